"""A rank's process and its trace files' events on its tracks.

Each rank is one process, named by rank, host and device. Every source thread and GPU stream
becomes a named track of it (the training loop's thread first, then other host threads, then
the device streams); where a track's complete events do not nest (Kineto writes an optimizer
step across a step boundary), the ones that overlap move to lanes of their own, since a viewer
would otherwise draw them inside the wrong slice. A rank's later trace files reuse its tracks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uberprof.present.export.layout import IdSpace, TrackInfo, nest_lanes, qualify
from uberprof.present.export.source import PH_INSTANT, PH_X, FileScan, iter_events
from uberprof.present.export.writer import TraceWriter
from uberprof.rundir import ranks_by_id

if TYPE_CHECKING:
    from uberprof.analysis.read import RunContext  # OpenedRun.ctx

__all__ = ["RankState", "rank_name", "write_file"]


@dataclass
class RankState:
    """One rank's process while it is written: its tracks so far (source pid, tid and lane,
    or ("uberprof", track, lane), to output tid)."""

    rank: int
    pid: int
    name: str
    tids: dict[tuple[Any, ...], int] = field(default_factory=dict)
    main_tid: int | None = None
    x_events: int = 0


def write_file(writer: TraceWriter, ids: IdSpace, st: RankState, scan: FileScan,
               keep: np.ndarray, shift: int) -> None:
    """The kept events of one file of rank `st`, on its tracks (opened as needed), shifted
    by `shift` ns (clock offset minus the time base) and with renumbered flow ids."""
    x = keep & (scan.ph == PH_X)
    lane = _lanes(scan, x)
    local = _open_tracks(writer, ids, st, scan, keep, lane)
    tid_of = np.zeros(scan.n, dtype=np.int64)
    for (t, ln), tid in local.items():
        tid_of[(scan.track == t) & (lane == ln) & keep] = tid
    flow_ids = {int(f): ids.new_flow_id() for f in np.unique(scan.flow[keep & (scan.flow >= 0)])}
    process_tid = st.main_tid if st.main_tid is not None else 0
    st.x_events += int(x.sum())
    for batch in iter_events(scan, keep, tid_of, st.pid, shift, flow_ids, process_tid):
        writer.events(batch)


def _lanes(scan: FileScan, x: np.ndarray) -> np.ndarray:
    """Each event's lane on its source track: 0, or more where complete events `x` of the
    track overlap without nesting."""
    lane = np.zeros(scan.n, dtype=np.int32)
    xi = np.flatnonzero(x)
    if xi.size:
        tr = scan.track[xi]
        order = np.argsort(tr, kind="stable")
        xs, trs = xi[order], tr[order]
        cuts = np.flatnonzero(np.diff(trs)) + 1
        for seg in np.split(xs, cuts):
            s = scan.ts_ns[seg]
            lane[seg] = nest_lanes(s, s + scan.dur_ns[seg])
    return lane


def _open_tracks(writer: TraceWriter, ids: IdSpace, st: RankState, scan: FileScan,
                 keep: np.ndarray, lane: np.ndarray) -> dict[tuple[int, int], int]:
    """The output tid of each (source track, lane) with kept events, the rank's tracks
    created in order where new; sets the rank's main track (the training loop's)."""
    on_track = keep & ~((scan.ph == PH_INSTANT) & (scan.scope > 0))  # those go to the process
    used = sorted({(int(t), int(l)) for t, l in zip(scan.track[on_track].tolist(),
                                                   lane[on_track].tolist())},
                  key=lambda k: _track_order(scan, k))
    main = scan.main_track()
    local: dict[tuple[int, int], int] = {}
    devices = {scan.tracks[t][0] for t in scan.device_tracks}
    for t, ln in used:
        src = scan.tracks[t]
        key = (src[0], src[1], ln)
        tid = st.tids.get(key)
        if tid is None:
            tid = st.tids[key] = ids.new_tid(st.pid)
            writer.track(TrackInfo(st.pid, tid, _track_name(scan, t, ln, devices),
                                   len(st.tids)))
        local[(t, ln)] = tid
        if st.main_tid is None and t == main and ln == 0:
            st.main_tid = tid
    if st.main_tid is None and local:
        st.main_tid = next(iter(local.values()))
    return local


def _track_order(scan: FileScan, key: tuple[int, int]) -> tuple[Any, ...]:
    """Main thread first, then other host threads, then device streams, then the rest."""
    t, lane = key
    pid, tid = scan.tracks[t]
    if t == scan.main_track():
        group = 0
    elif t in scan.device_tracks:
        group = 2
    elif isinstance(pid, int) and isinstance(tid, int):
        group = 1
    else:
        group = 3
    num = tid if isinstance(tid, int) else 0
    return (group, str(type(pid)), pid if isinstance(pid, int) else 0, num, str(tid), lane)


def _track_name(scan: FileScan, t: int, lane: int, device_pids: set[Any]) -> str:
    """A track's name: the source's thread name or stream (with its device where the file has
    several), the training loop marked, and the lane when not the first."""
    pid, tid = scan.tracks[t]
    name = scan.thread_names.get((pid, tid))
    if t in scan.device_tracks:
        base = name or f"stream {tid}"
        if len(device_pids) > 1:
            label = scan.process_labels.get(pid) or f"device {pid}"
            base = qualify(base, label)
    elif name:
        base = name
    elif isinstance(tid, str):
        base = tid
    else:
        base = f"thread {tid}"
    if t == scan.main_track() and "main" not in base:
        base = qualify(base, "training loop")
    return base if lane == 0 else qualify(base, f"overlapping {lane}")


def rank_name(r: int, ctx: RunContext, scan: FileScan, gpu_of: dict[int, tuple[str, str]],
              run_root: Path) -> str:
    """"rank R (host, device)": the device from the counters' GPU of the rank, else
    rank.json, else the trace's device processes."""
    host = ctx.host_of(r) or scan.raw.host or "unknown host"
    dev = "CPU"
    if r in gpu_of:
        g = gpu_of[r][1]
        dev = "GPU " + g[3:] if g.startswith("gpu") else g
    else:
        meta = _rank_meta(run_root, r) if ctx.is_run_dir else {}
        device = meta.get("device") if isinstance(meta.get("device"), dict) else {}
        if isinstance(device.get("index"), int):
            dev = f"GPU {device['index']}"
        else:
            gpus = sorted({scan.process_labels.get(scan.tracks[t][0], "")
                           for t in scan.device_tracks} - {""})
            if gpus:
                dev = ", ".join(gpus)
            elif scan.device_tracks:
                dev = "GPU"
    return qualify(f"rank {r}", f"{host}, {dev}")


def _rank_meta(root: Path, rank: int) -> dict[str, Any]:
    m = ranks_by_id(root).get(rank)
    return m.raw if m is not None else {}
