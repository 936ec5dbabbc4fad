"""Real text for convergence runs: where it comes from, its byte-level BPE tokenizer, and the cache.

    python -m harness data                      # prepare every corpus for vocab 8192 (the default)
    python -m harness data --vocab-size 320     # the CPU smoke test's tokenizer

(`python -m harness.run.data` runs the same.) Convergence runs must train on real text without
the internet, on a GPU machine that reaches no registry. Two texts ship with every CPython
installation, so any machine that runs the harness already has them, and nothing is downloaded:

- `stdlib_code`: the Python source of the standard library (`sysconfig`'s stdlib directory; test
  suites, IDLE, lib2to3, turtledemo and ensurepip left out) with every docstring removed: about
  9 MB of real, human-written code and comments. The pretraining text.
- `stdlib_docs`: the English prose of Python's documentation that ships with CPython: the Language
  Reference and library topics of `pydoc_data.topics` (what `help("topics")` shows) and every
  module, class and function docstring of the same files: about 2.2 MB. The continued-pretraining
  text: a shift from code to prose, disjoint from the first text since docstrings were removed there.

Each text is a list of documents (one per source file, one per pydoc topic). A document goes to
the held-out split when the first 8 bytes of the SHA-256 of its name, read as a number, are a
multiple of HELDOUT_EVERY (one document in 20), so the split is stable across processes and
machines and never cuts a document in two.

The tokenizer is a byte-level BPE (the `tokenizers` package, GPT-2 style: any byte sequence
encodes, no unknown token) trained on the training splits of both texts together, with one special
token `<|endoftext|>` that separates documents. `prepare` writes, under the cache directory,
`v{vocab}/tokenizer.json`, `v{vocab}/{corpus}.{split}.npy` (uint16 token ids) and
`v{vocab}/manifest.json` (Python version, characters, documents, tokens and SHA-256 of each file).
Prepared once, the folder is a few MB: carry it to a GPU machine rather than rebuild it there,
since another Python version ships slightly different text. `load` prepares on first use.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import inspect
import json
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / ".cache" / "convergence"
SPLITS = ("train", "heldout")
HELDOUT_EVERY = 20  # one document in 20 (5%) is held out
EOT = "<|endoftext|>"
SKIP_DIRS = {"test", "tests", "idle_test", "idlelib", "lib2to3", "turtledemo", "ensurepip"}
SKIP_DIRS |= {"site-packages", "dist-packages", "pydoc_data", "__pycache__"}
FORMAT = 1  # bump when what `prepare` writes changes

Document = tuple[str, str]  # (name, text)


def _stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted, without test suites and bundled tools."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(root.rglob("*.py")) if not SKIP_DIRS & set(p.relative_to(root).parts[:-1])]


def _docstring_nodes(tree: ast.AST) -> Iterator[ast.Expr]:
    """The docstring expressions of a module and of every class and function in it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield first


def _parse(path: Path) -> tuple[str, ast.AST | None]:
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        return source, ast.parse(source)
    except SyntaxError:
        return source, None


def stdlib_code() -> list[Document]:
    """Every stdlib source file with its docstrings' lines removed (code and comments stay)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in _stdlib_files():
        source, tree = _parse(path)
        drop = set()
        for node in _docstring_nodes(tree) if tree else ():
            drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        lines = source.splitlines(keepends=True)
        text = "".join(line for number, line in enumerate(lines, start=1) if number not in drop)
        docs.append((f"code/{path.relative_to(root)}", text))
    return docs


def stdlib_docs() -> list[Document]:
    """The pydoc topics, then one document per stdlib file made of its docstrings."""
    import pydoc_data.topics

    root = Path(sysconfig.get_paths()["stdlib"])
    docs = [(f"topic/{name}", text) for name, text in sorted(pydoc_data.topics.topics.items())]
    for path in _stdlib_files():
        _, tree = _parse(path)
        strings = [n.value.value for n in _docstring_nodes(tree)] if tree else []
        text = "\n\n".join(inspect.cleandoc(s) for s in strings if s.strip())
        if text:
            docs.append((f"doc/{path.relative_to(root)}", text + "\n"))
    return docs


CORPORA: dict[str, Callable[[], list[Document]]] = {
    "stdlib_code": stdlib_code,
    "stdlib_docs": stdlib_docs,
}


def is_heldout(name: str) -> bool:
    """True for the documents of the held-out split (stable: a hash of the document's name)."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_EVERY == 0


def split(docs: list[Document]) -> dict[str, list[str]]:
    """{"train": texts, "heldout": texts}, by `is_heldout`."""
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for name, text in docs:
        out["heldout" if is_heldout(name) else "train"].append(text)
    return out


def train_tokenizer(texts: Iterator[str], vocab_size: int):
    """A byte-level BPE with `vocab_size` entries (256 bytes, EOT, then merges), trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def encode(tokenizer, texts: list[str]):
    """One uint16 array: every text's tokens, each followed by EOT."""
    import numpy as np

    eot = tokenizer.token_to_id(EOT)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids.extend(encoding.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.uint16)


def cache_dir(root: str | Path | None, vocab_size: int) -> Path:
    """Where the tokenizer and corpora of one vocabulary size live (relative roots: to the repo)."""
    base = Path(root) if root else DEFAULT_DIR
    return (base if base.is_absolute() else REPO / base) / f"v{vocab_size}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _save_array(path: Path, array) -> None:
    import numpy as np

    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        np.save(f, array)
    tmp.replace(path)


def prepare(vocab_size: int = 8192, root: str | Path | None = None) -> Path:
    """Build the tokenizer and tokenize every corpus into the cache; returns the cache folder.

    Idempotent: a folder whose manifest has this FORMAT and vocabulary is left as it is."""
    if not 257 <= vocab_size <= 65536:
        raise ValueError(f"vocab_size={vocab_size}: byte-level BPE needs 257..65536 (256 bytes + EOT)")
    folder = cache_dir(root, vocab_size)
    if _manifest_ok(folder, vocab_size):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".prepare.lock", "w") as lock:  # points of a concurrent sweep prepare once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _manifest_ok(folder, vocab_size):
            _prepare_into(folder, vocab_size)
    return folder


