"""One Kineto trace file -> one columnar event table (pyarrow), times in int64 nanoseconds.

A first pass splits `traceEvents` into raw slices of the JSON text (a skip-scan, no objects per
field); batches of events are then decoded into typed msgspec structs that name only the fields
analysis needs (unknown keys are skipped inside the C decoder: no dict per event, no `args`
object tree) and reduced at once to compact columns. Memory peaks at the JSON text plus one
batch; decoding is about 2x faster than `orjson.loads` of the same text (measured in
benchmarks/ingest.py). Strings are dictionary-encoded; classification runs once per distinct
(category, name), not per event.
"""

from __future__ import annotations

import functools
import gc
import gzip
import operator
import os
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

try:  # ISA-L's inflate: same output as zlib's, faster
    from isal import isal_zlib as _isal

    _inflate = _isal.decompress
    _INFLATE_ERRORS: tuple[type[Exception], ...] = (zlib.error, _isal.error)
except ImportError:  # pragma: no cover - isal is a declared dependency
    _inflate = zlib.decompress
    _INFLATE_ERRORS = (zlib.error,)

from uberprof.ingest import classify as K
from uberprof.ingest.classify import is_device_category
from uberprof.ingest.events import TraceArgs, TraceEvent, decode_events
from uberprof.ingest.validate import check_times

__all__ = ["EVENT_SCHEMA", "IngestedTrace", "RawTrace", "TraceError", "ingest_trace", "json_size",
           "read_raw_trace", "read_trace_bytes"]


