"""`uberprof trace`: record a trace window on a running job's next steps, on demand."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from uberprof.cli.params import RANK_LIST, FiniteRange
from uberprof.collect.rank.requests import MAX_STEPS
from uberprof.collect.trace_request import CannotTrace, TraceOutcome, request_trace
from uberprof.rundir import rank_ranges

EPILOG = """\
\b
Examples:
  uberprof trace uberprof-runs/RUN                 (3 steps, every rank)
  uberprof trace uberprof-runs/RUN --steps 10 --ranks 0,7,12-15
\b
How it reaches the job: the request is a file in the run directory (requests/), which each
rank looks for at its step boundaries (every 0.5 s at most, one stat); every chosen rank
starts at the same step, a little ahead of the job's last finished step, and answers in its
own folder. On several nodes it works where they share the run directory. The job never
waits for this command, and a rank that cannot answer does not hold the others back.
\b
Exit codes: 0 every chosen rank will record the window; 1 a rank refused or did not answer,
or the job cannot be asked (it ended, it has not finished a step yet, no such rank).
"""


@click.command(epilog=EPILOG, short_help="Record a trace window on a running job, now.")
@click.argument("run", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--steps", "steps", type=click.IntRange(1, MAX_STEPS), default=3,
              show_default=True, metavar="K", help="Steps the window records.")
@click.option("--ranks", type=RANK_LIST, metavar="LIST",
              help="Only these ranks, e.g. 0,7,12-15 [default: every rank of the run].")
@click.option("--wait", "wait_s", type=FiniteRange(min=0.5, max=3600), metavar="SECONDS",
              help="How long to wait for the ranks' answers; a rank that has not read the "
              "request by then never records it [default: 10 s + 3 steps of the job].")
@click.option("--json", "as_json", is_flag=True, help="The answers as JSON (docs/trace.md).")
def trace(run: Path, steps: int, ranks: set[int] | None, wait_s: float | None,
          as_json: bool) -> None:
    """Ask the job running in RUN to record a trace window on its next K steps.

    Answers with the steps the window will cover on each rank, or why it cannot: the job
    ended, a window is already recording or scheduled on those steps, no rank answered in
    time. `uberprof info RUN` lists the window, marked "on demand", once it is written.
    """
    try:
        outcome = request_trace(run, steps, ranks, wait_s)
    except CannotTrace as exc:
        if as_json:
            sys.stdout.buffer.write(orjson.dumps({"ok": False, "reason": str(exc)}) + b"\n")
        else:
            click.echo(f"uberprof trace: {exc}", err=True)
        sys.exit(1)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(outcome.as_json(), option=orjson.OPT_INDENT_2)
                                + b"\n")
    else:
        for line in describe(outcome, run):
            click.echo(line)
    sys.exit(0 if outcome.ok else 1)


def describe(o: TraceOutcome, run: Path) -> list[str]:
    """The answers in words: the window, the late ranks, the refusals, the silent ranks."""
    lines = []
    on_time = sorted(r for r, a in o.accepted.items() if not a.get("late"))
    if on_time:
        lines.append(f"trace window on steps {o.first}-{o.last} on rank(s) "
                     f"{rank_ranges(on_time)} (on demand; the job was at step {o.last_step}, "
                     f"{o.step_s * 1e3:.0f} ms a step)")
    for r, a in sorted(o.accepted.items()):
        if a.get("late"):
            w = a.get("window") or ["?", "?"]
            lines.append(f"rank {r}: steps {w[0]}-{w[1]} (it read the request at step "
                         f"{a.get('step')}, past step {o.first}: it starts at its next step)")
    for r, a in sorted(o.refused.items()):
        lines.append(f"rank {r}: refused: {a.get('reason') or 'no reason given'}")
    if o.silent:
        lines.append(f"rank(s) {rank_ranges(o.silent)}: no answer in {o.wait_s:g} s (a node "
                     "that does not share this run directory, or a rank stuck in a step); "
                     "they will not record this window")
    if o.accepted:
        lines.append(f"next: uberprof info {run} lists the window once its traces are written")
    return lines