def _prepare_into(folder: Path, vocab_size: int) -> None:
    splits = {name: split(make()) for name, make in CORPORA.items()}
    tokenizer = train_tokenizer((text for parts in splits.values() for text in parts["train"]), vocab_size)
    tokenizer.save(str(folder / "tokenizer.json"))
    manifest = {"format": FORMAT, "vocab_size": vocab_size, "python": sys.version.split()[0]}
    manifest["source"] = sysconfig.get_paths()["stdlib"]
    manifest["files"] = {"tokenizer.json": _sha256(folder / "tokenizer.json")}
    manifest["corpora"] = {}
    for name, parts in splits.items():
        manifest["corpora"][name] = {}
        for split_name, texts in parts.items():
            path = folder / f"{name}.{split_name}.npy"
            _save_array(path, encode(tokenizer, texts))
            manifest["files"][path.name] = _sha256(path)
            manifest["corpora"][name][split_name] = _stats(texts, path)
    tmp = folder / "manifest.json.tmp"  # last, and whole: its presence says the folder is complete
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(folder / "manifest.json")


def _stats(texts: list[str], path: Path) -> dict[str, int]:
    import numpy as np

    return {"documents": len(texts), "chars": sum(map(len, texts)), "tokens": int(np.load(path).size)}


def _manifest_ok(folder: Path, vocab_size: int) -> bool:
    path = folder / "manifest.json"
    if not path.exists():
        return False
    manifest = json.loads(path.read_text())
    files_there = all((folder / name).exists() for name in manifest.get("files", {}))
    return manifest.get("format") == FORMAT and manifest.get("vocab_size") == vocab_size and files_there


@dataclass
class Corpus:
    """One prepared text: its token ids per split, and where they came from."""

    name: str
    train: object  # numpy uint16 array
    heldout: object
    manifest: dict


def load(name: str, vocab_size: int, root: str | Path | None = None) -> Corpus:
    """A prepared corpus (prepared now if the cache does not hold it yet)."""
    import numpy as np

    if name not in CORPORA:
        raise ValueError(f"corpus {name!r} is not known; choose one of: {', '.join(sorted(CORPORA))}")
    folder = prepare(vocab_size, root)
    manifest = json.loads((folder / "manifest.json").read_text())
    arrays = {s: np.load(folder / f"{name}.{s}.npy") for s in SPLITS}
    return Corpus(name, arrays["train"], arrays["heldout"], manifest)


DATA_EXAMPLES = """\
examples:
  python -m harness data                      # every corpus, vocab 8192: what +exp=convergence reads
  python -m harness data --vocab-size 320     # the tokenizer of +exp=convergence_smoke
  FORGE_BENCH_DATA=/data/forge python -m harness data   # another cache folder
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness data",
        description=__doc__.splitlines()[0],
        epilog=DATA_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--vocab-size", type=int, default=8192, help="tokenizer size (default 8192)")
    parser.add_argument("--dir", default=os.environ.get("FORGE_BENCH_DATA"), help=f"default {DEFAULT_DIR}")
    args = parser.parse_args(argv)
    folder = prepare(args.vocab_size, args.dir)
    manifest = json.loads((folder / "manifest.json").read_text())
    print(f"{folder} (Python {manifest['python']})")
    for name, parts in manifest["corpora"].items():
        for split_name, stats in parts.items():
            print(
                f"  {name:12s} {split_name:8s} {stats['documents']:5d} docs {stats['chars']:>10,d} chars "
                f"{stats['tokens']:>9,d} tokens"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
