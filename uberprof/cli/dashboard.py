"""`uberprof dashboard`: serve the Dash app of one run (`uberprof.dashboards`), safe by
default."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from uberprof.cli.params import INPUT_PATH
from uberprof.dashboards.nav import pages_text
from uberprof.dashboards.server import (
    AUTH_ENV,
    ServeError,
    check_exposure,
    credentials,
    is_loopback,
    make_server,
    serve,
)


@click.command(short_help="Serve the interactive dashboard of a run (Plotly Dash).")
@click.argument("path", type=INPUT_PATH)
@click.option("--port", type=click.IntRange(0, 65535), default=8050, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but a loopback address needs --auth.")
@click.option("--auth", "auth_text", metavar="USER:PASSWORD", default=None,
              help="Require HTTP basic authentication. Other users of this machine can read "
                   f"it in `ps`: prefer --auth-file or {AUTH_ENV}=user:password.")
@click.option("--auth-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Require HTTP basic authentication with the user:password on the first "
                   "line of this file (keep it private: chmod 600).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the analysis tables are (default: PATH/derived).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for reading traces when the analysis must run first.")
@click.option("--compare", "baselines", type=click.Path(exists=True, path_type=Path),
              multiple=True, metavar="A",
              help="Also compare PATH against run A (the baseline) on a /compare page, as "
                   "`uberprof diff A PATH` does. Given more than once (runs of the job at other "
                   "sizes), the page also shows their scaling, as `uberprof scaling` does.")
def dashboard(path: Path, port: int, host: str, auth_text: str | None, auth_file: Path | None,
              out: Path | None, workers: int | None, baselines: tuple[Path, ...]) -> None:
    """Serve the dashboard of PATH (a uberprof run directory or a folder of Kineto traces).

    Pages: {pages}.

    \b
    Runs `uberprof analyze` first when the tables are missing or
    stale, and reads the diagnosis `uberprof report` saved when it is fresh (else diagnoses
    while the pages are served: the overview's findings fill in when done); the URL answers at
    once, with a page that says how far that got until the run is ready. Listens on
    127.0.0.1 unless --host says otherwise; any other address requires credentials:
    --auth-file FILE or UBERPROF_DASHBOARD_AUTH=user:password (--auth user:password works
    too, but shows in `ps`). Serves nothing but this run's views.
    """
    import threading

    before = set(threading.enumerate())
    err = Console(stderr=True)
    say = Console(highlight=False)
    baseline = baselines[0] if baselines else None
    try:
        creds = credentials(auth_text, auth_file, os.environ)
        for note in creds.notes:
            err.print(f"uberprof dashboard: {note}", markup=False, soft_wrap=True)
        auth, source = creds.auth, creds.source
        check_exposure(host, auth)

        # the preparing page answers first: Dash (a second or two to import) comes later
        from uberprof.dashboards.preparing import Switch, preparing_app
        from uberprof.dashboards.server import loopback_hosts

        stage = ["starting"]
        allowed = loopback_hosts(host) if is_loopback(host) else None
        # the page's held question ends when the dashboard answers in its place
        switch = Switch(preparing_app(path.resolve().name, lambda: stage[0], auth, allowed,
                                      moved=lambda: switch.moved))
        server = make_server(host, port, switch)
    except ServeError as exc:
        err.print(f"uberprof dashboard: {exc}", markup=False)
        sys.exit(exc.code)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/"
    say.print(f"uberprof dashboard: [bold]{url}[/bold]  (Ctrl-C to stop; until the run is "
              "ready, the page says how far it got)")
    if auth is not None:
        say.print(f"  basic authentication required: user '{auth[0]}' (from {source}); "
                  "the connection is plain HTTP, so use it on trusted networks or behind TLS")
    if not is_loopback(host):
        say.print(f"  listening on {host}: reachable from other machines")
    sys.stdout.flush()

    def prepare() -> bool:
        """The run prepared and switched to (said), or False when there is nothing to show."""
        try:
            t0 = time.perf_counter()
            from uberprof.analysis.tables.pool import keep_pandas_out

            keep_pandas_out()  # pyarrow would import it (0.3 s of the start) for nothing here
            prepared = _prepare(path, out, workers, baseline, auth, allowed, stage, err,
                                baselines[1:], show=lambda app: switch.to(app.server))
            if prepared is None:
                return False
            app, data = prepared
            switch.to(app.server)  # before it says so: the next request sees the dashboard
            say.print(f"[dim]{len(data.ranks())} rank(s), {len(data.all_steps())} step(s), "
                      f"{len(data.traced_steps())} traced; ready in "
                      f"{time.perf_counter() - t0:.1f} s[/dim]")
            sys.stdout.flush()
            return True
        except Exception as exc:  # noqa: BLE001 - said, then the server stops
            err.print(f"uberprof dashboard: preparing {path} failed: {exc!r}", markup=False,
                      highlight=False)
            return False

    if not serve(server, prepare):
        sys.exit(1)
    _leave_while_working(before)  # stopped (Ctrl-C) while it may still be preparing the run


# the pages as the navigation bar has them (dashboards/nav.py), never a list kept by hand
dashboard.help = (dashboard.help or "").replace("{pages}", pages_text())


def _leave_while_working(before: set[Any]) -> None:
    """Exit 0 now when the dashboard was stopped (Ctrl-C) while a thread it started (not in
    `before`) still runs: one that analyses or diagnoses the run would be ended by the
    interpreter's shutdown inside Arrow's or DuckDB's C++ code (pthread_exit unwinding
    through it: "FATAL: exception not rethrown", SIGABRT, exit 134), its worker processes left
    behind. The workers are stopped first. Returns when no such thread runs."""
    import threading

    if not any(t not in before and t.is_alive() for t in threading.enumerate()):
        return
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _prepare(path: Path, out: Path | None, workers: int | None, baseline: Path | None,
             auth: tuple[str, str] | None, allowed: tuple[str, ...] | None, stage: list[str],
             err: Console, others: tuple[Path, ...] = (),
             show: Callable[[Any], None] | None = None) -> tuple[Any, Any] | None:
    """Open and warm the run while the server already answers (with the page of
    dashboards/preparing.py, `stage[0]` saying how far): (the dashboard's app, the run's
    RunData), or None when there is nothing to show (said). A diagnosis that was not saved is
    made on a thread while the dashboard is served (the overview says so, then fills in). The
    run is opened the one way a view opens it (`uberprof.analysis.read`: `open_tables`, then
    `diagnose_opened`, through RunData, which shows a failed diagnosis on its pages instead of
    stopping).

    Once the tables are read, a run that is not followed live and not compared is handed to
    `show` as an app whose pages wait for it (`preparing.RunSoon`): the browser loads Dash's
    scripts while the rest is read (its summary, diagnosis, counters, the overview built)."""
    from uberprof.dashboards.app import create_app, warm_overview
    from uberprof.dashboards.live import job_runs
    from uberprof.dashboards.preparing import RunSoon
    from uberprof.rundir import RunDir

    def step(what: str) -> Any:
        """Say `what` on the page and the terminal while it is done."""
        stage[0] = what
        return err.status(f"{what}…", spinner="dots")

    root = path.resolve()
    opened = _open_tables(root, out, workers, stage, err)
    soon = app = None  # both set where the app answers before the run is read
    if show is not None and baseline is None and not job_runs(root):
        soon = RunSoon(RunDir(root).run_id() or root.name)
        app = create_app(soon, auth=auth, allowed_hosts=allowed)
        show(app)
    try:
        data = _read(root, opened, out, workers, baseline, stage, step, err, others)
    except BaseException as exc:
        if soon is not None:
            soon.failed(repr(exc))
        raise
    if data is None:
        if soon is not None:
            soon.failed("nothing to show")
        return None
    if soon is not None:  # shown already: its pages wait for this
        warm_overview(data, app.server.logger)  # type: ignore[union-attr]
        soon.ready(data)
        return app, data
    with step("preparing the overview"):
        return create_app(data, auth=auth, allowed_hosts=allowed), data


def _read(root: Path, opened: Any, out: Path | None, workers: int | None,
          baseline: Path | None, stage: list[str], step: Callable[[str], Any], err: Console,
          others: tuple[Path, ...]) -> Any:
    """`_prepare` once the tables are read: the run's `RunData` with its diagnosis (saved, or
    being made on a thread), counters and comparison; None when there is nothing to show
    (said)."""
    from uberprof.dashboards.data import RunData

    with step("reading the run's tables"):
        data = RunData.of(opened, out=out, workers=workers,
                          baseline=baseline.resolve() if baseline is not None else None)
    for n in data.notices:
        err.print(f"uberprof dashboard: {n}", markup=False, highlight=False)
    if not data.has_traces and data.steps.num_rows == 0:
        err.print(f"uberprof dashboard: nothing to show in {root}: no trace and no step "
                  "timeline (is it a uberprof run directory or a folder of Kineto traces?)",
                  markup=False, highlight=False)
        return None
    ranks = len(data.ranks())
    if data.has_traces:
        with step("reading the saved diagnosis"):
            saved = data.read_saved_diagnosis()  # read.diagnose_opened(make=False)
        if not saved:  # read.diagnose_opened on a thread; the overview fills in when done
            stage[0] = f"diagnosing {ranks} rank(s)"
            t0 = time.perf_counter()
            err.print(f"uberprof dashboard: diagnosing {ranks} rank(s) while the pages are "
                      "served; the overview's findings fill in when it is done", markup=False,
                      highlight=False)

            def diagnosed() -> None:
                err.print(f"uberprof dashboard: diagnosed in {time.perf_counter() - t0:.1f} s"
                          + (f" ({data.diagnosis_error})" if data.diagnosis_error else ""),
                          markup=False, highlight=False)
            data.diagnose_in_background(diagnosed)
    with step("reading the counters"):
        data.warm()
    if data.baseline is not None:
        from uberprof.dashboards.queries.compare import compare_with

        with step(f"comparing with {baseline}"):
            data.comparison = compare_with(data.baseline, root, out=out, workers=workers,
                                           others=tuple(p.resolve() for p in others))
        for why in (data.comparison.error, data.comparison.scaling_error):
            if why:
                err.print(f"uberprof dashboard: --compare: {why}", markup=False,
                          highlight=False)
    for p in data.problems[:5]:
        err.print(f"uberprof dashboard: {p}", markup=False, highlight=False)
    return data


def _open_tables(root: Path, out: Path | None, workers: int | None, stage: list[str],
                 err: Console) -> Any:
    """`read.open_tables` of the run, with the same progress bar as `uberprof analyze` (and
    `stage[0]` saying how far)."""
    from uberprof.analysis.diagnosis.model import READING_TRACES
    from uberprof.analysis.read import open_tables

    stage[0] = "reading the run"
    try:
        from uberprof.present.terminal.progress import ReadProgress
    except ImportError:  # pragma: no cover - it moved: no bar, same work
        return open_tables(root, out=out, workers=workers)
    with ReadProgress(err) as update:
        def progress(done: int, total: int, label: str, what: str = READING_TRACES) -> None:
            stage[0] = f"{what}: {done} of {total}"
            update(done, total, label, what)

        return open_tables(root, out=out, workers=workers, progress=progress)
