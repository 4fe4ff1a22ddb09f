"""`uberprof export` on small synthetic traces: format validity, pass-through, ids, selection,
the size budget, and the command line. Real jobs are in test_export_runs.py."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from tests._export_check import compare_with_sources, load, rank_pids, us_to_ns, validate_tef
from tests._export_traces import write_gpu_run, write_traces
from tests._jobs import PY, job_env
from uberprof.analysis.read import open_run
from uberprof.cli import main
from uberprof.cli.params import parse_ranks, parse_steps
from uberprof.present.export import ExportError, ExportOptions, export_trace
from uberprof.present.export.chrome import ns_to_us
from uberprof.present.export.layout import IdSpace, nest_lanes, qualify
from uberprof.present.export.perfetto import default_format


def _export(src: Path, out: Path, **kw) -> tuple:  # type: ignore[no-untyped-def]
    # Derived tables next to the output (a temporary folder), never inside the inputs: the
    # shared traces are read-only.
    res = export_trace(open_run(src, out=out.parent / "derived"), out, ExportOptions(**kw))
    return res, load(res.path)


def test_lanes_keep_nesting_and_move_only_partial_overlaps() -> None:
    s = np.array([0, 10, 20, 900, 1000, 1000], dtype=np.int64)
    e = np.array([1000, 200, 150, 1100, 2000, 2000], dtype=np.int64)
    lanes = nest_lanes(s, e)
    # the step, its nested ops, the next step and an identical twin share lane 0; the span
    # that crosses the step boundary moves to lane 1
    assert lanes.tolist() == [0, 0, 0, 1, 0, 0]
    assert nest_lanes(np.array([0, 5], dtype=np.int64),
                      np.array([5, 9], dtype=np.int64)).tolist() == [0, 0]  # touching


def test_ids_are_unique_across_processes() -> None:
    ids = IdSpace(max_pid=12)
    tids = [ids.new_tid(p) for p in range(13) for _ in range(5)]
    assert len(set(tids)) == len(tids)
    assert not set(tids) & set(range(13))  # never a pid
    assert ids.new_tid(3) == 4005  # rank 3's sixth track
    assert len({ids.new_flow_id() for _ in range(100)}) == 100
    small = IdSpace(max_pid=2, stride=2)  # more tracks than the stride: still unique
    many = [small.new_tid(p) for p in range(3) for _ in range(4)]
    assert len(set(many)) == len(many) and not set(many) & {0, 1, 2}
    huge = IdSpace(max_pid=2_000_000)
    assert huge.new_tid(2_000_000) < 2**32 and huge.new_tid(0) > 2_000_000


def test_times_round_trip_to_the_nanosecond() -> None:
    for ns in (0, 1, 156_777, 999_999, 12_345_678_901, 3_600_000_000_001):
        us = ns_to_us(ns)
        assert us_to_ns(us) == ns  # ingest's reading
        assert int(us * 1000.0) == ns  # Perfetto's (truncating) reading


def test_synthetic_export_is_valid_and_passes_every_event_through(tmp_path: Path) -> None:
    src = write_traces(tmp_path / "traces")
    res, doc = _export(tmp_path / "traces", tmp_path / "out" / "merged.json")
    assert res.path.name == "merged.json.gz" and res.path.exists()
    assert not list((tmp_path / "out").glob(".*.tmp"))
    assert validate_tef(doc) == []
    counts = compare_with_sources(res.path, {r: [p] for r, p in src.items()})
    assert counts == {0: 19, 1: 19}  # 3 steps x 6 complete events + the profiler span
    # names and places
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[0] == "rank 0 (host-a, GPU 0)" and names[1] == "rank 1 (host-b, GPU 0)"
    threads = {e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0}
    assert {"stream 7", "PyTorch Profiler"} <= threads
    assert any(t.startswith("thread 4000 (pt_main_thread)") for t in threads)
    assert any("overlapping" in t for t in threads)  # Optimizer.step crosses the step end
    # launch flows renumbered: unique across ranks, both ends present
    flows = Counter((e["id"], e["ph"]) for e in doc["traceEvents"] if e.get("cat") == "ac2g")
    assert len(flows) == 2 * 3 * 2 and set(flows.values()) == {1}
    # Python function events are off by default, and the summary says so
    assert not [e for e in doc["traceEvents"] if e.get("cat") == "python_function"]
    assert any(d["reason"] == "python" and d["events"] == 6 for d in res.dropped)
    assert any(d["reason"] == "invalid" for d in res.dropped)  # the negative duration
    # profiler-wide instants belong to their rank's process, not the whole file
    inst = [e for e in doc["traceEvents"] if e["ph"] == "i" and e.get("cat") != "uberprof"]
    assert len(inst) == 2 and {e["s"] for e in inst} == {"p"}
    assert doc["uberprof_export"]["ranks"] == [0, 1]


def test_with_python_keeps_python_events(tmp_path: Path) -> None:
    src = write_traces(tmp_path / "traces")
    res, doc = _export(tmp_path / "traces", tmp_path / "m.json", python=True, gzip=False)
    assert res.path.name == "m.json"
    assert validate_tef(doc) == []
    compare_with_sources(res.path, {r: [p] for r, p in src.items()}, left_out=())
    assert sum(e.get("cat") == "python_function" for e in doc["traceEvents"]) == 6


def test_rank_and_step_selection(tmp_path: Path) -> None:
    write_traces(tmp_path / "traces", world=3, hosts=("a",))
    res, doc = _export(tmp_path / "traces", tmp_path / "sel.json", ranks={1, 2, 9}, steps=(2, 2))
    assert validate_tef(doc) == []
    pids = rank_pids(doc)
    assert sorted(pids) == [1, 2]
    assert any("9" in n for n in res.notes)
    steps = [e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep")]
    # step 2 and the steps touching it at its boundaries are kept; step 1's kernel is not
    assert "ProfilerStep#2" in steps
    kernels = [e for e in doc["traceEvents"] if e.get("name") == "gemm_kernel"]
    assert len(kernels) == 2  # one per selected rank
    with pytest.raises(ExportError):
        _export(tmp_path / "traces", tmp_path / "none.json", ranks={7})


def test_budget_drops_short_host_operators_first(tmp_path: Path) -> None:
    write_traces(tmp_path / "traces", small_ops=400)
    full, doc_full = _export(tmp_path / "traces", tmp_path / "full.json", gzip=False)
    assert full.dropped == [d for d in full.dropped if d["reason"] != "size budget"]
    limit = full.bytes_uncompressed // 2
    res, doc = _export(tmp_path / "traces", tmp_path / "small.json", gzip=False,
                       max_bytes=limit)
    assert validate_tef(doc) == []
    assert res.bytes_uncompressed <= limit
    budget = [d for d in res.dropped if d["reason"] == "size budget"]
    assert budget and "host operators" in budget[0]["what"]
    names = Counter(e.get("name") for e in doc["traceEvents"])
    assert names["aten::empty"] < 2 * 3 * 400  # the 1-µs operators went
    for keep in ("gemm_kernel", "ProfilerStep#1", "Optimizer.step#SGD.step", "aten::linear"):
        assert names[keep] == names_full(doc_full)[keep], keep
    assert doc["uberprof_export"]["dropped"] == res.dropped


def names_full(doc: dict) -> Counter:  # type: ignore[type-arg]
    return Counter(e.get("name") for e in doc["traceEvents"])


def test_cli_parsers() -> None:
    assert parse_steps("10-12") == (10, 12) and parse_steps("7") == (7, 7)
    assert parse_ranks("0,2,4-6") == {0, 2, 4, 5, 6}
    for bad in ("x", "5-3", "-1"):
        with pytest.raises(click.BadParameter):
            parse_steps(bad)
    for bad in ("a", "3-1", ""):
        with pytest.raises(click.BadParameter):
            parse_ranks(bad)


def test_cli_step_and_rank_options_say_what_is_wrong(tmp_path: Path) -> None:
    """The shared parameter types (uberprof.cli.params) reject bad ranges before any work."""
    for opt, bad, says in (("--steps", "5-3", "the range ends before it starts"),
                           ("--steps", "x", "use A-B or N, such as 10-12"),
                           ("--ranks", "3-1", "use a list such as 0,2,4-7")):
        res = CliRunner().invoke(main, ["export", str(tmp_path), "-o", str(tmp_path / "o.json"),
                                        opt, bad])
        assert res.exit_code == 2, res.output
        assert f"Invalid value for '{opt}'" in res.output and says in res.output, res.output


def test_cli_writes_and_reports(tmp_path: Path) -> None:
    write_traces(tmp_path / "traces")
    proc = subprocess.run([PY, "-m", "uberprof", "export", str(tmp_path / "traces"), "-o",
                           str(tmp_path / "cli.json"), "--ranks", "0"],
                          capture_output=True, text=True, timeout=300, env=job_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cli.json.gz").exists()
    assert "wrote" in proc.stderr and "1 rank(s)" in proc.stderr
    assert "Python function events" in proc.stderr
    bad = subprocess.run([PY, "-m", "uberprof", "export", str(tmp_path / "traces"), "-o",
                          str(tmp_path / "x.json"), "--ranks", "5"],
                         capture_output=True, text=True, timeout=300, env=job_env(), check=False)
    assert bad.returncode == 1 and "nothing to export" in bad.stderr
    pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    pf = subprocess.run([PY, "-m", "uberprof", "export", str(tmp_path / "traces"), "-o",
                         str(tmp_path / "cli.pftrace"), "--format", "perfetto", "--no-gzip",
                         "--steps", "2-3"],
                        capture_output=True, text=True, timeout=300, env=job_env(), check=False)
    assert pf.returncode == 0, pf.stderr
    assert (tmp_path / "cli.pftrace").read_bytes()[:1] == b"\x0a"  # Trace.packet, field 1
    # no --format and a name that does not say: the format that orders ranks in the UI
    dflt = subprocess.run([PY, "-m", "uberprof", "export", str(tmp_path / "traces"), "-o",
                           str(tmp_path / "plain"), "--no-gzip", "--steps", "2-3"],
                          capture_output=True, text=True, timeout=300, env=job_env(), check=False)
    assert dflt.returncode == 0, dflt.stderr
    assert (tmp_path / "plain").read_bytes()[:1] == b"\x0a"


def test_default_format_follows_the_name_then_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """.json stays JSON and .pftrace protobuf whatever is installed; any other name gets
    perfetto when its package imports (ranks in order in the UI), else chrome."""
    from uberprof.present.export import perfetto

    assert default_format(Path("run.json.gz")) == "chrome"
    assert default_format(Path("RUN.JSON")) == "chrome"
    assert default_format(Path("run.pftrace")) == "perfetto"

    def missing() -> None:
        raise ImportError("no perfetto")

    monkeypatch.setattr(perfetto, "_import_protos", missing)
    assert default_format(Path("run.trace")) == "chrome"
    assert default_format(Path("run.pftrace")) == "perfetto"  # asked for by name: says why not
    monkeypatch.setattr(perfetto, "_import_protos", lambda: None)
    assert default_format(Path("run.trace")) == "perfetto"


def test_names_end_apart_from_the_ids_viewers_append() -> None:
    """Perfetto shows "NAME PID" and "NAME TID": every name ends in a parenthesis, so "rank 2
    (vm, CPU) 2" is not read as CPU number 2 nor "idle gaps (uberprof) 3000" as a count."""
    assert qualify("rank 2", "vm, CPU") == "rank 2 (vm, CPU)"
    assert qualify("idle gaps (uberprof)", "lane 2") == "idle gaps (uberprof, lane 2)"
    assert qualify("thread 7 (training loop)", "overlapping 1") == \
        "thread 7 (training loop, overlapping 1)"


