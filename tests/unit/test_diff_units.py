"""`uberprof diff` without jobs: the significance test on synthetic samples, self time of
nested operators, and `compare` on hand-made run profiles (matching, notes, findings)."""

from __future__ import annotations

import numpy as np
import pytest

from uberprof.analysis.diff import RunProfile, compare, median_ratio_test
from uberprof.analysis.diff.comm import CollStat
from uberprof.analysis.diff.counters import CounterStat
from uberprof.analysis.diff.profile import BREAKDOWN_PARTS
from uberprof.analysis.diff.stats import block_length
from uberprof.analysis.tables.operators import OpStat, self_times


def _samples(median: float, n: int = 20, spread: float = 0.05, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return median * (1 + spread * rng.standard_normal(n))


def test_same_distribution_is_no_significant_change() -> None:
    t = median_ratio_test(_samples(100, seed=1), _samples(100, seed=2))
    assert not t.significant and t.verdict == "no significant change"
    assert t.ci is not None and t.ci[0] < 1 < t.ci[1]


def test_a_large_slowdown_is_significant_and_slower() -> None:
    t = median_ratio_test(_samples(100, seed=1), _samples(150, seed=2))
    assert t.significant and t.verdict == "slower"
    assert t.ratio == pytest.approx(1.5, rel=0.05)
    assert t.ci is not None and t.ci[0] > 1.3


def test_a_speedup_is_faster() -> None:
    t = median_ratio_test(_samples(100, seed=1), _samples(70, seed=2))
    assert t.significant and t.verdict == "faster" and t.ci is not None and t.ci[1] < 1


def test_a_certain_but_tiny_change_is_below_the_minimum() -> None:
    a, b = _samples(100, spread=0.001, seed=1), _samples(102, spread=0.001, seed=2)
    t = median_ratio_test(a, b, min_change_pct=5)
    assert t.ci is not None and t.ci[0] > 1  # beyond the steps' own noise ...
    assert not t.significant and "below the 5%" in t.reason  # ... but not beyond 5 %
    assert median_ratio_test(a, b, min_change_pct=1).significant


def test_too_few_steps_are_not_tested() -> None:
    t = median_ratio_test([100.0, 101.0], [200.0, 210.0, 220.0])
    assert t.verdict == "not tested" and not t.significant and t.ci is None
    assert t.ratio == pytest.approx(210 / 100.5)


def test_the_test_is_seeded() -> None:
    a, b = _samples(100, seed=3), _samples(104, seed=4)
    assert median_ratio_test(a, b).ci == median_ratio_test(a, b).ci
    assert median_ratio_test(a, b, seed=1).ci != median_ratio_test(a, b, seed=2).ci


def test_drift_widens_the_interval() -> None:
    """Steps that drift (a slow half, then a fast half) are not independent draws: blocks keep
    the drift in each resample, so the interval is wider than for the same values shuffled."""
    drift = np.r_[np.full(10, 80.0), np.full(10, 120.0)] + np.linspace(0, 1, 20)
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(drift)
    base = _samples(100, seed=5)
    w_drift = np.diff(median_ratio_test(base, drift).ci)[0]  # type: ignore[index]
    w_shuf = np.diff(median_ratio_test(base, shuffled).ci)[0]  # type: ignore[index]
    assert w_drift >= w_shuf
    assert block_length(20) == 3 and block_length(1) == 1


def test_self_time_subtracts_direct_children_per_thread() -> None:
    # thread 1: parent [0, 100) with children [10, 30) and [40, 90), grandchild [50, 60)
    # thread 2: one op [0, 50), overlapping thread 1 in time but not nested in it
    tid = np.array([1, 1, 1, 1, 2])
    ts = np.array([0, 10, 40, 50, 0])
    dur = np.array([100, 20, 50, 10, 50])
    assert self_times(tid, ts, dur).tolist() == [30, 20, 40, 10, 50]


def _profile(step_ms: list[float], ops: dict[str, float], **kw: object) -> RunProfile:
    bd = {k: 0.0 for k, _, _ in BREAKDOWN_PARTS}
    bd["compute"] = float(np.mean(step_ms)) * 1e6
    base: dict[str, object] = {
        "path": "/x", "kind": "run", "run_id": "x", "world_size": 2, "ranks": [0, 1],
        "steps": list(range(len(step_ms))), "step_ns": [v * 1e6 for v in step_ms],
        "rank_step_ns": {0: [v * 1e6 for v in step_ms]}, "breakdown_ns": bd,
        "step_mean_ns": float(np.mean(step_ms)) * 1e6,
        "ops": {("operator", n): OpStat("operator", n, 1.0, v * 1e6, v * 1e6)
                for n, v in ops.items()},
        "collectives": {}, "counters": {}, "counters_from": "none", "metadata": {},
        "findings": []}
    base.update(kw)
    return RunProfile(**base)  # type: ignore[arg-type]


def test_compare_matches_operators_and_shares_the_step_change() -> None:
    a = _profile([100.0] * 10, {"aten::mm": 40, "aten::add": 10, "old::op": 5})
    b = _profile([150.0] * 10, {"aten::mm": 90, "aten::add": 10, "new::op": 5})
    doc = compare(a, b).to_json()
    top = doc["ops"][0]
    assert (top["name"], top["delta_ms"], top["share_pct"]) == ("aten::mm", 50.0, 100.0)
    only = {r["name"]: r["only_in"] for r in doc["ops"] if r["only_in"]}
    assert only == {"old::op": "a", "new::op": "b"}
    assert doc["breakdown"][0]["part"] == "compute" and doc["breakdown"][0]["delta_ms"] == 50.0


def test_compare_says_when_ranks_and_steps_do_not_line_up() -> None:
    a = _profile([100.0] * 10, {})
    b = _profile([100.0] * 6, {}, world_size=4, ranks=[0, 1, 2, 3])
    notes = " ".join(compare(a, b).notes)
    assert "ranks differ" in notes and "analysed steps differ" in notes
    assert compare(a, _profile([100.0] * 10, {})).notes == []


def test_compare_findings_metadata_counters_collectives() -> None:
    f = {"kind": "idle", "cause": "data", "title": "data", "severity": "high", "evidence": {}}
    g = {"kind": "straggler", "cause": "compute", "title": "slow rank", "severity": "low",
         "evidence": {}}
    h = {"kind": "exposed_comm", "cause": None, "title": "comm", "severity": "low",
         "evidence": {}}
    a = _profile([100.0] * 5, {}, findings=[{**f, "ms_per_step": 10.0},
                                            {**h, "ms_per_step": 1.0}],
                 metadata={"torch_version": "2.12", "hosts": "a"},
                 counters={("nvml", "sm_clock"): CounterStat("nvml", "sm_clock", "MHz", 1400,
                                                             1, 9)},
                 collectives={("0", "allreduce", 1024): CollStat("0", "allreduce", 1024, 2.0,
                                                                 3e6, 1e9, 1e6, 2e6, 5e5)})
    b = _profile([100.0] * 5, {}, findings=[{**g, "ms_per_step": 4.0},
                                            {**h, "ms_per_step": 3.0}],
                 metadata={"torch_version": "2.13", "hosts": "a"},
                 counters={("nvml", "sm_clock"): CounterStat("nvml", "sm_clock", "MHz", 1050,
                                                             1, 9)})
    doc = compare(a, b).to_json()
    fd = doc["findings"]
    assert [r["kind"] for r in fd["new"]] == ["straggler"] and fd["new"][0]["b_ms"] == 4.0
    assert [r["kind"] for r in fd["gone"]] == ["idle"] and fd["gone"][0]["a_ms"] == 10.0
    assert fd["changed"][0]["delta_ms"] == 2.0
    assert doc["metadata_changes"] == [{"key": "torch_version", "a": "2.12", "b": "2.13"}]
    assert doc["counters"][0]["ratio"] == pytest.approx(0.75)
    coll = doc["collectives"][0]
    assert coll["only_in"] == "a" and coll["b"] is None and coll["a"]["busbw_gbit_s"] == 8.0
