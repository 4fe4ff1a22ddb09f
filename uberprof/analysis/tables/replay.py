"""Replaying the step graph (`graph.py`): every node's start and end from its dependencies, with
the recorded durations or changed ones, and the critical path that sets each step's length.

The graph is replayed as 2 events per node (its start, its end). Once per graph (kept in its
`cache`, so every replay of it with other durations reuses it) Kahn's algorithm, run a whole
frontier at a time in numpy (an event at a time in Python for a graph of a few ranks, whose
levels hold an event or two: `MAX_LANES_EVENT_KAHN`), gives each event a *level*: the longest
chain of dependencies from an event that waits for nothing (a node's own start -> end included).
No event waits for one of its own level, so a replay walks the levels in order and computes each
level's events at once: the latest of their incoming edges in one `maximum.reduceat`, the
deciding edge the first in each event's edge order to reach it, as an event-at-a-time loop would
keep it. The loop (`how="loop"`) is kept as the reference (tests/unit/test_replay_levels.py
checks the two agree exactly) and runs where the levels are narrow (a few ranks: fewer than
MIN_EVENTS_PER_LEVEL events a level, where a level's numpy steps cost more than its events in
the loop). An event's time is the latest of what it waits for:

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

A cycle (only clock error makes one) stops Kahn's algorithm: the earliest recorded event still
waiting is released, and the dependencies into it not yet met are dropped (counted in
`Replay.broken`); an event whose every dependency was dropped keeps its recorded start.

With the recorded durations this reproduces the recorded times wherever the trace is
self-consistent; what it does not reproduce (clock error, work the trace does not show) is the
replay error that `diagnosis/whatif.py` reports. Each event keeps the edge that decided it, so
the critical path of a step is read backwards from its end: a chain of (rank, kind, interval)
pieces that tile the step.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

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

__all__ = ["NODE_CACHE", "PATH_KINDS", "Path", "Replay", "critical_path", "keeps_levels",
           "recorded_device_spans", "replay", "step_spans"]

PATH_KINDS = ("compute", "transfer", "waiting", "data", "host")
_SELF = 4  # the implicit edge from a node's start to its end
_NEG = -(1 << 62)
NODE_CACHE = ("windows", "device_windows")  # what a graph caches from its nodes alone: an
#                            edit of its edges keeps it (the structure it must compute again)


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


@dataclass
class _Structure:
    """What a replay needs of a graph's shape, computed once per graph (its `cache`): the
    events' levels and, per level, its events and their incoming edges (module docstring)."""

    from_ev: np.ndarray  # per edge, its source event
    order_e: np.ndarray  # kept edges by target event, each event's in edge order (CSR)
    ptr: np.ndarray  # per event, its kept edges' range in order_e
    ev: np.ndarray  # the events by level (a topological order)
    lptr: np.ndarray  # per level, its events' range in ev
    k: np.ndarray  # kept edges in the order of ev (each event's in edge order)
    eptr: np.ndarray  # per level, its edges' range in k
    seg: np.ndarray  # per event of ev with an edge, the offset of its first edge in its level
    sptr: np.ndarray  # per level, its range in seg (and seg_ev)
    seg_ev: np.ndarray  # per event of ev with an edge, its offset in its level
    seg_of: np.ndarray  # per edge of k, the index of its event among its level's seg
    single: np.ndarray  # per level: every event has exactly one edge (no reduction needed)
    broken: int

    @property
    def levels(self) -> int:
        return int(self.lptr.size - 1)


