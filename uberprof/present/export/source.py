"""One trace file of one rank, passed through to the merged trace.

A light scan first decodes only what decisions need (phase, category, name, thread, time,
duration, flow id, correlation) into arrays, the way ingest does, so that selection, the size
budget, flow pairing and track lanes are decided before anything is written. Then the kept events
are decoded in full, a batch at a time, and rewritten: the rank's pid, a track tid unique across
the file, timestamps on the aligned clock, renumbered flow ids. Everything else (args, categories,
names) passes through untouched. Memory: the file's JSON text, the scan's arrays and one batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from uberprof.ingest import classify as K
from uberprof.ingest.events import TraceEvent, decode_events
from uberprof.ingest.trace import RawTrace, read_raw_trace
from uberprof.ingest.validate import as_float, check_times, us_to_ns

__all__ = [
    "PH_ASYNC", "PH_C", "PH_FLOW", "PH_INSTANT", "PH_M", "PH_X",
    "TIER_DEVICE", "TIER_HOST", "TIER_KEEP", "TIER_LAUNCH_FLOWS", "TIER_MINOR", "TIER_PYTHON",
    "FileScan", "iter_events", "scan_file",
]

BATCH = 8192

# Phases, as small codes.
PH_X, PH_INSTANT, PH_FLOW, PH_C, PH_M, PH_ASYNC, PH_BE, PH_OTHER = range(8)
_PH = {"X": PH_X, "i": PH_INSTANT, "I": PH_INSTANT, "R": PH_INSTANT, "s": PH_FLOW, "t": PH_FLOW,
       "f": PH_FLOW, "C": PH_C, "M": PH_M, "b": PH_ASYNC, "e": PH_ASYNC, "n": PH_ASYNC,
       "S": PH_ASYNC, "T": PH_ASYNC, "F": PH_ASYNC, "p": PH_ASYNC, "B": PH_BE, "E": PH_BE}

# Usefulness tiers for the size budget, least useful first (see budget.py).
TIER_PYTHON, TIER_MINOR, TIER_HOST, TIER_LAUNCH_FLOWS, TIER_DEVICE = range(5)
TIER_KEEP = 99
_HOST_TIER_KINDS = frozenset({K.OPERATOR, K.RUNTIME, K.OTHER})
_DEVICE_TIER_KINDS = frozenset({K.KERNEL, K.MEMCPY, K.MEMSET, K.DEVICE_SYNC, K.DEVICE_OTHER,
                                K.DEVICE_ANNOTATION})


class _Event(TraceEvent, gc=False):
    """Ingest's common fields, and what flows and instants need."""

    id: Any = None
    bind_id: Any = None
    s: Any = None


_DECODER = msgspec.json.Decoder(list[_Event])
_ANY = msgspec.json.Decoder()


def _key(v: Any) -> Any:
    """A hashable stand-in for a pid or tid (numbers and strings as they are)."""
    if isinstance(v, (int, str)) or v is None:
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return str(v)


@dataclass
class FileScan:
    """What the decisions need about every event of one file, as arrays in file order."""

    raw: RawTrace
    ph: np.ndarray  # int8 phase codes
    ts_ns: np.ndarray  # int64, the source's clock (epoch ns when the trace says so)
    ts_ok: np.ndarray  # bool: ts is a number
    dur_ns: np.ndarray  # int64, complete events; -1 when missing
    track: np.ndarray  # int32 index into `tracks`
    tier: np.ndarray  # int8 usefulness tier (TIER_*)
    size: np.ndarray  # int32 bytes of the event's JSON text
    flow: np.ndarray  # int32 index into `flow_keys` (flows and async events), -1
    flow_end: np.ndarray  # bool: a flow's end ('f', 't') rather than its start
    correlation: np.ndarray  # int64 args.correlation of complete events, -1
    flow_int_id: np.ndarray  # int64 id of launch (ac2g) flows, -1
    scope: np.ndarray  # int8 instants: 0 thread, 1 process, 2 global
    tracks: list[tuple[Any, Any]]  # (source pid, source tid)
    flow_keys: list[tuple[Any, Any]]  # (category, id)
    thread_names: dict[tuple[Any, Any], str]
    process_labels: dict[Any, str]
    device_tracks: set[int]  # tracks with device activity
    step_counts: dict[int, int]  # track -> ProfilerStep events on it
    problems: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.ph)

    @property
    def base_ns(self) -> int:
        return self.raw.base_time_ns or 0

    def main_track(self) -> int | None:
        """The training loop's track: the one with the step annotations."""
        if self.step_counts:
            return max(self.step_counts, key=lambda t: self.step_counts[t])
        return None


_DEVICE_CAT: dict[Any, bool] = {}


