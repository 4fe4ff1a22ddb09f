"""`uberprof whatif --remove straggler` checked against the measured fix on a real CPU (Gloo)
job of 2 ranks: rank 1 computes three times as long on every odd step (`train_ddp.py
--fault-steps`) and as the others on every even one, all traced (at twice as long, the stalls a
busy machine gives the healthy rank overlapped the extra work: CI once measured the odd steps
only 1.16 times the even ones). The straggler steps' projection is compared
with the healthy steps' measured median in the same job, as `benchmarks/whatif.py --in-job`
does, so that a machine's drift between two runs is no part of the comparison; the tolerance is
the two medians' own 95% intervals (the steps' spread), not a fixed percentage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests._jobs import SAMPLES, torchrun, uberprof_run
from uberprof.analysis.tables.steptime import median_interval
from uberprof.cli import main

STEPS = 40
TRACE = (5, STEPS - 3)  # 17 straggler steps and 16 healthy ones traced


@pytest.fixture(scope="module")
def alternate_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whatif-in-job")
    odd = ",".join(str(s) for s in range(1, STEPS, 2))
    uberprof_run(out, "alt", torchrun(2, SAMPLES / "train_ddp.py", "--steps", str(STEPS),
                                      "--slow-rank", "1", "--slow-factor", "3",
                                      "--fault-steps", odd),
                 "--trace-steps", f"{TRACE[0]}-{TRACE[1]}", "--counters", "none")
    return out / "alt"


def _median(rows: list[dict], key: str) -> tuple[float, float]:
    """The median of `key` over `rows` and the half-width of its 95% interval."""
    x = np.array([r[key] for r in rows], np.float64)
    lo, hi = median_interval(x)
    return float(np.median(x)), (hi - lo) / 2


def test_removing_the_straggler_projects_the_healthy_steps_within_their_spread(
        alternate_run: Path) -> None:
    res = CliRunner().invoke(main, ["whatif", str(alternate_run), "--remove", "straggler",
                                    "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["straggler"] == 1 and doc["replay_error_pct"] <= 5.0, doc["straggler_basis"]
    rows = doc["steps"]
    slow = [r for r in rows if r["step"] % 2 == 1]
    healthy = [r for r in rows if r["step"] % 2 == 0]
    assert len(slow) >= 15 and len(healthy) >= 15
    problem, _ = _median(slow, "measured_ms")
    measured, m_half = _median(healthy, "measured_ms")
    assert problem > 1.4 * measured  # the fault is on the odd steps only
    projected, p_half = _median(slow, "projected_ms")
    assert abs(projected - measured) <= p_half + m_half, (projected, p_half, measured, m_half)
