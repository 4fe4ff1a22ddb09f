"""What `uberprof run` must never do to the user: run a typo, widen imports, hang a terminal."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._jobs import PY, ROOT, job_env

BASE_PY = getattr(sys, "_base_executable", "") or ""


def _uberprof(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = job_env(PYTHONPATH=str(ROOT))
    return subprocess.run([PY, "-m", "uberprof", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout, check=False)


@pytest.mark.parametrize("typo, suggestion", [("--hang-timout", None),
                                              ("--trace-step", "--trace-steps")])
def test_unknown_option_is_an_error_not_the_command(tmp_path: Path, typo: str,
                                                    suggestion: str | None) -> None:
    out = tmp_path / "runs"
    proc = _uberprof(tmp_path, "run", "--out", str(out), typo, "15", "--", PY, "-c", "pass")
    assert proc.returncode == 2, proc.stderr
    assert f"No such option '{typo}'" in proc.stderr
    assert suggestion is None or suggestion in proc.stderr
    assert "was not found" not in proc.stderr
    assert not out.exists(), "a mistyped option created a run directory"


def test_command_without_double_dash_still_runs(tmp_path: Path) -> None:
    proc = _uberprof(tmp_path, "run", "--out", str(tmp_path / "runs"), PY, "-c",
                     "import sys; print('ran', sys.argv[1:])", "--flag", "x")
    assert proc.returncode == 0, proc.stderr
    assert "ran ['--flag', 'x']" in proc.stdout


def _bare_env() -> dict[str, str]:
    env = job_env()
    env.pop("PYTHONPATH", None)
    return env


def _no_uberprof_in(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import uberprof"], capture_output=True,
                           env=_bare_env(), cwd="/", check=False)
    return probe.returncode != 0


@pytest.mark.skipif(not BASE_PY or not _no_uberprof_in(BASE_PY),
                    reason="needs an interpreter without uberprof installed")
@pytest.mark.parametrize("neighbour", ["tests", "samples"])
def test_bootstrap_makes_only_uberprof_importable(tmp_path: Path, neighbour: str) -> None:
    # Another interpreter than uberprof's own: the bootstrap loads uberprof from UBERPROF_HOME,
    # and must not make the folders beside it importable.
    code = (f"import sys\ntry:\n    import {neighbour}\nexcept ImportError:\n    print('no')\n"
            "else:\n    print('yes')\nprint('uberprof' in sys.modules)\n")
    plain = subprocess.run([BASE_PY, "-c", code], capture_output=True, text=True,
                           cwd=tmp_path, env=_bare_env(), timeout=60, check=False)
    assert plain.stdout.splitlines() == ["no", "False"]
    # The job keeps only the bootstrap folder that uberprof put first on PYTHONPATH, so that
    # the checkout under test (on this test's PYTHONPATH) is reachable through UBERPROF_HOME only.
    job = ["sh", "-c", 'PYTHONPATH="${PYTHONPATH%%:*}" exec "$0" -c "$1"', BASE_PY, code]
    proc = subprocess.run([PY, "-m", "uberprof", "run", "--out", str(tmp_path / "runs"),
                           "--counters", "none", "--", *job], capture_output=True, text=True,
                          cwd=tmp_path, env=job_env(PYTHONPATH=str(ROOT)), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["no", "True"], proc.stderr
    assert "bootstrap failed" not in proc.stderr


# ---- a terminal: the job reads it, Ctrl-C and Ctrl-Z reach it -----------------------------------


# A job that says when it is ready, then waits for a Ctrl-C and exits 9 on it.
INTERRUPTIBLE = ("import time\ntry:\n    print('ready', flush=True); time.sleep(60)\n"
                 "except KeyboardInterrupt:\n    print('got INT', flush=True); raise SystemExit(9)")


class _Pty:
    """`uberprof run -- ...` as the foreground job of a fresh terminal (its own session)."""

    def __init__(self, tmp_path: Path, code: str, argv: list[str] | None = None) -> None:
        argv = argv or [PY, "-m", "uberprof", "run", "--out", str(tmp_path / "runs"),
                        "--counters", "none", "--", PY, "-c", code]
        env = job_env(PYTHONPATH=str(ROOT))
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec at once
            os.chdir(tmp_path)
            os.execve(PY, argv, env)
        self.output = b""

    def read_until(self, text: bytes, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {text!r} after {timeout} s: {self.output!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # EIO: the terminal's last process is gone
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"terminal closed before {text!r}: {self.output!r}")
                self.output += chunk

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout: float = 60, untraced: bool = False) -> int:
        """The wait status of `uberprof run` (a stop too with untraced)."""
        deadline = time.monotonic() + timeout
        flags = os.WNOHANG | (os.WUNTRACED if untraced else 0)
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, flags)
            if pid:
                return status
            try:  # keep the terminal drained so the job never blocks on output
                if select.select([self.fd], [], [], 0.1)[0]:
                    self.output += os.read(self.fd, 4096)
            except OSError:
                time.sleep(0.1)
        self.kill()
        raise AssertionError(f"uberprof run still running after {timeout} s: {self.output!r}")

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def terminal(tmp_path: Path):
    started: list[_Pty] = []

    def start(code: str, argv: list[str] | None = None) -> _Pty:
        started.append(_Pty(tmp_path, code, argv))
        return started[-1]

    yield start
    for t in started:
        t.kill()
        try:
            os.waitpid(t.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        os.close(t.fd)


def test_job_reads_the_terminal(terminal) -> None:
    t = terminal("print('answer:', input('question? '))")
    t.read_until(b"question? ")
    t.write(b"forty-two\n")
    t.read_until(b"answer: forty-two")
    status = t.wait()
    assert os.waitstatus_to_exitcode(status) == 0, t.output


def test_ctrl_c_in_the_terminal_reaches_the_job(terminal) -> None:
    t = terminal(INTERRUPTIBLE)
    t.read_until(b"ready")
    t.write(b"\x03")
    t.read_until(b"got INT")
    assert os.waitstatus_to_exitcode(t.wait()) == 9, t.output


def test_ctrl_c_before_uberprof_is_ready_reaches_the_job(terminal) -> None:
    # On a busy machine the job can be up and reading the keyboard while uberprof still starts
    # its own parts (here: 3 s); a Ctrl-C typed then must reach the job all the same.
    launcher = ("import os, sys, time\nfrom uberprof.collect.launcher import run_wrapped\n"
                "sys.exit(run_wrapped(sys.argv[1:], os.environ, lambda pid: time.sleep(3)))")
    t = terminal("", [PY, "-c", launcher, PY, "-c", INTERRUPTIBLE])
    t.read_until(b"ready")
    t.write(b"\x03")
    t.read_until(b"got INT", timeout=30)
    assert os.waitstatus_to_exitcode(t.wait()) == 9, t.output


def test_ctrl_z_stops_uberprof_and_continue_resumes_the_job(terminal) -> None:
    t = terminal("print('ready', flush=True)\nprint('after:', input())")
    t.read_until(b"ready")
    t.write(b"\x1a")  # Ctrl-Z: the job stops, and uberprof run with it (the shell's view)
    status = t.wait(untraced=True)
    assert os.WIFSTOPPED(status), t.output
    os.kill(t.pid, signal.SIGCONT)  # what `fg` sends; uberprof still holds the terminal
    t.write(b"resumed\n")
    t.read_until(b"after: resumed")
    assert os.waitstatus_to_exitcode(t.wait()) == 0, t.output


def test_a_run_leaves_no_lock_file(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([PY, "-m", "uberprof", "run", "--out", str(tmp_path / "runs"),
                           "--counters", "host", "--", PY, "-c", "import time; time.sleep(1)"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=job_env(PYTHONPATH=str(ROOT), TMPDIR=str(tmp)), check=False)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp.rglob("*.lock")) == []
