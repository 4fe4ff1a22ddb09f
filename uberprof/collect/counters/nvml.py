"""GPU counters through NVML (`pynvml`, from the nvidia-ml-py package).

Two tiers, because NVML calls take a driver lock that the job's own CUDA calls also need:
the cheap set (utilisation, clocks, clock event reasons, power, energy, temperatures, memory,
NVLink byte counters, XID events) runs at the fast rate; the rest (maximum clocks, power limit,
ECC counts, PCIe link, PCIe throughput, which blocks ~20 ms per call) at the slow one.

A value the GPU or driver does not support is asked for once, then listed under the device's
`unsupported` in meta.json and never asked again: no rows, never a row of NaNs.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Any

from uberprof.collect.counters.store import Row
from uberprof.rundir.counters import normalize_gpu_uuid

ALL_LINKS = 0xFFFFFFFF
"""NVML field scope meaning "summed over all NVLinks" for the throughput fields."""
FI_MEMORY_TEMP = 82
FI_NVLINK_TX = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB, cumulative
FI_NVLINK_RX = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError

CLOCKS_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
"""nvmlClocksEventReason* bits (the same values as the older nvmlClocksThrottleReason*)."""

SLOWDOWN_MASK = 0x004 | 0x008 | 0x020 | 0x040 | 0x080
"""Reasons that mean the GPU runs slower than it could: power cap, thermal, HW slowdown, brake."""


def decode_clocks_event_reasons(mask: int) -> list[str]:
    """Names of the bits set in a clock event (throttle) reasons mask; unknown bits as hex."""
    names = [name for bit, name in CLOCKS_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCKS_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"0x{bit:x}")
            rest &= ~bit
        bit <<= 1
    return names


class NvmlUnavailable(Exception):
    """No usable NVML: no library, no driver, no GPU, or no permission."""


def _raise(exc: BaseException) -> Any:
    raise exc


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class Gpu:
    index: int
    handle: Any
    label: str
    info: dict[str, Any] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)


class Nvml:
    """An initialised NVML with its device handles; shared by the NVML and GPM sources."""

    def __init__(self, nv: ModuleType) -> None:
        self.nv = nv
        self.gpus: list[Gpu] = []
        self.driver: str | None = None
        self._unsupported_codes = {getattr(nv, name, code) for name, code in (
            ("NVML_ERROR_NOT_SUPPORTED", 3), ("NVML_ERROR_NO_PERMISSION", 4),
            ("NVML_ERROR_FUNCTION_NOT_FOUND", 13), ("NVML_ERROR_INVALID_ARGUMENT", 2))}

    @classmethod
    def open(cls, module: ModuleType | None = None) -> Nvml:
        """Initialise NVML; raises NvmlUnavailable with the reason in NVML's words."""
        try:
            nv = module or importlib.import_module("pynvml")
        except ImportError as exc:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from None
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(str(exc) or type(exc).__name__) from None
        except OSError as exc:
            raise NvmlUnavailable(str(exc)) from None
        self = cls(nv)
        try:
            count = nv.nvmlDeviceGetCount()
            try:
                self.driver = _text(nv.nvmlSystemGetDriverVersion())
            except nv.NVMLError:
                pass
            for i in range(count):
                try:
                    handle = nv.nvmlDeviceGetHandleByIndex(i)
                except nv.NVMLError as exc:  # no permission on this one: skip it, keep others
                    self.gpus.append(Gpu(i, None, f"gpu{i}", {"error": str(exc)}))
                    continue
                self.gpus.append(Gpu(i, handle, f"gpu{i}"))
        except nv.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(str(exc)) from None
        self.gpus = [g for g in self.gpus if g.handle is not None] or self.gpus
        if not any(g.handle is not None for g in self.gpus):
            self.close()
            raise NvmlUnavailable("no GPU found" if not self.gpus else
                                  "; ".join(g.info.get("error", "") for g in self.gpus))
        for g in self.gpus:
            g.info.update(self._static(g))
        return self

    def is_unsupported(self, exc: BaseException) -> bool:
        if isinstance(exc, AttributeError):  # an older pynvml without the function
            return True
        return isinstance(exc, self.nv.NVMLError) and getattr(exc, "value", None) in \
            self._unsupported_codes

    def call(self, gpu: Gpu, key: str, fn: Callable[[], Any]) -> Any:
        """`fn()` unless `key` is known unsupported on this GPU; None when it fails.

        Unsupported (or no permission) is remembered at the first answer. Other errors are
        counted: after 5 in a row the value is given up as failing.
        """
        if key in gpu.unsupported:
            return None
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - NVMLError subclasses, ctypes errors
            if self.is_unsupported(exc):
                gpu.unsupported[key] = str(exc) or type(exc).__name__
            else:
                n = gpu.failures.get(key, 0) + 1
                gpu.failures[key] = n
                if n >= 5:
                    gpu.unsupported[key] = f"failing: {exc}"
            return None
        gpu.failures.pop(key, None)
        return value

    def _static(self, g: Gpu) -> dict[str, Any]:
        nv = self.nv
        info: dict[str, Any] = {"index": g.index}
        for key, fn in (("uuid", lambda: _text(nv.nvmlDeviceGetUUID(g.handle))),
                        ("name", lambda: _text(nv.nvmlDeviceGetName(g.handle))),
                        ("pci_bus_id", lambda: _text(nv.nvmlDeviceGetPciInfo(g.handle).busId)),
                        ("memory_total", lambda: nv.nvmlDeviceGetMemoryInfo(g.handle).total)):
            info[key] = self.call(g, f"static.{key}", fn)
        g.unsupported = {k: v for k, v in g.unsupported.items() if not k.startswith("static.")}
        info["uuid_normalized"] = normalize_gpu_uuid(info.get("uuid"))
        return info

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def field_value(nv: ModuleType, fv: Any) -> float | None:
    """The number inside an nvmlFieldValue_t, by its value type; None if NVML had no value."""
    if getattr(fv, "nvmlReturn", 0) != 0:
        return None
    v = fv.value
    kind = getattr(fv, "valueType", 3)
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
            6: "usVal"}.get(kind, "ullVal")
    return float(getattr(v, attr))


