"""Reports: results records in, reports/ out (`python -m harness report`: `report.main`).

One job per module:

    report              the procedure: read, build the sections, write tables, plots, README
    tables              T1-T6 and every other point, one `Selection` (table + records) each
    kernel_table        T4: the fused kernel against cuBLAS (kernel records)
    convergence_table   loss curves against the reference method's
    preambles           the expectation each section opens with
    expectations        the model behind them: bytes per parameter, FLOP and byte floors
    paper               the paper's figures, shown beside the measured ones
    reference_table     the paper's code (its FORGE, `forge_reference`) measured beside ours
    plots               memory breakdowns, step times, capacity and loss-curve plots (PNG)
    readme              reports/README.md from the built sections
    markup              `Table` and its Markdown and LaTeX renderings, fixed number formats
"""
