"""`uberprof report --json` on every real GPU trace here (issue 48): ../shared/traces (HTA's and
the tb_plugin's), samples/gpu (H100 runs) and samples/gpu/public (more of HTA's test data, with
its source in samples/gpu/README.md). Each document must not contradict itself in what a reader
checks by eye: shares, times at stake, projections, the order of the findings, memory."""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from uberprof.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"
SAMPLES = ROOT / "samples" / "gpu"


def _corpus() -> dict[str, Path]:
    """Each trace (a folder of one job's traces, a run directory or one trace file) by name."""
    out: dict[str, Path] = {}
    if SHARED.is_dir():
        out |= {p.relative_to(SHARED).as_posix(): p for p in sorted(SHARED.glob("*/*"))
                if p.is_dir()}
    out |= {f"samples/{n}": SAMPLES / n for n in ("gloo2", "nccl1", "straggler", "oom")}
    out |= {f"samples/whatif/{p.name}": p for p in sorted((SAMPLES / "whatif").iterdir())
            if p.is_dir()}
    out["samples/profile"] = SAMPLES / "profile"  # a trace and its key_averages JSON: one rank
    out |= {f"public/{p.relative_to(SAMPLES / 'public').as_posix()}": p
            for p in sorted((SAMPLES / "public").glob("*/*")) if p.is_dir()}
    return out


CORPUS = _corpus()
SEVERITY = {"high": 0, "medium": 1, "low": 2}


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every corpus trace's report document, once per module (derived tables under tmp: nothing
    is written beside the traces)."""
    out = tmp_path_factory.mktemp("corpus")
    got = {}
    for name, path in CORPUS.items():
        res = CliRunner().invoke(main, ["report", str(path), "--json", "--workers", "1",
                                        "--out", str(out / name.replace("/", "_"))])
        # 3: the report found a hang or crash (samples/gpu/oom), its verdict
        assert res.exit_code in (0, 3), f"{name}: {res.output[-2000:]}"
        got[name] = json.loads(res.stdout)
    return got


def _violations(docs: dict[str, dict[str, Any]], check: Any) -> list[str]:
    return [f"{name}: {v}" for name, d in docs.items() for v in check(d)]


def test_the_corpus_holds_thirty_real_gpu_traces_from_several_vendors(
        docs: dict[str, dict[str, Any]]) -> None:
    """Every trace is reported; at least 30 have an accelerator rank, NVIDIA and AMD among
    them (the CPU-only and rank-less edge cases are in the corpus too, and not counted)."""
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is not there")
    assert [n for n, d in docs.items() if not d["ranks"]] == []
    gpu = [n for n, d in docs.items() if any(r["mode"] == "device" for r in d["ranks"])]
    assert len(gpu) >= 30, sorted(gpu)
    devices = {r.get("device_type") for d in docs.values() for r in d["ranks"]}
    assert {"cuda", "rocm"} <= devices, devices


def _shares(d: dict[str, Any]) -> list[str]:
    bad = []
    for r in d["ranks"]:
        b = r.get("breakdown_pct") or {}
        for k, v in b.items():
            if v is not None and not 0.0 <= v <= 100.0:
                bad.append(f"rank {r['rank']} {k} {v}%")
        parts = [b.get(k) for k in ("compute", "exposed_comm", "memory", "idle")]
        if all(p is not None for p in parts) and abs(sum(parts) - 100.0) > 0.5:
            bad.append(f"rank {r['rank']} compute+exposed+memory+idle = {sum(parts):.2f}%")
    return bad


def test_each_ranks_breakdown_shares_are_within_0_100_and_sum_to_100(
        docs: dict[str, dict[str, Any]]) -> None:
    assert _violations(docs, _shares) == []


IDLE_KINDS = ("idle", "data_stall", "launch_bound")


def _idle_agrees(d: dict[str, Any]) -> list[str]:
    """The rank table's idle share is of the time the idle findings' shares are of: each
    rank's idle gaps fit in its idle time, and no idle finding stakes more (in ms or as a share)
    than the idlest rank shows in the table."""
    bad, most_ms, most_pct = [], 0.0, 0.0
    for r in d["ranks"]:
        idle_pct, window = r["breakdown_pct"]["idle"], r["analysed"]["window_ms"]
        if idle_pct is None or not window:
            continue
        idle_ms = idle_pct * window / 100.0
        gaps = sum(r["idle_gaps"]["ms_by_cause"].values())
        if gaps > idle_ms + 0.01 * window + 1e-3:  # the shares are rounded to 0.01 points
            bad.append(f"rank {r['rank']}: idle gaps {gaps:.3f} ms, table idle {idle_pct}% "
                       f"of {window} ms")
        most_ms, most_pct = max(most_ms, idle_ms), max(most_pct, idle_pct)
    wall = d["run"]["analysed_wall_ms"] or 0.0
    for i, f in enumerate(d["findings"]):
        if f["kind"] not in IDLE_KINDS or not wall:
            continue
        share = 100.0 * f["time_at_stake_ms"] / wall
        if f["time_at_stake_ms"] > most_ms + 0.01 * wall + 1e-3 or share > most_pct + 0.05:
            bad.append(f"#{i + 1} {f['kind']}: {f['time_at_stake_ms']} ms ({share:.2f}%) at "
                       f"stake, the table's idlest rank {most_ms:.3f} ms ({most_pct}%)")
    return bad


def test_the_rank_tables_idle_share_agrees_with_the_idle_findings(
        docs: dict[str, dict[str, Any]]) -> None:
    """HTA's trace_compare_base (the device runs behind the host's steps) had shown a rank at
    100% compute beside a 272 ms idle finding: the table's shares were of the whole trace's
    device window, cut at the last step, and the finding's of the analysed steps."""
    assert _violations(docs, _idle_agrees) == []
    r = docs["public/hta/trace_compare_base"]["ranks"][0]
    assert r["breakdown_pct"]["idle"] > 90.0, r


