"""Ingest's column building against an independent reading of the same traces.

The table is built with per-batch shortcuts (attribute getters mapped in C, each distinct
pid/tid/stream value converted once); these tests read the real traces with orjson, event by
event, and check that the columns agree, and that the shortcuts fall back to the per-event rules
where a dict could not tell values apart (1, 1.0 and True are one key).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest

from uberprof.ingest import trace as T
from uberprof.ingest import values as V
from uberprof.ingest.events import TraceEvent, decode_events
from uberprof.ingest.gz import json_size

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
TRACES = sorted(p for p in SHARED.rglob("*") if p.name.endswith((".json", ".json.gz"))) \
    if SHARED.is_dir() else []


def _reference(path: Path) -> dict[str, Counter[Any]]:
    """Per-event values of the complete events, read with orjson one event at a time."""
    doc = orjson.loads(T.read_trace_bytes(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    out: dict[str, Counter[Any]] = {k: Counter() for k in ("times", "ids", "links")}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        if not isinstance(e.get("ts"), (int, float)) or not isinstance(e.get("dur"), (int, float)) \
                or e["dur"] < 0:
            continue
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        ext = a.get("External id", a.get("external id"))
        out["times"][(e.get("name"), e["dur"])] += 1
        out["ids"][(e.get("pid"), e.get("tid"))] += 1
        out["links"][(a.get("correlation", -1), -1 if ext is None else ext)] += 1
    return out


def _table(path: Path) -> dict[str, Counter[Any]]:
    t = T.ingest_trace(path).events
    names = t.column("name").to_pylist()
    dur = t.column("dur").to_numpy() / 1000.0
    pid, tid = t.column("pid").to_pylist(), t.column("tid").to_pylist()
    return {"times": Counter(zip(names, dur.tolist())), "ids": Counter(zip(pid, tid)),
            "links": Counter(zip(t.column("correlation").to_pylist(),
                                 t.column("external_id").to_pylist()))}


@pytest.mark.skipif(not TRACES, reason=f"{SHARED} not present")
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name)
def test_columns_agree_with_an_event_by_event_reading(path: Path) -> None:
    ref, got = _reference(path), _table(path)
    assert sum(got["times"].values()) == sum(ref["times"].values())
    # durations round-trip through integer ns: compare at the ns
    assert Counter({(n, round(d * 1000)): c for (n, d), c in got["times"].items()}) == \
        Counter({(n, round(d * 1000)): c for (n, d), c in ref["times"].items()})
    assert got["links"] == ref["links"]
    # pid/tid: integers as they are; strings ("stream 7", "Spans") become codes of their own
    ints = Counter({k: c for k, c in ref["ids"].items()
                    if all(type(v) is int for v in k)})
    assert all(got["ids"][k] == c for k, c in ints.items())


def _ids_one_by_one(values: list[Any]) -> np.ndarray:
    codes: dict[str, int] = {}
    return np.array([V._id(v, codes) for v in values], dtype=np.int64)


@pytest.mark.parametrize("values", [
    ["stream 7", 3, "stream 7", 12, "12", " -4", None, 3],  # distinct-value path
    [1, True, 1.0, "x", 1],  # equal as dict keys, different as ids: one by one
    [[1], "stream 2", 5],  # unhashable: one by one
])
def test_ids_match_the_per_event_rules(values: list[Any]) -> None:
    assert V.id_column(values, {}).tolist() == _ids_one_by_one(values).tolist()


@pytest.mark.parametrize("values", [
    [7, None, "7", 7, "0x0", -3, None],
    [1, True, 1.0, 1],  # True and 1.0 are no stream; 1 is
    [{"a": 1}, 2],
])
def test_streams_match_the_per_event_rules(values: list[Any]) -> None:
    has, stream = V.stream_column(values)
    pairs = [V._stream(v) for v in values]
    assert has.tolist() == [h for h, _ in pairs]
    assert stream.tolist() == [s for _, s in pairs]


def test_streams_tell_equal_keys_apart() -> None:
    has, stream = V.stream_column([1, True, 1.0, 1])
    assert has.tolist() == [True, False, False, True]
    assert stream.tolist() == [1, -1, -1, 1]


def test_batch_decode_of_one_or_many_events() -> None:
    dec = msgspec.json.Decoder(list[TraceEvent])
    raws = [msgspec.Raw(b'{"ph": "X", "name": "a"}'), msgspec.Raw(b'{"ph": "M", "name": "b"}'),
            msgspec.Raw(b'{"ph": "X", "name": "c"}')]
    assert decode_events([], dec, TraceEvent) == []
    assert [e.name for e in decode_events(raws[:1], dec, TraceEvent)] == ["a"]
    assert [e.name for e in decode_events(raws, dec, TraceEvent)] == ["a", "b", "c"]


def test_events_without_args_are_never_collectives(tmp_path: Path) -> None:
    """A `gloo:*` span lacking args is no collective (it carries no metadata to read)."""
    doc = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 1,
         "ts": 1, "dur": 2},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 1,
         "ts": 5, "dur": 2, "args": {"Input Dims": [[4]], "Input type": ["float"]}},
    ]}
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps(doc))
    t = T.ingest_trace(path).events
    assert t.column("in_bytes").to_pylist() == [None, 16]


@pytest.mark.skipif(not TRACES, reason=f"{SHARED} not present")
def test_json_size_is_the_text_ingest_reads() -> None:
    """The pool sizes its work (one process or several) by the JSON text, which gzipped traces
    state in their trailer: Kineto's compress 8-15x, so their file size misleads."""
    from uberprof.analysis.tables.pool import Job, _json_bytes

    for path in TRACES:
        size = len(T.read_trace_bytes(path))
        assert json_size(path) == size, path
        job = Job(rel=path.name, table={}, entry={"size": path.stat().st_size}, path=str(path),
                  src=str(path), out="", trace=True)
        assert _json_bytes(job) == size, path
    assert json_size(SHARED / "no such trace.json.gz") == 0


def test_old_device_events_take_their_stream_from_the_tid(tmp_path: Path) -> None:
    """Device events without a stream arg (2021 traces) name it in the tid; any other tid (a
    number, or JSON that is no text at all) leaves the stream to the tid's own number."""
    def kernel(tid: Any, ts: int) -> dict[str, Any]:
        return {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": tid, "ts": ts, "dur": 1}

    doc = {"traceEvents": [kernel("stream 7", 1), kernel("Stream12", 3), kernel("stream 7", 5),
                           kernel(["odd"], 7), kernel(3, 9)]}
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps(doc))
    t = T.ingest_trace(path).events.sort_by("ts")
    streams = t.column("stream").to_pylist()
    assert streams[:3] == [7, 12, 7]
    assert streams[4] == 3
    assert streams[3] >= 0
