"""Remedies chosen from what the job already does (issue 50), on the real GPU traces in
../shared/traces: HTA's `trace_filter` (a 128-GPU recommendation job: fbgemm split embeddings
sharded through all-to-alls, the dense part under DDP, a foreach Shampoo optimizer) and the
traces where the opposite holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from uberprof.cli import main

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is not there")


def _report(folder: str, out: Path) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["report", str(TRACES / folder), "--json", "--workers", "1",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output[-2000:]
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def trace_filter(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _report("hta/trace_filter", tmp_path_factory.mktemp("tf"))


def _finding(doc: dict[str, Any], kind: str, cause: str | None = None) -> dict[str, Any]:
    return next(f for f in doc["findings"] if f["kind"] == kind
                and (cause is None or f["cause"] == cause))


def test_trace_filter_parallelism_names_embedding_sharding_from_its_all_to_alls(
        trace_filter: dict[str, Any]) -> None:
    p = trace_filter["run"]["parallelism"]
    assert p["summary"] == "embedding sharding (128) x DDP (128)"
    assert "all-to-all" in p["evidence"]["embedding"]
    assert "fbgemm" in p["evidence"]["embedding"]


def test_trace_filter_exposed_comm_remedy_says_what_it_saw_without_bucket_cap_mb(
        trace_filter: dict[str, Any]) -> None:
    remedy = _finding(trace_filter, "exposed_comm")["remedy"]
    assert "bucket_cap_mb" not in remedy
    assert remedy.startswith("Embedding sharding")
    # the all-to-all's size and share, and that DDP's all-reduces are the smaller part
    assert "up to 400.0 MB each" in remedy and "all-reduces are only 20%" in remedy
    assert "FP8 kernels seen" in remedy  # the all-to-all already runs quantised


def test_trace_filter_host_idle_remedy_says_it_already_uses_foreach(
        trace_filter: dict[str, Any]) -> None:
    remedy = _finding(trace_filter, "idle", "host")["remedy"]
    assert "use a fused or foreach optimizer" not in remedy.lower()
    assert remedy.startswith("Already uses a foreach optimizer: EMAOptimizer/Shampoo")
    o = trace_filter["run"]["job_traits"]["optimizer"]
    assert o["region"] == "## optimizer ##" and 190 < o["host_ms_per_step"] < 260
    assert f"{o['host_ms_per_step']} ms of host time a step in ## optimizer ##" in remedy
    assert "aten::_foreach_mul_" in remedy and "fused optimizer on the device" in remedy


def test_trace_filter_launch_remedy_says_no_cuda_graph_or_compiled_kernel_was_seen(
        trace_filter: dict[str, Any]) -> None:
    t = trace_filter["run"]["job_traits"]
    assert not t["cuda_graphs"]["present"] and not t["compiled"]["present"]
    assert _finding(trace_filter, "launch_bound")["remedy"].startswith(
        "No cudaGraphLaunch nor compiled (Triton) kernel in the traces")


def test_ddp_trace_whose_all_reduces_are_its_traffic_keeps_the_bucket_remedy_with_its_sizes(
        tmp_path: Path) -> None:
    doc = _report("hta/nccl_parser_config", tmp_path)
    assert doc["run"]["parallelism"]["summary"] == "DDP (2)"
    t = doc["run"]["job_traits"]
    [ar] = [c for c in t["collectives"] if c["name"] == "allreduce"]
    assert ar["share_pct"] > 50
    comm = [f for f in doc["findings"] if f["kind"] == "exposed_comm"]
    for f in comm:
        assert "bucket_cap_mb=" in f["remedy"] and f"median {ar['mb_median']} MB" in f["remedy"]
