"""Real GPU runs through the whole pipeline on a CPU machine.

`samples/gpu/` holds four run directories captured on an NVIDIA H100 (2026-11-25) by
`benchmarks/gpu_capture.sh` (samples/gpu/README.md): one NCCL rank, two ranks sharing the GPU
with Gloo on CUDA tensors, the same with rank 1 running its forward pass twice, and the same
with rank 1 running out of GPU memory at step 25. Beside them, each rank's own
`torch.cuda.max_memory_allocated()` at the end (`<run>.memory.<rank>`). These tests read them
as a user would (`report --json`, `export`, `info`, the dashboard's data), so what CI checks is
what the GPU showed, not what a CPU test assumed.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests._gpu_samples import GPU, sample_fixtures
from uberprof.cli import main

RUNS = ("nccl1", "gloo2", "straggler", "oom")

runs, reports = sample_fixtures(RUNS, "gpu-samples")


def _findings(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["kind"] == kind]


def test_every_gpu_rank_is_read_as_a_cuda_device_with_its_model(
        runs: dict[str, Path]) -> None:
    res = CliRunner().invoke(main, ["info", str(runs["gloo2"]), "--json"])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert text.count("NVIDIA H100 80GB HBM3") >= 2  # both ranks name the model


def test_nccl_rank_has_compute_on_the_device_and_no_collective_to_match(
        reports: dict[str, dict[str, Any]]) -> None:
    """One NCCL rank: DDP's all-reduces launch no kernel (NCCL skips a group of one), so the
    breakdown is compute and idle, and no collective is matched or left unmatched."""
    doc = reports["nccl1"]
    assert doc["run"]["backend"] == "nccl" and doc["run"]["device_type"] == "cuda"
    (rank,) = doc["ranks"]
    assert rank["mode"] == "device"
    assert rank["breakdown_pct"]["compute"] > 10
    assert rank["breakdown_pct"]["exposed_comm"] == 0
    assert doc["run"]["collectives"]["matched_instances"] == 0
    assert doc["run"]["collectives"]["unmatched_calls"] == 0


def test_gloo_collectives_of_cuda_tensors_are_communication_not_sync_idle(
        reports: dict[str, dict[str, Any]]) -> None:
    """Gloo all-reduces device tensors on its host threads, copying them through pinned
    memory: the device waits for the result. Read before as 'idle (host synchronisations)',
    with no collective found; now as matched collectives and exposed communication."""
    doc = reports["gloo2"]
    assert doc["run"]["collectives"]["matched_instances"] > 0
    assert doc["run"]["collectives"]["unmatched_calls"] == 0
    for rank in doc["ranks"]:
        assert rank["breakdown_pct"]["exposed_comm"] > 20, rank
    assert _findings(doc, "exposed_comm")
    assert not [f for f in _findings(doc, "idle") if f.get("cause") == "sync"
                and f["severity"] == "high"]


def test_gloo_on_cuda_bandwidth_is_judged_against_the_hosts_sockets_not_nvlink(
        reports: dict[str, dict[str, Any]]) -> None:
    rows = [b for b in reports["gloo2"]["run"]["bandwidth"] if b["collective"] == "allreduce"]
    assert rows
    for row in rows:  # DDP's buckets, each with its size
        assert row["bytes"] > 0  # shapes are recorded on Gloo ranks of a GPU (record_shapes)
        assert row["link"] == "loopback" and row["link_kind"] != "NVLink"


def test_extra_gpu_compute_on_rank_1_is_a_compute_straggler(
        reports: dict[str, dict[str, Any]]) -> None:
    (f,) = _findings(reports["straggler"], "straggler")
    assert f["ranks"] == [1] and f["cause"] == "compute"
    assert not _findings(reports["gloo2"], "straggler")  # the same job without the fault


def test_out_of_memory_on_rank_1_is_the_crash_and_rank_0_its_victim(
        reports: dict[str, dict[str, Any]]) -> None:
    (f,) = _findings(reports["oom"], "crash")
    assert f["ranks"] == [1]
    assert "OutOfMemoryError" in f["title"] and "CUDA out of memory" in f["title"]
    assert f["evidence"]["first"]["rank"] == 1
    assert [v["rank"] for v in f["evidence"]["victims"]] == [0]
    assert f["cause"] == "out_of_memory"
    mem = f["evidence"]["memory"]
    assert mem["device_total_bytes"] == 85017493504  # the H100's, from rank.json
    assert mem["requested_bytes"] == int(80.18 * (1 << 30))  # "Tried to allocate 80.18 GiB"
    own = json.loads((GPU / "gloo2.memory.1").read_text())  # the same job without the fault
    assert mem["peak_allocated_bytes"] == own["max_memory_allocated"]
    # no leak before the OOM: in use between steps within 10% (it is, to 16 KiB)
    assert abs(mem["in_use_last_bytes"] - mem["in_use_first_bytes"]) < \
        0.1 * mem["in_use_first_bytes"]
    # one unit system, the allocator's own (binary): "Tried to allocate 80.18 GiB" is 80.18 GiB
    assert "(steady)" in f["title"] and "asked for 80.18 GiB" in f["title"]
    assert "of 79.18 GiB" in f["title"] and " GB" not in f["title"]


def test_step_timeline_gpu_peak_memory_is_the_jobs_own_max_memory_allocated(
        runs: dict[str, Path]) -> None:
    """The collector's per-step peak (the caching allocator's statistics) against what the
    job itself asked torch at the end: the last step's peak is the run's maximum."""
    from uberprof.rundir.ranks import read_step_timeline

    checked = 0
    for name in ("nccl1", "gloo2", "straggler"):
        for rank_dir in sorted((runs[name] / "ranks").iterdir()):
            steps = read_step_timeline(rank_dir).steps
            own = json.loads((GPU / f"{name}.memory.{rank_dir.name}").read_text())
            assert steps[-1]["gpu_mem_peak_bytes"] == own["max_memory_allocated"]
            assert all(0 < s["gpu_mem_bytes"] <= s["gpu_mem_peak_bytes"] for s in steps
                       if "gpu_mem_bytes" in s)
            checked += 1
    assert checked == 5


def test_nvml_and_gpm_counters_have_values_their_units_allow(runs: dict[str, Path]) -> None:
    from uberprof.rundir.counters import counters_table

    t = counters_table(runs["straggler"], "vm", sources=["nvml", "gpm"], label_ranks=False)
    by: dict[str, list[float]] = {}
    units: dict[str, str] = {}
    for m, v, u in zip(*(t.column(c).to_pylist() for c in ("metric", "value", "unit"))):
        by.setdefault(m, []).append(v)
        units[m] = u
    assert 0 < max(by["power"]) <= max(by["power.limit"]) and units["power"] == "W"
    assert max(by["clock.sm"]) <= max(by["clock.sm_max"]) and units["clock.sm"] == "MHz"
    assert max(by["mem.used"]) < max(by["mem.total"]) and units["mem.used"] == "B"
    assert 0 <= min(by["util.gpu"]) and max(by["util.gpu"]) <= 100
    gpm = [m for m in by if m.startswith("gpm.") and units[m] == "%"]
    assert "gpm.sm_active" in gpm
    assert all(0 <= v <= 100 for m in gpm for v in by[m])
    assert max(by["gpm.sm_active"]) > 0  # the job ran kernels while GPM sampled


def test_export_of_a_gpu_run_holds_its_kernels_and_counter_tracks(
        runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "merged.json"
    res = CliRunner().invoke(main, ["export", str(runs["gloo2"]), "-o", str(out)])
    assert res.exit_code == 0, res.output
    written = out if out.exists() else out.with_name(out.name + ".gz")
    data = json.loads(gzip.decompress(written.read_bytes()) if written.suffix == ".gz"
                      else written.read_bytes())
    events = data["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
    assert any(e.get("ph") == "C" and "power" in str(e.get("name", "")).lower() for e in events)


def test_dashboard_loads_a_gpu_run_and_answers_its_overview(runs: dict[str, Path]) -> None:
    from tests.unit.test_dashboard import _client, _route
    from uberprof.dashboards.data import RunData

    data = RunData(root=runs["straggler"], workers=1).load()
    status, body = _route(_client(data), "/", "")
    assert status == 200
    assert "straggler" in body.lower()


def test_operators_and_kernels_of_a_cuda_profile_match_key_averages_on_the_same_window(
        tmp_path: Path) -> None:
    """samples/gpu/profile: four steps profiled on the H100 with CPU and CUDA activities, and
    torch.profiler's own key_averages() of them (benchmarks/gpu_key_averages.py). Host
    operators' self time leaves out the CUDA runtime calls inside them (cudaLaunchKernel...),
    as key_averages does; kernels' time is their device time."""
    from uberprof.analysis.diagnosis.advisor import diagnose
    from uberprof.analysis.tables.derived import read_operators

    shutil.copy(GPU / "profile" / "gpu-profile.pt.trace.json.gz", tmp_path)
    diagnose(tmp_path, out=tmp_path / "derived", workers=1)
    rows = read_operators(tmp_path / "derived").to_pylist()
    ka = json.loads((GPU / "profile" / "gpu-profile.key_averages.json").read_text())["rows"]
    ops = sorted((r for r in rows if r["kind"] == "operator"), key=lambda r: -r["self_ns"])
    kernels = sorted((r for r in rows if r["kind"] == "kernel"), key=lambda r: -r["incl_ns"])
    assert len(ops) >= 15 and len(kernels) >= 15
    for r in ops[:15]:
        k = ka[r["name"]]
        assert r["calls"] == k["count"], r
        assert r["self_ns"] / 1e3 == pytest.approx(k["self_cpu_us"], rel=0.01), r
        assert r["incl_ns"] / 1e3 == pytest.approx(k["cpu_total_us"], rel=0.01), r
    for r in kernels[:15]:
        k = ka[r["name"]]
        assert r["calls"] == k["count"], r
        assert r["incl_ns"] / 1e3 == pytest.approx(k["self_device_us"], rel=0.01), r
