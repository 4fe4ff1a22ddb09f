"""The in-script API. Importing it is cheap: torch is touched only when a profile is active."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from uberprof.collect.config import CollectConfig, TraceSchedule
from uberprof.collect.runid import resolve_run_id
from uberprof.rundir import RunDir


def step() -> None:
    """Mark the end of a training step, for loops without an optimizer step.

    A no-op unless the process runs under `uberprof run` or inside `uberprof.profile()`.
    Once called, it is the only step source (optimizer and profiler steps are ignored).
    """
    from uberprof.collect.rank import activation

    if activation.S.run is not None:
        activation.explicit_step()


@contextmanager
def profile(
    out: str | os.PathLike[str] = "uberprof-runs",
    run_id: str | None = None,
    trace_steps: str | None = None,
    trace_every: int | None = None,
    trace_active: int = 3,
    trace: bool = True,
) -> Iterator[RunDir]:
    """Profile this process as a rank, without `uberprof run`.

    The run directory is `<out>/<run_id>`. In a multi-rank job every rank must use the same
    `run_id`; by default it comes from the launcher (torchrun's rendezvous id, SLURM's job id).
    Trace windows: `trace_steps="20-22"`, or `trace_every=N` with `trace_active=K`, or `trace=False`.
    """
    from uberprof.collect.rank import activation

    if activation.S.run is not None:
        raise RuntimeError("uberprof is already profiling this process (uberprof run or profile())")
    if not trace:
        schedule = TraceSchedule.off()
    elif trace_every:
        schedule = TraceSchedule.periodic(trace_every, trace_active)
    elif trace_steps:
        schedule = TraceSchedule.parse_steps(trace_steps)
    else:
        schedule = TraceSchedule()
    rid = run_id or resolve_run_id(None, [], dict(os.environ), per_process=True)
    run = RunDir(Path(out) / rid)
    run.create(rid)
    activation.configure(run.root, rid, None, CollectConfig(trace=schedule))
    activation.install_hooks()
    # Before init_process_group the rank is not known yet: the agent starts at the first step
    # or when the process group comes up, as under `uberprof run`.
    activation.activate_if_distributed()
    try:
        yield run
    finally:
        activation.close_agent("profile() exited")
        activation.S.run = None
        activation.S.agent = None
