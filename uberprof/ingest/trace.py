"""One Kineto trace file -> one columnar event table (pyarrow), times in int64 nanoseconds.

The front door of ingest: `ingest_trace` and the `TraceError` it raises, reading a trace file
(`read_trace_bytes`, `read_raw_trace`, shared with the trace export) and the stages that turn
the decoded columns into an `IngestedTrace`. A first pass skips over `traceEvents` as one raw
slice of the JSON text (a skip-scan, no object per event); pieces of it are then decoded into
typed structs and reduced at once to compact columns (pieces.py, columns.py), so memory peaks at
the JSON text plus the columns and one piece; decoding is about 2x faster than `orjson.loads` of the same text (measured
in benchmarks/ingest.py). The table is then built once (table.py): strings dictionary-encoded,
classification run once per distinct (category, name), not per event.
"""

from __future__ import annotations

import gc
import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa

from uberprof.ingest.columns import Columns, decode_columns
from uberprof.ingest.gz import gunzip
from uberprof.ingest.pieces import decode_array_columns, is_array, is_empty_array
from uberprof.ingest.table import event_table
from uberprof.ingest.validate import check_times, us_to_ns
from uberprof.ingest.values import id_column

__all__ = ["IngestedTrace", "RawTrace", "TraceError", "ingest_trace", "read_raw_trace",
           "read_trace_bytes"]


class TraceError(Exception):
    """A trace that cannot be analysed; the message names the file and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class _TraceFields(msgspec.Struct):
    """What the trace object says besides its events."""

    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    deviceProperties: Any = None
    host_name: Any = None
    hostname: Any = None
    uberprof_window: Any = None


class _Header(_TraceFields):
    """The trace object with its events left undecoded (raw slices of the JSON text)."""

    traceEvents: list[msgspec.Raw] | None = None


class _LazyHeader(_TraceFields):
    """`_Header` with the event array left as one raw slice of the text (pieces.py)."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"")


_HEADER_DECODER = msgspec.json.Decoder(_Header)
_LAZY_HEADER_DECODER = msgspec.json.Decoder(_LazyHeader)
_ANY_DECODER = msgspec.json.Decoder()


@dataclass
class IngestedTrace:
    """The event table of one trace file (`uberprof.ingest.table.EVENT_SCHEMA`) and what its
    header says."""

    path: str
    events: pa.Table
    rank: int | None  # from distributedInfo; None when the trace does not say
    world_size: int | None = None
    backend: str | None = None
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    host: str | None = None
    device_type: str = "cpu"  # cuda, rocm, gpu (unknown vendor), cpu
    clock: str = "relative"  # epoch (baseTimeNanoseconds or absolute µs) or relative (unknown origin)
    threads: dict[int, str] = field(default_factory=dict)  # tid -> thread name
    uberprof_window: str | None = None
    sub_us: bool = False  # timestamps with fractions of a microsecond ("ns resolution" traces)
    problems: list[str] = field(default_factory=list)
    memory: pa.Table | None = None  # MEMORY_SCHEMA ([memory] events); None when it has none


# --- reading ----------------------------------------------------------------------------------

