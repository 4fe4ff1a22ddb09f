"""`uberprof whatif` checked against the measured fix on real CPU (Gloo) jobs of 2 ranks.

`--remove straggler`: rank 1 computes three times as long on every odd step (`train_ddp.py
--fault-steps`) and as the others on every even one, all traced (at twice as long, the stalls a
busy machine gives the healthy rank overlapped the extra work: CI once measured the odd steps
only 1.16 times the even ones). The straggler steps' projection is compared
with the healthy steps' measured median in the same job, as `benchmarks/whatif.py --in-job`
does, so that a machine's drift between two runs is no part of the comparison; the tolerance is
the two medians' own 95% intervals (the steps' spread), not a fixed percentage.

`--balance-stages`: a 2-stage pipeline whose stages run 1 + 5 blocks on every odd step and
3 + 3 on the others (`train_pipeline.py --fault-steps`), measured as `benchmarks/whatif.py
--in-job` measures it (its `as_periods` and `neighbour_ratios`): each unbalanced step's
projection against the balanced steps on either side of it, within the issue's 10% target
widened by the 95% interval of those ratios. That holds on a quiet host only: beside other work
the split stops costing (the stages' work shares the full cores whatever the split) and the
projection is optimistic, which `whatif` then says (`contention.BUSY_PER_CORE`); the test
checks that it says so and skips the comparison. Its jobs are timed, so they run alone (`solo`:
`make test` runs those after the others)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests._jobs import ROOT, SAMPLES, load_script, torchrun, uberprof_run
from uberprof.analysis.tables.steptime import median_interval
from uberprof.cli import main

pytestmark = pytest.mark.solo

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


W = load_script(ROOT / "benchmarks" / "whatif.py", "_whatif_bench_jobs")
PIPE_STEPS = 16


@pytest.fixture(scope="module")
def alternating_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whatif-pipeline-in-job")
    odd = ",".join(str(s) for s in range(1, PIPE_STEPS, 2))
    # 1 + 5 blocks against 3 + 3: the split costs 26-34% a step on a quiet 2-core VM (2 + 6
    # against 4 + 4, the benchmark's pair, 15-20%, once 1% where the traced steps' own cost
    # rose through the window: docs/overhead.md, shapes)
    uberprof_run(out, "pipe", torchrun(2, SAMPLES / "train_pipeline.py", "--steps",
                                       str(PIPE_STEPS), "--dim", "256", "--batch", "16",
                                       "--layers-per-stage", "1", "--heavy-stage", "1",
                                       "--heavy-factor", "5", "--fault-steps", odd),
                 "--trace-steps", f"3-{PIPE_STEPS - 3}", "--counters", "none")
    return out / "pipe"


def test_balancing_the_stages_projects_the_balanced_steps_around_each_unbalanced_one(
        alternating_pipeline: Path) -> None:
    res = CliRunner().invoke(main, ["whatif", str(alternating_pipeline), "--balance-stages",
                                    "--json"])
    assert res.exit_code == 0, res.output
    raw = json.loads(res.stdout)
    busy = [h for h in raw["core_sharing"]["hosts"] if h["busy"]]
    if busy:
        assert any("busy with other work" in c for c in raw["caveats"]), raw["caveats"]
        pytest.skip(f"the host was busy ({busy[0]['background_threads']} other runnable "
                    "threads beside the ranks): whatif says its projection is unsure, and the "
                    "split's cost cannot be measured here")
    doc = W.as_periods(raw, alternating_pipeline)
    unbalanced = [r["step"] for r in doc["steps"] if r["step"] % 2 == 1]
    as_measured = {**doc, "steps": [{**r, "projected_ms": r["measured_ms"]} for r in doc["steps"]]}
    cost = float(np.median(W.neighbour_ratios(as_measured, unbalanced))) - 1.0
    ratios = np.array(W.neighbour_ratios(doc, unbalanced))
    assert ratios.size >= 4, doc["steps"]
    assert cost > 0.1, cost  # the unbalanced steps are slower than the balanced ones around them
    lo, hi = median_interval(ratios) or (ratios.min(), ratios.max())
    assert lo - 0.10 <= 1.0 <= hi + 0.10, (np.median(ratios), lo, hi)
    assert 1.0 + cost - np.median(ratios) > cost / 2, (cost, np.median(ratios))  # more than
    # half of what the split costs projected away