class NvmlSource:
    """Per-GPU NVML counters. `sample` is the fast tier, `sample_slow` the slow one."""

    name = "nvml"

    def __init__(self, nvml: Nvml, pcie_period_s: float = 5.0,
                 pcie_from_gpm: Callable[[Gpu], bool] | None = None) -> None:
        self.nvml = nvml
        self.nv = nvml.nv
        self.pcie_period_s = pcie_period_s
        self.pcie_from_gpm = pcie_from_gpm or (lambda g: False)
        self._last_pcie = -1e18
        self._nvlink_last: dict[tuple[str, int], tuple[float, float]] = {}
        self._event_set: Any = None
        self._by_uuid = {g.info.get("uuid"): g for g in nvml.gpus}
        self.xid_registered: list[str] = []

    def prime(self) -> None:
        self._register_xid()
        for g in self.nvml.gpus:
            self._nvlink_and_memtemp(g)

    # ---- fast tier ----------------------------------------------------------------------------

    def sample(self) -> list[Row]:
        rows: list[Row] = []
        for g in self.nvml.gpus:
            rows += self._sample_gpu(g)
        rows += self._poll_xid()
        return rows

    def _sample_gpu(self, g: Gpu) -> list[Row]:
        nv, h, call, d = self.nv, g.handle, self.nvml.call, g.label
        rows: list[Row] = []
        util = call(g, "util", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            rows += [(d, "util.gpu", util.gpu, "%"), (d, "util.mem", util.memory, "%")]
        sm = call(g, "clock.sm", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        if sm is not None:
            rows.append((d, "clock.sm", sm, "MHz"))
        mem = call(g, "clock.mem", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        if mem is not None:
            rows.append((d, "clock.mem", mem, "MHz"))
        mask = self._clocks_event_reasons(g)
        if mask is not None:
            rows.append((d, "clocks_event_reasons", mask, "bitmask"))
            rows.append((d, "clocks_slowdown", 1.0 if mask & SLOWDOWN_MASK else 0.0, "bool"))
            for bit, name in CLOCKS_EVENT_REASONS:
                rows.append((d, f"clocks_event.{name}", 1.0 if mask & bit else 0.0, "bool"))
        power = call(g, "power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        if power is not None:
            rows.append((d, "power", power / 1000.0, "W"))
        energy = call(g, "energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
        if energy is not None:
            rows.append((d, "energy", energy / 1000.0, "J"))
        temp = call(g, "temp.gpu", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        if temp is not None:
            rows.append((d, "temp.gpu", temp, "C"))
        meminfo = call(g, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if meminfo is not None:
            rows += [(d, "mem.used", meminfo.used, "B"), (d, "mem.total", meminfo.total, "B")]
        pstate = call(g, "pstate", lambda: nv.nvmlDeviceGetPerformanceState(h))
        if pstate is not None:
            rows.append((d, "pstate", pstate, "P"))
        rows += self._nvlink_and_memtemp(g)
        return rows

    def _clocks_event_reasons(self, g: Gpu) -> int | None:
        """The current mask: nvmlDeviceGetCurrentClocksEventReasons, or where the driver or the
        bindings predate it, the same bits from nvmlDeviceGetCurrentClocksThrottleReasons."""
        nv, h = self.nv, g.handle
        if g.info.get("clocks_event_api") != "throttle_reasons":
            try:
                mask = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
                g.info["clocks_event_api"] = "event_reasons"
                return int(mask)
            except Exception as exc:  # noqa: BLE001
                if not self.nvml.is_unsupported(exc):
                    error = exc  # a transient failure: counted like any other value's
                    return self.nvml.call(g, "clocks_event_reasons", lambda: _raise(error))
                g.info["clocks_event_api"] = "throttle_reasons"
        mask = self.nvml.call(g, "clocks_event_reasons",
                              lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return None if mask is None else int(mask)

    def _nvlink_and_memtemp(self, g: Gpu) -> list[Row]:
        """Memory temperature and NVLink data counters in one field-values call. The NVLink
        fields count KiB over all links (scope 0xFFFFFFFF); rates come from their deltas."""
        wanted = [(fid, scope) for fid, scope, key in ((FI_MEMORY_TEMP, 0, "temp.mem"),
                                                       (FI_NVLINK_TX, ALL_LINKS, "nvlink.tx"),
                                                       (FI_NVLINK_RX, ALL_LINKS, "nvlink.rx"))
                  if key not in g.unsupported]
        if not wanted or "field_values" in g.unsupported:
            return []
        values = self.nvml.call(g, "field_values",
                                lambda: self.nv.nvmlDeviceGetFieldValues(g.handle, wanted))
        if values is None:
            return []
        rows: list[Row] = []
        now = time.monotonic()
        for (fid, _scope), fv in zip(wanted, values):
            key = {FI_MEMORY_TEMP: "temp.mem", FI_NVLINK_TX: "nvlink.tx",
                   FI_NVLINK_RX: "nvlink.rx"}[fid]
            ret = getattr(fv, "nvmlReturn", 0)
            if ret != 0:
                if ret in self.nvml._unsupported_codes:
                    g.unsupported[key] = f"field {fid}: NVML error {ret}"
                continue
            value = field_value(self.nv, fv)
            if value is None:
                continue
            if fid == FI_MEMORY_TEMP:
                rows.append((g.label, "temp.mem", value, "C"))
                continue
            ts_us = getattr(fv, "timestamp", 0) or 0
            t = ts_us / 1e6 if ts_us > 0 else now
            prev = self._nvlink_last.get((g.label, fid))
            self._nvlink_last[(g.label, fid)] = (value, t)
            if prev is not None and t > prev[1] and value >= prev[0]:
                rate = (value - prev[0]) * 1024.0 / (t - prev[1])
                rows.append((g.label, "nvlink.tx_rate" if fid == FI_NVLINK_TX else
                             "nvlink.rx_rate", rate, "B/s"))
        return rows

    # ---- XID events ---------------------------------------------------------------------------

    def _register_xid(self) -> None:
        nv = self.nv
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except Exception:  # noqa: BLE001 - no events on this system: no XID rows
            self._event_set = None
            return
        for g in self.nvml.gpus:
            try:
                nv.nvmlDeviceRegisterEvents(g.handle, XID_EVENT, self._event_set)
                self.xid_registered.append(g.label)
            except Exception as exc:  # noqa: BLE001
                g.unsupported["xid"] = str(exc) or type(exc).__name__

    def _poll_xid(self, limit: int = 64) -> list[Row]:
        """Drain pending XID events without waiting (timeout 0)."""
        if self._event_set is None or not self.xid_registered:
            return []
        rows: list[Row] = []
        for _ in range(limit):
            try:
                event = self.nv.nvmlEventSetWait_v2(self._event_set, 0)
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: nothing pending
                break
            label = "gpu?"
            try:
                uuid = _text(self.nv.nvmlDeviceGetUUID(event.device))
                gpu = self._by_uuid.get(uuid)
                label = gpu.label if gpu else label
            except Exception:  # noqa: BLE001
                pass
            rows.append((label, "xid", float(event.eventData), "code"))
        return rows

    # ---- slow tier ----------------------------------------------------------------------------

    def sample_slow(self) -> list[Row]:
        nv, call = self.nv, self.nvml.call
        rows: list[Row] = []
        now = time.monotonic()
        do_pcie = now - self._last_pcie >= self.pcie_period_s
        if do_pcie:
            self._last_pcie = now
        for g in self.nvml.gpus:
            for metric, fn, unit in self._slow_getters(g.handle):
                v = call(g, metric, fn)
                if v is not None:
                    rows.append((g.label, metric, float(v), unit))
            if do_pcie and not self.pcie_from_gpm(g):
                # Blocks ~20 ms per call inside the driver: slow tier only, and not every tick.
                for metric, counter in (("pcie.tx_rate", nv.NVML_PCIE_UTIL_TX_BYTES),
                                        ("pcie.rx_rate", nv.NVML_PCIE_UTIL_RX_BYTES)):
                    v = call(g, metric, partial(nv.nvmlDeviceGetPcieThroughput, g.handle, counter))
                    if v is not None:
                        rows.append((g.label, metric, float(v) * 1024.0, "B/s"))  # KB/s
        return rows

    def _slow_getters(self, h: Any) -> list[tuple[str, Callable[[], Any], str]]:
        nv = self.nv
        return [
            ("clock.sm_max", partial(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM), "MHz"),
            ("clock.mem_max", partial(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM), "MHz"),
            ("power.limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0, "W"),
            ("ecc.corrected", partial(nv.nvmlDeviceGetTotalEccErrors, h,
                                      nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
             "count"),
            ("ecc.uncorrected", partial(nv.nvmlDeviceGetTotalEccErrors, h,
                                        nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                        nv.NVML_VOLATILE_ECC), "count"),
            ("pcie.link_gen", partial(nv.nvmlDeviceGetCurrPcieLinkGeneration, h), "gen"),
            ("pcie.link_width", partial(nv.nvmlDeviceGetCurrPcieLinkWidth, h), "lanes"),
            ("pcie.link_gen_max", partial(nv.nvmlDeviceGetMaxPcieLinkGeneration, h), "gen"),
            ("pcie.link_width_max", partial(nv.nvmlDeviceGetMaxPcieLinkWidth, h), "lanes"),
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "driver": self.nvml.driver,
            "gpus": {g.label: {**g.info, "unsupported": dict(sorted(g.unsupported.items()))}
                     for g in self.nvml.gpus},
            "xid_events": self.xid_registered,
        }

    def close(self) -> None:
        if self._event_set is not None:
            try:
                self.nv.nvmlEventSetFree(self._event_set)
            except Exception:  # noqa: BLE001
                pass
            self._event_set = None
