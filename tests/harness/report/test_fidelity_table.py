"""`harness.report.fidelity_table`: bias against fp32 master weights told apart from seed noise."""

import random

from harness.report import fidelity_table as ft
from tests.helpers import convergence_record

STEPS = list(range(0, 2001, 100))  # held-out evaluations, step 0 before any update
PHASES = [dict(name="pretrain", first_step=0, steps=1600), dict(name="cpt", first_step=1600, steps=400)]


def _run(label: str, method: str, master: str, seed: int, offset: float, noise: float, rng) -> dict:
    """A convergence record whose held-out curve is a common decay + `offset` + per-step noise."""
    base = [3.0 + 6.0 / (1 + s / 100) + 0.01 * seed for s in STEPS]
    heldout = [b + (0.0 if s == 0 else offset + rng.gauss(0, noise)) for b, s in zip(base, STEPS)]
    return convergence_record(
        "convergence",
        label,
        method,
        master,
        seed,
        "2026-12-01",
        losses=[4.0] * 2000,
        heldout_losses=heldout,
        heldout_steps=STEPS,
        phases=PHASES,
    )


def _records(seeds: int, bias: float = 0.02) -> list[dict]:
    rng = random.Random(0)
    out = []
    for seed in range(seeds):
        out += [
            _run("fused_adamw_fp32", "fused_adamw", "fp32", seed, 0.0, 0.0, rng),  # the reference
            _run("torch_adamw_fp32", "torch_adamw", "fp32", seed, rng.gauss(0, 0.0005), 0.0005, rng),
            _run("forge_bf16_kahan", "forge", "bf16+kahan", seed, rng.gauss(0, 0.0005), 0.0005, rng),
            _run("forge_bf16", "forge", "bf16+sr", seed, bias + rng.gauss(0, 0.0005), 0.0005, rng),
        ]
    return out


def _verdicts(records: list[dict]) -> dict[tuple[str, str], tuple[str, str]]:
    table = ft.fidelity(records).table
    col = {name: i for i, name in enumerate(table.header)}
    target = table.header[-1]
    return {(r[col["Method"]], r[col["Phase"]]): (r[col["Verdict"]], r[col[target]]) for r in table.rows}


def test_a_biased_method_is_named_and_an_unbiased_one_is_within_the_controls_noise():
    verdicts = _verdicts(_records(3))
    for phase in ("pretrain", "cpt"):
        assert verdicts[("forge_bf16_kahan", phase)] == ("within noise", "met")
        verdict, target = verdicts[("forge_bf16", phase)]
        assert verdict.startswith("biased by +0.02") and target == "not met"
        assert verdicts[("torch_adamw_fp32", phase)][0] == "fp32 control (sets the band)"
    assert not any(method == "fused_adamw_fp32" for method, _ in verdicts)  # the reference has no row


def test_fewer_than_three_seeds_are_not_judged():
    verdicts = _verdicts(_records(2))
    assert verdicts[("forge_bf16", "cpt")] == ("not judged: 2 seeds of 3", "—")


def test_the_interval_is_students_t_over_the_seeds():
    mean, half = ft.interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and abs(half - 4.303 * 1.0 / 3**0.5) < 1e-12


def test_the_held_out_point_before_any_update_is_left_out():
    rng = random.Random(1)
    ref = _run("fused_adamw_fp32", "fused_adamw", "fp32", 0, 0.0, 0.0, rng)
    other = _run("forge_bf16", "forge", "bf16+sr", 0, 0.5, 0.0, rng)
    other["heldout_losses"][0] += 100.0  # step 0 differs wildly: it must not count
    assert abs(ft.heldout_deviation(other, ref, 0, 1600) - 0.5) < 1e-9


def test_a_mean_outside_the_band_whose_interval_reaches_into_it_is_unresolved():
    rng = random.Random(2)
    records = []
    for seed, offset in enumerate((0.004, -0.002, 0.006)):  # mean +0.0027, interval about +-0.010
        records += [
            _run("fused_adamw_fp32", "fused_adamw", "fp32", seed, 0.0, 0.0, rng),
            _run("torch_adamw_fp32", "torch_adamw", "fp32", seed, 0.0002 * (seed - 1), 0.0, rng),
            _run("forge_int8", "forge", "bf16+sr", seed, offset, 0.0, rng),
        ]
    verdict, target = _verdicts(records)[("forge_int8", "pretrain")]
    assert verdict.startswith("unresolved: +0.0027") and target == "not met"


