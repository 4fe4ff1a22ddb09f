"""How `uberprof dashboard` starts: the server listens at once (the preparing page), the run is
opened and warmed on a thread, the dashboard's app takes the preparing page's place, and a stop
(Ctrl-C) while a thread still works ends the worker processes first.

The CLI parses the options, calls `start` and hands it a `StartupView`, the presenter that says
what happens (`uberprof/present/terminal/dashboard.py` on a terminal)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from uberprof.dashboards.server import (
    ServeError,
    check_exposure,
    credentials,
    is_loopback,
    make_server,
    serve,
)

__all__ = ["Options", "StartupView", "start"]


class StartupView(Protocol):
    """What the start-up says, and where."""

    def note(self, line: str) -> None:
        """One line about the start (stderr), without the command's name."""

    def listening(self, url: str, auth: tuple[str, str] | None, source: str | None,
                  exposed_on: str | None) -> None:
        """The server answers at `url` (`exposed_on`: the address, when it is not a loopback
        one)."""

    def ready(self, ranks: int, steps: int, traced: int, seconds: float) -> None:
        """The run is prepared and the dashboard answers."""

    def doing(self, what: str) -> AbstractContextManager[Any]:
        """`what` is being done (a spinner)."""

    def reading(self) -> AbstractContextManager[Callable[..., None]]:
        """While traces are read: yields a `model.Progress` (a bar)."""


@dataclass
class Options:
    """`uberprof dashboard`'s options (docs/dashboard.md)."""

    path: Path
    port: int = 8050
    host: str = "127.0.0.1"
    auth_text: str | None = None
    auth_file: Path | None = None
    out: Path | None = None
    workers: int | None = None
    baselines: tuple[Path, ...] = field(default_factory=tuple)


def start(opts: Options, view: StartupView, environ: Mapping[str, str] = os.environ) -> int:
    """Serve the dashboard of `opts.path` until stopped: the exit status (0, or why not)."""
    before = set(threading.enumerate())
    try:
        creds = credentials(opts.auth_text, opts.auth_file, environ)
        for note in creds.notes:
            view.note(note)
        auth = creds.auth
        check_exposure(opts.host, auth)

        # the preparing page answers first: Dash (a second or two to import) comes later
        from uberprof.dashboards.preparing import Switch, preparing_app
        from uberprof.dashboards.server import loopback_hosts

        stage = ["starting"]
        allowed = loopback_hosts(opts.host) if is_loopback(opts.host) else None
        # the page's held question ends when the dashboard answers in its place
        switch = Switch(preparing_app(opts.path.resolve().name, lambda: stage[0], auth, allowed,
                                      moved=lambda: switch.moved))
        server = make_server(opts.host, opts.port, switch)
    except ServeError as exc:
        view.note(str(exc))
        return exc.code
    shown = f"[{opts.host}]" if ":" in opts.host else opts.host
    view.listening(f"http://{shown}:{server.server_port}/", auth, creds.source,
                   None if is_loopback(opts.host) else opts.host)

    def prepare() -> bool:
        """The run prepared and switched to (said), or False when there is nothing to show."""
        try:
            t0 = time.perf_counter()
            from uberprof.analysis.read import keep_pandas_out
            from uberprof.rundir.ranks import listed_once

            keep_pandas_out()  # pyarrow would import it (0.3 s of the start) for nothing here
            with listed_once():  # the analysis, diagnosis and counters each list the ranks
                prepared = _prepare(opts, auth, allowed, stage, view,
                                    show=lambda app: switch.to(app.server))
            if prepared is None:
                return False
            app, data = prepared
            switch.to(app.server)  # before it says so: the next request sees the dashboard
            view.ready(len(data.ranks()), len(data.all_steps()), len(data.traced_steps()),
                       time.perf_counter() - t0)
            return True
        except Exception as exc:  # noqa: BLE001 - said, then the server stops
            view.note(f"preparing {opts.path} failed: {exc!r}")
            return False

    if not serve(server, prepare):
        return 1
    _leave_while_working(before)  # stopped (Ctrl-C) while it may still be preparing the run
    return 0


