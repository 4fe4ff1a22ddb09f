"""`uberprof diff A B`: what changed between two runs, and whether it is beyond noise."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from uberprof.cli.params import INPUT_PATH, RANK_LIST, STEP_RANGE, FiniteRange

EPILOG = """\
\b
Examples:
  uberprof diff uberprof-runs/yesterday uberprof-runs/today
  uberprof diff runA runB --steps 10-40 --ranks 0-7
  uberprof diff ./tb_old/rank0.json.gz ./tb_new/rank0.json.gz --json > diff.json
  uberprof diff runA runB --html diff.html               (one file to share)
"""


@click.command(epilog=EPILOG, short_help="Compare two runs: what changed, and is it real.")
@click.argument("a", type=INPUT_PATH)
@click.argument("b", type=INPUT_PATH)
@click.option("--json", "as_json", is_flag=True,
              help="Print the comparison as JSON (stable; docs/diff.md).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a self-contained HTML comparison to this file.")
@click.option("--steps", type=STEP_RANGE, metavar="A-B",
              help="Only these steps (inclusive) of both runs.")
@click.option("--ranks", type=RANK_LIST, metavar="LIST",
              help="Only these ranks of both runs, e.g. 0,2,4-7.")
@click.option("--min-change-pct", type=FiniteRange(min=0), default=5.0,
              show_default=True,
              help="Smallest change in median step time reported as significant.")
@click.option("--gap-threshold-us", type=FiniteRange(min=0), default=50.0,
              show_default=True, help="Shortest device idle gap counted by cause.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for reading traces (default: one per CPU).")
def diff(a: Path, b: Path, as_json: bool, html_file: Path | None,
         steps: tuple[int, int] | None, ranks: set[int] | None, min_change_pct: float, gap_threshold_us: float,
         workers: int | None) -> None:
    """Compare run B against run A (each a run directory, a folder of Kineto traces, or one
    trace): step time and whether the change is beyond noise, where the time moved, the
    operators and kernels, collectives, counters, metadata and findings that changed. Runs are
    analysed first where needed. Times are per step, so runs with other ranks or steps compare.
    """
    import orjson

    from uberprof.analysis.diff import compare, profile_run
    from uberprof.analysis.diff.profile import NothingToCompare
    from uberprof.analysis.tables.pool import keep_pandas_out
    from uberprof.ingest.discover import NoTraces
    from uberprof.present.terminal.progress import ReadProgress

    if html_file is None:
        keep_pandas_out()
    err = Console(stderr=True)
    profiles = []
    for path in (a, b):
        try:
            with ReadProgress(err) as update:
                profiles.append(profile_run(path, ranks=ranks, steps=steps, workers=workers,
                                            progress=update,
                                            threshold_ns=int(gap_threshold_us * 1000)))
        except (NoTraces, NothingToCompare) as exc:
            err.print(f"uberprof diff: {exc}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(1)
    c = compare(profiles[0], profiles[1], min_change_pct=min_change_pct)
    if html_file is not None:
        from uberprof.present.diff_html import write_diff_html

        write_diff_html(c, html_file)
        err.print(f"uberprof diff: wrote {html_file}", markup=False, highlight=False)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(c.to_json(), option=orjson.OPT_INDENT_2
                                             | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        from uberprof.present.diff_terminal import render_diff

        render_diff(c, Console())
