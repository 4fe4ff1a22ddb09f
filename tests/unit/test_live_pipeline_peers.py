"""The live indications of a pipeline-parallel run (`uberprof watch`, the live dashboard): ranks
are compared with their peers only, the ranks that do the same work, from the parallel layout
each rank records in its rank.json (`uberprof/collect/rank/layout.py`,
`uberprof.analysis.diagnosis.step_signals.peer_sets`). The 2-rank pipeline job itself:
tests/jobs/test_live_pipeline.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from uberprof.analysis.diagnosis.step_signals import followed_signals, peer_sets, step_signals
from uberprof.rundir.follow import RunFollower


def _cpu(ranks: int, steps: int, ms: dict[int, float], seed: int = 0) -> list[Any]:
    """The training thread's CPU time per step: `ms[r]` ms on rank r (1% noise)."""
    rng = np.random.default_rng(seed)
    return [(r, np.arange(steps), (ms[r] * 1e6 * (1 + 0.01 * rng.standard_normal(steps)))
             .astype(np.int64)) for r in range(ranks)]


def _alike(ranks: int, steps: int, seed: int = 1) -> tuple[list[Any], list[Any]]:
    """Step times alike (a pipeline's ranks wait for each other), no data wait."""
    rng = np.random.default_rng(seed)
    s = np.arange(steps)
    return ([(r, s, (250e6 + rng.normal(0, 2e6, steps)).astype(np.int64)) for r in range(ranks)],
            [(r, s, np.zeros(steps, np.int64)) for r in range(ranks)])


def test_two_stages_with_different_cpu_times_give_no_straggler() -> None:
    times, waits = _alike(2, 40)
    busy = _cpu(2, 40, {0: 60, 1: 200})  # stage 1 is the heavier stage, by design
    # compared as one group (no layout), stage 1 is "a straggler": the wrong verdict
    assert [s.kind for s in step_signals(times, waits, busy=busy)] == ["straggler"]
    # each rank its own stage: nobody to compare with
    assert step_signals(times, waits, busy=busy, peers=[[0], [1]]) == []


def test_a_slow_replica_within_a_stage_is_still_a_straggler() -> None:
    """2 stages x 2 data-parallel replicas: ranks 0, 1 are stage 0 and 2, 3 stage 1; stage 1
    computes 3x more (no straggler), and rank 3 30% more than its replica (a straggler)."""
    times, waits = _alike(4, 40)
    busy = _cpu(4, 40, {0: 60, 1: 60, 2: 180, 3: 234})
    found = step_signals(times, waits, busy=busy, peers=[[0, 1], [2, 3]])
    assert [(s.kind, s.rank, s.confidence) for s in found] == [("straggler", 3, "confirmed")]
    assert "CPU time" in found[0].title
    even = _cpu(4, 40, {0: 60, 1: 60, 2: 180, 3: 180})
    assert step_signals(times, waits, busy=even, peers=[[0, 1], [2, 3]]) == []


def _group(name: str, desc: str, ranks: list[int]) -> dict[str, Any]:
    return {"name": name, "desc": desc, "ranks": ranks, "backend": "gloo"}