def _leave_while_working(before: set[Any]) -> None:
    """Exit 0 now when the dashboard was stopped (Ctrl-C) while a thread it started (not in
    `before`) still runs: one that analyses or diagnoses the run would be ended by the
    interpreter's shutdown inside Arrow's or DuckDB's C++ code (pthread_exit unwinding
    through it: "FATAL: exception not rethrown", SIGABRT, exit 134), its worker processes left
    behind. The workers are stopped first. Returns when no such thread runs."""
    if not any(t not in before and t.is_alive() for t in threading.enumerate()):
        return
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _prepare(opts: Options, auth: tuple[str, str] | None, allowed: tuple[str, ...] | None,
             stage: list[str], view: StartupView,
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
        return view.doing(what)

    root = opts.path.resolve()
    opened = _open_tables(root, opts, stage, view)
    soon = app = None  # both set where the app answers before the run is read
    if show is not None and not opts.baselines and not job_runs(root):
        soon = RunSoon(RunDir(root).run_id() or root.name)
        app = create_app(soon, auth=auth, allowed_hosts=allowed)
        show(app)
    try:
        data = _read(root, opened, opts, stage, step, view)
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


def _read(root: Path, opened: Any, opts: Options, stage: list[str],
          step: Callable[[str], Any], view: StartupView) -> Any:
    """`_prepare` once the tables are read: the run's `RunData` with its diagnosis (saved, or
    being made on a thread), counters and comparison; None when there is nothing to show
    (said)."""
    from uberprof.dashboards.data import RunData

    baseline = opts.baselines[0] if opts.baselines else None
    with step("reading the run's tables"):
        data = RunData.of(opened, out=opts.out, workers=opts.workers,
                          baseline=baseline.resolve() if baseline is not None else None)
    for n in data.notices:
        view.note(n)
    if not data.has_traces and data.steps.num_rows == 0:
        view.note(f"nothing to show in {root}: no trace and no step timeline (is it a uberprof "
                  "run directory or a folder of Kineto traces?)")
        return None
    if data.has_traces:
        with step("reading the saved diagnosis"):
            saved = data.read_saved_diagnosis()  # read.diagnose_opened(make=False)
        if not saved:  # read.diagnose_opened on a thread; the overview fills in when done
            _diagnose_in_background(data, stage, view)
    with step("reading the counters"):
        data.warm()
    if data.baseline is not None:
        from uberprof.dashboards.queries.compare import compare_with

        with step(f"comparing with {baseline}"):
            data.comparison = compare_with(data.baseline, root, out=opts.out,
                                           workers=opts.workers,
                                           others=tuple(p.resolve() for p in opts.baselines[1:]))
        for why in (data.comparison.error, data.comparison.scaling_error):
            if why:
                view.note(f"--compare: {why}")
    for p in data.problems[:5]:
        view.note(p)
    return data


def _diagnose_in_background(data: Any, stage: list[str], view: StartupView) -> None:
    """`read.diagnose_opened` of `data` on a thread, said when it starts and ends."""
    ranks = len(data.ranks())
    stage[0] = f"diagnosing {ranks} rank(s)"
    t0 = time.perf_counter()
    view.note(f"diagnosing {ranks} rank(s) while the pages are served; the overview's findings "
              "fill in when it is done")

    def diagnosed() -> None:
        view.note(f"diagnosed in {time.perf_counter() - t0:.1f} s"
                  + (f" ({data.diagnosis_error})" if data.diagnosis_error else ""))
    data.diagnose_in_background(diagnosed)


def _open_tables(root: Path, opts: Options, stage: list[str], view: StartupView) -> Any:
    """`read.open_tables` of the run, with the view's progress (and `stage[0]` saying how
    far)."""
    from uberprof.analysis.progress import READING_TRACES
    from uberprof.analysis.read import open_tables

    stage[0] = "reading the run"
    with view.reading() as update:
        def progress(done: int, total: int, label: str, what: str = READING_TRACES) -> None:
            stage[0] = f"{what}: {done} of {total}"
            update(done, total, label, what)

        return open_tables(root, out=opts.out, workers=opts.workers, progress=progress)
