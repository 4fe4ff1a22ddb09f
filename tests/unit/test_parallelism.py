"""Reading a run's parallelism (analysis/tables/parallelism.py), the remedies that fit it
(diagnosis/causes.py), the tensor-parallel finding's accounting (findings/tp_comm.py) and the
report's line. On synthetic process groups and event names, and on the real NCCL traces in
../shared/traces; the CPU parallel jobs are tests/jobs/test_parallelism_reading.py."""

from __future__ import annotations

import gzip
import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from uberprof.analysis.diagnosis.advisor import account
from uberprof.analysis.diagnosis.causes import (
    COMM_REMEDIES,
    exposed_comm_remedy,
    link_remedy,
)
from uberprof.analysis.diagnosis.document import empty_diagnosis
from uberprof.analysis.diagnosis.findings import finding_kinds
from uberprof.analysis.diagnosis.findings.tp_comm import (
    _tp_alone,
    _tp_combined,
    unless_tensor_parallel_only,
)
from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.tables.context import load_context
from uberprof.analysis.tables.parallelism import (
    Parallelism,
    parallelism_of,
    read_parallelism,
    recorded_parallelism,
)
from uberprof.present.report_terminal import parallelism_line, render_report

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
# FSDP1's options, as whole words (FSDP2's set_modules_to_backward_prefetch is not one)
FSDP1_NAMES = re.compile(r"\b(backward_prefetch|forward_prefetch|limit_all_gathers|"
                         r"BackwardPrefetch|FullyShardedDataParallel|no_sync)\b")


def _mesh(rank: int, dims: dict[str, list[list[int]]], world: int) -> list[dict[str, Any]]:
    """A rank's pg_config as the trace header gives it: the default group, then its groups
    of each mesh dimension."""
    out = [{"name": "0", "desc": "default_pg", "size": world, "ranks": list(range(world))}]
    for i, (d, groups) in enumerate(dims.items()):
        g = next(g for g in groups if rank in g)
        out.append({"name": str(i + 1), "desc": f"mesh_{d}", "size": len(g), "ranks": g})
    return out


def _world(world: int) -> dict[int, list[dict[str, Any]]]:
    return {r: [{"name": "0", "desc": "default_pg", "size": world, "ranks": list(range(world))}]
            for r in range(world)}


