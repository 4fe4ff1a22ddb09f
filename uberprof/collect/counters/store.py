"""Counter tables on disk: one Arrow IPC stream per source, appended batch by batch.

Why a stream of small batches: every batch is complete on disk once written and flushed, so a
node agent killed with `kill -9` leaves everything up to its last flush readable; a reader stops
at a cut-off last batch and keeps the rest. Long format (one row per value) because sources
differ in what they can measure on each machine, and an unsupported value is then simply absent.

    counters/<source>.arrows   ts_ns int64 (epoch ns), device, metric, value float64, unit
    counters/index.json        per (source, metric, unit): rows, devices, first/last ts; rewritten
                               after every flush so `uberprof info` need not scan the tables
    counters/meta.json         what was sampled: settings, GPUs (UUIDs), NICs (speed, tc cap), ...

This module writes; reading (and the index format) is `uberprof.rundir.counters`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from uberprof.rundir import COUNTERS_INDEX, COUNTERS_META, COUNTERS_SUFFIX, write_json_atomic
from uberprof.rundir.counters import SeriesStats

Row = tuple[str, str, float, str]
"""(device, metric, value, unit): what a source returns for one tick."""

COLUMNS = ("ts_ns", "device", "metric", "value", "unit")


def schema() -> Any:
    import pyarrow as pa

    return pa.schema([("ts_ns", pa.int64()), ("device", pa.string()), ("metric", pa.string()),
                      ("value", pa.float64()), ("unit", pa.string())])


class CounterStore:
    """Buffers rows per source and appends them as one batch per source at each flush.

    Thread-safe: the fast and slow sampling threads both add to it. After an I/O error it stops
    writing (less data, never a crash); `error` says why.
    """

    def __init__(self, directory: Path, compression: str | None = "lz4") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._compression = compression
        self._lock = threading.Lock()
        self._buf: dict[str, tuple[list[int], list[str], list[str], list[float], list[str]]] = {}
        self._writers: dict[str, tuple[IO[bytes], Any]] = {}
        self._index: dict[tuple[str, str], SeriesStats] = {}
        self._index_dirty = False
        self.closed = False
        self.error: BaseException | None = None

    def warm_up(self) -> None:
        """Pay pyarrow's one-off start-up (IPC writer, codec: ~0.3 s of CPU) now, in set-up,
        not in the first flush."""
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression=self._compression)
        with pa.ipc.new_stream(sink, schema(), options=options) as writer:
            writer.write_batch(_batch(([0], ["d"], ["m"], [0.0], ["u"])))

    def add(self, source: str, ts_ns: int, rows: Iterable[Row]) -> None:
        with self._lock:
            if self.closed or self.error is not None:
                return
            cols = self._buf.get(source)
            if cols is None:
                cols = self._buf[source] = ([], [], [], [], [])
            ts, dev, met, val, unit = cols
            for d, m, v, u in rows:
                if v is None:
                    continue
                ts.append(ts_ns)
                dev.append(d)
                met.append(m)
                val.append(float(v))
                unit.append(u)

    def flush(self) -> None:
        """Append what is buffered as one batch per source, then rewrite the index."""
        with self._lock:
            if self.error is not None or self.closed:
                return  # closed: a late flush must not start a second stream in the same file
            buffered, self._buf = self._buf, {}
            try:
                for source, cols in buffered.items():
                    if cols[0]:
                        self._write(source, cols)
                if self._index_dirty:
                    write_json_atomic(self.dir / COUNTERS_INDEX, self._index_doc())
                    self._index_dirty = False
            except Exception as exc:  # noqa: BLE001 - disk full, permissions: stop, keep the job
                self.error = exc

    def stop_writing(self, why: BaseException) -> None:
        """Write nothing more (what is on disk stays readable); `error` says why."""
        with self._lock:
            self.error = self.error or why

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for f, writer in self._writers.values():
                try:
                    writer.close()
                    f.close()
                except Exception as exc:  # noqa: BLE001
                    self.error = self.error or exc
            self._writers.clear()

    def write_meta(self, meta: dict[str, Any]) -> None:
        try:
            write_json_atomic(self.dir / COUNTERS_META, meta)
        except OSError as exc:
            self.error = self.error or exc

    def _write(self, source: str, cols: tuple[list[int], list[str], list[str], list[float],
                                               list[str]]) -> None:
        import pyarrow as pa

        entry = self._writers.get(source)
        if entry is None:
            f = open(self.dir / f"{source}{COUNTERS_SUFFIX}", "ab")
            options = pa.ipc.IpcWriteOptions(compression=self._compression)
            entry = self._writers[source] = (f, pa.ipc.new_stream(f, schema(), options=options))
        f, writer = entry
        writer.write_batch(_batch(cols))
        f.flush()
        ts, dev, met, _, unit = cols
        for t, d, m, u in zip(ts, dev, met, unit):
            s = self._index.get((source, m))
            if s is None:
                s = self._index[(source, m)] = SeriesStats(unit=u)
            s.add(1, (d,), t, t)
        self._index_dirty = True

    def _index_doc(self) -> dict[str, Any]:
        return {
            "updated_ns": time.time_ns(),
            "series": [s.entry(src, m) for (src, m), s in sorted(self._index.items())],
        }


def _batch(cols: tuple[list[int], list[str], list[str], list[float], list[str]]) -> Any:
    import pyarrow as pa

    ts, dev, met, val, unit = cols
    return pa.record_batch([pa.array(ts, pa.int64()), pa.array(dev, pa.string()),
                            pa.array(met, pa.string()), pa.array(val, pa.float64()),
                            pa.array(unit, pa.string())], schema=schema())
