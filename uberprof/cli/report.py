"""`uberprof report RUN [--json] [--html FILE]`: what holds the job back, ranked, with evidence."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from uberprof.cli.options import (
    dask_executor_or_exit,
    dask_option,
    derived_option,
    gap_threshold_option,
    workers_option,
)
from uberprof.cli.output import cannot_write, unwritable
from uberprof.cli.params import INPUT_PATH

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.model import Diagnosis

EPILOG = """\
\b
Examples:
  uberprof report uberprof-runs/RUN
  uberprof report uberprof-runs/RUN --html report.html     (one file to share)
  uberprof report ./tb_traces --json > diagnosis.json       (any folder of Kineto traces)
"""


@click.command(epilog=EPILOG,
               short_help="Diagnose what holds a run back, with evidence and remedies.")
@click.argument("path", type=INPUT_PATH)
@click.option("--json", "as_json", is_flag=True,
              help="Print the diagnosis as JSON (stable; docs/json.md).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a self-contained HTML report to this file.")
@gap_threshold_option("reported")
@workers_option()
@derived_option("--out", "Where derived tables go (default: PATH/derived).")
@dask_option("Read traces and diagnose each rank")
def report(path: Path, as_json: bool, html_file: Path | None, gap_threshold_us: float,
           workers: int | None, out: Path | None, dask_address: str | None) -> None:
    """Diagnose PATH (a run directory, a folder of Kineto traces, or one trace).

    Reads the traces first when their tables are missing or stale (as `uberprof analyze`),
    then aligns clocks, matches collectives and reports stragglers, idle gaps and their causes,
    exposed communication and link limits, ranked by the time they cost. The diagnosis is
    kept beside the tables and reused while the traces and options stay the same.
    """
    import orjson

    from uberprof.analysis.read import empty_report, open_run
    from uberprof.analysis.tables.pool import keep_pandas_out
    from uberprof.present.terminal.progress import ReadProgress

    if html_file is None:
        keep_pandas_out()
    err = Console(stderr=True)
    if html_file is not None and (why := unwritable(html_file)) is not None:
        err.print(f"uberprof report: {why}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)

    def unsaved(exc: OSError) -> None:
        # kept for the dashboard, export and notebooks; a read-only place only costs a notice
        err.print(f"uberprof report: could not save the diagnosis tables ({exc})", markup=False)

    with ExitStack() as stack:
        executor = dask_executor_or_exit(stack, dask_address, workers, "report")
        with ReadProgress(err) as update:
            opened = open_run(path, out=out, threshold_ns=int(gap_threshold_us * 1000),
                              workers=workers, progress=update, executor=executor,
                              on_save_error=unsaved)
    d = opened.diagnosis
    if d is None:  # nothing to diagnose: no trace, and no hang or crash recorded
        if as_json:
            sys.stdout.buffer.write(orjson.dumps(empty_report(path, opened.problems),
                                                 option=orjson.OPT_INDENT_2) + b"\n")
        err.print(f"uberprof report: {opened.no_traces}", markup=False, highlight=False,
                  soft_wrap=True)
        sys.exit(1)
    failed = False
    if html_file is not None:
        from uberprof.present.report_html import write_html

        try:
            write_html(d, html_file)
            err.print(f"uberprof report: wrote {html_file}", markup=False, highlight=False)
        except OSError as exc:
            err.print(f"uberprof report: {cannot_write(html_file, exc)}", markup=False,
                      highlight=False, soft_wrap=True)
            failed = True
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(d.to_json(), option=orjson.OPT_INDENT_2
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        from uberprof.present.report_terminal import render_report

        render_report(d, Console())
    from uberprof.analysis.diagnosis.findings.kind import FAILURE

    failure = next((f for f in d.findings if f.role == FAILURE), None)
    if failure is not None and not failed:  # the verdict: the job hung or crashed, whatever was analysed
        err.print(f"uberprof report: the job failed ({failure.kind}; the first finding); "
                  f"exit code {FAILED_JOB}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(FAILED_JOB)
    if not analysed(d):
        err.print("uberprof report: nothing could be analysed: no rank has a usable trace "
                  "window (see the problems); exit code 1", markup=False, highlight=False,
                  soft_wrap=True)
    if failed or not analysed(d):
        sys.exit(1)


FAILED_JOB = 3  # the exit code of a report that found a hang or a crash (docs/report.md)


def analysed(d: Diagnosis) -> bool:
    """Whether any rank was analysed: it has traced steps (`run.analysed_steps`). Ranks known
    only from their step timelines, or a hang or crash found without a trace, are reported but
    are not an analysis: the exit code is 1 then (docs/report.md), so that a script never takes
    step times alone for a diagnosis."""
    return bool(d.ranks) and bool(d.run.get("analysed_steps"))
