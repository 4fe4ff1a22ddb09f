"""What this machine lets uberprof collect (the checks behind `uberprof doctor`)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Check:
    name: str
    ok: bool | None  # None: optional and absent
    detail: str


def check_all(out: Path) -> list[Check]:
    return [_torch(), *_distributed(), _nvml(), _dcgm(), _psutil(), _writable(out)]


def _torch() -> Check:
    try:
        import torch
    except ImportError as exc:
        return Check("torch", False, f"not importable ({exc}): nothing can be collected")
    if torch.cuda.is_available():
        kind = "ROCm" if getattr(torch.version, "hip", None) else "CUDA"
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        detail = (f"{torch.__version__}, {kind} {torch.version.hip or torch.version.cuda}, "
                  f"{torch.cuda.device_count()} GPU(s): {', '.join(names)}")
    else:
        detail = f"{torch.__version__}, no GPU: CPU activity and Gloo only"
    return Check("torch", True, detail)


def _distributed() -> list[Check]:
    import torch.distributed as dist

    if not dist.is_available():
        return [Check("torch.distributed", False, "not built into this torch")]
    out = [Check("gloo", dist.is_gloo_available(), "CPU collectives")]
    nccl = dist.is_nccl_available()
    detail = "GPU collectives"
    if nccl:
        try:
            import torch

            detail += f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
        except Exception:  # noqa: BLE001
            pass
    out.append(Check("nccl", nccl if nccl else None, detail if nccl else "not available"))
    return out


def _nvml() -> Check:
    try:
        import pynvml
    except ImportError:
        return Check("nvml", None, "nvidia-ml-py is not installed: no GPU counters")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Check("nvml", None, f"no NVIDIA GPU or driver ({exc}): no GPU counters")
    try:
        n = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return Check("nvml", True, f"driver {driver}, {n} GPU(s): GPU counters available")
    finally:
        pynvml.nvmlShutdown()


def _dcgm() -> Check:
    if importlib.util.find_spec("pydcgm") or importlib.util.find_spec("dcgm_structs"):
        return Check("dcgm", True, "bindings found: --counters dcgm can add profiling fields")
    return Check("dcgm", None, "bindings not installed (they ship with DCGM, not PyPI)")


def _psutil() -> Check:
    ok = importlib.util.find_spec("psutil") is not None
    return Check("psutil", ok, "host CPU, memory and NIC counters" if ok else "missing")


def _writable(out: Path) -> Check:
    target = out if out.exists() else next((p for p in out.absolute().parents if p.exists()), out)
    try:
        with tempfile.NamedTemporaryFile(dir=target):
            pass
    except OSError as exc:
        return Check("output", False, f"cannot write under {target}: {exc.strerror or exc}")
    free = os.statvfs(target)
    gib = free.f_bavail * free.f_frsize / 2**30
    return Check("output", True, f"{out} writable, {gib:.0f} GiB free")
