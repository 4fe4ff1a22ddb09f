"""Which host spans enclose a moment on a thread, innermost first: the lookup behind giving a
communication kernel the metadata of the `nccl:*` / `record_param_comms` span its launch ran in.

Filtering every span for every kernel costs spans x kernels array passes (0.8 s of one rank's
analysis on an NCCL-heavy V100 trace: 1,272 kernels, each a pass over thousands of spans). Spans
of one thread are nested (record_function scopes), so each span's enclosing span is found once,
in a single pass per thread, and a query walks up from the last span that started at or before
its moment: any span that encloses the moment and started earlier also encloses that last one,
so the walk meets every enclosing span, innermost first. A thread whose spans overlap without
nesting (a broken trace) is answered by the plain filter instead, so the answer never depends on
the shortcut.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EnclosingSpans"]


class EnclosingSpans:
    """Spans given as (thread, start, end) arrays; `around(thread, t)` gives the indices
    (into those arrays) of the spans on `thread` with start <= t <= end, innermost first."""

    def __init__(self, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        self._start, self._end = start, end
        self._threads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        order = np.lexsort((-end, start, tid))  # by thread, start; the outer first on a tie
        bounds = np.flatnonzero(np.diff(tid[order])) + 1
        for group in np.split(order, bounds) if order.size else []:
            self._threads[int(tid[group[0]])] = (group, start[group],
                                                 _parents(start[group], end[group]))

    def around(self, thread: int, t: int) -> list[int]:
        found = self._threads.get(int(thread))
        if found is None:
            return []
        group, starts, parent = found
        if parent is None:  # spans that overlap without nesting: filter them all
            inside = group[(starts <= t) & (self._end[group] >= t)]
            return inside[np.lexsort((self._end[inside], -self._start[inside]))].tolist()
        out = []
        j = int(np.searchsorted(starts, t, side="right")) - 1
        while j >= 0:
            if self._end[group[j]] >= t:
                out.append(int(group[j]))
            j = int(parent[j])
        return out


def _parents(start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """For spans sorted by start (outer first on a tie), the position of each one's innermost
    enclosing span (-1: none); None when two spans overlap without one holding the other."""
    parent = np.full(start.size, -1, dtype=np.int64)
    stack: list[int] = []
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
        while stack and end[stack[-1]] < s:
            stack.pop()
        if stack:
            if end[stack[-1]] < e:
                return None
            parent[i] = stack[-1]
        stack.append(i)
    return parent
