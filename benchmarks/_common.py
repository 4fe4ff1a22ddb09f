"""What the benchmark scripts share: the repository on sys.path (they run from a checkout, not
an installed uberprof), a command line whose help is the script's docstring, a job run so that
no rank outlives the benchmark, and a command's JSON document."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests._jobs import PY, job_env  # noqa: E402  (the repository is on sys.path now)

__all__ = ["ROOT", "doc_parser", "json_option", "run_job", "synth_options", "uberprof_json"]


def doc_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the docstring's first paragraph, the rest as its epilog."""
    first, _, rest = doc.partition("\n\n")
    return argparse.ArgumentParser(description=first, epilog=rest,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def synth_options(p: argparse.ArgumentParser, steps: int) -> None:
    """The size of the synthetic run a benchmark writes (synth_run.py): ranks and steps."""
    p.add_argument("--ranks", type=int, default=64, help="ranks of the synthetic run")
    p.add_argument("--steps", type=int, default=steps, help="steps in each rank's timeline")


def json_option(p: argparse.ArgumentParser, what: str = "result") -> None:
    p.add_argument("--json", action="store_true", help=f"print the {what} as JSON")


def run_job(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`cmd` (an `uberprof run`) captured; on a timeout or when the benchmark is ended
    (SIGTERM, Ctrl-C) it gets SIGTERM first, which it passes on to the job's own process
    group, so that no rank outlives the benchmark (SIGKILL after a grace period)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=job_env())
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stop(proc: subprocess.Popen[Any], grace_s: float = 30, drain: bool = True) -> None:
    """SIGTERM (an `uberprof` command passes it on to what it started), SIGKILL after
    `grace_s`. `drain`: read its pipes meanwhile (a child blocked on a full pipe cannot exit);
    False where another thread already reads them."""
    proc.terminate()
    finish = proc.communicate if drain else proc.wait
    try:
        finish(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        finish()


def uberprof_json(args: list[str], timeout: float) -> dict[str, Any]:
    """The JSON document of `uberprof ARGS` (a command run with --json); a command that prints
    none (it failed) raises with its exit code and the end of its stderr."""
    proc = subprocess.run([PY, "-m", "uberprof", *args], capture_output=True, text=True,
                          timeout=timeout, env=job_env(), check=False)
    if not proc.stdout.strip():
        raise RuntimeError(f"uberprof {' '.join(args)} exited {proc.returncode} with no "
                           f"document: {proc.stderr.strip()[-800:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc
