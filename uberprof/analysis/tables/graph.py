"""The dependency graph of the traced steps across ranks: what each piece of work waited for.

Built only from what `uberprof analyze` and the diagnosis already hold (each rank's event table,
its activity as the breakdown counts it, the matched collective instances and the send/recv
pairs), never from the trace JSON again, and kept columnar: numpy arrays of nodes and edges.

**Nodes.** Per rank, its *lane*: the host window of every analysed step (and the host time
between two steps) cut into consecutive segments of one kind each, in program order, by the
same activity the breakdown uses (`metrics.device_activity`). On a CPU rank: `compute` (the
training thread's operators), `waiting` (communication in flight and no compute: blocked on a
collective or a receive), `data` (a data-loader fetch, nothing else running) and `host` (the
rest: Python, the profiler). A device rank has two lanes: its host's (`waiting` where a runtime
call waited for the device, `data`, `host`) and its device's over the steps' device windows
(`compute`: kernels and copies on any stream, `waiting`: communication kernels and no compute,
or idle until the host launched the next work, `host`: idle for another reason). A lane tiles
its window, so replaying it with its own durations gives its steps' lengths back. Beside the
lanes, each rank's part in a matched collective instance or a send/recv pair is a `comm` node,
and each instance has one `barrier` node (no rank).

**Edges** (`src -> dst`, what must happen before what):

- `program`: a lane's segments one after the other (dst starts when src ends).
- `launch`: a comm node starts at the point of its lane where it was issued (src's start plus
  an offset into it; the offset shrinks with src's work when src is made faster).
- `arrive`: every participant's comm node to its instance's barrier: the barrier passes at the
  last arrival. A receive is an instance of two, so it completes only after its send started.
- `complete`: the barrier to each participant's comm node (it ends its recorded *tail* after
  the last arrival: the transfer), and a comm node to the `waiting` segment it ends: the
  segment ends its recorded *lag* after the comm completes (the thread waking up).
- `reach` (device ranks, host launch -> device work by correlation id): the device's idle
  segment ends when the host, at that point of its lane, launched the work that follows it;
  the host's wait in a synchronize or a blocking copy ends when the device work it waited for
  (that point of the device lane) ends.

What cannot be known from a trace is left as recorded: a comm that does not end a waiting
segment, a waiting segment no matched comm ends (fixed length), a transfer's time under another
schedule or contention. `replay.py` runs the graph; `diagnosis/whatif.py` changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.tables.lanes import (
    ARRIVE,
    BARRIER,
    BETWEEN,
    COMM,
    COMPLETE,
    EDGE_KINDS,
    KINDS,
    LAUNCH,
    PROGRAM,
    REACH,
    WAIT,
    RankLane,
)

if TYPE_CHECKING:
    from uberprof.analysis.tables.contention import CoreSharing

__all__ = ["StepGraph", "build_graph"]

# A comm ends a waiting segment when it ends this close to the segment's end, before or after:
# the waiter may wake before the comm's own span is closed (Gloo signals, then records), or
# some time after it (a thread waiting for a core on a busy host: milliseconds). The closeness
# allowed is WAKE_TOLERANCE_NS, or up to WAKE_SHARE of the segment's length, at most
# WAKE_MAX_NS: a wait far longer than its comm's end explains is left as recorded.
WAKE_TOLERANCE_NS = 100_000
WAKE_SHARE = 0.1
WAKE_MAX_NS = 10_000_000


@dataclass
class StepGraph:
    """The run's graph (module docstring), on aligned clocks. Per node: its recorded start and
    duration, and the recorded parts the replay keeps: `tail` (comm: its end after the last
    arrival), `lag` (waiting: its end after the comm that ends it). Per edge: kind and, for a
    launch, the offset into its source."""

    rank: np.ndarray  # int64, -1 for a barrier
    kind: np.ndarray  # int8, KINDS
    step: np.ndarray  # int64, BETWEEN between steps (comm: that of the segment it was issued in)
    start: np.ndarray  # int64 ns, aligned clocks
    dur: np.ndarray  # int64 ns
    tail: np.ndarray  # int64 ns
    lag: np.ndarray  # int64 ns
    src: np.ndarray  # int64 edges
    dst: np.ndarray
    etype: np.ndarray  # int8, EDGE_KINDS
    offset: np.ndarray  # int64 ns (launch edges)
    op_node: np.ndarray  # int64: the compute node of each operator row
    op_name: np.ndarray  # int64 codes into `names`
    op_ns: np.ndarray  # int64 self ns
    names: list[str]
    lanes: dict[int, tuple[int, int]]  # rank -> its (host) lane's node ids [lo, hi)
    device_lanes: dict[int, tuple[int, int]] = field(default_factory=dict)  # device ranks'
    cache: dict[str, Any] = field(default_factory=dict, repr=False)
    # per node, what link what-ifs need (comm nodes; -1 / 0 elsewhere or unknown): the bytes S
    # the transfer moves as nccl-tests counts them, its bus factor (busbw = S * bus / t), and
    # whether it is a send/recv rather than a collective; per host-lane node, its time in
    # kernel-launch calls (lanes.RankLane.launch_ns)
    nbytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    bus: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    p2p: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    launch_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sync: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per node: a host's
    #   wait for its own device (lanes.RankLane.sync), not for a collective
    via_node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # device
    via_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # compute
    via_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # nodes' kernel
    #   time by the host operators that launched them (lanes.RankLane.via_*; codes into `names`)
    device_idle: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # the
    #   device lanes' idle nodes (lanes.RankLane.idle), ids: a step's device work ends at the
    #   last node of its device window that is not one of them (none on CPU ranks)
    sharing: CoreSharing | None = None  # which nodes share which host's cores (contention.py;
    #   set by the diagnosis where the step timelines show it), for projections

    @property
    def n(self) -> int:
        return int(self.kind.size)

    def counts(self) -> dict[str, int]:
        """Nodes by kind and edges by kind: what the graph holds, for the report."""
        nk = np.bincount(self.kind, minlength=len(KINDS))
        ek = np.bincount(self.etype, minlength=len(EDGE_KINDS))
        return {**{f"{k}_nodes": int(c) for k, c in zip(KINDS, nk)},
                **{f"{k}_edges": int(c) for k, c in zip(EDGE_KINDS, ek)}}


def build_graph(lanes: dict[int, RankLane], offsets: dict[int, int], instances: pa.Table,
                pairs: pa.Table | None = None, consume: bool = False) -> StepGraph:
    """The graph of `lanes` (own clocks, moved by `offsets` onto the aligned clock) joined by
    the matched collective `instances` (rank, instance, start_ns, end_ns on each rank's own
    clock; optional `bytes` and `bus_factor` columns give each transfer's size) and the
    send/recv `pairs` (p2p.PAIR_SCHEMA, aligned). `consume`: take each lane out of `lanes`
    as it is added, so that a lane is freed once the graph holds its copy (the diagnosis's
    lanes are its own: at 512 ranks they and the graph's pieces were held together)."""
    b = _Builder()
    for r in sorted(lanes):
        b.add_lane(lanes.pop(r) if consume else lanes[r], int(offsets.get(r, 0)))
    b.add_comms(_participations(instances, pairs, offsets))
    b.bind_waits()
    return b.graph()


def _participations(instances: pa.Table, pairs: pa.Table | None,
                    offsets: dict[int, int]) -> tuple[np.ndarray, ...]:
    """(instance, rank, start, end, bytes, bus factor, is send/recv) of every rank's part in a
    collective or a send/recv, aligned; send/recv pairs are numbered after the collectives."""
    inst = instances.column("instance").to_numpy().astype(np.int64) if instances.num_rows \
        else np.zeros(0, np.int64)
    rank = instances.column("rank").to_numpy().astype(np.int64) if instances.num_rows \
        else np.zeros(0, np.int64)
    off = np.array([offsets.get(int(r), 0) for r in rank.tolist()], np.int64)
    s = instances.column("start_ns").to_numpy().astype(np.int64) + off if rank.size else inst
    e = instances.column("end_ns").to_numpy().astype(np.int64) + off if rank.size else inst
    names = instances.schema.names if rank.size else []
    nb = np.nan_to_num(instances.column("bytes").to_numpy(zero_copy_only=False)
                       .astype(np.float64), nan=-1).astype(np.int64) if "bytes" in names \
        else np.full(rank.size, -1, np.int64)
    bus = np.nan_to_num(instances.column("bus_factor").to_numpy(zero_copy_only=False)
                        .astype(np.float64), nan=0.0) if "bus_factor" in names \
        else np.zeros(rank.size)
    parts = [(inst, rank, s, e, nb, bus, np.zeros(rank.size, bool))]
    if pairs is not None and pairs.num_rows:
        base = int(inst.max()) + 1 if inst.size else 0
        pid = pairs.column("pair").to_numpy().astype(np.int64) + base
        pb = np.nan_to_num(pairs.column("bytes").to_numpy(zero_copy_only=False)
                           .astype(np.float64), nan=-1).astype(np.int64)
        for side, who in (("send", "src"), ("recv", "dst")):
            parts.append((pid, pairs.column(who).to_numpy().astype(np.int64),
                          pairs.column(f"{side}_start_ns").to_numpy().astype(np.int64),
                          pairs.column(f"{side}_end_ns").to_numpy().astype(np.int64),
                          pb, np.ones(pid.size), np.ones(pid.size, bool)))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(7))


class _Builder:
    """Accumulates nodes and edges as lists of arrays; `graph()` joins them once."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, np.ndarray]] = []
        self.edges: list[tuple[np.ndarray, np.ndarray, int, np.ndarray]] = []
        self.n = 0
        self.lanes: dict[int, tuple[int, int]] = {}
        self.device_lanes: dict[int, tuple[int, int]] = {}
        self.ops: list[tuple[np.ndarray, list[str], np.ndarray]] = []
        self.comm: dict[str, np.ndarray] = {}
        self.launch: list[tuple[np.ndarray, np.ndarray]] = []
        self.sync: list[np.ndarray] = []
        self.idle: list[np.ndarray] = []
        self.via: list[tuple[np.ndarray, list[str], np.ndarray]] = []

    def _nodes(self, **cols: np.ndarray) -> np.ndarray:
        k = cols["kind"].size
        self.nodes.append(cols)
        ids = np.arange(self.n, self.n + k, dtype=np.int64)
        self.n += k
        return ids

    def _edges(self, src: np.ndarray, dst: np.ndarray, kind: int,
               offset: np.ndarray | None = None) -> None:
        off = offset if offset is not None else np.zeros(src.size, np.int64)
        self.edges.append((src.astype(np.int64), dst.astype(np.int64), kind, off))

    def add_lane(self, lane: RankLane, off: int) -> None:
        """A rank's lane (and a device rank's device lane with the edges between them)."""
        ids = self._add_one(lane, off)
        if ids is None:
            return
        self.lanes[lane.rank] = (int(ids[0]), int(ids[-1]) + 1)
        dev = self._add_one(lane.device, off) if lane.device is not None else None
        if dev is None:
            return
        self.device_lanes[lane.rank] = (int(dev[0]), int(dev[-1]) + 1)
        if lane.links.size:
            both = (ids, dev)
            src = np.array([both[a][b] for a, b in lane.links[:, :2].tolist()], np.int64)
            dst = np.array([both[a][b] for a, b in lane.links[:, 2:4].tolist()], np.int64)
            self._edges(src, dst, REACH, lane.links[:, 4])

    def _add_one(self, lane: RankLane, off: int) -> np.ndarray | None:
        if lane.start.size == 0:
            return None
        k = lane.start.size
        z = np.zeros(k, np.int64)
        ids = self._nodes(rank=np.full(k, lane.rank, np.int64), kind=lane.kind.astype(np.int8),
                          step=lane.step, start=lane.start + off, dur=lane.end - lane.start,
                          tail=z, lag=z)
        self._edges(ids[:-1], ids[1:], PROGRAM)
        if lane.op_seg.size:
            self.ops.append((lane.op_seg + ids[0], lane.op_name, lane.op_ns))
        if lane.launch_ns.size == k and lane.launch_ns.any():
            self.launch.append((ids, lane.launch_ns))
        if lane.via_seg.size:
            self.via.append((lane.via_seg + ids[0], lane.via_name, lane.via_ns))
        if lane.idle.size == k:  # a device lane: its idle segments
            self.idle.append(ids[lane.idle])
        if lane.device is not None:  # a device rank's host: its waits for the device
            sync = lane.sync if lane.sync.size == k else lane.kind == WAIT  # (all, unsaid)
            self.sync.append(ids[sync])
        return ids

    def _lane_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cols = {c: np.concatenate([d[c] for d in self.nodes]) if self.nodes else
                np.zeros(0, np.int64) for c in ("rank", "start", "dur")}
        return cols["rank"], cols["start"], cols["dur"]

    def add_comms(self, parts: tuple[np.ndarray, ...]) -> None:
        """Comm nodes issued from the lane segment their start falls in, and one barrier per
        instance; an instance a participant of which lies outside its lane is left out."""
        inst, rank, s, e, nb, bus, p2p = parts
        _, lstart, ldur = self._lane_arrays()
        seg = np.full(inst.size, -1, np.int64)
        for r in self.lanes:  # a device rank's communication runs on its device lane
            lo, hi = self.device_lanes.get(r, self.lanes[r])
            m = rank == r
            j = np.searchsorted(lstart[lo:hi], s[m], side="right") - 1 + lo
            ok = (j >= lo) & (s[m] < lstart[np.clip(j, lo, hi - 1)] + ldur[np.clip(j, lo,
                                                                                    hi - 1)])
            seg[np.flatnonzero(m)[ok]] = j[ok]
        bad = np.unique(inst[seg < 0])
        keep = ~np.isin(inst, bad)
        inst, rank, s, e, seg = inst[keep], rank[keep], s[keep], e[keep], seg[keep]
        nb, bus, p2p = nb[keep], bus[keep], p2p[keep]
        if inst.size == 0:
            self.comm = {"node": np.zeros(0, np.int64)}
            return
        uniq, inv = np.unique(inst, return_inverse=True)
        last = np.full(uniq.size, np.iinfo(np.int64).min)
        np.maximum.at(last, inv, s)
        lane_step = np.concatenate([d["step"] for d in self.nodes])
        z = np.zeros(inst.size, np.int64)
        comm = self._nodes(rank=rank, kind=np.full(inst.size, COMM, np.int8),
                           step=lane_step[seg], start=s, dur=np.maximum(e - s, 0),
                           tail=np.maximum(e - np.maximum(s, last[inv]), 0), lag=z)
        zb = np.zeros(uniq.size, np.int64)
        bar = self._nodes(rank=np.full(uniq.size, -1, np.int64),
                          kind=np.full(uniq.size, BARRIER, np.int8), step=np.full(
                              uniq.size, BETWEEN, np.int64), start=last, dur=zb, tail=zb, lag=zb)
        self._edges(seg, comm, LAUNCH, s - lstart[seg])
        self._edges(comm, bar[inv], ARRIVE)
        self._edges(bar[inv], comm, COMPLETE)
        self.comm = {"node": comm, "rank": rank, "start": s, "end": e, "bytes": nb,
                      "bus": bus, "p2p": p2p}

    def bind_waits(self) -> None:
        """Each waiting segment ends when the comm of its rank that ends nearest its end does
        (within the wake-up tolerance above): a `complete` edge, the difference its lag."""
        c = self.comm
        if not self.nodes or c.get("node") is None or c["node"].size == 0:
            return
        kind = np.concatenate([d["kind"] for d in self.nodes])
        lag = np.concatenate([d["lag"] for d in self.nodes])
        rank, start, dur = self._lane_arrays()
        for r in self.lanes:
            m = c["rank"] == r
            order = np.argsort(c["end"][m], kind="stable")
            ends, starts, nodes = c["end"][m][order], c["start"][m][order], c["node"][m][order]
            w = np.flatnonzero((kind == WAIT) & (rank == r))
            if w.size == 0 or ends.size == 0:
                continue
            b0, b1 = start[w], start[w] + dur[w]
            j = np.searchsorted(ends, b1, side="left")
            lo_j, hi_j = np.clip(j - 1, 0, ends.size - 1), np.clip(j, 0, ends.size - 1)
            jc = np.where(np.abs(ends[lo_j] - b1) <= np.abs(ends[hi_j] - b1), lo_j, hi_j)
            tol = np.maximum(WAKE_TOLERANCE_NS, np.minimum(WAKE_SHARE * (b1 - b0), WAKE_MAX_NS))
            ok = (np.abs(ends[jc] - b1) <= tol) & (ends[jc] > b0) & (starts[jc] < b1)
            self._edges(nodes[jc[ok]], w[ok], COMPLETE)
            lag[w[ok]] = b1[ok] - ends[jc[ok]]  # negative: it woke before the span closed
        at = 0
        for d in self.nodes:
            k = d["kind"].size
            d["lag"] = lag[at:at + k]
            at += k

    def graph(self) -> StepGraph:
        """The graph, once: each column's pieces are let go as it is joined (at 512 ranks the
        pieces and the joined columns together were the report's peak), so the builder is
        spent after this."""
        col = {c: np.concatenate([d.pop(c) for d in self.nodes]) if self.nodes else
               np.zeros(0, np.int8 if c == "kind" else np.int64)
               for c in ("rank", "kind", "step", "start", "dur", "tail", "lag")}
        self.nodes = []
        e, self.edges = self.edges, []
        src = np.concatenate([x[0] for x in e]) if e else np.zeros(0, np.int64)
        dst = np.concatenate([x[1] for x in e]) if e else np.zeros(0, np.int64)
        et = np.concatenate([np.full(x[0].size, x[2], np.int8) for x in e]) if e else \
            np.zeros(0, np.int8)
        off = np.concatenate([x[3] for x in e]) if e else np.zeros(0, np.int64)
        del e
        names: dict[str, int] = {}
        op_node, op_name, op_ns = [], [], []
        for seg, nm, ns in self.ops:
            op_node.append(seg)
            op_name.append(np.array([names.setdefault(x, len(names)) for x in nm], np.int64))
            op_ns.append(ns)
        via_node, via_name, via_ns = [], [], []
        for seg, nm, ns in self.via:
            via_node.append(seg)
            via_name.append(np.array([names.setdefault(x, len(names)) for x in nm], np.int64))
            via_ns.append(ns)
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
        n = col["kind"].size
        nbytes, bus = np.full(n, -1, np.int64), np.zeros(n)
        p2p, launch = np.zeros(n, bool), np.zeros(n, np.int64)
        c = self.comm
        if c.get("node") is not None and c["node"].size:
            nbytes[c["node"]], bus[c["node"]], p2p[c["node"]] = c["bytes"], c["bus"], c["p2p"]
        for ids, ns in self.launch:
            launch[ids] = ns
        sync = np.zeros(n, bool)
        for ids in self.sync:
            sync[ids] = True
        return StepGraph(rank=col["rank"], kind=col["kind"].astype(np.int8), step=col["step"],
                         start=col["start"], dur=col["dur"], tail=col["tail"], lag=col["lag"],
                         src=src, dst=dst, etype=et, offset=off, op_node=cat(op_node),
                         op_name=cat(op_name), op_ns=cat(op_ns), names=list(names),
                         lanes=self.lanes, device_lanes=self.device_lanes, nbytes=nbytes,
                         bus=bus, p2p=p2p, launch_ns=launch, sync=sync,
                         device_idle=cat(self.idle).astype(np.int64), via_node=cat(via_node),
                         via_name=cat(via_name), via_ns=cat(via_ns))
