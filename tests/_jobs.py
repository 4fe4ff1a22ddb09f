"""Running real jobs under `uberprof run` from tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from uberprof.collect.runid import option_value

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SCRIPTS = ROOT / "tests" / "scripts"
PY = sys.executable

# Time limits (s): a bound of the samples' work on an idle core, measured with margin (a
# 14-step 4-rank DDP run under `uberprof run` takes 40-50 s on 2 cores at a load of 6 per
# core, i.e. about 4 s of idle-core work per rank), times SAFETY, times how loaded the machine
# is now; below pytest-timeout's 600 s so a stuck job ends with its output, not a stack dump.
START_S = 30.0  # interpreter, torch import, process group, uberprof's start and finish
STEP_S = 0.5  # one step of the samples' default model, one rank
SAFETY = 3.0
FLOOR_S = 60.0
CEILING_S = 540.0


def torchrun(nproc: int, script: Path | str, *args: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(script), *args]


def load_factor() -> float:
    """How many times slower than on an idle machine work runs now: runnable tasks per CPU
    over the last minute, at least 1 (a shared CI machine's other jobs, a stress loop)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def time_limit(idle_s: float) -> float:
    """A limit for work that takes at most `idle_s` on an idle machine: generous enough that a
    healthy run under load never reaches it, bounded so that a stuck one still ends."""
    return min(CEILING_S, max(FLOOR_S, idle_s * SAFETY * load_factor()))


def browser_timeout_ms(idle_s: float = 10.0) -> float:
    """Playwright's limit for one action or wait (its own default, 30 s, failed under load)."""
    return time_limit(idle_s) * 1000


def job_limit(command: Sequence[str]) -> float:
    """time_limit of a training job from its command: `--steps` (30 by default, the samples'),
    and its ranks (`--nproc_per_node`, `--nprocs`), which share the CPUs."""
    steps = option_value(command, "--steps")
    ranks = option_value(command, "--nproc_per_node", "--nprocs")
    n_steps = int(steps) if steps and steps.isdigit() else 30
    n_ranks = int(ranks) if ranks and ranks.isdigit() else 1
    per_cpu = max(1.0, n_ranks / (os.cpu_count() or 1))
    return time_limit((START_S + n_steps * STEP_S) * per_cpu)


def stop(procs: Sequence[subprocess.Popen[str]], grace_s: float = 15.0) -> None:
    """End processes a test gave up on: SIGTERM first, which `uberprof run` passes to its whole
    job (a SIGKILL would leave the job's ranks behind), then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UBERPROF_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def uberprof_run(out: Path, run_id: str, command: list[str], *options: str,
                 timeout: float | None = None, env: dict[str, str] | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
    """`uberprof run --out OUT --run-id ID [options] -- command`, captured; the time limit is
    the job's (`job_limit`) unless given."""
    cmd = [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id, *options,
           "--", *command]
    limit = job_limit(command) if timeout is None else timeout
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env or job_env()) as p:
        try:
            stdout, stderr = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            stop([p])
            stdout, stderr = p.communicate()
            raise AssertionError(f"uberprof run still running after {limit:.0f} s (stopped):\n"
                                 f"{stdout}\n{stderr[-4000:]}") from None
    proc = subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"uberprof run failed ({proc.returncode}):\n{proc.stdout}\n"
                             f"{proc.stderr[-4000:]}")
    return proc


def info_json(*runs: Path) -> dict[str, Any]:
    proc = subprocess.run([PY, "-m", "uberprof", "info", "--json", *map(str, runs)],
                          capture_output=True, text=True, timeout=time_limit(40),
                          env=job_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_ranks(info: dict[str, Any], world: int, steps: int, window: list[int] | None) -> None:
    """`uberprof info --json` of a finished healthy job: ranks 0..world-1, each with `steps`
    steps from 0 and the trace `window` (None: no window), no problem, exit code 0."""
    assert [r["rank"] for r in info["ranks"]] == list(range(world)), info["problems"]
    for r in info["ranks"]:
        assert r["steps"] == steps, (r["rank"], r["steps"])
        assert r["first_step"] == 0 and r["last_step"] == steps - 1
        assert r["finished"]
        if window is None:
            assert r["trace_windows"] == []
        else:
            assert [w["steps"] for w in r["trace_windows"]] == [window]
    assert info["problems"] == []
    assert info["exit_code"] == 0


def load_script(path: Path, name: str) -> ModuleType:
    """A script of benchmarks/ or samples/ imported as module `name` (registered in sys.modules
    first: its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


def followed_job(stop: Path) -> list[str]:
    """A 2-rank DDP job of the sample's model whose steps are slow (rank 1 waits 60 ms for each
    batch, rank 0 for rank 1) and that ends, exit 0, after the step in which `stop` appears
    (tests/scripts/ddp_until_stopped.py; at the latest after CEILING_S): something to follow
    for as long as a test looks, whatever the load, and no longer."""
    return torchrun(2, SCRIPTS / "ddp_until_stopped.py", "--stop", str(stop),
                    "--max-seconds", str(CEILING_S), "--slow-data-rank", "1",
                    "--data-delay-ms", "60")


def start_followed_job(out: Path, run_id: str, stop: Path, *options: str,
                       stderr: Any = subprocess.DEVNULL) -> subprocess.Popen[str]:
    """`followed_job(stop)` under `uberprof run [options]` (`--no-trace` unless `options` name
    a window), started in the background."""
    trace = [] if any(o.startswith("--trace") for o in options) else ["--no-trace"]
    return subprocess.Popen(
        [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id, *trace, *options,
         "--", *followed_job(stop)],
        stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=job_env())


def wait_for_steps(run: Path, steps: int, job: subprocess.Popen[str], limit: float) -> None:
    """Wait until every rank of running `job` has finished `steps` steps (its step timelines)."""
    from uberprof.rundir.follow import RunFollower

    deadline = time.monotonic() + limit
    follower = RunFollower(run)
    while follower.poll().steps < steps:
        assert job.poll() is None, f"the job ended (exit {job.returncode}) before step {steps}"
        assert time.monotonic() < deadline, f"no step {steps} in {limit:.0f} s"
        time.sleep(0.2)
