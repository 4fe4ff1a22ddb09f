"""Decoded events -> compact columns, a batch at a time: the per-event half of ingest.

Batches of raw event slices are decoded into typed msgspec structs that name only the fields
analysis needs (unknown keys are skipped inside the C decoder: no dict per event, no `args`
object tree) and reduced at once to numpy arrays and string codes, so memory holds the JSON text
plus one batch of structs, never a struct per event. This is the hot loop of `uberprof analyze`:
per-event work is kept in C (attribute getters and coding dicts mapped over a batch); values are
converted by the rules in values.py, collective metadata kept by collectives.py.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import compress, islice, repeat
from typing import Any

import msgspec
import numpy as np

from uberprof.ingest.classify import is_device_category
from uberprof.ingest.collectives import CommArgs, comm_args_of
from uberprof.ingest.events import IngestArgs, IngestEvent, decode_events
from uberprof.ingest.memory import MEMORY_EVENT, MemoryRows
from uberprof.ingest.validate import as_float
from uberprof.ingest.values import Coder, id_column, int_column, stream_column, stream_from_tid

__all__ = ["BATCH", "Columns", "decode_columns"]


_BATCH_DECODER = msgspec.json.Decoder(list[IngestEvent])
BATCH = 8192  # events decoded into structs at a time: bounds memory to the text plus a batch


class _DeviceCats(dict):  # type: ignore[type-arg]
    def __missing__(self, key: Any) -> bool:
        v = self[key] = isinstance(key, str) and is_device_category(key)
        return v


# Field getters of events (and of their args), mapped over a batch in C.
_CAT, _NAME, _PID, _TID, _ARGS, _PH, _TS, _DUR = map(
    operator.attrgetter, ("cat", "name", "pid", "tid", "args", "ph", "ts", "dur"))
_STREAM, _CORRELATION, _EXTERNAL_ID, _EXTERNAL_ID_OLD, _INPUT_DIMS = map(
    operator.attrgetter, ("stream", "correlation", "external_id", "external_id_old",
                          "input_dims"))
_NO_ARGS = IngestArgs()
_DEVICE_CAT = _DeviceCats()
_PH_X, _PH_M, _PH_I, _PH_NONE = 1, 2, 3, 4


class _PhCodes(dict):  # type: ignore[type-arg]
    """ph value -> code: the phases decoding tells apart, 0 for any other. Another phase is
    remembered on first sight (up to _PH_KEEP of them), so that the flow and counter events
    of an NCCL trace (`s`, `f`, `C`: a third of its events) are looked up in C, not through
    this method once per event (108,800 calls, 6% of analyze's CPU on nccl_parser_config x8)."""

    def __missing__(self, key: Any) -> int:
        if len(self) < _PH_KEEP:
            self[key] = 0
        return 0


_PH_KEEP = 64  # phases remembered: Kineto writes a dozen; a malformed trace cannot grow it


_PH_CODE = _PhCodes({"X": _PH_X, "M": _PH_M, "i": _PH_I, None: _PH_NONE})


def decode_columns(raw_events: list[msgspec.Raw], consume: bool = False) -> Columns:
    """The columns of a trace's raw events, decoded `BATCH` at a time to bound memory.

    With `consume` the list gives up each batch's slices as it is decoded (None in their
    place): a slice object costs about 70 bytes an event, a third of a gigabyte on a 1 GB
    trace, which is then freed while the columns grow instead of held until the end."""
    cols = Columns()
    for i in range(0, len(raw_events), BATCH):
        batch = raw_events[i:i + BATCH]
        if consume:
            raw_events[i:i + BATCH] = _NONES[:len(batch)]
        cols.add(decode_events(batch, _BATCH_DECODER, IngestEvent))
        del batch
    return cols


_NONES: list[None] = [None] * BATCH


class Columns:
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
        # Operators' `Input Dims` (record_shapes), coded by their JSON text as written: b""
        # where the event has none. Only operators keep them (table.py).
        self.shapes: list[np.ndarray] = []
        self.shape_texts = Coder()
        self.cats = Coder()
        self.names = Coder()
        self.id_codes: dict[str, int] = {}
        self.comm_args: dict[int, CommArgs] = {}
        self.threads: dict[int, str] = {}
        self.memory = MemoryRows()  # [memory] instant events (profile_memory)
        self._comm_names = np.zeros(0, dtype=bool)
        self.n = 0
        self.negative = 0
        self.missing = 0

    def add(self, events: list[IngestEvent]) -> None:
        """Reduce one decoded batch to columns: its complete events whose times are usable."""
        xs = self._complete(events)
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
        self.pid.append(id_column(list(map(_PID, xs)), self.id_codes))
        tid_raw = list(map(_TID, xs))
        tid = id_column(tid_raw, self.id_codes)
        args = list(map(_ARGS, xs))
        comm = self.comm_names()[name_codes]
        if None in args:  # events without args read as ones with empty args (never collectives)
            comm &= np.fromiter(map(operator.is_not, args, repeat(None)), bool, m)
            args = [_NO_ARGS if a is None else a for a in args]
        has, stream = stream_column(list(map(_STREAM, args)))
        # Known device categories carry no stream arg in old traces: the stream is in the tid.
        device = np.fromiter(map(_DEVICE_CAT.__getitem__, cats), bool, m)
        no_stream = np.flatnonzero(device & ~has)
        if no_stream.size:  # once per distinct tid (its code tells the raw value's stream)
            codes, first, where = np.unique(tid[no_stream], return_index=True,
                                            return_inverse=True)
            per_tid = [stream_from_tid(tid_raw[i], int(c))
                       for i, c in zip(no_stream[first].tolist(), codes.tolist())]
            stream[no_stream] = np.array(per_tid, dtype=stream.dtype)[where.reshape(-1)]
        self.tid.append(tid)
        self.has_stream.append(has)
        self.stream.append(stream)
        self.correlation.append(int_column(list(map(_CORRELATION, args))))
        ext = list(map(_EXTERNAL_ID, args))
        if None in ext:  # 2021 traces spell it "external id"
            ext = [o if e is None else e for e, o in zip(ext, map(_EXTERNAL_ID_OLD, args))]
        self.external_id.append(int_column(ext))
        self.shapes.append(np.fromiter(map(self.shape_texts.__getitem__,
                                           map(bytes, map(_INPUT_DIMS, args))), np.int32, m))
        for i, ca in comm_args_of(names, comm, args).items():
            self.comm_args[self.n + i] = ca
        self.ts.append(ts)
        self.dur.append(dur)
        self.n += m

    def _complete(self, events: list[IngestEvent]) -> list[IngestEvent]:
        """The batch's complete ("X") events; thread names are taken from its metadata ones."""
        n = len(events)
        phs = list(map(_PH, events))
        if phs.count("X") == n:
            return events
        # Phases as small codes, looked up once per distinct value (a dict mapped in C).
        try:
            ph = np.fromiter(map(_PH_CODE.__getitem__, phs), np.int8, n)
        except TypeError:  # an unhashable ph (a list, say): neither of the kinds kept
            ph = np.fromiter((_PH_CODE[p] if p is None or isinstance(p, str) else 0
                              for p in phs), np.int8, n)
        meta = np.flatnonzero(ph == _PH_M)
        if meta.size:
            _thread_names([events[i] for i in meta.tolist()], self.threads)
        is_x = ph == _PH_X
        if not is_x.all():
            instant = np.flatnonzero(ph == _PH_I)
            if instant.size:
                self.memory.add([events[i] for i in instant.tolist()
                                 if events[i].name == MEMORY_EVENT])
            no_ph = np.flatnonzero(ph == _PH_NONE).tolist()
            for i in no_ph:  # Chrome's default phase: complete events may leave it out
                is_x[i] = events[i].dur is not None
            return list(compress(events, is_x.tolist()))
        return events

    def comm_names(self) -> np.ndarray:
        """Which name codes may be collectives (`gloo:*`, `nccl:*`) or launch one (`c10d::*`,
        which name what the program called and, for send/recv, the peer), extended as names
        appear."""
        known = self._comm_names.size
        if known < len(self.names):
            new = [type(nm) is str and (nm[:5] in ("gloo:", "nccl:") or nm[:6] == "c10d::")
                   for nm in islice(self.names, known, None)]
            self._comm_names = np.concatenate([self._comm_names, np.array(new, dtype=bool)])
        return self._comm_names

    def array(self, name: str, dtype: Any) -> np.ndarray:
        """One column, its batches joined (empty when no batch added to it)."""
        parts = getattr(self, name)
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _times(xs: Sequence[IngestEvent]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _thread_names(events: list[IngestEvent], out: dict[int, str]) -> None:
    """tid -> thread name, from the `thread_name` metadata events."""
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