def _stakes(d: dict[str, Any]) -> list[str]:
    wall = d["run"]["analysed_wall_ms"] or 0.0
    bad = []
    for i, f in enumerate(d["findings"]):
        if f["time_at_stake_ms"] > wall + 1e-3:
            bad.append(f"#{i + 1} {f['kind']}: {f['time_at_stake_ms']} ms of {wall} ms")
        for m in re.finditer(r"([\d.]+)% of (?:the|its) analysed time", json.dumps(f)):
            if float(m.group(1)) > 100.0:
                bad.append(f"#{i + 1} {f['kind']}: {m.group(0)}")
    total = sum(f["time_at_stake_ms"] for f in d["findings"])
    if total > wall + 1e-2:
        bad.append(f"findings stake {total} ms of {wall} ms")
    return bad


def test_no_finding_stakes_more_than_the_analysed_time(docs: dict[str, dict[str, Any]]) -> None:
    assert _violations(docs, _stakes) == []


def _bounded(d: dict[str, Any]) -> list[str]:
    bad = []
    for i, f in enumerate(d["findings"]):
        g = f["projected_gain"] or {}
        if (g.get("gain_ms") or 0.0) > f["time_at_stake_ms"] + 1e-3 and not g.get("note"):
            bad.append(f"#{i + 1} {f['kind']}: gains {g['gain_ms']} ms of "
                       f"{f['time_at_stake_ms']} ms at stake")
    return bad


def test_a_projected_gain_stays_within_its_findings_time_at_stake(
        docs: dict[str, dict[str, Any]]) -> None:
    assert _violations(docs, _bounded) == []


def _silent(d: dict[str, Any]) -> list[str]:
    wall = d["run"]["analysed_wall_ms"] or 0.0
    bad = []
    for i, f in enumerate(d["findings"]):
        gain = (f["projected_gain"] or {}).get("gain_ms")
        big = wall and f["time_at_stake_ms"] >= 0.1 * wall and f["role"] != "failure"
        if big and (gain is None or gain <= 0.0) and not f["projected_gain_why"]:
            bad.append(f"#{i + 1} {f['kind']}: {f['time_at_stake_ms']} ms at stake, "
                       f"gains {gain}, no why")
    return bad


def test_a_finding_with_a_tenth_at_stake_that_gains_nothing_says_why(
        docs: dict[str, dict[str, Any]]) -> None:
    assert _violations(docs, _silent) == []