def _write_run(root: Path, metas: dict[int, dict[str, Any]], cpu_ms: dict[int, float],
               steps: int = 30) -> Path:
    """A run directory whose ranks recorded `metas` (rank.json) and step timelines with
    alike step times and `cpu_ms[r]` of CPU time per step."""
    root.mkdir(parents=True)
    (root / "run.json").write_text('{"run_id": "pp"}')
    rng = np.random.default_rng(2)
    for r, meta in metas.items():
        d = root / "ranks" / str(r)
        d.mkdir(parents=True)
        (d / "rank.json").write_text(json.dumps({"rank": r, "world_size": len(metas), **meta}))
        rows = [{"kind": "step", "step": s, "host_start_ns": s * 300_000_000,
                 "host_end_ns": s * 300_000_000 + int(250e6 + rng.normal(0, 2e6)),
                 "data_wait_ns": 0,
                 "cpu_ns": int(cpu_ms[r] * 1e6 * (1 + 0.01 * rng.standard_normal()))}
                for s in range(steps)]
        (d / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return root


def _world(n: int) -> dict[str, Any]:
    return _group("0", "default_pg", list(range(n)))


def test_the_peers_are_read_from_the_layout_in_rank_json(tmp_path: Path) -> None:
    # a 1-D pipeline (torch.distributed.pipelining over the world): each rank its own stage
    one_d = {r: {"process_groups": [_world(2)], "parallel_apis": ["pipelining"]} for r in (0, 1)}
    peers = peer_sets(one_d)
    assert peers.sets == [[0], [1]] and peers.stages == 2
    # a 2x2 mesh ("pp", "dp") = [[0, 1], [2, 3]]: stage = the index in the "mesh_pp" group
    pp = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    dp = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    mesh = {r: {"process_groups": [_world(4), _group("1", "mesh_pp", pp[r]),
                                   _group("3", "mesh_dp", dp[r])],
                "parallel_apis": ["pipelining"]} for r in range(4)}
    peers = peer_sets(mesh)
    assert peers.sets == [[0, 1], [2, 3]] and peers.stages == 2
    # data parallel, a mesh without a pipeline dimension (pipelining imported but unused), and
    # ranks that recorded no layout (older runs): every rank is every other's peer
    dp_only = {r: {"process_groups": [_world(2)], "parallel_apis": []} for r in (0, 1)}
    named = {r: {"process_groups": [_world(4), _group("1", "mesh_dp", dp[r])],
                 "parallel_apis": ["pipelining"]} for r in range(4)}
    old = {r: {"process_groups": [{"name": "default", "ranks": [0, 1]}]} for r in (0, 1)}
    for metas in (dp_only, named, old):
        assert peer_sets(metas).sets is None and peer_sets(metas).note() is None
    # a rank of a pipeline run without a layout yet is nobody's peer
    assert peer_sets({**mesh, 3: {}}).sets == [[0, 1], [2], [3]]

    # read from the run directory, as `uberprof watch` does
    run = _write_run(tmp_path / "pp", one_d, {0: 60, 1: 200})
    follower = RunFollower(run)
    follower.poll()
    found = followed_signals(follower)
    assert [(s.kind, s.confidence) for s in found] == [("pipeline_imbalance", "none")]
    assert found[0].title.startswith("pipeline of 2 stages: the stages do different work")
    # the same timelines, the layout of a data-parallel run: the straggler test as before
    for r in (0, 1):
        path = run / "ranks" / str(r) / "rank.json"
        path.write_text(json.dumps({"rank": r, "world_size": 2, **dp_only[r]}))
        os.utime(path, ns=(time.time_ns() + 10**9,) * 2)  # a new mtime, whatever the clock
    found = followed_signals(follower)
    assert [(s.kind, s.rank) for s in found] == [("straggler", 1)]


def test_parallel_layout_lists_a_real_device_meshs_groups_with_their_descs(
        one_rank_process_group: None) -> None:
    """A real one-rank Gloo process group in this process, with a 2-D device mesh ("pp",
    "dp"): a backend named per dimension makes the mesh create its own groups, as it does
    with more than one rank."""
    import sys

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from uberprof.collect.rank.layout import parallel_layout

    init_device_mesh("cpu", (1, 1), mesh_dim_names=("pp", "dp"),
                     backend_override={"pp": "gloo", "dp": "gloo"})
    layout = parallel_layout(dist)
    groups = [(g["desc"], g["ranks"], g["backend"]) for g in layout["process_groups"]]
    assert groups == [("default_pg", [0], "gloo"), ("mesh_pp", [0], "gloo"),
                      ("mesh_dp", [0], "gloo")]
    assert len({g["name"] for g in layout["process_groups"]}) == 3
    assert layout["apis"] == (["pipelining"] if "torch.distributed.pipelining"
                              in sys.modules else [])
