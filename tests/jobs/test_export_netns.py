"""The two-node run (two network namespaces joined by a veth pair capped at 1 Gbit/s) exported:
each rank's events round-trip through ingest, the file obeys the Trace Event Format, each rank
is named with its own host, each node's counters (its veth's throughput) sit in a process of
their own, and the gradient all-reduce is marked bandwidth-bound on both ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._export_check import compare_with_sources, load, rank_pids, validate_tef
from tests._export_traces import run_sources
from tests._jobs import PY, SAMPLES
from tests.netns import Node, requires_netns, two_nodes, wait_ok
from uberprof.analysis.read import open_run
from uberprof.present.export import export_trace

pytestmark = [pytest.mark.netns, requires_netns]


def _job(a: Node, b: Node, out: Path, run_id: str, port: int) -> Path:
    def argv(i: int) -> list[str]:
        return [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id,
                "--trace-steps", "3-8", "--sample-hz", "10", "--",
                PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                f"--master_addr={a.addr}", f"--master_port={port}", f"--node_rank={i}",
                str(SAMPLES / "train_ddp.py"), "--steps", "10"]
    wait_ok([a.start(argv(0)), b.start(argv(1))])
    return out / run_id


def test_two_node_export(tmp_path: Path) -> None:
    with two_nodes("exp", rate="1gbit") as (a, b):
        run = _job(a, b, tmp_path, "twonode", 29651)
    res = export_trace(open_run(run), tmp_path / "twonode.json")
    doc = load(res.path)
    assert validate_tef(doc) == []
    hosts = {h["host"]: h for h in doc["uberprof_export"]["clock_alignment"]["hosts"]}
    assert set(hosts) == {a.hostname, b.hostname}
    offsets = {r: h["offset_ns"] for h in hosts.values() for r in h["ranks"]}
    counts = compare_with_sources(res.path, run_sources(run), offsets=offsets)
    assert sorted(counts) == [0, 1]
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    pids = rank_pids(doc)
    assert {names[pids[0]].split(" (")[1].split(", ")[0],
            names[pids[1]].split(" (")[1].split(", ")[0]} == \
        {a.hostname, b.hostname}
    # each node's counters: its own process, its veth's throughput
    node_procs = {p: n for p, n in names.items() if n.startswith("node ")}
    assert len(node_procs) == 2
    for pid in node_procs:
        series = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == pid}
        assert any(s.startswith("NIC v") and s.endswith(" tx") for s in series), series
    # the report's verdict, on the timeline: the capped link limits the gradient all-reduce
    bound = [e for e in doc["traceEvents"] if e.get("cat") == "uberprof"
             and e["name"].startswith("bandwidth-bound: allreduce")]
    assert {e["pid"] for e in bound} == {pids[0], pids[1]}
    assert all(e["args"]["link"] == "inter-node" and e["args"]["peak_gbit_s"] == 1.0
               for e in bound)
