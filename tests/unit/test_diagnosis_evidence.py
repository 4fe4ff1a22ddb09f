"""Evidence strength and root-cause accounting on synthetic data: the straggler test at many
seeds, thin evidence, ties, the two-rank case; the wait/transfer split and busbw from the
transfer; the accounting invariant; nested optimizer spans; step-time intervals; the clock
alignment's error bound; remedies that fit the device."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from tests.unit.test_diagnosis_units import _ctx, _lateness, _row
from uberprof.analysis.diagnosis.advisor import account as _account
from uberprof.analysis.diagnosis.bandwidth import Peaks, instance_bandwidth
from uberprof.analysis.diagnosis.causes import GAP_CAUSES, STRAGGLER_CAUSES, remedy_for
from uberprof.analysis.diagnosis.evidence import chance_words, poisson_binomial_sf
from uberprof.analysis.diagnosis.lateness import lateness
from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.diagnosis.stragglers import find_straggler, straggler_test
from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables.align import align_clocks
from uberprof.analysis.tables.collectives import match_collectives
from uberprof.analysis.tables.steptime import median_interval, step_time_doc, step_walls

STEP = 200e6  # 200 ms steps


# --- the statistic ------------------------------------------------------------------------------

def test_poisson_binomial_tail_is_the_binomial_when_probabilities_are_equal() -> None:
    for n, k, p in ((4, 3, 0.25), (20, 12, 0.25), (14, 14, 0.5), (6, 0, 0.3)):
        exact = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))
        assert poisson_binomial_sf(k, [p] * n) == pytest.approx(exact, rel=1e-9)
    assert poisson_binomial_sf(3, [0.5, 0.5]) == 0.0
    assert chance_words(0.0004) == "< 0.1%" and chance_words(0.052) == "5%"


# --- the straggler test -------------------------------------------------------------------------

def test_healthy_noise_never_confirms_a_straggler_and_rarely_suspects_one() -> None:
    confirmed = suspected = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        late = rng.exponential(5e6, size=(20, 4))  # 5 ms of arrival jitter, no fault
        t = straggler_test(_lateness(late - late.min(1, keepdims=True),
                                     np.repeat(np.arange(10), 2)), STEP, 10 * STEP)
        assert t is not None
        confirmed += t.decision == "confirmed"
        suspected += t.decision == "suspected"
    assert confirmed == 0
    assert suspected <= 10  # <= 5% by construction (Bonferroni at 5%)


def test_a_rank_late_at_18_of_18_is_confirmed_and_says_why() -> None:
    rng = np.random.default_rng(3)
    late = rng.exponential(1e6, size=(18, 4))
    late[:, 3] += 30e6
    lat = _lateness(late - late.min(1, keepdims=True), np.repeat(np.arange(6), 3))
    s = find_straggler(lat, STEP, 6 * STEP)
    assert s is not None and s.rank == 3 and s.confidence == "confirmed"
    assert s.test["p_value"] < 0.001 and s.test["chance"] == "< 0.1%"
    assert "18 of 18 collectives over 6 step(s)" in s.test["sentence"]
    assert "confirmed" in s.test["sentence"]


def test_last_in_3_of_4_is_at_most_suspected() -> None:
    late = np.zeros((4, 4))
    late[:, 0] = [1e6, 2e6, 3e6, 4e6]
    late[[0, 1, 2], 1] = 20e6  # rank 1 last in 3 of 4, by a material margin
    late[3, 2] = 30e6
    t = straggler_test(_lateness(late, np.arange(4)), STEP, 4 * STEP)
    assert t is not None and t.rank == 1 and t.last == 3
    assert t.decision in ("suspected", "none")
    s = find_straggler(_lateness(late, np.arange(4)), STEP, 4 * STEP)
    assert s is None or s.confidence == "suspected"


def test_thin_but_perfect_evidence_says_what_would_confirm_it() -> None:
    late = np.zeros((3, 4))
    late[:, 2] = 40e6  # last at 3 of 3: chance (1/4)^3 x 4 ranks = 6%
    t = straggler_test(_lateness(late, np.arange(3)), STEP, 3 * STEP)
    assert t is not None and t.decision == "none" and t.decided_by == "frequency"
    assert "--trace-steps" in t.as_test().sentence


def test_ties_for_last_are_nobodys_fault() -> None:
    late = np.zeros((20, 4))
    late[:, 1] = late[:, 2] = 40e6  # two ranks always tie for last
    t = straggler_test(_lateness(late, np.arange(20)), STEP, 20 * STEP)
    assert t is not None and t.last == 0 and t.decision == "none"


def test_two_ranks_last_at_14_of_14_is_confirmed_not_hidden_by_its_own_spread() -> None:
    # the real client case: 2 ranks, rank 1 last 14/14, median 2.8 ms late, up to 17 ms
    rng = np.random.default_rng(5)
    lead = np.clip(rng.lognormal(np.log(2.8e6), 1.0, 14), 0.3e6, 17e6)
    late = np.stack([np.zeros(14), lead], axis=1)
    s = find_straggler(_lateness(late, np.arange(14)), 40e6, 14 * 40e6)
    assert s is not None and s.rank == 1 and s.confidence == "confirmed", s
    assert s.test["p_value"] < 0.01


def test_more_often_than_chance_but_not_most_of_the_time_is_no_straggler() -> None:
    # oversubscribed cores: one healthy rank last at 12 of 20 (chance < 1%), by 20 ms
    rng = np.random.default_rng(7)
    late = rng.exponential(1e6, size=(20, 4))
    late[:12, 1] += 20e6
    late[12:, 0] += 20e6
    t = straggler_test(_lateness(late, np.arange(20)), STEP, 20 * STEP)
    assert t is not None and t.rank == 1 and t.last == 12 and t.p_value < 0.01
    assert t.decision == "none" and t.decided_by == "materiality"
    assert "needs >= 62.5%" in t.as_test().sentence


def test_persistent_but_immaterial_says_materiality_decided() -> None:
    late = np.zeros((20, 4))
    late[:, 1] = 50_000  # always last by 50 µs of a 100 ms step
    t = straggler_test(_lateness(late, np.arange(20)), 100e6, 20 * 100e6)
    assert t is not None and t.decision == "none" and t.decided_by == "materiality"
    assert t.as_dict()["test"]["p_value"] < 0.001
    assert "not material" in t.as_test().sentence


# --- wait / transfer ----------------------------------------------------------------------------

def _bitmap_ctx():  # type: ignore[no-untyped-def]
    """DDP's 164 B find_unused_parameters bitmap: rank 1 arrives 14.5 ms late; the first exit
    comes 0.24 ms after it arrives, but rank 1's Gloo thread takes 14.5 ms to come back."""
    rows = [_row(0, 0, 14_740_000, nbytes=164), _row(1, 14_500_000, 29_000_000, nbytes=164)]
    return _ctx(rows, {0: "a", 1: "a"})


