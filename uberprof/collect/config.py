"""What to collect: the options of `uberprof run`, carried to every rank through one env variable."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from uberprof.rundir.ranks import MAX_STEP, rank_ranges

ENV_CONFIG = "UBERPROF_CONFIG"
ENV_RUN_DIR = "UBERPROF_RUN_DIR"
ENV_NODE = "UBERPROF_NODE"
ENV_HOME = "UBERPROF_HOME"

DEFAULT_TRACE_STEPS = (10, 19)
"""Late enough that DDP bucket rebuilding and warm-up are over; ten steps, because the straggler
test needs evidence: with one gradient bucket, three steps give 3 collectives, and no rank can be
shown late beyond chance at 1% (4 ranks: best corrected p is 6%). A job too short for it is told
so, with a window it does reach."""


@dataclass(frozen=True)
class TraceSchedule:
    """Which steps torch.profiler records. The same on every rank, so windows line up."""

    windows: tuple[tuple[int, int], ...] = (DEFAULT_TRACE_STEPS,)
    every: int = 0
    active: int = 3

    @classmethod
    def off(cls) -> TraceSchedule:
        return cls(windows=(), every=0)

    @classmethod
    def parse_steps(cls, text: str) -> TraceSchedule:
        """`20-22`, `20`, or several: `5-7,100-102`."""
        windows = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            first, _, last = part.partition("-")
            try:
                a, b = int(first), int(last or first)
            except ValueError:
                raise ValueError(f"not a step range: {part!r} (expected e.g. 20-22)") from None
            if a < 0 or b < a:
                raise ValueError(f"bad step range {part!r}: need 0 <= first <= last")
            if b >= MAX_STEP:  # a step no step timeline can hold (rundir/ranks.py)
                raise ValueError(f"bad step range {part!r}: steps go up to {MAX_STEP - 1}")
            windows.append((a, b))
        if not windows:
            raise ValueError("empty step range")
        return cls(windows=tuple(sorted(windows)), every=0)

    @classmethod
    def periodic(cls, every: int, active: int) -> TraceSchedule:
        if every <= 0 or active <= 0 or active > every:
            raise ValueError("need --trace-every N and --trace-active K with 0 < K <= N")
        return cls(windows=(), every=every, active=active)

    @property
    def enabled(self) -> bool:
        return bool(self.windows) or self.every > 0

    def window_at(self, step: int) -> tuple[int, int] | None:
        """The window that starts at `step`, if one does."""
        for a, b in self.windows:
            if a == step:
                return (a, b)
        if self.every and step > 0 and step % self.every == 0:
            return (step, step + self.active - 1)
        return None

    def overlapping(self, first: int, last: int) -> tuple[int, int] | None:
        """A scheduled window that shares a step with `first`-`last`, if one does."""
        for a, b in self.windows:
            if a <= last and b >= first:
                return (a, b)
        if self.every:
            for start in range(max(self.every, first - self.active + 1), last + 1):
                if start % self.every == 0:
                    return (start, start + self.active - 1)
        return None

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        if self.every:
            return f"{self.active} steps every {self.every}"
        return ", ".join(f"steps {a}-{b}" for a, b in self.windows)


@dataclass(frozen=True)
class CollectConfig:
    trace: TraceSchedule = field(default_factory=TraceSchedule)
    record_shapes: bool | None = None  # None: on CPU ranks only (collect/rank/windows.py)
    with_stack: bool = False
    modules: bool = False  # module::<path> spans in trace windows (collect/rank/modules.py)
    profile_memory: bool = False  # torch.profiler's [memory] events in trace windows
    window_memory_mb: int | None = None  # None: from the host's memory; 0: none (window_memory)
    # --trace-ranks: the ranks that record trace windows (None: every rank); the others keep
    # their step timeline and Flight Recorder only
    trace_ranks: tuple[int, ...] | None = None

    def traces_rank(self, rank: int) -> bool:
        """Whether `rank` records trace windows (`--trace-ranks`)."""
        return self.trace_ranks is None or rank in self.trace_ranks

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, environ: os._Environ[str] | dict[str, str] | None = None) -> CollectConfig:
        raw = (environ or os.environ).get(ENV_CONFIG)
        if not raw:
            return cls()
        data = json.loads(raw)
        t = data.get("trace", {})
        trace = TraceSchedule(
            windows=tuple(tuple(w) for w in t.get("windows", ())),  # type: ignore[misc]
            every=int(t.get("every", 0)),
            active=int(t.get("active", 3)),
        )
        return cls(
            trace=trace,
            record_shapes=_optional_bool(data.get("record_shapes")),
            with_stack=bool(data.get("with_stack", False)),
            modules=bool(data.get("modules", False)),
            profile_memory=bool(data.get("profile_memory", False)),
            window_memory_mb=_optional_int(data.get("window_memory_mb")),
            trace_ranks=_optional_ranks(data.get("trace_ranks")),
        )


def _optional_bool(value: object) -> bool | None:
    return None if value is None else bool(value)


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _optional_ranks(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(sorted({v for v in value if isinstance(v, int) and not isinstance(v, bool)
                         and v >= 0}))


def describe_ranks(ranks: tuple[int, ...] | None) -> str:
    """`(0, 1, 2, 7)` as "0-2, 7"; None (every rank) as "all"."""
    if ranks is None:
        return "all"
    if not ranks:
        return "none"
    return rank_ranges(list(ranks))
