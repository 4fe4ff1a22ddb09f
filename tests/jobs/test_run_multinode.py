"""A two-node job (two torchrun invocations with --nnodes=2, one per network namespace)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests._jobs import PY, SAMPLES, info_json
from tests.netns import Node, requires_netns, two_nodes, wait_ok

pytestmark = [pytest.mark.netns, requires_netns]


def _launch(node: Node, out: Path, torchrun_args: list[str], steps: int) -> subprocess.Popen:
    argv = [PY, "-m", "uberprof", "run", "--out", str(out), "--trace-steps", "5-6", "--",
            PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            *torchrun_args, str(SAMPLES / "train_ddp.py"), "--steps", str(steps)]
    return node.start(argv)


def test_two_nodes_land_in_one_run_and_can_be_read_together(tmp_path: Path) -> None:
    with two_nodes("mn") as (a, b):
        # 1. c10d rendezvous with an id: both nodes find the same run directory by themselves.
        shared = tmp_path / "shared"
        rdzv = [f"--rdzv-endpoint={a.addr}:29611", "--rdzv-backend=c10d", "--rdzv-id=twonode"]
        wait_ok([_launch(a, shared, [*rdzv, "--rdzv_conf=is_host=1", f"--local_addr={a.addr}"], 12),
                 _launch(b, shared, [*rdzv, "--rdzv_conf=is_host=0", f"--local_addr={b.addr}"], 12)])
        info = info_json(shared / "twonode")
        assert info["problems"] == []
        assert sorted(n["host"] for n in info["nodes"]) == [a.hostname, b.hostname]
        assert [r["rank"] for r in info["ranks"]] == [0, 1]
        assert {r["host"] for r in info["ranks"]} == {a.hostname, b.hostname}
        for r in info["ranks"]:
            assert r["steps"] == 12 and [w["steps"] for w in r["trace_windows"]] == [[5, 6]]
        # The online clock estimate: measured across hosts, with its uncertainty.
        far = next(r for r in info["ranks"] if r["host"] != info["ranks"][0]["host"])
        assert far["clock"]["method"] == "store-ping"
        assert 0 < far["clock"]["offset_uncertainty_ns"] < 50_000_000
        # One machine, one real clock: the estimate must be within its uncertainty (plus slack).
        assert abs(far["clock"]["offset_to_rank0_ns"]) <= far["clock"]["offset_uncertainty_ns"] \
            + 2_000_000

        # 2. Static rendezvous without an id, each node writing to its own disk.
        static = [f"--master_addr={a.addr}", "--master_port=29612"]
        out_a, out_b = tmp_path / "local-a", tmp_path / "local-b"
        wait_ok([_launch(a, out_a, [*static, "--node_rank=0"], 8),
                 _launch(b, out_b, [*static, "--node_rank=1"], 8)])
        [run_a], [run_b] = list(out_a.iterdir()), list(out_b.iterdir())
        together = info_json(run_a, run_b)
        assert together["problems"] == []
        assert [r["rank"] for r in together["ranks"]] == [0, 1]
        assert len({r["job_id"] for r in together["ranks"]}) == 1