def test_wait_is_before_the_last_arrival_and_transfer_after() -> None:
    ctx = _bitmap_ctx()
    lat = {r["rank"]: r for r in lateness(match_collectives(ctx).instances).to_pylist()}
    assert lat[0]["wait_ns"] == 14_500_000 and lat[0]["transfer_ns"] == 240_000
    assert lat[1]["wait_ns"] == 0 and lat[1]["transfer_ns"] == 14_500_000


def test_busbw_comes_from_the_transfer_not_the_waiting() -> None:
    ctx = _bitmap_ctx()
    m = match_collectives(ctx)
    bw = instance_bandwidth(ctx, m.instances, {(0, 1): 14_500_000}, Peaks(ctx, None),
                            {0: 0, 1: 0}).to_pylist()[0]
    assert bw["t_ns"] == 240_000 and bw["t_basis"] == "after last arrival"
    assert bw["t_shortest_ns"] == 14_500_000  # what earlier versions divided by
    assert bw["exposed_ns"] == 240_000  # the exposed transfer, never more than t
    assert bw["t_bound_ns"] == 0  # one host: one clock


# --- accounting ---------------------------------------------------------------------------------

def _f(kind: str, ms: float, **kw: object) -> Finding:
    return Finding(kind, "low", kind, [], [], None, ms, {}, "", **kw)  # type: ignore[arg-type]


def test_time_at_stake_never_adds_up_to_more_than_the_wall_time() -> None:
    s = _f("straggler", 70.0)
    exposed = _f("exposed_comm", 40.0, observed_ms=60.0,
                 caused_by=[{"_ref": s, "kind": "straggler", "ms": 20.0}])
    out = _account([exposed, _f("idle", 30.0), s], wall_ns=100_000_000)
    assert [f.kind for f in out] == ["straggler", "exposed_comm", "idle"]
    assert sum(f.time_at_stake_ms for f in out) <= 100.0 + 1e-9
    assert out[2].time_at_stake_ms == 0.0 and out[2].evidence["capped_ms"] == 30.0
    assert out[1].time_at_stake_ms == 30.0 and out[1].evidence["capped_ms"] == 10.0
    # the link resolves to the straggler's rank in the list; its own share is stated
    assert out[1].caused_by == [{"kind": "straggler", "ms": 20.0, "index": 0}]
    assert out[1].as_dict()["own_pct"] == 50.0 and out[1].as_dict()["observed_ms"] == 60.0


# --- nested optimizer spans ---------------------------------------------------------------------

def test_forward_and_backward_inside_optimizer_step_are_not_optimizer_time() -> None:
    ev = pa.table({
        "ts": pa.array([0, 10, 50, 80, 200], pa.int64()),
        "dur": pa.array([100, 30, 20, 5, 40], pa.int64()),
        "tid": pa.array([1, 1, 1, 1, 1], pa.int64()),
        "kind": pa.array(["optimizer", "operator", "operator", "operator", "optimizer"]
                         ).dictionary_encode(),
        "name": pa.array(["Optimizer.step#SGD.step", "aten::linear",
                          "autograd::engine::evaluate_function: AddmmBackward0", "aten::add_",
                          "Optimizer.step#SGD.step"]).dictionary_encode()})
    # Lightning's closure: forward then backward end at 70, the update runs 70-100; a plain
    # optimizer step (200-240) is all optimizer
    got = M.optimizer_time_in(ev, np.array([0, 150]), np.array([150, 300]))
    assert got.tolist() == [30, 40]


