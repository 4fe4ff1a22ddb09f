"""What a run says about itself, flattened to `key -> text` so two runs compare key by key:
versions (uberprof, torch, Python, CUDA, NCCL), world size, hosts, backend, device type, GPU
model and count, the command line and the launcher's options. Often the answer to "why is it
slower". The traces' own headers (`ingest/head.py`) give the GPU model and count and the
versions Kineto wrote, also for a folder of traces that has no run directory around it.

`JOB_KEYS` are the keys that say what changed under the job (`compare.job_changes`): the
hardware, its count, the versions and the parallelism, named before any time is attributed to
operators."""

from __future__ import annotations

import shlex
from typing import Any

from uberprof.analysis.tables.context import RunContext
from uberprof.ingest.head import trace_head
from uberprof.rundir import RunDir, list_nodes, ranks_by_id

__all__ = ["JOB_KEYS", "run_metadata"]

# What changed under the job, in the order `diff` names it, with the words it uses.
JOB_KEYS = {"gpu_model": "GPU model", "gpu_count": "GPUs visible to a process",
            "world_size": "world size", "host_count": "hosts",
            "parallelism": "parallelism", "torch_version": "PyTorch",
            "cuda_runtime_version": "CUDA runtime",
            "cuda_driver_version": "CUDA driver", "nccl_version": "NCCL",
            "compute_capability": "compute capability", "gpu_memory_bytes": "GPU memory"}
HEAD_RANKS = 8  # ranks whose trace heads are read
_VERSION_KEYS = ("cuda_runtime_version", "cuda_driver_version", "cupti_version",
                 "hip_runtime_version", "rocm_version")

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
    meta.update(_trace_heads(ctx))
    if ctx.is_run_dir:
        run = RunDir(ctx.root)
        ranks = ranks_by_id(run).values()
        meta["torch_version"] = _distinct([m.raw.get("torch_version") for m in ranks])
        meta["uberprof_version.rank"] = _distinct([m.raw.get("uberprof_version") for m in ranks])
        meta["launcher"] = _distinct([m.raw.get("launcher") for m in ranks])
        meta["gpu_model"] = _distinct([m.device.get("name") for m in ranks]) \
            or meta.get("gpu_model")
        meta["gpu_memory_bytes"] = _distinct([m.device.get("total_memory_bytes")
                                              for m in ranks]) or meta.get("gpu_memory_bytes")
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


def _trace_heads(ctx: RunContext) -> dict[str, str | None]:
    """What the first `HEAD_RANKS` ranks' trace heads say: GPU model, count, memory and compute
    capability (`deviceProperties`), the NCCL version (`distributedInfo`) and the CUDA/CUPTI
    versions where Kineto wrote them."""
    heads = []
    for r in sorted(ctx.rank_ids)[:HEAD_RANKS]:
        for path in ctx.run.trace_files(r)[:1]:
            heads.append(trace_head(path))
    devs = [h.get("deviceProperties") for h in heads]
    devs = [d for d in devs if isinstance(d, list) and d]
    props = [p for d in devs for p in d if isinstance(p, dict)]
    dist = [h.get("distributedInfo") for h in heads if isinstance(h.get("distributedInfo"), dict)]
    out: dict[str, str | None] = {
        "gpu_model": _distinct([p.get("name") for p in props]),
        "gpu_count": _distinct([len(d) for d in devs]),
        "gpu_memory_bytes": _distinct([p.get("totalGlobalMem") for p in props]),
        "compute_capability": _distinct([f"{p.get('computeMajor')}.{p.get('computeMinor')}"
                                         for p in props if p.get("computeMajor") is not None]),
        "nccl_version": _distinct([d.get("nccl_version") for d in dist]),
    }
    for k in _VERSION_KEYS:
        out[k] = _distinct([h.get(k) for h in heads])
    return out
