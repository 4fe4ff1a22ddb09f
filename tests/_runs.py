"""Real DDP runs under `uberprof run`, shared by the analysis tests (session-scoped, and made
once across pytest-xdist's workers: tests/_made_once.py).

Registered once in tests/jobs/conftest.py: a test names the fixture as an argument and imports
nothing of it (imported into a test module, it would run again for that module)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests._jobs import SAMPLES, load_script, torchrun, uberprof_run
from tests._made_once import made_once

TRACE_STEPS = (4, 6)
STEPS = 10


@pytest.fixture(scope="session")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """2- and 4-rank CPU (Gloo) runs of samples/train_ddp.py, traced on steps 4-6, with their
    node's counters at 10 Hz: the analysis and scaling tests' runs, the dashboard's healthy
    sample (2 ranks) and the export's counters run (4 ranks), which were four more jobs."""
    def make(out: Path) -> dict[int, Path]:
        runs = {}
        for n in (2, 4):
            uberprof_run(out, f"ddp{n}",
                         torchrun(n, SAMPLES / "train_ddp.py", "--steps", str(STEPS)),
                         "--trace-steps", f"{TRACE_STEPS[0]}-{TRACE_STEPS[1]}",
                         "--sample-hz", "10", timeout=400)
            runs[n] = out / f"ddp{n}"
        return runs
    return made_once(tmp_path_factory, "ddp-runs", make)


ShortRun = tuple[Path, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def short_ddp_run(tmp_path_factory: pytest.TempPathFactory) -> ShortRun:
    """A 2-rank samples/train_ddp.py run of 6 steps traced on steps 2-3, `uberprof run`'s other
    options left at their defaults (host counters on): its directory and what `uberprof run`
    printed. The small real run that the fuzz, the closing-line and the no-module-spans tests
    read (they made it three times); a test that changes it works on a copy."""
    def make(out: Path) -> ShortRun:
        proc = uberprof_run(out, "short", torchrun(2, SAMPLES / "train_ddp.py", "--steps", "6"),
                            "--trace-steps", "2-3")
        return out / "short", proc
    return made_once(tmp_path_factory, "short-ddp", make)


MODULES_MEMORY_WINDOW = (3, 5)


@pytest.fixture(scope="session")
def modules_memory_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank samples/train_ddp.py run of 8 steps under `uberprof run --modules
    --profile-memory`, traced on steps 3-5: the run the module and memory report tests and the
    dashboard's memory page read (two jobs before)."""
    def make(out: Path) -> Path:
        w = MODULES_MEMORY_WINDOW
        uberprof_run(out, "mm", torchrun(2, SAMPLES / "train_ddp.py", "--steps", "8"),
                     "--modules", "--profile-memory", "--trace-steps", f"{w[0]}-{w[1]}")
        return out / "mm"
    return made_once(tmp_path_factory, "modules-memory", make)


def sample_parameter_count() -> int:
    """Parameters of the sample's model with its default arguments (what DDP all-reduces)."""
    mod = load_script(SAMPLES / "train_ddp.py", "_train_ddp")
    a = mod.parse_args([])
    model = mod.TinyTransformer(a.vocab, a.dim, a.layers, a.heads, a.seq)
    return sum(p.numel() for p in model.parameters())
