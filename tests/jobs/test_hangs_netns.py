"""A hang across two nodes (network namespaces, one rank each, one shared run directory): each
node's watchdog captures its own rank and stops its part of the job; the report names the
rank that never came back, on its node, and the collective the other waits in.

Node a's timeout is longer than node b's, so node b captures first: its part of the job is
stopped only once node a recorded the hang too (stopping rank 1 first broke rank 0's all-reduce,
rank 0 died before its capture and was named the culprit, seen in CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._failures import FAULTY, HANG_TIMEOUT, first_finding, line_of, rank_doc
from tests._jobs import PY
from tests.netns import Node, requires_netns, two_nodes
from uberprof.collect.watchdog import HANG_EXIT_CODE

pytestmark = [pytest.mark.netns, requires_netns]


def test_a_hang_across_two_nodes(tmp_path: Path) -> None:
    def argv(a: Node, i: int) -> list[str]:
        timeout = str(float(HANG_TIMEOUT) + (4 if i == 0 else 0))
        return [PY, "-m", "uberprof", "run", "--out", str(tmp_path), "--run-id", "hang2",
                "--no-trace", "--hang-timeout", timeout, "--on-hang", "stop", "--",
                PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                f"--master_addr={a.addr}", "--master_port=29655", f"--node_rank={i}",
                str(FAULTY), "--fault", "sleep", "--rank", "1"]

    with two_nodes("hang") as (a, b):
        procs = [a.start(argv(a, 0)), b.start(argv(a, 1))]
        results = [p.communicate(timeout=180) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [HANG_EXIT_CODE, HANG_EXIT_CODE], [r[1][-2000:] for r in results]
    f = first_finding(tmp_path / "hang2", "hang")
    assert f["ranks"] == [1] and sorted(f["evidence"]["nodes"]) == [a.hostname, b.hostname]
    stuck = rank_doc(f, 1)
    assert stuck["where"].endswith(f"faulty.py:{line_of('time.sleep(1)')} in stuck_forever")
    w = f["evidence"]["waiting_in"]
    assert (w["op"], w["process_group"], w["ranks"]) == ("all_reduce", "default_pg", [0])
