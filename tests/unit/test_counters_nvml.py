"""The NVML path against a test double of `pynvml`: two GPUs, one throttled (power cap and HW
thermal slowdown) with fields it does not support, an XID event, GPM on one GPU only."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from uberprof.collect import capabilities
from uberprof.collect.counters import CounterSettings, NodeSampler, read_counters
from uberprof.collect.counters.gpm import GpmSource
from uberprof.collect.counters.nvml import (
    ALL_LINKS,
    Nvml,
    NvmlSource,
    decode_clocks_event_reasons,
)
from uberprof.collect.safety import AgentLog
from uberprof.rundir import RunDir, write_json_atomic
from uberprof.rundir.counters import counter_meta, normalize_gpu_uuid, rank_gpus

NOT_SUPPORTED, TIMEOUT, LIB_NOT_FOUND = 3, 10, 12
THROTTLED = 0x4 | 0x40  # sw_power_cap | hw_thermal_slowdown
UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]


def fake_pynvml(*, event_reasons_api: bool = True, init_error: int | None = None
                ) -> types.ModuleType:
    """A stand-in for the pynvml module, with the calls and error classes uberprof uses."""
    nv = types.ModuleType("pynvml")
    nv.calls = {}  # type: ignore[attr-defined]

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return {NOT_SUPPORTED: "Not Supported", TIMEOUT: "Timeout",
                    LIB_NOT_FOUND: "NVML Shared Library Not Found"}.get(self.value, "Unknown")

    def sub(name: str, code: int) -> type:
        return type(name, (NVMLError,), {"__init__": lambda self, *a: NVMLError.__init__(self, code)})

    nv.NVMLError = NVMLError
    nv.NVMLError_NotSupported = sub("NVMLError_NotSupported", NOT_SUPPORTED)
    nv.NVMLError_Timeout = sub("NVMLError_Timeout", TIMEOUT)
    nv.NVMLError_LibraryNotFound = sub("NVMLError_LibraryNotFound", LIB_NOT_FOUND)
    constants = {"NVML_ERROR_INVALID_ARGUMENT": 2, "NVML_ERROR_NOT_SUPPORTED": 3,
                 "NVML_ERROR_NO_PERMISSION": 4, "NVML_ERROR_TIMEOUT": 10,
                 "NVML_ERROR_FUNCTION_NOT_FOUND": 13, "NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2,
                 "NVML_TEMPERATURE_GPU": 0, "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
                 "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0,
                 "NVML_PCIE_UTIL_TX_BYTES": 0, "NVML_PCIE_UTIL_RX_BYTES": 1,
                 "NVML_GPM_METRICS_GET_VERSION": 1}
    for name, value in constants.items():
        setattr(nv, name, value)

    handles = [types.SimpleNamespace(index=i) for i in range(2)]
    state = {"nvlink_kib": 0, "field_ts_us": 1_000_000, "events": [(handles[1], 79)],
             "closed": False}

    def counted(name: str) -> None:
        nv.calls[name] = nv.calls.get(name, 0) + 1  # type: ignore[attr-defined]

    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)

    nv.nvmlInit = nvmlInit
    nv.nvmlShutdown = lambda: state.__setitem__("closed", True)
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlSystemGetDriverVersion = lambda: "999.1"
    nv.nvmlDeviceGetHandleByIndex = lambda i: handles[i]
    nv.nvmlDeviceGetUUID = lambda h: UUIDS[h.index]
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"0000:0{h.index}:00.0")
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=141 << 30, used=7 << 30)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97, memory=41)
    nv.nvmlDeviceGetClockInfo = lambda h, c: (1980 if h.index == 0 else 1200) if c == 1 else 2619
    nv.nvmlDeviceGetMaxClockInfo = lambda h, c: 1980 if c == 1 else 2619
    def reasons(h: Any) -> int:
        return 0 if h.index == 0 else THROTTLED

    if event_reasons_api:
        nv.nvmlDeviceGetCurrentClocksEventReasons = reasons
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = reasons

    def power(h: Any) -> int:
        counted(f"power{h.index}")
        if h.index == 1:
            raise nv.NVMLError_NotSupported()
        return 650_000  # mW

    nv.nvmlDeviceGetPowerUsage = power
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 5_000_000  # mJ
    nv.nvmlDeviceGetTemperature = lambda h, s: 71
    nv.nvmlDeviceGetPerformanceState = lambda h: 0
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16

    def pcie(h: Any, counter: int) -> int:
        counted(f"pcie{h.index}")
        return 1000  # KB/s

    nv.nvmlDeviceGetPcieThroughput = pcie

    def field_values(h: Any, fields: list[tuple[int, int]]) -> list[Any]:
        counted(f"fields{h.index}")
        state["field_ts_us"] += 1_000_000  # one second per call
        state["nvlink_kib"] += 1_000_000
        out = []
        for fid, scope in fields:
            ret, value = 0, types.SimpleNamespace(ullVal=0, dVal=0.0)
            if fid == 82:
                ret = NOT_SUPPORTED if h.index == 1 else 0
                value.ullVal = 80
            elif fid in (138, 139):
                ret = 0 if scope == ALL_LINKS else 2  # other scopes: a single link, not the sum
                value.ullVal = state["nvlink_kib"]
            out.append(types.SimpleNamespace(fieldId=fid, scopeId=scope, valueType=3,
                                             nvmlReturn=ret, timestamp=state["field_ts_us"],
                                             value=value))
        return out

    nv.nvmlDeviceGetFieldValues = field_values
    nv.nvmlEventSetCreate = lambda: object()
    nv.nvmlDeviceRegisterEvents = lambda h, types_, es: None
    nv.nvmlEventSetFree = lambda es: None

    def wait(es: Any, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never block the sampling loop
        if not state["events"]:
            raise nv.NVMLError_Timeout()
        dev, xid = state["events"].pop(0)
        return types.SimpleNamespace(device=dev, eventType=8, eventData=xid)

    nv.nvmlEventSetWait_v2 = wait

    # GPM: supported on GPU 0 only (a Hopper beside an older GPU).
    nv.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=int(h.index == 0))
    nv.nvmlGpmSampleAlloc = lambda: types.SimpleNamespace(t=None)

    def gpm_get(h: Any, sample: Any) -> Any:
        sample.t = time.monotonic()
        return sample

    nv.nvmlGpmSampleGet = gpm_get
    nv.nvmlGpmSampleFree = lambda s: None

    class MetricsGet:
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
                            for _ in range(64)]

    nv.c_nvmlGpmMetricsGet_t = MetricsGet
    gpm_values = {1: 99.0, 2: 87.5, 3: 40.0, 5: 65.0, 7: 64.0, 10: 55.0, 11: 0.0, 12: 5.0,
                  13: 1.0, 20: 100.0, 21: 200.0}

    def metrics_get(mg: Any) -> Any:
        assert mg.version == 1 and mg.sample1 is not mg.sample2
        assert abs(mg.sample2.t - mg.sample1.t) >= 0.1  # two samples, >= 100 ms apart
        for m in mg.metrics[: mg.numMetrics]:
            if m.metricId in gpm_values:
                m.value = gpm_values[m.metricId]
            else:  # NVLink rates on a GPU without NVLink
                m.nvmlReturn = NOT_SUPPORTED
        return mg

    nv.nvmlGpmMetricsGet = metrics_get
    return nv


def _rows(rows: list[tuple[str, str, float, str]]) -> dict[tuple[str, str], float]:
    return {(d, m): v for d, m, v, _ in rows}


def test_decode_clocks_event_reasons() -> None:
    assert decode_clocks_event_reasons(0) == []
    assert decode_clocks_event_reasons(THROTTLED) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_clocks_event_reasons(0x1 | 0x8 | 0x80) == ["gpu_idle", "hw_slowdown",
                                                             "hw_power_brake_slowdown"]
    assert decode_clocks_event_reasons(0x400) == ["0x400"]


@pytest.mark.parametrize("event_reasons_api", [True, False], ids=["event-reasons", "throttle-fallback"])
def test_nvml_source_throttle_and_unsupported_fields(event_reasons_api: bool) -> None:
    nv = fake_pynvml(event_reasons_api=event_reasons_api)
    nvml = Nvml.open(nv)
    assert [g.label for g in nvml.gpus] == ["gpu0", "gpu1"]
    source = NvmlSource(nvml)
    source.prime()
    first, second = _rows(source.sample()), _rows(source.sample())

    # Decoded throttle reasons: GPU 1 is power capped and thermally slowed, GPU 0 is not.
    for reason in ("sw_power_cap", "hw_thermal_slowdown"):
        assert second[("gpu1", f"clocks_event.{reason}")] == 1.0
        assert second[("gpu0", f"clocks_event.{reason}")] == 0.0
    assert second[("gpu1", "clocks_event.hw_slowdown")] == 0.0
    assert second[("gpu1", "clocks_event_reasons")] == THROTTLED
    assert second[("gpu1", "clocks_slowdown")] == 1.0 and second[("gpu0", "clocks_slowdown")] == 0.0
    api = nvml.gpus[1].info["clocks_event_api"]
    assert api == ("event_reasons" if event_reasons_api else "throttle_reasons")

    # Unsupported: no rows (not NaN rows), asked once only, and listed per device.
    assert ("gpu0", "power") in second and ("gpu1", "power") not in second
    assert ("gpu0", "temp.mem") in second and ("gpu1", "temp.mem") not in second
    assert nv.calls["power1"] == 1 and nv.calls["power0"] == 2
    described = source.describe()["gpus"]
    assert set(described["gpu1"]["unsupported"]) == {"power", "temp.mem"}
    assert described["gpu0"]["unsupported"] == {}
    assert described["gpu1"]["uuid"] == UUIDS[1] and described["gpu0"]["name"] == "NVIDIA H200"

    # Units converted: mW -> W, mJ -> J; NVLink KiB counters (all-links scope) -> bytes/s.
    assert second[("gpu0", "power")] == 650.0 and second[("gpu0", "energy")] == 5000.0
    assert second[("gpu0", "clock.sm")] == 1980 and second[("gpu1", "clock.sm")] == 1200
    assert second[("gpu0", "util.gpu")] == 97 and second[("gpu0", "mem.used")] == 7 << 30
    assert second[("gpu0", "nvlink.tx_rate")] == pytest.approx(1_000_000 * 1024 * 2 / 2)
    assert second[("gpu1", "nvlink.rx_rate")] > 0
    # The XID event reached its GPU, once.
    assert first[("gpu1", "xid")] == 79 and ("gpu1", "xid") not in second


def test_gpm_and_slow_tier() -> None:
    nv = fake_pynvml()
    nvml = Nvml.open(nv)
    gpm = GpmSource(nvml)
    assert gpm.setup() == ["gpu0"]
    source = NvmlSource(nvml, pcie_period_s=0.0, pcie_from_gpm=gpm.covers_pcie)
    assert gpm.sample() == []  # too soon after set-up: GPM needs samples >= 100 ms apart
    time.sleep(0.12)
    rows = _rows(gpm.sample())
    assert rows[("gpu0", "gpm.sm_active")] == 87.5 and rows[("gpu0", "gpm.tensor_active")] == 65.0
    assert rows[("gpu0", "gpm.dram_bw_util")] == 55.0
    assert rows[("gpu0", "gpm.pcie.tx_rate")] == 100.0 * 1024 * 1024
    assert not any(d == "gpu1" for d, _ in rows)  # no GPM on that GPU
    assert "gpm.nvlink.tx_rate" in nvml.gpus[0].unsupported
    assert nvml.gpus[0].info["gpm"] is True and nvml.gpus[1].info["gpm"] is False
    slow = _rows(source.sample_slow())
    assert slow[("gpu0", "clock.sm_max")] == 1980 and slow[("gpu1", "power.limit")] == 700.0
    assert slow[("gpu0", "ecc.uncorrected")] == 0 and slow[("gpu1", "pcie.link_width")] == 16
    # PCIe through NVML (blocking) only where GPM does not give it.
    assert ("gpu1", "pcie.tx_rate") in slow and ("gpu0", "pcie.tx_rate") not in slow
    assert slow[("gpu1", "pcie.rx_rate")] == 1000 * 1024
    assert "pcie0" not in nv.calls
    gpm.close()
    source.close()


def _run(tmp_path: Path, run_id: str = "g") -> tuple[RunDir, Path]:
    run = RunDir(tmp_path / run_id)
    run.create(run_id)
    return run, run.claim_node_dir("n0")


def test_sampler_with_fake_gpus_writes_gpu_tables(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)  # the way the sampler imports it
    run, nd = _run(tmp_path)
    sampler = NodeSampler(run, "g", nd, CounterSettings(sample_hz=10, flush_s=0.3),
                          AgentLog("node", nd / "uberprof.log"))
    assert sampler.start()
    assert sampler.wait_ready(60)  # set-up (pyarrow, NVML, GPM) is slow on a loaded machine
    time.sleep(1.6)
    sampler.stop()
    assert "no NVIDIA GPU" not in capsys.readouterr().err
    df = read_counters(run.root, "n0")
    assert {"host", "nic", "nvml", "gpm"} <= set(df.source)
    nvml = df[df.source == "nvml"]
    assert set(nvml.device) == {"gpu0", "gpu1"}
    throttled = nvml[(nvml.device == "gpu1") & (nvml.metric == "clocks_event.sw_power_cap")]
    assert len(throttled) >= 5 and (throttled.value == 1.0).all()
    assert nvml[(nvml.device == "gpu1") & (nvml.metric == "power")].empty
    assert (df[(df.source == "gpm") & (df.metric == "gpm.sm_active")].value == 87.5).all()
    meta = counter_meta(run.root, "n0")
    assert meta["gpus"]["gpu1"]["uuid"] == UUIDS[1]
    assert "power" in meta["gpus"]["gpu1"]["unsupported"]
    assert meta["gpm_gpus"] == ["gpu0"] and meta["driver"] == "999.1"
    assert nv.calls["power1"] == 1
    # Ranks map to GPUs through the UUID torch reports (without NVML's "GPU-" prefix).
    for rank, uuid in ((0, UUIDS[1]), (1, UUIDS[0])):
        write_json_atomic(run.ranks_dir / str(rank) / "rank.json",
                          {"rank": rank, "host": meta["host"], "pid": 1,
                           "device": {"type": "cuda", "index": 0, "uuid": uuid[4:]}})
    assert rank_gpus(run.root) == {0: ("n0", "gpu1"), 1: ("n0", "gpu0")}
    assert normalize_gpu_uuid(UUIDS[0]) == normalize_gpu_uuid(UUIDS[0][4:].upper())


@pytest.mark.parametrize("gpu_build, said", [
    (True, "no NVIDIA GPU (NVML: NVML Shared Library Not Found): host counters only"),
    (False, None),  # a CPU-only torch build expects no GPU: a note, no warning on every run
])
def test_no_gpu_is_at_most_one_line_and_host_counters_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        gpu_build: bool, said: str | None) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=LIB_NOT_FOUND))
    monkeypatch.setattr(capabilities, "torch_build_has_gpu", lambda: gpu_build)
    run, nd = _run(tmp_path, "nogpu")
    sampler = NodeSampler(run, "nogpu", nd, CounterSettings(sample_hz=10, flush_s=0.3),
                          AgentLog("node", nd / "uberprof.log"))
    sampler.start()
    time.sleep(0.8)
    sampler.stop()
    err = capsys.readouterr().err.splitlines()
    assert err == ([f"uberprof: {said}"] if said else [])
    df = read_counters(run.root, "n0")
    assert "nvml" not in set(df.source) and (df.metric == "cpu.util").sum() >= 5
    note = said or "a CPU-only torch build: host counters only"
    assert sampler.status()["notes"] == [note]


def test_torch_build_is_read_without_importing_torch(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('torch must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    for cuda, hip, expected in (("None", "None", False), ("'12.4'", "None", True),
                                ("None", "'6.2.4'", True)):
        (fake / "version.py").write_text(f"from typing import Optional\n"
                                         f"cuda: Optional[str] = {cuda}\nhip = {hip}\n")
        assert capabilities.torch_build_has_gpu() is expected
    (fake / "version.py").unlink()
    assert capabilities.torch_build_has_gpu() is None


def test_dcgm_requested_without_bindings_is_one_line(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setitem(sys.modules, "pydcgm", None)  # import fails as if not installed
    monkeypatch.setattr("uberprof.collect.counters.dcgm.BINDING_DIRS", ())
    run, nd = _run(tmp_path, "dcgm")
    sampler = NodeSampler(run, "dcgm", nd, CounterSettings(mode="dcgm", sample_hz=10,
                                                           flush_s=0.3), AgentLog("node"))
    sampler.start()
    time.sleep(0.8)
    sampler.stop()
    err = [line for line in capsys.readouterr().err.splitlines() if "DCGM" in line]
    assert len(err) == 1 and "continuing without DCGM" in err[0]
    assert "nvml" in set(read_counters(run.root, "n0").source)
