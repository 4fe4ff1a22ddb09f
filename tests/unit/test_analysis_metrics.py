"""Interval arithmetic and the metric definitions, on hand-computed synthetic traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests import _traces as T
from uberprof.analysis.tables import intervals as iv
from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables.rank import analyze_trace

US = 1000  # ns per µs


def _brute(intervals: list[tuple[int, int]], lo: int, hi: int) -> set[int]:
    return {t for s, e in intervals for t in range(max(s, lo), min(e, hi))}


@pytest.mark.parametrize("seed", range(20))
def test_interval_ops_match_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)

    def rand_set(n: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
        s = rng.integers(0, 200, n)
        e = s + rng.integers(0, 30, n)
        return s, e, list(zip(s.tolist(), e.tolist()))

    sa, ea, la = rand_set(int(rng.integers(0, 15)))
    sb, eb, lb = rand_set(int(rng.integers(0, 15)))
    a, b = iv.union(sa, ea), iv.union(sb, eb)
    pa_, pb = _brute(la, 0, 10_000), _brute(lb, 0, 10_000)
    assert iv.total(a) == len(pa_)
    assert np.all(a.starts[1:] > a.ends[:-1])  # disjoint and not touching
    assert iv.total(iv.intersect(a, b)) == len(pa_ & pb)
    assert iv.total(iv.subtract(a, b)) == len(pa_ - pb)
    assert iv.total(iv.merge(a, b)) == len(pa_ | pb)
    lo = rng.integers(0, 150, 8)
    hi = lo + rng.integers(0, 80, 8)
    got = iv.covered_in(a, lo, hi)
    want = [len(_brute(la, int(x), int(y))) for x, y in zip(lo, hi)]
    assert got.tolist() == want
    gaps = iv.complement_gaps(a, 0, 250)
    assert iv.total(gaps) + iv.total(iv.clip(a, 0, 250)) == 250


def test_empty_sets() -> None:
    e = iv.empty()
    assert iv.total(iv.union(np.array([5]), np.array([5]))) == 0  # zero-length dropped
    assert iv.total(iv.intersect(e, e)) == 0
    assert iv.covered_in(e, np.array([0]), np.array([10])).tolist() == [0]


def test_breakdown_of_a_gpu_trace(tmp_path: Path) -> None:
    t = analyze_trace(T.write(tmp_path / "r0.json", T.gpu_step_trace()))
    s = t.steps.to_pylist()
    assert [r["step"] for r in s] == [1, 2]
    base = T.BASE_NS
    one, two = s
    assert one["device_start_ns"] == base + 1100 * US
    assert one["device_end_ns"] == two["device_start_ns"] == base + 2100 * US  # tiling
    assert two["device_end_ns"] == base + 2900 * US
    assert {k: one[k] // US for k in ("window_ns", "compute_ns", "comm_ns", "overlap_ns",
                                      "exposed_comm_ns", "memory_ns", "idle_ns")} == {
        "window_ns": 1000, "compute_ns": 300, "comm_ns": 400, "overlap_ns": 100,
        "exposed_comm_ns": 300, "memory_ns": 50, "idle_ns": 350}
    assert two["compute_ns"] == 700 * US and two["idle_ns"] == 100 * US
    assert one["comm_bytes"] == 4000 and one["collectives"] == 1
    # Whole trace, HTA's way: the last step is left out -> window [1100, 1850) µs.
    w = t.summary
    assert w["window_ns"] == 750 * US
    p = M.percentages(*(w[k] for k in ("window_ns", "compute_ns", "comm_ns", "overlap_ns",
                                       "exposed_comm_ns", "memory_ns", "idle_ns")))
    assert p == {"idle_pct": 13.33, "compute_pct": 40.0, "non_compute_pct": 46.67,
                 "overlap_pct": 25.0, "exposed_comm_pct": 40.0, "memory_pct": 6.67}
    c = t.collectives.to_pylist()[0]
    assert (c["name"], c["in_bytes"], c["group_size"], c["seq"], c["step"]) == \
        ("allreduce", 4000, 2, 7, 1)
    # every event knows its step: device events through their launch
    ev = t.events.to_pandas()
    assert set(ev.loc[ev["kind"] == "comm_kernel", "step"]) == {1}


def test_breakdown_of_a_cpu_gloo_trace(tmp_path: Path) -> None:
    t = analyze_trace(T.write(tmp_path / "r0.json.gz", T.cpu_step_trace()))
    assert t.summary["mode"] == "cpu"
    one, two = t.steps.to_pylist()
    assert {k: one[k] // US for k in ("window_ns", "compute_ns", "comm_ns", "overlap_ns",
                                      "exposed_comm_ns", "memory_ns", "idle_ns",
                                      "data_wait_ns", "optimizer_ns")} == {
        "window_ns": 900, "compute_ns": 580, "comm_ns": 300, "overlap_ns": 60,
        "exposed_comm_ns": 240, "memory_ns": 0, "idle_ns": 80, "data_wait_ns": 100,
        "optimizer_ns": 80}
    assert (two["window_ns"], two["compute_ns"], two["exposed_comm_ns"], two["idle_ns"]) == \
        (800 * US, 400 * US, 400 * US, 0)
    assert (one["comm_bytes"], two["comm_bytes"]) == (4000, 8000)
    assert t.summary["window_ns"] == 880 * US and t.summary["idle_ns"] == 60 * US


def test_steps_without_activity_get_empty_windows() -> None:
    a = M._activity("device", np.array([0, 1]), np.array([0, 0], np.int8),
                    np.array([100, 400]), np.array([200, 450]), np.array([10, 310]),
                    np.ones(2, bool), iv.empty())
    lo, hi = M.step_device_windows(np.array([0, 100, 300]), np.array([100, 300, 500]), a)
    assert lo.tolist() == [100, 400, 400] and hi.tolist() == [400, 400, 450]
