"""A desync that ends in an abort, judged from synthetic evidence: the culprit is read from each
rank's collective sequence (the Flight Recorder dumps a rank wrote when it raised, or when its
launcher saw a peer fail), never the rank that aborted on the mismatch it met. The real Gloo
job is tests/jobs/test_crash_jobs.py; NCCL's equivalent (no NCCL here) is this dump."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from uberprof.analysis.diagnosis.findings.failures import failure_findings
from uberprof.collect.rank import exits
from uberprof.rundir import RunDir, write_json_atomic
from uberprof.rundir.layout import PEER_FAILED_REQUEST_FILE

T0 = 10**18
C10D = [{"file": "/job/train.py", "line": 13, "function": "<module>"},
        {"file": "/x/site-packages/torch/distributed/distributed_c10d.py", "line": 3252,
         "function": "all_reduce"}]


def _nccl_rank(run: RunDir, node: str, rank: int, last: list[list[int]], reason: str) -> Path:
    """A rank of a DDP job on NCCL: 3 finished steps, each the gradients' bucket (all_reduce
    [4680]) then the loss for logging (all_reduce [1]); then `last` (sizes) in step 3; its Flight
    Recorder dump (`reason`) with NCCL's names and times inside the steps."""
    d = run.claim_rank_dir(rank)
    write_json_atomic(d / "rank.json", {"rank": rank, "pid": 10**6 + rank, "node": node,
                                        "world_size": 4, "start_ns": T0})
    with open(d / "steps.jsonl", "w") as f:
        f.writelines(json.dumps({"kind": "step", "step": s, "host_start_ns": T0 + s * 10**9,
                                 "host_end_ns": T0 + (s + 1) * 10**9}) + "\n" for s in range(3))
    calls = [(size, T0 + s * 10**9 + 10**8 * (i + 1), True)
             for s in range(3) for i, size in enumerate(([4680], [1]))]
    calls += [(size, T0 + 3 * 10**9 + 10**8 * (i + 1), False) for i, size in enumerate(last)]
    dump = {"entries": [{"collective_seq_id": i + 1, "process_group": ["0", "default_pg"],
                         "profiling_name": "nccl:all_reduce", "input_sizes": [size],
                         "input_dtypes": ["Float"], "retired": done,
                         "state": "completed" if done else "scheduled", "time_created_ns": t}
                        for i, (size, t, done) in enumerate(calls)]}
    (d / f"flight-recorder-{reason}.json").write_text(json.dumps(
        {"time_ns": T0 + 4 * 10**9, "reason": reason, "dump": dump}))
    return d


def test_an_nccl_watchdog_timeout_after_a_skipped_all_reduce_names_the_rank_that_skipped(
        tmp_path: Path) -> None:
    """Rank 2 skipped the loss's all-reduce in step 3: its next call (the next step's bucket,
    [4680]) has the number the others' loss all-reduce [1] has. Ranks 0, 1 and 3 time out in
    NCCL's watchdog (a victim's error) and dump; rank 2 dumped when its launcher saw rank 1
    fail. Rank 2 is the culprit, from its sequence, whatever raised first."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    dirs = {r: _nccl_rank(run, node.name, r, [[4680], [4680]] if r == 2 else [[4680], [1]],
                          "peer_failed" if r == 2 else "exception") for r in range(4)}
    for r in (0, 1, 3):
        (dirs[r] / "exceptions.jsonl").write_text(json.dumps(
            {"time_ns": T0 + 5 * 10**9 + r, "type": "DistBackendError",
             "message": f"[Rank {r}] Watchdog caught collective operation timeout: "
                        "WorkNCCL(SeqNum=8, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                        "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
             "where": "excepthook", "frames": C10D}) + "\n")
    (crash,) = [f for f in failure_findings(run.root) if f.kind == "crash"]
    assert crash.cause == "desync" and crash.ranks == [2], crash.title
    m = crash.evidence["desync"]["mismatch"]
    assert (m["seq"], m["decided_by"], m["ranks"]) == (8, "history", [2])
    assert crash.title.startswith("Crash after a collective desync: rank 2 departed first")
    assert "rank 2 issued all_reduce [4680] where the others issued all_reduce [1]" in crash.title
    assert crash.title.endswith("ranks 0, 1, 3 failed after it (victims)")


def _gloo_abort(tmp_path: Path, skipper_dumped: bool) -> RunDir:
    """Gloo's abort: rank 1 receives rank 2's bucket where it expected the loss and dies of
    SIGABRT in the all-reduce (torchrun records it); rank 0 raises "Connection closed by peer";
    ranks 2 and 3 are ended by torchrun after dumping at their launcher's request (rank 2's
    dump left out with `skipper_dumped` False)."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    dirs = {}
    for r in range(4):
        reason = "exception" if r == 0 else "peer_failed" if r != 1 else "none"
        dirs[r] = _nccl_rank(run, node.name, r, [[4680], [4680]] if r == 2 else [[4680], [1]],
                             reason)
    (dirs[1] / "flight-recorder-none.json").unlink()
    if not skipper_dumped:
        (dirs[2] / "flight-recorder-peer_failed.json").unlink()
    (dirs[0] / "exceptions.jsonl").write_text(json.dumps(
        {"time_ns": T0 + 5 * 10**9, "type": "RuntimeError",
         "message": "[pair.cc:553] Connection closed by peer [127.0.0.1]:5343",
         "where": "excepthook", "frames": C10D}) + "\n")
    with open(node / "exits-1.jsonl", "w") as f:
        for r, code in ((1, -6), (2, -15), (3, -15)):
            f.write(json.dumps({"time_ns": T0 + 4 * 10**9 + r, "pid": 10**6 + r,
                                "local_rank": r, "exitcode": code,
                                "signal": "SIGABRT" if code == -6 else "SIGTERM",
                                "source": "torchrun"}) + "\n")
    (dirs[1] / "fatal.txt").write_text(
        "Fatal Python error: Aborted\n\nCurrent thread 0x00007f2 (most recent call first):\n"
        '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 3252 in '
        "all_reduce\n"
        '  File "/job/train.py", line 13 in <module>\n')
    return run


