"""A trace window's memory budget: how much the rank's memory may grow inside a window before the
window stops early, so that a long window cannot take the memory the job needs.

With operator shapes recorded (CPU ranks' default), torch's profiler holds what it records of
every operator's tensors until the window stops (docs/overhead.md): one process running the
pipeline sample's blocks grew by 108 MB a traced step, and a window asked for on hundreds of
steps would grow by tens of GB. So at each step's end inside a window the rank's resident memory
is read (`/proc/self/statm`: one read, a few microseconds) and, once it has grown by more than
the budget since the window started, the window stops there: its trace keeps the steps recorded
so far, `rank.json`'s `trace.cut_short` says when and why, and `info` and `report` name it.

The budget, unless `uberprof run --window-memory-mb` gives one: half the memory the host had
available when the window started, shared by the ranks of that host (`LOCAL_WORLD_SIZE`). Where
neither the resident memory nor the available memory can be read (not Linux), no budget holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AVAILABLE_SHARE", "Cut", "WindowMemory", "available_bytes", "resident_bytes"]

AVAILABLE_SHARE = 0.5  # of the host's available memory, shared by its ranks, per window
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MB = 1 << 20


def resident_bytes() -> int | None:
    """This process's resident memory, from /proc/self/statm; None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def available_bytes() -> int | None:
    """The host's available memory (MemAvailable, as psutil reads it); None where unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no budget rather than a failed window
        return None


@dataclass(frozen=True)
class Cut:
    """A window stopped early: its memory grew by `grown` bytes, over `budget`."""

    grown: int
    budget: int

    def words(self) -> str:
        grown = f"{self.grown / MB:.1f}".removesuffix(".0")  # 40.4 MB is over 40 MB
        return (f"its memory grew by {grown} MB in the window, over the budget of "
                f"{self.budget / MB:.0f} MB")


class WindowMemory:
    """The budget of the window in progress (module docstring): `start` when a window starts,
    `over` at each step's end inside it."""

    def __init__(self, budget_mb: int | None, local_ranks: int,
                 resident: Callable[[], int | None] = resident_bytes,
                 available: Callable[[], int | None] = available_bytes) -> None:
        self._given = budget_mb  # None: from the available memory; 0: no budget
        self._local = max(1, local_ranks)
        self._resident = resident
        self._available = available
        self._base: int | None = None
        self.budget: int | None = None

    def start(self) -> None:
        self._base = self._resident()
        if self._given == 0 or self._base is None:
            self.budget = None
        elif self._given is not None:
            self.budget = self._given * MB
        else:
            free = self._available()
            self.budget = int(free * AVAILABLE_SHARE / self._local) if free else None

    def over(self) -> Cut | None:
        """The cut, where the memory grew past the budget since `start`; None otherwise."""
        if self.budget is None or self._base is None:
            return None
        now = self._resident()
        if now is None or now - self._base <= self.budget:
            return None
        return Cut(now - self._base, self.budget)
