"""The dashboard following a running job: a status line ("running · N steps · last step 2 s
ago") above every page, and the overview's step-time heat map redrawn every few seconds from
what the job appended since (`uberprof.rundir.follow`), without reloading the page. When the job
ends the status says so, and the timer stops. Runs whose job has ended get none of this.
"""

from __future__ import annotations

import threading
from typing import Any

from dash import Input, Output, dcc
from dash.exceptions import PreventUpdate

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.rundir.follow import LiveState, RunFollower, steps_table

__all__ = ["INTERVAL_MS", "Live", "live_for"]

INTERVAL_MS = 3000  # how often an open page asks for what is new


class Live:
    """A run being followed: one follower shared by every browser tab (polls are serialised:
    they advance the same byte offsets)."""

    def __init__(self, data: RunData, follower: RunFollower, first: LiveState) -> None:
        self.data = data
        self.follower = follower
        self.state = first
        self._lock = threading.Lock()
        self._drawn = -1  # step rows behind the heat map last sent

    def poll(self) -> LiveState:
        with self._lock:
            self.state = self.follower.poll()
            return self.state

    def status(self, state: LiveState) -> str:
        if state.ended:
            return (state.status_line() + " · the job has ended: re-open the dashboard to see "
                    "the final diagnosis")
        return state.status_line()

    def layout(self) -> list[Any]:
        """The timer and the status line, above the pages."""
        return [dcc.Interval(id="live-tick", interval=INTERVAL_MS, disabled=self.state.ended),
                ui.notice(self.status(self.state), "info", id="live-status")]

    def register(self, app: Any) -> None:
        """The callbacks: the status on every tick, the overview's heat map when it is open."""

        @app.callback(Output("live-status", "children"), Output("live-tick", "disabled"),
                      Input("live-tick", "n_intervals"))
        def _status(_n: int | None) -> tuple[str, bool]:
            state = self.poll()
            return self.status(state), state.ended

        @app.callback(Output("step-heatmap", "figure"), Input("live-tick", "n_intervals"),
                      prevent_initial_call=True)
        def _heatmap(_n: int | None) -> Any:
            from uberprof.dashboards.pages.overview import heatmap_figure
            from uberprof.dashboards.queries.tables import binned_heatmap

            with self._lock:
                rows = sum(f.step.n for f in self.follower.step_followers().values())
                if rows in (0, self._drawn):  # nothing new: the figure stays as it is
                    raise PreventUpdate
                self._drawn = rows
                t = steps_table(self.follower)
            hm = binned_heatmap(t, "step_time_ns", 250, 256)
            return heatmap_figure(self.data, self.data.straggler_rank(), hm)


def live_for(data: RunData) -> Live | None:
    """A `Live` when `data` is a run directory whose job still runs, else None (old runs, and
    folders of traces, behave as they always did)."""
    if not data.is_run_dir:
        return None
    follower = RunFollower(data.root)
    state = follower.poll()
    return Live(data, follower, state) if state.running else None
