"""Decoding `traceEvents` piece by piece (ingest/pieces.py) gives the same event table as
decoding it from one raw slice per event (columns.decode_columns, the way every trace took
before), whatever the pieces' size and wherever a `}, {` sits inside an event."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pytest

from uberprof.ingest import pieces as P
from uberprof.ingest import trace as T
from uberprof.ingest.columns import decode_columns

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
TRACES = sorted(p for p in SHARED.rglob("*") if p.name.endswith((".json", ".json.gz"))) \
    if SHARED.is_dir() else []


def _by_slices(path: Path) -> pa.Table:
    """The event table through one raw slice per event (the reference way)."""
    raw = T.read_trace_bytes(path)
    header = T._decode_header(raw, path)
    cols = decode_columns(header.traceEvents or [])
    header.traceEvents = None
    return T._build(path, header, cols).events


def _event(i: int, **extra: object) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 2,
            "ts": 1000 + 10 * i, "dur": 5, "args": {"External id": i}, **extra}


def _write(path: Path, events: list[object], **header: object) -> Path:
    path.write_bytes(orjson.dumps({"schemaVersion": 1, **header, "traceEvents": events},
                                  option=orjson.OPT_INDENT_2))
    return path


@pytest.mark.skipif(not TRACES, reason=f"{SHARED} not present")
@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.name}/{p.name[:24]}")
def test_piecewise_table_equals_the_one_from_raw_slices_on_shared_traces(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(P, "PIECE_BYTES", 4096)  # many pieces even on the small traces
    try:
        expected = _by_slices(path)
    except T.TraceError:
        pytest.skip("a trace ingest refuses either way")
    assert T.ingest_trace(path).events.equals(expected)


def test_a_cut_candidate_inside_a_string_or_nested_object_is_never_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Names and args holding "}, {" (the cut pattern) at many offsets, so that with tiny pieces
    # the first candidate after a piece's nominal end is often inside an event.
    events = [_event(i, name=f"x}}, {{y{i}", args={"External id": i, "inner": [{"a": 1}, {"b": 2}]})
              if i % 3 else _event(i) for i in range(400)]
    path = _write(tmp_path / "t.json", events)
    monkeypatch.setattr(P, "PIECE_BYTES", 50)
    table = T.ingest_trace(path).events
    assert table.equals(_by_slices(path))
    assert table.num_rows == 400
    assert sorted(table.column("name").to_pylist()) == sorted(e["name"] for e in events)


def test_events_that_do_not_fit_the_struct_are_kept_as_the_slice_way_keeps_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # args that is not an object, and an event that is not an object: the per-event fallback.
    events: list[object] = [_event(i) for i in range(50)]
    events[10] = {**_event(10), "args": [1, 2]}
    events[20] = 7
    events[30] = {**_event(30), "args": "text"}
    path = _write(tmp_path / "t.json", events)
    monkeypatch.setattr(P, "PIECE_BYTES", 200)
    table = T.ingest_trace(path).events
    assert table.equals(_by_slices(path))
    assert table.num_rows == 49  # all but the number


def test_an_empty_event_array_is_refused_with_the_same_message(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", [])
    with pytest.raises(T.TraceError, match="no trace events"):
        T.ingest_trace(path)


def test_a_trace_whose_events_are_not_an_array_is_refused_as_before(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps({"traceEvents": {"a": 1}}))
    with pytest.raises(T.TraceError, match="no trace events"):
        T.ingest_trace(path)


def test_invalid_json_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2},')
    with pytest.raises(T.TraceError, match="invalid JSON"):
        T.ingest_trace(path)


def test_the_header_is_read_when_it_follows_the_events(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    events = [_event(i) for i in range(20)]
    path.write_bytes(b'{"traceEvents": ' + orjson.dumps(events)
                     + b', "distributedInfo": {"rank": 3, "world_size": 4}}')
    t = T.ingest_trace(path)
    assert (t.rank, t.world_size, t.events.num_rows) == (3, 4, 20)


@pytest.mark.parametrize("size", [1, 64, 1000, 1 << 20])
def test_pieces_cover_every_event_once_at_any_piece_size(
        size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    events = [_event(i) for i in range(300)]
    raw = msgspec.json.decode(orjson.dumps({"traceEvents": events}), type=T._LazyHeader)
    monkeypatch.setattr(P, "PIECE_BYTES", size)
    cols = P.decode_array_columns(raw.traceEvents)
    assert cols.n == 300
    assert cols.array("external_id", np.int64).tolist() == list(range(300))
