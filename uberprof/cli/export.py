"""`uberprof export RUN -o FILE`: every rank in one clock-aligned trace for a timeline viewer."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from uberprof.cli.options import derived_option, gap_threshold_option, workers_option
from uberprof.cli.output import cannot_write, unwritable
from uberprof.cli.params import INPUT_PATH, RANK_LIST, STEP_RANGE, FiniteRange

EPILOG = """\
\b
Examples:
  uberprof export uberprof-runs/RUN -o run.json.gz
  uberprof export uberprof-runs/RUN -o steps.json.gz --steps 20-21 --ranks 0-7
  uberprof export uberprof-runs/RUN -o run.pftrace --format perfetto
\b
Open the file in https://ui.perfetto.dev ("Open trace file"; it stays in your browser);
docs/export.md says how to view it offline.
"""


@click.command(epilog=EPILOG,
               short_help="Merge all ranks into one clock-aligned trace for Perfetto.")
@click.argument("path", type=INPUT_PATH)
@click.option("-o", "--output", "output", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The trace file to write (compressed unless --no-gzip: .gz is added to a "
                   "name without it, and the output says so).")
@click.option("--steps", type=STEP_RANGE, metavar="A-B", help="Only these steps (inclusive).")
@click.option("--ranks", type=RANK_LIST, metavar="LIST", help="Only these ranks, e.g. 0,2,4-7.")
@click.option("--no-counters", is_flag=True, help="Leave out GPU, NIC and CPU counter tracks.")
@click.option("--with-python", is_flag=True,
              help="Keep Python function events (with_stack traces; large, off by default).")
@click.option("--max-mb", type=FiniteRange(min=0), default=None,
              help="Size budget in MB of uncompressed output: the least useful events are "
                   "dropped first to fit (default 500; 0: no limit). Without --steps, when "
                   "the steps, collectives and marks alone exceed it, the traced steps around "
                   "the slowest that fit are written (a note says which).")
@click.option("--format", "fmt", type=click.Choice(["chrome", "perfetto"]), default=None,
              help="chrome: Trace Event Format JSON; perfetto: Perfetto's protobuf trace, "
                   "which lists the ranks in order in the Perfetto UI. Default: the one the "
                   "output's name says (.json, .json.gz: chrome; .pftrace: perfetto), else "
                   "perfetto when the `perfetto` package is installed, else chrome.")
@click.option("--no-gzip", is_flag=True, help="Write the file uncompressed.")
@gap_threshold_option("marked")
@workers_option("Processes for reading traces not analysed yet (default: one per CPU).")
@derived_option("--derived", "Where the analysis tables are (default: PATH/derived).")
def export(path: Path, output: Path, steps: tuple[int, int] | None, ranks: set[int] | None,
           no_counters: bool, with_python: bool, max_mb: float | None, fmt: str | None,
           no_gzip: bool,
           gap_threshold_us: float, workers: int | None, derived: Path | None) -> None:
    """Merge the traces of PATH (a run directory, a folder of Kineto traces, or one trace) into
    one timeline: a process per rank, sorted and named by rank, host and device, every thread
    and GPU stream a named track, timestamps on the aligned clock, uberprof's findings (idle
    gaps by cause, straggler waits, link-limited collectives) as marked ranges, and the node
    counters as counter tracks.
    """
    from uberprof.analysis.read import open_run
    from uberprof.analysis.tables.pool import keep_pandas_out
    from uberprof.present.export import DEFAULT_MAX_MB, ExportError, ExportOptions, export_trace
    from uberprof.present.export.perfetto import default_format
    from uberprof.present.terminal.progress import ReadProgress

    keep_pandas_out()
    err = Console(stderr=True)
    budget = DEFAULT_MAX_MB if max_mb is None else max_mb
    opts = ExportOptions(steps=steps, ranks=ranks,
                         counters=not no_counters, python=with_python,
                         max_bytes=int(budget * 1e6) if budget else None,
                         fmt=fmt or default_format(output), gzip=not no_gzip)

    def say(msg: str) -> None:
        err.print(f"uberprof export: {msg}", markup=False, highlight=False, soft_wrap=True)

    if (why := unwritable(output, makes_folders=True)) is not None:
        say(why)
        sys.exit(1)
    try:
        with ReadProgress(err) as update:
            opened = open_run(path, out=derived, threshold_ns=int(gap_threshold_us * 1000),
                              workers=workers, progress=update)
            res = export_trace(opened, output, opts, progress=update)
    except OSError as exc:  # reading is the analysis' (problems), so this is the output
        say(cannot_write(output, exc))
        sys.exit(1)
    except ExportError as exc:  # no traces (as the analysis says it), no rank left
        say(str(exc))
        sys.exit(1)
    except ImportError as exc:  # the perfetto format's library
        say(str(exc))
        sys.exit(1)
    for n in res.notes:
        say(n)
    for dr in res.dropped:
        mb = f", {dr['mb']} MB" if "mb" in dr else ""
        say(f"left out {dr['events']:,} {dr['what']}{mb}")
    say(f"wrote {res.path}: {len(res.ranks)} rank(s), {res.events:,} events, "
        f"{res.bytes_uncompressed / 1e6:.1f} MB ({res.bytes_file / 1e6:.1f} MB on disk) "
        f"in {res.seconds:.1f} s")
    if Path(res.path) != output:
        say(f"the file is {res.path}, not {output}: gzip-compressed, so .gz was added to the name "
            f"given (--no-gzip writes {output} uncompressed)")
    say("open it in https://ui.perfetto.dev (Open trace file); offline viewing: docs/export.md")
