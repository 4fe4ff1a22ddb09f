"""`tables/operators.py` groups events on their columns' dictionary codes (no string per
event, no copy of the table); these tests set its rows against Arrow's own group-by over the
same events as text (how the table was built before), on the shared traces and on tables whose
dictionaries differ between chunks or repeat a value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from uberprof.analysis.tables import operators as O
from uberprof.analysis.tables.metrics import kind_mask
from uberprof.analysis.tables.rank import analyze_trace
from uberprof.ingest import classify as K

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
TRACES = sorted(p for p in SHARED.rglob("*") if p.name.endswith((".json", ".json.gz"))) \
    if SHARED.is_dir() else []


def _reference(events: pa.Table, steps: set[int] | None, by_shapes: bool) -> set[tuple]:
    """The rows through Arrow's group-by on the text columns (the former implementation)."""
    runtime = (K.RUNTIME, K.SYNC)
    ev = events.filter(pa.array(kind_mask(events, O.OP_KINDS + runtime)))
    ts = ev.column("ts").to_numpy().astype(np.int64)
    dur = ev.column("dur").to_numpy().astype(np.int64)
    tid = ev.column("tid").to_numpy().astype(np.int64)
    self_ns = dur.copy()
    host = kind_mask(ev, (K.OPERATOR, *runtime))
    self_ns[host] = O.self_times(tid[host], ts[host], dur[host])
    keep = ~kind_mask(ev, runtime)
    if steps is not None:
        keep &= np.isin(ev.column("step").to_numpy(), list(steps))
    cols = {"kind": pc.cast(ev.column("kind"), pa.string()),
            "name": pc.cast(ev.column("name"), pa.string())}
    if by_shapes:
        cols["shapes"] = pc.cast(ev.column("shapes"), pa.string())
    sums = pa.table({**cols, "self": self_ns, "dur": dur}).filter(pa.array(keep)).group_by(
        list(cols)).aggregate([("dur", "count"), ("self", "sum"), ("dur", "sum")])
    shapes = sums.column("shapes").to_pylist() if by_shapes else [None] * sums.num_rows
    return set(zip(sums.column("kind").to_pylist(), sums.column("name").to_pylist(), shapes,
                   sums.column("dur_count").to_pylist(), sums.column("self_sum").to_pylist(),
                   sums.column("dur_sum").to_pylist()))


def _rows(t: pa.Table) -> list[tuple]:
    return list(zip(*(t.column(c).to_pylist() for c in
                      ("kind", "name", "shapes", "calls", "self_ns", "incl_ns"))))


@pytest.mark.skipif(not TRACES, reason=f"{SHARED} not present")
@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.name}/{p.name[:24]}")
def test_operator_rows_equal_arrows_group_by_on_text_for_shared_traces(path: Path) -> None:
    try:
        events = analyze_trace(path).events
    except Exception as exc:  # noqa: BLE001 - traces the analysis refuses are not this test's
        pytest.skip(f"not analysable: {exc}")
    step = events.column("step").to_numpy()
    steps = {int(s) for s in np.unique(step[step >= 0])} or None
    table = O.operator_table(events)
    rows = _rows(table)
    assert set(rows) == _reference(events, steps, by_shapes=True)
    assert len(rows) == len(set(rows))  # one row per group


@pytest.mark.skipif(not TRACES, reason=f"{SHARED} not present")
def test_operator_rows_are_ordered_by_self_time_then_name_kind_and_shapes() -> None:
    events = analyze_trace(TRACES[0]).events
    rows = _rows(O.operator_table(events))
    key = [(-r[4], r[1], r[0], r[2] is None, r[2] or "") for r in rows]
    assert key == sorted(key)


def _events(names: list[str], kinds: list[str], durs: list[int]) -> pa.Table:
    n = len(names)
    return pa.table({
        "ts": pa.array(np.arange(n, dtype=np.int64) * 100),
        "dur": pa.array(durs, pa.int64()),
        "kind": pa.array(kinds).dictionary_encode(),
        "name": pa.array(names).dictionary_encode(),
        "tid": pa.array(np.arange(n, dtype=np.int64)),  # no nesting: self = duration
        "shapes": pa.nulls(n, pa.string()).dictionary_encode(),
    })


def test_chunks_with_different_dictionaries_group_by_value_not_by_code() -> None:
    a = _events(["k1", "k2"], ["kernel", "kernel"], [10, 20])
    b = _events(["k2", "k1", "k1"], ["kernel", "kernel", "memcpy"], [1, 2, 4])
    both = pa.concat_tables([a, b])
    assert both.column("name").num_chunks == 2
    ops = O.rank_ops(both, None)
    assert {k: (s.calls, s.self_ns) for k, s in ops.items()} == {
        ("kernel", "k1"): (2.0, 12.0), ("kernel", "k2"): (2.0, 21.0), ("memcpy", "k1"): (1.0, 4.0)}


def test_a_dictionary_that_repeats_a_value_gives_one_row() -> None:
    names = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()),
                                           pa.array(["same", "same"]))
    t = _events(["x", "x", "x"], ["kernel"] * 3, [1, 2, 3]).set_column(
        3, "name", names)
    assert _rows(O.operator_table(t)) == [("kernel", "same", None, 3, 6, 6)]


def test_plain_string_columns_are_grouped_too() -> None:
    t = _events(["a", "b", "a"], ["kernel"] * 3, [5, 1, 5])
    t = t.set_column(3, "name", pc.cast(t.column("name"), pa.string()))
    assert _rows(O.operator_table(t)) == [("kernel", "a", None, 2, 10, 10),
                                          ("kernel", "b", None, 1, 1, 1)]
