"""Each rank's *lane* for the step graph (`graph.py`): its analysed steps' windows cut into
consecutive segments of one kind (compute, data, host, waiting) in program order, from its event
table and its activity as the breakdown counts it; on a device rank, its host's lane and its
device's, with the launches and synchronisations between them. The per-rank half of the graph,
read where the analysis's map runs (`lane_passes`); `graph.py` joins the lanes across ranks.
The node and edge kinds are named here, the leaf of the two.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from uberprof.analysis.tables import derived as D
from uberprof.analysis.tables import intervals as iv
from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.operators import self_times
from uberprof.analysis.tables.pool import map_calls
from uberprof.ingest import classify as K

__all__ = [
    "ARRIVE",
    "BARRIER",
    "BETWEEN",
    "COMM",
    "COMPLETE",
    "COMPUTE",
    "DATA",
    "EDGE_KINDS",
    "HOST",
    "KINDS",
    "LAUNCH",
    "NEED",
    "PROGRAM",
    "REACH",
    "WAIT",
    "RankLane",
    "lane_pass",
    "lane_passes",
    "rank_lane",
]

KINDS = ("compute", "data", "host", "waiting", "comm", "barrier")
COMPUTE, DATA, HOST, WAIT, COMM, BARRIER = range(6)
EDGE_KINDS = ("program", "launch", "arrive", "complete", "reach", "need")
PROGRAM, LAUNCH, ARRIVE, COMPLETE, REACH, NEED = range(6)
# `need` (an end before an end) is added only by what-if changes (diagnosis/whatif.py): a
# collective hidden under compute must still end before its step does
BETWEEN = -(1 << 40)  # the step of a segment between two steps' windows (a pseudo-step is -1)


@dataclass
class RankLane:
    """One rank's lane, on its own clock: consecutive segments and the operators in them."""

    rank: int
    start: np.ndarray  # int64 ns
    end: np.ndarray
    kind: np.ndarray  # int8: COMPUTE, DATA, HOST or WAIT
    step: np.ndarray  # int64: the step whose host window holds it, BETWEEN between two steps
    op_seg: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # segment
    op_name: list[str] = field(default_factory=list)  # operator or kernel name per row
    op_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # self time in it
    device: RankLane | None = None  # a device rank's device lane (this one is then the host's)
    links: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.int64))  # reach
    #   edges between the two: (src lane, src segment, dst lane, dst segment, offset); lane 0
    #   is this one, 1 the device's
    launch_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per
    #   segment of a device rank's host lane: its time inside kernel-launch runtime calls
    #   (what `whatif --remove launch` takes off the host); empty: none known
    sync: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per segment of a
    #   device rank's host lane: a wait for its own device (a synchronize, a blocking copy),
    #   not for a collective; empty: none
    via_seg: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # a device
    via_name: list[str] = field(default_factory=list)  # lane's kernels by the host operators
    via_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # that launched
    #   them (the innermost by external id, and those enclosing it): segment, operator name,
    #   its kernels' time in the segment; what `whatif --op aten::mm=2` shortens on a GPU rank
    idle: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per segment of a
    #   device lane: no kernel, copy or collective runs (waiting for a launch or for another
    #   reason); a step's device work ends at its last segment that is not idle. Empty: none

    @classmethod
    def empty(cls, rank: int) -> RankLane:
        z = np.zeros(0, np.int64)
        return cls(rank, z, z, np.zeros(0, np.int8), z)


