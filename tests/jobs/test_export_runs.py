"""Acceptance of `uberprof export` on real 4-rank CPU (Gloo) runs: the export re-read by
uberprof's own ingest has every rank's events in the sources' count and order, every event obeys
the Trace Event Format, a node whose clock is shifted comes out aligned, the straggler's victims
show their waits, and a size budget leaves a valid, smaller trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests._diag_runs import shift_node
from tests._export_check import compare_with_sources, load, rank_pids, us_to_ns, validate_tef
from tests._export_traces import run_sources
from uberprof.analysis.diagnosis.advisor import diagnose
from uberprof.analysis.read import open_run
from uberprof.present.export import ExportOptions, export_trace


def _tracks(doc: dict, pid: int) -> dict[int, str]:  # type: ignore[type-arg]
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}


def test_four_rank_run_round_trips_through_ingest(counters_run: Path,
                                                     tmp_path: Path) -> None:
    res = export_trace(open_run(counters_run), tmp_path / "ddp4.json")
    doc = load(res.path)
    assert validate_tef(doc) == []
    counts = compare_with_sources(res.path, run_sources(counters_run))
    assert sorted(counts) == [0, 1, 2, 3] and min(counts.values()) > 1000
    assert doc["uberprof_export"]["complete_events_per_rank"] == {str(r): n
                                                                  for r, n in counts.items()}
    # one process per rank, named and sorted by rank; findings first, then the node counters
    procs = {e["pid"]: (e["args"]["name"]) for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_sort_index"}
    ranks = rank_pids(doc)
    assert [procs[ranks[r]].split(" (")[0] for r in range(4)] == [f"rank {r}" for r in range(4)]
    assert all(procs[ranks[r]].endswith(", CPU)") for r in range(4))
    assert sorted(sort, key=sort.get)[:5] == [4, 0, 1, 2, 3]  # findings, then ranks in order
    assert "findings (uberprof)" in procs.values()
    # each rank: its training loop, its Gloo threads, uberprof's idle gaps
    names = _tracks(doc, ranks[1])
    assert any("training loop" in n for n in names.values())
    assert sum("pt_gloo_runloop" in n for n in names.values()) >= 1
    # counters: the node's CPU and NIC, in a process of the node, on the export's clock
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert {"CPU utilisation"} <= {e["name"] for e in counters}
    assert any(e["name"].startswith("NIC ") for e in counters)
    assert all(e["ts"] >= 0 for e in counters)
    # gzip by default, smaller than what it holds
    assert res.path.suffix == ".gz" and res.bytes_file < res.bytes_uncompressed / 4


def test_shifted_node_comes_out_aligned(logging_run: Path, tmp_path: Path) -> None:
    shift = 37_500_000
    run = shift_node(logging_run, tmp_path / "shifted", [2, 3], "node-b", shift)
    res = export_trace(open_run(run), tmp_path / "aligned.json")
    doc = load(res.path)
    assert validate_tef(doc) == []
    hosts = {h["host"]: h for h in doc["uberprof_export"]["clock_alignment"]["hosts"]}
    offset, bound = hosts["node-b"]["offset_ns"], hosts["node-b"]["error_bound_ns"]
    # within the error bound uberprof states for it (see test_diagnosis_runs), under 2 ms
    assert bound is not None and bound <= 2_000_000, hosts["node-b"]
    assert abs(offset + shift) <= max(100_000, bound), hosts["node-b"]
    # every event of the shifted ranks moved by exactly the estimated offset, nothing else
    compare_with_sources(res.path, run_sources(run), offsets={0: 0, 1: 0, 2: offset, 3: offset})
    # Collectives, found in the export by their exported times: no rank leaves one before every
    # rank has entered it (as on the real, shared clock), and the two nodes leave together.
    d = diagnose(run)
    pids = rank_pids(doc)
    spans = {(e["pid"], us_to_ns(e["ts"])): us_to_ns(e["ts"]) + us_to_ns(e["dur"])
             for e in doc["traceEvents"] if e["ph"] == "X" and e["name"].startswith("gloo:")}
    shifts = {0: 0, 1: 0, 2: offset, 3: offset}
    exported: dict[int, dict[int, tuple[int, int]]] = {}
    for row in d.matched.instances.to_pylist():
        s = row["start_ns"] + shifts[row["rank"]]
        end = spans.get((pids[row["rank"]], s - res.summary["time_base_ns"]))
        assert end is not None, row  # every matched collective is in the export, aligned
        exported.setdefault(row["instance"], {})[row["rank"]] = (s, end + res.summary["time_base_ns"])
    assert len(exported) >= 40
    causal = skew = 0
    skews = []
    for inst in exported.values():
        if len(inst) < 4:
            continue
        starts = [a for a, _ in inst.values()]
        ends = [b for _, b in inst.values()]
        causal += max(starts) <= min(ends) + 100_000
        skews.append(np.mean([inst[r][1] for r in (2, 3)]) - np.mean([inst[r][1] for r in (0, 1)]))
        skew += 1
    assert causal >= 0.95 * skew, (causal, skew)
    assert abs(float(np.median(skews))) < 2_000_000, np.median(skews)  # was 37.5 ms


def test_straggler_waits_are_marked(slow_compute_run: Path, tmp_path: Path) -> None:
    res = export_trace(open_run(slow_compute_run), tmp_path / "straggler.json",
                       ExportOptions(steps=(5, 8)))
    doc = load(res.path)
    assert validate_tef(doc) == []
    pids = rank_pids(doc)
    waits = [e for e in doc["traceEvents"] if e.get("cat") == "uberprof"
             and e["name"] == "waiting for rank 2"]
    assert {e["pid"] for e in waits} == {pids[0], pids[1], pids[3]}
    assert all("step" in e["args"]["collective"] and e["dur"] > 0 for e in waits)
    late = [e for e in doc["traceEvents"] if e.get("cat") == "uberprof"
            and e["pid"] == pids[2] and e["name"].startswith("late")]
    assert late
    # the findings process names the straggler first, spanning the selected steps
    fpid = next(e["pid"] for e in doc["traceEvents"] if e["ph"] == "M"
                and e["name"] == "process_name" and e["args"]["name"] == "findings (uberprof)")
    tracks = _tracks(doc, fpid)
    first = min(tracks)
    assert "straggler" in tracks[first], tracks
    finding = next(e for e in doc["traceEvents"] if e["pid"] == fpid and e["tid"] == first
                   and e["ph"] == "X")
    assert "Rank 2 is a straggler" in finding["name"] and finding["args"]["remedy"]
    steps = {e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep")}
    assert {"ProfilerStep#5", "ProfilerStep#8"} <= steps and "ProfilerStep#3" not in steps


def test_budget_on_a_real_run(counters_run: Path, tmp_path: Path) -> None:
    opened = open_run(counters_run)
    full = export_trace(opened, tmp_path / "full.json", ExportOptions(gzip=False))
    limit = full.bytes_uncompressed // 3
    res = export_trace(opened, tmp_path / "small.json",
                       ExportOptions(gzip=False, max_bytes=limit))
    doc = load(res.path)
    assert validate_tef(doc) == []
    assert res.bytes_uncompressed <= limit * 1.05
    what = [d["what"] for d in res.dropped if d["reason"] == "size budget"]
    assert what and any("host operators" in w for w in what), res.dropped
    names = {e.get("name") for e in doc["traceEvents"]}
    assert {"ProfilerStep#4", "ProfilerStep#6", "gloo:all_reduce"} <= names
    assert doc["uberprof_export"]["budget"]["limit_mb"] == round(limit / 1e6, 1)