PP_DP = {"pp": [[0, 2], [1, 3]], "dp": [[0, 1], [2, 3]]}
DP_TP = {"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]}


def test_a_pipeline_by_data_parallel_mesh_gives_stages_from_the_pp_groups() -> None:
    groups = {r: _mesh(r, PP_DP, 4) for r in range(4)}
    names = {r: {"DistributedDataParallel.forward", "c10d::send", "c10d::recv_", "aten::mm"}
             for r in range(4)}
    p = parallelism_of(groups, names, 4)
    assert p.kinds == ("pp", "ddp")
    assert p.dims == {"pp": 2, "dp": 2}
    assert p.groups["pp"] == [[0, 2], [1, 3]] and p.groups["ddp"] == [[0, 1], [2, 3]]
    assert p.stage_of == {0: 0, 2: 1, 1: 0, 3: 1}
    assert p.summary() == "pipeline (2 stages) x DDP (2)"
    assert "mesh dimension 'pp'" in p.evidence["pp"]
    assert json.loads(json.dumps(p.as_dict()))["stage_of"] == {"0": 0, "1": 0, "2": 1, "3": 1}


def test_a_one_dimensional_pipeline_is_read_from_send_recv_and_its_stage_is_the_rank() -> None:
    names = {r: {"c10d::send", "c10d::recv_", "gloo:send", "gloo:recv", "aten::mm"}
             for r in range(3)}
    p = parallelism_of(_world(3), names, 3)
    assert p.kinds == ("pp",) and p.dims == {}
    assert p.stage_of == {0: 0, 1: 1, 2: 2}
    assert p.summary() == "pipeline (3 stages)"


def test_point_to_point_on_some_ranks_only_is_not_called_a_pipeline() -> None:
    names = {0: {"c10d::send"}, 1: {"aten::mm"}}
    assert parallelism_of(_world(2), names, 2).kinds == ()


def test_fsdp_by_tensor_parallel_mesh_gives_fsdp_the_dp_groups() -> None:
    groups = {r: _mesh(r, DP_TP, 4) for r in range(4)}
    names = {r: {"FSDP::pre_forward (blocks.0)", "_c10d_functional::all_reduce",
                 "_c10d_functional::wait_tensor"} for r in range(4)}
    p = parallelism_of(groups, names, 4)
    assert p.kinds == ("tp", "fsdp2")
    assert p.groups["tp"] == [[0, 1], [2, 3]] and p.groups["fsdp2"] == [[0, 2], [1, 3]]
    assert p.stage_of == {}
    assert p.summary() == "tensor parallel (2) x FSDP2 (2)"


@pytest.mark.parametrize(("names", "kinds", "summary"), [
    ({"FSDP::pre_forward", "FSDP::post_backward_reduce"}, ("fsdp2",), "FSDP2 (2)"),
    ({"FullyShardedDataParallel.forward", "FullyShardedDataParallel._pre_forward"},
     ("fsdp1",), "FSDP1 (2)"),
    ({"DistributedDataParallel.forward", "c10d::allreduce_"}, ("ddp",), "DDP (2)"),
    ({"_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"}, ("tp",),
     "tensor parallel (2)"),
])
def test_each_api_is_told_by_its_own_marker(names: set[str], kinds: tuple[str, ...],
                                            summary: str) -> None:
    p = parallelism_of(_world(2), {0: names, 1: names}, 2)
    assert p.kinds == kinds and p.summary() == summary
    assert p.groups[kinds[0]] == [[0, 1]]
    assert "2 of 2 rank(s)" in p.evidence[kinds[0]]


def test_a_single_process_and_an_unmarked_job_say_so() -> None:
    assert parallelism_of({0: []}, {0: {"aten::mm"}}, 1).summary() == "single process"
    unknown = parallelism_of(_world(2), {0: {"c10d::allreduce_"}, 1: set()}, 2)
    assert unknown.kinds == () and unknown.summary().startswith("not known (2 ranks")


def test_a_mesh_dimension_without_a_marker_is_named_as_a_dimension() -> None:
    groups = {r: _mesh(r, {"dp": [[0, 1]]}, 2) for r in range(2)}
    p = parallelism_of(groups, {0: set(), 1: set()}, 2)
    assert p.kinds == () and p.summary() == "data parallel (2)"


# --- the real NCCL traces ----------------------------------------------------------------------

NO_MARKER = "no DDP, FSDP, pipeline or tensor-parallel marker in the traces"


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")
@pytest.mark.parametrize(("folder", "summary"), [
    # 2 of a 128-rank recommendation job: fbgemm embeddings sharded (all-to-all), DDP dense
    ("hta/trace_filter", "embedding sharding (128) x DDP (128)"),
    ("hta/nccl_parser_config", "DDP (2)"),
    ("hta/cpu_only", f"not known (300 ranks; {NO_MARKER})"),
    ("tb_plugin/test_distributed_nccl", f"not known (2 ranks; {NO_MARKER})"),
])
def test_the_shared_nccl_traces_read_as_data_parallel_or_unknown(folder: str, summary: str,
                                                                 tmp_path: Path) -> None:
    ctx = load_context(SHARED / folder, out=tmp_path / "derived", workers=1)
    p = read_parallelism(ctx)
    assert p.summary() == summary
    assert "pp" not in p.kinds and "tp" not in p.kinds and p.stage_of == {}


# --- info: the saved reading, else the trace headers --------------------------------------------

def _trace(path: Path, pg_config: list[dict[str, Any]]) -> Path:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0,
                                                   "pg_config": pg_config},
           "traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 1}] * 1000}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def test_info_reads_the_mesh_from_the_trace_heads_when_no_report_was_saved(
        tmp_path: Path) -> None:
    traces = {}
    for r in range(4):
        pgs = [{"pg_name": g["name"], "pg_desc": g["desc"], "pg_size": g["size"],
                "ranks": g["ranks"]} for g in _mesh(r, PP_DP, 4)]
        traces[r] = _trace(tmp_path / f"r{r}.json.gz", pgs)
    p = recorded_parallelism(tmp_path, traces)
    assert p is not None and p["kinds"] == ["pp"] and p["dims"] == {"pp": 2, "dp": 2}
    assert p["summary"] == "pipeline (2 stages) x data parallel (2)"
    assert p["stage_of"] == {"0": 0, "1": 0, "2": 1, "3": 1}
    assert p["basis"].startswith("trace headers")
    no_mesh = {0: _trace(tmp_path / "w.json.gz", [{"pg_name": "0", "pg_desc": "default_pg",
                                                   "pg_size": 2, "ranks": [0, 1]}])}
    assert recorded_parallelism(tmp_path / "nothing", no_mesh) is None


