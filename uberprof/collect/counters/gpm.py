"""GPU Performance Monitoring (GPM) metrics on Hopper and newer, through NVML.

GPM answers what plain utilisation cannot: how busy the SMs really are, tensor core activity,
DRAM bandwidth, and PCIe/NVLink rates, without blocking calls and without conflicting with CUPTI
tracing. A metric is computed from two samples at least ~100 ms apart; here each slow tick takes
one sample and reports the metrics over the whole interval since the previous tick.
"""

from __future__ import annotations

import time
from typing import Any

from uberprof.collect.counters.nvml import Gpu, Nvml
from uberprof.collect.counters.store import Row

MIB = 1024.0 * 1024.0

GPM_METRICS: tuple[tuple[int, str, str, float], ...] = (
    # NVML_GPM_METRIC_* id, metric, unit, scale
    (1, "gpm.gr_engine_active", "%", 1.0),
    (2, "gpm.sm_active", "%", 1.0),
    (3, "gpm.sm_occupancy", "%", 1.0),
    (5, "gpm.tensor_active", "%", 1.0),
    (7, "gpm.hmma_tensor_active", "%", 1.0),
    (10, "gpm.dram_bw_util", "%", 1.0),
    (11, "gpm.fp64_active", "%", 1.0),
    (12, "gpm.fp32_active", "%", 1.0),
    (13, "gpm.fp16_active", "%", 1.0),
    (20, "gpm.pcie.tx_rate", "B/s", MIB),  # MiB/s
    (21, "gpm.pcie.rx_rate", "B/s", MIB),
    (60, "gpm.nvlink.rx_rate", "B/s", MIB),
    (61, "gpm.nvlink.tx_rate", "B/s", MIB),
)
MIN_INTERVAL_S = 0.1


class GpmSource:
    """Two alternating sample buffers per supported GPU; metrics over each slow interval."""

    name = "gpm"

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.nv = nvml.nv
        self._samples: dict[str, list[Any]] = {}  # label -> [previous, next]
        self._taken: dict[str, float] = {}  # label -> when the previous sample was taken
        self.supported: list[str] = []

    def setup(self) -> list[str]:
        """Allocate buffers on the GPUs that support GPM; returns their labels."""
        nv = self.nv
        for g in self.nvml.gpus:
            try:
                support = nv.nvmlGpmQueryDeviceSupport(g.handle)
                if not getattr(support, "isSupportedDevice", 0):
                    g.info["gpm"] = False
                    continue
                bufs = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                nv.nvmlGpmSampleGet(g.handle, bufs[0])
                self._taken[g.label] = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - pre-Hopper, old driver/bindings, MIG
                g.info["gpm"] = False
                g.info["gpm_error"] = str(exc) or type(exc).__name__
                continue
            g.info["gpm"] = True
            self._samples[g.label] = bufs
            self.supported.append(g.label)
        return self.supported

    def covers_pcie(self, g: Gpu) -> bool:
        """Whether GPM gives this GPU's PCIe rates (so the blocking NVML call can be skipped)."""
        return g.label in self._samples and "gpm.pcie.tx_rate" not in g.unsupported

    def prime(self) -> None:
        pass

    def sample(self) -> list[Row]:
        rows: list[Row] = []
        for g in self.nvml.gpus:
            bufs = self._samples.get(g.label)
            now = time.monotonic()
            if bufs is None or now - self._taken.get(g.label, 0.0) < MIN_INTERVAL_S:
                continue  # GPM needs its two samples >= 100 ms apart
            try:
                self.nv.nvmlGpmSampleGet(g.handle, bufs[1])
                self._taken[g.label] = now
                rows += self._metrics(g, bufs[0], bufs[1])
            except Exception as exc:  # noqa: BLE001
                n = g.failures.get("gpm", 0) + 1
                g.failures["gpm"] = n
                if n >= 5:
                    g.unsupported["gpm"] = f"failing: {exc}"
                    self._free(g.label)
                continue
            g.failures.pop("gpm", None)
            bufs.reverse()  # the newest sample starts the next interval
        return rows

    def _metrics(self, g: Gpu, first: Any, second: Any) -> list[Row]:
        nv = self.nv
        wanted = [m for m in GPM_METRICS if m[1] not in g.unsupported]
        if not wanted:
            return []
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(wanted)
        mg.sample1 = first
        mg.sample2 = second
        for i, (mid, _, _, _) in enumerate(wanted):
            mg.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        rows: list[Row] = []
        for i, (_mid, metric, unit, scale) in enumerate(wanted):
            m = mg.metrics[i]
            if getattr(m, "nvmlReturn", 0) != 0:
                g.unsupported[metric] = f"GPM: NVML error {m.nvmlReturn}"
                continue
            rows.append((g.label, metric, float(m.value) * scale, unit))
        return rows

    def _free(self, label: str) -> None:
        for buf in self._samples.pop(label, []):
            try:
                self.nv.nvmlGpmSampleFree(buf)
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        for label in list(self._samples):
            self._free(label)

    def describe(self) -> dict[str, Any]:
        return {"gpm_gpus": self.supported}
