"""What answers while `uberprof dashboard` prepares a run (analysis, diagnosis, counters: a
minute and more on a large run): the server listens at once, every request gets a page that
says how far preparation got, and then the dashboard answers in its place.
Behind the same gate as the dashboard (dashboards/gate.py).

The page asks the server (HEAD) whether anything changed, and the server holds that request
until the stage changes, the dashboard answers instead, or HOLD_S pass: the page then shows
the new stage, or reloads into the dashboard, within HOLD_POLL_S. It used to ask ten times a
second and reload itself every second: 3.6 s of the browser's CPU in 20 s (0.4 s of the
server's), taken from the analysis it waited for on a 2-core machine. Without scripts, the
page reloads itself every RELOAD_S.

The dashboard can answer before its run is ready (`RunSoon`): once the tables are read, the
browser loads Dash's scripts (half a second and more) while the server reads the run's
summary, diagnosis and counters, instead of after."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, unquote

import flask

from uberprof.dashboards.gate import secure

__all__ = ["HOLD_S", "RELOAD_S", "RunSoon", "Switch", "preparing_app"]

RELOAD_S = 1  # how often a page without scripts reloads (and the Retry-After it sends)
HOLD_S = 10.0  # the longest the server holds the page's question (well below proxies' limits)
HOLD_POLL_S = 0.05  # how often a held question looks at the stage and the switch
STAGE_EVERY_S = 0.5  # a stage that changes all the time ("reading traces: 17 of 1024") is
# shown twice a second: a question is held at least this long unless the dashboard answers
SHOWN_HEADER = "X-Uberprof-Shown"  # the stage the page shows (URL-quoted), in its question
STAGE_HEADER = "X-Uberprof-Stage"  # the stage now (URL-quoted), in the answer
# The page's script: ask, show the stage the answer names, ask again at once (a second later
# when the answer was not held: something else answered); reload when the answer is not
# "still preparing" (the dashboard, or 204: it answers in this page's place now).
_ASK = ("<script>(function(){var el=document.getElementById('preparing-stage');"
        "function ask(){var t=Date.now();"
        "fetch(location.href,{method:'HEAD',cache:'no-store',"
        "headers:{'" + SHOWN_HEADER + "':encodeURIComponent(el.dataset.stage)}})"
        ".then(function(r){if(r.status!==503){location.reload();return;}"
        "var s=r.headers.get('" + STAGE_HEADER + "');"
        "if(s!==null){s=decodeURIComponent(s);el.dataset.stage=s;el.textContent=s+'\\u2026';}"
        "setTimeout(ask,Date.now()-t<100?1000:0);})"
        ".catch(function(){setTimeout(ask,1000);});}"
        "ask();})();</script>")


def preparing_app(label: str, stage: Callable[[], str], auth: tuple[str, str] | None,
                  allowed_hosts: tuple[str, ...] | None,
                  moved: Callable[[], bool] = lambda: False,
                  hold_s: float = HOLD_S) -> flask.Flask:
    """The page of the run `label` while it is prepared: 503 with Retry-After (not the
    dashboard yet: scripts and proxies can tell), the current `stage()` in words. The page's
    question (a HEAD naming the stage it shows) is held until `stage()` differs (and at least
    STAGE_EVERY_S), `moved()` (the dashboard answers in this app's place: then 204) or
    `hold_s` pass."""
    server = flask.Flask("uberprof-preparing", static_folder=None)
    secure(server, auth, allowed_hosts)

    @server.route("/", defaults={"path": ""})
    @server.route("/<path:path>")
    def _page(path: str) -> flask.Response:
        shown = flask.request.headers.get(SHOWN_HEADER)
        if shown is not None and flask.request.method == "HEAD":
            shown, asked = unquote(shown), time.monotonic()
            while not moved() and (t := time.monotonic()) < asked + hold_s and (
                    stage() == shown or t < asked + min(STAGE_EVERY_S, hold_s)):
                time.sleep(HOLD_POLL_S)
            if moved():
                return flask.Response(status=204)
        now = stage()
        body = (
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<noscript><meta http-equiv='refresh' content='{RELOAD_S}'></noscript>"
            f"<title>uberprof · {html.escape(label)} (preparing)</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:3em;color:#333}"
            ".stage{color:#666}</style></head><body>"
            f"<h2>uberprof · {html.escape(label)}</h2>"
            "<p>Preparing the dashboard of this run; this page follows it and opens the "
            "dashboard when it is ready.</p>"
            f"<p class='stage' id='preparing-stage' data-stage='{html.escape(now)}'>"
            f"{html.escape(now)}…</p>"
            f"{_ASK}</body></html>")
        return flask.Response(body, 503, {"Retry-After": str(RELOAD_S),
                                          STAGE_HEADER: quote(now, safe="")},
                              mimetype="text/html")

    return server


class Switch:
    """A WSGI app that passes each request to `first` until `to(app)`, then to `app`;
    `moved` says whether that happened (a held question of the preparing page ends on it)."""

    def __init__(self, first: Callable[..., Iterable[bytes]]) -> None:
        self._app = first
        self._lock = threading.Lock()
        self.moved = False

    def to(self, app: Callable[..., Iterable[bytes]]) -> None:
        with self._lock:
            self._app = app
            self.moved = True

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
