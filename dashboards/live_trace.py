"""The live dashboard's "record a trace" button: a trace window on the running job's next steps,
on every rank or those named, asked exactly as `uberprof trace` asks
(`uberprof.collect.trace_request.request_trace`, the one way to ask) and answered in the same
words (`uberprof.cli.trace.describe`): the steps the window will cover, or why it cannot be
recorded (the job ended, a window already recording, no answer in time).

The one place a view writes: the request file in the run directory that every rank reads at
its step boundaries (docs/trace.md). It does not read the run through the collect side: what
the dashboard shows still comes from `uberprof.rundir` and the analysis. The callback waits for
the ranks' answers (10 s and three of the job's steps at most) in a server thread; the page's
other callbacks go on meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dash import Input, Output, State, dcc, html

from uberprof.dashboards import ui

__all__ = ["DEFAULT_STEPS", "answer", "layout", "register"]

DEFAULT_STEPS = 3  # as `uberprof trace`


def layout() -> html.Div:
    """The button, the window's length in steps, the ranks (empty: every rank), the answer."""
    from uberprof.collect.trace_request import MAX_STEPS

    return html.Div([
        html.Button("record a trace", id="trace-button", n_clicks=0, className="trace-button",
                    title="Record a torch.profiler window on the job's next steps "
                          "(as `uberprof trace RUN` does)"),
        html.Label([" of ", dcc.Input(id="trace-steps", type="number", min=1, max=MAX_STEPS,
                                      step=1, value=DEFAULT_STEPS, debounce=True,
                                      style={"width": "4em"}), " steps"]),
        html.Label([" on ranks ", dcc.Input(id="trace-ranks", type="text", value="",
                                            placeholder="all (or 0,2-3)",
                                            style={"width": "9em"})]),
        dcc.Loading(html.Div(id="trace-answer", className="trace-answer"), type="dot"),
    ], id="live-trace", className="live-trace")


def answer(root: Path, steps: Any, ranks_text: str | None) -> html.Div:
    """Ask the job in `root` for a window and say what it answered (never raises)."""
    import click

    from uberprof.cli.params import parse_ranks
    from uberprof.cli.trace import describe
    from uberprof.collect.trace_request import CannotTrace, request_trace

    try:
        ranks = parse_ranks((ranks_text or "").strip() or None)
        count = int(steps) if steps not in (None, "") else DEFAULT_STEPS
    except click.BadParameter as exc:
        return ui.notice(f"cannot ask for a trace: ranks {exc.format_message()}", "warn",
                         id="trace-outcome")
    except (TypeError, ValueError):
        return ui.notice(f"cannot ask for a trace: {steps!r} is no number of steps", "warn",
                         id="trace-outcome")
    try:
        outcome = request_trace(root, count, ranks)
    except CannotTrace as exc:
        return ui.notice(f"cannot record a trace: {exc}", "warn", id="trace-outcome")
    except Exception as exc:  # noqa: BLE001 - the page says it, the job is not concerned
        return ui.notice(f"asking for a trace failed: {type(exc).__name__}: {exc}", "warn",
                         id="trace-outcome")
    lines = describe(outcome, root)
    return html.Div([html.Div(line) for line in lines], id="trace-outcome",
                    className=f"notice {'info' if outcome.ok else 'warn'}",
                    **{"data-first": str(outcome.first), "data-last": str(outcome.last),
                       "data-ok": str(outcome.ok).lower()})


def register(app: Any, root: Path) -> None:
    """The button's callback, for the run in `root`."""

    @app.callback(Output("trace-answer", "children"), Input("trace-button", "n_clicks"),
                  State("trace-steps", "value"), State("trace-ranks", "value"),
                  prevent_initial_call=True)
    def _ask(n_clicks: int | None, steps: Any, ranks: str | None) -> Any:
        if not n_clicks:
            return None
        return answer(root, steps, ranks)
