"""Step boundaries from whatever the script already does, without code changes.

Three sources, the more explicit one winning once it is seen:
  1. the global optimizer step post-hook (one boundary per iteration, also with several
     optimizers: the cycle of optimizers is learnt from the first iteration, and the boundary is
     placed after the last optimizer of the cycle);
  2. `torch.profiler.profile.step()` of a profiler the script drives itself (`ProfilerStep#N`);
  3. `uberprof.step()` called by the script.
When a stronger source shows up in the middle of a step that a weaker one opened, that step simply
continues, so the switch never creates a spurious short step.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum


class StepSource(IntEnum):
    OPTIMIZER = 1
    PROFILER = 2
    EXPLICIT = 3


class StepDetector:
    def __init__(self, on_boundary: Callable[[int, StepSource], None]) -> None:
        self._on_boundary = on_boundary
        self.source: StepSource | None = None
        self._last_emitted: StepSource | None = None
        self._cycle: list[int] = []  # optimizers seen while learning the first iteration
        self._closer: int | None = None  # the optimizer whose step ends an iteration
        self._last_hook_ns = 0

    def optimizer_stepped(self, optimizer_id: int, t_ns: int) -> None:
        if not self._accept(StepSource.OPTIMIZER):
            return
        if self._closer is None:
            if optimizer_id not in self._cycle:
                self._cycle.append(optimizer_id)
                self._last_hook_ns = t_ns
                return
            # An optimizer came round again: the first iteration ended at the previous hook.
            self._closer = self._cycle[-1]
            self._emit(self._last_hook_ns, StepSource.OPTIMIZER)
        if optimizer_id == self._closer:
            self._emit(t_ns, StepSource.OPTIMIZER)

    def profiler_stepped(self, t_ns: int) -> None:
        if self._accept(StepSource.PROFILER):
            self._emit(t_ns, StepSource.PROFILER)

    def explicit_step(self, t_ns: int) -> None:
        if self._accept(StepSource.EXPLICIT):
            self._emit(t_ns, StepSource.EXPLICIT)

    def flush(self) -> None:
        """At exit: a single iteration with optimizers still counts as a step."""
        if self.source == StepSource.OPTIMIZER and self._closer is None and self._cycle:
            self._emit(self._last_hook_ns, StepSource.OPTIMIZER)
            self._cycle.clear()

    def _accept(self, source: StepSource) -> bool:
        if self.source is not None and source < self.source:
            return False
        if self.source is not None and source > self.source:
            self.source = source
            self._cycle.clear()
            # The open step began at a weaker source's boundary: let it run to the next one.
            return self._last_emitted is None
        self.source = source
        return True

    def _emit(self, t_ns: int, source: StepSource) -> None:
        self._last_emitted = source
        self._on_boundary(t_ns, source)
