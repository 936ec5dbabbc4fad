"""Tables mark a captured or compiled step whose record predates the harness's own attention mask
(no `attention_mask` field): it ran transformers' full causal mask. Eager steps, failed points and
records that carry the field are not marked."""

from harness.report.tables import COL_METHOD, MASKED_ATTENTION, Notes, Row, masked_attention


def record(**fields):
    base = {"method": "forge", "method_label": "forge_bf16_graph", "status": "ok"}
    base.update(method_options={"cuda_graph": True, "state_dtype": "bf16"})
    return {**base, **fields}


def test_captured_and_compiled_steps_without_the_field_are_marked():
    compiled = record(method_label="forge_bf16_compile", method_options={"compile": True})
    assert masked_attention(record()) and masked_attention(compiled)
    notes = Notes()
    assert COL_METHOD.cell(Row(record(), None, notes)) == "forge_bf16_graph [1]"
    assert notes.lines() == [f"[1] {MASKED_ATTENTION}"]


def test_eager_steps_failed_points_and_records_with_the_field_are_not():
    eager = record(method_label="forge_bf16", method_options={"state_dtype": "bf16"})
    for unmarked in (eager, record(status="oom"), record(attention_mask="is_causal")):
        assert not masked_attention(unmarked)
        notes = Notes()
        assert COL_METHOD.cell(Row(unmarked, None, notes)) == unmarked["method_label"]
        assert notes.lines() == []
