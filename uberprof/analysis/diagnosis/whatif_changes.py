"""The changes `uberprof whatif` replays (docs/whatif.md), each as an edit of the step graph
(`tables/graph.py`): a factor on some nodes' own work, a new transfer time for some comm
nodes, and, for the changes that lift a dependency, a copy of the graph with those edges
dropped, moved or added. `apply_changes` composes any set of them in one fixed order (data,
operators, launches, syncs, link bandwidth, link scale, hidden communication, pipeline
balance, then the straggler against the others' median of what is left), so a change never
depends on the order the options were given in.

Each change also says what it touched (`changes[]` of the projection): the milliseconds it
removed, the transfers it re-timed, and a `note` where it could not act (no such work, no byte
counts, no pipeline stages).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

import numpy as np

from uberprof.analysis.tables import lanes
from uberprof.analysis.tables.graph import StepGraph
from uberprof.analysis.tables.replay import NODE_CACHE

__all__ = ["REMOVABLE", "Change", "Edit", "apply_changes", "edited_graph", "edits_edges",
           "parse_changes"]

REMOVABLE = ("straggler", "data", "launch", "sync", "exposed-comm")
_ORDER = ("data", "op", "launch", "sync", "gbps", "link", "exposed-comm", "balance",
          "straggler")


@dataclass(frozen=True)
class Change:
    """One change to replay. `kind`: `straggler` (its extra work at the others' median; `rank`
    names it, else the run's), `data` (data waits removed), `launch` (launch overhead and
    launch-bound device idle removed), `sync` (host synchronisation waits removed),
    `exposed-comm` (collectives' transfers no longer block their waiter), `link` (transfer
    time / `factor`), `gbps` (transfers at `factor` Gbit/s plus the measured latency),
    `balance` (pipeline stages' compute at their mean), `op` (operator `name` `factor`
    times faster). `sizes` limits a link change to transfers of those byte counts and
    `groups` hidden communication to collectives within those ranks (a finding's scope)."""

    kind: str
    factor: float = 1.0
    name: str = ""
    rank: int | None = None
    sizes: tuple[int, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()

    def describe(self) -> str:
        scope = f" (transfers of {', '.join(map(str, self.sizes))} bytes)" if self.sizes else ""
        return {"straggler": "the straggler's extra work removed (its compute, host, "
                             "data-loader time and waits for its own device per step at the "
                             "others' median)",
                "data": "data-loader waits removed",
                "launch": "launch overhead removed (the host's kernel-launch calls and the "
                          "dispatch of the operators that issued them, and the "
                          "device's idle waiting for launches)",
                "sync": "host synchronisation waits removed",
                "exposed-comm": "communication hidden under compute (collectives' transfers "
                                "no longer block the work after them" +
                                (", within the groups given" if self.groups else "") +
                                "; waiting for late peers, receives and each collective's "
                                "end before its step's end kept)",
                "link": f"collective and send/recv transfer time / {self.factor:g}{scope} "
                        "(waiting for peers unchanged)",
                "gbps": f"transfers at {self.factor:g} Gbit/s: bytes on the link / "
                        f"{self.factor:g} Gbit/s plus the measured latency (waiting for "
                        "peers unchanged)",
                "balance": "pipeline stages' compute at their mean per step",
                "op": f"operator {self.name} {self.factor:g}x faster"}[self.kind]


def parse_changes(remove: list[str], link_scale: float | None, ops: list[str],
                  link_gbps: float | None = None, balance_stages: bool = False
                  ) -> list[Change]:
    """The changes of `uberprof whatif`'s options; ValueError with a sentence on a bad one."""
    out: list[Change] = []
    for what in remove:
        if what not in REMOVABLE:
            raise ValueError(f"--remove {what}: say one of {', '.join(REMOVABLE)}")
        out.append(Change(what))
    if link_scale is not None:
        if not link_scale > 0:
            raise ValueError(f"--link-scale {link_scale}: a factor above 0 (2: twice as fast)")
        out.append(Change("link", float(link_scale)))
    if link_gbps is not None:
        if not link_gbps > 0:
            raise ValueError(f"--link-gbps {link_gbps}: a bandwidth above 0 in Gbit/s")
        out.append(Change("gbps", float(link_gbps)))
    if balance_stages:
        out.append(Change("balance"))
    for spec in ops:
        name, sep, f = spec.rpartition("=")
        try:
            factor = float(f)
        except ValueError:
            factor = -1.0
        if not sep or not name or not factor > 0:
            raise ValueError(f"--op {spec}: say NAME=F, e.g. aten::mm=2 (twice as fast)")
        out.append(Change("op", factor, name))
    return out


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 3)


@dataclass
class Edit:
    """What the changes do to the graph: each node's factor on its own work, its tail (ns),
    the graph to replay (the same one, or a copy with edges dropped, moved or added) and what
    each change touched."""

    own: np.ndarray
    tail: np.ndarray
    graph: StepGraph
    notes: list[dict[str, Any]]
    drop: np.ndarray  # edges dropped
    src: np.ndarray  # each edge's source (moved by hidden communication)
    extra: list[tuple[np.ndarray, np.ndarray, int]]  # edges added (src, dst, kind)


def apply_changes(g: StepGraph, changes: list[Change], straggler: int | None,
                  stages: dict[int, int] | None = None, copy: bool = True) -> Edit:
    """The graph edit of `changes` (module docstring); `straggler` is the run's straggler
    (what a straggler change without a rank acts on), `stages` each rank's pipeline stage.
    `copy=False` leaves `graph` as `g` and the edges' edit in `drop`, `src` and `extra` (the
    caller replays `g` with them or makes the copy, `edited_graph`)."""
    e = Edit(np.ones(g.n), g.tail.astype(np.float64), g, [], np.zeros(g.src.size, bool),
             g.src.copy(), [])
    for c in sorted(changes, key=lambda c: _ORDER.index(c.kind)):
        if c.kind == "data":
            m = g.kind == lanes.DATA
            e.own[m] = 0.0
            e.notes.append(_note(c, removed_ms=_ms(g.dur[m].sum()),
                                 none="no data-loader wait in the traced steps"))
        elif c.kind == "op":
            e.notes.append(_scale_op(g, e.own, c))
        elif c.kind == "launch":
            e.notes.append(_remove_launch(g, e, c))
        elif c.kind == "sync":
            e.notes.append(_remove_sync(g, e, c))
        elif c.kind == "gbps":
            e.notes.append(_link_gbps(g, e, c))
        elif c.kind == "link":
            m = (g.kind == lanes.COMM) & (np.isin(g.nbytes, c.sizes) if c.sizes else True)
            e.tail[m] /= c.factor
            e.notes.append(_with_solo({"change": c.describe(),
                                       "transfer_ms": _ms(g.tail[m].sum())},
                                      _solo(g, _barrier_of(g), np.flatnonzero(m))))
        elif c.kind == "exposed-comm":
            e.notes.append(_hide_comm(g, e, c))
        elif c.kind == "balance":
            e.notes.append(_balance(g, e, c, stages or {}))
        else:
            e.notes.append(_scale_straggler(g, e, c.rank if c.rank is not None
                                            else straggler, c))
    if copy and edits_edges(g, e):
        e.graph = edited_graph(g, e)
    return e


def edits_edges(g: StepGraph, e: Edit) -> bool:
    """Whether the edit drops, moves or adds an edge of `g`."""
    return bool(e.drop.any() or e.extra or (e.src != g.src).any())


def edited_graph(g: StepGraph, e: Edit) -> StepGraph:
    """A copy of `g` with the edit's edges dropped, moved and added (its node cache kept)."""
    keep = ~e.drop
    src = [e.src[keep]] + [x[0] for x in e.extra]
    dst = [g.dst[keep]] + [x[1] for x in e.extra]
    et = [g.etype[keep]] + [np.full(x[0].size, x[2], np.int8) for x in e.extra]
    off = [g.offset[keep]] + [np.zeros(x[0].size, np.int64) for x in e.extra]
    e.graph = dataclasses.replace(g, src=np.concatenate(src).astype(np.int64),
                                  dst=np.concatenate(dst).astype(np.int64),
                                  etype=np.concatenate(et).astype(np.int8),
                                  offset=np.concatenate(off).astype(np.int64),
                                  cache={k: v for k, v in g.cache.items()
                                         if k in NODE_CACHE})  # what the edges don't set
    return e.graph


def _note(c: Change, none: str, **touched: Any) -> dict[str, Any]:
    """A change's entry in `changes[]`, with a note when it touched nothing."""
    doc = {"change": c.describe(), **touched}
    if not any(v for v in touched.values()):
        doc["note"] = none
    return doc


def _scale_op(g: StepGraph, own: np.ndarray, c: Change) -> dict[str, Any]:
    """Operator `c.name` (exact, else every name holding it) `c.factor` times faster: on a CPU
    rank its self time, on a device rank its kernels' time, matched by kernel name or by the
    host operator that launched them (`StepGraph.via_*`): each compute node loses that part
    of its work (the larger of the two where a name matches both ways)."""
    names = [i for i, n in enumerate(g.names) if n == c.name] or \
        [i for i, n in enumerate(g.names) if c.name in n]
    cut = np.zeros(g.n)
    m = np.isin(g.op_name, names)
    np.add.at(cut, g.op_node[m], g.op_ns[m] * (1 - 1 / c.factor))
    v = np.isin(g.via_name, names)
    if v.any():  # the kernels of a host operator on a device rank, counted once per node
        via = np.zeros(g.n)
        np.maximum.at(via, g.via_node[v], g.via_ns[v] * (1 - 1 / c.factor))
        cut = np.maximum(cut, via)
    has = cut > 0
    dur = g.dur[has].astype(np.float64)
    own[has] *= np.clip((dur - cut[has]) / np.where(dur > 0, dur, 1), 0, 1)
    doc = {"change": c.describe(), "matched": sorted(g.names[i] for i in names)[:10],
           "operator_ms": _ms(g.op_ns[m].sum()), "kernel_ms": _ms(_kernel_ns(g, v))}
    if not names:  # a typo, most often: the names it may have meant
        doc["closest"] = difflib.get_close_matches(c.name, sorted(set(g.names)), n=3,
                                                   cutoff=0.5)
    return doc


def _kernel_ns(g: StepGraph, v: np.ndarray) -> float:
    """The device time of the kernels launched by the matched host operators: per node the
    largest of the matched operators' (an operator and the one it encloses hold the same
    kernels), summed."""
    if not v.any():
        return 0.0
    per = np.zeros(g.n)
    np.maximum.at(per, g.via_node[v], g.via_ns[v])
    return float(per.sum())


def _lane_mask(g: StepGraph, device: bool) -> np.ndarray:
    """The nodes of the device lanes (`device`), or of the host lanes of device ranks."""
    m = np.zeros(g.n, bool)
    for r, (lo, hi) in (g.device_lanes.items() if device else
                        ((r, g.lanes[r]) for r in g.device_lanes)):
        m[lo:hi] = True
    return m


def _remove_launch(g: StepGraph, e: Edit, c: Change) -> dict[str, Any]:
    """Device idle waiting for the host to launch its next work (a waiting segment of a
    device lane that a `reach` edge from the host ends) takes no time and no longer waits for
    the launch; the host's own work loses its launch overhead (`lanes.RankLane.launch_ns`:
    the launch calls and the dispatch of the operators that issued them)."""
    dev = _lane_mask(g, device=True)
    reach = (g.etype == lanes.REACH) & dev[g.dst] & ~dev[g.src]
    waits = np.unique(g.dst[reach])
    idle_ns = int(g.dur[waits].sum())
    e.drop |= reach
    e.own[waits] = 0.0
    host = (g.kind == lanes.HOST) & (g.launch_ns > 0)
    dur = g.dur[host].astype(np.float64)
    e.own[host] *= np.clip((dur - g.launch_ns[host]) / np.where(dur > 0, dur, 1), 0, 1)
    return _note(c, device_idle_ms=_ms(idle_ns),
                 launch_overhead_ms=_ms(g.launch_ns[host].sum()),
                 none="nothing launch-bound: no device lane waits for a launch (CPU ranks "
                      "have none) and no launch call is on the host's path")


def _remove_sync(g: StepGraph, e: Edit, c: Change) -> dict[str, Any]:
    """The host's waits for the device (a synchronize, a blocking copy: the waiting segments
    of a device rank's host lane) take no time and wait for nothing."""
    m = _sync_waits(g)
    e.own[m] = 0.0
    e.drop |= m[g.dst] & ((g.etype == lanes.REACH) | (g.etype == lanes.COMPLETE))
    return _note(c, removed_ms=_ms(g.dur[m].sum()),
                 none="no host synchronisation wait: no device rank's host waited for its "
                      "device (CPU ranks have none)")


def _sync_waits(g: StepGraph) -> np.ndarray:
    """The host's waits for its own device: waiting segments of device ranks' host lanes that
    are not waits for a collective (a host running Gloo on device tensors waits for those)."""
    return _lane_mask(g, device=False) & (g.kind == lanes.WAIT) & g.sync


def _barrier_of(g: StepGraph) -> np.ndarray:
    """Each comm node's barrier (-1 elsewhere)."""
    out = np.full(g.n, -1, np.int64)
    a = g.etype == lanes.ARRIVE
    out[g.src[a]] = g.dst[a]
    return out


def _instances(g: StepGraph, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The barriers of comm `nodes`, and each node's instance index into them."""
    return np.unique(_barrier_of(g)[nodes], return_inverse=True)


GBIT = 1e9 / 8  # bytes per second in one Gbit/s


def _link_gbps(g: StepGraph, e: Edit, c: Change) -> dict[str, Any]:
    """Each transfer whose bytes are known takes latency + S * bus / bandwidth after its last
    participant arrived (each participant keeps its own wake-up after the first exit);
    transfers without a byte count keep their time, and the note says how many."""
    comm = np.flatnonzero((g.kind == lanes.COMM) & (_barrier_of(g) >= 0))
    if comm.size == 0:
        return _note(c, transfers=0, none="no collective or send/recv in the graph")
    bars, inv = _instances(g, comm)
    first = np.full(bars.size, np.iinfo(np.int64).max)
    np.minimum.at(first, inv, e.tail[comm].astype(np.int64))  # the first exit's transfer
    size = np.full(bars.size, -1.0)
    np.maximum.at(size, inv, (g.nbytes[comm] * g.bus[comm]).astype(np.float64))
    known = size > 0
    alpha, basis = _latency(size[known], first[known].astype(np.float64))
    new = alpha + size / (c.factor * GBIT) * 1e9
    at = comm[known[inv]]
    k = inv[known[inv]]
    e.tail[at] = np.maximum(e.tail[at] - first[k], 0) + new[k]
    doc: dict[str, Any] = {
        "change": c.describe(), "transfers": int(known.sum()),
        "transfer_ms": _ms(first[known].sum()), "projected_transfer_ms": _ms(new[known].sum()),
        "latency_us": round(alpha / 1e3, 1), "latency_basis": basis}
    if not known.all():
        doc["note"] = (f"{int((~known).sum())} of {bars.size} transfers have no byte count "
                       "in the traces (kept as recorded)")
    return _with_solo(doc, _solo(g, _barrier_of(g), at))


def _latency(size: np.ndarray, t: np.ndarray) -> tuple[float, str]:
    """The run's measured latency (ns): the intercept of the transfer time against the bytes
    on the link, fitted to each message size's median transfer; with one size (or sizes less
    than 2x apart, where noise decides the intercept) it cannot be told from the bandwidth and
    is taken as 0, which makes a faster link's gain an upper bound."""
    if size.size == 0:
        return 0.0, "no transfer with a byte count"
    sizes = np.unique(size)
    med = np.array([np.median(t[size == s]) for s in sizes])
    if sizes.size < 2 or sizes[-1] < 2 * sizes[0]:
        what = "one message size" if sizes.size < 2 else \
            "message sizes less than 2x apart"
        return 0.0, (f"{what}: the latency cannot be told from the bandwidth and is taken as 0 "
                     "(the projected gain of a faster link is an upper bound)")
    slope, icpt = np.polyfit(sizes, med, 1)
    if slope <= 0:
        return float(med.min()), (f"the transfer time does not grow with size over "
                                  f"{sizes.size} message sizes: the smallest one's median "
                                  "transfer taken as the latency")
    return float(np.clip(icpt, 0, med.min())), (
        f"intercept of the median transfer time against the bytes on the link, over "
        f"{sizes.size} message sizes")


def _hide_comm(g: StepGraph, e: Edit, c: Change) -> dict[str, Any]:
    """A collective's transfer no longer ends the waiting segment it ended: that segment ends
    when the collective's last participant arrives (plus its wake-up lag), so waiting for a
    late peer stays; the collective itself must still end before the end of the step it was
    issued in (a `need` edge to that step's last segment of its lane). Send/recv are kept:
    the work after a receive uses what it received."""
    bar = _barrier_of(g)
    coll = (g.kind == lanes.COMM) & ~g.p2p & (bar >= 0)
    if c.groups and coll.any():
        ids = np.flatnonzero(coll)
        bars, inv = np.unique(bar[ids], return_inverse=True)
        members: dict[int, set[int]] = {}
        for b, r in zip(bars[inv].tolist(), g.rank[ids].tolist()):
            members.setdefault(b, set()).add(r)
        groups = [set(x) for x in c.groups]
        inside = {b for b, rs in members.items() if any(rs <= x for x in groups)}
        coll[ids[~np.isin(bar[ids], list(inside))]] = False
    moved = (g.etype == lanes.COMPLETE) & coll[g.src] & (g.kind[g.dst] == lanes.WAIT)
    e.src[moved] = bar[g.src[moved]]
    hidden = np.unique(g.src[moved])
    first: dict[int, int] = {}  # per hidden instance, its transfer (the first exit's)
    for b, t in zip(bar[hidden].tolist(), g.tail[hidden].tolist()):
        first[b] = min(first.get(b, t), t)
    # the step's last segment of the lane each collective was issued from
    seg_of = np.full(g.n, -1, np.int64)
    la = g.etype == lanes.LAUNCH
    seg_of[g.dst[la]] = g.src[la]
    last = _last_of_step(g)
    v = np.flatnonzero(coll & (seg_of >= 0))
    v = v[g.step[seg_of[v]] != lanes.BETWEEN]
    if v.size:
        e.extra.append((v, last[seg_of[v]], lanes.NEED))
    doc = _note(c, collectives=int(coll.sum()), unblocked_waits=int(moved.sum()),
                transfer_ms=_ms(sum(first.values())),
                none="no collective ends a waiting segment: nothing to hide")
    return _with_solo(doc, _solo(g, bar, hidden))


def _with_solo(doc: dict[str, Any], solo: int) -> dict[str, Any]:
    """`doc` with a note where `solo` of the collectives it changed have no peer in the traces
    (`diagnosis.whatif.with_solo`)."""
    if solo:
        said = doc.get("note")
        doc["note"] = (f"{said}; " if said else "") + (
            f"{solo} collective(s) changed have no peer in the traces (one rank's trace of a "
            "larger job): their whole kernel is counted as transfer, though part of it may be "
            "waiting for late peers, so the projection overstates what the change does (a "
            "gain is an upper bound)")
    return doc


def _solo(g: StepGraph, bar: np.ndarray, hidden: np.ndarray) -> int:
    """How many of the instances of comm nodes `hidden` have one participant only (the
    collectives of a rank whose peers are not in the traces)."""
    if hidden.size == 0:
        return 0
    arrivals = np.bincount(g.dst[g.etype == lanes.ARRIVE], minlength=g.n)
    b = np.unique(bar[hidden])
    return int((arrivals[b[b >= 0]] == 1).sum())


def _last_of_step(g: StepGraph) -> np.ndarray:
    """For each lane node, the last node of its lane in the same step (itself elsewhere)."""
    out = np.arange(g.n, dtype=np.int64)
    for lo, hi in (*g.lanes.values(), *g.device_lanes.values()):
        st = g.step[lo:hi]
        ends = np.r_[np.flatnonzero(st[1:] != st[:-1]), st.size - 1]  # each run's last
        run = np.searchsorted(ends, np.arange(st.size), side="left")
        out[lo:hi] = ends[run] + lo
    return out


def _balance(g: StepGraph, e: Edit, c: Change, stages: dict[int, int]) -> dict[str, Any]:
    """In each step, each stage's compute (its ranks' mean) scaled to the mean over the
    stages: the slow stages lose what the fast ones gain, the total stays."""
    stage_of = {r: s for r, s in stages.items() if r in g.lanes}
    if len(set(stage_of.values())) < 2:
        return {"change": c.describe(), "stages": [],
                "note": "no pipeline stages measured: no send/recv was paired between stages "
                        "(the report's problems say why) or there is one stage only"}
    work = g.dur * e.own
    comp = g.kind == lanes.COMPUTE
    steps, ranks, per = _work_by_step_rank(g, work, comp)
    kinds = sorted(set(stage_of.values()))
    who = np.array(sorted(stage_of), np.int64)
    col = np.searchsorted(ranks, who)  # each staged rank's column
    of = np.searchsorted(kinds, [stage_of[r] for r in who.tolist()])  # and its stage
    mean_of = np.stack([per[:, col[of == i]].mean(axis=1) for i in range(len(kinds))], axis=1) \
        if steps.size else np.zeros((0, len(kinds)))
    target = mean_of.mean(axis=1) if steps.size else np.zeros(0)
    fac = np.where(mean_of > 0, target[:, None] / np.where(mean_of > 0, mean_of, 1.0), 1.0)
    # each staged rank's compute nodes in the steps, times its stage's factor in that step
    nodes = np.flatnonzero(comp & (g.step != lanes.BETWEEN) & np.isin(g.rank, who))
    si = np.searchsorted(steps, g.step[nodes])
    ri = of[np.searchsorted(who, g.rank[nodes])]
    e.own[nodes] *= fac[si, ri]
    before = dict(zip(kinds, mean_of.sum(axis=0).tolist())) if steps.size else {}
    moved = float(np.maximum(mean_of - target[:, None], 0.0).sum())
    return {"change": c.describe(), "moved_ms": _ms(moved),
            "stages": [{"stage": k, "ranks": sorted(r for r, x in stage_of.items() if x == k),
                        "compute_ms": _ms(v), "balanced_ms": _ms(sum(before.values()) /
                                                                 len(before))}
                       for k, v in sorted(before.items())], "steps": int(steps.size)}


def _scale_straggler(g: StepGraph, e: Edit, rank: int | None, c: Change) -> dict[str, Any]:
    """The straggler's work in each step scaled down to the others' median there: its compute,
    its host time, its data-loader waits and its host's waits for its own device (what it does
    or waits for on its own, not what it waits for on its peers), each kind on its own (a
    device rank's kernels and its host's work are two lanes). A scaled wait for the device
    is the straggler's own time: it no longer waits for the device node it was tied to."""
    if rank is None or rank not in g.lanes or len(g.lanes) < 2:
        return {"change": c.describe(), "rank": rank, "removed_ms": 0.0,
                "note": "no straggler to remove" if rank is None else
                f"rank {rank} is not in the graph with another rank"}
    removed = 0.0
    work = g.dur * e.own
    sync = _sync_waits(g)
    for kind, mask in ((lanes.COMPUTE, g.kind == lanes.COMPUTE), (lanes.HOST, g.kind == lanes.HOST),
                       (lanes.DATA, g.kind == lanes.DATA), (lanes.WAIT, sync)):
        steps, ranks, per = _work_by_step_rank(g, work, mask, rank)
        if steps.size == 0:
            continue
        col = int(np.searchsorted(ranks, rank))
        mine = per[:, col]
        target = np.median(np.delete(per, col, axis=1), axis=1)
        cut = mine > target
        fac = np.where(cut, target / np.where(cut, mine, 1.0), 1.0)
        nodes = np.flatnonzero(mask & (g.rank == rank))
        at = np.searchsorted(steps, g.step[nodes])
        ok = (at < steps.size) & (steps[np.clip(at, 0, steps.size - 1)] == g.step[nodes])
        nodes, f = nodes[ok], fac[at[ok]]
        e.own[nodes] *= f
        if kind == lanes.WAIT:  # its own time now: not ended by the device work it waited for
            scaled = np.zeros(g.n, bool)
            scaled[nodes[f < 1.0]] = True
            e.drop |= scaled[g.dst] & ((g.etype == lanes.REACH) | (g.etype == lanes.COMPLETE))
        removed += float((mine - target)[cut].sum())
    return {"change": c.describe(), "rank": rank, "removed_ms": _ms(removed)}


def _work_by_step_rank(g: StepGraph, work: np.ndarray, nodes: np.ndarray,
                       rank: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The steps `rank`'s `nodes` (a mask; any rank's where None) are in, the ranks of the
    lanes, and each step's and rank's `work` summed over `nodes` (steps x ranks; 0 where a
    rank has none): one pass over the nodes, not one per step and rank."""
    ranks = np.array(sorted(g.lanes), np.int64)
    m = nodes & (g.step != lanes.BETWEEN)
    steps = np.unique(g.step[m & (g.rank == rank) if rank is not None else m])
    ri = np.searchsorted(ranks, g.rank)
    m &= (ri < ranks.size) & (ranks[np.clip(ri, 0, ranks.size - 1)] == g.rank)
    if steps.size == 0:
        return steps, ranks, np.zeros((0, ranks.size))
    si = np.searchsorted(steps, g.step)
    m &= (si < steps.size) & (steps[np.clip(si, 0, steps.size - 1)] == g.step)
    per = np.bincount(si[m] * ranks.size + ri[m], weights=work[m],
                      minlength=steps.size * ranks.size).reshape(steps.size, ranks.size)
    return steps, ranks, per
