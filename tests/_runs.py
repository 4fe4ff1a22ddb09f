"""Real DDP runs under `uberprof run`, shared by the analysis tests (session-scoped: each job
runs once per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._jobs import SAMPLES, load_script, torchrun, uberprof_run

TRACE_STEPS = (4, 6)
STEPS = 10


@pytest.fixture(scope="session")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """2- and 4-rank CPU (Gloo) runs of samples/train_ddp.py, traced on steps 4-6."""
    out = tmp_path_factory.mktemp("ddp-runs")
    runs = {}
    for n in (2, 4):
        uberprof_run(out, f"ddp{n}",
                     torchrun(n, SAMPLES / "train_ddp.py", "--steps", str(STEPS)),
                     "--trace-steps", f"{TRACE_STEPS[0]}-{TRACE_STEPS[1]}", "--counters", "none",
                     timeout=400)
        runs[n] = out / f"ddp{n}"
    return runs


def sample_parameter_count() -> int:
    """Parameters of the sample's model with its default arguments (what DDP all-reduces)."""
    mod = load_script(SAMPLES / "train_ddp.py", "_train_ddp")
    a = mod.parse_args([])
    model = mod.TinyTransformer(a.vocab, a.dim, a.layers, a.heads, a.seq)
    return sum(p.numel() for p in model.parameters())