def _is_device_cat(cat: Any) -> bool:
    v = _DEVICE_CAT.get(cat)
    if v is None:
        v = _DEVICE_CAT[cat] = isinstance(cat, str) and K.is_device_category(cat)
    return v


def scan_file(path: str) -> FileScan:
    """Scan one trace file (see the module doc); raises ingest's `TraceError` when unusable."""
    raw = read_raw_trace(path)
    sc = _Scanner(raw)
    for start in range(0, len(raw.events), BATCH):
        sc.batch(start, decode_events(raw.events[start:start + BATCH], _DECODER, _Event,
                                      keep_place=True))
    return sc.result()


class _Scanner:
    """The arrays and lookup tables of one file's scan, filled a decoded batch at a time
    (`batch`) and then turned into a `FileScan` with checked times (`result`)."""

    def __init__(self, raw: RawTrace) -> None:
        n = len(raw.events)
        self.raw = raw
        self.ph = np.full(n, PH_OTHER, dtype=np.int8)
        self.ts = np.zeros(n, dtype=np.float64)
        self.dur = np.full(n, np.nan, dtype=np.float64)
        self.track = np.zeros(n, dtype=np.int32)
        self.tier = np.full(n, TIER_KEEP, dtype=np.int8)
        self.flow = np.full(n, -1, dtype=np.int32)
        self.flow_end = np.zeros(n, dtype=bool)
        self.corr = np.full(n, -1, dtype=np.int64)
        self.flow_int = np.full(n, -1, dtype=np.int64)
        self.scope = np.zeros(n, dtype=np.int8)
        self.size = np.fromiter(map(len, raw.events), np.int32, n)
        self.tracks: dict[tuple[Any, Any], int] = {}
        self.flows: dict[tuple[Any, Any, int], int] = {}
        self.tiers: dict[tuple[Any, Any, int, bool], int] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.labels: dict[Any, str] = {}
        self.device_tracks: set[int] = set()
        self.step_counts: dict[int, int] = {}

    def batch(self, start: int, evs: list[_Event]) -> None:
        """Events `start`... of the file: phase, track, time; then what each phase needs (a
        complete event's duration, device, correlation and tier; a flow's key and end; an
        instant's scope). One loop, its arrays and tables bound to locals: it runs per event."""
        ph, ts, dur, track, tier = self.ph, self.ts, self.dur, self.track, self.tier
        corr, scope, tracks, tiers = self.corr, self.scope, self.tracks, self.tiers
        for j, e in enumerate(evs):
            i = start + j
            p = _PH.get(e.ph, PH_OTHER) if isinstance(e.ph, str) else PH_OTHER
            if e.ph is None and e.dur is not None:
                p = PH_X
            ph[i] = p
            a = e.args
            if p == PH_M:
                _metadata(e, self.thread_names, self.labels)
                continue
            key = (_key(e.pid), _key(e.tid))
            t = tracks.get(key)
            if t is None:
                t = tracks[key] = len(tracks)
            track[i] = t
            v = e.ts
            ts[i] = v if type(v) in (float, int) else as_float(v)
            if p == PH_X:
                d = e.dur
                dur[i] = d if type(d) in (float, int) else as_float(d)
                stream = a.stream if a is not None else None
                on_device = type(stream) is int or _is_device_cat(e.cat)
                if on_device:
                    self.device_tracks.add(t)
                c = a.correlation if a is not None else None
                if type(c) is int:
                    corr[i] = c
                cat, name = e.cat, e.name
                tk = (cat, name, p, on_device)
                tr = tiers.get(tk)
                if tr is None:
                    tr = tiers[tk] = _tier(cat, name, p, on_device)
                tier[i] = tr
                if tr == TIER_KEEP and type(name) is str and name.startswith("ProfilerStep#"):
                    self.step_counts[t] = self.step_counts.get(t, 0) + 1
            elif p == PH_FLOW or p == PH_ASYNC:
                self._flow(i, e, p)
            elif p == PH_INSTANT:
                tier[i] = TIER_MINOR
                scope[i] = 2 if e.s == "g" else 1 if e.s == "p" else 0
                if scope[i]:
                    tier[i] = TIER_KEEP  # profiler-wide marks: few, and they frame the window

    def _flow(self, i: int, e: _Event, p: int) -> None:
        """A flow or async event: its key (category, id, phase kind) and whether it ends one;
        a flow's tier, and a launch flow's integer id (to drop it with its kernel)."""
        fid = e.id if e.id is not None else e.bind_id
        if fid is not None:
            fk = (e.cat, _key(fid), p)
            f = self.flows.get(fk)
            if f is None:
                f = self.flows[fk] = len(self.flows)
            self.flow[i] = f
        self.flow_end[i] = e.ph in ("f", "t", "e", "F", "T")
        if p == PH_FLOW:
            self.tier[i] = TIER_LAUNCH_FLOWS if e.cat == "ac2g" else TIER_MINOR
            if e.cat == "ac2g" and type(fid) is int:
                self.flow_int[i] = fid

    def result(self) -> FileScan:
        """The scan, its times checked as ingest checks them and in integer ns: out-of-range
        times are left out as ingest leaves them out (its problems name them)."""
        raw, ph, n = self.raw, self.ph, len(self.ph)
        base = raw.base_time_ns or 0
        checked = check_times(self.ts, self.dur, base, timed=~np.isnan(self.ts) & (ph != PH_M))
        ts, dur = checked.ts_us, checked.dur_us
        ts_ok = ~np.isnan(ts) if checked.keep is None else ~np.isnan(ts) & checked.keep
        ts_ns = np.zeros(n, dtype=np.int64)
        ts_ns[ts_ok] = us_to_ns(ts[ts_ok]) + base
        dur_ns = np.full(n, -1, dtype=np.int64)
        dok = ~np.isnan(dur) & (dur >= 0)
        dur_ns[dok] = np.rint(dur[dok] * 1000.0).astype(np.int64)
        return FileScan(raw=raw, ph=ph, ts_ns=ts_ns, ts_ok=ts_ok, dur_ns=dur_ns,
                        track=self.track, tier=self.tier, size=self.size, flow=self.flow,
                        flow_end=self.flow_end, correlation=self.corr,
                        flow_int_id=self.flow_int, scope=self.scope, tracks=list(self.tracks),
                        flow_keys=[(c, i) for c, i, _ in self.flows],
                        thread_names=self.thread_names, process_labels=self.labels,
                        device_tracks=self.device_tracks, step_counts=self.step_counts)


