"""An expert-parallel job (samples/train_moe.py: tokens dispatched to each rank's experts and
combined back through all-to-alls, on CPU/Gloo) is read as expert parallel from its
collectives, and its remedies are chosen from what it already does (issue 50): its optimizer's
implementation and the all-to-alls' sizes and splits, as saved in `run.job_traits`."""

from __future__ import annotations

from tests._parallel_runs import Report
from uberprof.analysis.diagnosis.causes import REMEDIES, chosen_remedy


def _a2a(report: dict) -> dict:
    return max((c for c in report["run"]["job_traits"]["collectives"]
                if c["name"] == "alltoall"), key=lambda c: c["ms"])


def test_all_to_all_job_reads_as_expert_parallel_from_its_collectives(moe_run: Report) -> None:
    p = moe_run[1]["run"]["parallelism"]
    assert p["kinds"] == ["ep"] and p["summary"] == "expert parallel (2)", p
    assert "all-to-all" in p["evidence"]["ep"] and "embedding" not in p["evidence"]


def test_job_traits_name_its_fused_optimizer_and_unequal_all_to_all_splits(
        moe_run: Report) -> None:
    t = moe_run[1]["run"]["job_traits"]
    o = t["optimizer"]
    assert o["classes"] == ["AdamW"] and o["implementation"] == "fused" and o["device"] == "cpu"
    assert o["host_ms_per_step"] > 0 and o["top_op"]["name"].startswith("aten::_fused_adamw")
    a2a = _a2a(moe_run[1])
    lo, hi = a2a["largest_mb_across_ranks"]
    assert a2a["calls_per_step"] >= 4 and lo < 0.9 * hi, a2a  # half the tokens to rank 0
    assert not t["cuda_graphs"]["present"] and not t["embeddings"]["present"]


def test_plain_optimizer_job_reads_as_plain(moe_plain_run: Report) -> None:
    o = moe_plain_run[1]["run"]["job_traits"]["optimizer"]
    assert o["implementation"] == "plain" and o["top_op"] is None


def test_expert_parallel_remedies_fit_it_and_quote_its_all_to_all(moe_run: Report) -> None:
    report = moe_run[1]
    for f in report["findings"]:
        assert "bucket_cap_mb" not in f["remedy"], (f["kind"], f["remedy"])
        assert "fused or foreach optimizer" not in f["remedy"], (f["kind"], f["remedy"])
    comm = [f for f in report["findings"] if f["kind"] == "exposed_comm"]
    assert comm, [f["kind"] for f in report["findings"]]  # the all-to-alls block every rank
    remedy = comm[0]["remedy"]
    assert remedy.startswith("Expert parallel") and "unequal splits" in remedy
    assert f"{_a2a(report)['mb_max']} MB" in remedy


def test_optimizer_preconditions_hold_on_the_fused_job_and_the_plain_one(
        moe_run: Report, moe_plain_run: Report) -> None:
    fused, plain = (r[1]["run"]["job_traits"] for r in (moe_run, moe_plain_run))
    assert chosen_remedy("idle (host)", fused).key == "host_fused_already"
    assert chosen_remedy("idle (host)", plain).key == "host_plain_optimizer"
    [quantised] = [r for r in REMEDIES if r.key == "all_to_all_quantised_already"]
    assert not quantised.holds(fused)  # no FP8 kernel on a CPU job
    assert chosen_remedy(
        "exposed_comm (embedding sharding, expert parallel)", fused).key == "all_to_all_quantise"


def test_unequal_expert_load_is_an_all_to_all_imbalance_naming_the_rank_with_more_tokens(
        moe_run: Report, moe_plain_run: Report) -> None:
    """Half of every rank's tokens routed to rank 0's experts (--skew 0.5): the all-to-alls'
    splits are unequal with rank 0 the heaviest, and the finding names it, with the waiting it
    causes explained on the ranks that pay it. Even routing: no such finding."""
    report = moe_run[1]
    found = [f for f in report["findings"] if f["kind"] == "alltoall_imbalance"]
    assert found, [(f["kind"], f["title"]) for f in report["findings"]]
    f = found[0]
    assert 0 in f["ranks"] and f["evidence"]["splits"]["heavy_ranks"] == [0], f["evidence"]
    assert f["evidence"]["splits"]["max_ratio"] >= 1.25 and f["accounts_for"]
    for r, part in f["accounts_for"].items():  # what it explains, each rank's own waiting
        rank = next(x for x in report["ranks"] if str(x["rank"]) == r)
        waits = {w["rank"]: w["ms"] for w in rank["exposed_comm"]["wait_by_peer"]}
        assert part["exposed_comm_ms"] <= sum(waits.get(int(c), 0.0) for c in f["ranks"]) + 1e-3
    plain = moe_plain_run[1]["findings"]
    assert [x["title"] for x in plain if x["kind"] == "alltoall_imbalance"] == []