def _structure(g: StepGraph) -> _Structure:
    """Levels of the 2n events (module docstring), by Kahn's algorithm one level at a time;
    where the graph has a cycle (only clock error makes one) the earliest recorded event still
    waiting is released, and the edges into it not yet satisfied are dropped and counted."""
    if "structure" in g.cache:
        return g.cache["structure"]
    n2 = 2 * g.n
    ix = _index_type(n2 + g.src.size)  # indices only (never times): 32 bits where they fit
    from_ev, to_ev = (a.astype(ix) for a in _event_edges(g))
    own = np.arange(0, n2, 2, dtype=ix)
    a_from, a_to = np.r_[from_ev, own], np.r_[to_ev, own + 1]  # with each node's own edge
    out = np.argsort(a_from, kind="stable")
    out_to = a_to[out]
    del out
    optr = _offsets(a_from, n2, ix)  # (the levels' counts, offsets and levels in `ix` too:
    indeg = np.bincount(a_to, minlength=n2).astype(ix)  # int64 they were 30 MB each at 512
    del a_from, a_to, own  # ranks, and with the transients, freed as soon as they are used,
    #                        they made the report's peak)
    if len(g.lanes) + len(g.device_lanes) <= MAX_LANES_EVENT_KAHN:
        level, lv, broken = _levels_by_event(g, out_to, optr, indeg)
    else:
        level, lv, broken = _levels_by_frontier(g, out_to, optr, indeg)
    del out_to, optr, indeg
    kept = np.flatnonzero(level[from_ev] < level[to_ev])  # an edge into a released event
    #                                                        from one not yet placed: dropped
    order_e = kept[np.argsort(to_ev[kept], kind="stable")]
    del kept
    ptr = _offsets(to_ev[order_e], n2, ix)
    del to_ev
    order_e = order_e.astype(ix)
    ev = np.argsort(level, kind="stable")
    lptr = np.searchsorted(level[ev], np.arange(lv + 1))
    first = ptr[ev]
    cnt = ptr[ev + 1] - first  # per event of ev, its kept edges
    ecum = np.zeros(cnt.size + 1, ix)
    np.cumsum(cnt, out=ecum[1:])
    k = order_e[np.repeat(first - ecum[:-1], cnt) + np.arange(int(ecum[-1]))]
    del first
    eptr = ecum[lptr]
    has = np.flatnonzero(cnt > 0)
    lev_of = level[ev[has]]
    del level
    seg = (ecum[has] - eptr[lev_of]).astype(ix)
    del ecum
    sptr = np.searchsorted(lev_of, np.arange(lv + 1))
    seg_ev = (has - lptr[lev_of]).astype(ix)
    seg_of = np.repeat(np.arange(has.size) - sptr[lev_of], cnt[has]).astype(ix)
    del has, lev_of, cnt
    per_level = np.diff(lptr)
    single = (np.diff(sptr) == per_level) & (np.diff(eptr) == per_level)
    g.cache["structure"] = _Structure(from_ev, order_e, ptr, ev, lptr, k, eptr, seg, sptr,
                                      seg_ev, seg_of, single, broken)
    return g.cache["structure"]


def _offsets(keys: np.ndarray, n: int, ix: type[np.signedinteger[Any]]) -> np.ndarray:
    """Where each value 0..n-1 of the sorted `keys` starts (n+1 offsets, CSR), in `ix`: the
    counts' running sum, without the 2 arrays of n+1 int64 a search of each value made."""
    out = np.zeros(n + 1, ix)
    np.cumsum(np.bincount(keys, minlength=n), out=out[1:])
    return out


def _index_type(most: int) -> type[np.signedinteger[Any]]:
    """The structure's index arrays (events, edges, offsets: read as indices, never added to
    times) as int32 where every index fits, which halves the structure the graph keeps (at
    512 ranks 290 MB of int64, held again for each edited graph a projection replays)."""
    return np.int32 if most < np.iinfo(np.int32).max else np.int64


# A graph of this many lanes or fewer (8 device ranks: 16) is levelled an event at a time in
# Python: its levels hold a few events each, and a level's numpy steps (~0.1 ms) cost more than
# its events do in the loop (~0.5 us an edge). Measured (2026-11-26, 2 ranks of a 142 MiB trace,
# 1.4 M levels): 110 s of the frontier loop's own time over the diagnosis's 5 graphs, now 12 s.
MAX_LANES_EVENT_KAHN = 32


def _release(g: StepGraph, level: np.ndarray | memoryview, pending: np.ndarray | None,
             at: int) -> tuple[int, np.ndarray, int]:
    """The earliest recorded event still waiting (a cycle): (event, pending order, cursor)."""
    if pending is None:
        t_rec = np.empty(2 * g.n, np.int64)
        t_rec[0::2], t_rec[1::2] = g.start, g.start + g.dur
        pending = np.argsort(t_rec, kind="stable")
    while level[pending[at]] >= 0:
        at += 1
    return int(pending[at]), pending, at


