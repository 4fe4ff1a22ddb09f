"""A shared run made once per test session, whichever pytest-xdist worker asks for it first.

A session-scoped fixture is made once per process, and under pytest-xdist every worker is a
process: each worker would make every run its tests share. They used to be kept apart by
putting every test file that used a shared run on one worker (one xdist group), which left
that worker with most of the job suite while the other ran out of work. Now the runs live in
the folder the workers' temporary folders share (`factory.getbasetemp().parent` on a worker);
the first worker to ask makes a run there under a file lock, and the others wait on that lock
and read what it returned (pickled beside the run). The wait is bounded by the run's own time
limits (`tests/_jobs.py`): the maker's job is stopped at its limit, and a worker that dies
releases its lock with its process. A run that failed is not made again by the next worker:
it fails with the first one's message.

A test that changes a run works on its own copy (`copy_run`), since another worker may read
the same run at the same time (two analyses of one run are safe: tables/derived.py writes
every file under a temporary name and renames it into place, and `copy_run` leaves those
temporary names out).
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock

__all__ = ["copy_run", "made_once"]

T = TypeVar("T")


def _shared_root(factory: pytest.TempPathFactory) -> Path | None:
    """The folder every worker of this session sees, or None when not under pytest-xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return factory.getbasetemp().parent


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """`make(folder)` run once per session across workers (module docstring): its result,
    made here or read from the worker that made it. `folder` is empty and named `name`."""
    root = _shared_root(factory)
    if root is None:
        return make(factory.mktemp(name))
    result, failed = root / f"{name}.result.pickle", root / f"{name}.failed"
    with FileLock(str(root / f"{name}.lock")):
        if result.exists():
            return pickle.loads(result.read_bytes())
        if failed.exists():
            pytest.fail(f"the shared run {name} failed on another worker:\n"
                        f"{failed.read_text()}", pytrace=False)
        folder = root / name
        folder.mkdir()
        try:
            value = make(folder)
        except BaseException as e:
            failed.write_text(f"{type(e).__name__}: {e}"[-6000:])
            raise
        result.write_bytes(pickle.dumps(value))
        return value


def copy_run(src: Path, dst: Path, derived: bool = False) -> Path:
    """A copy of run `src` at `dst` for a test that changes it; without its derived/ folder
    unless `derived` (then with what analyses have finished writing: the temporary files of
    one under way on another worker are left out)."""
    if not derived:
        return Path(shutil.copytree(src, dst, ignore=shutil.ignore_patterns("derived")))
    return Path(shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".*.tmp", ".write-test-*"),
                                copy_function=_copy_if_there))


def _copy_if_there(src: str, dst: str) -> str:
    """shutil.copy2, skipping a file that an analysis on another worker removed after the copy
    listed its folder (a saved diagnosis's state, say, which it rewrites)."""
    try:
        return shutil.copy2(src, dst)
    except FileNotFoundError:
        return dst
