"""`uberprof report` on the real GPU (and CPU) traces in ../shared/traces: it runs on every one,
and what it finds matches what was checked by hand (see the README's `uberprof report`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from uberprof.cli import main

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
FOLDERS = sorted(p.relative_to(TRACES).as_posix() for p in TRACES.glob("*/*") if p.is_dir())

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is not there")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("trace-reports")
    docs = {}
    for folder in FOLDERS:
        res = CliRunner().invoke(main, ["report", str(TRACES / folder), "--json", "--workers",
                                        "1", "--out", str(out / folder.replace("/", "_"))])
        assert res.exit_code == 0, f"{folder}: {res.output[-2000:]}"
        docs[folder] = json.loads(res.stdout)
    return docs


def _kinds(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in doc["findings"]:
        out.setdefault(f["kind"], []).append(f)
    return out


@pytest.mark.parametrize("folder", FOLDERS)
def test_report_runs_on_every_shared_trace(reports: dict[str, dict[str, Any]],
                                           folder: str) -> None:
    doc = reports[folder]
    assert doc["ranks"], folder
    for f in doc["findings"]:
        assert f["time_at_stake_ms"] >= 0 and f["remedy"]
    # one trace per rank, never a straggler (nothing to compare with, or healthy)
    assert "straggler" not in _kinds(doc)


def test_compute_bound_v100_trace_has_nothing_big(reports: dict[str, dict[str, Any]]) -> None:
    doc = reports["hta/ns_resolution_trace"]  # 96.8% compute in HTA
    assert all(f["severity"] != "high" for f in doc["findings"]), doc["findings"]


def test_nccl_trace_is_launch_and_host_bound(reports: dict[str, dict[str, Any]]) -> None:
    doc = reports["hta/nccl_parser_config"]  # 77.8% idle in HTA, small kernels
    kinds = _kinds(doc)
    assert kinds["launch_bound"][0]["severity"] == "high"
    assert doc["findings"][0]["kind"] in ("launch_bound", "idle")
    [r] = doc["ranks"]
    assert r["idle_gaps"]["ms_by_cause"]["launch"] > 100


def test_two_ranks_of_a_big_job_are_matched_and_aligned(
        reports: dict[str, dict[str, Any]]) -> None:
    doc = reports["hta/trace_filter"]  # ranks 0 and 1 of 128, sampled events
    coll = doc["run"]["collectives"]
    assert coll["matched_instances"] >= 4 and coll["unmatched_calls"] > 0
    hosts = doc["run"]["clock_alignment"]["hosts"]
    assert [h["method"] for h in hosts] == ["reference", "collectives"]
    assert abs(hosts[1]["offset_ns"]) < 1_000_000  # the same host in all likelihood
    # group size 128 comes from the trace header: busbw uses it
    assert all(c["busbw_gbit_s"] for c in doc["run"]["bandwidth"])
    assert "exposed_comm" in _kinds(doc)


def test_resnet_with_dataloader_workers_is_launch_bound(
        reports: dict[str, dict[str, Any]]) -> None:
    doc = reports["tb_plugin/resnet50_num_workers_4"]
    assert doc["findings"][0]["kind"] == "launch_bound"


def test_gloo_trace_is_communication_bound(reports: dict[str, dict[str, Any]]) -> None:
    doc = reports["hta/cpu_only"]  # rank 34 of 300, 87% in gloo:all_reduce
    assert doc["findings"][0]["kind"] == "exposed_comm"
    assert doc["findings"][0]["severity"] == "high"
