"""Replaying the step graph (`graph.py`): every node's start and end from its dependencies, with
the recorded durations or changed ones, and the critical path that sets each step's length.

The graph is replayed as 2 events per node (its start, its end), in one topological order
(Kahn's, computed once per graph). An event's time is the latest of what it waits for:

- a start: the end of the previous segment of its lane (`program`), or for a comm node the
  point of its lane where it was issued (`launch`); the first segment of a lane starts where
  it was recorded;
- an end: its start plus its own work (`scale` times the recorded duration; none for a comm
  node, a barrier or a waiting segment that a comm or a `reach` ends), the latest of its
  `reach` edges (another node's start plus an offset into it, scaled with it), its `arrive`
  (a barrier: the participants' starts) and `complete` (the barrier, or the comm that ends a
  waiting segment, plus that segment's recorded lag) and `need` (another node's end: only
  what-if changes add them) edges; a comm node adds its tail (its transfer after the last
  arrival, `tail_scale` times the recorded one, or `tail_ns` given outright).

With the recorded durations this reproduces the recorded times wherever the trace is
self-consistent; what it does not reproduce (clock error, work the trace does not show) is the
replay error that `diagnosis/whatif.py` reports. Each event keeps the edge that decided it, so
the critical path of a step is read backwards from its end: a chain of (rank, kind, interval)
pieces that tile the step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from uberprof.analysis.tables.graph import StepGraph
from uberprof.analysis.tables.lanes import (
    ARRIVE,
    BARRIER,
    BETWEEN,
    COMM,
    COMPLETE,
    COMPUTE,
    DATA,
    HOST,
    LAUNCH,
    NEED,
    PROGRAM,
    REACH,
    WAIT,
)

__all__ = ["PATH_KINDS", "Path", "Replay", "critical_path", "replay", "step_spans"]

PATH_KINDS = ("compute", "transfer", "waiting", "data", "host")
_SELF = 4  # the implicit edge from a node's start to its end
_NEG = -(1 << 62)


@dataclass
class Replay:
    """Replayed start and end of every node, and for each event the edge that decided it (an
    index into the graph's edges, `-1 - v` for node v's own work, or -2**62 for none)."""

    start: np.ndarray
    end: np.ndarray
    start_by: np.ndarray
    end_by: np.ndarray
    own: np.ndarray  # the own work each node was given (ns)
    tail: np.ndarray  # the tail each node was given (ns)
    broken: int  # dependencies dropped to break a cycle (clock error): 0 when consistent


def _structure(g: StepGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], int]:
    """Incoming edges per event (CSR: order of edges, pointers) and a topological order of the
    2n events; edges that close a cycle (only clock error makes one) are dropped and counted."""
    if "order" in g.cache:
        return g.cache["order"]
    n = g.n
    from_ev, to_ev = _event_edges(g)
    order_e = np.argsort(to_ev, kind="stable")
    ptr = np.searchsorted(to_ev[order_e], np.arange(2 * n + 1))
    indeg = np.bincount(to_ev, minlength=2 * n).astype(np.int64)
    out_order = np.argsort(from_ev, kind="stable")
    out_ptr = np.searchsorted(from_ev[out_order], np.arange(2 * n + 1))
    indeg_l, out_l, optr_l = indeg.tolist(), out_order.tolist(), out_ptr.tolist()
    to_l = to_ev.tolist()
    done = [False] * (2 * n)
    # Kahn's algorithm, nodes' own edges included (start before end)
    for v in range(n):
        indeg_l[2 * v + 1] += 1
    queue = deque(i for i in range(2 * n) if indeg_l[i] == 0)
    order: list[int] = []
    t_rec = np.empty(2 * n, np.int64)
    t_rec[0::2], t_rec[1::2] = g.start, g.start + g.dur
    pending = None
    broken = 0
    while len(order) < 2 * n:
        if not queue:  # a cycle: release the earliest recorded event still waiting
            if pending is None:
                pending = sorted(range(2 * n), key=lambda i: t_rec[i])
            i = next(i for i in pending if not done[i])
            broken += indeg_l[i]
            indeg_l[i] = 0
            queue.append(i)
        i = queue.popleft()
        if done[i]:
            continue
        done[i] = True
        order.append(i)
        nxt = [i + 1] if i % 2 == 0 else []
        nxt += [to_l[e] for e in out_l[optr_l[i]:optr_l[i + 1]]]
        for j in nxt:
            indeg_l[j] -= 1
            if indeg_l[j] == 0 and not done[j]:
                queue.append(j)
    g.cache["order"] = (order_e, ptr, from_ev, order, broken)
    return g.cache["order"]


def _event_edges(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """Each edge as (from event, to event): event 2v is node v's start, 2v+1 its end."""
    et = g.etype
    from_ev = np.where((et == PROGRAM) | (et == COMPLETE) | (et == NEED), 2 * g.src + 1,
                       2 * g.src)
    to_ev = np.where((et == PROGRAM) | (et == LAUNCH), 2 * g.dst, 2 * g.dst + 1)  # others: ends
    return from_ev.astype(np.int64), to_ev.astype(np.int64)


