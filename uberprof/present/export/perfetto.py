"""The merged trace in Perfetto's protobuf format, through the `perfetto` package's TracePacket
protos and streaming trace builder (Google's own Python package, `pip install perfetto`).

Why it exists beside the JSON: the file is several times smaller (names, categories and argument
names interned once per trace, varint timestamps), it loads faster, and its tracks can be
ordered explicitly. Perfetto's JSON importer ignores `process_sort_index` and orders processes
by activity; here every rank is a track under one root with `child_ordering = EXPLICIT`, so the
UI lists rank 0, 1, 2, ... with uberprof's findings first.

Layout: a root track, one child per rank (and for the findings and each node's counters), one
grandchild per thread, GPU stream or uberprof track, counter tracks beside them. Slices are
begin/end pairs written per track in time order; flows become `flow_ids` on the slice a Chrome
flow start binds to and `terminating_flow_ids` on the one its end binds to. Events arrive from
the merge as Chrome-shaped dicts (ts/dur in ns after the time base), one file of a rank at a
time: the writer buffers that much to order begins and ends, never the whole trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from uberprof.present.export.layout import ProcessInfo, TrackInfo
from uberprof.present.export.writer import TraceWriter
from uberprof.rundir import as_int

__all__ = ["PerfettoWriter", "default_format"]

ROOT_UUID = 1
_PROC_BASE = 1 << 40  # track uuids: processes, then threads (by their unique tid), counters
_TRACK_BASE = 2 << 40
_COUNTER_BASE = 3 << 40


def _import_protos() -> Any:
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
    except ImportError as exc:
        raise ImportError(
            "--format perfetto needs the `perfetto` package (Google's Python API for Perfetto, "
            f"with the trace protos): pip install 'uberprof[perfetto]' or pip install perfetto "
            f"({exc})") from None
    return perfetto_trace_pb2, StreamingTraceProtoBuilder


_JSON_NAMES = (".json", ".json.gz")
_PROTO_NAMES = (".pftrace", ".pftrace.gz", ".perfetto-trace", ".perfetto-trace.gz", ".pb", ".pb.gz")


def default_format(output: Path) -> str:
    """The format `uberprof export` writes when not told: the one `output`'s name says
    (.json: chrome, .pftrace: perfetto), else perfetto when its package is importable, since
    only it lists the ranks in order in the Perfetto UI, else chrome (no extra package)."""
    name = output.name.lower()
    if name.endswith(_JSON_NAMES):
        return "chrome"
    if name.endswith(_PROTO_NAMES):
        return "perfetto"
    try:
        _import_protos()
    except ImportError:
        return "chrome"
    return "perfetto"


class PerfettoWriter(TraceWriter):
    """TracePackets through the streaming builder; a rank's events are buffered until
    `end_unit()` to write each track's slices as begin/end pairs in time order."""

    def __init__(self, path: Path, gzipped: bool, base_ns: int) -> None:
        self.P, builder = _import_protos()
        super().__init__(path, gzipped)
        self._builder = builder(self._file)
        self._first = True
        self._names: dict[str, int] = {}
        self._cats: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._proc_uuid: dict[int, int] = {}
        self._counters: dict[tuple[int, str, str], int] = {}
        self._pending: list[dict[str, Any]] = []
        self._base = base_ns
        p = self._packet()
        d = p.track_descriptor
        d.uuid = ROOT_UUID
        d.name = "uberprof export"
        d.child_ordering = self.P.TrackDescriptor.EXPLICIT
        self._builder.write_packet(p)

    # --- packets --------------------------------------------------------------------------

    def _packet(self) -> Any:
        p = self._builder.create_packet()
        p.trusted_packet_sequence_id = 1
        if self._first:
            p.sequence_flags = self.P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            p.first_packet_on_sequence = True
            self._first = False
        return p

    def _intern(self, p: Any, table: dict[str, int], value: str, kind: str) -> int:
        iid = table.get(value)
        if iid is None:
            iid = table[value] = len(table) + 1
            entry = getattr(p.interned_data, kind).add()
            entry.iid = iid
            entry.name = value
            p.sequence_flags |= self.P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        return iid

    # --- tracks ---------------------------------------------------------------------------

    def process(self, proc: ProcessInfo) -> None:
        p = self._packet()
        d = p.track_descriptor
        d.uuid = self._proc_uuid.setdefault(proc.pid, _PROC_BASE + proc.pid)
        d.parent_uuid = ROOT_UUID
        d.name = proc.name
        d.sibling_order_rank = proc.sort_index
        d.child_ordering = self.P.TrackDescriptor.EXPLICIT
        self._builder.write_packet(p)

    def track(self, t: TrackInfo) -> None:
        p = self._packet()
        d = p.track_descriptor
        d.uuid = _TRACK_BASE + t.tid
        d.parent_uuid = self._proc_uuid.get(t.pid, ROOT_UUID)
        d.name = t.name
        d.sibling_order_rank = t.sort_index
        self._builder.write_packet(p)

    def _counter_track(self, pid: int, name: str, unit: str) -> int:
        key = (pid, name, unit)
        uuid = self._counters.get(key)
        if uuid is None:
            uuid = self._counters[key] = _COUNTER_BASE + len(self._counters)
            p = self._packet()
            d = p.track_descriptor
            d.uuid = uuid
            d.parent_uuid = self._proc_uuid.get(pid, ROOT_UUID)
            d.name = f"{name} ({unit})"
            d.sibling_order_rank = 1 << 20  # after the slice tracks
            d.counter.unit_name = unit
            self._builder.write_packet(p)
        return uuid

    # --- events ---------------------------------------------------------------------------

    def events(self, batch: list[dict[str, Any]]) -> None:
        self._pending.extend(batch)

    def end_unit(self) -> None:
        """Write what was buffered: slices as begin/end pairs in time order per track, with
        their flows; instants; counter values."""
        evs, self._pending = self._pending, []
        if not evs:
            return
        self.events_written += len(evs)
        slices: dict[int, list[int]] = {}  # tid -> indexes of complete events
        flows: dict[int, list[int]] = {}  # tid -> indexes of flow events
        for i, e in enumerate(evs):
            ph = e.get("ph")
            if ph == "X":
                slices.setdefault(e["tid"], []).append(i)
            elif ph in ("s", "t", "f"):
                flows.setdefault(e["tid"], []).append(i)
            elif ph == "C":
                self._counter(e)
            elif ph in ("i", "I", "R"):
                self._instant(e)
            else:
                self.unsupported += 1
        out_flows: dict[int, list[int]] = {}
        in_flows: dict[int, list[int]] = {}
        for tid, idx in slices.items():
            idx.sort(key=lambda i: (evs[i]["ts"], -evs[i]["dur"], i))
            if tid in flows:
                _bind_flows(evs, idx, flows[tid], out_flows, in_flows)
            self._slices(evs, idx, _TRACK_BASE + tid, out_flows, in_flows)

    def _slices(self, evs: list[dict[str, Any]], idx: list[int], uuid: int,
                out_flows: dict[int, list[int]], in_flows: dict[int, list[int]]) -> None:
        """Begin/end packets of one track's complete events (sorted by start, longest first;
        they nest, as the merge makes sure) in time order."""
        stack: list[int] = []  # end times of the open slices
        for i in idx:
            e = evs[i]
            ts = e["ts"]
            while stack and stack[-1] <= ts:
                self._end(stack.pop(), uuid)
            end = ts + e["dur"]
            self._begin(e, uuid, out_flows.get(i), in_flows.get(i))
            stack.append(end)
        while stack:
            self._end(stack.pop(), uuid)

    def _begin(self, e: dict[str, Any], uuid: int, flow_out: list[int] | None,
               flow_in: list[int] | None) -> None:
        p = self._packet()
        p.timestamp = e["ts"]
        te = p.track_event
        te.type = self.P.TrackEvent.TYPE_SLICE_BEGIN
        te.track_uuid = uuid
        self._fill(p, te, e)
        if flow_out:
            te.flow_ids.extend(flow_out)
        if flow_in:
            te.terminating_flow_ids.extend(flow_in)
        self._builder.write_packet(p)

    def _end(self, ts: int, uuid: int) -> None:
        p = self._packet()
        p.timestamp = ts
        te = p.track_event
        te.type = self.P.TrackEvent.TYPE_SLICE_END
        te.track_uuid = uuid
        self._builder.write_packet(p)

    def _instant(self, e: dict[str, Any]) -> None:
        p = self._packet()
        p.timestamp = e["ts"]
        te = p.track_event
        te.type = self.P.TrackEvent.TYPE_INSTANT
        scope = e.get("s", "t")
        te.track_uuid = (self._proc_uuid.get(e["pid"], ROOT_UUID) if scope in ("p", "g")
                         else _TRACK_BASE + e["tid"])
        self._fill(p, te, e)
        self._builder.write_packet(p)

    def _counter(self, e: dict[str, Any]) -> None:
        args = e.get("args") or {}
        for unit, v in args.items():
            if not isinstance(v, (int, float)):
                continue
            uuid = self._counter_track(e["pid"], str(e.get("name", "counter")), str(unit))
            p = self._packet()
            p.timestamp = e["ts"]
            te = p.track_event
            te.type = self.P.TrackEvent.TYPE_COUNTER
            te.track_uuid = uuid
            te.double_counter_value = float(v)
            self._builder.write_packet(p)

    def _fill(self, p: Any, te: Any, e: dict[str, Any]) -> None:
        name = e.get("name")
        te.name_iid = self._intern(p, self._names, name if isinstance(name, str) else str(name),
                                   "event_names")
        cat = e.get("cat")
        if isinstance(cat, str) and cat:
            te.category_iids.append(self._intern(p, self._cats, cat, "event_categories"))
        args = e.get("args")
        if isinstance(args, dict):
            for k, v in args.items():
                if v is None:
                    continue
                a = te.debug_annotations.add()
                a.name_iid = self._intern(p, self._arg_names, str(k), "debug_annotation_names")
                _value(a, v)

    # --- the end --------------------------------------------------------------------------

    def finish(self, summary: dict[str, Any]) -> None:
        self.end_unit()
        p = self._packet()
        p.timestamp = 0
        te = p.track_event
        te.type = self.P.TrackEvent.TYPE_INSTANT
        te.track_uuid = ROOT_UUID
        self._fill(p, te, {"name": "uberprof export summary", "cat": "uberprof",
                           "args": summary})
        self._builder.write_packet(p)
        self._file.commit()


