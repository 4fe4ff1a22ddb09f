"""What a run says about itself, flattened to `key -> text` so two runs compare key by key:
versions (uberprof, torch, Python), world size, hosts, backend, device type and model, the
command line and the launcher's options. Often the answer to "why is it slower"."""

from __future__ import annotations

import shlex
from typing import Any

from uberprof.analysis.tables.context import RunContext
from uberprof.rundir import RunDir, list_nodes, ranks_by_id

__all__ = ["run_metadata"]

# Keys that always differ between two runs and say nothing about why one is slower.
IGNORED = ("run_id", "start_ns", "end_ns", "pid", "cwd")


def _distinct(values: list[Any]) -> str | None:
    vals = sorted({str(v) for v in values if v not in (None, "", [], {})})
    return ", ".join(vals) if vals else None


def run_metadata(ctx: RunContext) -> dict[str, str]:
    """Flat metadata of a run (traces: what their headers say; run directories: more)."""
    infos = list(ctx.ranks.values())
    meta: dict[str, str | None] = {
        "world_size": _distinct([i.world_size for i in infos]) or str(len(infos)),
        "ranks_traced": str(len(infos)),
        "hosts": _distinct([i.host for i in infos]),
        "host_count": str(len({i.host for i in infos if i.host})) or None,
        "backend": _distinct([i.backend for i in infos]),
        "device_type": _distinct([i.device_type for i in infos]),
        "mode": _distinct([i.mode for i in infos]),
    }
    if ctx.is_run_dir:
        run = RunDir(ctx.root)
        ranks = ranks_by_id(run).values()
        meta["torch_version"] = _distinct([m.raw.get("torch_version") for m in ranks])
        meta["uberprof_version.rank"] = _distinct([m.raw.get("uberprof_version") for m in ranks])
        meta["launcher"] = _distinct([m.raw.get("launcher") for m in ranks])
        meta["gpu_model"] = _distinct([m.device.get("name") for m in ranks])
        meta["gpu_memory_bytes"] = _distinct([m.device.get("total_memory_bytes") for m in ranks])
        meta["script_argv"] = _distinct([shlex.join(map(str, m.raw["argv"])) for m in ranks
                                         if isinstance(m.raw.get("argv"), list)])
        for node in list_nodes(run):
            if node.command:
                meta["command"] = shlex.join(map(str, node.command))
            meta["platform"] = _str(node.raw.get("platform")) or meta.get("platform")
            for k, v in node.versions.items():
                meta[f"version.{k}"] = _str(v)
            for k, v in node.options.items():
                if k not in ("out", "run_id"):
                    meta[f"option.{k}"] = _str(v)
            env = node.raw.get("env")
            if isinstance(env, dict):  # knobs such as NCCL_*, when the collector records them
                for k, v in env.items():
                    meta[f"env.{k}"] = _str(v)
    return {k: v for k, v in sorted(meta.items()) if v is not None and k not in IGNORED}


def _str(v: Any) -> str | None:
    if v is None or v == "":
        return None
    return v if isinstance(v, str) else str(v)