def _levels_by_frontier(g: StepGraph, out_to: np.ndarray, optr: np.ndarray,
                        indeg: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Each event's level, a whole frontier at a time in numpy (wide graphs); (levels, number
    of levels, dependencies dropped)."""
    n2 = 2 * g.n
    level = np.full(n2, -1, indeg.dtype)
    front = np.flatnonzero(indeg == 0)
    pending: np.ndarray | None = None
    at, done, lv, broken = 0, 0, 0, 0
    while done < n2:
        if front.size == 0:  # a cycle: release the earliest recorded event still waiting
            i, pending, at = _release(g, level, pending, at)
            broken += int(indeg[i])
            indeg[i] = 0
            front = np.array([i], np.int64)
        level[front] = lv
        lv += 1
        done += front.size
        lo, hi = optr[front], optr[front + 1]
        cnt = hi - lo
        tot = int(cnt.sum())
        if tot == 0:
            front = front[:0]
            continue
        nxt = out_to[np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(tot)]
        np.subtract.at(indeg, nxt, 1)
        nxt = nxt[(indeg[nxt] == 0) & (level[nxt] < 0)]
        front = np.unique(nxt) if nxt.size > 1 else nxt  # an event two edges of it reached
    return level, lv, broken


def _levels_by_event(g: StepGraph, out_to: np.ndarray, optr: np.ndarray,
                     indeg: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The same levels as `_levels_by_frontier`, an event at a time on Python lists (narrow
    graphs). An event joins the next level when its last dependency is placed; the order of
    events within a level does not change any level."""
    n2 = 2 * g.n
    outl, pl = _ints(out_to), _ints(optr)
    deg_arr, level_arr = indeg.astype(np.int64), np.full(n2, -1, np.int64)
    deg, level = _ints(deg_arr), _ints(level_arr)
    front = np.flatnonzero(indeg == 0).tolist()
    pending: np.ndarray | None = None
    at, done, lv, broken = 0, 0, 0, 0
    while done < n2:
        if not front:  # a cycle: release the earliest recorded event still waiting
            i, pending, at = _release(g, level, pending, at)
            broken += deg[i]
            deg[i] = 0
            front = [i]
        nxt = []
        for i in front:
            level[i] = lv
        for i in front:
            for k in range(pl[i], pl[i + 1]):
                j = outl[k]
                d = deg[j] - 1
                deg[j] = d
                if d == 0 and level[j] < 0:
                    nxt.append(j)
        lv += 1
        done += len(front)
        front = nxt
    return level_arr, lv, broken


