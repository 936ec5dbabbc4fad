"""The data-parallel table: every planned point, `not measured` until a record exists; measured
points against fused AdamW under the same wrapper."""

from harness.report.dp_table import NOT_MEASURED, dp_table, planned_points


def _record(label: str, step: float, peak: float, batch: int = 1) -> dict:
    return dict(
        sweep="dp_h200", method_label=label, model="llama3.1-8b", seq_len=1024, batch_size=batch,
        world_size=2, status="ok", step_time_ms_median=step, peak_alloc_gib=peak, time="2026-12-03T00:00:00",
    )  # fmt: skip


def test_without_records_every_planned_point_reads_not_measured():
    table = dp_table([]).table
    planned = planned_points("dp_h200") + planned_points("dp_capacity_40gb")
    assert len(table.rows) == len(planned) > 10
    assert all(row[-4:] == [NOT_MEASURED] * 4 for row in table.rows)
    assert {row[3] for row in table.rows} == {"ddp", "fsdp2"}


def test_a_measured_point_is_compared_with_fused_adamw_under_the_same_wrapper():
    records = [_record("fused_adamw_ddp", 200.0, 70.0), _record("forge_bf16_ddp", 180.0, 56.0)]
    rows = {(row[4], row[5]): row for row in dp_table(records).table.rows}
    forge = rows["forge_bf16_ddp", "1"]
    assert forge[-4:] == ["180.0", "56.0", "0.90x", "0.80x"]
    assert rows["forge_bf16_ddp", "2"][-1] == NOT_MEASURED  # batch 2 was not measured
    assert rows["forge_bf16_fsdp2", "1"][-1] == NOT_MEASURED  # another wrapper's baseline is no baseline
