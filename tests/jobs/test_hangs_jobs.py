"""Hangs of real 4-rank CPU/Gloo jobs under `uberprof run --hang-timeout 5` (tests/_failures.py):
the watchdog captures every rank, `--on-hang stop` ends the job (exit 124), and `uberprof report
--json` names the stuck rank, its Python stack and the collective the others wait in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._failures import (
    HANG_TIMEOUT,
    faulty_run,
    first_finding,
    line_of,
    rank_doc,
    report_json,
)
from tests._jobs import load_factor
from uberprof.collect.watchdog import HANG_EXIT_CODE


def _assert_waiting(f: dict, waiting: list[int]) -> None:
    w = f["evidence"]["waiting_in"]
    assert (w["op"], w["process_group"], w["sizes"], w["dtypes"]) == \
        ("all_reduce", "default_pg", [[4]], ["Float"])
    assert w["ranks"] == waiting and isinstance(w["seq"], int) and w["since_ns"] > 0
    for r in waiting:
        doc = rank_doc(f, r)
        assert doc["state"] == "waiting" and doc["collective"]["seq"] == w["seq"]
        assert doc["stack"][-1]["function"] == "all_reduce"


def test_a_rank_sleeping_forever_is_named_with_its_stack(tmp_path: Path) -> None:
    proc, took = faulty_run(tmp_path, "sleep", "sleep", "--rank", "3")
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    assert took < 60 + 30  # the hang starts a few seconds in; stopped within a minute of it
    line = next(x for x in proc.stderr.splitlines() if x.startswith("uberprof: hang:"))
    assert "rank 3 stopped in" in line and "stuck_forever" in line and "stopping" in line
    assert "the job was stopped after a hang (--on-hang stop): exit code 124" in proc.stderr
    f = first_finding(tmp_path / "sleep", "hang")
    assert f["ranks"] == [3] and f["cause"] == "stuck_rank"
    stuck = rank_doc(f, 3)
    assert stuck["state"] == "stuck" and stuck["last_step"] == 2
    assert stuck["where"].endswith(f"faulty.py:{line_of('time.sleep(1)')} in stuck_forever")
    assert [x["function"] for x in stuck["stack"][-2:]] == ["train", "stuck_forever"]
    _assert_waiting(f, [0, 1, 2])
    assert f["evidence"]["action"] == "stop"
    assert f["evidence"]["timeout_s"] == float(HANG_TIMEOUT)
    # the ranks that --on-hang stop ended are no crash
    kinds = [x["kind"] for x in report_json(tmp_path / "sleep")["findings"]]
    assert kinds[0] == "hang" and "crash" not in kinds, kinds  # (a busy host may add host_cpu)


def test_a_rank_that_skips_a_collective_is_named_with_where_it_waits(tmp_path: Path) -> None:
    proc, _ = faulty_run(tmp_path, "skip", "skip", "--rank", "2")
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    f = first_finding(tmp_path / "skip", "hang")
    assert f["ranks"] == [2] and f["cause"] == "skipped_collective"
    assert "rank 2 skipped it and waits in all_reduce #1" in f["title"]
    assert rank_doc(f, 2)["where"].endswith(f"faulty.py:{line_of('group=pair')} in train")
    _assert_waiting(f, [0, 1, 3])


def test_on_hang_report_leaves_the_job_running_and_notes_the_resume(tmp_path: Path) -> None:
    # paused 6 s past the hang timeout (as before at 10 s): declared a hang, then resumed
    pause_s = float(HANG_TIMEOUT) + 6
    proc, _ = faulty_run(tmp_path, "pause", "pause", "--rank", "1", "--pause-s", str(pause_s),
                         on_hang="report")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("uberprof: hang:"))
    assert "rank 1 stopped in" in line and "the job goes on" in line
    f = first_finding(tmp_path / "pause", "hang")
    assert f["ranks"] == [1] and f["evidence"]["resumed_ns"] > f["evidence"]["detected_ns"]
    assert "resumed after" in f["title"]


def test_mp_spawn_with_its_own_profiler(tmp_path: Path) -> None:
    proc, _ = faulty_run(tmp_path, "spawned", "sleep", "--rank", "1", "--own-profiler",
                         nproc=3, spawn=True)
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    f = first_finding(tmp_path / "spawned", "hang")
    assert f["ranks"] == [1]
    assert rank_doc(f, 1)["where"].endswith("in stuck_forever")
    _assert_waiting(f, [0, 2])


@pytest.mark.parametrize(("fault", "rank", "nproc", "op", "line"), [
    ("mismatch-op", 0, 2, "broadcast", "dist.broadcast(grad"),
    ("barrier", 0, 2, "barrier", "dist.barrier()"),
    ("mismatch-op", 1, 4, "broadcast", "dist.broadcast(grad"),
], ids=["broadcast-2", "barrier-2", "broadcast-4"])
def test_a_mismatch_names_the_rank_that_departed_from_its_steps_not_an_index(
        tmp_path: Path, fault: str, rank: int, nproc: int, op: str, line: str) -> None:
    """Rank R issues another collective (broadcast, barrier) where it and the others issued
    an all-reduce at every earlier step: R departed, also on a tie of two ranks, and only the
    others wait in the all-reduce."""
    proc, _ = faulty_run(tmp_path, fault, fault, "--rank", str(rank), nproc=nproc)
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    f = first_finding(tmp_path / fault, "hang")
    assert f["cause"] == "mismatch" and f["ranks"] == [rank], f["title"]
    (m,) = f["evidence"]["mismatches"]
    assert m["ranks"] == [rank] and m["decided_by"] == "history"
    assert m["calls"][str(rank)]["op"] == op
    assert m["departures"][str(rank)]["expected"]["op"] == "all_reduce"
    others = [r for r in range(nproc) if r != rank]
    _assert_waiting(f, others)
    assert rank_doc(f, rank)["state"] == "departed"
    assert rank_doc(f, rank)["where"].endswith(f"faulty.py:{line_of(line)} in train")
    assert f"rank {rank} issued {op}" in f["title"] and f"rank {rank} departed" in f["title"]


def test_a_frozen_rank_is_named_with_its_last_place_as_soon_as_any_hang(
        tmp_path: Path) -> None:
    """Rank 2 of 4 sends itself SIGSTOP: alive, it answers nothing. The watchdog gives up on
    it at once (its process is stopped) and the hang names it frozen, after its last step and
    collective, within the time of any hang (not after the 30 s wait for answers)."""
    proc, _ = faulty_run(tmp_path, "stop", "stop", "--rank", "2")
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("uberprof: hang:"))
    assert "rank 2 is frozen: stopped" in line
    f = first_finding(tmp_path / "stop", "hang")
    assert f["cause"] == "frozen_rank" and f["ranks"] == [2], f["title"]
    assert f["evidence"]["frozen_ranks"] == [2] and f["evidence"]["stuck_ranks"] == [2]
    doc = rank_doc(f, 2)
    assert doc["state"] == "frozen" and doc["process_state"] == "T" and doc["answered"] is False
    assert doc["last_step"] == 2
    _assert_waiting(f, [0, 1, 3])
    # its last collective: the one before the all-reduce the others wait in
    assert doc["last_collective"]["seq"] == f["evidence"]["waiting_in"]["seq"] - 1
    assert "after step 2, last collective all_reduce" in f["title"]
    # the verdict (the node's hang.json) came within the timeout, a poll and a few seconds
    (rec,) = (tmp_path / "stop" / "nodes").glob("*/hang.json")
    written = rec.stat().st_mtime_ns
    stall_s = (written - json.loads(rec.read_text())["last_progress_ns"]) / 1e9
    assert stall_s < float(HANG_TIMEOUT) + 10 * load_factor(), stall_s
