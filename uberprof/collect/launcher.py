"""Start the wrapped command and pass the terminal, signals and the exit code through, unchanged.

The command runs in its own process group, so a signal sent to `uberprof run` (SIGTERM from a
scheduler, `kill -INT`) reaches the whole job: the launcher, its ranks and their workers. A third
SIGINT kills the group outright for jobs that ignore the first two.

When `uberprof run` is the foreground job of a terminal, it hands the terminal's foreground to
the job's group, as a shell does: the job can read the terminal (input(), pdb, a password
prompt) instead of stopping on SIGTTIN, and Ctrl-C, Ctrl-\\ and Ctrl-Z reach the whole job
straight from the terminal. When the job is stopped (Ctrl-Z), `uberprof run` takes the
terminal back and stops too, so the shell's job control (fg, bg) works as without uberprof.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
KILL_AFTER_INTERRUPTS = 3
TERMINAL_STOPS = (signal.SIGTTIN, signal.SIGTTOU)


def exit_code_of(returncode: int) -> int:
    """A child killed by signal N exits like it would in a shell: 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Terminal:
    """The controlling terminal of `uberprof run`, and which process group holds its foreground."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.own_group = os.getpgrp()

    @classmethod
    def controlling(cls) -> Terminal | None:
        """None without a controlling terminal (batch jobs, pipes, CI)."""
        try:
            return cls(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
        except OSError:
            return None

    def foreground(self) -> int | None:
        try:
            return os.tcgetpgrp(self.fd)
        except OSError:
            return None

    def give(self, group: int) -> None:
        """Make `group` the foreground; SIGTTOU is blocked, as a background caller would get it."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            os.tcsetpgrp(self.fd, group)
        except OSError:
            pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def close(self) -> None:
        os.close(self.fd)


def run_wrapped(command: Sequence[str], env: Mapping[str, str],
                started: Callable[[int], None] | None = None) -> int:
    """Run `command` to completion and return its exit code (shell convention for signals).
    `started` is told the job's pid (also its process group) once it runs."""
    # Signals are forwarded from before the job starts, and the terminal is handed over before
    # anything else: a Ctrl-C typed while uberprof still holds the foreground (a busy machine
    # can keep it there for a while) reaches the job all the same.
    job: list[int] = []  # the job's pid, once it runs (also its process group)
    pending: list[int] = []
    interrupts = 0

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupts
        if signum == signal.SIGINT:
            interrupts += 1
        sig = signal.SIGKILL if interrupts >= KILL_AFTER_INTERRUPTS else signum
        if not job:
            pending.append(sig)
            return
        try:
            os.killpg(job[0], sig)
        except ProcessLookupError:
            pass

    terminal = Terminal.controlling()
    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        own_group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        child = subprocess.Popen(list(command), env=dict(env), **own_group)  # type: ignore[call-overload]
    except BaseException as exc:
        _restore(previous, terminal)
        if isinstance(exc, FileNotFoundError):
            raise CommandNotFound(command[0]) from None
        if isinstance(exc, PermissionError):
            raise CommandNotFound(command[0], "is not executable") from None
        raise
    if terminal is not None and terminal.foreground() == terminal.own_group:
        terminal.give(child.pid)
    job.append(child.pid)
    for sig in pending:
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass
    try:
        if started is not None:
            started(child.pid)
        while True:
            _, status = os.waitpid(child.pid, os.WUNTRACED)
            if os.WIFSTOPPED(status):
                _job_stopped(child.pid, os.WSTOPSIG(status), terminal)
                continue
            child.returncode = os.waitstatus_to_exitcode(status)
            return exit_code_of(child.returncode)
    finally:
        _restore(previous, terminal, child.pid)


def _restore(previous: dict[int, object], terminal: Terminal | None, job: int | None = None
             ) -> None:
    """Put back the signal handlers and, where the job held it, the terminal's foreground."""
    for s, handler in previous.items():
        signal.signal(s, handler)  # type: ignore[arg-type]
    if terminal is not None:
        if job is not None and terminal.foreground() == job:
            terminal.give(terminal.own_group)
        terminal.close()


def _job_stopped(group: int, sig: int, terminal: Terminal | None) -> None:
    """Mirror the job's stop the way a shell sees it: stop, and on resume resume the job."""
    if terminal is None:
        return  # no job control to serve: whoever stopped the job will continue it
    if sig in TERMINAL_STOPS and terminal.foreground() == group:
        os.killpg(group, signal.SIGCONT)  # it read the terminal just before we handed it over
        return
    if terminal.foreground() == group:
        terminal.give(terminal.own_group)
    os.kill(os.getpid(), signal.SIGSTOP)  # the shell shows the job stopped; fg/bg continue us
    if terminal.foreground() == terminal.own_group:
        terminal.give(group)
    try:
        os.killpg(group, signal.SIGCONT)
    except ProcessLookupError:
        pass


class CommandNotFound(Exception):
    def __init__(self, name: str, why: str = "was not found") -> None:
        super().__init__(f"command {name!r} {why}")
        self.exit_code = 127 if why == "was not found" else 126
