"""On a real 2-rank CPU (Gloo) job, the idle and exposed_comm findings name the operators
around the time they count, and those are the operators the trace has next to it: each step
of `tests/scripts/gaps_around.py` sleeps between `aten::mm` and `aten::tanh` and all-reduces
synchronously between `aten::sigmoid` and `aten::relu`."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from tests._jobs import PY, SCRIPTS, job_env, time_limit, torchrun, uberprof_run

SLEEP_MS = 15.0
WINDOW = (2, 6)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("around")
    uberprof_run(out, "around", torchrun(2, SCRIPTS / "gaps_around.py", "--steps", "8",
                                         "--sleep-ms", str(SLEEP_MS)),
                 "--trace-steps", f"{WINDOW[0]}-{WINDOW[1]}", "--counters", "none")
    return out / "around"


def _neighbours(run: Path, rank: int, name: str, skip: str = "\0"
                ) -> list[tuple[str, float]]:
    """From the raw trace: for each `name` operator on the training thread, the operator that
    ended last before it started (those named `skip...` left out) and the time between them
    (ms)."""
    doc = json.loads(gzip.decompress(next((run / "ranks" / str(rank) / "traces").glob(
        "*.json.gz")).read_bytes()))
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    main = next(e["tid"] for e in ops if e["name"] == name)
    ops = [e for e in ops if e["tid"] == main and not e["name"].startswith(skip)]
    out = []
    for e in ops:
        if e["name"] == name:
            prev = max((o for o in ops if o["ts"] + o["dur"] <= e["ts"]),
                       key=lambda o: o["ts"] + o["dur"])
            out.append((prev["name"], (e["ts"] - prev["ts"] - prev["dur"]) / 1e3))
    return out


def test_idle_and_exposed_comm_findings_name_the_adjacent_operators(run: Path) -> None:
    proc = subprocess.run([PY, "-m", "uberprof", "report", "--json", str(run)],
                          capture_output=True, text=True, timeout=time_limit(120),
                          env=job_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    found = {f["kind"]: f for f in doc["findings"]}
    rank_steps = sum(1 for r in (0, 1) for _ in range(WINDOW[0], WINDOW[1] + 1))
    # the trace itself: every tanh follows an mm after the sleep; every relu follows the
    # all-reduce's launch (a communication call, never compute), and before it a sigmoid
    for rank in (0, 1):
        assert {p for p, gap in _neighbours(run, rank, "aten::tanh")
                if gap >= SLEEP_MS / 2} == {"aten::mm"}
        assert {p for p, _ in _neighbours(run, rank, "aten::relu")} == {"c10d::allreduce_"}
        assert {p for p, _ in _neighbours(run, rank, "aten::relu", "c10d::")} == \
            {"aten::sigmoid"}

    idle = found["idle"]["evidence"]["around"]
    assert idle["before"][0]["name"] == "aten::mm", idle
    assert idle["after"][0]["name"] == "aten::tanh", idle
    assert idle["before"][0]["count"] >= rank_steps - 1  # one sleep per analysed rank-step
    assert idle["before"][0]["pct"] >= 50  # the sleeps are most of the idle time

    exposed = found["exposed_comm"]["evidence"]["around"]
    assert exposed["before"][0]["name"] == "aten::sigmoid", exposed
    assert exposed["after"][0]["name"] == "aten::relu", exposed
    assert exposed["before"][0]["pct"] >= 50

    text = subprocess.run([PY, "-m", "uberprof", "report", str(run)], capture_output=True,
                          text=True, timeout=time_limit(120), env=job_env(),
                          check=False).stdout
    flat = " ".join(text.split())
    assert "around it: after aten::mm" in flat and "after aten::sigmoid" in flat