# --- remedies -----------------------------------------------------------------------------------

def test_fsdp2_is_never_told_fsdp1_option_names() -> None:
    for text in (exposed_comm_remedy(("fsdp2",)), exposed_comm_remedy(("tp", "fsdp2")),
                 link_remedy("bandwidth-bound", ("fsdp2",)),
                 link_remedy("latency-bound", ("fsdp2",))):
        assert not FSDP1_NAMES.findall(text), text
    text = exposed_comm_remedy(("fsdp2",))
    for name in ("set_modules_to_forward_prefetch", "set_modules_to_backward_prefetch",
                 "reshard_after_forward", "set_requires_gradient_sync"):
        assert name in text


def test_each_kind_gets_its_own_remedy_and_only_its_own() -> None:
    assert "limit_all_gathers" in exposed_comm_remedy(("fsdp1",))
    assert "set_modules_to_forward_prefetch" not in exposed_comm_remedy(("fsdp1",))
    ddp = exposed_comm_remedy(("ddp",))
    assert "bucket_cap_mb" in ddp and "no_sync" in ddp and "FSDP" not in ddp
    pp = exposed_comm_remedy(("pp",))
    assert "ScheduleInterleaved1F1B" in pp and "micro-batches" in pp and "rebalance" in pp
    assert "bucket_cap_mb" not in pp and "FSDP" not in pp
    tp = exposed_comm_remedy(("tp",))
    assert "SequenceParallel" in tp and "async TP" in tp and "TP degree" in tp
    both = exposed_comm_remedy(("pp", "ddp"))
    assert both.index("Pipeline") < both.index("DDP")
    assert "FSDP2's" in exposed_comm_remedy(()) and "bucket_cap_mb" in exposed_comm_remedy(())
    assert "bucket_cap_mb" not in link_remedy("latency-bound", ("pp",))


def test_the_remedies_name_apis_that_torch_has() -> None:
    """Every API name the remedies use exists in the installed torch (2.13)."""
    torch = pytest.importorskip("torch")
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel, fully_shard
    from torch.distributed.pipelining import ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble  # noqa: F401
    from torch.distributed.tensor.parallel import SequenceParallel  # noqa: F401

    for m in ("set_modules_to_forward_prefetch", "set_modules_to_backward_prefetch",
              "set_requires_gradient_sync"):
        assert m in COMM_REMEDIES["fsdp2"] and hasattr(FSDPModule, m)
    assert "reshard_after_forward" in inspect.signature(fully_shard).parameters
    fsdp1 = inspect.signature(FullyShardedDataParallel.__init__).parameters
    assert {"backward_prefetch", "forward_prefetch", "limit_all_gathers"} <= set(fsdp1)
    ddp = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    assert {"bucket_cap_mb", "gradient_as_bucket_view", "find_unused_parameters"} <= set(ddp)
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group  # noqa: F401

    assert hasattr(inductor_config, "_micro_pipeline_tp")


