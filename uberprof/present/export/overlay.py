"""uberprof's own tracks over the traces: the marks of its findings and the node counters.

Per rank, its marks (idle gaps, straggler waits, link-limited collectives: findings.py) on
tracks that come before the trace's, and its GPU's counters on a track after them. Run-wide,
a process of the findings, the analysed steps and the clock alignment; per node, a process of
the counters no exported rank owns (NICs, CPU, other GPUs). Marks whose ranges overlap without
nesting go to lanes of their own, as the trace's events do.
"""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path
from typing import Any

import numpy as np

from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.present.export import counters as C
from uberprof.present.export.findings import FINDINGS_PROCESS, Mark
from uberprof.present.export.layout import IdSpace, ProcessInfo, TrackInfo, nest_lanes, qualify
from uberprof.present.export.memory import write_memory_counters
from uberprof.present.export.plan import Plan
from uberprof.present.export.tracks import RankState
from uberprof.present.export.window import Selection
from uberprof.present.export.writer import TraceWriter

__all__ = ["NodeCounterReader", "marks_tracks", "write_findings_process", "write_gpu_counters",
           "write_marks", "write_node_counters", "write_rank_overlay"]


class NodeCounterReader:
    """Each node's counters over the export's window (and a while before it: the value they
    start with), on the aligned clock of the node's host; read once per node."""

    def __init__(self, root: Path, d: Diagnosis, plan: Plan, frame: tuple[int, int] | None,
                 base: int) -> None:
        self.root, self.d, self.frame, self.base = root, d, frame, base
        self.hosts = dict(plan.nodes)
        self.cache: dict[str, C.NodeCounters] = {}

    def __call__(self, node: str) -> C.NodeCounters:
        if node not in self.cache:
            assert self.frame is not None  # no counter nodes without a window (plan.py)
            lo, hi = self.frame
            self.cache[node] = C.read_node_counters(
                self.root, node, self._host_offset(self.hosts.get(node)),
                (lo - 10_000_000_000, hi), self.base)
        return self.cache[node]

    def _host_offset(self, host: str | None) -> int:
        for h in self.d.alignment.hosts:
            if h.host == host:
                return h.offset_ns
        return 0


def marks_tracks(writer: TraceWriter, ids: IdSpace, st: RankState, marks: list[Mark],
                 order: tuple[str, ...] = ()) -> None:
    """The tracks of `marks` in process `st` (those named in `order` first, in that order),
    a lane each where ranges overlap; each mark's lane is kept in its args until written."""
    names: list[str] = [t for t in order if any(m.track == t for m in marks)]
    names += [m.track for m in marks if m.track not in names]
    names = list(dict.fromkeys(names))
    for name in names:
        mine = [m for m in marks if m.track == name]
        ranged = [m for m in mine if m.dur is not None]
        lanes = nest_lanes(np.array([m.ts for m in ranged], dtype=np.int64),
                           np.array([m.ts + (m.dur or 0) for m in ranged], dtype=np.int64))
        for m, ln in zip(ranged, lanes.tolist()):
            m.args.setdefault("_lane", ln)
        for m in mine:
            if m.dur is None:
                m.args.setdefault("_lane", 0)
        for ln in sorted({int(m.args["_lane"]) for m in mine}):
            tid = ids.new_tid(st.pid)
            st.tids[("uberprof", name, ln)] = tid
            writer.track(TrackInfo(st.pid, tid, name if ln == 0 else qualify(name, f"lane {ln + 1}"),
                                   len(st.tids)))


def write_marks(writer: TraceWriter, st: RankState, marks: list[Mark], base: int) -> None:
    """`marks` as events on the tracks `marks_tracks` opened: ranges as complete events,
    instants as thread instants, none before the time base."""
    batch = []
    for m in marks:
        lane = int(m.args.pop("_lane", 0))
        tid = st.tids.get(("uberprof", m.track, lane))
        if tid is None:
            continue
        ts = max(m.ts, base)  # nothing before the time base (viewers drop negative times)
        e: dict[str, Any] = {"name": m.name, "cat": "uberprof", "pid": st.pid, "tid": tid,
                             "ts": ts - base, "args": m.args}
        if m.dur is None:
            e["ph"], e["s"] = "i", "t"
        else:
            e["ph"], e["dur"] = "X", max(m.ts + m.dur - ts, 0)
        batch.append(e)
        if m.flow is not None:  # bound to this mark's slice, at `flow_at` (inside it)
            ph, fid = m.flow
            at = ts if m.flow_at is None else min(max(m.flow_at, ts), ts + e.get("dur", 0))
            f = {"ph": ph, "id": fid, "cat": "uberprof.p2p", "name": "send -> recv",
                 "pid": st.pid, "tid": tid, "ts": at - base}
            if ph == "f":
                f["bp"] = "e"
            batch.append(f)
    if batch:
        writer.events(batch)


def write_gpu_counters(writer: TraceWriter, ids: IdSpace, st: RankState,
                       nc: C.NodeCounters, gpu: str, base: int) -> None:
    """The counters of the rank's own GPU, on a track of its process."""
    series = [s for s in nc.series if s.gpu == gpu]
    if not series:
        return
    tid = ids.new_tid(st.pid)
    st.tids[("uberprof", "counters", 0)] = tid
    writer.track(TrackInfo(st.pid, tid, "GPU counters", len(st.tids)))
    for s in series:
        writer.events(C.series_events(s, st.pid, tid, base))


def write_rank_overlay(writer: TraceWriter, plan: Plan, sel: Selection, st: RankState,
                       counters: NodeCounterReader, memory: Any) -> None:
    """What follows a rank's trace events in its process: its marks, its GPU's counters and
    its GPU memory per step (`memory`: the step timelines, `memory.MEMORY_COLUMNS`)."""
    write_marks(writer, st, plan.marks.get(st.rank, []), sel.base)
    if plan.gpu_of.get(st.rank) and plan.gpu_of[st.rank][0] in plan.node_pid:
        node, gpu = plan.gpu_of[st.rank]
        write_gpu_counters(writer, plan.ids, st, counters(node), gpu, sel.base)
    write_memory_counters(writer, plan.ids, st, memory, sel)


def write_findings_process(writer: TraceWriter, plan: Plan, base: int) -> None:
    """The run-wide marks' process (findings, analysed steps, clock alignment), if any."""
    gmarks = plan.global_marks
    if not gmarks:
        return
    writer.process(ProcessInfo(plan.findings_pid, FINDINGS_PROCESS,
                               plan.order[("findings", None)], "uberprof"))
    fst = RankState(-1, plan.findings_pid, FINDINGS_PROCESS)
    marks_tracks(writer, plan.ids, fst, gmarks)
    write_marks(writer, fst, gmarks, base)
    writer.end_unit()


def write_node_counters(writer: TraceWriter, plan: Plan, counters: NodeCounterReader,
                        exported: Container[int], base: int) -> None:
    """A process per node with the counters no `exported` rank shows in its own process."""
    for n, h in plan.nodes:
        taken = {g for r, (nd, g) in plan.gpu_of.items() if nd == n and r in exported}
        series = [s for s in counters(n).series if s.gpu is None or s.gpu not in taken]
        if not series:
            continue
        pid = plan.node_pid[n]
        writer.process(ProcessInfo(pid, qualify(f"node {n}", f"{h}, counters" if h and h != n
                                               else "counters"),
                                   plan.order[("node", n)], "counters"))
        tid = plan.ids.new_tid(pid)
        writer.track(TrackInfo(pid, tid, "counters", 0))
        for s in series:
            writer.events(C.series_events(s, pid, tid, base))
        writer.end_unit()
