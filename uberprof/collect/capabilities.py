"""What this machine lets uberprof collect (the checks behind `uberprof doctor`)."""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Check:
    name: str
    ok: bool | None  # None: optional and absent
    detail: str


def check_all(out: Path) -> list[Check]:
    return [_torch(), *_distributed(), *_nvml(), _dcgm(), _psutil(), *_network(), _writable(out)]


def counter_backends(checks: list[Check]) -> list[str]:
    """What the node sampler of `uberprof run` would read on this machine, for doctor's summary."""
    ok = {c.name for c in checks if c.ok}
    out = []
    if "psutil" in ok:
        out.append("host CPU/memory/NICs" + (" + InfiniBand" if "infiniband" in ok else ""))
    if "nvml" in ok:
        out.append("GPU via NVML" + (" + GPM" if "gpm" in ok else ""))
    if "dcgm" in ok:
        out.append("DCGM profiling fields with --counters dcgm")
    return out


def torch_build_has_gpu() -> bool | None:
    """Whether the torch this environment imports was built for CUDA or ROCm, read from its
    version.py without importing torch (seconds and memory in the node agent); None if unknown.
    A CPU-only build expects no GPU, so a missing NVML is not news there."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    builds = re.findall(r"^(?:cuda|hip)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.MULTILINE)
    return any(b != "None" for b in builds) if builds else None


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


def _nvml() -> list[Check]:
    try:
        import pynvml
    except ImportError:
        return [Check("nvml", None, "nvidia-ml-py is not installed: no GPU counters")]
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [Check("nvml", None, f"no NVIDIA GPU or driver ({exc}): no GPU counters")]
    try:
        n = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
        checks = [Check("nvml", True, f"driver {driver}, {n} GPU(s): GPU counters available")]
        gpm = 0
        for i in range(n):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                gpm += bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            except (pynvml.NVMLError, AttributeError):
                pass
        checks.append(Check("gpm", True if gpm else None,
                            f"{gpm} of {n} GPU(s): SM/tensor activity, DRAM, NVLink, PCIe rates"
                            if gpm else "not supported (Hopper or newer): no GPM metrics"))
        return checks
    finally:
        pynvml.nvmlShutdown()


def _dcgm() -> Check:
    from uberprof.collect.counters.dcgm import bindings_location

    where = bindings_location()
    if where is None:
        return Check("dcgm", None, "bindings not installed (they ship with DCGM, not PyPI)")
    engine = _listening("127.0.0.1", 5555)
    how = ("a host engine is running: --counters dcgm connects to it" if engine else
           "no host engine running: --counters dcgm starts an embedded one")
    return Check("dcgm", True, f"bindings at {Path(where).parent}; {how}")


def _listening(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _network() -> list[Check]:
    """NICs with their speed and tc cap, and InfiniBand ports: the links the counters watch."""
    from uberprof.collect.counters.infiniband import InfinibandSource
    from uberprof.collect.counters.nic import NicSource

    nic = NicSource()
    try:
        nic.prime()
        nic.sample_links()
    except Exception as exc:  # noqa: BLE001
        return [Check("nics", None, f"cannot list network interfaces ({exc})")]
    parts = []
    for name, info in sorted(nic.links.items()):
        speed = info.get("link_speed")
        desc = f"{speed * 8 / 1e9:g} Gbit/s" if speed else "speed unknown"
        if info.get("tc_rate"):
            desc += f", tc cap {info['tc_rate'] * 8 / 1e9:g} Gbit/s"
        parts.append(f"{name} ({desc})")
    tc = "" if nic.tc_available else "; no `tc`: caps set with tc cannot be read"
    checks = [Check("nics", True if parts else None,
                    (", ".join(parts) if parts else "no network interface up") + tc)]
    ib = InfinibandSource()
    ib.sample_links()
    if ib.ports:
        ports = ", ".join(f"{p} ({(i.get('rate') or 0) * 8 / 1e9:g} Gbit/s)"
                          for p, i in ib.ports.items())
        checks.append(Check("infiniband", True, ports))
    else:
        checks.append(Check("infiniband", None, "no InfiniBand ports"))
    return checks


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