def _event_edges(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """Each edge as (from event, to event): event 2v is node v's start, 2v+1 its end."""
    et = g.etype
    from_ev = np.where((et == PROGRAM) | (et == COMPLETE) | (et == NEED), 2 * g.src + 1,
                       2 * g.src)
    to_ev = np.where((et == PROGRAM) | (et == LAUNCH), 2 * g.dst, 2 * g.dst + 1)  # others: ends
    return from_ev.astype(np.int64), to_ev.astype(np.int64)


# A graph whose levels hold fewer events than this on average is replayed event by event: a
# level's numpy steps cost tens of microseconds, an event in the loop about one. Measured
# (2026-11-26, synthetic graphs): the two cost the same at about 20 events a level; the loop is
# 3-7x faster at the 3-4 events a level of 2-4 ranks, the levels 4x faster at the 66 of 64
# ranks and 33x at the 525 of 512 ranks.
MIN_EVENTS_PER_LEVEL = 20


def replay(g: StepGraph, scale: np.ndarray | None = None,
           tail_scale: np.ndarray | None = None, tail_ns: np.ndarray | None = None,
           how: str = "auto", drop: np.ndarray | None = None,
           src: np.ndarray | None = None) -> Replay:
    """Replay `g` (module docstring); `scale` multiplies each node's own work, `tail_scale`
    each comm node's tail (both 1 by default); `tail_ns`, where given, is each node's tail
    before `tail_scale` instead of the recorded one. `how`: `levels` (numpy, a level at a
    time), `loop` (an event at a time: the reference) or `auto` (by events per level).

    `drop` (a mask of `g`'s edges) and `src` (each edge's source where an edit moved some)
    replay `g` as a what-if edit changed it without a copy of its edges or a structure of its
    own, which at 512 ranks were the report's peak: only where `keeps_levels` says the graph's
    levels still order the edited edges; the times are then those of the edited copy's replay
    (tests/unit/test_replay_edits.py), its deciding edges indices into `g`'s edges."""
    n = g.n
    st = _structure(g)
    sc = np.ones(n) if scale is None else np.asarray(scale, np.float64)
    ts = np.ones(n) if tail_scale is None else np.asarray(tail_scale, np.float64)
    esrc = g.src if src is None else src
    waits = np.zeros(n, bool)
    ends = (g.etype == COMPLETE) | (g.etype == REACH)
    waits[g.dst[ends if drop is None else ends & ~drop]] = True
    del ends
    own = np.where((g.kind == COMM) | (g.kind == BARRIER) | ((g.kind == WAIT) & waits), 0,
                   np.rint(g.dur * sc)).astype(np.int64)
    del waits
    tail = np.rint((g.tail if tail_ns is None else tail_ns) * ts).astype(np.int64)
    weight = np.where((g.etype == LAUNCH) | (g.etype == REACH), np.rint(g.offset * sc[esrc]),
                      np.where(g.etype == COMPLETE, g.lag[g.dst], 0)).astype(np.int64)
    heads = np.zeros(n, bool)
    heads[[lo for lo, _ in (*g.lanes.values(), *g.device_lanes.values())]] = True
    fe = st.from_ev if src is None else _moved_from(g, st, src)
    if how == "loop" or (how == "auto" and 2 * n < MIN_EVENTS_PER_LEVEL * st.levels):
        t, by = _replay_loop(g, st, own, tail, weight, heads, fe, drop)
    else:
        t, by = _replay_levels(g, st, own, tail, weight, heads, fe, drop)
    # views of the events' arrays, not copies: a replay's result is 2 arrays of 2n, not 4 of
    # n beside them (at 512 ranks the copies were 57 MB more at each replay's peak)
    start, end = t[0::2], t[1::2]
    bar = g.kind == BARRIER
    start[bar] = end[bar]
    return Replay(start, end, by[0::2], by[1::2], own, tail, st.broken)


def _moved_from(g: StepGraph, st: _Structure, src: np.ndarray) -> np.ndarray:
    """Each edge's source event with the sources `src` moved (as `_event_edges` reads them)."""
    moved = np.flatnonzero(src != g.src)
    fe = st.from_ev.copy()
    et = g.etype[moved]
    late = (et == PROGRAM) | (et == COMPLETE) | (et == NEED)
    fe[moved] = (2 * src[moved] + late).astype(fe.dtype)
    return fe


def keeps_levels(g: StepGraph, src: np.ndarray | None = None) -> bool:
    """Whether `replay(g, drop=..., src=src)` replays an edit of `g` exactly as a copy of it
    with those edges would be: the graph's structure dropped no dependency (a cycle's: an edit
    could change which), and every moved edge still goes from an earlier level to a later one.
    Dropping edges never breaks the order; adding edges is not covered (a copy replays those)."""
    st = _structure(g)
    if st.broken:
        return False
    if src is None:
        return True
    moved = np.flatnonzero(src != g.src)
    if moved.size == 0:
        return True
    level = np.empty(2 * g.n, np.int32)
    level[st.ev] = np.repeat(np.arange(st.levels, dtype=np.int32), np.diff(st.lptr))
    et, dst = g.etype[moved], g.dst[moved]
    to_ev = 2 * dst + ~((et == PROGRAM) | (et == LAUNCH))
    from_ev = 2 * src[moved] + ((et == PROGRAM) | (et == COMPLETE) | (et == NEED))
    return bool((level[from_ev] < level[to_ev]).all())


def _replay_loop(g: StepGraph, st: _Structure, own: np.ndarray, tail: np.ndarray,
                 weight: np.ndarray, heads: np.ndarray, from_ev: np.ndarray,
                 drop: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each event's time and deciding edge, one event at a time in topological order: the
    reference the level replay must match exactly (`from_ev`: each edge's source event;
    `drop`: edges left out)."""
    n = g.n
    t_arr, by_arr = np.zeros(2 * n, np.int64), np.full(2 * n, _NEG, np.int64)
    # memoryviews, not lists: the same Python ints on indexing at 8 bytes an element (a list
    # of a gigabyte trace's graph held ~36 bytes an element, 2.6 GB at 2 ranks of 1 GB)
    t, by = _ints(t_arr), _ints(by_arr)
    oe, pl, fe, w = _ints(st.order_e), _ints(st.ptr), _ints(from_ev), _ints(weight)
    gone = memoryview(np.ascontiguousarray(drop if drop is not None else
                                           np.zeros(weight.size, bool), np.bool_))
    own_l, tail_l, start_l = _ints(own), _ints(tail), _ints(g.start)
    kind_l, heads_l = _ints(g.kind), memoryview(np.ascontiguousarray(heads, np.bool_))
    for i in _ints(st.ev):
        v = i >> 1
        best, arg = _NEG, _NEG
        if i & 1:
            if kind_l[v] != BARRIER:
                best, arg = t[i - 1] + own_l[v], -1 - v
        elif heads_l[v]:
            best = start_l[v]
        for k in range(pl[i], pl[i + 1]):
            e = oe[k]
            if gone[e]:
                continue
            x = t[fe[e]] + w[e]
            if x > best:
                best, arg = x, e
        if best == _NEG:  # a node nothing reaches (its edges were dropped): as recorded
            best = start_l[v] if not i & 1 else t[i - 1] + own_l[v]
        t[i] = best + (tail_l[v] if i & 1 else 0)
        by[i] = arg
    return t_arr, by_arr


def _ints(a: np.ndarray) -> memoryview:
    """`a` as 64-bit integers an event loop indexes (a memoryview: Python ints on reading, no
    list of boxed ints held)."""
    return memoryview(np.ascontiguousarray(a, np.int64))


def _replay_levels(g: StepGraph, st: _Structure, own: np.ndarray, tail: np.ndarray,
                   weight: np.ndarray, heads: np.ndarray, from_ev: np.ndarray,
                   drop: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each event's time and deciding edge, a level at a time: the events of a level wait only
    for events of earlier levels, so each level is a few numpy steps over its events and their
    edges, with the loop's rules (its own work or recorded start first, then the first edge
    in its order that is later). What a level reads of its events and edges is computed for
    a run of levels of at least LEVEL_CHUNK events at a time, not for all 2n events at once:
    at 512 ranks those ten arrays of 2n were 250 MB, the report's peak."""
    ev, k = st.ev, st.k
    t = np.zeros(ev.size, np.int64)  # by event
    by = np.full(ev.size, _NEG, np.int64)
    lptr, eptr, sptr = st.lptr.tolist(), st.eptr.tolist(), st.sptr.tolist()
    levels = len(lptr) - 1
    big = np.iinfo(np.int64).max
    c_hi, c_lo, ce_lo = -1, 0, 0
    for lv, single in enumerate(st.single.tolist()):
        a, b, ea, eb = lptr[lv], lptr[lv + 1], eptr[lv], eptr[lv + 1]
        if b > c_hi:  # the next run of levels: its events' and edges' inputs
            last = min(max(bisect_left(lptr, a + LEVEL_CHUNK), lv + 1), levels)
            c_lo, c_hi, ce_lo = a, lptr[last], ea
            e = ev[c_lo:c_hi]
            v = e >> 1
            is_end = (e & 1).astype(bool)
            prev = np.where(is_end, e - 1, e)  # an end's start (a start: itself, unused)
            worked = is_end & (g.kind[v] != BARRIER)  # an end after its own work
            own_e = np.where(is_end, own[v], 0)
            rec = g.start[v]
            first = np.where(~is_end & heads[v], rec, _NEG)  # a lane's first start: recorded
            first_by = np.where(worked, -1 - v, _NEG)
            add = np.where(is_end, tail[v], 0)
            kc = k[ce_lo:eptr[last]]
            src, w = from_ev[kc], weight[kc]
            gone = drop[kc] if drop is not None else None  # a dropped edge reaches nothing
        i, j, ei, ej = a - c_lo, b - c_lo, ea - ce_lo, eb - ce_lo
        after = t[prev[i:j]] + own_e[i:j]  # an end: its start plus its own work
        best = np.where(worked[i:j], after, first[i:j])
        arg = first_by[i:j].copy()
        if eb > ea:
            x = t[src[ei:ej]] + w[ei:ej]
            if gone is not None:
                x[gone[ei:ej]] = _NEG
            if single:  # one edge each: no reduction
                later = x > best
                best[later], arg[later] = x[later], kc[ei:ej][later]
            else:
                sa, sb = sptr[lv], sptr[lv + 1]
                at, seg = st.seg_ev[sa:sb], st.seg[sa:sb]
                top = np.maximum.reduceat(x, seg)
                pos = np.where(x == top[st.seg_of[ea:eb]], np.arange(eb - ea), big)
                hit = k[ea + np.minimum.reduceat(pos, seg)]  # the first edge at the top
                later = top > best[at]
                best[at[later]], arg[at[later]] = top[later], hit[later]
        none = best == _NEG  # nothing reaches it (its edges were dropped): as recorded
        if none.any():
            best[none] = np.where(is_end[i:j], after, rec[i:j])[none]
        t[ev[a:b]] = best + add[i:j]
        by[ev[a:b]] = arg
    return t, by


# Events whose inputs _replay_levels computes at a time (a run of whole levels, at least this
# many events): small enough that its arrays are a few MB, large enough that a run's numpy
# steps cost nothing beside the levels'.
LEVEL_CHUNK = 1 << 16


def step_spans(g: StepGraph, r: Replay) -> dict[int, dict[int, tuple[int, int, int, int]]]:
    """step -> rank -> (replayed start, replayed end, recorded start, last node) of the step on
    that rank: from its host window's start to the later of the host window's end and the end
    of the step's device work (a device rank's: its last kernel, copy or collective of the
    step's device window, not the idle after it), so device time the host does not wait for
    still sets the step where the device runs behind. The last node is the one that ends it
    (where the critical path is read back from)."""
    step, rank, first, last = _windows(g)
    end = r.end[last]
    d_step, d_rank, d_last = _device_windows(g)
    if d_last.size:  # the device work of the same (step, rank), where it ends later
        key, d_key = step * _RANKS + rank, d_step * _RANKS + d_rank
        order = np.argsort(d_key, kind="stable")
        i = np.clip(np.searchsorted(d_key[order], key), 0, d_key.size - 1)
        dev = np.where(d_key[order][i] == key, d_last[order][i], -1)
        later = (dev >= 0) & (r.end[np.maximum(dev, 0)] > end)
        last = np.where(later, dev, last)
        end = np.where(later, r.end[np.maximum(dev, 0)], end)
    out: dict[int, dict[int, tuple[int, int, int, int]]] = {}
    for s, k, b, x, y, z in zip(step.tolist(), rank.tolist(), last.tolist(),
                                r.start[first].tolist(), end.tolist(), g.start[first].tolist()):
        out.setdefault(s, {})[k] = (x, y, z, b)
    return out


_RANKS = 1 << 24  # (step, rank) as one key: ranks below this


def recorded_device_spans(g: StepGraph) -> dict[tuple[int, int], int]:
    """(step, rank) -> the recorded time from the start of the step's host window to the end
    of its device work on that rank (device ranks with device work in the step): what the
    trace says the step's length is, measured to the device's end as `step_spans` replays it."""
    step, rank, first, _ = _windows(g)
    host = {(s, k): a for s, k, a in zip(step.tolist(), rank.tolist(), g.start[first].tolist())}
    st, rk, last = _device_windows(g)
    ends = g.start[last] + g.dur[last]
    return {(s, k): e - host[(s, k)] for s, k, e in zip(st.tolist(), rk.tolist(), ends.tolist())
            if (s, k) in host}


def _windows(g: StepGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each (step, rank) window of a host lane: its step, rank, first and last node (in one
    sort of the lanes' nodes; kept in the graph's cache: a what-if edit keeps the nodes)."""
    if "windows" not in g.cache:
        g.cache["windows"] = _runs(g, g.lanes.values(), np.zeros(0, np.int64))
    return g.cache["windows"]


def _device_windows(g: StepGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each (step, rank) of a device lane with device work in it: its step, rank and the last
    node of that work (its idle nodes left out; cached like `_windows`)."""
    if "device_windows" not in g.cache:
        if not g.device_lanes:  # CPU ranks only: nothing to pass over
            z = np.zeros(0, np.int64)
            g.cache["device_windows"] = (z, z, z)
            return g.cache["device_windows"]
        st, rk, _, last = _runs(g, g.device_lanes.values(), g.device_idle)
        g.cache["device_windows"] = (st, rk, last)
    return g.cache["device_windows"]


def _runs(g: StepGraph, spans: Any, skip: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The nodes of the lanes `spans` ([lo, hi) each) within a step, less `skip`, grouped by
    (step, rank): each group's step, rank, first and last node."""
    on = np.zeros(g.n, bool)
    for lo, hi in spans:
        on[lo:hi] = True
    on[skip] = False
    nodes = np.flatnonzero(on & (g.step != BETWEEN))
    nodes = nodes[np.lexsort((nodes, g.step[nodes], g.rank[nodes]))]
    st, rk = g.step[nodes], g.rank[nodes]
    new = np.r_[True, (st[1:] != st[:-1]) | (rk[1:] != rk[:-1])] if nodes.size else \
        np.zeros(0, bool)
    head = np.flatnonzero(new)
    tail = np.r_[head[1:] - 1, nodes.size - 1] if head.size else head
    return st[head], rk[head], nodes[head], nodes[tail]


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