def test_gpu_counters_sit_in_their_rank(tmp_path: Path) -> None:
    run = write_gpu_run(tmp_path / "run")
    _, doc = _export(run, tmp_path / "gpu.json")
    assert validate_tef(doc) == []
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    pids = rank_pids(doc)
    assert names[pids[0]] == "rank 0 (host-a, GPU 3)"  # the NVML index, found by UUID
    assert names[pids[1]] == "rank 1 (host-b, GPU 3)"
    assert all(n.endswith(")") for n in names.values()), names  # apart from the pid viewers add
    series: dict[int, set[str]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            series.setdefault(e["pid"], set()).add(e["name"])
            assert e["ts"] >= 0
    assert {"GPU 3 SM clock", "GPU 3 power", "GPU 3 utilisation"} <= series[pids[0]]
    node_a = next(p for p, n in names.items() if n.startswith("node host-a"))
    # the node keeps its NIC and the GPU no exported rank owns
    assert series[node_a] == {"NIC eth0 rx", "NIC eth0 tx", "GPU 5 SM clock"}
    tx = [e["args"]["Gbit/s"] for e in doc["traceEvents"]
          if e["ph"] == "C" and e["pid"] == node_a and e["name"] == "NIC eth0 tx"]
    assert tx and all(v == 10.0 for v in tx)  # 1.25e9 B/s
    # sorted: findings, rank 0, node host-a, rank 1, node host-b
    sort = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_sort_index"}
    order = [names[p].split(" (")[0] for p in sorted(sort, key=sort.get)]
    assert order == ["findings", "rank 0", "node host-a", "rank 1", "node host-b"]
    _, doc2 = _export(run, tmp_path / "nc.json", counters=False)
    assert not [e for e in doc2["traceEvents"] if e["ph"] == "C"]


def test_several_trace_windows_per_rank(tmp_path: Path) -> None:
    run = write_gpu_run(tmp_path / "run", windows=2)
    res, doc = _export(run, tmp_path / "two.json")
    assert validate_tef(doc) == []
    sources = {r: sorted((run / "ranks" / str(r) / "traces").glob("*.gz")) for r in (0, 1)}
    assert compare_with_sources(res.path, sources) == {0: 38, 1: 38}
    # the second window reuses the first one's tracks
    names = [e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0]
    assert len(names) == len(set(names))
    # a step of the second window: only that file is read
    _, doc2 = _export(run, tmp_path / "second.json", steps=(12, 12))
    assert validate_tef(doc2) == []
    steps = {e["name"] for e in doc2["traceEvents"] if e.get("name", "").startswith("Profiler")}
    assert "ProfilerStep#12" in steps and not any(s in steps for s in ("ProfilerStep#2",
                                                                       "ProfilerStep#1"))


SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")
@pytest.mark.parametrize("folder", ["hta/trace_filter", "hta/nccl_parser_config",
                                    "hta/amd_trace", "tb_plugin/resnet50_num_workers_4"])
def test_real_gpu_traces(folder: str, tmp_path: Path) -> None:
    """Traces recorded by others on A100, MI250 and (2021) V100: GPU streams, launch and
    forward-backward flows, NCCL kernels, the old absolute-µs format."""
    from uberprof.analysis.tables.pipeline import analyze

    res, doc = _export(SHARED / folder, tmp_path / "x.json")
    assert validate_tef(doc) == []
    a = analyze(SHARED / folder, out=tmp_path / "derived")
    ranks = {e["rank"] for e in a.inputs.values() if e.get("status") == "ok"}
    sources = {r: a.trace_files(r) for r in ranks}
    hosts = doc["uberprof_export"]["clock_alignment"]["hosts"]
    offsets = {r: h["offset_ns"] for h in hosts for r in h["ranks"]}
    compare_with_sources(res.path, sources, offsets=offsets)
    tracks = {e["args"]["name"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(t.startswith("stream ") or " · stream " in t for t in tracks), tracks


SHARED_NCCL = SHARED / "hta" / "nccl_parser_config"


@pytest.mark.skipif(not SHARED_NCCL.is_dir(), reason="the shared traces are not here")
@pytest.mark.parametrize("fraction", [0.2, 0.35])
def test_budget_counts_uberprofs_own_marks_so_the_export_fits(tmp_path: Path,
                                                              fraction: float) -> None:
    """A real NCCL trace cut to a fraction of its export: what is written stays within the
    budget once the findings' marks (never dropped) are weighed as they are written, and the
    budget is used (not met by dropping far more than needed)."""
    opened = open_run(SHARED_NCCL, out=tmp_path / "derived")
    full = export_trace(opened, tmp_path / "full.json", ExportOptions(gzip=False))
    limit = int(full.bytes_uncompressed * fraction)
    res = export_trace(opened, tmp_path / "cut.json", ExportOptions(gzip=False, max_bytes=limit))
    assert any(d["reason"] == "size budget" for d in res.dropped)
    assert 0.8 * limit <= res.bytes_uncompressed <= limit


@pytest.mark.skipif(not SHARED_NCCL.is_dir(), reason="the shared traces are not here")
def test_a_budget_below_what_is_never_dropped_says_so_and_how_to_fit(tmp_path: Path) -> None:
    """At a twentieth of its export, a real NCCL trace's collectives, steps and findings alone
    exceed the budget: with its steps given (--steps 4-6: all three), the export drops every
    droppable tier, writes what is left, and a note names the size it could not go below and
    the options that would fit (none at a budget that fits). Without --steps it chooses
    steps instead (test_export_autosteps.py)."""
    opened = open_run(SHARED_NCCL, out=tmp_path / "derived")
    full = export_trace(opened, tmp_path / "full.json", ExportOptions(gzip=False))
    limit = int(full.bytes_uncompressed * 0.05)
    res = export_trace(opened, tmp_path / "cut.json",
                       ExportOptions(gzip=False, max_bytes=limit, steps=(4, 6)))
    assert res.bytes_uncompressed > limit
    [note] = [n for n in res.notes if n.startswith("over the size budget")]
    assert "--steps" in note and "--ranks" in note and "--max-mb" in note
    said_mb = float(note.split("come to about ")[1].split(" MB")[0])
    assert 0.8 * res.bytes_uncompressed / 1e6 <= said_mb <= 1.25 * res.bytes_uncompressed / 1e6
    ok = export_trace(opened, tmp_path / "ok.json",
                      ExportOptions(gzip=False, max_bytes=int(full.bytes_uncompressed * 0.35),
                                    steps=(4, 6)))
    assert not [n for n in ok.notes if n.startswith("over the size budget")]