def _value(a: Any, v: Any) -> None:
    """A JSON value into a DebugAnnotation. Lists and objects (Kineto's input shapes, types,
    strides) become their compact JSON text: as readable in the UI, and nested annotations
    would cost ~20 sub-messages per operator for the same information."""
    t = type(v)
    if t is str:
        a.string_value = v
    elif t is int:
        if as_int(v) is not None:
            a.int_value = v
        else:
            a.string_value = str(v)
    elif t is float:
        a.double_value = v
    elif t is bool:
        a.bool_value = v
    elif t in (list, dict, tuple):
        a.string_value = orjson.dumps(v, default=str).decode()
    else:
        a.string_value = str(v)


def _bind_flows(evs: list[dict[str, Any]], slices: list[int], flow_idx: list[int],
                out_flows: dict[int, list[int]], in_flows: dict[int, list[int]]) -> None:
    """Attach each Chrome flow event of a track to a slice of it, as Chrome binds them: a start
    or step to the innermost slice enclosing its time; an end to the enclosing slice when it
    says `"bp": "e"`, else to the next slice that starts at or after it."""
    starts = [evs[i]["ts"] for i in slices]
    order = sorted(flow_idx, key=lambda i: evs[i]["ts"])
    stack: list[int] = []  # open slices (indexes into `slices`)
    k = 0
    for fi in order:
        f = evs[fi]
        t = f["ts"]
        while k < len(slices) and starts[k] <= t:
            while stack and evs[slices[stack[-1]]]["ts"] + evs[slices[stack[-1]]]["dur"] < starts[k]:
                stack.pop()
            stack.append(k)
            k += 1
        while stack and evs[slices[stack[-1]]]["ts"] + evs[slices[stack[-1]]]["dur"] < t:
            stack.pop()
        fid = f.get("id")
        if not isinstance(fid, int):
            continue
        if f["ph"] == "f" and f.get("bp") != "e":
            target = slices[k] if k < len(slices) else None
            # slices starting exactly at t were pushed already: the innermost of them is next
            if stack and evs[slices[stack[-1]]]["ts"] == t:
                target = slices[stack[-1]]
        else:
            target = slices[stack[-1]] if stack else None
        if target is None:
            continue
        (in_flows if f["ph"] == "f" else out_flows).setdefault(target, []).append(fid)
