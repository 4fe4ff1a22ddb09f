"""`EnclosingSpans` answers exactly what filtering every span would, innermost first."""

from __future__ import annotations

import numpy as np
import pytest

from uberprof.analysis.tables.enclosing import EnclosingSpans


def _filtered(tid: np.ndarray, start: np.ndarray, end: np.ndarray, thread: int,
              t: int) -> list[int]:
    inside = np.flatnonzero((tid == thread) & (start <= t) & (end >= t))
    return inside[np.lexsort((end[inside], -start[inside]))].tolist()


def _nested(rng: np.random.Generator, lo: int, hi: int, depth: int) -> list[tuple[int, int]]:
    """Random properly nested spans in [lo, hi] (record_function scopes on one thread)."""
    out: list[tuple[int, int]] = []
    t = lo
    while t < hi and depth > 0:
        a = int(rng.integers(t, hi))
        b = int(rng.integers(a, min(hi, a + (hi - lo) // 2) + 1))
        out.append((a, b))
        out.extend(_nested(rng, a, b, depth - 1))
        t = b + 1 + int(rng.integers(0, 3))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_nested_spans_are_found_as_the_full_filter_finds_them(seed: int) -> None:
    rng = np.random.default_rng(seed)
    spans = [(thread, a, b) for thread in (1, 2, 7) for a, b in _nested(rng, 0, 400, 4)]
    tid, start, end = (np.array(c, dtype=np.int64) for c in zip(*spans))
    lookup = EnclosingSpans(tid, start, end)
    for thread in (1, 2, 7, 9):
        for t in range(-2, 403, 3):
            assert lookup.around(thread, t) == _filtered(tid, start, end, thread, t), (thread, t)


@pytest.mark.parametrize("seed", range(10))
def test_spans_that_overlap_without_nesting_fall_back_to_the_full_filter(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    start = rng.integers(0, 300, 60)
    end = start + rng.integers(0, 80, 60)
    tid = rng.integers(0, 2, 60)
    lookup = EnclosingSpans(tid, start, end)
    for thread in (0, 1):
        for t in range(0, 400, 7):
            assert lookup.around(thread, t) == _filtered(tid, start, end, thread, t)


def test_a_moment_inside_two_nested_scopes_lists_the_inner_one_first() -> None:
    # nccl:all_reduce [0, 100] around record_param_comms [10, 50]; a sibling [60, 90]
    lookup = EnclosingSpans(np.array([5, 5, 5]), np.array([0, 10, 60]), np.array([100, 50, 90]))
    assert lookup.around(5, 20) == [1, 0]
    assert lookup.around(5, 55) == [0]
    assert lookup.around(5, 70) == [2, 0]
    assert lookup.around(5, 101) == [] and lookup.around(6, 20) == []
