"""What answers while `uberprof dashboard` prepares a run (analysis, diagnosis, counters: a
minute and more on a large run): the server listens at once, every request gets a page that
says how far preparation got and reloads itself, and then the dashboard answers in its place.
Behind the same gate as the dashboard (dashboards/gate.py).

The dashboard can answer before its run is ready (`RunSoon`): once the tables are read, the
browser loads Dash's scripts (half a second and more) while the server reads the run's
summary, diagnosis and counters, instead of after."""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Iterable
from typing import Any

import flask

from uberprof.dashboards.gate import secure

__all__ = ["RELOAD_S", "RunSoon", "Switch", "preparing_app"]

RELOAD_S = 1  # how often the page asks again (and the Retry-After it sends)
POLL_MS = 100  # how often its script asks whether the dashboard answers in its place
# A reload every RELOAD_S left the dashboard unseen for half a second on average after it was
# ready: the page's script asks (HEAD) ten times as often and reloads as soon as it is there.
_POLL = ("<script>(function(){var t=setInterval(function(){"
         "fetch(location.href,{method:'HEAD',cache:'no-store'}).then(function(r){"
         "if(r.status!==503){clearInterval(t);location.reload();}}).catch(function(){});"
         "}, " + str(POLL_MS) + ");})();</script>")


def preparing_app(label: str, stage: Callable[[], str], auth: tuple[str, str] | None,
                  allowed_hosts: tuple[str, ...] | None) -> flask.Flask:
    """The page of the run `label` while it is prepared: 503 with Retry-After (not the
    dashboard yet: scripts and proxies can tell), the current `stage()` in words."""
    server = flask.Flask("uberprof-preparing", static_folder=None)
    secure(server, auth, allowed_hosts)

    @server.route("/", defaults={"path": ""})
    @server.route("/<path:path>")
    def _page(path: str) -> flask.Response:
        body = (
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<meta http-equiv='refresh' content='{RELOAD_S}'>"
            f"<title>uberprof · {html.escape(label)} (preparing)</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:3em;color:#333}"
            ".stage{color:#666}</style></head><body>"
            f"<h2>uberprof · {html.escape(label)}</h2>"
            "<p>Preparing the dashboard of this run; this page reloads itself.</p>"
            f"<p class='stage' id='preparing-stage'>{html.escape(stage())}…</p>"
            f"{_POLL}</body></html>")
        return flask.Response(body, 503, {"Retry-After": str(RELOAD_S)},
                              mimetype="text/html")

    return server


class Switch:
    """A WSGI app that passes each request to `first` until `to(app)`, then to `app`."""

    def __init__(self, first: Callable[..., Iterable[bytes]]) -> None:
        self._app = first
        self._lock = threading.Lock()

    def to(self, app: Callable[..., Iterable[bytes]]) -> None:
        with self._lock:
            self._app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        with self._lock:
            app = self._app
        return app(environ, start_response)


class RunSoon:
    """The run of a dashboard that answers before the run is ready: its pages call it, and
    wait until `ready(data)` (or fail with the reason given to `failed`). Called from the
    server's request threads; set once by the thread that prepares the run."""

    def __init__(self, label: str) -> None:
        self.label = label  # the run's name in titles, before the run is read
        self._done = threading.Event()
        self._data: Any = None
        self._error: str | None = None

    def ready(self, data: Any) -> None:
        self._data = data
        self._done.set()

    def failed(self, why: str) -> None:
        self._error = why
        self._done.set()

    def __call__(self) -> Any:
        """The run, once ready; raises RuntimeError when preparing it failed."""
        self._done.wait()
        if self._error is not None:
            raise RuntimeError(f"preparing the run failed: {self._error}")
        return self._data
