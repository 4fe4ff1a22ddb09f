"""The step graph on the real GPU traces in ../shared/traces: two lanes per GPU rank joined by
launches and synchronisations (`reach` edges), ranks joined by their collectives; the replay
reproduces the measured steps, and the critical path agrees with what the report's tests found
by hand (tests/unit/test_report_traces.py: the NCCL trace is launch- and host-bound)."""

from __future__ import annotations

from pathlib import Path

import pytest

from uberprof.analysis.diagnosis.busy import busy_times
from uberprof.analysis.diagnosis.whatif import (
    critical_path_doc,
    parse_changes,
    project,
    replay_doc,
    run_graph,
)
from uberprof.analysis.read import open_run

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is not there")


def _graph(folder: str, out: Path):
    opened = open_run(TRACES / folder, out=out, workers=1)
    d = opened.diagnosis
    assert opened.ctx is not None and d is not None
    return run_graph(opened.ctx, d.steps, d.matched.instances, d.alignment.offsets(),
                     d.p2p, busy_times(opened.ctx)), d


@pytest.mark.parametrize("folder", ["hta/trace_filter", "hta/nccl_parser_config",
                                    "hta/ns_resolution_trace",
                                    "tb_plugin/resnet50_num_workers_4"])
def test_gpu_ranks_replay_their_steps(folder: str, tmp_path: Path) -> None:
    g, d = _graph(folder, tmp_path)
    assert g.device_lanes and set(g.device_lanes) == set(g.lanes)
    assert g.counts()["reach_edges"] > 0  # launches and syncs join the two lanes
    doc = replay_doc(g, d.steps)
    assert doc["steps"] and doc["fit_for_projection"], doc["why"]
    assert doc["max_error_pct"] <= 5.0
    cp = critical_path_doc(g)
    for s in cp["steps"]:  # the pieces tile each step
        assert sum(s["by_kind_ms"].values()) == pytest.approx(s["length_ms"], rel=0.01)


def test_two_ranks_of_a_big_job_wait_on_each_other(tmp_path: Path) -> None:
    g, d = _graph("hta/trace_filter", tmp_path)
    c = g.counts()
    assert len(g.lanes) == 2 and c["barrier_nodes"] == 5 and c["comm_nodes"] == 10
    doc = project(g, d.steps, parse_changes([], 2.0, []), straggler=None)
    assert doc["projected_step_ms"] <= doc["baseline_step_ms"]


def test_the_launch_bound_trace_has_its_path_on_the_host(tmp_path: Path) -> None:
    g, d = _graph("hta/nccl_parser_config", tmp_path)
    cp = critical_path_doc(g)
    assert cp["kind"] == "host" and cp["by_kind_pct"]["host"] > 80
    # its longest kernel twice as fast: the device waits for its launches all the same
    longest = max(range(len(g.names)), key=lambda c: int(g.op_ns[g.op_name == c].sum()))
    doc = project(g, d.steps, parse_changes([], None, [f"{g.names[longest]}=2"]),
                  straggler=None)
    assert doc["changes"][0]["operator_ms"] > 0 and doc["gain_pct"] < 2.0


def test_removing_launch_overhead_on_a_launch_bound_gpu_trace_shortens_its_steps(
        tmp_path: Path) -> None:
    """ResNet-50 on one GPU with its device waiting for launches: the launch-bound finding
    carries the gain `--remove launch` projects, and the change removes device idle that
    waited for launches and time in launch calls."""
    g, d = _graph("tb_plugin/resnet50_num_workers_4", tmp_path)
    doc = project(g, d.steps, parse_changes(["launch"], None, []), straggler=None)
    ch = doc["changes"][0]
    assert ch["device_idle_ms"] > 0 and ch["launch_overhead_ms"] > 0, ch
    assert doc["projected_step_ms"] < doc["baseline_step_ms"], doc
    (f,) = [f for f in d.findings if f.kind == "launch_bound"]
    assert f.projected_gain["projected_step_ms"] == doc["projected_step_ms"]
    assert f.projected_gain["gain_pct"] == doc["gain_pct"]
