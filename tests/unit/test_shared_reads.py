"""What lets a big run's diagnosis and dashboard read less without reading anything stale:
rank.json read once while unchanged (`rundir/ranks.py:read_rank`), counter streams shared
within a diagnosis (`rundir/counters.py:shared_reads`), and the dashboard's step series taking
the analysis's rank and step order as it is (`dashboards/steps_data.py`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from uberprof.analysis.tables.overview import in_rank_step_order
from uberprof.collect.counters.store import CounterStore
from uberprof.rundir import RunDir
from uberprof.rundir import counters as C
from uberprof.rundir.ranks import read_rank

_OLD_NS = 1_600_000_000 * 10**9  # an mtime long past: the cache may answer


def _rank_json(folder: Path, rank: int, host: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rank.json"
    path.write_text(json.dumps({"rank": rank, "host": host, "world_size": 8}))
    return path


def test_an_unchanged_old_rank_json_is_parsed_once(tmp_path: Path) -> None:
    path = _rank_json(tmp_path / "3", 3, "a")
    os.utime(path, ns=(_OLD_NS, _OLD_NS))
    first = read_rank(tmp_path / "3")
    assert first.rank == 3 and first.host == "a"
    assert read_rank(tmp_path / "3") is first


def test_a_replaced_rank_json_is_read_again(tmp_path: Path) -> None:
    path = _rank_json(tmp_path / "3", 3, "a")
    os.utime(path, ns=(_OLD_NS, _OLD_NS))
    assert read_rank(tmp_path / "3").host == "a"
    tmp = tmp_path / "3" / "rank.json.tmp"  # the writers' way: a new file renamed into place
    tmp.write_text(json.dumps({"rank": 3, "host": "b", "world_size": 8}))
    os.utime(tmp, ns=(_OLD_NS, _OLD_NS))  # same size, same mtime: the inode differs
    tmp.replace(path)
    assert read_rank(tmp_path / "3").host == "b"


def test_a_rank_json_rewritten_in_place_within_seconds_is_read_again(tmp_path: Path) -> None:
    path = _rank_json(tmp_path / "3", 3, "a")
    assert read_rank(tmp_path / "3").host == "a"
    st = path.stat()
    path.write_text(json.dumps({"rank": 3, "host": "b", "world_size": 8}))  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime: one clock tick
    assert path.stat().st_ino == st.st_ino and path.stat().st_size == st.st_size
    assert read_rank(tmp_path / "3").host == "b"


def _counters(tmp_path: Path) -> tuple[RunDir, CounterStore]:
    """A run whose node n0 has 30 flushes of host counters; the store still open."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    nd = run.claim_node_dir("n0")
    store = CounterStore(nd / "counters")
    for i in range(30):  # one flush per batch, as the sampler writes them
        store.add("host", 1_000 * (i + 1), [("cpu", "cpu.util", float(i), "%"),
                                            ("mem", "mem.total", 1e9, "B")])
        store.flush()
    return run, store


def test_shared_reads_give_the_same_rows_as_reading_batch_by_batch(tmp_path: Path) -> None:
    run, store = _counters(tmp_path)
    store.close()
    asks: list[dict[str, Any]] = [
        {"sources": ["host"], "metrics": ["cpu.util"], "start_ns": 5_000, "end_ns": 20_000},
        {"sources": ["host"], "metrics": ["mem.total", "cpu.util"]},
        {"sources": ["host"], "start_ns": 29_000}]
    alone = [C.counters_table(run, "n0", **a) for a in asks]
    with C.shared_reads():
        shared = [C.counters_table(run, "n0", **a) for a in asks]
        again = [C.counters_table(run, "n0", **a) for a in asks]
    for a, s, g in zip(alone, shared, again):
        assert a.num_rows > 0 and s.equals(a) and g.equals(a)
    assert alone[0].column("value").to_pylist() == [float(i) for i in range(4, 20)]


def test_a_stream_that_grew_is_read_again_inside_shared_reads(tmp_path: Path) -> None:
    run, store = _counters(tmp_path)
    with C.shared_reads():
        before = C.counters_table(run, "n0", sources=["host"], metrics=["cpu.util"])
        store.add("host", 99_000, [("cpu", "cpu.util", 99.0, "%")])  # the sampler's next flush
        store.flush()
        store.close()
        after = C.counters_table(run, "n0", sources=["host"], metrics=["cpu.util"])
    assert after.num_rows == before.num_rows + 1
    assert after.column("value").to_pylist()[-1] == 99.0


def test_nothing_is_kept_after_shared_reads(tmp_path: Path) -> None:
    run, store = _counters(tmp_path)
    store.close()
    with C.shared_reads():
        C.counters_table(run, "n0", sources=["host"])
        assert C._shared
    assert C._shared is None


def test_step_series_order_kept_when_sorted_and_made_when_not() -> None:
    ordered = pa.table({"rank": [0, 0, 1, 1], "step": [0, 1, 0, 5], "v": [1, 2, 3, 4]})
    assert in_rank_step_order(ordered) is ordered
    mixed = pa.table({"rank": [1, 0, 1, 0], "step": [5, 1, 0, 0], "v": [4, 2, 3, 1]})
    got = in_rank_step_order(mixed)
    assert got.column("v").to_pylist() == [1, 2, 3, 4]
    same_rank_back = pa.table({"rank": [0, 0], "step": [1, 0], "v": [2, 1]})
    assert in_rank_step_order(same_rank_back).column("v").to_pylist() == [1, 2]


def test_load_steps_reads_only_the_columns_the_pages_use(tmp_path: Path) -> None:
    from uberprof.analysis.tables.context import RunContext
    from uberprof.analysis.tables.schemas import RUN_STEP_SCHEMA
    from uberprof.dashboards.steps_data import DASHBOARD_STEP_COLUMNS, load_steps

    derived = tmp_path / "derived"
    derived.mkdir()
    rows = [{"rank": r, "step": s, "host_start_ns": 10 * s, "host_end_ns": 10 * s + 9,
             "step_time_ns": 9, "compute_ns": 5, "traced": s == 1} for r in (0, 1)
            for s in (0, 1)]
    import pyarrow.parquet as pq

    from uberprof.analysis.tables.derived import STEPS_FILE
    pq.write_table(pa.Table.from_pylist(rows, schema=RUN_STEP_SCHEMA), derived / STEPS_FILE)

    class _Run:
        pass
    run = _Run()
    run.derived = derived  # type: ignore[attr-defined]
    ctx = RunContext(run=run, root=tmp_path, is_run_dir=False, ranks={})  # type: ignore[arg-type]
    t = load_steps(tmp_path, ctx, [])
    assert t.schema.names == list(DASHBOARD_STEP_COLUMNS)
    assert "compute_ns" not in t.schema.names
    assert t.column("traced").to_pylist() == [False, True, False, True]
    whole = ctx.steps()  # the diagnosis's read: every column, kept
    assert whole.column("compute_ns").to_pylist() == [5] * 4
    assert ctx.steps(["rank", "step"]).equals(whole.select(["rank", "step"]))