def rank_lane(rank: int, events: pa.Table, steps: pa.Table,
              act: M.Activity | None = None) -> RankLane:
    """This rank's lane over the host windows of `steps` (its analysed steps, RUN_STEP_SCHEMA),
    cut by its activity (module docstring; where kinds overlap, the first listed wins). A
    CPU rank has one lane: compute, waiting, data, host. A device rank has two: the host's
    (blocked on the device, data, host, and blocked on a collective its host runs: Gloo on
    device tensors) and, in `device`, the device's over the steps' device windows (compute,
    waiting on communication, idle), joined by launches and syncs."""
    st = steps.filter(pa.array(np.asarray(steps.column("host_end_ns").is_valid()))) \
        .sort_by("host_start_ns")
    if st.num_rows == 0 or events.num_rows == 0:
        return RankLane.empty(rank)
    act = act if act is not None else M.device_activity(events)
    ts = events.column("ts").to_numpy()
    end = ts + events.column("dur").to_numpy()
    data_m = M.kind_mask(events, (K.DATALOADER,))
    data = iv.union(ts[data_m], end[data_m])
    work = iv.merge(act.compute, act.memory)
    host_w = _windows(st, "host_start_ns", "host_end_ns")
    if act.mode == "cpu":
        lane = _cut(rank, host_w, [(COMPUTE, work), (WAIT, act.comm), (DATA, data)])
        _add_ops(lane, events, act)
        return lane
    syncs = _sync_calls(events, act)
    lane = _cut(rank, host_w, [(WAIT, iv.union(syncs[0], syncs[1])), (DATA, data),
                               (HOST, _host_work(events, ts, end)),
                               (_COMM_WAIT, _host_comm(events, ts, end))])
    lane.sync = lane.kind == WAIT  # cut apart from the waits for a collective, then named
    lane.kind[lane.kind == _COMM_WAIT] = WAIT
    dev_st = st.filter(pa.array(np.asarray(st.column("device_start_ns").is_valid())))
    if dev_st.num_rows == 0:
        return lane
    lane.device = _cut(rank, _windows(dev_st.sort_by("device_start_ns"), "device_start_ns",
                                      "device_end_ns"), [(COMPUTE, work), (WAIT, act.comm)])
    lane.device.idle = lane.device.kind == HOST  # before `_link` names the launch waits
    _add_ops(lane.device, events, act)
    tree = _OpTree.of(events)
    _add_launching_ops(lane.device, events, tree)
    _link(lane, act, syncs)
    lane.launch_ns = _launch_time(lane, events, tree)
    return lane


_COMM_WAIT = 64  # a host waiting for a collective, while the lane is cut: WAIT once cut


def _host_work(events: pa.Table, ts: np.ndarray, end: np.ndarray) -> iv.Intervals:
    """A device rank's host work: the training threads' operators (the forward, the autograd
    thread's backward launches, the optimizer), whose time is the host's own."""
    m = M.kind_mask(events, M.CPU_COMPUTE_KINDS) & \
        np.isin(events.column("tid").to_numpy(), M.training_threads(events))
    return iv.union(ts[m], end[m])


def _host_comm(events: pa.Table, ts: np.ndarray, end: np.ndarray) -> iv.Intervals:
    """Collectives a device rank runs on its host (Gloo on CUDA tensors: `gloo:*` spans on
    Gloo's threads). Where one is in flight and no training thread runs an operator, the host
    waits for it (DDP's wait for its buckets at the end of backward): waiting, which the graph
    ties to the collective's end, not host work of fixed length, or a late peer's delay would
    read as this rank's own time."""
    m = M.kind_mask(events, M.CPU_COMM_KINDS)
    return iv.union(ts[m], end[m])


_LAUNCH_CALL = "Launch"  # cudaLaunchKernel, cuLaunchKernelEx, hipLaunchKernel, cudaGraphLaunch


