"""`--format perfetto`: Perfetto's protobuf trace, decoded back with the same protos, holds every
event of the JSON export, with balanced and time-ordered slices on every track, flows bound to
slices at both ends, and tracks ordered explicitly by rank."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest

from tests._export_check import load
from tests._export_traces import write_traces
from uberprof.analysis.read import open_run
from uberprof.present.export import ExportOptions, export_trace

P = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


def decode(path: Path) -> list:  # type: ignore[type-arg]
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return list(P.Trace.FromString(raw).packet)


def _check(packets: list) -> dict:  # type: ignore[type-arg]
    """Replays the packets as the trace processor would: interned names resolved, descriptors
    before use, slices balanced per track and never ending before they begin."""
    names: dict[int, str] = {}
    tracks: dict[int, object] = {}
    open_: dict[int, list[tuple[int, str]]] = {}
    last_ts: dict[int, int] = {}
    slices: Counter[int] = Counter()
    flows_out: Counter[int] = Counter()
    flows_in: Counter[int] = Counter()
    counters: Counter[int] = Counter()
    for p in packets:
        assert p.trusted_packet_sequence_id == 1
        for n in p.interned_data.event_names:
            names[n.iid] = n.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in tracks
            if d.HasField("parent_uuid"):
                assert d.parent_uuid in tracks, "a child described before its parent"
            tracks[d.uuid] = d
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        assert te.track_uuid in tracks, "an event on an undescribed track"
        assert p.timestamp >= last_ts.get(te.track_uuid, 0), "time goes back on a track"
        last_ts[te.track_uuid] = p.timestamp
        if te.type == P.TrackEvent.TYPE_SLICE_BEGIN:
            assert te.name_iid in names
            open_.setdefault(te.track_uuid, []).append((p.timestamp, names[te.name_iid]))
            slices[te.track_uuid] += 1
            flows_out.update(te.flow_ids)
            flows_in.update(te.terminating_flow_ids)
        elif te.type == P.TrackEvent.TYPE_SLICE_END:
            begin, _ = open_[te.track_uuid].pop()
            assert p.timestamp >= begin
        elif te.type == P.TrackEvent.TYPE_COUNTER:
            counters[te.track_uuid] += 1
    assert all(not v for v in open_.values()), "unbalanced slices"
    assert set(flows_out) == set(flows_in), "flows with one end only"
    return {"tracks": tracks, "slices": slices, "flows": len(flows_out), "counters": counters}


def test_perfetto_export_matches_the_json_one(tmp_path: Path) -> None:
    write_traces(tmp_path / "traces", world=3, hosts=("a", "a", "b"))
    opened = open_run(tmp_path / "traces", out=tmp_path / "derived")
    js = export_trace(opened, tmp_path / "m.json", ExportOptions(gzip=False))
    pf = export_trace(opened, tmp_path / "m.pftrace", ExportOptions(fmt="perfetto"))
    assert pf.path.name == "m.pftrace.gz" and pf.bytes_uncompressed < js.bytes_uncompressed
    doc = load(js.path)
    got = _check(decode(pf.path))
    tracks = got["tracks"]
    # every complete event of the JSON export is a slice of the proto, on the same track
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    json_tracks = {(e["pid"], e["tid"]): (procs[e["pid"]], e["args"]["name"])
                   for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    per_track = Counter(json_tracks[(e["pid"], e["tid"])] for e in doc["traceEvents"]
                        if e["ph"] == "X")
    by_name = {(tracks[d.parent_uuid].name, d.name): uuid for uuid, d in tracks.items()
               if d.HasField("parent_uuid") and d.parent_uuid in tracks}
    assert set(per_track) <= set(by_name)
    for key, n in per_track.items():
        assert got["slices"][by_name[key]] == n, key
    # ranks in order under one root with explicit ordering, findings first
    root = next(d for d in tracks.values() if not d.HasField("parent_uuid"))
    assert root.child_ordering == P.TrackDescriptor.EXPLICIT
    top = sorted((d for d in tracks.values() if d.parent_uuid == root.uuid),
                 key=lambda d: d.sibling_order_rank)
    assert [d.name.split(" (")[0] for d in top] == ["findings", "rank 0", "rank 1",
                                                     "rank 2"]
    # launch flows: one per kernel, both ends bound
    assert got["flows"] == sum(1 for e in doc["traceEvents"]
                               if e.get("cat") == "ac2g" and e["ph"] == "s")
    assert pf.summary["ranks"] == [0, 1, 2]


def test_missing_perfetto_package_is_a_clear_error(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def fake(name: str, *a, **k):  # type: ignore[no-untyped-def]
        if name.startswith("perfetto"):
            raise ImportError("No module named 'perfetto'")
        return real(name, *a, **k)

    write_traces(tmp_path / "traces")
    opened = open_run(tmp_path / "traces", out=tmp_path / "derived")
    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match="pip install"):
        export_trace(opened, tmp_path / "x.pftrace", ExportOptions(fmt="perfetto"))
    assert not list(tmp_path.glob("x.pftrace*")) and not list(tmp_path.glob(".x.*"))
