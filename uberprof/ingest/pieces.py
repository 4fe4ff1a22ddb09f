"""A trace's `traceEvents` array decoded piece by piece, straight from its JSON text.

Why: holding one raw slice object per event (`list[msgspec.Raw]`, about 70 bytes an event) next
to the text cost a third of a gigabyte on a 1 GB trace, and was the worker's memory peak. Here
the header decoder skips the array as a single slice (no object per event), and the array's
text is cut into pieces of about `PIECE_BYTES`, each decoded into structs at once and reduced
to columns (columns.py) before the next: memory holds the text, the columns, and one piece.

Where to cut: after a `}` `,` `{` sequence (between two events in every Kineto trace). Such a
sequence may also sit inside an event (a string, nested objects); a cut there leaves the piece
with an unterminated string or object, which no JSON parser accepts, so a piece that decodes
was cut between events (the text before it was, and the whole array is known to be valid JSON:
the header decoder checked it). A piece that does not decode grows to the next candidate.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import msgspec

from uberprof.ingest.columns import BATCH, Columns
from uberprof.ingest.events import IngestEvent, decode_events

__all__ = ["PIECE_BYTES", "decode_array_columns", "is_array", "is_empty_array"]

PIECE_BYTES = 1 << 21  # about 10k Kineto events: the size of columns.py's batches
_MAX_RETRIES = 64  # candidate cuts tried in a row before the rest is decoded as one piece
_CUT = re.compile(rb"\}\s*(,)\s*\{")
_EMPTY = re.compile(rb"\[\s*\]")
_EVENTS = msgspec.json.Decoder(list[IngestEvent])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])


def is_array(array: msgspec.Raw) -> bool:
    """Whether a raw JSON value is an array."""
    return len(array) > 0 and memoryview(array)[0] == ord("[")


def is_empty_array(array: msgspec.Raw) -> bool:
    """Whether a raw JSON array holds nothing (looks at its first bytes only)."""
    return _EMPTY.match(memoryview(array)) is not None


def decode_array_columns(array: msgspec.Raw) -> Columns:
    """The columns of a raw JSON array of trace events (`is_array`), a piece at a time."""
    cols = Columns()
    for events in _pieces(memoryview(array)):
        cols.add(events)
    return cols


def _pieces(text: memoryview) -> Iterator[list[IngestEvent]]:
    """The events of `text` (a whole JSON array), one piece's structs at a time."""
    end_of_array = len(text) - 1  # the closing bracket
    start = 1
    while True:
        cut, retries = start + PIECE_BYTES, 0
        while True:
            m = _CUT.search(text, cut) if cut < end_of_array and retries < _MAX_RETRIES else None
            end = m.start(1) if m is not None else end_of_array
            try:
                events = _decode_piece(b"[" + text[start:end] + b"]")
                break
            except msgspec.DecodeError:
                if m is None:
                    raise  # the rest of a valid array always decodes: not reached
                cut, retries = m.end(1), retries + 1
        yield events
        del events
        if m is None:
            return
        start = end + 1


def _decode_piece(piece: bytes) -> list[IngestEvent]:
    """Structs for a piece's events; raises DecodeError (not ValidationError) when the piece is
    not a whole JSON array. Events that do not fit the struct take decode_events's one by one
    way, as in columns.decode_columns."""
    try:
        return _EVENTS.decode(piece)
    except msgspec.ValidationError:
        raws = _RAWS.decode(piece)  # DecodeError here: a cut inside an event
    out: list[IngestEvent] = []
    for i in range(0, len(raws), BATCH):
        out.extend(decode_events(raws[i:i + BATCH], _EVENTS, IngestEvent))
    return out
