"""`uberprof whatif RUN --remove straggler ...`: what fixing it would gain, projected by
replaying the run's step graph with the change (docs/whatif.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from uberprof.cli.options import derived_option, gap_threshold_option, workers_option
from uberprof.cli.params import INPUT_PATH, STEP_RANGE, FiniteRange

EPILOG = """\
\b
Examples:
  uberprof whatif uberprof-runs/RUN --remove straggler
  uberprof whatif uberprof-runs/RUN --remove data --link-scale 2
  uberprof whatif uberprof-runs/RUN --link-gbps 4 --remove exposed-comm
  uberprof whatif uberprof-runs/RUN --balance-stages --remove sync --remove launch
  uberprof whatif uberprof-runs/RUN --op aten::mm=2 --op "nccl:all_reduce=1.5" --json
  uberprof whatif uberprof-runs/RUN --remove straggler --steps 100-102
\b
How to read it: each traced step is replayed twice on the run's dependency
graph (every rank's work in program order, each collective waiting for its
last participant, each receive for its send): once with the recorded
durations (the "replayed" column: it should match "measured"; the replay
error says how well) and once with your changes ("projected"). The projected
step time is the measured median less the mean gain a step, with a 95%
interval from the steps' spread. A run whose replay error is above 5% is said to be unfit for
projection, with why. What a replay cannot know: contention a change adds
or removes, caches, a schedule the framework would pick instead.
"""


@click.command(epilog=EPILOG, short_help="Project the step time if a problem were fixed.")
@click.argument("path", type=INPUT_PATH)
@click.option("--remove", "remove", multiple=True,
              type=click.Choice(["straggler", "data", "launch", "sync", "exposed-comm"]),
              help="'straggler': the straggler's extra work (its compute, host, data-loader "
                   "time and waits for its own device per step cut to the other ranks' "
                   "median); 'data': every data-loader wait; "
                   "'launch': the host's launch overhead (kernel-launch calls and the "
                   "dispatch of the operators that issued them) and the device's idle waiting "
                   "for launches (GPU ranks); 'sync': the host's waits for its device, not for "
                   "a collective (GPU ranks); 'exposed-comm': collectives' transfers hidden under compute "
                   "(waiting for late peers, receives and each collective's end before its "
                   "step's end kept). Repeat to combine.")
@click.option("--link-scale", type=FiniteRange(min=0, min_open=True), default=None,
              metavar="F", help="Collective and send/recv transfer time divided by F (a link "
                                "F times faster); time waiting for late peers is unchanged.")
@click.option("--link-gbps", type=FiniteRange(min=0, min_open=True), default=None,
              metavar="X", help="Transfers at X Gbit/s: each collective's and send/recv's "
                                "bytes on the link / X plus the run's measured latency "
                                "(transfers without a byte count keep their time; the "
                                "output says how many).")
@click.option("--balance-stages", is_flag=True,
              help="Pipeline stages' compute at their mean in each step (layers moved from "
                   "the slow stages to the fast ones).")
@click.option("--op", "ops", multiple=True, metavar="NAME=F",
              help="Operator or kernel NAME F times faster (its self time / F). An exact name, "
                   "else every name containing NAME. Repeatable.")
@click.option("--steps", "only", type=STEP_RANGE, metavar="A-B",
              help="Only these traced steps' figures (inclusive), such as one trace window of "
                   "several; the whole run is still replayed, so each step's gain is the same "
                   "as without --steps.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the projection as JSON (baseline_step_ms, replayed_step_ms, "
                   "projected_step_ms, interval_ms, changes, steps; docs/whatif.md).")
@gap_threshold_option("used by the diagnosis it reads")
@workers_option()
@derived_option("--out", "Where derived tables go (default: PATH/derived).")
def whatif(path: Path, remove: tuple[str, ...], link_scale: float | None,
           link_gbps: float | None, balance_stages: bool, ops: tuple[str, ...],
           only: tuple[int, int] | None, as_json: bool, gap_threshold_us: float,
           workers: int | None, out: Path | None) -> None:
    """Project PATH's step time (a run directory, a folder of Kineto traces, or one trace) if
    the given problems were fixed: the traced steps replayed on the run's dependency graph
    with the changes, against the measured steps. Several changes compose. With no change:
    the baseline (each step measured and replayed, the replay error and the critical path).
    The run is analysed and diagnosed first where needed (as `uberprof report`)."""
    import orjson

    from uberprof.analysis.diagnosis.whatif import parse_changes, project_run
    from uberprof.analysis.read import open_run
    from uberprof.analysis.tables.pool import keep_pandas_out
    from uberprof.present.terminal.progress import ReadProgress

    keep_pandas_out()
    err = Console(stderr=True)
    try:
        changes = parse_changes(list(remove), link_scale, list(ops), link_gbps, balance_stages)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    with ReadProgress(err) as update:
        opened = open_run(path, out=out, threshold_ns=int(gap_threshold_us * 1000),
                          workers=workers, progress=update)
    if opened.ctx is None or opened.diagnosis is None:
        err.print(f"uberprof whatif: {opened.no_traces or 'nothing to replay'}", markup=False,
                  highlight=False, soft_wrap=True)
        sys.exit(1)
    if not opened.diagnosis.ranks:  # every trace unreadable: name them, not a projection
        for p in opened.problems or ["no rank could be analysed"]:
            err.print(f"uberprof whatif: {p}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    doc = project_run(opened.ctx, opened.diagnosis, changes, only)
    if not changes:  # the baseline: the run replayed as recorded, and what sets its steps
        run = opened.diagnosis.run
        doc.update(baseline=True, critical_path=run["critical_path"], replay=run["replay"])
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        from uberprof.present.terminal.whatif import render_whatif

        render_whatif(doc, Console())
    if doc.get("projected_step_ms") is None:
        sys.exit(1)
