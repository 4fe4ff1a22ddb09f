"""Which per-input tables `analyze_input` writes: the optional ones (modules, memory) only when
they have rows, never one an earlier analysis of the same input left behind, and the run-level
tables the same whether or not an input wrote them. Temporary names are unique per process."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq

from tests import _traces as T
from uberprof.analysis.tables import derived as D
from uberprof.analysis.tables.pipeline import analyze
from uberprof.analysis.tables.rank import analyze_input


def _memory_event(ts: float, nbytes: int) -> dict[str, object]:
    return {"ph": "i", "s": "t", "name": "[memory]", "pid": T.PID, "tid": T.MAIN, "ts": ts,
            "args": {"Device Type": 0, "Device Id": -1, "Addr": 1, "Bytes": nbytes,
                     "Total Allocated": 100, "Total Reserved": 200}}


def test_empty_optional_tables_are_not_written_and_stale_ones_are_removed(
        tmp_path: Path) -> None:
    doc = T.cpu_step_trace(rank=0)
    doc["traceEvents"] += [_memory_event(1100.0, 64), _memory_event(1200.0, -64)]
    src = T.write(tmp_path / "rank-0.pt.trace.json", doc)
    out = tmp_path / "input"
    assert analyze_input(str(src), str(out))["status"] == "ok"
    assert pq.read_table(out / D.MEMORY_FILE).num_rows == 2  # has rows: written
    assert not (out / D.MODULES_FILE).exists()  # no module spans: none
    assert {p.name for p in out.iterdir()} == {D.EVENTS_FILE, D.INPUT_STEPS_FILE,
                                               D.INPUT_COLLECTIVES_FILE, D.ACTIVITY_FILE,
                                               D.INPUT_OPERATORS_FILE, D.MEMORY_FILE,
                                               D.SUMMARY_FILE}
    T.write(src, T.cpu_step_trace(rank=0))  # the trace changes: no memory events any more
    assert analyze_input(str(src), str(out))["status"] == "ok"
    assert not (out / D.MEMORY_FILE).exists()


def test_an_input_analysed_again_loses_the_files_earlier_formats_wrote(tmp_path: Path) -> None:
    src = T.write(tmp_path / "rank-0.pt.trace.json", T.cpu_step_trace(rank=0))
    out = tmp_path / "input"
    out.mkdir()
    old = ["events.parquet", "steps.parquet", "collectives.parquet", "operators.parquet",
           "activity.parquet"]  # formats 10 and 11
    for name in old:
        (out / name).write_bytes(b"stale")
    assert analyze_input(str(src), str(out))["status"] == "ok"
    assert not {p.name for p in out.iterdir()} & set(old)
    events = D.read_small(out / D.EVENTS_FILE)
    assert D.EVENTS_FILE.endswith(".arrow") and events.num_rows > 0


def test_a_large_event_table_is_compressed_and_reads_back_the_same(tmp_path: Path) -> None:
    import pyarrow as pa

    n = D.COMPRESS_EVENTS_FROM // 8 + 1  # one int64 column past the size that compresses
    big = pa.table({"ts": pa.array(range(n), pa.int64())})
    small = big.slice(0, 1000)
    D.write_events(big, tmp_path / "big.arrow")
    D.write_events(small, tmp_path / "small.arrow")
    assert (tmp_path / "big.arrow").stat().st_size < big.nbytes / 4  # zstd: a range packs
    assert (tmp_path / "small.arrow").stat().st_size > small.nbytes  # as it is, framing added
    assert D.read_small(tmp_path / "big.arrow").equals(big)
    assert D.read_small(tmp_path / "small.arrow").equals(small)
    assert D.read_small(tmp_path / "big.arrow", ["ts"]).equals(big)


def test_run_tables_are_whole_when_inputs_skip_their_empty_optional_tables(
        tmp_path: Path) -> None:
    d = tmp_path / "traces"
    with_memory = T.cpu_step_trace(rank=0)
    with_memory["traceEvents"].append(_memory_event(1100.0, 64))
    T.write(d / "rank-0.pt.trace.json", with_memory)
    T.write(d / "rank-1.pt.trace.json", T.cpu_step_trace(rank=1))
    a = analyze(d, out=tmp_path / "d", workers=1)
    assert [r["rank"] for r in a.ranks] == [0, 1]
    memory = D.read_memory_timeline(a.derived)
    assert memory.column("rank").to_pylist() == [0]
    assert D.read_modules(a.derived).num_rows == 0
    assert sorted(set(D.read_operators(a.derived).column("rank").to_pylist())) == [0, 1]


def test_temporary_names_differ_within_a_process_and_name_the_process(tmp_path: Path) -> None:
    target = tmp_path / "t.parquet"
    names = {D._temp_beside(target) for _ in range(1000)}
    assert len(names) == 1000
    assert all(p.parent == tmp_path and p.name.startswith(".t.parquet.")
               and f".{os.getpid()}-" in p.name and not p.exists() for p in names)


def test_a_forked_child_draws_names_its_parent_never_does(tmp_path: Path) -> None:
    target = tmp_path / "t.parquet"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next names, as the parent's will be at the same serial
        os.close(r)
        os.write(w, "\n".join(str(D._temp_beside(target)) for _ in range(10)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = set(f.read().split("\n"))
    os.waitpid(pid, 0)
    parent = {str(D._temp_beside(target)) for _ in range(10)}
    assert len(child) == 10 and not child & parent


def test_an_input_analysed_again_leaves_no_table_of_the_older_format(tmp_path: Path) -> None:
    src = T.write(tmp_path / "rank-0.pt.trace.json", T.cpu_step_trace(rank=0))
    out = tmp_path / "input"
    out.mkdir()
    old = [out / n for n in ("steps.parquet", "collectives.parquet", "operators.parquet",
                             "activity.parquet")]
    for p in old:  # what derived format 10 wrote
        p.write_bytes(b"PAR1")
    assert analyze_input(str(src), str(out))["status"] == "ok"
    assert not any(p.exists() for p in old)
    assert (out / D.INPUT_STEPS_FILE).exists()
