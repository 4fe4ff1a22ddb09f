"""Hangs of real 4-rank CPU/Gloo jobs under `uberprof run --hang-timeout 10`: the watchdog
captures every rank, `--on-hang stop` ends the job (exit 124), and `uberprof report --json`
names the stuck rank, its Python stack and the collective the others wait in."""

from __future__ import annotations

from pathlib import Path

from tests._failures import faulty_run, first_finding, line_of, rank_doc, report_json
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
    assert f["evidence"]["action"] == "stop" and f["evidence"]["timeout_s"] == 10
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
    proc, _ = faulty_run(tmp_path, "pause", "pause", "--rank", "1", "--pause-s", "16",
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
