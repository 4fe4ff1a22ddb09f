"""One counter sampler per host and run: a `flock` on a file in a private per-user folder.

The lock files live in `<tmp>/uberprof-<uid>/`, a folder that must be a real directory owned by
this user with no access for others, so nobody else can plant a symlink or a file there (to make
uberprof overwrite one of the user's files, or to switch their counters off). Files are opened
with O_NOFOLLOW and removed when the lock is released; only a killed agent leaves one behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import stat
import tempfile
import time
from pathlib import Path

from uberprof.rundir import RunDir


class UnsafeLockFolder(OSError):
    """The private lock folder exists but is not private: a symlink, another owner, open mode."""


def private_folder() -> Path:
    """`<tmp>/uberprof-<uid>`, created 0700; checked (not a symlink, ours, 0700) on every use."""
    folder = Path(tempfile.gettempdir()) / f"uberprof-{os.getuid()}"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeLockFolder(f"{folder} is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeLockFolder(f"{folder} belongs to uid {st.st_uid}, not to you")
    if st.st_mode & 0o077:
        raise UnsafeLockFolder(f"{folder} is open to others (mode {stat.S_IMODE(st.st_mode):o})")
    return folder


class HostLock:
    """A host-wide, per-run lock: held while sampling, released by the kernel if the agent dies."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @staticmethod
    def path_for(run: RunDir, run_id: str, host: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", f"{run_id}-{host}")[:120]
        digest = hashlib.sha1(str(run.root.absolute()).encode()).hexdigest()[:10]
        return private_folder() / f"{safe}-{digest}.counters.lock"

    @classmethod
    def acquire(cls, path: Path, holder: str) -> tuple[HostLock | None, str | None]:
        """(lock, None) when this agent samples, (None, holder) when another one does."""
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = _holder(fd)
                os.close(fd)
                return None, other or "another agent"
            if _same_file(fd, path):
                break
            os.close(fd)  # its holder removed it between our open and our flock: again
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
        except OSError:
            pass
        return cls(path, fd), None

    def release(self) -> None:
        """Remove the file, then unlock: an agent that opened it meanwhile sees it is gone."""
        if self._fd is None:
            return
        try:
            if _same_file(self._fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        except OSError:
            pass
        self._fd = None


def _holder(fd: int, wait_s: float = 1.0) -> str:
    """Who holds the lock: its holder writes its name right after taking it, so a file still
    empty is read again for a moment (a CI run once read it in between)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            other = os.pread(fd, 512, 0).decode(errors="replace").strip()
        except OSError:
            return ""
        if other or time.monotonic() > deadline:
            return other
        time.sleep(0.01)


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)
