"""DCGM profiling fields (`--counters dcgm`), when DCGM's Python bindings are installed.

The bindings ship with the DCGM package (not PyPI), usually under /usr/local/dcgm/bindings or
/usr/share/datacenter-gpu-manager-4/bindings. uberprof never fights a DCGM already running: when a
host engine listens (dcgm-exporter, a cluster monitor), it connects to it as one more client and
adds its own watches; it never pauses profiling or changes the engine's settings. Without a host
engine it starts an embedded one inside the node agent. If the profiling fields cannot be watched
(another client holds a different set, an unsupported GPU), DCGM is skipped with a notice.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from uberprof.collect.counters.store import Row

BINDING_DIRS = (
    "/usr/local/dcgm/bindings/python3",
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings",
)

PROF_FIELDS: tuple[tuple[int, str, str, float], ...] = (
    # DCGM_FI_PROF_* id, metric, unit, scale (activity ratios 0..1 become %)
    (1001, "dcgm.gr_engine_active", "%", 100.0),
    (1002, "dcgm.sm_active", "%", 100.0),
    (1003, "dcgm.sm_occupancy", "%", 100.0),
    (1004, "dcgm.tensor_active", "%", 100.0),
    (1005, "dcgm.dram_active", "%", 100.0),
    (1006, "dcgm.fp64_active", "%", 100.0),
    (1007, "dcgm.fp32_active", "%", 100.0),
    (1008, "dcgm.fp16_active", "%", 100.0),
    (1009, "dcgm.pcie.tx_rate", "B/s", 1.0),
    (1010, "dcgm.pcie.rx_rate", "B/s", 1.0),
    (1011, "dcgm.nvlink.tx_rate", "B/s", 1.0),
    (1012, "dcgm.nvlink.rx_rate", "B/s", 1.0),
)


class DcgmUnavailable(Exception):
    pass


def import_bindings() -> tuple[ModuleType, ModuleType, ModuleType]:
    """(pydcgm, dcgm_structs, dcgm_fields), looking in DCGM's install folders too."""
    try:
        return _import()
    except ImportError:
        pass
    extra = [d for d in BINDING_DIRS if os.path.isdir(d) and d not in sys.path]
    if not extra:
        raise DcgmUnavailable("DCGM Python bindings not found (they ship with DCGM, not PyPI)")
    sys.path.extend(extra)
    try:
        return _import()
    except ImportError as exc:
        raise DcgmUnavailable(f"DCGM Python bindings not importable ({exc})") from None


def _import() -> tuple[ModuleType, ModuleType, ModuleType]:
    return (importlib.import_module("pydcgm"), importlib.import_module("dcgm_structs"),
            importlib.import_module("dcgm_fields"))


def bindings_location() -> str | None:
    """Where the bindings would be imported from, without importing them (for doctor)."""
    spec = importlib.util.find_spec("pydcgm")
    if spec is not None:
        return spec.origin
    for d in BINDING_DIRS:
        if (Path(d) / "pydcgm.py").is_file():
            return str(Path(d) / "pydcgm.py")
    return None


class DcgmSource:
    """Watches the profiling fields in one group of our own and reads their latest values."""

    name = "dcgm"

    def __init__(self, period_s: float, gpu_labels: dict[int, str] | None = None,
                 host: str = "127.0.0.1") -> None:
        self.period_s = period_s
        self.gpu_labels = gpu_labels or {}
        self.host = host
        self.mode: str | None = None
        self._handle: Any = None
        self._group: Any = None
        self._field_group: Any = None
        self._fields: dict[int, tuple[str, str, float]] = {}

    def setup(self) -> None:
        """Connect (running host engine) or embed; raises DcgmUnavailable with the reason."""
        pydcgm, structs, _fields = import_bindings()
        try:
            self._handle = pydcgm.DcgmHandle(ipAddress=self.host, timeoutMs=1000)
            self.mode = "connected to a running host engine"
        except Exception:  # noqa: BLE001 - nothing listening: run one inside this process
            try:
                self._handle = pydcgm.DcgmHandle(
                    ipAddress=None, opMode=structs.DCGM_OPERATION_MODE_AUTO)
                self.mode = "embedded"
            except Exception as exc:  # noqa: BLE001
                raise DcgmUnavailable(f"cannot start or reach DCGM ({exc})") from None
        try:
            system = self._handle.GetSystem()
            gpu_ids = list(system.discovery.GetAllSupportedGpuIds())
            if not gpu_ids:
                raise DcgmUnavailable("DCGM sees no supported GPU")
            name = f"uberprof-{os.getpid()}"
            self._group = system.GetGroupWithGpuIds(name, gpu_ids)
            self._fields = {fid: (m, u, s) for fid, m, u, s in PROF_FIELDS}
            self._field_group = pydcgm.DcgmFieldGroup(self._handle, name, list(self._fields))
            # Watching is where a conflict with another client's profiling set shows up.
            self._group.samples.WatchFields(self._field_group, int(self.period_s * 1e6),
                                            max(10.0, self.period_s * 4), 0)
        except DcgmUnavailable:
            self.close()
            raise
        except Exception as exc:  # noqa: BLE001
            self.close()
            raise DcgmUnavailable(f"DCGM profiling fields cannot be watched ({exc})") from None

    def prime(self) -> None:
        pass

    def sample(self) -> list[Row]:
        if self._group is None:
            return []
        latest = self._group.samples.GetLatest_v2(self._field_group).values
        rows: list[Row] = []
        for entities in latest.values():
            for entity_id, fields in entities.items():
                label = self.gpu_labels.get(entity_id, f"gpu{entity_id}")
                for fid, values in fields.items():
                    spec = self._fields.get(fid)
                    if spec is None or not values:
                        continue
                    v = values[-1]
                    if getattr(v, "isBlank", False) or v.value is None:
                        continue
                    try:
                        value = float(v.value)
                    except (TypeError, ValueError):
                        continue
                    rows.append((label, spec[0], value * spec[2], spec[1]))
        return rows

    def close(self) -> None:
        """Remove only what uberprof created; the host engine and others' watches stay."""
        for obj in (self._field_group, self._group):
            try:
                if obj is not None:
                    obj.Delete()
            except Exception:  # noqa: BLE001
                pass
        self._field_group = self._group = None
        try:
            if self._handle is not None:
                self._handle.Shutdown()
        except Exception:  # noqa: BLE001
            pass
        self._handle = None

    def describe(self) -> dict[str, Any]:
        return {"dcgm": {"mode": self.mode, "fields": [m for m, _, _ in self._fields.values()]}}
