"""The Dash app: one URL per page, the selection (rank, step) in the query string, and the
safety rules of docs/DESIGN.md (basic authentication when asked for, no file served from disk but
the app's own assets, no cross-site framing, no DNS rebinding on a loopback address).

Routing is one callback from the URL to the page's layout, so every view is a plain link that
can be bookmarked or pasted to a colleague; controls on a page only change the URL.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import dash
import flask
from dash import Input, Output, dcc, html

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.gate import secure
from uberprof.dashboards.preparing import RunSoon
from uberprof.dashboards.server import LOOPBACK, loopback_hosts
from uberprof.dashboards.ui import Selection

__all__ = ["LOOPBACK_HOSTS", "PAGE_MODULES", "create_app", "loopback_hosts", "warm_overview"]

PAGE_MODULES = ("overview", "steps", "stragglers", "gaps", "communication", "parallelism",
                "operators",
                "memory", "counters", "compare")
LOOPBACK_HOSTS = LOOPBACK
ASSETS = Path(__file__).resolve().parent / "assets"
LIGHT_DIR = Path(__file__).resolve().parent / "vendor"
_VERSION = re.compile(rb"plotly\.js[^\n]*?v(\d+\.\d+\.\d+)")


def _plotly_js_version(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            m = _VERSION.search(f.read(300))
    except OSError:
        return None
    return m.group(1).decode() if m else None


PLOTLY_JS_PATH = "/_dash-component-suites/plotly/package_data/plotly.min.js"
GRAPH_JS_PATH = "/_dash-component-suites/dash/dcc/async-graph.js"


def light_plotly() -> Path | None:
    """The vendored plotly.js bundle with cartesian traces only (1.5 MB instead of 4.8 MB: the
    browser parses a third of it), served where dcc.Graph fetches plotly.js from, so that it
    still loads in parallel with the first callback. Only when it is the same plotly.js
    version as the one the installed `plotly` ships; otherwise Dash serves that one."""
    import plotly

    light = next(LIGHT_DIR.glob("plotly-cartesian-*.min.js"), None)
    if light is None:
        return None
    full = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    version = _plotly_js_version(light)
    return light if version and version == _plotly_js_version(full) else None


def _pages() -> dict[str, ModuleType]:
    mods = [importlib.import_module(f"uberprof.dashboards.pages.{m}") for m in PAGE_MODULES]
    return {m.PATH: m for m in mods}


def create_app(data: RunData | RunSoon, auth: tuple[str, str] | None = None,
               allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS,
               warm: bool = True) -> dash.Dash:
    """The app of one loaded run.

    `auth`: (user, password) required from every request (HTTP basic). `allowed_hosts`: the
    Host header values accepted (the loopback names when listening on 127.0.0.1, so that a web
    page cannot reach the dashboard through DNS rebinding); None accepts any. `data` may be a
    `RunSoon` (a run being prepared, not followed live): the app answers at once, its pages
    wait for the run, and the caller warms the overview (`warm_overview`) before it is ready.
    """
    server = _server(auth, allowed_hosts)
    app = _dash_app(server, data.label)
    pages = _pages()
    from uberprof.dashboards.live import live_for

    soon = data if isinstance(data, RunSoon) else None
    live = live_for(data) if isinstance(data, RunData) else None
    app.layout = html.Div([
        dcc.Location(id="url", refresh="callback-nav"),
        html.Div(id="nav"),
        *(live.layout() if live is not None else []),
        dcc.Loading(html.Main(id="page"), type="dot", delay_show=400),
    ], className="app")

    def data_of() -> RunData:
        """The run as shown now (grows while its job runs: `dashboards/live.py`)."""
        if live is not None:
            return live.current()
        return soon() if soon is not None else data  # type: ignore[return-value]

    _route_urls(app, pages, data_of, live is not None)
    for m in pages.values():
        if hasattr(m, "register"):
            m.register(app, data_of)
    if live is not None:
        from uberprof.dashboards.live import EXTENSION

        live.register(app)
        server.extensions[EXTENSION] = live
    if warm and soon is None:
        warm_overview(data_of(), server.logger)
    return app


def warm_overview(data: RunData, log: Any = None) -> None:
    """Build the overview once, so that its first visitor does not pay for the caches and
    plotly's templates; a failure is logged (the page shows it when visited)."""
    try:
        _pages()["/"].layout(data, Selection())
    except Exception as exc:  # noqa: BLE001 - the page shows the error when visited
        if log is not None:
            log.warning("warming the overview failed: %s", exc)