# --- step time ----------------------------------------------------------------------------------

def test_median_interval_covers_the_median_with_its_stated_confidence() -> None:
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(400):
        iv = median_interval(rng.normal(0.0, 1.0, 20))
        assert iv is not None
        hits += iv[0] <= 0.0 <= iv[1]
    assert hits / 400 >= 0.93
    assert median_interval(np.arange(5)) is None  # too few for a 95% interval


def test_median_interval_of_a_long_run() -> None:
    """10,000 steps (a long run's untraced steps): 2**n once overflowed a float from 1,024
    steps on, and the diagnosis failed. The interval is the binomial one: median +- about
    1.96 * sqrt(n) / 2 order statistics."""
    iv = median_interval(np.arange(10_000, dtype=np.float64))
    assert iv is not None
    lo, hi = iv
    assert lo + hi == 9_999.0  # symmetric order statistics
    assert 4_999.5 - lo == pytest.approx(1.96 * np.sqrt(10_000) / 2, abs=2)
    assert median_interval(np.arange(1_000, dtype=np.float64)) == (468.0, 531.0)


def test_step_time_states_profiler_inflation_and_uberprofs_own_cost() -> None:
    rows = []
    for s in range(30):
        traced = 10 <= s <= 19
        t = 150e6 if traced else (400e6 if s == 20 else 100e6 + s * 1e5)
        for r in range(2):
            rows.append({"rank": r, "step": s, "step_time_ns": int(t + r * 1e5),
                         "traced": traced})
    doc = step_time_doc(pa.Table.from_pylist(rows), 150e6)
    assert doc["after_trace"]["steps_list"] == [20]
    assert doc["uberprof_cost_ms"] == pytest.approx(400.1 - doc["untraced"]["median_ms"], abs=0.01)
    assert doc["profiler_inflation"] == pytest.approx(1.47, abs=0.02)
    lo, hi = doc["profiler_inflation_interval"]
    assert lo <= doc["profiler_inflation"] <= hi
    assert doc["untraced"]["steps"] == 18  # less step 0 (start-up) and step 20 (uberprof's)


def test_step_walls_are_the_longest_rank_per_step() -> None:
    """Grouped in Arrow, against the row-by-row definition: rows without a time or with a
    negative (pseudo) step count nowhere; traced on any rank is traced."""
    rng = np.random.default_rng(5)
    n = 400
    steps = rng.integers(-1, 40, n).tolist()
    times = [None if rng.random() < 0.1 else int(rng.integers(0, 10**9)) for _ in range(n)]
    traced = [None if rng.random() < 0.05 else bool(rng.random() < 0.3) for _ in range(n)]
    table = pa.table({"rank": list(range(n)), "step": steps,
                      "step_time_ns": pa.array(times, pa.int64()), "traced": traced})
    want: dict[int, tuple[int, bool]] = {}
    for s, t, tr in zip(steps, times, traced, strict=True):
        if t is None or s < 0:
            continue
        prev = want.get(s, (0, False))
        want[s] = (max(prev[0], t), prev[1] or bool(tr))
    assert step_walls(table) == want and list(step_walls(table)) == sorted(want)


# --- clock alignment ----------------------------------------------------------------------------

def test_the_alignment_error_bound_holds_the_true_error() -> None:
    rng = np.random.default_rng(2)
    rows, offset = [], 5_000_000
    for i in range(30):
        t0 = i * 10_000_000
        for r in range(4):
            start = t0 + int(rng.integers(0, 300_000))
            end = t0 + 2_000_000 + int(rng.exponential(400_000))  # Gloo wake-ups: spread exits
            shift = offset if r >= 2 else 0
            rows.append(_row(r, start + shift, end + shift, step=i))
    ctx = _ctx(rows, {0: "a", 1: "a", 2: "b", 3: "b"})
    b = align_clocks(ctx, match_collectives(ctx)).hosts[1]
    assert b.error_bound_ns is not None and b.error_bound_basis
    assert abs(b.offset_ns + offset) <= b.error_bound_ns, b
    assert b.as_dict()["error_bound_ns"] == b.error_bound_ns


# --- remedies -----------------------------------------------------------------------------------

def test_cpu_runs_get_cpu_remedies() -> None:
    assert "pin_memory" in remedy_for(GAP_CAUSES["data"], "cuda")
    assert "pin_memory" not in remedy_for(GAP_CAUSES["data"], "cpu")
    assert "on the device" not in remedy_for(GAP_CAUSES["host"], "cpu")
    assert "GPU" not in remedy_for(STRAGGLER_CAUSES["compute"], "cpu")
