"""`uberprof calibrate RUN [-- LAUNCHER...]`: measure the peak bus bandwidth the job's links
reach, with a short all-reduce sweep under the job's own launcher, and record it in the run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from uberprof.cli.params import FiniteRange

EPILOG = """\
\b
Examples:
  uberprof calibrate uberprof-runs/RUN          (the run's launcher, after you confirm it)
  uberprof calibrate --yes uberprof-runs/RUN    (the run's launcher, no question: your own runs)
  uberprof calibrate uberprof-runs/RUN -- torchrun --nproc_per_node=8
  uberprof calibrate RUN -- torchrun --nnodes=2 --nproc_per_node=8 --rdzv-endpoint=...
\b
LAUNCHER is the command line that starts your training script, without the script: the sweep
script takes its place. Multi-node: run the same command on every node, as for the job. Rank 0
writes RUN/calibration.json; `uberprof report` then compares busbw with the measured peak.
"""


@click.command(context_settings={"ignore_unknown_options": True},
               epilog=EPILOG, short_help="Measure the job's link bandwidth (all-reduce sweep).")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--max-mb", type=FiniteRange(min=0.0625), default=64.0, show_default=True,
              help="Largest all-reduce size (MiB).")
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed all-reduces per size.")
@click.option("--timeout", type=FiniteRange(min=1), default=600.0, show_default=True,
              help="Give up after this many seconds.")
@click.option("--yes", "-y", is_flag=True,
              help="Run the launcher recorded in RUN without asking (only for runs you trust: "
              "a run directory can name any command).")
@click.argument("launcher", nargs=-1, type=click.UNPROCESSED)
def calibrate(run_dir: Path, max_mb: float, iters: int, timeout: float, yes: bool,
              launcher: tuple[str, ...]) -> None:
    """Run an all-reduce sweep under LAUNCHER and record the peak busbw in RUN_DIR.

    Without LAUNCHER, the launcher recorded in the run (node.json) is reused, the command up to
    the training script, once you confirm it (or with --yes): a run directory made by someone
    else could name any command.
    """
    from rich.console import Console

    from uberprof.analysis.diagnosis.links import CALIBRATION_FILE, read_calibration
    from uberprof.collect.calibrate import SweepFailed, recorded_launcher, run_sweep
    from uberprof.present.terminal.calibrate import render_calibration
    from uberprof.rundir import RunDir

    err = Console(stderr=True)
    run = RunDir(run_dir.resolve())
    if not run.is_run():
        raise click.BadParameter(f"{run_dir} is not a uberprof run directory", param_hint="RUN")
    prefix = list(launcher) or recorded_launcher(run)
    if not prefix:
        raise click.UsageError("cannot tell the job's launcher from the run; give it after --, "
                               "e.g. uberprof calibrate RUN -- torchrun --nproc_per_node=8")
    if not launcher:
        _consent_to_recorded(prefix, run.root, yes)
    try:
        run_sweep(prefix, run.root / CALIBRATION_FILE, int(max_mb * (1 << 20)), iters, timeout,
                  starting=lambda cmd: err.print(f"uberprof calibrate: {' '.join(cmd)}",
                                                 markup=False, highlight=False))
    except SweepFailed as exc:
        err.print(f"uberprof calibrate: {exc}", markup=False)
        sys.exit(exc.code)
    doc = read_calibration(run.root)
    if doc is None:
        # another node's rank 0 wrote it (local run folders): nothing to show here
        err.print("uberprof calibrate: done; rank 0 (on another node) wrote the results")
        return
    render_calibration(doc, Console())


def _consent_to_recorded(prefix: list[str], run: Path, yes: bool) -> None:
    """Never run what a run directory says unless the user says so: --yes, or a confirmed prompt
    (default No); without a terminal to ask on, refuse."""
    shown = shlex.join(prefix)
    if yes:
        return
    if not stdin_is_terminal():
        raise click.UsageError(f"{run} records the launcher `{shown}`; uberprof runs it only "
                               "when you say so: add --yes, or give the launcher after --")
    if not click.confirm(f"uberprof calibrate: run the launcher recorded in {run}:\n  {shown}\n"
                         "with the sweep script in place of the training script?",
                         default=False, err=True):
        click.echo("uberprof calibrate: nothing run", err=True)
        sys.exit(1)


def stdin_is_terminal() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()

