"""The derived folder's units (issue 13 items 0 and 4): tables replace files whole, freshness,
no table is written in place, the reduce's step rows. On a real run (commands from any working
directory, analyses at once): tests/jobs/test_derived_jobs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from uberprof.analysis.tables import derived as D
from uberprof.analysis.tables.schemas import RUN_STEP_SCHEMA


def test_replacing_keeps_the_old_file_until_the_new_one_is_whole(tmp_path: Path) -> None:
    target = tmp_path / "t.parquet"
    D.write_parquet(pa.table({"a": [1]}), target)
    with pytest.raises(RuntimeError), D.replacing(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_bytes(b"half a tab")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == [target]
    assert pq.read_table(target).column("a").to_pylist() == [1]
    with D.replacing(target) as a, D.replacing(target) as b:
        assert a != b  # two writers at once never share a temporary name
        pq.write_table(pa.table({"a": [2]}), a)
        pq.write_table(pa.table({"a": [3]}), b)
    assert pq.read_table(target).column("a").to_pylist() == [2]  # the last to finish wins
    assert list(tmp_path.iterdir()) == [target]


def test_freshness(tmp_path: Path) -> None:
    f = tmp_path / "trace.json"
    f.write_text("{}")
    made = tmp_path / "summary.json"
    st = f.stat()
    entry = D.input_entry("trace.json", st)
    assert entry["path"] == "trace.json" and entry["key"] == D.entry_key("trace.json")
    assert not D.is_fresh(None, st, made)
    assert not D.is_fresh({**entry, "status": "ok"}, st, made)  # tables missing
    made.write_text("{}")
    assert D.is_fresh({**entry, "status": "ok"}, st, made)
    assert D.is_fresh({**entry, "status": "error"}, st, tmp_path / "none")
    assert not D.is_fresh({**entry, "status": "ok", "version": -1}, st, made)
    f.write_text("{} ")
    assert not D.is_fresh({**entry, "status": "ok"}, f.stat(), made)


def test_no_derived_file_is_ever_written_in_place(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table goes to a unique hidden temporary name in its folder, then is renamed: a
    reader (or a second analysis) never finds a half-written table under a real name."""
    from tests import _traces as T
    from uberprof.analysis.tables.pipeline import analyze

    d = tmp_path / "traces"
    T.write(d / "rank-0.pt.trace.json.gz", T.gpu_step_trace(rank=0))
    T.write(d / "rank-1.pt.trace.json", T.cpu_step_trace(rank=1))
    opened: list[Path] = []
    real_temp = D._temp_beside

    def temp_beside(path: Path) -> Path:  # every writer (IPC, Parquet, JSON) takes its name here
        tmp = real_temp(path)
        opened.append(tmp)
        return tmp

    monkeypatch.setattr(D, "_temp_beside", temp_beside)
    a = analyze(d, out=tmp_path / "d", workers=1)
    assert a.ranks and [r["rank"] for r in a.ranks] == [0, 1]
    made = {p for p in (tmp_path / "d").rglob("*") if p.is_file()}
    assert {p.name for p in made} >= {D.EVENTS_FILE, "steps.parquet", "ranks.parquet",
                                      "collectives.parquet", "summary.json", "manifest.json"}
    assert len(opened) >= 9 and not set(opened) & made
    assert all(p.name.startswith(".") and p.name.endswith(".tmp") and p.parent in
               {m.parent for m in made} for p in opened)
    assert len(set(opened)) == len(opened)  # never one temporary name twice


