"""Never harm the job: uberprof's own failures are logged and swallowed, never raised into user code.

Each agent has one `AgentLog`. It writes details to a log file in the run directory when it can,
and prints at most one line per kind of problem on stderr, so a broken collector costs the user one
line of output, not their job.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class AgentLog:
    def __init__(self, who: str, path: Path | None = None) -> None:
        self.who = who
        self._path = path
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def set_path(self, path: Path | None) -> None:
        self._path = path

    def write(self, message: str) -> None:
        """Details for the log file only."""
        if self._path is None:
            return
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{self.who} pid {os.getpid()}] {message}\n"
        try:
            with self._lock, open(self._path, "a") as f:
                f.write(line)
        except OSError:
            pass

    def notice(self, message: str, key: str | None = None) -> None:
        """One line on stderr (once per key), also logged."""
        key = key or message
        self.write(message)
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
        try:
            sys.stderr.write(f"uberprof: {message}\n")
            sys.stderr.flush()
        except Exception:
            pass

    def error(self, where: str, exc: BaseException) -> None:
        """An exception inside uberprof: full traceback to the log, one line to stderr. A full
        disk is no internal error: `diskfull` says it once and writing stops."""
        from uberprof.collect import diskfull

        if diskfull.is_disk_full_error(exc):
            self.write(f"disk full in {where}: {exc}")
            diskfull.declare(exc)
            return
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.write(f"error in {where}:\n{detail}")
        where_log = f" (details in {self._path})" if self._path else ""
        self.notice(
            f"internal error in {where}: {type(exc).__name__}: {exc}; "
            f"your job is not affected{where_log}",
            key=f"error:{where}",
        )


def swallowing(log: AgentLog, where: str, default: Any = None) -> Callable[[F], F]:
    """Decorate a hook so that any exception in it is logged and the hook returns `default`."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the whole point
                log.error(where, exc)
                return default

        return wrapper  # type: ignore[return-value]

    return deco
