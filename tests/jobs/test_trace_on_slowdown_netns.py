"""The slowdown trigger across two nodes (network namespaces, one rank each, one shared run
directory), under `uberprof run` with its default options: rank 1, on node b, computes twice
as long from step 80 on. Each node's agent watches its own rank; the first to see the rise
asks (the request's slot is created exclusively), the other finds the slot taken. One window
is recorded on both ranks at the same steps inside the slow stretch, and each node.json says
which node asked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._jobs import PY, SAMPLES, info_json
from tests.netns import Node, requires_netns, two_nodes, wait_ok
from uberprof.rundir import LOG_FILE

# timed jobs, as tests/jobs/test_trace_on_slowdown_jobs.py (whose numbers these are): the
# detector reads the step times' level against their own spread
pytestmark = [pytest.mark.netns, pytest.mark.solo, requires_netns]

SLOW_FROM, STEPS = 80, 400
SCHEDULED = [10, 19]


def _argv(out: Path, master: Node, node_rank: int, steps: int = STEPS) -> list[str]:
    return [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", "slow2", "--",
            PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            f"--master_addr={master.addr}", "--master_port=29671", f"--node_rank={node_rank}",
            str(SAMPLES / "train_ddp.py"), "--steps", str(steps), "--slow-rank", "1",
            "--slow-factor", "2", "--fault-steps", f"{SLOW_FROM}-{steps - 1}"]


def _nodes(run: Path) -> dict[str, dict[str, Any]]:
    return {m["host"]: m for m in (json.loads(p.read_text())
                                   for p in run.glob("nodes/*/node.json"))}


def test_a_slowdown_on_one_node_opens_one_window_on_both_nodes(tmp_path: Path) -> None:
    with two_nodes("sd") as (a, b):
        wait_ok([a.start(_argv(tmp_path, a, 0)), b.start(_argv(tmp_path, a, 1))])
    run = tmp_path / "slow2"
    nodes = _nodes(run)
    assert sorted(nodes) == [a.hostname, b.hostname]
    detected = [(host, d) for host, m in nodes.items() for d in m["slowdowns"]["detected"]]
    asked = [(host, d) for host, d in detected if d["requested"]]
    assert len(asked) == 1, detected  # one node asked; another that saw it found it asked
    (asker, found), = asked
    folders = {host: m["node"] for host, m in nodes.items()}
    # each node.json that saw the rise names the node that asked, the asker's own included;
    # rank 0's node may see none (its rank is not late, and the step time is noisy here). A
    # later rise (a loaded machine's) is over the budget of one window an hour, on either node
    for _, d in detected:
        assert d["refused"] is not None or (
            d["asked_by"] == {"node": folders[asker], "host": asker} and
            d["window"] == found["window"]), detected
    assert found["trigger"] in ("slowdown", "lateness")
    if asker == b.hostname:  # rank 1's own node: it is named, late against rank 0's work
        assert found["involved"] == [1], found
    assert SLOW_FROM <= found["onset"] <= SLOW_FROM + 5, found
    for m in nodes.values():  # both nodes read the other's rank: the run is shared
        assert (m["slowdowns"]["peer_ranks"], m["slowdowns"]["shared"]) == (1, True)
    info = info_json(run)
    assert info["problems"] == []
    windows = {r["rank"]: [(w["steps"], w["trigger"]) for w in r["trace_windows"]]
               for r in info["ranks"]}
    expected = [(SCHEDULED, "schedule"), (found["window"], found["trigger"])]
    assert windows == {0: expected, 1: expected}, windows
    assert SLOW_FROM < found["window"][0] and found["window"][1] < STEPS
    assert {r["host"] for r in info["ranks"]} == {a.hostname, b.hostname}


def test_nodes_with_run_directories_of_their_own_say_their_trigger_asks_their_ranks_only(
        tmp_path: Path) -> None:
    """Each node writes its own run directory: each sees 1 of the job's 2 ranks, and its log
    (on stderr), node.json and `uberprof info` say a slowdown opens a window on its own ranks
    only; the job runs to its end."""
    with two_nodes("sl") as (a, b):
        procs = [a.start(_argv(tmp_path / "a", a, 0, 120)),
                 b.start(_argv(tmp_path / "b", a, 1, 120))]
        wait_ok(procs)
    for node in (a, b):
        out = tmp_path / node.hostname[-1] / "slow2"
        (meta,) = _nodes(out).values()
        assert (meta["slowdowns"]["shared"], meta["slowdowns"]["ranks_seen"],
                meta["slowdowns"]["world_size"]) == (False, 1, 2), meta["slowdowns"]
        (log,) = out.glob(f"nodes/*/{LOG_FILE}")
        assert "shows 1 of the job's 2 ranks" in log.read_text()
        text = subprocess.run([PY, "-m", "uberprof", "info", str(out)], capture_output=True,
                              text=True, check=True).stdout
        assert "shows 1 of the job's 2 ranks (not shared)" in text, text