def _launch_time(lane: RankLane, events: pa.Table, tree: _OpTree) -> np.ndarray:
    """Per host segment (host work only), its launch overhead: time inside kernel-launch runtime
    calls on the training threads, and inside the operators that issued them (the innermost
    operator around each launch call, less the operators nested in it): the dispatch each
    launch costs, which CUDA graphs or a compiled region take off the host. Python between
    operators, and operators that launch nothing, are not counted."""
    tid = events.column("tid").to_numpy()
    m = M.kind_mask(events, (K.RUNTIME,)) & np.isin(tid, M.training_threads(events))
    rows = np.flatnonzero(m)
    out = np.zeros(lane.start.size, np.int64)
    if rows.size == 0 or lane.start.size == 0:
        return out
    names = events.column("name").combine_chunks()
    vocab = names.dictionary.to_pylist()
    is_launch = np.array([_LAUNCH_CALL in str(v) for v in vocab], bool)
    codes = names.indices.to_numpy(zero_copy_only=False)[rows]
    rows = rows[is_launch[codes]]
    if rows.size == 0:
        return out
    ts_all, dur_all = events.column("ts").to_numpy(), events.column("dur").to_numpy()
    calls = iv.union(ts_all[rows], ts_all[rows] + dur_all[rows])
    if tree.ops.size:
        who = tree.innermost(tid[rows], ts_all[rows], np.ones(rows.size, bool))
        launchers = np.unique(who[who >= 0])
        inner = np.flatnonzero(np.isin(tree.parent, launchers))  # nested in them
        own = iv.subtract(iv.union(tree.ts[launchers], tree.end[launchers]),
                          iv.union(tree.ts[inner], tree.end[inner]))
        calls = iv.merge(calls, own)
    host = lane.kind == HOST
    out[host] = iv.covered_in(calls, lane.start[host], lane.end[host])
    return out


def _windows(st: pa.Table, lo: str, hi: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, steps) of the steps' windows, made not to overlap."""
    ws = st.column(lo).to_numpy().astype(np.int64)
    we = np.maximum(st.column(hi).to_numpy(zero_copy_only=False).astype(np.int64), ws)
    we[:-1] = np.minimum(we[:-1], ws[1:])
    return ws, we, st.column("step").to_numpy().astype(np.int64)


def _cut(rank: int, windows: tuple[np.ndarray, np.ndarray, np.ndarray],
         sets: list[tuple[int, iv.Intervals]]) -> RankLane:
    """The span of `windows` cut into maximal segments of one kind (the first set holding an
    instant names it, else host) and one step (BETWEEN between windows)."""
    ws, we, steps = windows
    lo, hi = int(ws[0]), int(we[-1])
    bounds = [np.array([lo, hi]), ws, we] + [np.r_[x.starts, x.ends] for _, x in sets]
    b = np.unique(np.clip(np.concatenate(bounds).astype(np.int64), lo, hi))
    left, right = b[:-1], b[1:]
    kind = np.full(left.size, HOST, np.int8)
    for k, x in reversed(sets):  # the first set wins
        kind[M._starts_inside(left, x)] = k
    w = np.searchsorted(ws, left, side="right") - 1
    inside = (w >= 0) & (left < we[np.clip(w, 0, None)])
    step = np.where(inside, steps[np.clip(w, 0, None)], BETWEEN)
    cut = np.r_[True, (kind[1:] != kind[:-1]) | (step[1:] != step[:-1])]
    first = np.flatnonzero(cut)
    seg_end = np.r_[left[first[1:]], right[-1]] if first.size else first
    return RankLane(rank, left[first], seg_end, kind[first], step[first].astype(np.int64))


MIN_SYNC_NS = 20_000  # a host call shorter than this is not read as waiting for the device
# It waited for device work that ended this close to its return, before or after (the
# device's clock and the host's are read apart: a blocking copy returns before its end).
SYNC_TOLERANCE_NS = 100_000


def _sync_calls(events: pa.Table, act: M.Activity) -> tuple[np.ndarray, ...]:
    """Host runtime calls on the step-carrying threads that waited for the device: at least
    MIN_SYNC_NS long and returning within SYNC_TOLERANCE_NS of the end of some device work
    that was under way (a synchronize, a blocking copy). (starts, ends, that device end)."""
    tid = events.column("tid").to_numpy()
    threads = np.unique(tid[M.kind_mask(events, (K.STEP,))])
    m = M.kind_mask(events, (K.RUNTIME, K.SYNC)) & np.isin(tid, threads)
    ts = events.column("ts").to_numpy()[m]
    ce = ts + events.column("dur").to_numpy()[m]
    ends = np.sort(act.ends) if act.ends.size else act.ends
    if ends.size == 0 or ts.size == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    j = np.searchsorted(ends, ce, side="left")
    before, after = ends[np.clip(j - 1, 0, None)], ends[np.clip(j, None, ends.size - 1)]
    dev = np.where(np.abs(ce - before) <= np.abs(after - ce), before, after)
    ok = (ce - ts >= MIN_SYNC_NS) & (np.abs(ce - dev) <= SYNC_TOLERANCE_NS) & (dev > ts)
    return ts[ok].astype(np.int64), ce[ok].astype(np.int64), dev[ok].astype(np.int64)


