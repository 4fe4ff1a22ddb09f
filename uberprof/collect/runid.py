"""Run identity: the nodes of one job must land in the same run directory without extra flags.

The id comes, first that applies, from `--run-id`; from the launcher's command line (torchrun's
`--rdzv-id`); from the scheduler (Slurm, PBS, LSF, SGE, Kubernetes' PyTorchJob); else it is
generated from the time and a short random part, which serves single-node runs.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence

_SCHEDULER_VARS = (
    ("SLURM_JOB_ID", "slurm"),
    ("PBS_JOBID", "pbs"),
    ("LSB_JOBID", "lsf"),
    ("JOB_ID", "sge"),
)


def resolve_run_id(
    explicit: str | None,
    command: Sequence[str],
    environ: Mapping[str, str],
    per_process: bool = False,
) -> str:
    """The run id for this job; `per_process` when called inside a rank rather than a launcher."""
    if explicit:
        return sanitize(explicit)
    rdzv = torchrun_rdzv_id(command)
    if rdzv:
        return sanitize(rdzv)
    if per_process:
        elastic = environ.get("TORCHELASTIC_RUN_ID")
        if elastic and elastic != "none":
            return sanitize(elastic)
    for var, prefix in _SCHEDULER_VARS:
        value = environ.get(var)
        if value:
            step = environ.get("SLURM_STEP_ID") if var == "SLURM_JOB_ID" else None
            return sanitize(f"{prefix}-{value}" + (f".{step}" if step else ""))
    if per_process and environ.get("MASTER_ADDR") and int(environ.get("WORLD_SIZE", "1")) > 1:
        # Ranks of one job without a shared id: the rendezvous address is what they share.
        day = time.strftime("%Y%m%d")
        return sanitize(f"{day}-{environ['MASTER_ADDR']}-{environ.get('MASTER_PORT', '')}")
    return generate()


def generate() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def torchrun_rdzv_id(command: Sequence[str]) -> str | None:
    """`--rdzv-id X`, `--rdzv_id=X` (torchrun's two spellings), when the command is torchrun."""
    if not is_torchrun(command):
        return None
    return option_value(command, "--rdzv-id", "--rdzv_id")


def option_value(command: Sequence[str], *names: str) -> str | None:
    """The value of the first of `names` in a command line (`--name value` or `--name=value`),
    None when it has none."""
    for i, arg in enumerate(command):
        for name in names:
            if arg == name and i + 1 < len(command):
                return command[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def is_torchrun(command: Sequence[str]) -> bool:
    head = " ".join(command[:3])
    return bool(re.search(r"(^|/)torchrun\b|torch\.distributed\.(run|launch)\b", head))


def sanitize(run_id: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", run_id.strip())
    if not clean or clean in (".", ".."):
        raise ValueError(f"unusable run id: {run_id!r}")
    return clean
