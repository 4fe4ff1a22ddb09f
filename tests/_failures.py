"""Jobs that hang or crash (tests/scripts/faulty.py) under `uberprof run`, and their report."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests._jobs import (
    CEILING_S,
    PY,
    SCRIPTS,
    job_env,
    job_limit,
    load_factor,
    torchrun,
)
from uberprof.collect.watchdog import ANSWER_WAIT_S, STOP_GRACE_S

FAULTY = SCRIPTS / "faulty.py"
# The faulty jobs' steps take milliseconds (a 8x8 model, 50 ms sleeps), and a job's start-up
# does not count (the watchdog waits for its first step): 5 s without a step is a hang even on a
# loaded machine, and each hang test waits that long (it was 10 s: 5 s more per test).
HANG_TIMEOUT = "5"
# The crash tests' jobs end by themselves (torchrun or mp.spawn ends the survivors); they keep
# the longer timeout, so that no hang is declared while a loaded machine tears a job down.
CRASH_HANG_TIMEOUT = "10"
HANG_FAULTS = ("sleep", "spin", "pause", "skip", "mismatch-op", "barrier", "stop")


def faulty_run(out: Path, run_id: str, fault: str, *args: str, nproc: int = 4,
               spawn: bool = False, on_hang: str = "stop", limit: float | None = None
               ) -> tuple[subprocess.CompletedProcess[str], float]:
    """The faulty job under `uberprof run --hang-timeout T --on-hang ...` (T: HANG_TIMEOUT for a
    fault that hangs, CRASH_HANG_TIMEOUT for one that crashes); (result, seconds).
    Its time limit (unless given): the job's work (`job_limit`), plus the hang timeout, the
    watchdog's longest wait for answers and the stop's grace, scaled by the load."""
    job = ([PY, str(FAULTY), "--spawn", str(nproc)] if spawn else torchrun(nproc, FAULTY))
    timeout = HANG_TIMEOUT if fault in HANG_FAULTS else CRASH_HANG_TIMEOUT
    if limit is None:
        limit = min(CEILING_S, job_limit([*job, "--steps", "8"]) + load_factor() * (
            float(timeout) + ANSWER_WAIT_S + 2 * STOP_GRACE_S))
    cmd = [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id, "--no-trace",
           "--hang-timeout", timeout, "--on-hang", on_hang, "--",
           *job, "--fault", fault, *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=job_env(),
                          check=False)
    return proc, time.monotonic() - t0


def report_json(run: Path) -> dict[str, Any]:
    proc = subprocess.run([PY, "-m", "uberprof", "report", "--json", str(run)],
                          capture_output=True, text=True, timeout=120, env=job_env(), check=False)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def first_finding(run: Path, kind: str) -> dict[str, Any]:
    """The report's first finding, which must be of `kind` (hangs and crashes come first)."""
    findings = report_json(run)["findings"]
    assert findings, "no finding"
    assert findings[0]["kind"] == kind, [f["title"] for f in findings]
    return findings[0]


def rank_doc(finding: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(r for r in finding["evidence"]["ranks"] if r["rank"] == rank)


def line_of(text: str) -> int:
    """The line of faulty.py that holds `text` (the place a report must name)."""
    lines = FAULTY.read_text().splitlines()
    hits = [i for i, line in enumerate(lines, 1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]