def _link(lane: RankLane, act: M.Activity, syncs: tuple[np.ndarray, ...]) -> None:
    """Intra-rank edges of a device rank (`reach`: a node's start plus an offset bounds
    another's end): the device idle before work waits for the host to launch that work, and
    a host wait ends when the device work it waited for does."""
    dev = lane.device
    assert dev is not None
    # launches: an idle segment followed by work launched while it was idle (the device
    # waited for the host); idle for other reasons (a stream waiting on another) stays fixed
    order = np.argsort(act.starts, kind="stable")
    starts, launch, linked = act.starts[order], act.launch[order], act.linked[order]
    idle = np.flatnonzero((dev.kind[:-1] == HOST) & (dev.kind[1:] != HOST))
    s = dev.start[idle + 1]
    k = np.searchsorted(starts, s, side="left")
    kc = np.clip(k, 0, max(starts.size - 1, 0))
    ok = (k < starts.size) & (starts[kc] == s) & linked[kc] if starts.size else \
        np.zeros(idle.size, bool)
    at = launch[kc].astype(np.int64) if starts.size else s
    h = _segs_at(lane, at)
    ok &= (h >= 0) & (dev.start[idle] < at) & (at <= s)  # launched while the device sat idle
    dev.kind[idle[ok]] = WAIT
    launches = np.c_[np.zeros(ok.sum(), np.int64), h[ok], np.ones(ok.sum(), np.int64),
                     idle[ok], s[ok] - lane.start[h[ok]]]
    # syncs: the host segment that ends with the call waits for the device node holding the
    # end of the work it waited for
    ce, d_end = syncs[1].astype(np.int64), syncs[2].astype(np.int64)
    h = np.searchsorted(lane.end, ce, side="left")
    hc = np.clip(h, 0, max(lane.end.size - 1, 0))
    d = _segs_at(dev, d_end - 1)
    ok = (h < lane.end.size) & (lane.end[hc] == ce) & (lane.kind[hc] == WAIT) & (d >= 0) & \
        (dev.start[np.clip(d, 0, None)] < ce)
    waits = np.c_[np.ones(ok.sum(), np.int64), d[ok], np.zeros(ok.sum(), np.int64), h[ok],
                  ce[ok] - dev.start[d[ok]]]
    lane.links = np.concatenate([launches, waits]).astype(np.int64).reshape(-1, 5)


def _segs_at(lane: RankLane, t: np.ndarray) -> np.ndarray:
    """The segment of `lane` holding each time of `t`, -1 outside it."""
    i = np.searchsorted(lane.start, t, side="right") - 1
    ic = np.clip(i, 0, max(lane.start.size - 1, 0))
    ok = (i >= 0) & (i < lane.start.size) & (t < lane.end[ic]) if lane.start.size else \
        np.zeros(t.size, bool)
    return np.where(ok, i, -1).astype(np.int64)


