"""Output files named on the command line (`export -o`, `report --html`): checked before the
analysis spends minutes, and a write that still fails is one line, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cannot_write", "unwritable"]


def unwritable(path: Path, makes_folders: bool = False) -> str | None:
    """Why `path` cannot be written (a folder in its place, a file where a folder should be,
    a missing folder unless the command `makes_folders`, a read-only folder), or None when it
    looks writable; the write itself may still fail (`cannot_write`)."""
    if path.is_dir():
        return f"cannot write {path}: it is a folder"
    parent = path.parent
    while makes_folders and not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.exists():
        return f"cannot write {path}: no folder {parent}"
    if not parent.is_dir():
        return f"cannot write {path}: {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"cannot write {path}: permission denied"
    return None


def cannot_write(path: Path, exc: OSError) -> str:
    """The one line for a write that failed."""
    return f"cannot write {path}: {exc.strerror or exc}"
