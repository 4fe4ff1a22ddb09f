"""The merged trace as Chrome Trace Event Format JSON, streamed (gzip by default).

Events arrive in batches with `ts`/`dur` as integer ns after the file's time base and leave as
µs, the format's unit. Each is written as (ns + 0.25) / 1000: the quarter nanosecond makes
every reader land on the exact integer ns, whether it rounds the fraction (uberprof's ingest,
`rint`) or truncates `µs * 1000` (Perfetto's JSON importer, which would turn 156.777 into
156776 ns and can break the nesting of events that end together).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from uberprof.present.export.layout import ProcessInfo, TrackInfo
from uberprof.present.export.writer import TraceWriter
from uberprof.rundir import as_int

__all__ = ["ChromeWriter", "ns_to_us"]


def ns_to_us(ns: int) -> float:
    """Trace Event Format µs for an integer ns (see the module doc)."""
    return (ns + 0.25) / 1000.0


class ChromeWriter(TraceWriter):
    """Writes `{"traceEvents": [...], ...}`: events are encoded a batch at a time and joined with
    commas as they come; nothing waits for the end of a rank."""

    def __init__(self, path: Path, gzipped: bool, header: dict[str, Any]) -> None:
        super().__init__(path, gzipped)
        self._first = True
        head = orjson.dumps(header)
        self._file.write(head[:-1] + (b"," if len(head) > 2 else b"") + b'"traceEvents":[')

    def _add(self, encoded: list[bytes]) -> None:
        if not encoded:
            return
        chunk = b",".join(encoded)
        if not self._first:
            chunk = b"," + chunk
        self._first = False
        self._file.write(chunk)
        self.events_written += len(encoded)

    def process(self, p: ProcessInfo) -> None:
        ev = [{"ph": "M", "name": "process_name", "pid": p.pid, "tid": 0, "ts": 0,
               "args": {"name": p.name}},
              {"ph": "M", "name": "process_sort_index", "pid": p.pid, "tid": 0, "ts": 0,
               "args": {"sort_index": p.sort_index}}]
        if p.labels:
            ev.append({"ph": "M", "name": "process_labels", "pid": p.pid, "tid": 0, "ts": 0,
                       "args": {"labels": p.labels}})
        self._add([orjson.dumps(e) for e in ev])

    def track(self, t: TrackInfo) -> None:
        self._add([orjson.dumps({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": t.tid,
                                 "ts": 0, "args": {"name": t.name}}),
                   orjson.dumps({"ph": "M", "name": "thread_sort_index", "pid": t.pid,
                                 "tid": t.tid, "ts": 0, "args": {"sort_index": t.sort_index}})])

    def events(self, batch: list[dict[str, Any]]) -> None:
        dumps = orjson.dumps
        out = []
        for e in batch:
            e["ts"] = (e["ts"] + 0.25) / 1000.0
            d = e.get("dur")
            if d is not None:
                e["dur"] = (d + 0.25) / 1000.0
            try:
                out.append(dumps(e))
            except TypeError:  # orjson.JSONEncodeError: a value JSON cannot carry as it is
                out.append(dumps(_json_safe(e)))
        self._add(out)

    def end_unit(self) -> None:
        """A rank (or another group of events) is complete: nothing to reorder in JSON."""
        self._file.flush()

    def finish(self, summary: dict[str, Any]) -> None:
        self._file.write(b'],"uberprof_export":' + orjson.dumps(summary) + b"}")
        self._file.commit()


def _json_safe(value: Any) -> Any:
    """`value` with what orjson refuses (integers beyond 64 bits, odd types, odd keys) as
    strings: an odd source trace's value is kept as text, never a failed export."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return value
    if isinstance(value, int):
        return value if as_int(value) is not None else str(value)
    return str(value)
