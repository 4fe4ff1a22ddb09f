"""Serving the dashboard: who may connect (this machine only, or whoever has the credentials) and
the threaded WSGI server the app runs in. Used by `uberprof dashboard` and by the dashboard beside
a job (`uberprof.dashboards.live_server`).

Light on purpose (no Dash, no werkzeug until a server is made): the command line imports it for
every command. What goes wrong is a `ServeError`, whose text is said as is; its `code` is the
exit status.
"""

from __future__ import annotations

import ipaddress
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["AUTH_ENV", "LOOPBACK", "Credentials", "ServeError", "check_exposure", "credentials",
           "is_loopback", "loopback_hosts", "make_server", "parse_auth", "read_auth_file",
           "serve"]

AUTH_ENV = "UBERPROF_DASHBOARD_AUTH"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServeError(Exception):
    """Why the dashboard is not served, in words; `code`: the exit status (2: the options are
    wrong or unsafe, 1: the server could not start)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Credentials:
    """The basic-authentication credentials asked for (None: none), where they came from (an
    option or AUTH_ENV), and what to tell the user about them ("warning: ...", "note: ...")."""

    auth: tuple[str, str] | None
    source: str
    notes: tuple[str, ...] = ()


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_hosts(bound: str) -> tuple[str, ...]:
    """The Host header values accepted when listening on the loopback address `bound`: the
    usual loopback names and `bound` itself (127.0.0.2 is loopback too). Here, not in the Dash
    app, so that the URL is printed before Dash is imported (a second or two)."""
    return LOOPBACK if bound.lower() in LOOPBACK else (*LOOPBACK, bound)


def read_auth_file(path: Path) -> tuple[str, str | None]:
    """The credentials in `path` (its first line, user:password), and a warning when other
    users can read the file; raises ValueError when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8").splitlines()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    warning = (f"{path} can be read by other users (chmod 600 {path})"
               if mode & (stat.S_IRGRP | stat.S_IROTH) else None)
    return (text[0].strip() if text else ""), warning


def parse_auth(text: str | None) -> tuple[str, str] | None:
    """'user:password' -> (user, password); None for None; raises ValueError when malformed."""
    if text is None:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ValueError("credentials must look like user:password (both non-empty)")
    return user, password


def credentials(auth_text: str | None, auth_file: Path | None,
                environ: Mapping[str, str]) -> Credentials:
    """The credentials of `uberprof dashboard`: from --auth (`auth_text`), --auth-file or the
    environment (AUTH_ENV); raises ServeError (code 2) when they are malformed or given twice."""
    notes: list[str] = []
    if auth_text is not None and auth_file is not None:
        raise ServeError("give --auth or --auth-file, not both", 2)
    if auth_file is not None:
        source = "--auth-file"
        try:
            text, warning = read_auth_file(auth_file)
        except ValueError as exc:
            raise ServeError(f"--auth-file: {exc}", 2) from None
        if warning:
            notes.append(f"warning: {warning}")
    elif auth_text is not None:
        source, text = "--auth", auth_text
        notes.append("note: --auth shows in `ps` to every user of this machine; prefer "
                     f"--auth-file or {AUTH_ENV}")
    else:
        source, text = AUTH_ENV, environ.get(AUTH_ENV) or None
    try:
        return Credentials(parse_auth(text), source, tuple(notes))
    except ValueError as exc:
        raise ServeError(f"{source}: {exc}", 2) from None


def check_exposure(host: str, auth: tuple[str, str] | None) -> None:
    """Raises ServeError (code 2) when `host` is reachable from other machines and no
    credentials protect the run."""
    if is_loopback(host) or auth is not None:
        return
    raise ServeError(
        f"refusing to listen on {host} without credentials: anyone who can reach this machine "
        f"could read the run. Give --auth-file FILE (user:password inside) or set {AUTH_ENV}="
        "user:password, or keep the default 127.0.0.1 and use an SSH tunnel "
        "(ssh -L 8050:127.0.0.1:8050 ...).", 2)


def make_server(host: str, port: int, wsgi: Any) -> Any:
    """A threaded WSGI server (werkzeug's, without the development-server banner and without a
    line per request); raises ServeError (code 1) when it cannot listen."""
    from werkzeug.serving import WSGIRequestHandler
    from werkzeug.serving import make_server as werkzeug_server

    class Quiet(WSGIRequestHandler):
        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            pass  # one line per request would bury the URL; errors are still logged

    try:
        return werkzeug_server(host, port, wsgi, threaded=True, request_handler=Quiet)
    except SystemExit:  # werkzeug says "Address already in use" and exits
        raise ServeError(f"cannot listen on {host}:{port}: the port is taken (pick another "
                         "--port, or --port 0 for any free one)", 1) from None
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", 1) from None


def serve(server: Any, prepare: Callable[[], bool]) -> bool:
    """Serve until Ctrl-C while `prepare` runs in a thread (the server already answers: the
    preparing page); when it returns False (nothing to serve) or raises, the server stops.
    Whether it did not fail."""
    failed: list[int] = []

    def run() -> None:
        ok = False
        try:
            ok = prepare()
        finally:
            if not ok:
                failed.append(1)
                server.shutdown()

    threading.Thread(target=run, name="uberprof-prepare", daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return not failed
