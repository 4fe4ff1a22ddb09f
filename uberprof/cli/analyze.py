"""`uberprof analyze`: per-rank, per-step compute / communication / idle from Kineto traces."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

MAX_ROWS = 64


@click.command(short_help="Break each rank's time down into compute, communication and idle.")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (see README).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for reading traces (default: one per CPU).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write derived tables (default: PATH/derived).")
@click.option("--force", is_flag=True, help="Analyse every trace again, even unchanged ones.")
@click.option("--dask", "dask_address", metavar="ADDRESS", default=None,
              help="Read traces on a Dask cluster (scheduler address, or 'local' for one on "
                   "this machine with --workers processes); needs uberprof[dask] and a file "
                   "system shared with the workers (see README).")
def analyze(path: Path, as_json: bool, workers: int | None, out: Path | None,
            force: bool, dask_address: str | None) -> None:
    """Analyse PATH: a uberprof run directory, any folder of Kineto traces, or one trace.

    Writes Parquet tables to PATH/derived (or --out; PATH read-only: a cache folder), skips
    traces already analysed, and prints one line per rank. Exits with 1 only when no rank
    could be analysed.
    """
    import orjson

    from uberprof.analysis.pipeline import analyze as run_analysis
    from uberprof.analysis.pool import keep_pandas_out
    from uberprof.ingest.discover import NoTraces

    keep_pandas_out()  # this process and its workers never need it (a no-op if already loaded)

    err = Console(stderr=True)
    try:
        with ExitStack() as stack:
            executor = _dask(stack, dask_address, workers)
            update = stack.enter_context(_progress(err))
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
        sys.stdout.buffer.write(orjson.dumps(result.summary, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        render(result.ranks, result.summary["problems"], result.derived, result.analysed,
               len(result.inputs), Console())
    if not result.ok:
        sys.exit(1)


def _dask(stack: ExitStack, address: str | None, workers: int | None) -> Any:
    """The Dask executor for --dask (None without it), closed with `stack`; a clear message
    and exit code 2 when Dask is missing or the cluster cannot be reached."""
    if address is None:
        return None
    from uberprof.analysis.distributed import DaskUnavailable, dask_executor

    try:
        return stack.enter_context(dask_executor(address, workers=workers))
    except DaskUnavailable as exc:
        Console(stderr=True).print(f"uberprof analyze: {exc}", markup=False, highlight=False)
        sys.exit(2)


class _progress:
    """A rich progress bar on stderr while traces are read (plain terminal only)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self):  # type: ignore[no-untyped-def]
        if not self.console.is_terminal:
            return lambda done, total, label: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        # No refresh thread: the workers are forked, and forking a process with threads that
        # may hold locks is asking for deadlocks. The bar is redrawn on every update instead.
        self.bar = Progress(TextColumn("reading traces"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("[dim]{task.description}"),
                            console=self.console, transient=True, auto_refresh=False)

        def update(done: int, total: int, label: str) -> None:
            if total == 0:
                return
            if self.task is None:
                self.bar.start()
                self.task = self.bar.add_task("", total=total)
            self.bar.update(self.task, completed=done, description=label[-60:], refresh=True)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.stop()


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def render(ranks: list[dict[str, Any]], problems: list[str], derived: Path, analysed: int,
           inputs: int, console: Console) -> None:
    # Two-line headers and no column rules: fits 80 columns.
    table = Table(show_edge=False, header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("rank", "device", "steps", "step\nms", "p90\nms", "idle\n%", "comp\n%",
                "non-\ncomp %", "over-\nlap %", "exp.\ncomm %"):
        table.add_column(col, justify="left" if col == "device" else "right")
    shown = ranks if len(ranks) <= MAX_ROWS else ranks[:MAX_ROWS]
    for r in shown:
        device = {"device": r["device_type"], "cpu": "cpu"}.get(r["mode"], "no trace")
        table.add_row(str(r["rank"]), device, str(r["steps"]), _ms(r["step_time_median_ms"]),
                      _ms(r["step_time_p90_ms"]), _pct(r["idle_pct"]), _pct(r["compute_pct"]),
                      _pct(r["non_compute_pct"]), _pct(r["overlap_pct"]),
                      _pct(r["exposed_comm_pct"]))
    if ranks:
        console.print(table)
    if len(ranks) > MAX_ROWS:
        console.print(f"[dim]... {len(ranks) - MAX_ROWS} more ranks: see --json or "
                      f"{derived / 'ranks.parquet'}[/dim]")
    reused = inputs - analysed
    console.print(f"[dim]{inputs} trace(s), {analysed} read now"
                  + (f", {reused} unchanged since the last analysis" if reused else "")
                  + f"; tables in {derived}[/dim]", highlight=False)
    if not ranks:
        console.print("[bold red]no rank could be analysed[/bold red]")
    if problems:
        console.print("[bold red]problems[/bold red]")
        for p in problems:
            console.print(f"  - {p}", markup=False, highlight=False)
