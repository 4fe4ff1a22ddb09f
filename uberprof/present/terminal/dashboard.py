"""What `uberprof dashboard` says on the terminal while it starts (`dashboards/startup.py`'s
`StartupView`): the URL on stdout; notes, the spinner and the progress bar on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rich.console import Console

from uberprof.present.terminal.progress import ReadProgress

__all__ = ["DashboardTerminal"]


class DashboardTerminal:
    """The dashboard's start on the terminal."""

    def __init__(self) -> None:
        self.err = Console(stderr=True)
        self.say = Console(highlight=False)

    def note(self, line: str) -> None:
        self.err.print(f"uberprof dashboard: {line}", markup=False, highlight=False,
                       soft_wrap=True)

    def listening(self, url: str, auth: tuple[str, str] | None, source: str | None,
                  exposed_on: str | None) -> None:
        self.say.print(f"uberprof dashboard: [bold]{url}[/bold]  (Ctrl-C to stop; until the "
                       "run is ready, the page says how far it got)")
        if auth is not None:
            self.say.print(f"  basic authentication required: user '{auth[0]}' (from {source}); "
                           "the connection is plain HTTP, so use it on trusted networks or "
                           "behind TLS")
        if exposed_on is not None:
            self.say.print(f"  listening on {exposed_on}: reachable from other machines")
        sys.stdout.flush()

    def ready(self, ranks: int, steps: int, traced: int, seconds: float) -> None:
        self.say.print(f"[dim]{ranks} rank(s), {steps} step(s), {traced} traced; ready in "
                       f"{seconds:.1f} s[/dim]")
        sys.stdout.flush()

    def doing(self, what: str) -> AbstractContextManager[Any]:
        return self.err.status(f"{what}…", spinner="dots")

    def reading(self) -> AbstractContextManager[Callable[..., None]]:
        return ReadProgress(self.err)