def test_a_gloo_abort_on_a_size_mismatch_is_a_victim_and_the_skipper_the_culprit(
        tmp_path: Path) -> None:
    (crash,) = [f for f in failure_findings(_gloo_abort(tmp_path, True).root)
                if f.kind == "crash"]
    assert crash.cause == "desync" and crash.ranks == [2], crash.title
    roles = {x["rank"]: x["role"] for x in crash.evidence["failed"]}
    assert roles == {1: "aborted_on_mismatch", 0: "victim", 2: "departed", 3: "victim"}
    assert "then rank 1, which met it, died of SIGABRT" in crash.title
    assert "a victim that aborted on the mismatch it detected" in crash.title


def test_a_gloo_abort_without_the_skippers_sequence_does_not_blame_the_aborted_rank_alone(
        tmp_path: Path) -> None:
    """Without rank 2's dump no sequence shows a departure: the aborted rank is still the
    first failure, and the title says it may only have met the rank that departed."""
    (crash,) = [f for f in failure_findings(_gloo_abort(tmp_path, False).root)
                if f.kind == "crash"]
    assert crash.evidence["first"]["rank"] == 1
    assert crash.cause != "desync" and crash.ranks == [1]
    assert "may only have met the rank that departed" in crash.title, crash.title


def test_the_launcher_asks_its_live_ranks_for_a_dump_and_waits_for_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`exits.ask_peers`: a request beside every live rank of this node but the failed one;
    it returns once each answered (a dump newer than the request), or after its wait."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = {0: os.getpid(), 1: live.pid, 2: 2**22 + 7}  # 2: no such process
        dirs = {}
        for r, pid in pids.items():
            dirs[r] = run.claim_rank_dir(r)
            write_json_atomic(dirs[r] / "rank.json", {"rank": r, "pid": pid, "node": "n0"})
        other = run.claim_rank_dir(3)
        write_json_atomic(other / "rank.json", {"rank": 3, "pid": live.pid, "node": "n1"})
        monkeypatch.setenv("UBERPROF_RUN_DIR", str(run.root))
        monkeypatch.setenv("UBERPROF_NODE", "n0")
        monkeypatch.setattr(exits, "_asked", False)
        (dirs[1] / "flight-recorder-peer_failed.json").write_text("{}")  # answered at once
        t = time.monotonic()
        assert exits.ask_peers(os.getpid(), wait_s=5) == [1]
        assert time.monotonic() - t < 2
        assert (dirs[1] / PEER_FAILED_REQUEST_FILE).exists()
        assert not (dirs[0] / PEER_FAILED_REQUEST_FILE).exists()
        assert not (other / PEER_FAILED_REQUEST_FILE).exists()
        assert exits.ask_peers(os.getpid()) == []  # once per launcher
    finally:
        live.kill()
        live.wait()
    assert node.name == "n0"
