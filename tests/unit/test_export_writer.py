"""The writers' shared part: one interface, one atomic output file, one abort."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from uberprof.present.export.chrome import ChromeWriter
from uberprof.present.export.layout import ProcessInfo, TrackInfo
from uberprof.present.export.writer import FLUSH_BYTES, AtomicOutput, TraceWriter


def test_atomic_output_appears_only_on_commit_and_counts_uncompressed_bytes(tmp_path: Path) -> None:
    out = AtomicOutput(tmp_path / "t.json.gz", gzipped=True)
    data = [b"x" * 1000] * (2 * FLUSH_BYTES // 1000)  # crosses the flush size twice
    for b in data:
        out.write(b)
    assert not (tmp_path / "t.json.gz").exists()
    assert out.n == sum(map(len, data))
    out.commit()
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == b"".join(data)
    assert [p.name for p in tmp_path.iterdir()] == ["t.json.gz"]


@pytest.mark.parametrize("gzipped", [True, False])
def test_abort_leaves_nothing_behind(tmp_path: Path, gzipped: bool) -> None:
    w = ChromeWriter(tmp_path / "m.json", gzipped, {"traceName": "t"})
    w.process(ProcessInfo(0, "rank 0", 0, None))
    w.events([{"ph": "X", "name": "k", "pid": 0, "tid": 1, "ts": 5, "dur": 2}])
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_chrome_writer_is_a_trace_writer_and_finishes_a_valid_document(tmp_path: Path) -> None:
    w = ChromeWriter(tmp_path / "m.json", False, {"traceName": "t"})
    assert isinstance(w, TraceWriter)
    w.process(ProcessInfo(0, "rank 0", 0, None))
    w.track(TrackInfo(0, 1, "main", 0))
    w.events([{"ph": "X", "name": "k", "pid": 0, "tid": 1, "ts": 1000, "dur": 2000}])
    w.end_unit()
    w.finish({"events_written": w.events_written})
    raw = (tmp_path / "m.json").read_bytes()
    doc = orjson.loads(raw)
    assert w.bytes_written == len(raw)
    assert w.events_written == 5 == doc["uberprof_export"]["events_written"]
    assert doc["traceEvents"][-1] == {"ph": "X", "name": "k", "pid": 0, "tid": 1,
                                      "ts": 1.00025, "dur": 2.00025}


def test_perfetto_writer_shares_the_interface_and_abort(tmp_path: Path) -> None:
    pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    from uberprof.present.export.perfetto import PerfettoWriter

    w = PerfettoWriter(tmp_path / "m.pftrace", False, 0)
    assert isinstance(w, TraceWriter)
    assert PerfettoWriter.abort is ChromeWriter.abort is TraceWriter.abort
    w.process(ProcessInfo(0, "rank 0", 0, None))
    w.abort()
    assert list(tmp_path.iterdir()) == []