# --- the tensor-parallel finding: each millisecond once -----------------------------------------

def _generic(ms: float = 300.0) -> Finding:
    ev = {"exposed_ms_all_ranks_pay": ms, "wait_ms": 100.0, "transfer_ms": ms - 100.0,
          "comm_ms_least_rank": ms * 2, "exposed_of_comm_pct": 50.0, "share_pct": 30.0,
          "limited_collectives": [], "test": {"sentence": "..."}}
    return Finding("exposed_comm", "high", "Communication not hidden", [0, 1, 2, 3], [3, 4],
                   None, ms, ev, exposed_comm_remedy(("tp", "fsdp2")), observed_ms=ms)


def _facts(p: Parallelism, found: list[Finding]) -> SimpleNamespace:
    return SimpleNamespace(parallelism=p, found=found,
                           first=lambda k: next((f for f in found if f.kind == k), None))


def test_tp_with_fsdp_links_all_its_time_to_the_generic_finding_and_is_suspected() -> None:
    groups = {r: _mesh(r, DP_TP, 4) for r in range(4)}
    p = parallelism_of(groups, {r: {"FSDP::pre_forward", "_c10d_functional::all_reduce"}
                                for r in range(4)}, 4)
    generic = _generic()
    f = _tp_combined(generic, _facts(p, [generic]))  # type: ignore[arg-type]
    assert f.kind == "tp_exposed_comm" and f.confidence == "suspected"
    assert f.time_at_stake_ms == 0.0 and f.observed_ms == 300.0
    assert f.evidence["separable"] is False and "not separable" in f.title
    assert "SequenceParallel" in f.remedy
    ranked = account([generic, f], 1000 * 1e6)
    assert sum(x.time_at_stake_ms for x in ranked) == pytest.approx(300.0)
    assert ranked[1].caused_by[0]["index"] == 0


def test_on_a_tp_only_run_the_generic_finding_defers_and_the_tp_one_holds_the_time() -> None:
    p = parallelism_of(_world(2), {r: {"_c10d_functional::wait_tensor"} for r in range(2)}, 2)
    generic = _generic()
    facts = _facts(p, [])
    assert unless_tensor_parallel_only(lambda _: [generic])(facts) == []  # type: ignore[arg-type]
    f = _tp_alone(generic, facts)  # type: ignore[arg-type]
    assert f.kind == "tp_exposed_comm" and f.time_at_stake_ms == generic.time_at_stake_ms
    assert "TP group of 2 ranks" in f.title and f.evidence["tp_groups"] == [[0, 1]]
    other = _facts(parallelism_of(_world(2), {r: {"DistributedDataParallel.forward"}
                                              for r in range(2)}, 2), [])
    assert unless_tensor_parallel_only(lambda _: [generic])(other) == [generic]  # type: ignore[arg-type]
    assert "tp_exposed_comm" in finding_kinds()


# --- the report states it -----------------------------------------------------------------------

def test_the_report_states_the_parallelism_near_the_top(tmp_path: Path) -> None:
    d = empty_diagnosis(tmp_path, [])
    assert d.run["parallelism"] is None and parallelism_line(d.run) == ""
    groups = {r: _mesh(r, PP_DP, 4) for r in range(4)}
    p = parallelism_of(groups, {r: {"DistributedDataParallel.forward"} for r in range(4)}, 4)
    d.run["parallelism"] = p.as_dict()
    assert parallelism_line(d.run) == ("Parallelism: pipeline (2 stages) x DDP (2); stages: "
                                       "0: rank 0/1, 1: rank 2/3")
    console = Console(record=True, width=200)
    render_report(d, console)
    lines = console.export_text().splitlines()
    assert any(line.startswith("Parallelism: pipeline (2 stages) x DDP (2)")
               for line in lines[:4]), lines[:6]