def _server(auth: tuple[str, str] | None, allowed_hosts: tuple[str, ...] | None
            ) -> flask.Flask:
    """The Flask server behind the app: the gate (`gate.secure`), no /static route, a 404 for
    a component file that does not exist, and the light plotly.js where it can be served."""
    server = flask.Flask("uberprof-dashboard", static_folder=None)  # no /static route
    secure(server, auth, allowed_hosts)

    from dash.exceptions import DependencyException

    @server.errorhandler(DependencyException)
    def _not_a_component_file(_exc: Exception) -> Any:
        return flask.Response("not found\n", 404, mimetype="text/plain")

    light = light_plotly()
    if light is not None:
        @server.before_request
        def _light_plotly() -> Any:
            if flask.request.path == PLOTLY_JS_PATH:
                return flask.send_file(light, mimetype="application/javascript", max_age=86400)
            return None
    return server


def _dash_app(server: flask.Flask, label: str) -> dash.Dash:
    """The Dash app on `server`, its scripts served from the package, fetching what the first
    graph will ask for while the page starts."""
    app = dash.Dash(
        "uberprof-dashboard", server=server, title=f"uberprof · {label}",
        assets_folder=str(ASSETS),
        suppress_callback_exceptions=True, serve_locally=True,
        update_title=None, compress=False, enable_mcp=False,
    )
    # Fetch what the first graph will ask for while the page starts (not run until then).
    app.index_string = app.index_string.replace("{%css%}", "{%css%}" + "".join(
        f'\n        <link rel="preload" as="script" href="{p}">'
        for p in (PLOTLY_JS_PATH, GRAPH_JS_PATH)), 1)
    return app


def _route_urls(app: dash.Dash, pages: dict[str, ModuleType], data_of: Any,
                live: bool) -> None:
    """The one callback from the URL to the navigation bar and the page's layout; a run
    followed while its job runs is rebuilt in place when it was analysed again."""
    again = [Input("live-generation", "data")] if live else []

    @app.callback(Output("nav", "children"), Output("page", "children"),
                  Input("url", "pathname"), Input("url", "search"), *again)
    def _route(pathname: str | None, search: str | None, *_generation: int) -> tuple[Any, Any]:
        try:
            data = data_of()
        except RuntimeError as exc:  # a run that failed to be prepared after the app answered
            return None, ui.page("page-error", html.H2("This run could not be read"),
                                 ui.notice(f"{exc}: the details are in the output of "
                                           "`uberprof dashboard`.", "bad"))
        path = pathname or "/"
        if path != "/" and path.endswith("/"):
            path = path.rstrip("/")
        sel = Selection.parse(search)
        nav = ui.nav(path if path in pages else "", sel, data.label,
                     compare=data.baseline is not None)
        page = pages.get(path)
        if page is None:
            return nav, ui.page("page-not-found", html.H2("Not found"),
                                html.P(f"No page {path}. "),
                                dcc.Link("Back to the overview", href=sel.href("/")))
        bad = _bad_selection(data, sel, path)
        if bad is not None:
            return nav, bad
        try:
            body = page.layout(data, sel)
        except Exception as exc:
            app.server.logger.exception("page %s%s failed", path, search or "")
            body = ui.page("page-error", html.H2("This page failed"),
                           ui.notice(f"{type(exc).__name__} while building {path}: the "
                                     "details are in the log of `uberprof dashboard`.", "bad"),
                           dcc.Link("Back to the overview", href="/"))
        return nav, body


def _bad_selection(data: RunData, sel: Selection, path: str) -> html.Div | None:
    """A page that says which value of the URL names nothing in this run (a rank or a step
    it does not have), with a link to the same page without it; None when all is well."""
    for key, value, have in (("rank", sel.rank, data.ranks), ("step", sel.step, data.all_steps)):
        if value is None:
            continue
        known = have()
        if value in known:
            continue
        span = f"{known[0]}–{known[-1]}" if known else "none"
        return ui.page("page-bad-selection", html.H2(f"No such {key}"),
                       ui.notice(f"This run has no {key} {value} ({key}s: {span}).", "warn",
                                 id="bad-selection"),
                       dcc.Link(f"Open {path} without it", href=sel.href(path, **{key: None})))
    return None