def read_trace_bytes(path: Path) -> bytes:
    """The JSON text of a `.json` or `.json.gz` file (gzip told by its magic, not its name)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if not raw:
        raise TraceError(path, "empty file (0 bytes)")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gunzip(raw)
        except EOFError:
            raise TraceError(path, "truncated gzip: the archive ends before its end marker "
                                   "(the writer was killed, or the copy is incomplete)") from None
        except (zlib.error, gzip.BadGzipFile) as exc:
            raise TraceError(path, f"corrupt gzip data ({exc})") from None
        if not raw:
            raise TraceError(path, "empty file (the gzip archive holds 0 bytes)")
    return raw


@dataclass
class RawTrace:
    """A trace's events as undecoded JSON slices, with the header facts that place them in time
    and in the job. For readers that pass events through (the trace export) rather than reduce
    them to columns: they decode what they keep, batch by batch."""

    path: str
    events: list[msgspec.Raw]
    base_time_ns: int | None  # baseTimeNanoseconds: ts are µs after it; None: absolute/unknown
    rank: int | None  # distributedInfo.rank
    host: str | None
    distributed_info: dict[str, Any] = field(default_factory=dict)


def read_raw_trace(path: str | Path) -> RawTrace:
    """The events of one trace file as raw JSON slices (see `RawTrace`); raises `TraceError`
    with the same messages as `ingest_trace` for unreadable files."""
    path = Path(path)
    header = _decode_header(read_trace_bytes(path), path)
    events = header.traceEvents
    if not events:
        raise TraceError(path, "no trace events (the traceEvents list is missing or empty)")
    base = _base_time_ns(header)
    info = _distributed_info(header)
    return RawTrace(
        path=str(path),
        events=events,
        base_time_ns=base or None,
        rank=_rank(info),
        host=_host(header),
        distributed_info=info,
    )


def _decode_header(raw: bytes, path: Path) -> _Header:
    """The header, and every event as a raw slice (a fast skip-scan, no objects per field)."""
    try:
        return _HEADER_DECODER.decode(raw)
    except msgspec.ValidationError:
        pass  # valid JSON of an unexpected shape: sorted out below
    except msgspec.DecodeError as exc:
        if not raw.strip():
            raise TraceError(path, "empty file (only white space)") from None
        raise TraceError(path, f"invalid JSON ({exc})") from None
    obj = _ANY_DECODER.decode(raw)
    if isinstance(obj, list):  # the JSON Array Format of Chrome traces
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict):
        raise TraceError(path, f"not a Kineto trace: the JSON is a {type(obj).__name__}, "
                               "not an object with traceEvents")
    events = obj.get("traceEvents")
    header = {k: v for k, v in obj.items() if k != "traceEvents"}
    try:
        h = msgspec.convert(header, _Header, strict=False)
    except msgspec.ValidationError:
        h = _Header()
    h.traceEvents = [msgspec.Raw(msgspec.json.encode(e)) for e in events
                     if isinstance(e, dict)] if isinstance(events, list) else None
    return h


def _base_time_ns(header: _Header) -> int:
    """baseTimeNanoseconds when it is a positive integer (ts are µs after it), else 0."""
    base = header.baseTimeNanoseconds
    return base if isinstance(base, int) and not isinstance(base, bool) and base > 0 else 0


def _distributed_info(header: _Header) -> dict[str, Any]:
    """The header's distributedInfo object ({} when absent or not an object)."""
    return header.distributedInfo if isinstance(header.distributedInfo, dict) else {}


def _rank(info: dict[str, Any]) -> int | None:
    """distributedInfo's rank when it is a non-negative integer."""
    rank = info.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


def _host(header: _Header) -> str | None:
    """The host the trace names (Kineto has spelt the key two ways)."""
    return next((h for h in (header.host_name, header.hostname) if isinstance(h, str)), None)


# --- ingesting --------------------------------------------------------------------------------

def ingest_trace(path: str | Path) -> IngestedTrace:
    """Parse one trace file into an `IngestedTrace`; raises `TraceError` when nothing is usable.

    Events are decoded into structs a batch at a time and reduced to compact columns at once,
    so memory peaks at the JSON text plus one batch, not at a struct per event.
    """
    path = Path(path)
    was_enabled = gc.isenabled()
    gc.disable()  # no reference cycles come out of JSON: spare the collector's full scans
    try:
        header, cols = _decode(read_trace_bytes(path), path)
    finally:
        if was_enabled:
            gc.enable()
    return _build(path, header, cols)  # the JSON text is gone: _decode held the last reference


def _decode(raw: bytes, path: Path) -> tuple[_Header, Columns]:
    """The header and the columns of every event. The usual trace (an object whose traceEvents
    is an array) is decoded from its text a piece at a time (pieces.py), with no object per
    event; any other shape takes `_decode_header`'s way, which also names what is wrong."""
    try:
        lazy: _LazyHeader | None = _LAZY_HEADER_DECODER.decode(raw)
    except msgspec.DecodeError:  # invalid JSON, or valid of another shape: said below
        lazy = None
    if lazy is not None and is_array(lazy.traceEvents):
        array, lazy.traceEvents = lazy.traceEvents, msgspec.Raw(b"")
        header = _Header(**{**msgspec.structs.asdict(lazy), "traceEvents": None})
        if is_empty_array(array):
            raise TraceError(path, "no trace events (the traceEvents list is missing or empty)")
        del raw  # the array's slice keeps the text alive until the columns are made
        return header, decode_array_columns(array)
    header = _decode_header(raw, path)
    del raw
    raw_events = header.traceEvents
    if not raw_events:
        raise TraceError(path, "no trace events (the traceEvents list is missing or empty)")
    header.traceEvents = None
    cols = decode_columns(raw_events, consume=True)
    return header, cols  # the JSON text went with the last raw slice


