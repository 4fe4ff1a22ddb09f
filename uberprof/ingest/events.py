"""The typed structs Kineto events are decoded into, and the batch decoder every reader uses.

A reader names only the fields it needs: unknown keys are skipped inside msgspec's C decoder
(no dict per event, no `args` object tree), which is what makes decoding about 2x faster than
`orjson.loads`. The fields every reader needs are declared once here; ingest and the trace
export each extend `TraceEvent` / `TraceArgs` with their own (collective metadata; flow ids).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

__all__ = ["IngestArgs", "IngestEvent", "TraceArgs", "TraceEvent", "decode_events"]


class TraceArgs(msgspec.Struct, gc=False):
    """The `args` fields every reader needs: launch links, the stream, metadata names."""

    correlation: Any = None
    stream: Any = None
    name: Any = None  # metadata events: thread and process names
    labels: Any = None


class TraceEvent(msgspec.Struct, gc=False):
    """The fields of a trace event every reader needs (values as the JSON has them)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: TraceArgs | None = None


E = TypeVar("E", bound=TraceEvent)

_ANY = msgspec.json.Decoder()


def decode_events(chunk: list[msgspec.Raw], decoder: msgspec.json.Decoder[list[E]],
                  struct: type[E], keep_place: bool = False) -> list[E]:
    """Structs for a batch of raw events, in one call to `decoder` (a `list[struct]` decoder).

    When the batch does not fit (an `args` that is not an object, say) the events are converted
    one by one, keeping what fits: with args when they are an object, else without. An event
    that is not an object at all is dropped, or with `keep_place` becomes an empty struct, so
    that the output lines up with `chunk`.
    """
    if not chunk:
        return []
    # One buffer, one copy: the brackets ride on the first and last slices.
    text = b",".join([b"[" + chunk[0], *chunk[1:-1], bytes(chunk[-1]) + b"]"] if len(chunk) > 1
                     else [b"[" + chunk[0] + b"]"])
    try:
        return decoder.decode(text)
    except msgspec.ValidationError:
        pass
    del text
    out: list[E] = []
    for r in chunk:
        try:
            out.append(msgspec.json.decode(r, type=struct))
            continue
        except msgspec.ValidationError:
            pass
        e = _ANY.decode(r)
        if isinstance(e, dict):
            e = {k: v for k, v in e.items() if k != "args" or isinstance(v, dict)}
            for attempt in (e, {k: v for k, v in e.items() if k != "args"}):
                try:
                    out.append(msgspec.convert(attempt, struct, strict=False))
                    break
                except msgspec.ValidationError:
                    continue
            else:
                if keep_place:
                    out.append(struct())
        elif keep_place:
            out.append(struct())
    return out


class IngestArgs(TraceArgs, gc=False):
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
    # c10d::send / c10d::recv_ name their peer (a rank of the group) in these.
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""),
                                                 name="Concrete Inputs")
    bytes: Any = None
    # [memory] events (profile_memory): ingest/memory.py
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    device_type: Any = msgspec.field(default=None, name="Device Type")


class IngestEvent(TraceEvent, gc=False):
    args: IngestArgs | None = None