def replay(g: StepGraph, scale: np.ndarray | None = None,
           tail_scale: np.ndarray | None = None, tail_ns: np.ndarray | None = None) -> Replay:
    """Replay `g` (module docstring); `scale` multiplies each node's own work, `tail_scale`
    each comm node's tail (both 1 by default); `tail_ns`, where given, is each node's tail
    before `tail_scale` instead of the recorded one."""
    n = g.n
    order_e, ptr, from_ev, order, broken = _structure(g)
    sc = np.ones(n) if scale is None else np.asarray(scale, np.float64)
    ts = np.ones(n) if tail_scale is None else np.asarray(tail_scale, np.float64)
    waits = np.zeros(n, bool)
    waits[g.dst[(g.etype == COMPLETE) | (g.etype == REACH)]] = True
    own = np.where((g.kind == COMM) | (g.kind == BARRIER) | ((g.kind == WAIT) & waits), 0,
                   np.rint(g.dur * sc)).astype(np.int64)
    tail = np.rint((g.tail if tail_ns is None else tail_ns) * ts).astype(np.int64)
    weight = np.where((g.etype == LAUNCH) | (g.etype == REACH), np.rint(g.offset * sc[g.src]),
                      np.where(g.etype == COMPLETE, g.lag[g.dst], 0)).astype(np.int64)
    heads = np.zeros(n, bool)
    heads[[lo for lo, _ in (*g.lanes.values(), *g.device_lanes.values())]] = True
    t = [0] * (2 * n)
    by = [_NEG] * (2 * n)
    oe, pl, fe, w = order_e.tolist(), ptr.tolist(), from_ev.tolist(), weight.tolist()
    own_l, tail_l, start_l = own.tolist(), tail.tolist(), g.start.tolist()
    kind_l, heads_l = g.kind.tolist(), heads.tolist()
    for i in order:
        v = i >> 1
        best, arg = _NEG, _NEG
        if i & 1:
            if kind_l[v] != BARRIER:
                best, arg = t[i - 1] + own_l[v], -1 - v
        elif heads_l[v]:
            best = start_l[v]
        for k in range(pl[i], pl[i + 1]):
            e = oe[k]
            x = t[fe[e]] + w[e]
            if x > best:
                best, arg = x, e
        if best == _NEG:  # a node nothing reaches (its edges were dropped): as recorded
            best = start_l[v] if not i & 1 else t[i - 1] + own_l[v]
        t[i] = best + (tail_l[v] if i & 1 else 0)
        by[i] = arg
    ta = np.array(t, np.int64)
    start, end = ta[0::2], ta[1::2]
    bar = g.kind == BARRIER
    start[bar] = end[bar]
    return Replay(start, end, np.array(by[0::2], np.int64), np.array(by[1::2], np.int64),
                  own, tail, broken)


def step_spans(g: StepGraph, r: Replay) -> dict[int, dict[int, tuple[int, int, int, int]]]:
    """step -> rank -> (replayed start, replayed end, recorded start, recorded end) of the
    step's window on that rank's lane, and the last node of it (for the critical path)."""
    out: dict[int, dict[int, tuple[int, int, int, int]]] = {}
    for rank, (lo, hi) in g.lanes.items():
        step = g.step[lo:hi]
        for s in np.unique(step[step != BETWEEN]).tolist():
            idx = np.flatnonzero(step == s) + lo
            a, b = int(idx[0]), int(idx[-1])
            out.setdefault(int(s), {})[int(rank)] = (int(r.start[a]), int(r.end[b]),
                                                     int(g.start[a]), b)
    return out


@dataclass
class Path:
    """The critical path of one step: pieces (rank, kind index into PATH_KINDS, ns, node)."""

    rank: np.ndarray
    kind: np.ndarray
    ns: np.ndarray
    node: np.ndarray

    def by_kind(self) -> dict[str, int]:
        return {k: int(self.ns[self.kind == i].sum()) for i, k in enumerate(PATH_KINDS)}

    def by_rank(self) -> dict[int, int]:
        return {int(x): int(self.ns[self.rank == x].sum()) for x in np.unique(self.rank)}


_OWN_KIND = {COMPUTE: 0, DATA: 3, HOST: 4, WAIT: 2, COMM: 1, BARRIER: 1}


def critical_path(g: StepGraph, r: Replay, last: int, t0: int) -> Path:
    """Walk back from node `last`'s end to time `t0` along the edges that decided each event
    (module docstring); the pieces tile [t0, end of `last`]. Launch offsets count as their
    source's work, a waiting segment's lag and a lane's idle start as host, tails as
    transfer."""
    ev, pieces = 2 * last + 1, []
    while True:
        v, is_end = ev >> 1, ev & 1
        t_ev = int(r.end[v] if is_end else r.start[v])
        if t_ev <= t0:
            break
        arg = int(r.end_by[v] if is_end else r.start_by[v])
        extra = int(r.tail[v]) if is_end else 0
        if extra:
            pieces.append((int(g.rank[v]), 1, min(extra, t_ev - t0), v))
            t_ev -= extra
        if arg == _NEG:  # a lane's first segment: nothing before it in the graph
            pieces.append((int(g.rank[v]), 4, max(t_ev - t0, 0), v))
            break
        if arg < 0:  # its own work, from its start
            u, prev = v, 2 * v
            kind = _OWN_KIND[int(g.kind[v])]
        else:
            u, et = int(g.src[arg]), int(g.etype[arg])
            prev = 2 * u + 1 if et in (PROGRAM, COMPLETE, NEED) else 2 * u
            kind = _OWN_KIND[int(g.kind[u])] if et in (LAUNCH, REACH) else \
                4 if et == COMPLETE else -1
            if et == ARRIVE:
                kind = -1
        t_prev = int(r.end[prev >> 1] if prev & 1 else r.start[prev >> 1])
        span = t_ev - max(t_prev, t0)
        if kind >= 0 and span > 0:
            pieces.append((int(g.rank[u]), kind, span, u))
        ev = prev
    if not pieces:
        z = np.zeros(0, np.int64)
        return Path(z, z, z, z)
    a = np.array(pieces, np.int64)
    return Path(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
