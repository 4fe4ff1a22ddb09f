"""What a run directory holds, and what is missing from it (the data behind `uberprof info`).

Several directories can be read as one run: the nodes of a multi-node job that each wrote to a
local disk. Their ranks are merged; the job id the ranks agreed on through the process group
tells whether they really belong together. Ranks and nodes are read through `uberprof.rundir`,
whose rank-id rule decides which folder is which rank; a folder it cannot place is a problem.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from uberprof.rundir import (
    COUNTERS_DIR,
    STEPS_FILE,
    TRACES_DIR,
    NodeMeta,
    RankMeta,
    RunDir,
    folder_problems,
    list_nodes,
    list_ranks,
    rank_ranges,
    read_step_timeline,
    read_steps,
    trace_triggers,
    trace_windows,
)
from uberprof.rundir.layout import disk_full_at, is_backwards_trace_file_name

# read_steps and trace_windows live in uberprof.rundir.ranks; still importable from here.
__all__ = ["NotARunDirectory", "gzip_is_complete", "inventory", "node_counters", "read_steps",
           "trace_windows"]


class NotARunDirectory(Exception):
    pass


def gzip_is_complete(path: Path) -> bool:
    """Decompress to the end without keeping anything: a cut-off archive has no valid trailer."""
    d = zlib.decompressobj(wbits=31)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                d.decompress(chunk, 0)
                while d.unconsumed_tail:
                    d.decompress(d.unconsumed_tail, 0)
    except zlib.error:
        return False
    return d.eof


def inventory(paths: Sequence[Path], check_traces: bool = True) -> dict[str, Any]:
    """The `uberprof info --json` document for one run (possibly spread over several folders)."""
    runs = [RunDir(Path(p)) for p in paths]
    for run in runs:
        if not run.root.is_dir():
            raise NotARunDirectory(f"{run.root}: no such directory")
        if not run.is_run():
            raise NotARunDirectory(
                f"{run.root}: not a uberprof run directory (no run.json and no ranks/ folder); "
                "point at <out>/<run-id>, e.g. uberprof-runs/20260101-120000-ab12cd"
            )
    problems: list[str] = []
    run_ids = []
    for run in runs:
        run_id = run.run_id()
        if (why := run.run_file_problem()) is not None:
            problems.append(why)
        run_ids.append(run_id or run.root.name)

    nodes = [_node(n, problems) for run in runs for n in list_nodes(run)]
    counters = [c for run in runs for p in run.node_dirs() for c in node_counters(p)]
    metas = [m for run in runs for m in list_ranks(run)]
    problems.extend(folder_problems(metas))
    ranks = [_rank(m, problems, check_traces) for m in metas if m.rank is not None]
    problems.extend(data_file_problems_of(runs))
    ranks.sort(key=lambda r: r["rank"])  # stable: a rank's folders stay in claim order

    _step_problems(ranks, problems)
    _window_problems(ranks, problems)
    exit_codes = [n["exit_code"] for n in nodes if n.get("exit_code") is not None]
    full = [(run.root, ns) for run in runs if (ns := disk_full_at(run.root)) is not None]
    for root, ns in full:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))
        problems.append(f"the disk holding {root} was full at {at}: uberprof stopped writing "
                        "there; what it wrote is readable, the rest is missing")
    for n in nodes:
        if n.get("exit_code"):
            problems.append(f"the command exited with code {n['exit_code']} on node {n['node']}")
        elif n.get("end_ns") is None and full:
            problems.append(f"node {n['node']}: the end of uberprof run was not recorded "
                            "(the disk was full)")
        elif n.get("end_ns") is None:
            problems.append(f"node {n['node']}: uberprof run did not finish (still running, "
                            "or killed)")
    problems[:0] = failure_problems(runs)
    job_ids = sorted({r["job_id"] for r in ranks if r.get("job_id")})
    if len(job_ids) > 1:
        problems.append(f"ranks come from different jobs: {', '.join(job_ids)}")

    return {
        "run_id": run_ids[0] if len(set(run_ids)) == 1 else run_ids,
        "paths": [str(r.root) for r in runs],
        "command": nodes[0]["command"] if nodes else None,
        "exit_code": next((c for c in exit_codes if c), exit_codes[0] if exit_codes else None),
        "start_ns": min((n["start_ns"] for n in nodes if n.get("start_ns")), default=None),
        "end_ns": max((n["end_ns"] for n in nodes if n.get("end_ns")), default=None),
        "nodes": nodes,
        "ranks": ranks,
        "counters": counters,
        "parallelism": run_parallelism(runs, ranks),
        "traced_ranks": traced_ranks(ranks),
        "problems": problems,
    }


def run_parallelism(runs: Sequence[RunDir], ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How the ranks divide the work (analysis/tables/parallelism.py): what `uberprof report`
    saved, else the device mesh from the head of each rank's first trace; None when unknown."""
    from uberprof.analysis.tables.parallelism import recorded_parallelism

    traces = {r["rank"]: Path(r["trace_windows"][0]["path"]) for r in ranks
              if isinstance(r["rank"], int) and r["trace_windows"]}
    try:
        return recorded_parallelism(runs[0].root, traces)
    except Exception:  # noqa: BLE001 - the rest of the inventory stands without it
        return None


