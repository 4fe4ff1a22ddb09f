"""What a Kineto trace says about the machine and the job before its events, read from the head
of the file only (no event is decoded): `deviceProperties` (the GPUs the process saw: model,
memory, compute capability), `distributedInfo` (backend, rank, world size and, in newer traces,
the NCCL version) and the version keys some Kineto builds write (`cuda_runtime_version`,
`cuda_driver_version`, `cupti_version`, ...). For `diff`, which names what changed under the job
before attributing time to operators."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

__all__ = ["HEAD_BYTES", "head_text", "trace_head"]

HEAD_BYTES = 1 << 20  # Kineto writes the header keys before the events


def head_text(path: Path, size: int = HEAD_BYTES) -> str | None:
    """The first `size` bytes of a trace file (gzip or not) as text; None when unreadable."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                head = f.read(size)
        else:
            with open(path, "rb") as f:
                head = f.read(size)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        return None
    return head.decode("utf-8", errors="replace")


def trace_head(path: Path) -> dict[str, Any]:
    """The trace object's keys before `traceEvents` ({} when the head cannot be read or does
    not hold them)."""
    text = head_text(path)
    if text is None:
        return {}
    at = text.find('"traceEvents"')
    start = text.find("{")
    if at < 0 or start < 0 or start > at:
        return {}
    prefix = text[start:at].rstrip().rstrip(",")
    try:
        doc = json.loads(prefix + "}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
