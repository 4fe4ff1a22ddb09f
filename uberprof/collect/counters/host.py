"""Host counters through psutil and /sys: this module holds the CPU and memory source, and
what the other host sources share (rates from growing counters, /sys files); the NICs are
nic.py's, the InfiniBand ports infiniband.py's, the job's own processes processes.py's.

Byte counters are turned into rates (`RateTracker`: bytes per second over the sampling interval)
because every consumer wants rates, and a rate needs the previous reading that only the sampler
has. Link speeds and caps are bytes per second too, so a rate and its ceiling compare
directly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil

from uberprof.collect.counters.store import Row

__all__ = ["HostSource", "RateTracker", "sys_text"]


class RateTracker:
    """Turns monotonically growing counters into per-second rates; a counter that goes back
    (reset, 32-bit wrap) yields no rate for that interval rather than a nonsense one."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[float, float]] = {}

    def rate(self, device: str, metric: str, value: float, t: float) -> float | None:
        key = (device, metric)
        prev = self._last.get(key)
        self._last[key] = (value, t)
        if prev is None:
            return None
        dv, dt = value - prev[0], t - prev[1]
        if dt <= 0 or dv < 0:
            return None
        return dv / dt

    def forget_except(self, devices: set[str]) -> None:
        self._last = {k: v for k, v in self._last.items() if k[0] in devices}


class HostSource:
    """CPU utilisation (mean and busiest core), user/system/iowait, load, memory."""

    name = "host"

    def prime(self) -> None:
        psutil.cpu_percent(percpu=True)
        psutil.cpu_times_percent()

    def sample(self) -> list[Row]:
        per_core = psutil.cpu_percent(percpu=True)
        times = psutil.cpu_times_percent()
        mem = psutil.virtual_memory()
        rows: list[Row] = []
        if per_core:
            rows.append(("cpu", "cpu.util", sum(per_core) / len(per_core), "%"))
            rows.append(("cpu", "cpu.util_max_core", max(per_core), "%"))
        for field in ("user", "system", "iowait"):
            v = getattr(times, field, None)
            if v is not None:
                rows.append(("cpu", f"cpu.{field}", v, "%"))
        try:
            l1, l5, l15 = os.getloadavg()
            rows += [("cpu", "load1", l1, "count"), ("cpu", "load5", l5, "count"),
                     ("cpu", "load15", l15, "count")]
        except OSError:
            pass
        rows += [("mem", "mem.used", mem.used, "B"), ("mem", "mem.available", mem.available, "B"),
                 ("mem", "mem.total", mem.total, "B")]
        try:
            rows.append(("mem", "swap.used", psutil.swap_memory().used, "B"))
        except (OSError, RuntimeError):
            pass
        return rows

    def describe(self) -> dict[str, Any]:
        return {"cpus": psutil.cpu_count(), "cpus_physical": psutil.cpu_count(logical=False)}


def sys_text(path: Path) -> str | None:
    """A /sys file's text, stripped; None where it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None