def failure_problems(runs: Sequence[RunDir]) -> list[str]:
    """Hangs and crashes first (analysis/diagnosis/findings/failures.py): the titles
    `uberprof report` gives."""
    from uberprof.analysis.diagnosis.findings.failures import failure_findings

    try:
        return [f.title for f in failure_findings([r.root for r in runs])]
    except Exception as exc:  # noqa: BLE001 - the rest of the inventory stands without it
        return [f"could not judge hangs and crashes: {type(exc).__name__}: {exc}"]


def data_file_problems_of(runs: Sequence[RunDir]) -> list[str]:
    """Damaged Flight Recorder logs and counters files (`rundir.damage`): the lines `report`
    gives too."""
    from uberprof.rundir.damage import data_file_problems

    return [p for run in runs for p in data_file_problems(run)]


def node_counters(node_dir: Path) -> list[dict[str, Any]]:
    """The counter series a node folder holds: node, source, metric, unit, samples (rows),
    devices, first_ns, last_ns. From the index the sampler keeps, else by scanning the tables."""
    from uberprof.rundir.counters import series_index, source_files

    cdir = node_dir / COUNTERS_DIR
    if not source_files(cdir):
        return []
    return [{"node": node_dir.name, **s} for s in series_index(cdir)]


def _node(node: NodeMeta, problems: list[str]) -> dict[str, Any]:
    if node.problem is not None:
        problems.append(node.problem)
    return {"node": node.node, "host": node.host, "command": node.command,
            "exit_code": node.exit_code, "start_ns": node.start_ns, "end_ns": node.end_ns,
            "options": node.options or None, "versions": node.versions or None,
            "counters": node.counters or None, "slowdowns": _slowdowns(node.raw)}


def _slowdowns(raw: dict[str, Any]) -> dict[str, Any] | None:
    """node.json's `slowdowns` (collect/slowdown.py): each rise the node's trigger detected,
    its window or why none (`refused`), and how many the budget left out; None when the
    trigger was off (or the run predates it)."""
    value = raw.get("slowdowns")
    if not isinstance(value, dict):
        return None
    detected = [d for d in value.get("detected") or [] if isinstance(d, dict)]
    suppressed = value.get("suppressed")
    shared = value.get("shared")
    return {"detected": detected, "suppressed": suppressed if isinstance(suppressed, int) else 0,
            "shared": shared if isinstance(shared, bool) else None,
            "ranks_seen": value.get("ranks_seen"), "world_size": value.get("world_size")}