def _order(d: dict[str, Any]) -> list[str]:
    fs = [f for f in d["findings"] if f["role"] != "failure"]
    return [f"{a['kind']} ({a['severity']}, {a['time_at_stake_ms']} ms) before {b['kind']} "
            f"({b['severity']}, {b['time_at_stake_ms']} ms)"
            for a, b in pairwise(fs) if SEVERITY[a["severity"]] > SEVERITY[b["severity"]]]


def test_the_order_of_the_findings_agrees_with_their_severity(
        docs: dict[str, dict[str, Any]]) -> None:
    assert _violations(docs, _order) == []


def _walk(o: Any, path: str = "") -> Any:
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, o


def _memory(d: dict[str, Any]) -> list[str]:
    """Sizes are never negative (a growth may be), and a peak is never 0: unknown is null."""
    found = {"memory": d["run"]["memory"], "memory_timeline": d["run"]["memory_timeline"]}
    return [f"{p} = {v}" for p, v in _walk(found)
            if p.endswith("_bytes") and "growth" not in p and isinstance(v, (int, float))
            and (v < 0 or (v == 0 and "peak" in p))]


def test_memory_sizes_are_never_negative_and_an_unknown_peak_is_null(
        docs: dict[str, dict[str, Any]]) -> None:
    assert _violations(docs, _memory) == []
    old = docs.get("tb_plugin/resnet50_num_workers_4")
    if old is not None:  # 2021 [memory] events: only each change's bytes, no totals
        for e in old["run"]["memory_timeline"]["ranks"]:
            assert e["events"] > 0 and e["peak_allocated_bytes"] is None
            assert e["first_allocated_bytes"] is None and e["max_reserved_bytes"] is None


