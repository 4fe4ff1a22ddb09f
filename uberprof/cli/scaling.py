"""`uberprof scaling RUN...`: throughput per rank, scaling efficiency against the smallest run,
and where the lost efficiency goes."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from uberprof.cli.options import gap_threshold_option, workers_option
from uberprof.cli.output import cannot_write, unwritable
from uberprof.cli.params import INPUT_PATH

EPILOG = """\
\b
Examples:
  uberprof scaling uberprof-runs/ddp-2 uberprof-runs/ddp-4 uberprof-runs/ddp-8
  uberprof scaling runs/n1 runs/n2 runs/n4 --batch 32        (32 samples per rank and step)
  uberprof scaling runs/b16 runs/b32 --batch 16 --batch 32   (one per run, in order)
  uberprof scaling runs/* --json > scaling.json
  uberprof scaling runs/* --html scaling.html                (efficiency and lost-time plots)
"""


@click.command(epilog=EPILOG,
               short_help="Scaling efficiency across runs of one job, and where it is lost.")
@click.argument("runs", nargs=-1, required=True, metavar="RUN RUN...", type=INPUT_PATH)
@click.option("--json", "as_json", is_flag=True,
              help="Print the table as JSON (stable; docs/scaling.md).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a self-contained HTML page with the plots to this file.")
@click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True, metavar="N",
              help="Samples per step on each rank: once for every run, or once per run in the "
                   "order given. Default: the script's --batch/--batch-size argument; without "
                   "it, throughput is in steps/s.")
@click.option("--force", is_flag=True,
              help="Compare runs even when their script or arguments differ (listed).")
@gap_threshold_option("counted (as `uberprof report`)")
@workers_option()
def scaling(runs: tuple[Path, ...], as_json: bool, html_file: Path | None,
            batches: tuple[int, ...], force: bool, gap_threshold_us: float,
            workers: int | None) -> None:
    """Compare runs of one job at different world sizes, node counts or batch sizes (each a
    run directory, or a folder of Kineto traces).

    Each run is analysed and diagnosed as `uberprof report` does (a fresh saved diagnosis is
    reused). The table gives per run its world size, nodes, ranks, per-rank batch, step time,
    throughput per rank and in total, the scaling efficiency (throughput per rank over the
    smallest run's), and the change in step time against the smallest run split into exposed
    communication per process group, waiting for peers, stragglers, idle time and compute,
    from each run's critical path. docs/scaling.md defines every column.
    """
    import orjson

    from uberprof.analysis.diff.scaling import ScalingError, read_scaling_point
    from uberprof.analysis.diff.scaling import scaling as compare_scaling
    from uberprof.analysis.tables.pool import keep_pandas_out
    from uberprof.present.terminal.progress import ReadProgress

    err = Console(stderr=True)

    def fail(message: str) -> None:
        err.print(f"uberprof scaling: {message}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)

    if len(runs) < 2:
        fail(f"needs at least 2 runs of one job, got {len(runs)} ({runs[0]})")
    if html_file is None:
        keep_pandas_out()
    elif (why := unwritable(html_file)) is not None:
        fail(why)
    points = []
    try:
        for path in runs:
            with ReadProgress(err) as update:
                points.append(read_scaling_point(path, workers=workers, progress=update,
                                                 threshold_ns=int(gap_threshold_us * 1000)))
        result = compare_scaling(points, force=force, batches=list(batches) or None)
    except ScalingError as exc:
        fail(str(exc))
    doc = result.to_json()
    if html_file is not None:
        from uberprof.present.scaling_html import write_scaling_html

        try:
            write_scaling_html(doc, html_file)
            err.print(f"uberprof scaling: wrote {html_file}", markup=False, highlight=False)
        except OSError as exc:
            fail(cannot_write(html_file, exc))
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        from uberprof.present.scaling_terminal import render_scaling

        render_scaling(doc, Console())