def test_a_seed_without_its_fp32_reference_is_left_out_not_judged_against_bf16():
    """Runs whose fp32-master reference is missing (a sweep cut short) are not compared with the
    bf16 fused AdamW instead."""
    rng = random.Random(3)
    records = [_run("fused_adamw", "fused_adamw", "bf16", 0, 0.05, 0.0, rng)]
    records += [_run("forge_bf16", "forge", "bf16+sr", 0, 0.0, 0.0, rng)]
    assert ft.fidelity(records) is None


def test_two_sweeps_of_the_same_points_stay_apart():
    """A shorter protocol's runs (another sweep) do not replace a longer one's of the same method,
    model and seed: each sweep's curves are compared within that sweep."""
    records = _records(3)
    short = [dict(r, sweep="convergence_short", time="2026-12-02T00:00:00") for r in _records(3, bias=0.0)]
    verdicts = ft.fidelity(records + short).table
    col = {name: i for i, name in enumerate(verdicts.header)}
    sweeps = {(r[col["Sweep"]], r[col["Method"]]) for r in verdicts.rows}
    assert ("convergence", "forge_bf16") in sweeps and ("convergence_short", "forge_bf16") in sweeps


def test_an_fp8_method_is_judged_against_its_bf16_twin_of_the_same_seed():
    """`fp8` among a method's options adds a row of it against the same method without `fp8`, per
    seed: an FP8 run as far from its twin as rounding moves fp32 is within noise; one 0.05 above,
    biased. No target cell: the 0.005-nat target is for master weights against fp32."""
    rng = random.Random(4)
    records = []
    for seed in range(3):
        bf16 = _run("forge_bf16", "forge", "bf16+sr", seed, 0.03 + rng.gauss(0, 0.0005), 0.0005, rng)
        bf16["method_options"] = dict(label="forge_bf16", state_dtype="bf16")
        close = _run("forge_fp8", "forge", "bf16+sr", seed, 0.03 + rng.gauss(0, 0.0005), 0.0005, rng)
        close["method_options"] = dict(label="forge_bf16", state_dtype="bf16", fp8="tensorwise")
        far = _run("fused_adamw_fp8", "fused_adamw", "bf16", seed, 0.05, 0.0, rng)
        far["method_options"] = dict(label="fused_adamw", fp8="tensorwise")
        twin = _run("fused_adamw", "fused_adamw", "bf16", seed, 0.0, 0.0, rng)
        twin["method_options"] = dict(label="fused_adamw")
        records += [
            _run("fused_adamw_fp32", "fused_adamw", "fp32", seed, 0.0, 0.0, rng),
            _run("torch_adamw_fp32", "torch_adamw", "fp32", seed, rng.gauss(0, 0.0005), 0.0005, rng),
            bf16, close, far, twin,
        ]  # fmt: skip
    verdicts = _verdicts(records)
    assert verdicts[("forge_fp8 - forge_bf16", "pretrain")] == ("within noise", "—")
    verdict, target = verdicts[("fused_adamw_fp8 - fused_adamw", "cpt")]
    assert verdict.startswith("biased by +0.05") and target == "—"
    assert ("forge_bf16 - forge_bf16", "cpt") not in verdicts  # a bf16 method has no twin row


def test_the_controls_compute_as_the_reference_does():
    """fp32 master weights under bf16 autocast are no control against an all-fp32 reference (bf16
    GEMMs are not rounding's noise) but are judged; against an autocast reference, as in
    +exp=convergence_amp, fp32 masters under the same autocast are the controls."""
    rng = random.Random(5)
    records = _records(3)
    for seed in range(3):
        amp = _run("fused_adamw_amp", "fused_adamw", "fp32", seed, 0.0, 0.0005, rng)
        amp["method_options"]["autocast"] = "bf16"
        records.append(amp)
    verdicts = _verdicts(records)
    assert verdicts[("fused_adamw_amp", "pretrain")] == ("within noise", "met")
    assert verdicts[("torch_adamw_fp32", "pretrain")][0] == "fp32 control (sets the band)"

    mixed = []
    for seed in range(3):
        for label, method, master, offset in [
            ("fused_adamw_amp", "fused_adamw", "fp32", 0.0),  # the reference
            ("forge_amp", "forge", "fp32", rng.gauss(0, 0.0005)),
            ("forge_bf16", "forge", "bf16+sr", 0.02),
        ]:
            record = _run(label, method, master, seed, offset, 0.0005, rng)
            if master == "fp32":
                record["method_options"]["autocast"] = "bf16"
            record["convergence_reference"] = label == "fused_adamw_amp"
            mixed.append(record)
    verdicts = _verdicts(mixed)
    assert verdicts[("forge_amp", "pretrain")][0] == "fp32 control (sets the band)"
    assert verdicts[("forge_bf16", "pretrain")][0].startswith("biased by +0.0")