def _add_ops(lane: RankLane, events: pa.Table, act: M.Activity) -> None:
    """Each compute segment's operators (CPU ranks: the training threads' operators by self
    time) or kernels and copies (device ranks: by duration), by the segment they start in."""
    if act.mode == "cpu":
        m = M.kind_mask(events, (K.OPERATOR,)) & np.isin(events.column("tid").to_numpy(),
                                                           M.training_threads(events))
    else:
        m = M.kind_mask(events, (K.KERNEL, K.MEMCPY, K.MEMSET, K.DEVICE_OTHER))
    rows = np.flatnonzero(m)
    if rows.size == 0 or lane.start.size == 0:
        return
    ts = events.column("ts").to_numpy()[rows]
    dur = events.column("dur").to_numpy()[rows].astype(np.int64)
    own = self_times(events.column("tid").to_numpy()[rows], ts, dur) if act.mode == "cpu" \
        else dur
    seg = np.searchsorted(lane.start, ts, side="right") - 1
    ok = (seg >= 0) & (ts < lane.end[np.clip(seg, 0, None)]) & (own > 0)
    ok &= lane.kind[np.clip(seg, 0, None)] == COMPUTE
    names = events.column("name").combine_chunks()
    codes = names.indices.to_numpy(zero_copy_only=False)[rows][ok].astype(np.int64)
    seg = seg[ok]
    n_names = len(names.dictionary)
    key, inv = np.unique(seg * n_names + codes, return_inverse=True)
    lane.op_seg = key // n_names
    lane.op_ns = np.bincount(inv, weights=own[ok]).astype(np.int64)
    vocab = names.dictionary.to_pylist()
    lane.op_name = [str(vocab[c]) for c in (key % n_names).tolist()]


def _add_launching_ops(lane: RankLane, events: pa.Table, tree: _OpTree) -> None:
    """Each compute segment's kernels and copies by the host operators that launched them: the
    innermost operator around the kernel's launch call (the runtime call of the same
    correlation id) on its thread, and every operator enclosing that one (a kernel of
    `aten::mm` under `aten::linear` counts for both), so that a faster host operator on a
    device rank shortens its device work."""
    corr = events.column("correlation").to_numpy()
    ops = tree.ops
    rows = np.flatnonzero(M.kind_mask(events, (K.KERNEL, K.MEMCPY, K.MEMSET, K.DEVICE_OTHER))
                          & (corr >= 0))
    calls = np.flatnonzero(M.kind_mask(events, (K.RUNTIME,)) & (corr >= 0))
    if ops.size == 0 or rows.size == 0 or calls.size == 0 or lane.start.size == 0:
        return
    ts_all, dur_all = events.column("ts").to_numpy(), events.column("dur").to_numpy()
    ts, dur = ts_all[rows], dur_all[rows].astype(np.int64)
    seg = np.searchsorted(lane.start, ts, side="right") - 1
    segc = np.clip(seg, 0, None)
    ok = (seg >= 0) & (ts < lane.end[segc]) & (lane.kind[segc] == COMPUTE) & (dur > 0)
    order = np.argsort(corr[calls], kind="stable")
    j = np.clip(np.searchsorted(corr[calls][order], corr[rows]), 0, calls.size - 1)
    call = calls[order][j]
    ok &= corr[call] == corr[rows]
    cur = tree.innermost(events.column("tid").to_numpy()[call], ts_all[call], ok)
    codes_all = events.column("name").combine_chunks().indices.to_numpy(zero_copy_only=False)
    parent = tree.parent
    segs, codes, ns = [], [], []
    for _ in range(MAX_OP_DEPTH):  # the launcher, then the operators enclosing it
        at = cur >= 0
        if not at.any():
            break
        segs.append(seg[at])
        codes.append(codes_all[ops[cur[at]]].astype(np.int64))
        ns.append(dur[at])
        cur = np.where(at, parent[np.clip(cur, 0, None)], -1)
    if not segs:
        return
    vocab = events.column("name").combine_chunks().dictionary.to_pylist()
    key, inv = np.unique(np.concatenate(segs) * len(vocab) + np.concatenate(codes),
                         return_inverse=True)
    lane.via_seg = key // len(vocab)
    lane.via_ns = np.bincount(inv, weights=np.concatenate(ns)).astype(np.int64)
    lane.via_name = [str(vocab[c]) for c in (key % len(vocab)).tolist()]


MAX_OP_DEPTH = 32  # operators enclosing a kernel's launcher that are followed up


