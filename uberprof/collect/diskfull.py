"""A full disk under the run directory: one line, stop writing, keep what was written readable.

The first process of the run to meet ENOSPC (or a full quota) creates an empty `disk-full` file
at the run's root (an empty file needs no data block), which tells the other processes of the
run to stay quiet about it and tells `uberprof info` what happened. Every writer of this process
then stops (`is_full()`); the last metadata writes fall back to rewriting the existing file in
place, which reuses its blocks, so `node.json` and `rank.json` still record how the run ended.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from uberprof.rundir.layout import DISK_FULL_FILE, write_json_atomic

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class _State:
    root: Path | None = None
    full = False
    lock = threading.Lock()


def configure(run_root: Path) -> None:
    """The run directory this process writes to (node or rank agent)."""
    _State.root = run_root


def is_disk_full_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def is_full() -> bool:
    """Whether this process met a full disk: writers stop rather than fail again and again."""
    return _State.full


def run_is_full() -> bool:
    """`is_full()`, or another process of the run met a full disk (one stat: not per step)."""
    if not _State.full and _State.root is not None and (_State.root / DISK_FULL_FILE).exists():
        _State.full = True
    return _State.full


def declare(exc: BaseException | None = None) -> None:
    """Stop writing; say so in one line, unless another process of the run already has."""
    with _State.lock:
        if _State.full:
            return
        _State.full = True
    root = _State.root
    if root is not None:
        try:
            os.close(os.open(root / DISK_FULL_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return  # another process of the run has said it
        except OSError:
            pass
    where = f"the disk holding {root}" if root is not None else "the disk of the run directory"
    try:
        sys.stderr.write(f"uberprof: {where} is full: uberprof stopped writing there (what it "
                         "wrote stays readable); your job is not affected\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass


def write_json_final(path: Path, obj: Any) -> None:
    """`write_json_atomic`, or on a full disk a rewrite in place of the existing file (compact,
    padded with spaces): not atomic, but it needs no new block, so the run's end is recorded."""
    try:
        write_json_atomic(path, obj)
        return
    except OSError as exc:
        if not is_disk_full_error(exc) or not path.exists():
            raise
        declare(exc)
    data = json.dumps(obj, separators=(",", ":"), default=str).encode()
    fd = os.open(path, os.O_WRONLY)
    try:
        old = os.fstat(fd).st_size
        os.pwrite(fd, data + b" " * max(0, old - len(data)), 0)
    finally:
        os.close(fd)
