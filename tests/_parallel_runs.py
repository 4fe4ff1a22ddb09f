"""Real CPU (Gloo) jobs of each parallelism (samples/), each run once per test session under
`uberprof run` and reported with `report --json`: tensor parallel, FSDP2, an unbalanced 1F1B
pipeline, and two 2x2 meshes (pipeline x DDP, FSDP2 x tensor parallel).

Registered once in tests/jobs/conftest.py: a test names the fixture as an argument and imports
nothing of it (imported into a test module, it would run again for that module)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._jobs import PY, SAMPLES, job_env, time_limit, torchrun, uberprof_run
from tests._made_once import made_once

STEPS = ("--steps", "8")
OPTIONS = ("--trace-steps", "3-6", "--counters", "none")
Report = tuple[Path, dict[str, Any]]


def _report(factory: pytest.TempPathFactory, name: str, nproc: int, script: str,
            *args: str) -> Report:
    def make(out: Path) -> Report:
        uberprof_run(out, name, torchrun(nproc, SAMPLES / script, *STEPS, *args), *OPTIONS)
        proc = subprocess.run([PY, "-m", "uberprof", "report", str(out / name), "--json"],
                              capture_output=True, text=True, timeout=time_limit(60),
                              env=job_env(), check=False)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return out / name, json.loads(proc.stdout)
    return made_once(factory, f"par-{name}", make)


@pytest.fixture(scope="session")
def tp_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _report(tmp_path_factory, "tp", 2, "train_tp.py")


@pytest.fixture(scope="session")
def fsdp2_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _report(tmp_path_factory, "fsdp2", 2, "train_fsdp2.py")


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """1F1B over 2 stages, 8 micro-batches; stage 1 holds three times stage 0's blocks."""
    return _report(tmp_path_factory, "pipe", 2, "train_pipeline.py", "--schedule", "1f1b",
                   "--microbatches", "8", "--heavy-stage", "1", "--heavy-factor", "3")


@pytest.fixture(scope="session")
def pp_dp_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _report(tmp_path_factory, "ppdp", 4, "train_2d.py", "--layout", "pp_dp")


@pytest.fixture(scope="session")
def fsdp_tp_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _report(tmp_path_factory, "fsdptp", 4, "train_2d.py", "--layout", "fsdp_tp")


@pytest.fixture(scope="session")
def moe_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """Expert parallel over 2 ranks, fused AdamW on the CPU, half the tokens routed to rank 0's
    experts (unequal all-to-all splits). A narrow model (--dim 32): its all-to-alls are a fifth
    of the step, well over the exposed-communication finding's 4% also on a busy machine (at the
    default width, 7% on a quiet one and under 4% beside the other job tests)."""
    return _report(tmp_path_factory, "moe", 2, "train_moe.py", "--optimizer", "fused",
                   "--skew", "0.5", "--dim", "32")


@pytest.fixture(scope="session")
def moe_plain_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """The same expert-parallel job with AdamW's per-parameter loop and even routing."""
    return _report(tmp_path_factory, "moe-plain", 2, "train_moe.py", "--optimizer", "plain")