class TraceError(Exception):
    """A trace that cannot be analysed; the message names the file and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


# --- the fields we decode ---------------------------------------------------------------------

class _Args(TraceArgs, gc=False):
    """What analysis needs beyond the common fields: operator links and collective metadata."""

    device: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_old: Any = msgspec.field(default=None, name="external id")  # 2021 traces
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    # Shapes are kept as raw JSON text and decoded only for the few collective events.
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    bytes: Any = None


class _Event(TraceEvent, gc=False):
    args: _Args | None = None


class _Header(msgspec.Struct):
    """The trace object with its events left undecoded (raw slices of the JSON text)."""

    traceEvents: list[msgspec.Raw] | None = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    deviceProperties: Any = None
    host_name: Any = None
    hostname: Any = None
    uberprof_window: Any = None


_HEADER_DECODER = msgspec.json.Decoder(_Header)
_BATCH_DECODER = msgspec.json.Decoder(list[_Event])
_ANY_DECODER = msgspec.json.Decoder()
BATCH = 8192  # events decoded into structs at a time: bounds memory to the text plus a batch


EVENT_SCHEMA = pa.schema([
    ("ts", pa.int64()),  # start, ns (epoch ns when the trace says how; see IngestedTrace.clock)
    ("dur", pa.int64()),  # ns
    ("kind", pa.dictionary(pa.int8(), pa.string())),  # see uberprof.ingest.classify
    ("name", pa.dictionary(pa.int32(), pa.string())),
    ("cat", pa.dictionary(pa.int32(), pa.string())),
    ("pid", pa.int64()),
    ("tid", pa.int64()),
    ("stream", pa.int64()),  # -1 on the host
    ("correlation", pa.int64()),  # links a launch (runtime call) to its device activity; -1
    ("external_id", pa.int64()),  # links operators to what they launched; -1
    ("coll_name", pa.dictionary(pa.int32(), pa.string())),  # collective metadata, null elsewhere
    ("dtype", pa.dictionary(pa.int32(), pa.string())),
    ("in_bytes", pa.int64()),
    ("out_bytes", pa.int64()),
    ("group_size", pa.int32()),
    ("pg_name", pa.dictionary(pa.int32(), pa.string())),
    ("pg_ranks", pa.dictionary(pa.int32(), pa.string())),
    ("seq", pa.int64()),
])


@dataclass
class IngestedTrace:
    """The event table of one trace file and what its header says."""

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
            raw = _gunzip(raw)
        except EOFError:
            raise TraceError(path, "truncated gzip: the archive ends before its end marker "
                                   "(the writer was killed, or the copy is incomplete)") from None
        except (zlib.error, gzip.BadGzipFile) as exc:
            raise TraceError(path, f"corrupt gzip data ({exc})") from None
        if not raw:
            raise TraceError(path, "empty file (the gzip archive holds 0 bytes)")
    return raw


def json_size(path: str | Path) -> int:
    """The size of a trace file's JSON text without reading it: a `.json.gz` says it in its gzip
    trailer (mod 4 GiB; Kineto's compress ~8-15x). 0 for a file that cannot be read."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return size
            f.seek(-4, os.SEEK_END)
            isize = int.from_bytes(f.read(4), "little")
        return max(isize, size * 4) if size > (1 << 30) else isize
    except OSError:
        return 0


def _gunzip(data: bytes) -> bytes:
    """Decompress in one allocation of the size the gzip trailer announces (gzip.decompress
    grows its buffer and peaks at 2.5x the output); multi-member or odd files take the slow way.
    With ISA-L (PyPI `isal`) inflation takes about 2/3 of zlib's time."""
    isize = int.from_bytes(data[-4:], "little") if len(data) >= 18 else 0
    # A cut-off archive ends in arbitrary bytes: believe the trailer only within reason.
    if 0 < isize <= 64 * len(data) + (1 << 20):
        try:
            out = _inflate(data, 31, isize)
            # the trailer's size is the last member's: a match means one member (Kineto's)
            if len(out) == isize:
                return out
        except _INFLATE_ERRORS:
            pass  # truncated or corrupt: gzip.decompress says which, below
    return gzip.decompress(data)


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
    base = header.baseTimeNanoseconds
    info = header.distributedInfo if isinstance(header.distributedInfo, dict) else {}
    rank = info.get("rank")
    return RawTrace(
        path=str(path),
        events=events,
        base_time_ns=base if isinstance(base, int) and not isinstance(base, bool) and base > 0
        else None,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None,
        host=next((h for h in (header.host_name, header.hostname) if isinstance(h, str)), None),
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


# --- building the table -----------------------------------------------------------------------

_STREAM_TID = re.compile(r"stream\s*(\d+)", re.IGNORECASE)


class _Coder(dict):  # type: ignore[type-arg]
    """value -> dense code, assigned on first sight."""

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self)
        return code


class _DeviceCats(dict):  # type: ignore[type-arg]
    def __missing__(self, key: Any) -> bool:
        v = self[key] = isinstance(key, str) and is_device_category(key)
        return v


# Field getters of events (and of their args), mapped over a batch in C.
_CAT, _NAME, _PID, _TID, _ARGS, _PH, _TS, _DUR = map(
    operator.attrgetter, ("cat", "name", "pid", "tid", "args", "ph", "ts", "dur"))
_STREAM, _CORRELATION, _EXTERNAL_ID, _EXTERNAL_ID_OLD, _COLL_NAME = map(
    operator.attrgetter, ("stream", "correlation", "external_id", "external_id_old", "coll_name"))
_NO_ARGS = _Args()
_EXACT_KEYS = frozenset((int, str, type(None)))
_DEVICE_CAT = _DeviceCats()


class _Columns:
    """Per-event values accumulated batch by batch, as compact arrays and string codes."""

    def __init__(self) -> None:
        self.ts: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.cat: list[np.ndarray] = []
        self.name: list[np.ndarray] = []
        self.pid: list[np.ndarray] = []
        self.tid: list[np.ndarray] = []
        self.has_stream: list[np.ndarray] = []
        self.stream: list[np.ndarray] = []
        self.correlation: list[np.ndarray] = []
        self.external_id: list[np.ndarray] = []
        self.cats = _Coder()
        self.names = _Coder()
        self.id_codes: dict[str, int] = {}
        self.comm_args: dict[int, _CommArgs] = {}
        self.threads: dict[int, str] = {}
        self._comm_names = np.zeros(0, dtype=bool)
        self.n = 0
        self.negative = 0
        self.missing = 0

    def add(self, events: list[_Event]) -> None:
        n = len(events)
        ph = np.fromiter(map(_PH, events), object, n)
        meta = np.flatnonzero(ph == "M")
        if meta.size:
            _thread_names([events[i] for i in meta.tolist()], self.threads)
        is_x = ph == "X"
        if not is_x.all():
            no_ph = np.flatnonzero(np.equal(ph, None)).tolist()
            for i in no_ph:  # Chrome's default phase: complete events may leave it out
                is_x[i] = events[i].dur is not None
            xs = list(compress(events, is_x.tolist()))
        else:
            xs = events
        del ph, is_x
        if not xs:
            return
        ts, dur, keep = _times(xs)
        if not keep.all():
            missing = np.isnan(ts) | np.isnan(dur)
            self.negative += int(((dur < 0) & ~missing).sum())
            self.missing += int(missing.sum())
            xs = list(compress(xs, keep.tolist()))
            ts, dur = ts[keep], dur[keep]
            if not xs:
                return
        # map() with attribute getters and coding dicts keeps the per-event work in C.
        m = len(xs)
        cats = list(map(_CAT, xs))
        names = list(map(_NAME, xs))
        name_codes = np.fromiter(map(self.names.__getitem__, names), np.int32, m)
        self.cat.append(np.fromiter(map(self.cats.__getitem__, cats), np.int32, m))
        self.name.append(name_codes)
        self.pid.append(_ids(list(map(_PID, xs)), self.id_codes))
        tid_raw = list(map(_TID, xs))
        tid = _ids(tid_raw, self.id_codes)
        args = list(map(_ARGS, xs))
        comm = self.comm_names()[name_codes]
        if None in args:  # events without args read as ones with empty args (never collectives)
            comm &= np.fromiter(map(operator.is_not, args, repeat(None)), bool, m)
            args = [_NO_ARGS if a is None else a for a in args]
        has, stream = _streams(list(map(_STREAM, args)))
        # Known device categories carry no stream arg in old traces: the stream is in the tid.
        device = np.fromiter(map(_DEVICE_CAT.__getitem__, cats), bool, m)
        for i in np.flatnonzero(device & ~has).tolist():
            stream[i] = _stream_from_tid(tid_raw[i], int(tid[i]))
        self.tid.append(tid)
        self.has_stream.append(has)
        self.stream.append(stream)
        self.correlation.append(_int_col(list(map(_CORRELATION, args))))
        ext = list(map(_EXTERNAL_ID, args))
        if None in ext:  # 2021 traces spell it "external id"
            ext = [o if e is None else e for e, o in zip(ext, map(_EXTERNAL_ID_OLD, args))]
        self.external_id.append(_int_col(ext))
        for i, ca in _comm_args(names, comm, args).items():
            self.comm_args[self.n + i] = ca
        self.ts.append(ts)
        self.dur.append(dur)
        self.n += m

    def comm_names(self) -> np.ndarray:
        """Which name codes may be collectives (`gloo:*`, `nccl:*`), extended as names appear."""
        known = self._comm_names.size
        if known < len(self.names):
            new = [type(nm) is str and nm[:5] in ("gloo:", "nccl:")
                   for nm in islice(self.names, known, None)]
            self._comm_names = np.concatenate([self._comm_names, np.array(new, dtype=bool)])
        return self._comm_names

    def array(self, name: str, dtype: Any) -> np.ndarray:
        parts = getattr(self, name)
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def ingest_trace(path: str | Path) -> IngestedTrace:
    """Parse one trace file into an `IngestedTrace`; raises `TraceError` when nothing is usable.

    Events are decoded into structs a batch at a time and reduced to compact columns at once,
    so memory peaks at the JSON text plus one batch, not at a struct per event.
    """
    path = Path(path)
    was_enabled = gc.isenabled()
    gc.disable()  # no reference cycles come out of JSON: spare the collector's full scans
    try:
        header = _decode_header(read_trace_bytes(path), path)
        raw_events = header.traceEvents
        if not raw_events:
            raise TraceError(path, "no trace events (the traceEvents list is missing or empty)")
        header.traceEvents = None
        cols = _Columns()
        for i in range(0, len(raw_events), BATCH):
            cols.add(decode_events(raw_events[i:i + BATCH], _BATCH_DECODER, _Event))
        del raw_events  # the JSON text goes with the last raw slice
    finally:
        if was_enabled:
            gc.enable()
    return _build(path, header, cols)


def _build(path: Path, header: _Header, cols: _Columns) -> IngestedTrace:
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

    base = header.baseTimeNanoseconds
    base = base if isinstance(base, int) and not isinstance(base, bool) and base > 0 else 0
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
    del ts, dur

    cat_vals = [c if isinstance(c, str) else "" for c in cols.cats]
    name_vals = [n if isinstance(n, str) else str(n if n is not None else "") for n in cols.names]
    cat_idx = cols.array("cat", np.int32)
    name_idx = cols.array("name", np.int32)
    has_stream = cols.array("has_stream", bool)
    stream = cols.array("stream", np.int64)
    device_cat = np.array([is_device_category(c) for c in cat_vals], dtype=bool)
    on_device = has_stream | device_cat[cat_idx]
    kind_codes, unknown = _kinds(cat_vals, name_vals, cat_idx, name_idx, on_device)
    if unknown:
        detail = ", ".join(f"'{c}' ({n})" for c, n in unknown.most_common())
        problems.append(f"{path}: device activity in categories uberprof does not know: "
                        f"{detail}; an unknown accelerator? Counted as compute")
    stream = np.where(on_device, stream, -1)
    coll = _collectives(cols.n, cols.comm_args, kind_codes)

    table = pa.Table.from_arrays(
        [
            pa.array(ts_ns, pa.int64()),
            pa.array(dur_ns, pa.int64()),
            pa.DictionaryArray.from_arrays(pa.array(kind_codes, pa.int8()),
                                           pa.array(K.ALL_KINDS, pa.string())),
            pa.DictionaryArray.from_arrays(pa.array(name_idx, pa.int32()),
                                           pa.array(name_vals, pa.string())),
            pa.DictionaryArray.from_arrays(pa.array(cat_idx, pa.int32()),
                                           pa.array(cat_vals, pa.string())),
            pa.array(cols.array("pid", np.int64), pa.int64()),
            pa.array(cols.array("tid", np.int64), pa.int64()),
            pa.array(stream, pa.int64()),
            pa.array(cols.array("correlation", np.int64), pa.int64()),
            pa.array(cols.array("external_id", np.int64), pa.int64()),
            *coll,
        ],
        schema=EVENT_SCHEMA,
    )
    if checked.keep is not None:
        table, ts_ns = table.filter(pa.array(checked.keep)), ts_ns[checked.keep]
    # Sorted by start time: every consumer wants that, and Parquet compresses it better.
    order = np.argsort(ts_ns, kind="stable")
    if not (order[1:] > order[:-1]).all():
        table = table.take(pa.array(order))

    info = header.distributedInfo if isinstance(header.distributedInfo, dict) else {}
    rank = info.get("rank")
    window = header.uberprof_window
    pgs = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    return IngestedTrace(
        path=str(path),
        events=table,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None,
        world_size=info.get("world_size") if isinstance(info.get("world_size"), int) else None,
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        process_groups=[
            {"name": str(pg.get("pg_name")), "desc": pg.get("pg_desc"),
             "size": pg.get("pg_size"), "ranks": pg.get("ranks")}
            for pg in pgs if isinstance(pg, dict)
        ],
        host=next((h for h in (header.host_name, header.hostname) if isinstance(h, str)), None),
        device_type=_device_type(name_vals, name_idx, kind_codes),
        clock=clock,
        threads=cols.threads,
        uberprof_window=window if isinstance(window, str) else None,
        sub_us=sub_us,
        problems=problems,
    )


def _times(xs: Sequence[_Event]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ts and dur in µs as float64, and which events have usable, non-negative times."""
    try:
        ts = np.array(list(map(_TS, xs)), dtype=np.float64)
        dur = np.array(list(map(_DUR, xs)), dtype=np.float64)
    except (TypeError, ValueError):
        ts = np.array([as_float(e.ts) for e in xs], dtype=np.float64)
        dur = np.array([as_float(e.dur) for e in xs], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        keep = ~np.isnan(ts) & ~np.isnan(dur) & (dur >= 0)
    return ts, dur, keep


def as_float(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return float("nan")
    return float("nan")


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """µs (float64) to integer ns without losing the sub-µs part of large epoch values."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _ids(values: list[Any], codes: dict[str, int]) -> np.ndarray:
    """pid/tid as int64: numbers as they are, numeric strings parsed, other strings coded < 0
    (`codes` keeps those codes the same across batches)."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    distinct = _distinct(values)
    if distinct is not None:  # few distinct values ("stream 7" tids): convert each once
        keys, idx = distinct
        return np.array([_id(v, codes) for v in keys], dtype=np.int64)[idx]
    return np.array([_id(v, codes) for v in values], dtype=np.int64)


def _id(v: Any, codes: dict[str, int]) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return codes.setdefault(str(v), -2 - len(codes))


def _distinct(values: list[Any]) -> tuple[list[Any], np.ndarray] | None:
    """The distinct values in order of first sight and each value's index among them; None
    when a dict cannot tell them apart exactly (unhashable values; 1, 1.0 and True are one key,
    so only ints, strings and None qualify)."""
    if not set(map(type, values)) <= _EXACT_KEYS:
        return None
    coder = _Coder()
    idx = np.fromiter(map(coder.__getitem__, values), np.int64, len(values))
    return list(coder), idx


def _streams(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Which events carry a numeric stream arg, and its value (-1 when none)."""
    distinct = _distinct(values)
    if distinct is not None:  # a handful of streams: convert each once
        keys, idx = distinct
        pairs = [_stream(v) for v in keys]
        return (np.array([h for h, _ in pairs], dtype=bool)[idx],
                np.array([v for _, v in pairs], dtype=np.int64)[idx])
    pairs = [_stream(v) for v in values]
    return (np.array([h for h, _ in pairs], dtype=bool).reshape(-1),
            np.array([v for _, v in pairs], dtype=np.int64).reshape(-1))


def _stream(v: Any) -> tuple[bool, int]:
    """(has a stream, the stream or -1)."""
    if type(v) is int:
        return v >= 0, v
    if isinstance(v, str) and v.isdigit():  # "0x0"-style pointers on runtime calls are not
        return True, int(v)
    return False, -1


def _stream_from_tid(raw: Any, tid: int) -> int:
    n = _stream_in_name(raw) if isinstance(raw, str) else None
    return max(tid, 0) if n is None else n


@functools.lru_cache(maxsize=4096)  # a trace has a few distinct device tids, and many events
def _stream_in_name(raw: str) -> int | None:
    m = _STREAM_TID.search(raw)
    return int(m.group(1)) if m else None


def _int_col(values: list[Any]) -> np.ndarray:
    try:
        arr = np.array([-1 if v is None else v for v in values], dtype=np.int64)
        return arr
    except (TypeError, ValueError, OverflowError):
        return np.array([v if isinstance(v, int) and not isinstance(v, bool) else -1
                         for v in values], dtype=np.int64)


def _kinds(cat_vals: list[str], name_vals: list[str], cat_idx: np.ndarray, name_idx: np.ndarray,
           on_device: np.ndarray) -> tuple[np.ndarray, Counter[str]]:
    """Kind code per event, classifying each distinct (cat, name, on_device) once."""
    key = (cat_idx * (len(name_vals) + 1) + name_idx) * 2 + on_device.astype(np.int64)
    uniq, inverse = np.unique(key, return_inverse=True)
    code_of = {k: i for i, k in enumerate(K.ALL_KINDS)}
    ucodes = np.empty(uniq.size, dtype=np.int8)
    unknown_cats: set[str] = set()
    for j, k in enumerate(uniq.tolist()):
        dev = bool(k & 1)
        rest = k >> 1
        c, nm = divmod(rest, len(name_vals) + 1)
        kind = K.classify(cat_vals[c], name_vals[nm], dev)
        if kind == K.DEVICE_OTHER:
            unknown_cats.add(cat_vals[c])
            kind_code = code_of[K.DEVICE_OTHER]
        else:
            kind_code = code_of[kind]
        ucodes[j] = kind_code
    codes = ucodes[inverse.reshape(-1)]
    unknown: Counter[str] = Counter()
    if unknown_cats:
        other = code_of[K.DEVICE_OTHER]
        for c in unknown_cats:
            ci = cat_vals.index(c)
            unknown[c] = int(((codes == other) & (cat_idx == ci)).sum())
    return codes, unknown


_CommArgs = tuple  # (name, coll_name, dtype, in_nelems, out_nelems, group_size, pg_name,
#                      pg_ranks, seq, input_dims bytes, input_type bytes)


def _comm_args(names: list[Any], candidates: np.ndarray, args: list[_Args]) -> dict[int, _CommArgs]:
    """The few fields collective metadata needs, for the events that may be collectives (a
    `gloo:*`/`nccl:*` name, or a collective name in args), as plain values (not raw slices of
    the JSON text, which would keep all of it alive)."""
    coll = np.fromiter(map(_COLL_NAME, args), object, len(args))
    out: dict[int, _CommArgs] = {}
    for i in np.flatnonzero(candidates | np.not_equal(coll, None)).tolist():
        a = args[i]
        out[i] = (names[i], a.coll_name, a.dtype, a.in_nelems, a.out_nelems, a.group_size,
                  a.pg_name, a.pg_ranks, a.seq, bytes(a.input_dims), bytes(a.input_type))
    return out


def _collectives(n: int, comm_args: dict[int, _CommArgs],
                 kind_codes: np.ndarray) -> list[pa.Array]:
    """Collective metadata columns: from NCCL's args where present, else from input shapes."""
    coll_name: list[str | None] = [None] * n
    dtype: list[str | None] = [None] * n
    in_bytes: list[int | None] = [None] * n
    out_bytes: list[int | None] = [None] * n
    group: list[int | None] = [None] * n
    pg_name: list[str | None] = [None] * n
    pg_ranks: list[str | None] = [None] * n
    seq: list[int | None] = [None] * n
    code_of = {k: i for i, k in enumerate(K.ALL_KINDS)}
    comm_codes = {code_of[K.COMM_KERNEL], code_of[K.HOST_COMM], code_of[K.COMM_OP]}
    for i, (nm, cname, dt, in_n, out_n, gsize, pgn, pgr, sq, dims, types) in comm_args.items():
        if int(kind_codes[i]) not in comm_codes:
            continue
        if cname is not None:
            coll_name[i] = str(cname)
            dt = str(dt) if dt is not None else None
            dtype[i] = dt
            size = K.DTYPE_BYTES.get(dt or "", None)
            if isinstance(in_n, int) and size:
                in_bytes[i] = in_n * size
            if isinstance(out_n, int) and size:
                out_bytes[i] = out_n * size
            if isinstance(gsize, int):
                group[i] = gsize
            if pgn is not None:
                pg_name[i] = str(pgn)
            if pgr is not None:
                pg_ranks[i] = pgr if isinstance(pgr, str) else str(pgr)
            if isinstance(sq, int):
                seq[i] = sq
            elif isinstance(sq, str) and sq.isdigit():
                seq[i] = int(sq)
        else:
            coll_name[i] = nm.split(":", 1)[1]
            in_bytes[i], dtype[i] = _bytes_from_shapes(dims, types)
    return [
        pa.array(coll_name, pa.string()).dictionary_encode(),
        pa.array(dtype, pa.string()).dictionary_encode(),
        pa.array(in_bytes, pa.int64()),
        pa.array(out_bytes, pa.int64()),
        pa.array(group, pa.int32()),
        pa.array(pg_name, pa.string()).dictionary_encode(),
        pa.array(pg_ranks, pa.string()).dictionary_encode(),
        pa.array(seq, pa.int64()),
    ]


def _bytes_from_shapes(dims_raw: bytes, types_raw: bytes) -> tuple[int | None, str | None]:
    """Bytes of a collective's tensors from `Input Dims` x `Input type` (Gloo has nothing else)."""
    if not len(dims_raw) or not len(types_raw):
        return None, None
    try:
        dims = _ANY_DECODER.decode(dims_raw)
        types = _ANY_DECODER.decode(types_raw)
    except msgspec.DecodeError:
        return None, None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, None
    total = 0
    found = False
    dtype = None
    for shape, t in zip(dims, types):
        size = K.DTYPE_BYTES.get(t) if isinstance(t, str) else None
        if size is None or not isinstance(shape, list):
            continue
        if all(isinstance(d, int) for d in shape):
            n = 1
            for d in shape:
                n *= d
            total += n * size
            found = True
            dtype = dtype or t
    return (total, dtype) if found else (None, None)


def _thread_names(events: list[_Event], out: dict[int, str]) -> None:
    for e in events:
        if e.ph == "M" and e.name == "thread_name" and e.args is not None \
                and isinstance(e.args.name, str):
            t = e.tid
            if isinstance(t, str) and t.isdigit():
                t = int(t)
            # Kineto writes a name per thread more than once; the specific one wins.
            if isinstance(t, int) and (t not in out or "(python" in out[t]
                                       or "(pt_main" in out[t]):
                out[t] = e.args.name


def _device_type(name_vals: list[str], name_idx: np.ndarray, kind_codes: np.ndarray) -> str:
    code_of = {k: i for i, k in enumerate(K.ALL_KINDS)}
    device_codes = np.array([code_of[k] for k in K.DEVICE_KINDS
                             if k not in (K.DEVICE_ANNOTATION, K.DEVICE_SYNC)])
    if not np.isin(kind_codes, device_codes).any():
        return "cpu"
    runtime = set(np.unique(name_idx[kind_codes == code_of[K.RUNTIME]]).tolist())
    names = [name_vals[i] for i in runtime]
    if any(n.startswith(("hip", "hsa")) for n in names):
        return "rocm"
    if any(n.startswith("cu") for n in names):
        return "cuda"
    if any(n.startswith("mtia") or "mtia" in n for n in names):
        return "mtia"
    return "gpu"