def _rank(meta: RankMeta, problems: list[str], check_traces: bool) -> dict[str, Any]:
    path = meta.folder
    timeline = read_step_timeline(path)
    steps, truncated = timeline.steps, timeline.truncated
    windows = trace_windows(path)
    rank = meta.rank
    if (skipped := timeline.problem(path / STEPS_FILE)) is not None:
        problems.append(skipped)
    if truncated:
        problems.append(f"rank {rank}: {path / STEPS_FILE} ends with a cut-off line "
                        f"(the rank stopped mid-write); {len(steps)} whole steps kept")
    if meta.readable and not meta.finished:
        last = steps[-1]["step"] if steps else None
        problems.append(
            (f"rank {rank}: its end was not recorded (the disk was full)"
             if disk_full_at(path.parent.parent) is not None else
             f"rank {rank} stopped abruptly (killed, crashed, or still running)")
            + (f" after step {last}: its {len(steps)} finished steps are kept" if steps
               else " before finishing any step")
        )
        lost = _step_ranges([meta.trace.get("exporting")])
        if lost and not any(list(w["steps"]) == lost[0] for w in windows):
            a, b = lost[0]
            problems.append(f"rank {rank}: the trace of steps {a}-{b} was being written when "
                            "it last recorded: lost if the rank was killed or crashed (a normal "
                            "exit waits for it), still to come if it runs")
    for cut in _cuts(meta.trace.get("cut_short")):
        problems.append(f"rank {rank}: trace window {cut['window'][0]}-{cut['window'][1]} "
                        f"stopped after step {cut['last']}: its memory grew by "
                        f"{cut['grown_mb']} MB in the window, over the budget of "
                        f"{cut['budget_mb']} MB (the profiler holds recorded tensors until a "
                        "window ends: trace fewer steps, --record-shapes off, or "
                        "--window-memory-mb)")
    triggers = trace_triggers(meta.trace.get("triggers"))
    for w in windows:
        # what opened it: "schedule" (also for runs from before triggers were recorded),
        # "on demand" (uberprof trace); a window cut short keeps its planned last step there
        w["trigger"] = triggers.get(w["steps"][0], "schedule")
        p = Path(w["path"])
        if check_traces and p.suffix == ".gz" and not gzip_is_complete(p):
            problems.append(f"rank {rank}: trace {p} is truncated")
            w["truncated"] = True
    tdir = path / TRACES_DIR
    for p in sorted(tdir.iterdir()) if tdir.is_dir() else ():
        if is_backwards_trace_file_name(p.name):
            problems.append(f"rank {rank}: {p} ignored: a trace window that ends before it "
                            "starts (the job ended where the window began); it holds no step")
    return {
        "rank": rank,
        "dir": str(path),
        "host": meta.host,
        "node": meta.node,
        "pid": meta.pid,
        "local_rank": meta.local_rank,
        "world_size": meta.world_size,
        "backend": meta.backend,
        "device": meta.device or None,
        "job_id": meta.job_id,
        "steps": None if timeline.unread else len(steps),  # None: its file could not be read
        "first_step": steps[0]["step"] if steps else None,
        "last_step": steps[-1]["step"] if steps else None,
        "finished": meta.finished,
        "exit": _as_exit(meta.raw.get("exit")),
        "trace_windows": windows,
        "trace_disabled_reason": meta.trace.get("disabled_reason"),
        "trace_not_reached": _step_ranges(meta.trace.get("not_reached")),
        "trace_exporting": next(iter(_step_ranges([meta.trace.get("exporting")])), None),
        "trace_cut_short": _cuts(meta.trace.get("cut_short")),
        # --trace-ranks: False for a rank it left out (step timeline and Flight Recorder only)
        "trace_selected": meta.trace.get("selected") is not False,
        "trace_ranks": meta.trace.get("ranks") if isinstance(meta.trace.get("ranks"), str)
        else None,
        "clock": meta.clock or None,
    }



def traced_ranks(ranks: list[dict[str, Any]]) -> str | None:
    """Which ranks record the schedule's windows, in words, when `--trace-ranks` chose some
    ("0, 2 of 4 (--trace-ranks 0,2)"); None when every rank does."""
    chosen = next((r["trace_ranks"] for r in ranks if r.get("trace_ranks")), None)
    if chosen is None:
        return None
    selected = [r["rank"] for r in ranks if r["trace_selected"] and isinstance(r["rank"], int)]
    world = max((r["world_size"] for r in ranks if isinstance(r.get("world_size"), int)),
                default=len(ranks))
    shown = rank_ranges(sorted(selected)) if selected else "none"
    return f"{shown} of {world} (--trace-ranks {chosen.replace(' ', '')})"


