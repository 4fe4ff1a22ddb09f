"""`uberprof trace` on a running 2-rank Gloo job (tests/_jobs.followed_job, run with
--no-trace): the window lands on the steps it announced on both ranks, marked "on demand";
a second request while the first is pending is refused with its reason, and a request after
the job ended says so."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from tests._jobs import PY, info_json, job_env, start_followed_job, stop, time_limit, wait_for_steps
from uberprof.rundir import trace_file_name


def _trace(run: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "uberprof", "trace", str(run), "--json", *options],
                          capture_output=True, text=True, env=job_env(), check=False,
                          timeout=time_limit(60))


def test_trace_on_demand_records_the_announced_steps_on_every_rank(tmp_path: Path) -> None:
    job = start_followed_job(tmp_path, "od", tmp_path / "stop")
    run = tmp_path / "od"
    try:
        wait_for_steps(run, 3, job, time_limit(60))
        asked = _trace(run, "--steps", "2")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        doc = json.loads(asked.stdout)
        assert doc["ok"] and sorted(doc["accepted"]) == ["0", "1"], doc
        assert doc["last"] == doc["first"] + 1 and doc["first"] > doc["last_step"]
        windows = {int(r): a["window"] for r, a in doc["accepted"].items()}
        for r, a in doc["accepted"].items():  # on time: the announced steps; late: said so
            assert a["window"] == [doc["first"], doc["last"]] or a["late"], a

        again = _trace(run)  # the first window is still to come (or recording): refused
        assert again.returncode == 1, again.stdout
        refused = json.loads(again.stdout)["refused"]
        assert sorted(refused) == ["0", "1"]
        assert all("a trace window is already" in a["reason"] for a in refused.values()), refused

        deadline = time.monotonic() + time_limit(60)
        files = {r: run / "ranks" / str(r) / "traces" / (trace_file_name(*w) + ".gz")
                 for r, w in windows.items()}
        while not all(f.exists() for f in files.values()):
            assert job.poll() is None, f"the job ended (exit {job.returncode})"
            assert time.monotonic() < deadline, f"no trace window in time: {files}"
            time.sleep(0.2)
        (tmp_path / "stop").touch()
        assert job.wait(timeout=time_limit(60)) == 0
    finally:
        stop([job])

    ended = _trace(run)
    assert ended.returncode == 1 and "the job ended" in json.loads(ended.stdout)["reason"]
    info = info_json(run)
    assert info["problems"] == []
    for r in info["ranks"]:
        assert [(w["steps"], w["trigger"]) for w in r["trace_windows"]] == \
            [(windows[r["rank"]], "on demand")]
