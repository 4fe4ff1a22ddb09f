"""A real 2-rank DDP job whose trace window alone is too short to name its straggler: the Flight
Recorder's arrivals over every untraced step name it; without them (an older run) the traced
window decides, as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests._jobs import SAMPLES, torchrun, uberprof_run
from uberprof.analysis.diagnosis.advisor import diagnose
from uberprof.rundir.layout import FLIGHT_LOG_FILE

STEPS = 30


@pytest.fixture(scope="module")
def short_window_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 1 computes twice as long per step; only steps 10-11 are traced."""
    out = tmp_path_factory.mktemp("fr-evidence")
    uberprof_run(out, "fr", torchrun(2, SAMPLES / "train_ddp.py", "--steps", str(STEPS),
                                     "--slow-rank", "1", "--slow-factor", "2"),
                 "--trace-steps", "10-11", "--counters", "none")
    return out / "fr"


def test_the_rank_agent_keeps_every_steps_arrivals_cheaply(short_window_run: Path) -> None:
    for r in (0, 1):
        meta = json.loads((short_window_run / "ranks" / str(r) / "rank.json").read_text())
        log = meta["flight_log"]
        assert log["ring"] > 0 and log["dumps"] >= 2, log  # after the window, and at exit
        # what each dump cost is recorded (its size is the benchmarks' business, not a test's)
        assert isinstance(log["max_cost_ms"], float) and log["max_cost_ms"] >= 0, log
        lines = (short_window_run / "ranks" / str(r) / FLIGHT_LOG_FILE).read_text().splitlines()
        reasons = [json.loads(x)["reason"] for x in lines]
        assert "window" in reasons and reasons[-1] == "exit"
        n = sum(len(json.loads(x)["entries"]) for x in lines)
        assert n >= 2 * STEPS  # two gradient buckets per step, every step


def test_the_straggler_is_named_from_every_untraced_step(short_window_run: Path, tmp_path: Path) -> None:
    d = diagnose(short_window_run, out=tmp_path / "derived")
    t = d.run["straggler_test"]
    # two traced steps: 4 all-reduces, too few to tell a straggler from chance
    assert t["traced"]["instances"] <= 4 and t["traced"]["decision"] != "confirmed", t
    # steps 1-9 and 13-29: not the first, the traced ones, nor the one after the window;
    # pooled with the traced window's, each instance once
    assert t["basis"] == "arrivals", t
    bases = t["test"]["bases"]
    assert bases["flight_recorder"]["instances"] >= 2 * (STEPS - 4), bases
    assert t["instances"] == bases["flight_recorder"]["instances"] + bases["traces"]["instances"]
    assert t["flight_recorder"]["first_step"] == 1 and t["flight_recorder"]["steps"] == 26
    assert t["flight_recorder"]["lost_entries"] == 0
    assert t["decision"] == "confirmed" and t["rank"] == 1, t["test"]["sentence"]
    [f] = [f for f in d.findings if f.kind == "straggler"]
    assert f.ranks == [1] and f.cause == "compute" and f.confidence == "confirmed"
    e = f.evidence
    assert e["basis"]["source"] == "arrivals"
    assert f"{e['basis']['last_in']} of {e['basis']['instances']} collectives" in \
        e["test"]["sentence"]
    assert "Flight Recorder" in e["test"]["sentence"] and "Flight Recorder" in f.title
    # the cause: the traced steps' breakdown, or the busy time over every step where two
    # traced steps on a loaded machine say otherwise
    basis = e["test"]["cause_basis"]
    assert basis in ("traced steps", "busy time")
    said = "the traced steps" if basis == "traced steps" else "its busy time"
    assert f"cause read from {said}" in e["test"]["sentence"]
    # the time at stake is the delay over the analysed (traced) steps only
    assert 0 < f.time_at_stake_ms <= d.run["analysed_wall_ms"]


def test_a_run_without_arrivals_is_diagnosed_from_its_traces(short_window_run: Path,
                                                             tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(short_window_run, old, ignore=shutil.ignore_patterns("derived",
                                                                         FLIGHT_LOG_FILE))
    d = diagnose(old, out=tmp_path / "derived")
    t = d.run["straggler_test"]
    assert "flight_recorder" not in t and "traced" not in t and t["basis"] == "traces"
    lat = d.lateness.to_pylist()  # the traced window's matched collectives
    mine = [x for x in lat if x["rank"] == t["rank"]]
    assert (t["last_in"], t["instances"]) == (sum(x["sole_last"] for x in mine), len(mine))
    assert t["decision"] != "confirmed"  # 4 instances cannot confirm, as before
    assert not [f for f in d.findings if f.kind == "straggler" and f.confidence == "confirmed"]
