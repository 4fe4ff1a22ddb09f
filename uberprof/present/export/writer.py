"""What the merge hands a merged trace to: the interface both output formats implement, and
the file they write through.

`TraceWriter` names the calls `merge.py` makes, in order: `process()` and `track()` declare
where events go, `events()` hands over a batch (Chrome-shaped dicts, ts/dur in integer ns after
the file's time base), `end_unit()` closes a rank's file (a writer may buffer that much, never
more), then `finish(summary)` or, on any error, `abort()`. Both formats write through
`AtomicOutput`: a temporary file renamed into place, so a failed or interrupted export never
leaves a truncated trace under the final name. `merge.open_writer` picks the
format's writer.
"""

from __future__ import annotations

import gzip
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, BinaryIO

from uberprof.present.export.layout import ProcessInfo, TrackInfo

__all__ = ["FLUSH_BYTES", "AtomicOutput", "TraceWriter"]

FLUSH_BYTES = 1 << 20  # handed on in ~1 MB chunks: one gzip write per event would double the time


class AtomicOutput:
    """A write-only, optionally gzipped file that becomes `path` only on `commit()`; it counts
    the (uncompressed) bytes written and hands them on in ~1 MB chunks."""

    def __init__(self, path: Path, gzipped: bool) -> None:
        self.path = Path(path)
        self.n = 0
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._raw: BinaryIO = open(self._tmp, "wb")  # noqa: SIM115 - closed in commit/discard
        self._gz = (gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6, mtime=0)
                    if gzipped else None)
        self._out: BinaryIO = (self._gz if self._gz is not None  # type: ignore[assignment]
                               else self._raw)
        self._parts: list[bytes] = []
        self._pending = 0

    def write(self, b: bytes) -> int:
        self.n += len(b)
        self._parts.append(b)
        self._pending += len(b)
        if self._pending >= FLUSH_BYTES:
            self.flush()
        return len(b)

    def flush(self) -> None:
        if self._parts:
            self._out.write(b"".join(self._parts))
            self._parts.clear()
            self._pending = 0

    def _close(self) -> None:
        try:
            if self._gz is not None:
                self._gz.close()
        finally:
            self._raw.close()

    def commit(self) -> None:
        """Write what is buffered, close, and move the file to its final name."""
        self.flush()
        self._close()
        os.replace(self._tmp, self.path)

    def discard(self) -> None:
        """Close and delete the temporary file; the final name is never touched."""
        try:
            self._close()
        finally:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass


class TraceWriter(ABC):
    """One merged-trace output format (see the module doc for the order of calls)."""

    events_written: int = 0
    unsupported: int = 0  # events of kinds the format cannot hold (left out, and said so)

    def __init__(self, path: Path, gzipped: bool) -> None:
        self.events_written = 0
        self.unsupported = 0
        self._file = AtomicOutput(path, gzipped)

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def bytes_written(self) -> int:
        """Bytes of the uncompressed output so far."""
        return self._file.n

    @abstractmethod
    def process(self, p: ProcessInfo) -> None:
        """A process (a rank, the findings, a node's counters): the parent of tracks."""

    @abstractmethod
    def track(self, t: TrackInfo) -> None:
        """A named track (thread, GPU stream, uberprof track) of a process declared before."""

    @abstractmethod
    def events(self, batch: list[dict[str, Any]]) -> None:
        """Events for the declared tracks; the writer may keep them until `end_unit()`."""

    @abstractmethod
    def end_unit(self) -> None:
        """A rank's file (or another group of events) is complete."""

    @abstractmethod
    def finish(self, summary: dict[str, Any]) -> None:
        """Write the rest and the export's summary, and move the file into place."""

    def abort(self) -> None:
        """Leave nothing behind: the temporary file is deleted, the final name never written."""
        self._file.discard()
