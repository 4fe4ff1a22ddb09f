"""`uberprof dashboard`: serve the Dash app of one run (`uberprof.dashboards`), safe by
default."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from uberprof.cli.params import INPUT_PATH
from uberprof.dashboards.nav import pages_text
from uberprof.dashboards.server import AUTH_ENV


@click.command(short_help="Serve the interactive dashboard of a run (Plotly Dash).")
@click.argument("path", type=INPUT_PATH)
@click.option("--port", type=click.IntRange(0, 65535), default=8050, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but a loopback address needs --auth.")
@click.option("--auth", "auth_text", metavar="USER:PASSWORD", default=None,
              help="Require HTTP basic authentication. Other users of this machine can read "
                   f"it in `ps`: prefer --auth-file or {AUTH_ENV}=user:password.")
@click.option("--auth-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Require HTTP basic authentication with the user:password on the first "
                   "line of this file (keep it private: chmod 600).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the analysis tables are (default: PATH/derived).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for reading traces when the analysis must run first.")
@click.option("--compare", "baselines", type=click.Path(exists=True, path_type=Path),
              multiple=True, metavar="A",
              help="Also compare PATH against run A (the baseline) on a /compare page, as "
                   "`uberprof diff A PATH` does. Given more than once (runs of the job at other "
                   "sizes), the page also shows their scaling, as `uberprof scaling` does.")
def dashboard(path: Path, port: int, host: str, auth_text: str | None, auth_file: Path | None,
              out: Path | None, workers: int | None, baselines: tuple[Path, ...]) -> None:
    """Serve the dashboard of PATH (a uberprof run directory or a folder of Kineto traces).

    Pages: {pages}.

    \b
    Runs `uberprof analyze` first when the tables are missing or stale, and reads the
    diagnosis `uberprof report` saved when it is fresh (else diagnoses while the pages are
    served: the overview's findings fill in when done); the URL answers at once, with a page
    that says how far that got until the run is ready. Listens on 127.0.0.1 unless --host
    says otherwise; any other address requires credentials: --auth-file FILE or
    UBERPROF_DASHBOARD_AUTH=user:password (--auth user:password works too, but shows in
    `ps`). Serves nothing but this run's views.
    """
    from uberprof.dashboards.startup import Options, start
    from uberprof.present.terminal.dashboard import DashboardTerminal

    code = start(Options(path, port=port, host=host, auth_text=auth_text, auth_file=auth_file,
                         out=out, workers=workers, baselines=baselines), DashboardTerminal())
    if code:
        sys.exit(code)


# the pages as the navigation bar has them (dashboards/nav.py), never a list kept by hand
dashboard.help = (dashboard.help or "").replace("{pages}", pages_text())
