"""Two nodes in network namespaces joined by a veth pair capped with tc at 1 Gbit/s, running a
Gloo all-reduce loop: the veth's NIC counters show throughput near the cap, and the cap is
recorded for analysis."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests._jobs import PY, START_S, time_limit
from tests.netns import Node, requires_netns, two_nodes, wait_ok
from uberprof.collect.counters import link_caps, read_counters

pytestmark = [pytest.mark.netns, requires_netns]

CAP_BYTES = 125e6  # 1 Gbit/s

ALLREDUCE_LOOP = """
import argparse, json, os, time
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=6.0)
p.add_argument("--out", required=True)
a = p.parse_args()
dist.init_process_group("gloo")
x = torch.ones(4 * 1024 * 1024)  # 16 MiB per all-reduce
dist.all_reduce(x)
flag = torch.zeros(1)
t0, n = time.time_ns(), 0
while True:  # stop together: rank 0's clock decides, shared through a tiny all-reduce
    dist.all_reduce(x)
    n += 1
    flag[0] = float(dist.get_rank() == 0 and time.time_ns() - t0 > a.seconds * 1e9)
    dist.all_reduce(flag)
    if flag[0] > 0:
        break
t1 = time.time_ns()
if dist.get_rank() == 0:
    with open(a.out, "w") as f:
        json.dump({"start_ns": t0, "end_ns": t1, "iterations": n}, f)
dist.destroy_process_group()
"""


def _launch(node: Node, rank: int, master: Node, port: int, out: Path, script: Path,
            loop_file: Path) -> subprocess.Popen[str]:
    argv = [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", "capped", "--no-trace",
            "--sample-hz", "4", "--",
            PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            f"--node_rank={rank}", f"--master_addr={master.addr}", f"--master_port={port}",
            str(script), "--seconds", "6", "--out", str(loop_file)]
    return node.start(argv)


def test_veth_counters_show_the_tc_cap_under_allreduce(tmp_path: Path) -> None:
    script = tmp_path / "allreduce_loop.py"
    script.write_text(ALLREDUCE_LOOP)
    loop_file = tmp_path / "loop.json"
    out = tmp_path / "runs"
    port = 29700 + os.getpid() % 200
    with two_nodes("ct", rate="1gbit") as (a, b):
        wait_ok([_launch(a, 0, a, port, out, script, loop_file),
                 _launch(b, 1, a, port, out, script, loop_file)], timeout=time_limit(START_S + 6))
    loop = json.loads(loop_file.read_text())
    run = out / "capped"
    for node in (a, b):
        df = read_counters(run, node.hostname, sources=["nic"])
        veth = df[df.device == node.veth]
        # The cap is recorded, in bytes/s, in the table and in meta.json; the veth has no speed.
        assert set(veth[veth.metric == "tc_rate"].value) == {CAP_BYTES}
        assert veth[veth.metric == "link_speed"].empty
        assert link_caps(run, node.hostname)[node.veth] == CAP_BYTES
        # Throughput while the loop runs (skipping its first second and last half second).
        during = veth[(veth.ts_ns > loop["start_ns"] + 1e9) & (veth.ts_ns < loop["end_ns"] - 5e8)]
        for metric in ("tx_rate", "rx_rate"):
            rates = during[during.metric == metric].value
            assert len(rates) >= 12, (metric, len(rates))
            median = float(rates.median())
            assert 0.75 * CAP_BYTES <= median <= 1.05 * CAP_BYTES, (node.hostname, metric, median)
        # Before the job started talking, the link was quiet.
        before = veth[(veth.metric == "tx_rate") & (veth.ts_ns < loop["start_ns"] - 5e8)]
        assert before.empty or float(before.value.median()) < 0.1 * CAP_BYTES
