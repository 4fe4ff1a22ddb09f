"""DCGM profiling fields against a test double of DCGM's Python bindings: embedded when no host
engine runs, a client of the running one otherwise, and out of the way when its watches fail."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from uberprof.collect.counters.dcgm import DcgmSource, DcgmUnavailable


def fake_dcgm(monkeypatch: pytest.MonkeyPatch, *, engine_running: bool,
              watch_error: str | None = None) -> dict[str, Any]:
    log: dict[str, Any] = {"handles": [], "deleted": [], "shutdown": 0, "watch": None}
    structs = types.ModuleType("dcgm_structs")
    structs.DCGM_OPERATION_MODE_AUTO = 1
    fields = types.ModuleType("dcgm_fields")
    pydcgm = types.ModuleType("pydcgm")

    class Value:
        def __init__(self, value: float | None, blank: bool = False) -> None:
            self.value, self.isBlank, self.ts = value, blank, 0

    class Samples:
        def WatchFields(self, field_group: Any, freq_us: int, keep_age: float,
                        keep_samples: int) -> None:
            if watch_error:
                raise RuntimeError(watch_error)
            log["watch"] = (field_group.ids, freq_us)

        def GetLatest_v2(self, field_group: Any) -> Any:
            gpu = {1002: [Value(0.875)], 1004: [Value(0.5)], 1011: [Value(3e9)],
                   1005: [Value(None, blank=True)]}
            return types.SimpleNamespace(values={1: {0: gpu, 1: {1002: [Value(0.25)]}}})

    class Group:
        samples = Samples()

        def Delete(self) -> None:
            log["deleted"].append("group")

    class FieldGroup:
        def __init__(self, handle: Any, name: str, ids: list[int]) -> None:
            self.ids = ids

        def Delete(self) -> None:
            log["deleted"].append("field_group")

    class System:
        discovery = types.SimpleNamespace(GetAllSupportedGpuIds=lambda: [0, 1])

        def GetGroupWithGpuIds(self, name: str, ids: list[int]) -> Group:
            return Group()

    class DcgmHandle:
        def __init__(self, ipAddress: str | None = None, opMode: int = 1,
                     timeoutMs: int = 0) -> None:
            if ipAddress is not None and not engine_running:
                raise RuntimeError("connection not valid")
            log["handles"].append("connected" if ipAddress else "embedded")

        def GetSystem(self) -> System:
            return System()

        def Shutdown(self) -> None:
            log["shutdown"] += 1

    pydcgm.DcgmHandle = DcgmHandle
    pydcgm.DcgmFieldGroup = FieldGroup
    for name, mod in (("pydcgm", pydcgm), ("dcgm_structs", structs), ("dcgm_fields", fields)):
        monkeypatch.setitem(sys.modules, name, mod)
    return log


def test_embedded_without_a_host_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_dcgm(monkeypatch, engine_running=False)
    src = DcgmSource(period_s=1.0, gpu_labels={0: "gpu0", 1: "gpu1"})
    src.setup()
    assert log["handles"] == ["embedded"] and src.mode == "embedded"
    assert log["watch"][1] == 1_000_000 and 1002 in log["watch"][0]
    rows = {(d, m): (v, u) for d, m, v, u in src.sample()}
    assert rows[("gpu0", "dcgm.sm_active")] == (87.5, "%")
    assert rows[("gpu0", "dcgm.tensor_active")] == (50.0, "%")
    assert rows[("gpu0", "dcgm.nvlink.tx_rate")] == (3e9, "B/s")
    assert rows[("gpu1", "dcgm.sm_active")] == (25.0, "%")
    assert ("gpu0", "dcgm.dram_active") not in rows  # blank values are not rows
    src.close()
    assert log["deleted"] == ["field_group", "group"] and log["shutdown"] == 1


def test_joins_a_running_host_engine_and_steps_aside_on_conflict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_dcgm(monkeypatch, engine_running=True)
    src = DcgmSource(period_s=2.0)
    src.setup()
    assert log["handles"] == ["connected"] and src.mode.startswith("connected")
    src.close()

    log = fake_dcgm(monkeypatch, engine_running=True,
                    watch_error="DCGM_ST_PROFILING_MULTI_PASS: another set is being watched")
    src = DcgmSource(period_s=2.0)
    with pytest.raises(DcgmUnavailable, match="cannot be watched"):
        src.setup()
    # It removed only what it created and disconnected; the engine keeps running.
    assert log["deleted"] == ["field_group", "group"] and log["shutdown"] == 1
    assert src.sample() == []