def _cuts(value: Any) -> list[dict[str, Any]]:
    """rank.json's `trace.cut_short` entries that are whole; anything else is none."""
    if not isinstance(value, list):
        return []
    return [c for c in value if isinstance(c, dict) and _step_ranges([c.get("window")])
            and all(isinstance(c.get(k), int) for k in ("last", "budget_mb"))
            and isinstance(c.get("grown_mb"), int | float)]  # one decimal since format 21


def _as_exit(value: Any) -> str | None:
    """How the rank agent saw the process end: "exit", or "exception" (an uncaught one)."""
    return value if isinstance(value, str) else None


def _step_ranges(value: Any) -> list[list[int]]:
    """`[[first, last], ...]` as rank.json holds it; anything else is no window."""
    if not isinstance(value, list):
        return []
    return [list(w) for w in value if isinstance(w, list) and len(w) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in w)]


def trace_not_reached(ranks: list[dict[str, Any]]) -> str | None:
    """Why scheduled trace windows are missing: the job ended before them. None if none was
    missed. Shared by `info` and `run`'s closing line, so a short job never fails silently."""
    missed = [r for r in ranks if r.get("trace_not_reached")]
    if not missed:
        return None
    windows = sorted({tuple(w) for r in missed for w in r["trace_not_reached"]})
    steps = ", ".join(f"{a}-{b}" for a, b in windows)
    last = max((r["last_step"] for r in missed if r.get("last_step") is not None), default=None)
    ended = (f"the job ended at step {last}" if last is not None
             else "the job ended before its first step")
    crashed = any(r.get("exit") == "exception" or not r.get("finished") for r in missed)
    died_in = (last + 1 if last is not None else 0) if crashed else None
    if died_in is not None and any(a <= died_in <= b for a, b in windows):
        # it died in a step of the window, not before it: the window was reached
        return (f"trace window at steps {steps} not written: the job stopped in step "
                f"{died_in}, inside the window, before its trace was written")
    if any(r["trace_windows"] for r in missed):
        return f"trace window at steps {steps} not reached: {ended}"
    hint = ""
    if last is not None:
        first = last // 2
        hint = (f"; to get a trace, run again with a window inside the job, e.g. "
                f"--trace-steps {first}-{min(last, first + 2)}")
    return f"no trace window: {ended}, before the window at steps {steps}{hint}"


def _step_problems(ranks: list[dict[str, Any]], problems: list[str]) -> None:
    """Ranks that finished without a single step, and trace windows the job never reached."""
    idle = sorted(r["rank"] for r in ranks
                  if r["finished"] and r["steps"] == 0 and isinstance(r["rank"], int))
    if idle:
        who = f"rank {idle[0]}" if len(idle) == 1 else f"ranks {rank_ranges(idle)}"
        problems.append(f"{who} recorded 0 steps: no optimizer.step() or torch.profiler step "
                        "was seen (a script that had nothing left to train, e.g. resumed from a "
                        "finished checkpoint?); loops without an optimizer: call uberprof.step()")
    missed = trace_not_reached(ranks)
    if missed:
        problems.append(missed)


def _window_problems(ranks: list[dict[str, Any]], problems: list[str]) -> None:
    """Scheduled windows that differ between the ranks that record them (`--trace-ranks`
    leaves the others out; windows on demand may name some ranks only, or start a step late
    on a rank that read the request late)."""
    traced = [r for r in ranks if r["trace_selected"]]
    scheduled = {r["rank"]: [w["steps"] for w in r["trace_windows"]
                             if w.get("trigger") == "schedule"] for r in traced}
    window_sets = {tuple(tuple(w) for w in ws) for ws in scheduled.values()}
    if len(window_sets) > 1:
        problems.append("ranks have different trace windows: "
                        + "; ".join(f"rank {rank}: "
                                    + (", ".join(f"{a}-{b}" for a, b in ws) or "none")
                                    for rank, ws in scheduled.items()))

