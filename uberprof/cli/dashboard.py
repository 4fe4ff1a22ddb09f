"""`uberprof dashboard`: serve the Dash app of one run (dashboards/), safe by default."""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

AUTH_ENV = "UBERPROF_DASHBOARD_AUTH"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_auth(text: str | None) -> tuple[str, str] | None:
    """'user:password' -> (user, password); None for None; raises ValueError when malformed."""
    if text is None:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ValueError("credentials must look like user:password (both non-empty)")
    return user, password


@click.command(short_help="Serve the interactive dashboard of a run (Plotly Dash).")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=8050, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but a loopback address needs --auth.")
@click.option("--auth", "auth_text", metavar="USER:PASSWORD", default=None,
              help=f"Require HTTP basic authentication (or set {AUTH_ENV}).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the analysis tables are (default: PATH/derived).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for reading traces when the analysis must run first.")
def dashboard(path: Path, port: int, host: str, auth_text: str | None, out: Path | None,
              workers: int | None) -> None:
    """Serve the dashboard of PATH (a uberprof run directory or a folder of Kineto traces).

    \b
    Pages: /  overview · /steps · /stragglers · /gaps · /communication · /counters
    Runs `uberprof analyze` first when the tables are missing or stale. Listens on
    127.0.0.1 unless --host says otherwise; any other address requires --auth
    (or UBERPROF_DASHBOARD_AUTH=user:password). Serves nothing but this run's views.
    """
    err = Console(stderr=True)
    say = Console(highlight=False)
    source = "--auth" if auth_text is not None else AUTH_ENV
    try:
        auth = parse_auth(auth_text if auth_text is not None else os.environ.get(AUTH_ENV) or None)
    except ValueError as exc:
        err.print(f"uberprof dashboard: {source}: {exc}", markup=False)
        sys.exit(2)
    if not is_loopback(host) and auth is None:
        err.print(f"uberprof dashboard: refusing to listen on {host} without credentials: "
                  "anyone who can reach this machine could read the run. Give --auth "
                  f"user:password (or set {AUTH_ENV}), or keep the default 127.0.0.1 and "
                  "use an SSH tunnel (ssh -L 8050:127.0.0.1:8050 ...).", markup=False)
        sys.exit(2)

    from uberprof.dashboards.app import LOOPBACK_HOSTS, create_app
    from uberprof.dashboards.data import RunData

    t0 = time.perf_counter()
    data = RunData(root=path.resolve(), out=out, workers=workers)
    try:  # the same progress bar as `uberprof analyze`
        from uberprof.present.terminal.progress import ReadProgress
    except ImportError:  # pragma: no cover - it moved: no bar, same work
        data.load()
    else:
        with ReadProgress(err) as update:
            data.load(progress=update)
    for n in data.notices:
        err.print(f"uberprof dashboard: {n}", markup=False, highlight=False)
    if not data.has_traces and data.steps.num_rows == 0:
        err.print(f"uberprof dashboard: nothing to show in {path}: no trace and no step "
                  "timeline (is it a uberprof run directory or a folder of Kineto traces?)",
                  markup=False, highlight=False)
        sys.exit(1)
    ranks = len(data.ranks())
    with err.status(f"diagnosing {ranks} rank(s)…", spinner="dots"):
        data.warm()
    say.print(f"[dim]{ranks} rank(s), {len(data.all_steps())} step(s), "
              f"{len(data.traced_steps())} traced; ready in {time.perf_counter() - t0:.1f} s"
              "[/dim]")
    for p in data.problems[:5]:
        err.print(f"uberprof dashboard: {p}", markup=False, highlight=False)

    allowed = LOOPBACK_HOSTS if is_loopback(host) else None
    app = create_app(data, auth=auth, allowed_hosts=allowed)
    server = _make_server(host, port, app.server, err)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/"
    say.print(f"uberprof dashboard: [bold]{url}[/bold]  (Ctrl-C to stop)")
    if auth is not None:
        say.print(f"  basic authentication required: user '{auth[0]}' (from {source}); "
                  "the connection is plain HTTP, so use it on trusted networks or behind TLS")
    if not is_loopback(host):
        say.print(f"  listening on {host}: reachable from other machines")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _make_server(host: str, port: int, wsgi: Any, err: Console) -> Any:
    """A threaded WSGI server (werkzeug's, without the development-server banner)."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            pass  # one line per request would bury the URL; errors are still logged

    try:
        return make_server(host, port, wsgi, threaded=True, request_handler=Quiet)
    except SystemExit:  # werkzeug says "Address already in use" and exits
        err.print(f"uberprof dashboard: cannot listen on {host}:{port}: the port is taken "
                  "(pick another --port, or --port 0 for any free one)", markup=False)
        sys.exit(1)
    except OSError as exc:
        err.print(f"uberprof dashboard: cannot listen on {host}:{port}: {exc.strerror or exc}",
                  markup=False)
        sys.exit(1)
