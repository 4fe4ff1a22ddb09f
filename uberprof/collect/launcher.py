"""Start the wrapped command and pass signals and the exit code through, unchanged.

The command runs in its own process group, so a signal sent to `uberprof run` (Ctrl-C, SIGTERM
from a scheduler) reaches the whole job: the launcher, its ranks and their workers. A third
Ctrl-C kills the group outright for jobs that ignore the first two.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
KILL_AFTER_INTERRUPTS = 3


def exit_code_of(returncode: int) -> int:
    """A child killed by signal N exits like it would in a shell: 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def run_wrapped(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run `command` to completion and return its exit code (shell convention for signals)."""
    try:
        own_group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        child = subprocess.Popen(list(command), env=dict(env), **own_group)  # type: ignore[call-overload]
    except FileNotFoundError:
        raise CommandNotFound(command[0]) from None
    except PermissionError:
        raise CommandNotFound(command[0], "is not executable") from None
    interrupts = 0

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupts
        if signum == signal.SIGINT:
            interrupts += 1
        sig = signal.SIGKILL if interrupts >= KILL_AFTER_INTERRUPTS else signum
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        while True:
            try:
                return exit_code_of(child.wait())
            except InterruptedError:
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class CommandNotFound(Exception):
    def __init__(self, name: str, why: str = "was not found") -> None:
        super().__init__(f"command {name!r} {why}")
        self.exit_code = 127 if why == "was not found" else 126