def _tier(cat: Any, name: Any, ph: int, on_device: bool) -> int:
    kind = K.classify(cat if isinstance(cat, str) else "",
                      name if isinstance(name, str) else str(name), on_device)
    if kind == K.PYTHON:
        return TIER_PYTHON
    if kind in _DEVICE_TIER_KINDS:
        return TIER_DEVICE
    if kind in _HOST_TIER_KINDS and not on_device:
        return TIER_HOST
    return TIER_KEEP


def _metadata(e: _Event, thread_names: dict[tuple[Any, Any], str], labels: dict[Any, str]) -> None:
    a = e.args
    if a is None:
        return
    if e.name == "thread_name" and isinstance(a.name, str):
        key = (_key(e.pid), _key(e.tid))
        old = thread_names.get(key)
        # Kineto names a thread more than once; the specific name wins (as ingest decides).
        if old is None or "(python" in old or "(pt_main" in old:
            thread_names[key] = a.name.strip()
    elif e.name == "process_labels" and isinstance(a.labels, str):
        labels[_key(e.pid)] = a.labels


def iter_events(scan: FileScan, keep: np.ndarray, tid_of: np.ndarray, pid: int,
                shift_ns: int, flow_ids: dict[int, int], process_tid: int) -> Iterator[list[dict[str, Any]]]:
    """The kept events in file order, rewritten, in batches. `tid_of[i]`: the output tid of
    event i; `shift_ns`: added to source ns (clock offset minus the output's time base), so
    `ts` and `dur` come out as integer ns relative to the output's base; `flow_ids`: source flow
    key index -> output id; `process_tid`: where process- and global-scoped instants go."""
    idx = np.flatnonzero(keep)
    ts_out = scan.ts_ns + shift_ns
    raws = scan.raw.events
    ph, dur, flow, scope = scan.ph, scan.dur_ns, scan.flow, scan.scope
    for start in range(0, len(idx), BATCH):
        chunk = idx[start:start + BATCH].tolist()
        evs = _ANY.decode(b"[" + b",".join([raws[i] for i in chunk]) + b"]")
        out = []
        for i, e in zip(chunk, evs):
            e["pid"] = pid
            e["ts"] = int(ts_out[i])
            p = ph[i]
            if p == PH_X:
                e["ph"] = "X"
                e["dur"] = int(dur[i])
                e["tid"] = int(tid_of[i])
            elif p == PH_INSTANT and scope[i]:
                e["s"] = "p"  # one rank's profiler-wide mark: its process, not the whole file
                e["tid"] = process_tid
            else:
                e["tid"] = int(tid_of[i])
                f = flow[i]
                if f >= 0:
                    new = flow_ids[int(f)]
                    if "id" in e:
                        e["id"] = new
                    else:
                        e["bind_id"] = new
            out.append(e)
        yield out
