"""Each rank's GPU memory as counter tracks of its process in the export: the bytes allocated
at every step boundary inside the export's frame, and the allocator's peak so far, from the
step timeline the analysis saved (`read.OpenedRun.step_timelines`, the numbers `run.memory`
summarises). A value holds until the next boundary, as a counter does; the boundary before the
frame gives the value at its start."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.present.export.layout import IdSpace, TrackInfo
from uberprof.present.export.tracks import RankState
from uberprof.present.export.window import Selection
from uberprof.present.export.writer import TraceWriter

__all__ = ["MEMORY_COLUMNS", "memory_events", "write_memory_counters"]

MEMORY_COLUMNS = ["host_end_ns", "gpu_mem_bytes", "gpu_mem_peak_bytes"]
_SERIES = (("gpu_mem_bytes", "GPU memory in use"), ("gpu_mem_peak_bytes", "GPU memory peak"))
_MIB = float(1 << 20)


def memory_events(timelines: pa.Table | None, rank: int, sel: Selection, pid: int, tid: int
                  ) -> list[dict[str, Any]]:
    """Chrome counter events ('C', MiB) of one rank's GPU memory in the frame."""
    frame = sel.frame
    if timelines is None or frame is None or not timelines.num_rows:
        return []
    t = timelines.filter(pc.and_(pc.equal(timelines.column("rank"), rank),
                                 pc.is_valid(timelines.column("host_end_ns"))))
    t = t.filter(pc.is_valid(t.column("gpu_mem_bytes")))
    if not t.num_rows:
        return []
    at = t.column("host_end_ns").to_numpy() + sel.offsets.get(rank, 0)  # the aligned clock
    lo, hi = frame
    inside = (at >= lo) & (at <= hi)
    before = np.flatnonzero(at < lo)
    if before.size:
        inside[before[-1]] = True
    out = []
    for name, label in _SERIES:
        v = t.column(name).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(inside):
            if v[i] is None or (isinstance(v[i], float) and np.isnan(v[i])):
                continue
            out.append({"ph": "C", "name": label, "cat": "uberprof.memory", "pid": pid,
                        "tid": tid, "ts": int(max(at[i], lo)) - sel.base,
                        "args": {"MiB": round(float(v[i]) / _MIB, 3)}})
    return out


def write_memory_counters(writer: TraceWriter, ids: IdSpace, st: RankState,
                          timelines: pa.Table | None, sel: Selection) -> None:
    """The rank's GPU memory on a track of its process, when it has any in the frame."""
    if timelines is None:
        return
    events = memory_events(timelines, st.rank, sel, st.pid, -1)
    if not events:
        return
    tid = ids.new_tid(st.pid)
    for e in events:
        e["tid"] = tid
    st.tids[("uberprof", "memory", 0)] = tid
    writer.track(TrackInfo(st.pid, tid, "GPU memory", len(st.tids)))
    writer.events(events)
