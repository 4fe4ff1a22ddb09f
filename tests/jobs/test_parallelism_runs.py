"""The breakdown, the matching and the findings on real CPU (Gloo) jobs of each parallelism
(issue 25's acceptance): every rank computes, send/recv pair with the peer's recv/send,
collectives match within their mesh groups, an unbalanced pipeline names its slow stage and not
the link, tensor parallelism's all-reduces are exposed, FSDP2's reduce-scatter keeps its name,
and no number in the report is negative. How each job's parallelism is read:
tests/jobs/test_parallelism_reading.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._jobs import PY, job_env, time_limit
from tests._parallel_runs import Report

ALL_RUNS = ("tp_run", "fsdp2_run", "pipeline_run", "pp_dp_run", "fsdp_tp_run")
# Differences, signed by definition (not durations): a rank's lead, CPU time, run-queue wait or
# per-step excess against the others' median, a clock's offset, memory growth between steps, a
# projection's gain (the measured median step less the projected median: below 0 where the
# replay finds that fixing a finding gains nothing and the steps' medians differ).
# Every time and size must be >= 0.
SIGNED = ("excess_ms", "excess_pct", "median_lead_ms", "data_wait_excess_ms",
          "run_wait_excess_ms", "excess_per_step_ms", "offset_ns", "correction_ns",
          "gpu_growth_bytes", "gain_ms", "gain_pct")


def _negatives(x: Any, path: str = "") -> list[str]:
    if isinstance(x, dict):
        return [n for k, v in x.items() if k not in SIGNED
                for n in _negatives(v, f"{path}.{k}")]
    if isinstance(x, list):
        return [n for i, v in enumerate(x) for n in _negatives(v, f"{path}[{i}]")]
    if isinstance(x, (int, float)) and not isinstance(x, bool) and x < 0:
        return [f"{path} = {x}"]
    return []


@pytest.mark.parametrize("run", ALL_RUNS)
def test_every_rank_computes_and_no_number_in_the_report_is_negative(
        run: str, request: pytest.FixtureRequest) -> None:
    _, doc = request.getfixturevalue(run)
    for r in doc["ranks"]:
        assert r["breakdown_pct"]["compute"] > 5, (r["rank"], r["breakdown_pct"])
    assert _negatives(doc) == []  # one host: even clock offsets are 0


@pytest.mark.parametrize("run", ("pipeline_run", "pp_dp_run"))
def test_every_send_pairs_with_its_peers_receive(run: str,
                                                 request: pytest.FixtureRequest) -> None:
    _, doc = request.getfixturevalue(run)
    p2p = doc["run"]["p2p"]
    assert p2p["pairs"] > 0 and p2p["unmatched_calls"] == 0, p2p
    directions = {(d["src"], d["dst"]) for d in p2p["by_direction"]}
    stage = {int(r): s for r, s in doc["run"]["parallelism"]["stage_of"].items()}
    assert directions and all(stage[a] != stage[b] for a, b in directions)  # between stages
    # send/recv never reach the collective matcher
    names = {c["collective"] for c in doc["run"]["collectives"]["unmatched_examples"]}
    assert not names & {"send", "recv"}


def test_an_unbalanced_pipeline_names_its_slow_stage_and_not_the_link(
        pipeline_run: Report) -> None:
    doc = pipeline_run[1]
    pipe = doc["run"]["pipeline"]
    assert (pipe["stages"], pipe["schedule"], pipe["microbatches"]) == (2, "1f1b", 8), pipe
    assert pipe["ideal_bubble_pct"] == pytest.approx(100 / 9, abs=0.1)
    heavy, light = pipe["per_stage"][1], pipe["per_stage"][0]
    assert heavy["compute_ms"] > 1.3 * light["compute_ms"]
    # the light stage waits for the heavy one's gradients; the heavy one hardly waits at all
    assert light["wait_next_ms"] > heavy["wait_prev_ms"] + heavy["wait_next_ms"]
    [f] = [f for f in doc["findings"] if f["kind"] == "pipeline_imbalance"]
    assert f["ranks"] == [1] and f["evidence"]["slowest_stage"] == 1, f
    assert "Rebalance the stages" in f["remedy"] and "interconnect" not in f["remedy"]
    assert not [x for x in doc["findings"] if x["kind"] == "bandwidth"]
    for x in doc["findings"]:  # its waiting, if any, is the slow stage's, not the link's
        if x["kind"] == "exposed_comm" and x["evidence"]["wait_ms"] > 0:
            assert any(c["kind"] == "pipeline_imbalance" for c in x["caused_by"]), x


def test_tensor_parallel_all_reduces_are_exposed_communication(tp_run: Report) -> None:
    doc = tp_run[1]
    for r in doc["ranks"]:  # the blocking all-reduces (wait_tensor) are not compute
        assert r["breakdown_pct"]["exposed_comm"] > 10, r["breakdown_pct"]
    assert doc["run"]["collectives"]["unmatched_calls"] == 0


def test_fsdp2_reduce_scatter_keeps_its_name_and_size(fsdp2_run: Report) -> None:
    doc = fsdp2_run[1]
    [world] = doc["run"]["comm_by_group"]
    assert set(world["collectives"]) == {"allgather", "reducescatter"}, world
    classes = {(c["collective"], c["bytes"]) for c in doc["run"]["bandwidth"]}
    gathers = {b for n, b in classes if n == "allgather"}
    scatters = {b for n, b in classes if n == "reducescatter"}
    assert gathers and gathers == scatters  # each unit's whole buffer, gathered and scattered


@pytest.mark.parametrize("run, dims", [("pp_dp_run", {"dp"}), ("fsdp_tp_run", {"tp", "dp"})])
def test_collectives_of_a_mesh_match_within_their_groups(
        run: str, dims: set[str], request: pytest.FixtureRequest) -> None:
    _, doc = request.getfixturevalue(run)
    coll = doc["run"]["collectives"]
    assert coll["matched_instances"] > 0 and coll["unmatched_calls"] == 0, coll
    groups = doc["run"]["comm_by_group"]
    assert {g["dim"] for g in groups} == dims
    assert all(len(g["ranks"]) == 2 for g in groups)  # the mesh's rows or columns, not all 4


def _export(run: Path, out: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([PY, "-m", "uberprof", "export", str(run), "-o", str(out),
                           "--format", "chrome", "--no-gzip", "--no-counters"],
                          capture_output=True, text=True, timeout=time_limit(120),
                          env=job_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def test_export_draws_an_arrow_from_each_send_to_its_receive(pipeline_run: Report,
                                                              tmp_path: Path) -> None:
    run, doc = pipeline_run
    events = _export(run, tmp_path / "pipe.json")
    flows = [e for e in events if e.get("cat") == "uberprof.p2p"]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert len(starts) == doc["run"]["p2p"]["pairs"] and starts.keys() == ends.keys()
    # each arrow leaves one rank's process and lands on the other's, after it left
    assert all(starts[i]["pid"] != ends[i]["pid"] for i in starts)
    assert all(ends[i]["ts"] >= starts[i]["ts"] - 1 for i in starts)


def test_export_puts_each_mesh_dimensions_collectives_on_its_own_track(
        fsdp_tp_run: Report, tmp_path: Path) -> None:
    events = _export(fsdp_tp_run[0], tmp_path / "fsdptp.json")
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    on = {}
    for e in events:
        track = names.get((e.get("pid"), e.get("tid")), "")
        if e.get("cat") == "uberprof" and track.endswith("collectives (uberprof)"):
            on.setdefault(track, set()).add(e["name"].split()[0])
    assert on.get("tp collectives (uberprof)") == {"allreduce"}, on
    assert on.get("dp collectives (uberprof)") == {"allgather", "reducescatter"}, on
