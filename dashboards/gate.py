"""The gate every request to a dashboard passes: the Host header on a loopback address (no DNS
rebinding), basic authentication when asked for, and headers that forbid framing, sniffing and
caching run data (docs/DESIGN.md, safety). Shared by the dashboard and the page that answers
while a run is being prepared."""

from __future__ import annotations

import base64
import hmac
from typing import Any

import flask


def secure(server: flask.Flask, auth: tuple[str, str] | None,
            allowed_hosts: tuple[str, ...] | None) -> None:
    """Install the gate on `server` (see the module docstring)."""
    expected = None
    if auth is not None:
        expected = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    allowed = {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None

    @server.before_request
    def _gate() -> Any:
        if allowed is not None:
            host = (flask.request.host or "").lower()
            name = host.rsplit(":", 1)[0] if not host.startswith("[") else \
                host[1:].split("]", 1)[0]
            if name not in allowed:
                return flask.Response("uberprof dashboard: unexpected Host header\n", 421,
                                      mimetype="text/plain")
        if expected is not None:
            given = flask.request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return flask.Response(
                    "uberprof dashboard: authentication required\n", 401,
                    {"WWW-Authenticate": 'Basic realm="uberprof dashboard", charset="UTF-8"'},
                    mimetype="text/plain")
        return None

    @server.after_request
    def _headers(resp: flask.Response) -> flask.Response:
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        resp.headers.setdefault("X-Frame-Options", "DENY")
        resp.headers.setdefault("Referrer-Policy", "no-referrer")
        if not flask.request.path.startswith(("/_dash-component-suites/", "/assets/")):
            resp.headers.setdefault("Cache-Control", "no-store")  # run data: never cached
        return resp
