"""`uberprof diff` on Kineto traces recorded elsewhere (../shared/traces, read-only): single
traces compare without a run directory, and runs that do not line up still compare."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._jobs import PY, job_env

# ../shared/traces beside the checkout (also from a worktree one level further down)
SHARED = next((p / "shared" / "traces" for p in Path(__file__).resolve().parents[3:5]
               if (p / "shared" / "traces").is_dir()),
              Path(__file__).resolve().parents[3] / "shared" / "traces")
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")

NS_TRACE = SHARED / "hta" / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
RESNET = SHARED / "tb_plugin" / "resnet50_num_workers_4" / "worker0.1623212756351.pt.trace.json.gz"


def diff_json(tmp: Path, *args: Path | str) -> dict[str, Any]:
    # the traces are read-only: derived tables go to the cache folder, here a temporary one
    proc = subprocess.run([PY, "-m", "uberprof", "diff", *map(str, args), "--json"],
                          capture_output=True, text=True, timeout=300,
                          env=job_env(XDG_CACHE_HOME=str(tmp)), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_two_single_gpu_traces_compare(tmp_path: Path) -> None:
    doc = diff_json(tmp_path, NS_TRACE, RESNET)
    assert doc["a"]["kind"] == doc["b"]["kind"] == "traces"
    assert doc["a"]["path"] == str(NS_TRACE) and doc["b"]["path"] == str(RESNET)
    st = doc["step_time_ms"]
    assert st["a"]["median"] and st["b"]["median"] and st["ratio"]
    kinds = {r["kind"] for r in doc["ops"]}
    assert {"operator", "kernel"} <= kinds
    assert any(r["only_in"] == "a" for r in doc["ops"]) and \
        any(r["only_in"] == "b" for r in doc["ops"])
    assert doc["counters"] == []  # plain traces carry no counters
    compute = next(r for r in doc["breakdown"] if r["part"] == "compute")
    assert compute["a_ms"] > 0 and compute["b_ms"] > 0


def test_two_traces_of_one_folder_each_keep_their_own_numbers(tmp_path: Path) -> None:
    """Both traces' derived tables land in one folder: each run is read before the next."""
    folder = SHARED / "tb_plugin" / "test_distributed_nccl"
    w0, w1 = folder / "worker0.pt.trace.json", folder / "worker1.pt.trace.json"
    doc = diff_json(tmp_path, w0, w1)
    back = diff_json(tmp_path, w1, w0)
    assert doc["step_time_ms"]["a"] == back["step_time_ms"]["b"]
    assert doc["step_time_ms"]["b"] == back["step_time_ms"]["a"]
    assert doc["a"]["ranks"] == [0] and doc["b"]["ranks"] == [1]


def test_runs_that_do_not_line_up_compare_per_step(tmp_path: Path) -> None:
    doc = diff_json(tmp_path, SHARED / "hta" / "trace_filter", SHARED / "hta" / "nccl_parser_config")
    assert doc["a"]["ranks"] == [0, 1] and doc["b"]["ranks"] == [0]
    assert any("ranks differ" in n for n in doc["notes"])
    assert any(r["key"] == "world_size" for r in doc["metadata_changes"])


def test_diff_of_traces_from_different_gpus_names_the_gpu_change_first(tmp_path: Path) -> None:
    a100 = SHARED / "hta" / "nccl_parser_config"  # rank 0 of 2 on an A100
    doc = diff_json(tmp_path, a100, NS_TRACE)  # one V100 rank
    changes = {c["key"]: (c["a"], c["b"]) for c in doc["job_changes"]}
    assert changes["gpu_model"] == ("NVIDIA A100-PG509-200", "Tesla V100-SXM2-32GB")
    assert changes["world_size"] == ("2", "1") and changes["compute_capability"] == ("8.0", "7.0")
    assert "nccl_version" not in changes  # both 2.17.1
    first = doc["notes"][0]
    assert first.startswith("under the job: GPU model NVIDIA A100-PG509-200 -> "
                            "Tesla V100-SXM2-32GB; world size 2 -> 1")
    assert "GPU memory 39.4 GiB -> 31.7 GiB" in first


def test_diff_of_traces_from_the_same_gpu_names_no_change_under_the_job(tmp_path: Path) -> None:
    doc = diff_json(tmp_path, NS_TRACE, NS_TRACE)
    assert doc["job_changes"] == [] and not any(n.startswith("under the job") for n in doc["notes"])
