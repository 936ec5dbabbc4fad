"""FORGE inside other training loops: each submodule adapts one ecosystem's trainer.

`forge.integrations.transformers.ForgeTrainer`: the Hugging Face `Trainer`, with FORGE built from its
`TrainingArguments` as the optimizer. The submodules import their ecosystem; this package imports nothing.
"""