@dataclass
class _OpTree:
    """A device rank's host operators (rows `ops` of its event table) and how they nest: each
    one's innermost enclosing operator on its thread (`parent`, an index into `ops`; -1:
    none). Built once per rank, for the launches' operators (`--op` on a GPU rank, and the
    launch overhead)."""

    ops: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    order: np.ndarray  # by thread, then start (the outer first on a tie)
    parent: np.ndarray

    @classmethod
    def of(cls, events: pa.Table) -> _OpTree:
        ops = np.flatnonzero(M.kind_mask(events, (K.OPERATOR,)))
        tid, ts = events.column("tid").to_numpy()[ops], events.column("ts").to_numpy()[ops]
        end = ts + events.column("dur").to_numpy()[ops]
        order = np.lexsort((-end, ts, tid))
        parent = np.full(ops.size, -1, np.int64)
        for group in np.split(order, np.flatnonzero(np.diff(tid[order])) + 1):
            p = _nesting(ts[group], end[group])
            parent[group] = np.where(p >= 0, group[np.clip(p, 0, None)], -1)
        return cls(ops, tid, ts, end, order, parent)

    def innermost(self, tid: np.ndarray, t: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """For each moment `t` on thread `tid` (where `ok`), the innermost operator (an index
        into `ops`) around it, -1 where none: the last one to start before it on that thread,
        or the nearest of its enclosing operators still open then."""
        out = np.full(t.size, -1, np.int64)
        for th in np.unique(tid[ok]).tolist():
            grp = self.order[self.tid[self.order] == th]
            q = np.flatnonzero(ok & (tid == th))
            k = np.searchsorted(self.ts[grp], t[q], side="right") - 1
            out[q] = np.where(k >= 0, grp[np.clip(k, 0, None)], -1)
        for _ in range(MAX_OP_DEPTH):  # closed before the moment: its parent may be open
            shut = (out >= 0) & (self.end[np.clip(out, 0, None)] < t)
            if not shut.any():
                break
            out[shut] = self.parent[out[shut]]
        out[(out >= 0) & (self.end[np.clip(out, 0, None)] < t)] = -1
        return out


def _nesting(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For spans sorted by start (the outer first on a tie), the position of each one's
    innermost enclosing span, -1 for none: the latest-starting span still open when it starts.
    A span that outlives the one it started in (timestamps rounded to the microsecond: a child
    ending a nanosecond after its parent) is still read as nested in it, so one such pair does
    not cost a whole thread its nesting (HTA's trace_diff traces had none nested before)."""
    parent = np.full(start.size, -1, dtype=np.int64)
    stack: list[int] = []
    ends = end.tolist()
    for i, s in enumerate(start.tolist()):
        while stack and ends[stack[-1]] <= s:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def lane_pass(derived: str, keys: list[str], rank: int, steps: pa.Table) -> RankLane:
    """One rank's lane from its event tables (read, used, dropped: the map's unit of work)."""
    events = D.read_events_if_any(Path(derived), keys)
    return rank_lane(rank, events, steps) if events is not None else RankLane.empty(rank)


def lane_passes(ctx: RunContext, traced: pa.Table) -> dict[int, RankLane]:
    """Every rank's lane, on the analysis's workers (`ctx.workers`, `ctx.executor`)."""
    keys = D.rank_input_keys(ctx.run.inputs)
    rank_col = traced.column("rank").to_numpy(zero_copy_only=False)
    calls = [(str(ctx.derived), keys.get(r, []), r,
              traced.filter(pa.array(rank_col == r))) for r in ctx.rank_ids]
    workers = ctx.workers if ctx.workers is not None else \
        (1 if len(calls) < 8 else min(os.cpu_count() or 1, len(calls)))
    out: dict[int, RankLane] = {}
    for i, res in map_calls(lane_pass, calls, workers, ctx.executor):
        r = calls[i][2]
        out[r] = res if isinstance(res, RankLane) else RankLane.empty(r)
    return out
