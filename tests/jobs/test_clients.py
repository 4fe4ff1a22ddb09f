"""Real training clients under `uberprof run`: a Lightning DDP job (started by Lightning itself
and by torchrun) and a Hugging Face `Trainer` job, 2 ranks on CPU. The job's output and exit
code are those of the same job run plainly; ranks, steps and the trace window are right.

They need the `clients` extra (`pip install 'uberprof[clients]'`, part of `dev`)."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests._jobs import (
    PY,
    SCRIPTS,
    assert_ranks,
    info_json,
    job_env,
    time_limit,
    torchrun,
    uberprof_run,
)

STEPS = 22
WINDOW = [10, 19]  # the default trace window
# 2 ranks importing Lightning or transformers (the imports alone take 5-10 s of CPU each)
IDLE_S = 120.0


def _needs(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(find_spec(module) is None,
                              reason=f"`{module}` is not installed (pip install "
                                     "'uberprof[clients]', part of the dev extra)")


def _same_output(text: str) -> list[str]:
    """The job's stdout with its numbers left out: timings (train_runtime, samples per
    second) vary, and a rate can print as a whole number. The job's closing line is checked
    exactly on its own."""
    return [re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", line) for line in text.splitlines()]


def _profiled_like_plain(tmp_path: Path, run_id: str, command: list[str], says: str) -> Path:
    plain = subprocess.run(command, capture_output=True, text=True, env=job_env(),
                           timeout=time_limit(IDLE_S), check=False)
    assert plain.returncode == 0, plain.stderr[-4000:]
    proc = uberprof_run(tmp_path, run_id, command, "--counters", "none",
                        timeout=time_limit(IDLE_S))
    assert says in plain.stdout and says in proc.stdout
    assert _same_output(proc.stdout) == _same_output(plain.stdout)
    assert f"2 rank(s), {STEPS} steps per rank" in proc.stderr
    run = tmp_path / run_id
    assert_ranks(info_json(run), 2, STEPS, WINDOW)
    for r in (0, 1):
        trace = run / "ranks" / str(r) / "traces" / "steps-000010-000019.pt.trace.json.gz"
        with gzip.open(trace) as f:
            names = {e.get("name") for e in json.load(f)["traceEvents"]}
        assert {"ProfilerStep#10", "ProfilerStep#19"} <= names and "ProfilerStep#20" not in names
    return run


@_needs("lightning")
@pytest.mark.parametrize("launch", ["python", "torchrun"])
def test_lightning_ddp(tmp_path: Path, launch: str) -> None:
    script = SCRIPTS / "lightning_ddp.py"
    command = ([PY, str(script), "--steps", str(STEPS)] if launch == "python"
               else torchrun(2, script, "--steps", str(STEPS)))
    _profiled_like_plain(tmp_path, f"lightning-{launch}", command,
                         f"lightning trained {STEPS} steps on 2 ranks")


@_needs("transformers")
@_needs("accelerate")
def test_hugging_face_trainer(tmp_path: Path) -> None:
    _profiled_like_plain(tmp_path, "hf", torchrun(2, SCRIPTS / "hf_trainer.py", "--steps",
                                                  str(STEPS)),
                         f"hf trained {STEPS} steps on 2 ranks")
