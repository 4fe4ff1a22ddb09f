"""Every remedy's precondition (`causes.REMEDIES`) checked on a real trace where it holds and one
where it does not (../shared/traces; the fused optimizer and the expert-parallel all-to-all on
the sample job, tests/jobs/test_expert_parallel_job.py), and docs/findings.md's table of
remedies is the one `causes.remedies_table` makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests._gpu_samples import copy_samples
from uberprof.analysis.diagnosis.advisor import analysed_steps
from uberprof.analysis.diagnosis.causes import (
    EXAMPLE_TRAITS,
    REMEDIES,
    chosen_remedy,
    remedies_table,
)
from uberprof.analysis.diagnosis.findings import REMEDIES_TABLE_BEGIN, REMEDIES_TABLE_END
from uberprof.analysis.diagnosis.job_traits import job_traits
from uberprof.analysis.tables.context import load_context

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
DOCS = Path(__file__).resolve().parents[2] / "docs"
# trace_filter: foreach Shampoo, fbgemm embeddings, all-to-all 53% of comm, FP8 kernels;
# nccl_parser_config: DDP, all-reduce ~100% of comm, foreach SGD; resnet50: plain SGD, 4
# data-loader workers; critical_path_simple_add: no optimizer at all
FOLDERS = ("hta/trace_filter", "hta/nccl_parser_config", "tb_plugin/resnet50_num_workers_4",
           "hta/critical_path_simple_add")
# samples/gpu/whatif/data-problem: an H100 DDP run whose data loader has no worker (num_workers=0)
DATA_PROBLEM = "whatif/data-problem"


@pytest.fixture(scope="module")
def traits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if not TRACES.is_dir():
        pytest.skip("../shared/traces is not there")
    out = {}
    for f in FOLDERS:
        ctx = load_context(TRACES / f, out=tmp_path_factory.mktemp("t") / "derived", workers=1)
        out[f] = job_traits(ctx, analysed_steps(ctx), "cuda")
    root = tmp_path_factory.mktemp("gpu")
    (root / "whatif").mkdir()
    run = copy_samples(root, (DATA_PROBLEM,))[DATA_PROBLEM]
    ctx = load_context(run, workers=1)
    out[DATA_PROBLEM] = job_traits(ctx, analysed_steps(ctx), "cuda")
    return out


def _rule(key: str):
    return next(r for r in REMEDIES if r.key == key)


def test_the_remedies_table_in_findings_md_is_the_one_causes_makes() -> None:
    text = (DOCS / "findings.md").read_text(encoding="utf-8")
    table = text.split(REMEDIES_TABLE_BEGIN)[1].split(REMEDIES_TABLE_END)[0].strip()
    assert table == remedies_table()
    for r in REMEDIES:
        assert f"`{r.key}`" in table


def test_every_finding_has_a_last_remedy_that_always_holds() -> None:
    for serves in {r.serves for r in REMEDIES}:
        assert chosen_remedy(serves, {}) is not None


@pytest.mark.parametrize(("key", "holds_on", "fails_on"), [
    ("host_foreach_already", "hta/trace_filter", "tb_plugin/resnet50_num_workers_4"),
    ("host_plain_optimizer", "tb_plugin/resnet50_num_workers_4", "hta/trace_filter"),
    ("ddp_buckets", "hta/nccl_parser_config", "hta/trace_filter"),
    ("all_to_all_quantised_already", "hta/trace_filter", "hta/nccl_parser_config"),
    ("data_in_process", DATA_PROBLEM, "tb_plugin/resnet50_num_workers_4"),
    ("data_workers_already", "tb_plugin/resnet50_num_workers_4", DATA_PROBLEM),
    ("straggler_data_in_process", DATA_PROBLEM, "tb_plugin/resnet50_num_workers_4"),
    ("straggler_data_workers_already", "tb_plugin/resnet50_num_workers_4", DATA_PROBLEM),
])
def test_precondition_holds_on_one_real_trace_and_fails_on_another(
        traits: dict[str, dict[str, Any]], key: str, holds_on: str, fails_on: str) -> None:
    r = _rule(key)
    assert r.holds(traits[holds_on]) and not r.holds(traits[fails_on])


def test_remedy_chosen_per_trace_is_the_first_that_holds(
        traits: dict[str, dict[str, Any]]) -> None:
    host = {f: chosen_remedy("idle (host)", t).key for f, t in traits.items()}
    assert host == {"hta/trace_filter": "host_foreach_already",
                    "hta/nccl_parser_config": "host_foreach_already",
                    "tb_plugin/resnet50_num_workers_4": "host_plain_optimizer",
                    "hta/critical_path_simple_add": "host_generic",
                    DATA_PROBLEM: "host_foreach_already"}
    ddp = {f: chosen_remedy("exposed_comm (DDP)", t).key for f, t in traits.items()}
    assert ddp["hta/trace_filter"] == "ddp_not_the_traffic"
    assert ddp["hta/nccl_parser_config"] == "ddp_buckets"
    assert traits["tb_plugin/resnet50_num_workers_4"]["data_loader_workers"] == "several"
    assert chosen_remedy("data_stall", traits["hta/trace_filter"]).key == "data_generic"


def test_fused_cuda_graph_and_compiled_preconditions_fail_on_every_shared_trace(
        traits: dict[str, dict[str, Any]]) -> None:
    for key in ("host_fused_already", "launch_graphs_already", "launch_compiled_no_graphs"):
        assert not any(_rule(key).holds(t) for t in traits.values()), key
    assert {chosen_remedy("launch_bound", t).key for t in traits.values()} == {"launch_eager"}


def test_cuda_graph_and_compiled_preconditions_hold_on_traits_that_show_them() -> None:
    # no trace at hand (and no GPU here) shows cudaGraphLaunch or Triton kernels: the traits
    # as job_traits writes them for such a trace
    graphs = {**EXAMPLE_TRAITS, "cuda_graphs": {"present": True, "launches": 40}}
    compiled = {**EXAMPLE_TRAITS, "compiled": {"present": True, "triton_kernels": 120}}
    assert chosen_remedy("launch_bound", graphs).key == "launch_graphs_already"
    assert "40 cudaGraphLaunch calls" in chosen_remedy("launch_bound", graphs).say(graphs)
    assert chosen_remedy("launch_bound", compiled).key == "launch_compiled_no_graphs"
    assert "reduce-overhead" in chosen_remedy("launch_bound", compiled).say(compiled)
