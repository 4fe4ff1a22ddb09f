"""Running real jobs under `uberprof run` from tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SCRIPTS = ROOT / "tests" / "scripts"
PY = sys.executable


def torchrun(nproc: int, script: Path | str, *args: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(script), *args]


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UBERPROF_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def uberprof_run(out: Path, run_id: str, command: list[str], *options: str,
                 timeout: float = 300, env: dict[str, str] | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
    """`uberprof run --out OUT --run-id ID [options] -- command`, captured."""
    cmd = [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id, *options,
           "--", *command]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env or job_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"uberprof run failed ({proc.returncode}):\n{proc.stdout}\n"
                             f"{proc.stderr[-4000:]}")
    return proc


def info_json(*runs: Path) -> dict[str, Any]:
    proc = subprocess.run([PY, "-m", "uberprof", "info", "--json", *map(str, runs)],
                          capture_output=True, text=True, timeout=120, env=job_env())
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def load_script(path: Path, name: str) -> ModuleType:
    """A script of benchmarks/ or samples/ imported as module `name` (registered in sys.modules
    first: its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


def start_slow_job(out: Path, run_id: str, steps: int, *options: str,
                   stderr: Any = subprocess.DEVNULL) -> subprocess.Popen[str]:
    """A 2-rank samples/train_ddp.py job of `steps` slow steps (60 ms of data wait each) under
    `uberprof run --no-trace [options]`, started in the background: something to follow."""
    return subprocess.Popen(
        [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id, "--no-trace",
         *options, "--", *torchrun(2, SAMPLES / "train_ddp.py", "--steps", str(steps),
                                   "--data-delay-ms", "60")],
        stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=job_env())
