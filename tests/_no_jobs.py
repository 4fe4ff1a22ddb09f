"""What a unit test may not start (tests/unit/conftest.py refuses it): a training job (torchrun,
`uberprof run`, `uberprof calibrate`, which relaunches the run's job), a browser (Chromium, or
Playwright's driver that starts it), a terminal (tmux) or a network namespace (`ip netns`,
unshare, nsenter). Tests that do belong in tests/jobs/.

Allowed: any other program, `python -c CODE` and scripts (their code is not read), and every
uberprof command but those two, `--help` included (`uberprof run --help` starts no job).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

MESSAGE = "unit tests start no jobs: move this test to tests/jobs/"

# Programs refused by name, wherever they are in the command (so `env X=1 torchrun ...`,
# `timeout 60 tmux ...` and `sudo unshare ...` are refused too).
PROGRAMS = frozenset({"torchrun", "chromium", "chromium-browser", "chrome", "google-chrome",
                      "headless_shell", "tmux", "unshare", "nsenter"})
# Python modules refused after `-m`.
MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
# uberprof commands that start a job.
COMMANDS = frozenset({"run", "calibrate"})
HELP = frozenset({"--help", "-h"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh"})
# The same rules on a shell command line (sh -c '...', shell=True).
SHELL_LINE = re.compile(r"(^|[\s;&|(/])(torchrun|chromium|chromium-browser|tmux|unshare|nsenter)"
                        r"(\s|$)|\bip\s+(-\S+\s+)*netns\b|\buberprof\s+(run|calibrate)\b"
                        r"(?![^;&|]*\s(--help|-h)\b)")


def _uberprof_command(rest: Sequence[str]) -> str | None:
    """The uberprof command in `rest` (what follows `uberprof` or `-m uberprof`), None for
    `--help`, `--version` or a command asked for its help."""
    if HELP & set(rest):
        return None
    words = [a for a in rest if not a.startswith("-")]
    return words[0] if words else None


def refusal(args: str | bytes | os.PathLike[str] | Sequence[object], shell: bool = False
            ) -> str | None:
    """Why a unit test may not start `args` (as given to subprocess.Popen), or None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        line = os.fsdecode(args)
        if shell:
            return _shell_refusal(line)
        argv = [line]
    else:
        argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    if shell and argv:
        return _shell_refusal(argv[0])
    for i, arg in enumerate(argv):
        name = os.path.basename(arg)
        if name in PROGRAMS:
            return f"starts {name}"
        if name == "ip" and "netns" in argv[i + 1:]:
            return "starts a network namespace (ip netns)"
        if arg == "run-driver" and i > 0 and "playwright" in argv[i - 1]:
            return "starts a browser (Playwright's driver)"
        if arg == "-m" and i + 1 < len(argv):
            module = argv[i + 1]
            if module in MODULES:
                return f"starts a job ({module})"
            if module == "uberprof" and _uberprof_command(argv[i + 2:]) in COMMANDS:
                return f"starts a job (uberprof {_uberprof_command(argv[i + 2:])})"
            break  # the rest are the module's own arguments
        if arg == "-c" and i > 0:
            program = os.path.basename(argv[i - 1])
            if program in SHELLS and i + 1 < len(argv):
                return _shell_refusal(argv[i + 1])
            break  # python -c CODE: code, not a command line
        if name == "uberprof" and _uberprof_command(argv[i + 1:]) in COMMANDS:
            return f"starts a job (uberprof {_uberprof_command(argv[i + 1:])})"
        if name.endswith(".py"):
            break  # a script's arguments are its own
    return None


def _shell_refusal(line: str) -> str | None:
    m = SHELL_LINE.search(line)
    if m:
        return f"starts {m.group(0).strip()!r} from a shell"
    try:
        return refusal(shlex.split(line))
    except ValueError:
        return None


class JobInUnitTest(RuntimeError):
    """A unit test tried to start a job."""


class NoJobs:
    """What the guard refused in one test; a test of the guard itself clears it."""

    def __init__(self) -> None:
        self.refused: list[str] = []


@contextmanager
def guarded(guard: NoJobs) -> Iterator[None]:
    """subprocess.Popen (and so run, check_output, asyncio's subprocesses) refuses what
    `refusal` refuses, with JobInUnitTest; if the code under test caught that error, the block
    fails all the same when it ends."""
    real_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], args: Any, *a: Any, **k: Any) -> None:
        why = refusal(args, shell=bool(k.get("shell", False)))
        if why is not None:
            guard.refused.append(f"{why}: {args!r}")
            raise JobInUnitTest(f"{MESSAGE} ({why}: {args!r})")
        real_init(self, args, *a, **k)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real_init  # type: ignore[method-assign]
        refused, guard.refused = guard.refused, []
    if refused:  # the error was caught on its way: fail all the same
        pytest.fail(f"{MESSAGE}; refused: " + "; ".join(refused), pytrace=False)