def _build(path: Path, header: _Header, cols: Columns) -> IngestedTrace:
    """The `IngestedTrace` of decoded columns: times checked, the table built, the header read."""
    problems = _dropped(path, cols)
    times = _times_ns(path, header, cols, problems)
    table, device_type = event_table(path, cols, times.ts_ns, times.dur_ns, times.keep, problems)
    return IngestedTrace(path=str(path), events=table, device_type=device_type, clock=times.clock,
                         threads=cols.threads, sub_us=times.sub_us, problems=problems,
                         memory=_memory(header, cols), **_header_facts(header))


def _memory(header: _Header, cols: Columns) -> pa.Table | None:
    """The trace's [memory] events as a table (ingest/memory.py), times and threads converted
    as the events' are; None when the trace has none."""
    if not len(cols.memory):
        return None
    us = np.asarray(cols.memory.ts, np.float64)
    base = _base_time_ns(header)
    ts_ns = us_to_ns(us) + base if base else us_to_ns(us)
    return cols.memory.table(ts_ns, id_column(cols.memory.tid, cols.id_codes))


def _dropped(path: Path, cols: Columns) -> list[str]:
    """Problems for the events decoding dropped for their times; raises when none is left."""
    problems: list[str] = []
    if cols.negative:
        problems.append(f"{path}: {cols.negative} events with a negative duration dropped "
                        "(a clock or profiler bug)")
    if cols.missing:
        problems.append(f"{path}: {cols.missing} events without a numeric ts/dur dropped")
    if not cols.n:
        if cols.negative or cols.missing:
            raise TraceError(path, "no usable timed events (every event has a negative or "
                                   "missing duration)")
        raise TraceError(path, "no timed events: the trace holds only metadata "
                               "(the profiler window recorded nothing)")
    return problems


class _Times(NamedTuple):
    """A trace's event times, checked and in ns, and what they say of its clock."""

    ts_ns: np.ndarray
    dur_ns: np.ndarray
    keep: np.ndarray | None  # the events whose times passed the range check; None: all
    clock: str  # see IngestedTrace.clock
    sub_us: bool


def _times_ns(path: Path, header: _Header, cols: Columns, problems: list[str]) -> _Times:
    """Every event's times in int64 ns after the range check, and the clock they are on; raises
    when no event's time is in range."""
    base = _base_time_ns(header)
    checked = check_times(cols.array("ts", np.float64), cols.array("dur", np.float64), base)
    ts, dur = checked.ts_us, checked.dur_us
    if checked.problem:
        if checked.dropped == cols.n:
            raise TraceError(path, f"no usable timed events: {checked.problem}")
        problems.append(f"{path}: {checked.problem}")
    if base:
        clock = "epoch"
        ts_ns = us_to_ns(ts) + base
    else:
        ts_ns = us_to_ns(ts)
        # Old traces carry absolute epoch microseconds; anything after 2001 is an epoch.
        clock = "epoch" if float(np.min(ts)) > 1e15 else "relative"
    dur_ns = np.rint(dur * 1000.0).astype(np.int64)
    sub_us = bool(np.any(ts != np.floor(ts)))
    return _Times(ts_ns, dur_ns, checked.keep, clock, sub_us)


def _header_facts(header: _Header) -> dict[str, Any]:
    """The `IngestedTrace` fields the header gives (rank, job, host), each where it is usable."""
    info = _distributed_info(header)
    window = header.uberprof_window
    pgs = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    return {
        "rank": _rank(info),
        "world_size": info.get("world_size") if isinstance(info.get("world_size"), int) else None,
        "backend": info.get("backend") if isinstance(info.get("backend"), str) else None,
        "process_groups": [
            {"name": str(pg.get("pg_name")), "desc": pg.get("pg_desc"),
             "size": pg.get("pg_size"), "ranks": pg.get("ranks")}
            for pg in pgs if isinstance(pg, dict)
        ],
        "host": _host(header),
        "uberprof_window": window if isinstance(window, str) else None,
    }