def test_the_terminal_report_says_why_a_finding_gains_nothing(tmp_path: Path) -> None:
    """HTA's trace_filter (two NCCL ranks): its exposed communication (24%) gains nothing in
    the replay, because the host sets its steps (a Shampoo optimizer on the host while the
    device's collectives run, the device done before the host's window ends), and the report
    says why under the finding."""
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is not there")
    res = CliRunner().invoke(main, ["report", str(SHARED / "hta" / "trace_filter"),
                                    "--out", str(tmp_path / "d")], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "ranked by severity" in res.output
    assert "no gain projected: the replay projects no shorter step" in res.output
    assert "host sets most of it" in res.output


def test_hiding_a_ranks_collectives_without_its_peers_gains_an_upper_bound(
        docs: dict[str, dict[str, Any]]) -> None:
    """One A100 rank of an eight-rank NCCL job (HTA's trace_diff control, its peers not in the
    traces): its exposed communication gains a shorter step, within its time at stake, and the
    projection says that its collectives' whole kernels were counted as transfer."""
    d = docs["public/hta/trace_diff_control"]
    f = next(f for f in d["findings"] if f["kind"] == "exposed_comm")
    g = f["projected_gain"]
    assert g is not None and 0.0 < g["gain_ms"] <= f["time_at_stake_ms"], f
    assert "no peer in the traces" in g["note"] and "upper bound" in g["note"]


def test_warm_up_is_named_and_makes_no_finding_on_a_trace_without_step_markers(
        docs: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """AlexNet on one A100, no step markers: a 10 s first cuDNN convolution and 3 s of lazy
    loading in its warm-up forward had read "launch-bound 92.5%". The warm-up part of the
    window is cut and named; what is left (its one measured forward) makes only suspected
    verdicts, each a small part of the trace."""
    d = docs["public/hta/alexnet"]
    w = d["run"]["warmup"]
    assert w is not None and w["steps"] == [] and "init" in w["evidence_ms"], w
    whole = w["cut_ms"]["0"] + d["run"]["analysed_wall_ms"]
    assert w["cut_ms"]["0"] > 0.9 * whole
    res = CliRunner().invoke(main, ["report", str(SAMPLES / "public" / "hta" / "alexnet"),
                                    "--out", str(tmp_path / "d"), "--workers", "1"],
                             terminal_width=200)
    assert "warm-up: the first 12" in res.output and "left out" in res.output, res.output
    for f in d["findings"]:
        assert f["confidence"] == "suspected" and f["time_at_stake_ms"] < 0.01 * whole, f


# Each finding's part of a rank's time is rounded to 0.001 ms, and so is the rank's own: the
# parts may miss the whole by that much per finding, and by 0.05% of a long rank's time
def _tolerance_ms(own: float, n_findings: int) -> float:
    return 0.002 * (n_findings + 1) + 5e-4 * own


def _accounted(d: dict[str, Any]) -> list[str]:
    """Per rank and part (exposed communication, idle): the findings' parts that name the rank
    (`accounts_for`) add up to at most its own time, and with its warm-up (idle) and the
    document's unexplained rest to all of it; its exposed communication's split adds up to it
    too."""
    bad = []
    for r in d["ranks"]:
        if not (r["analysed"].get("window_ms") or 0.0):
            continue
        acc = r.get("accounted")
        if acc is None:
            bad.append(f"rank {r['rank']}: no accounting")
            continue
        for part, key in (("exposed_comm", "exposed_comm_ms"), ("idle", "idle_ms")):
            own = r["analysed"][key] or 0.0
            parts = [float((f["accounts_for"].get(str(r["rank"])) or {}).get(key) or 0.0)
                     for f in d["findings"]]
            tol = _tolerance_ms(own, len(parts))
            if sum(parts) > own + tol:
                bad.append(f"rank {r['rank']} {part}: findings explain {sum(parts):.3f} of "
                           f"{own} ms")
            named = acc[part].get("warmup_ms", 0.0)  # warm-up: named, never a verdict
            if abs(sum(parts) + named + acc[part]["unexplained_ms"] - own) > tol:
                bad.append(f"rank {r['rank']} {part}: findings {sum(parts):.3f} + warm-up "
                           f"{named} + unexplained {acc[part]['unexplained_ms']} != {own} ms")
        c = r["exposed_comm"]
        split = c["wait_ms"] + c["transfer_ms"] + c["unmatched_ms"]
        if abs(split - c["exposed_ms"]) > _tolerance_ms(c["exposed_ms"], 3):
            bad.append(f"rank {r['rank']}: wait + transfer + unmatched {split:.3f} != exposed "
                       f"{c['exposed_ms']} ms")
    return bad


def test_each_ranks_exposed_comm_and_idle_are_explained_by_findings_or_named_unexplained(
        docs: dict[str, dict[str, Any]]) -> None:
    """Issue 48: the rank table and the findings must not disagree. Tolerance: 0.002 ms per
    finding plus 0.05% of the rank's time (rounding to 0.001 ms)."""
    assert _violations(docs, _accounted) == []


def test_the_terminal_report_names_what_no_finding_explains(tmp_path: Path) -> None:
    """Two ranks of a real 128-GPU job (HTA's trace_filter): idle gaps under the threshold are
    in no finding, and the report names each rank's unexplained idle time under the per-rank
    communication table, with the numbers the document saves."""
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is not there")
    path, out = SHARED / "hta" / "trace_filter", tmp_path / "d"
    res = CliRunner().invoke(main, ["report", str(path), "--out", str(out)],
                             terminal_width=200)
    assert res.exit_code == 0, res.output
    doc = json.loads(CliRunner().invoke(main, ["report", str(path), "--json", "--out",
                                               str(out)]).stdout)
    text = " ".join(res.output.split())
    assert "exposed communication per rank" in text
    left = {r["rank"]: r["accounted"]["idle"]["unexplained_ms"] for r in doc["ranks"]}
    assert all(v > 0.05 for v in left.values()), left
    assert "unexplained by any finding" in text
    for rank, v in left.items():
        assert f"rank {rank} {v:.2f} ms" in text, (rank, v)
    page = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(path), "--out", str(out), "--html", str(page)])
    assert res.exit_code == 0, res.output
    html = page.read_text()
    assert "Exposed communication per rank" in html and "unexplained idle ms" in html


def _warmup_left_out(d: dict[str, Any]) -> list[str]:
    """Warm-up steps are no analysed step, and no finding names one."""
    w = d["run"]["warmup"]
    if not w:
        return []
    bad = [f"warm-up step {s} analysed" for s in w["steps"] if s in d["run"]["analysed_steps"]]
    for i, f in enumerate(d["findings"]):
        bad += [f"#{i + 1} {f['kind']} names warm-up step {s}" for s in f["steps"] or []
                if s in w["steps"]]
    return bad


def test_warm_up_steps_are_left_out_of_the_analysed_steps_and_every_finding(
        docs: dict[str, dict[str, Any]]) -> None:
    assert _violations(docs, _warmup_left_out) == []
