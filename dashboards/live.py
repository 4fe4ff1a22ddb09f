"""The dashboard following a running job. Above every page: a status line ("running · N steps ·
last step 2 s ago") and the straggler and data-stall indications of the step timelines
(`uberprof.analysis.read.live_signals`, the same as `uberprof watch`'s). Every few seconds the
open page asks what is new; what the job appended is read incrementally
(`uberprof.rundir.follow`), and the page's growing parts are redrawn in place, without a
reload: the overview's step-time heat map, the steps page's recent step times and step picker,
the counters page's figure.

Heavier news is handled in a background thread, then shown by rebuilding the open page in place:
- a new trace window: the run is opened again (`read.open_tables`: only the new inputs are
  analysed, the derived tables are reused when fresh), so its steps become selectable;
- the end of the job: the whole run is analysed and diagnosed as `uberprof report` would (the
  saved diagnosis is reused when fresh); the status says so, then the timer stops.
Runs whose job has ended get none of this.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from uberprof.analysis.read import live_signals, open_tables
from uberprof.dashboards import live_trace, ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.ui import Selection
from uberprof.rundir import RunDir
from uberprof.rundir.follow import LiveState, RunFollower, trace_files

__all__ = ["EXTENSION", "INTERVAL_MS", "Live", "job_runs", "live_for"]

EXTENSION = "uberprof_live"  # where the app's `Live` is kept: flask_app.extensions[EXTENSION]

INTERVAL_MS = 3000  # how often an open page asks for what is new


class Live:
    """A run being followed: one follower shared by every browser tab (polls are serialised:
    they advance the same byte offsets). `current()` is the run as the pages show it now."""

    def __init__(self, data: RunData, follower: RunFollower, first: LiveState) -> None:
        self.follower = follower
        self.state = first
        self.generation = 0  # bumped when the open page must be rebuilt (new analysis)
        self.final = False  # the whole run was diagnosed after the job ended
        self.news = ""  # what the background work is doing, or what it found
        self._base = data  # the run as last analysed
        self._data = data.followed(follower)
        self._rows = follower.rows()
        self._traces = trace_files(data.root)
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._signals: tuple[tuple[int, bool], list[Any]] = ((-1, False), [])

    def current(self) -> RunData:
        """The run as the pages show it: the last analysis, with the steps read since."""
        with self._lock:
            return self._data

    def poll(self) -> LiveState:
        """Read what is new; start the background work the news calls for."""
        with self._lock:
            state = self.state = self.follower.poll()
            rows = self.follower.rows()
            if rows != self._rows and not self.final:
                self._rows = rows
                self._data = self._base.followed(self.follower)
            busy = self._worker is not None and self._worker.is_alive()
            if busy or self.final:
                return state
            if state.ended:
                self._start(final=True, traces=trace_files(self._base.root))
            else:
                traces = trace_files(self._base.root)
                if traces != self._traces:
                    self._start(final=False, traces=traces)
            return state

    def _start(self, final: bool, traces: frozenset[str]) -> None:
        self.news = ("the job has ended: diagnosing the whole run…" if final
                     else "a new trace window: analysing it…")
        self._worker = threading.Thread(target=self._analyse, args=(final, traces),
                                        name="uberprof-live-analysis", daemon=True)
        self._worker.start()

    def _analyse(self, final: bool, traces: frozenset[str]) -> None:
        """Open the run again (new inputs only) and diagnose it, then swap it in."""
        old = self._base
        try:
            new = RunData.of(open_tables(old.root, out=old.out, workers=old.workers),
                             out=old.out, workers=old.workers, baseline=old.baseline,
                             comparison=old.comparison)
            new.warm()  # the diagnosis: read back when fresh, else made (and saved)
            news = "" if new.diagnosis_error is None else \
                f"the diagnosis failed: {new.diagnosis_error}"
        except Exception as exc:  # noqa: BLE001 - the page keeps what it shows, and says so
            new, news = old, f"analysing the run again failed: {type(exc).__name__}: {exc}"
        with self._lock:
            self._base = new
            self._traces = traces
            self._data = new if final else new.followed(self.follower)
            self.final = final
            self.news = news
            self.generation += 1

    def wait_final(self, timeout: float) -> bool:
        """After the job ended: whether the final diagnosis is on the pages, waiting up to
        `timeout` s for it (polling, so that it starts even with no page open)."""
        deadline = time.monotonic() + timeout
        while not self.final and time.monotonic() < deadline:
            self.poll()
            worker = self._worker
            if worker is not None and worker.is_alive():
                worker.join(max(0.0, min(1.0, deadline - time.monotonic())))
            elif not self.final:
                time.sleep(0.2)
        return self.final

    def status(self, state: LiveState) -> str:
        line = state.status_line()
        if self.final:
            line += " · final diagnosis below"
        if self.news:
            line += " · " + self.news
        return line

    def signals(self) -> Any:
        """The indications of the step timelines (`read.live_signals`), asked again when
        steps arrived or the final diagnosis was made (its straggler verdict replaces theirs)."""
        with self._lock:
            key = (self._rows, self.final)
            if self._signals[0] != key:
                self._signals = (key, live_signals(self.follower))
            found = self._signals[1]
        return [html.Div([html.Span(s.kind.replace("_", " ")
                                    + (" · suspected" if s.confidence == "suspected" else ""),
                                    className="kind"),
                          " ", s.title, html.Span(f" · {s.source}", className="source")],
                         className=f"live-signal {s.kind} {s.confidence}",
                         title=s.test.get("sentence", ""), **{"data-rank": str(s.rank)})
                for s in found]

    def layout(self) -> list[Any]:
        """The timer, what the page has seen, the status line, the indications and the
        "record a trace" button (`live_trace.py`)."""
        return [dcc.Interval(id="live-tick", interval=INTERVAL_MS, disabled=False),
                dcc.Store(id="live-generation", data=self.generation),
                dcc.Store(id="live-rows", data=self._rows),
                ui.notice(self.status(self.state), "info", id="live-status"),
                html.Div(self.signals(), id="live-signals", className="live-signals"),
                live_trace.layout()]

    def register(self, app: Any) -> None:
        """The status on every tick; the growing figures of the open page when steps arrived
        (`live-rows`); the page itself when the run was analysed again (`live-generation`,
        an input of the app's router)."""

        @app.callback(Output("live-status", "children"), Output("live-tick", "disabled"),
                      Output("live-generation", "data"), Output("live-rows", "data"),
                      Output("live-signals", "children"),
                      Input("live-tick", "n_intervals"),
                      State("live-generation", "data"), State("live-rows", "data"))
        def _tick(_n: int | None, seen_gen: int | None, seen_rows: int | None
                  ) -> tuple[Any, ...]:
            state = self.poll()
            with self._lock:  # one consistent look: never "final" with the page not rebuilt
                gen, rows, status, final = (self.generation, self._rows, self.status(state),
                                            self.final)
            return (status, final,
                    dash.no_update if gen == seen_gen else gen,
                    dash.no_update if rows == seen_rows else rows,
                    self.signals() if rows != seen_rows else dash.no_update)

        def grows(output: Output, build: Any) -> None:
            @app.callback(output, Input("live-rows", "data"), State("url", "search"),
                          prevent_initial_call=True)
            def _redraw(_rows: int | None, search: str | None) -> Any:
                out = build(self.current(), Selection.parse(search))
                if out is None:
                    raise PreventUpdate
                return out

        live_trace.register(app, self._base.root)
        from uberprof.dashboards.pages import counters, overview, steps

        grows(Output("step-heatmap", "figure"),
              lambda d, _sel: overview.heatmap_figure(d, d.straggler_rank()))
        grows(Output("live-recent", "figure"), lambda d, _sel: steps.recent_figure(d))
        grows(Output("step-picker", "options"),
              lambda d, sel: steps.step_options(d, steps.default_step(d, sel)))
        grows(Output("counters-graph", "figure"), counters.figure_of)


def job_runs(root: Path) -> bool:
    """Whether `root` is a run directory whose job still runs, from its nodes' metadata alone
    (what `live_for` asks first): a dashboard that follows the job starts with its run read."""
    return RunDir(root).is_run() and bool(RunFollower(root).running())


def live_for(data: RunData) -> Live | None:
    """A `Live` when `data` is a run directory whose job still runs, else None (old runs, and
    folders of traces, behave as they always did)."""
    if not job_runs(data.root):  # an ended run: nothing to read twice (5 M steps at 512 ranks)
        return None
    follower = RunFollower(data.root)
    state = follower.poll()
    return Live(data, follower, state) if state.running else None
