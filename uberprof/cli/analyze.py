"""`uberprof analyze`: per-rank, per-step compute / communication / idle from Kineto traces."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

import click
from rich.console import Console

from uberprof.cli.options import (
    dask_executor_or_exit,
    dask_option,
    derived_option,
    workers_option,
)
from uberprof.cli.params import INPUT_PATH
from uberprof.present.terminal.analyze import render_analysis
from uberprof.present.terminal.progress import ReadProgress


@click.command(short_help="Break each rank's time down into compute, communication and idle.")
@click.argument("path", type=INPUT_PATH)
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary as JSON (docs/analyze.md).")
@workers_option()
@derived_option("--out", "Where to write derived tables (default: PATH/derived).")
@click.option("--force", is_flag=True, help="Analyse every trace again, even unchanged ones.")
@dask_option("Read traces")
def analyze(path: Path, as_json: bool, workers: int | None, out: Path | None,
            force: bool, dask_address: str | None) -> None:
    """Analyse PATH: a uberprof run directory, any folder of Kineto traces, or one trace.

    Writes Parquet tables to PATH/derived (or --out; PATH read-only: a cache folder), skips
    traces already analysed, and prints one line per rank. Exits with 1 only when no rank
    could be analysed.
    """
    import orjson

    from uberprof.analysis.tables.pipeline import analyze as run_analysis
    from uberprof.analysis.tables.pool import keep_pandas_out
    from uberprof.ingest.discover import NoTraces

    keep_pandas_out()  # this process and its workers never need it (a no-op if already loaded)

    err = Console(stderr=True)
    try:
        with ExitStack() as stack:
            executor = dask_executor_or_exit(stack, dask_address, workers, "analyze")
            update = stack.enter_context(ReadProgress(err))
            result = run_analysis(path, out=out, workers=workers, progress=update, force=force,
                                  executor=executor)
    except NoTraces as exc:
        if as_json:
            sys.stdout.buffer.write(orjson.dumps({"ranks": [], "problems": [str(exc)]},
                                                 option=orjson.OPT_INDENT_2) + b"\n")
        err.print(f"uberprof analyze: {exc}", markup=False, highlight=False)
        sys.exit(1)
    for n in result.notices:
        err.print(f"uberprof analyze: {n}", markup=False, highlight=False)
    if as_json:
        from uberprof.present.terminal.analyze import render_problems

        sys.stdout.buffer.write(orjson.dumps(result.summary, option=orjson.OPT_INDENT_2) + b"\n")
        render_problems(result.summary["problems"], not result.ranks, err)
    else:
        render_analysis(result.ranks, result.summary["problems"], result.derived,
                        result.analysed, len(result.inputs), Console(), err)
    if not result.ok:
        sys.exit(1)