def _row_path_steps(ctx: Any, rank: int) -> list[dict[str, Any]]:
    """The run-level step rows of one rank as the reduce built them row by row before it
    worked on columns (the reference): traced steps first seen, the timeline's window where it
    has both ends, the timeline's other steps untraced."""
    by_step: dict[int, dict[str, Any]] = {}
    for rel, e in sorted(ctx.run.inputs.items()):
        if e.get("rank") != rank or e.get("status") != "ok":
            continue
        for r in D.read_input_table(ctx.derived, e["key"], D.INPUT_STEPS_FILE).to_pylist():
            if r["step"] not in by_step:
                by_step[r["step"]] = {**r, "rank": rank, "traced": True, "trace": rel}
    timeline = ctx.run.timeline(ctx.root / "ranks" / str(rank))
    for tl in timeline.to_pylist() if timeline is not None else []:
        start, end = tl["host_start_ns"], tl["host_end_ns"]
        if tl["step"] in by_step:
            if start is not None and end is not None:
                by_step[tl["step"]].update(host_start_ns=start, host_end_ns=end)
            continue
        by_step[tl["step"]] = {"rank": rank, "step": tl["step"], "traced": False, "trace": None,
                               "host_start_ns": start, "host_end_ns": end,
                               "data_wait_ns": tl["data_wait_ns"]}
    rows = []
    for step in sorted(by_step):
        r = by_step[step]
        s, e = r.get("host_start_ns"), r.get("host_end_ns")
        r["step_time_ns"] = e - s if s is not None and e is not None else None
        rows.append({f: r.get(f) for f in RUN_STEP_SCHEMA.names})
    return rows


def test_run_steps_are_the_row_paths(tmp_path: Path) -> None:
    """The reduce's column-wise step table against the row-by-row reference, on a run with two
    trace windows, a traced step the timeline lacks, one whose timeline row has no end, and a
    timeline with a repeated step."""
    from tests.unit.test_dashboard import write_synth
    from uberprof.analysis.tables.context import load_context

    run = write_synth(tmp_path / "run", ranks=4, steps=40, counters=False, straggler=None)
    lines = (run / "ranks" / "1" / "steps.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    rows = [r for r in rows if r["step"] != 21]  # traced, not in the timeline
    for r in rows:
        if r["step"] == 20:
            del r["host_end_ns"]  # traced; the timeline's window lacks its end
    rows.append({**rows[5], "host_end_ns": rows[5]["host_end_ns"] + 99})  # step 5 again
    (run / "ranks" / "1" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx = load_context(run, workers=1)
    got = ctx.steps()
    for rank in range(4):
        mine = got.filter(pa.compute.equal(got.column("rank"), rank)).to_pylist()
        assert mine == _row_path_steps(ctx, rank), rank
    one = {r["step"]: r for r in got.to_pylist() if r["rank"] == 1}
    assert one[21]["traced"] and one[20]["traced"] and not one[5]["traced"]
    assert one[5]["host_end_ns"] == rows[-1]["host_end_ns"]  # the timeline keeps the last row


def test_first_input_summaries_reads_one_readable_summary_per_rank(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Each rank's first readable input summary, as `input_summaries` gives them, without
    reading a rank's later inputs (a broken first one falls through to the next)."""
    import orjson

    from uberprof.analysis.tables import derived as d

    inputs: dict[str, dict[str, Any]] = {}
    for rel, rank, text in [("a", 0, {"host": "a"}), ("b", 0, {"host": "b"}),
                            ("c", 1, None), ("e", 1, {"host": "e"}), ("f", 2, {"host": "f"})]:
        key = d.entry_key(rel)
        inputs[rel] = {"key": key, "rank": rank, "status": "ok"}
        folder = d.input_dir(tmp_path, key)
        folder.mkdir(parents=True)
        body = orjson.dumps({"summary": text}) if text is not None else b"{broken"
        (folder / d.SUMMARY_FILE).write_bytes(body)
    inputs["g"] = {"key": d.entry_key("g"), "rank": 3, "status": "error"}
    analysis = d.Analysis(source=tmp_path, derived=tmp_path, summary={}, ranks=[],
                          inputs=inputs)
    every: dict[int, dict[str, Any]] = {}
    for r, s in analysis.input_summaries():
        every.setdefault(r, s)
    read: list[str] = []
    real = d.read_input_summary
    monkeypatch.setattr(d, "read_input_summary", lambda p, k: read.append(k) or real(p, k))
    assert analysis.first_input_summaries() == every == {
        0: {"host": "a"}, 1: {"host": "e"}, 2: {"host": "f"}}
    assert read == [d.entry_key(x) for x in ("a", "c", "e", "f")]
