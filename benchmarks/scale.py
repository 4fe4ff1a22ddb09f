"""How `uberprof analyze` scales with ranks: wall time and the client's peak memory.

    python benchmarks/scale.py                       # 8, 64 and 256 ranks; process pool and Dask
    python benchmarks/scale.py --ranks 8,64 --modes pool --json scale.json
    python benchmarks/scale.py --repeat 3          # the fastest of 3 runs (a busy machine)
    python benchmarks/scale.py --ranks 64,512,4096 --steps 200 --traced-steps 3 --modes pool \
        --no-whatif                                 # issue 51: the report bounded at scale

For each rank count a synthetic run directory is written once (benchmarks/synth_run.py: NCCL
DDP steps with forward/backward kernels, bucketed all-reduces, an optimizer and a throttled
straggler; `--layers` and `--traced-steps` set the size of each rank's trace, the same for every
rank count, so total events grow with ranks). Then, each in a fresh process:

- `analyze`: the per-rank map and the cross-rank reduce from scratch (`force`), on the default
  forked process pool (`pool`) or on a `dask.distributed.LocalCluster` of as many worker
  processes (`dask`; cluster start-up is timed apart);
- `reduce`: `analyze` again with every input up to date, so only the cross-rank step runs;
- `report`: the diagnosis behind `uberprof report` (`advisor.diagnose`) over the analysed run;
- `whatif` (pool only): the step graph of issue 26 timed part by part over the analysed run:
  each rank's lane (on the workers), the graph's assembly, the replay, the critical path and
  replay documents (what the diagnosis adds with them), and the default projections
  (`project` on the base replay for --remove straggler, --remove data, --remove exposed-comm,
  a link 2x faster, and three of them at once).

Client memory is the peak resident set of the process that calls `analyze` (`ru_maxrss`): the
map's workers are other processes (forked, or Dask's), so it is what the coordinating machine
needs. The same number of workers is used at every size (default: one per CPU) so that times
compare. Times on a shared machine are noisy: compare ratios, and re-run.

At the end, issue 18's and 51's targets: `report`'s client at most REPORT_PEAK_MIB (300 MiB) at
REPORT_AT_RANKS (512) ranks and at most 2 GiB at 4,096 ranks (REPORT_BOUNDS_MIB), with its
time, and times that grow linearly with events (from one rank count to the next, time grows at
most LINEAR_SLACK times as much as events); issue 26's: the step graph's time (critical path
and default projections) at most WHATIF_RATIO x `analyze`'s at REPORT_AT_RANKS ranks or more,
and linear in the graph's nodes from one rank count to the next (each part's growth printed).
Exit code 1 when a target is missed.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import doc_parser

HERE = Path(__file__).resolve().parent
DATA = HERE / ".bench-data"
# Issue 18's targets, and issue 51's bound at scale: the report's client at most this many MiB
# from this many ranks on (the largest rank count not above a run's applies).
REPORT_PEAK_MIB = 300
REPORT_AT_RANKS = 512
REPORT_BOUNDS_MIB = {REPORT_AT_RANKS: REPORT_PEAK_MIB, 4096: 2048}
LINEAR_SLACK = 1.25
# Issue 26's target: the critical path and the default projections add at most the analysis's
# own time (WHATIF_RATIO x analyze's wall time) at REPORT_AT_RANKS ranks.
WHATIF_RATIO = 1.0
# The default projections: what `uberprof whatif` is asked most, one change set each.
DEFAULT_CHANGES: tuple[tuple[tuple[str, float], ...], ...] = (
    (("straggler", 1.0),), (("data", 1.0),), (("exposed-comm", 1.0),), (("link", 2.0),),
    (("straggler", 1.0), ("data", 1.0), ("link", 2.0)))


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _cpu_s() -> float:
    """CPU seconds of this process and of every process it (or they) waited for: forked
    workers, and Dask's nannies with their workers once the cluster is closed."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _synth() -> Any:
    sys.path.insert(0, str(HERE))
    import synth_run

    return synth_run


def make_run(ranks: int, layers: int, traced: int, steps: int) -> Path:
    """The synthetic run of `ranks` ranks (written once, then reused)."""
    dest = DATA / f"scale-r{ranks}-l{layers}-t{traced}-s{steps}-v1" / "run"
    stamp = dest.parent / ".complete"
    if stamp.exists():
        return dest
    s = _synth()
    first = steps // 2
    cfg = s.Config(out=dest, ranks=ranks, steps=steps, gpus_per_node=8,
                   windows=[(first, first + traced - 1)], straggler=(2 * ranks) // 3,
                   cause="throttle", slow=1.25, counters=False, seed=0, step_ms=200.0,
                   layers=layers)
    t = time.perf_counter()
    s.write_run(cfg, log=lambda *_: None)
    print(f"  wrote {dest} in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    stamp.touch()
    return dest


# --- what runs in each fresh process ------------------------------------------------------------

def child(phase: str, mode: str, run: Path, derived: Path, workers: int) -> dict[str, Any]:
    from uberprof.analysis.tables.pipeline import analyze, keep_pandas_out

    res: dict[str, Any] = {}
    cpu = _cpu_s()
    if phase == "whatif":
        keep_pandas_out()
        res.update(whatif_costs(run, derived, workers))
    elif phase == "report":
        from uberprof.analysis.diagnosis.advisor import diagnose

        if mode == "dask":
            from uberprof.analysis.tables.distributed import dask_executor

            t = time.perf_counter()
            with dask_executor("local", workers=workers) as ex:
                res["cluster_s"] = time.perf_counter() - t
                t = time.perf_counter()
                d = diagnose(run, out=derived, workers=workers, executor=ex)
                res["work_s"] = time.perf_counter() - t
        else:
            keep_pandas_out()
            t = time.perf_counter()
            d = diagnose(run, out=derived, workers=workers)
            res["work_s"] = time.perf_counter() - t
        res.update(straggler=d.straggler.rank if d.straggler else None,
                   findings=len(d.findings))
    elif mode == "dask":
        from uberprof.analysis.tables.distributed import dask_executor

        t = time.perf_counter()
        with dask_executor("local", workers=workers) as ex:
            res["cluster_s"] = time.perf_counter() - t
            t = time.perf_counter()
            a = analyze(run, out=derived, executor=ex, force=phase == "analyze")
            res["work_s"] = time.perf_counter() - t
    else:
        keep_pandas_out()  # as `uberprof analyze` does
        t = time.perf_counter()
        a = analyze(run, out=derived, workers=workers, force=phase == "analyze")
        res["work_s"] = time.perf_counter() - t
    if phase not in ("report", "whatif"):
        res.update(ranks=len(a.ranks), analysed=a.analysed,
                   events=sum(_events(a.derived, e) for e in a.inputs.values()))
    res["client_peak_mib"] = _peak_mib()
    res["cpu_s"] = _cpu_s() - cpu  # the cluster's start and close included (dask)
    return res


def whatif_costs(run: Path, derived: Path, workers: int) -> dict[str, Any]:
    """The step graph's parts timed one by one over an analysed run (issue 26 item 8): each
    rank's lane (on the workers), the graph's assembly, the replay, the report's critical path
    and replay documents (`run_graph_docs`, which the diagnosis runs), and the default
    projections (`project` once per change set of DEFAULT_CHANGES). `work_s` is their sum."""
    from uberprof.analysis.diagnosis.advisor import diagnose_context
    from uberprof.analysis.diagnosis.whatif import (
        Change,
        critical_path_doc,
        project,
        replay_doc,
        straggler_of,
    )
    from uberprof.analysis.tables.context import load_context
    from uberprof.analysis.tables.graph import build_graph
    from uberprof.analysis.tables.lanes import lane_passes
    from uberprof.analysis.tables.replay import _structure, replay

    ctx = load_context(run, out=derived, workers=workers)
    res: dict[str, Any] = {}

    def timed(key: str, fn: Any, *a: Any) -> Any:
        """fn(*a), its wall time as `key` and the client's CPU time as `key`_cpu (the
        lanes' workers are other processes: their CPU time is not in it)."""
        t, c = time.perf_counter(), time.process_time()
        out = fn(*a)
        res[key], res[key + "_cpu"] = time.perf_counter() - t, time.process_time() - c
        return out

    d = timed("diagnose_s", diagnose_context, ctx)
    lanes = timed("lanes_s", lane_passes, ctx, d.steps)
    g = timed("build_s", build_graph, lanes, d.alignment.offsets(), d.matched.instances, d.p2p)
    r = timed("replay_s", replay, g)
    fit = timed("docs_s", lambda: (critical_path_doc(g, r), replay_doc(g, d.steps, r)))[1]
    rank, basis = straggler_of(d)
    timed("projections_s", lambda: [project(g, d.steps, [Change(k, f) for k, f in kinds], rank,
                                            basis, base=r, fit=fit)
                                    for kinds in DEFAULT_CHANGES])
    res["projections"] = len(DEFAULT_CHANGES)
    res.update(nodes=int(g.n), edges=int(g.src.size), levels=_structure(g).levels)
    res["work_s"] = sum(res[k] for k in ("lanes_s", "build_s", "replay_s", "docs_s",
                                         "projections_s"))
    return res


def _events(derived: Path, entry: dict[str, Any]) -> int:
    from uberprof.analysis.tables.derived import read_input_summary

    try:
        return int(read_input_summary(derived, entry["key"])["summary"]["events"])
    except (OSError, KeyError, TypeError, ValueError):
        return 0


def measure(phase: str, mode: str, run: Path, derived: Path, workers: int,
            repeat: int = 1) -> dict[str, Any]:
    """The fastest of `repeat` fresh runs (a shared machine only ever adds time), with the
    largest client peak seen in any of them."""
    runs = [_measure_once(phase, mode, run, derived, workers) for _ in range(max(repeat, 1))]
    best = min(runs, key=lambda r: r["work_s"])
    return {**best, "client_peak_mib": max(r["client_peak_mib"] for r in runs),
            "runs_work_s": [r["work_s"] for r in runs]}


def _measure_once(phase: str, mode: str, run: Path, derived: Path, workers: int
                  ) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", phase, mode, str(run),
           str(derived), str(workers)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{phase}/{mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_s"] = time.perf_counter() - t
    return res


def json_bytes(run: Path) -> int:
    """JSON size of every trace (from each gzip trailer)."""
    from uberprof.ingest.gz import json_size

    return sum(map(json_size, run.glob("ranks/*/traces/*.json.gz")))


def main() -> None:
    ap = doc_parser(__doc__)
    ap.add_argument("--ranks", default="8,64,256", help="rank counts, comma-separated")
    ap.add_argument("--modes", default="pool,dask", help="pool, dask or both")
    ap.add_argument("--layers", type=int, default=8, help="synth_run --layers (trace size)")
    ap.add_argument("--traced-steps", type=int, default=10, help="steps in each rank's trace")
    ap.add_argument("--steps", type=int, default=2000, help="steps in each rank's timeline")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each measurement; the fastest is kept (noisy machines)")
    ap.add_argument("--no-report", action="store_true", help="skip the diagnosis")
    ap.add_argument("--no-whatif", action="store_true",
                    help="skip the step graph's timing (critical path, replay, projections)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    rows = []
    for n in [int(x) for x in args.ranks.split(",") if x]:
        run = make_run(n, args.layers, args.traced_steps, args.steps)
        row: dict[str, Any] = {"ranks": n, "steps": args.steps, "json_bytes": json_bytes(run)}
        for mode in modes:
            derived = run.parent / f"derived-{mode}"
            row[mode] = measure("analyze", mode, run, derived, args.workers, args.repeat)
            row[f"{mode}_reduce"] = measure("reduce", mode, run, derived, args.workers,
                                            args.repeat)
        if not args.no_report:
            for mode in modes:
                row[f"{mode}_report"] = measure("report", mode, run,
                                                run.parent / f"derived-{mode}", args.workers,
                                                args.repeat)
        row["events"] = row[modes[0]]["events"]
        if not args.no_whatif:
            row["whatif"] = measure("whatif", "pool", run, run.parent / f"derived-{modes[0]}",
                                    args.workers, args.repeat)
        rows.append(row)
        print(_line(row, modes), flush=True)
        if "whatif" in row:
            print(_whatif_line(row, modes[0]), flush=True)
    missed = report_targets(rows, modes)
    missed += whatif_targets(rows, modes[0])
    print(f"targets: {'all met' if not missed else f'{len(missed)} missed'}")
    if args.json:
        args.json.write_text(json.dumps({"workers": args.workers, "layers": args.layers,
                                         "traced_steps": args.traced_steps,
                                         "steps": args.steps, "rows": rows, "missed": missed},
                                        indent=2))
    sys.exit(1 if missed else 0)


def report_targets(rows: list[dict[str, Any]], modes: list[str]) -> list[str]:
    """Print the targets, each met or not with its figures; the missed ones' names."""
    missed = []
    for r in rows:
        for m in modes:
            rep = r.get(f"{m}_report")
            bound = report_bound(r["ranks"])
            if rep is None or bound is None:
                continue
            ok = rep["client_peak_mib"] <= bound
            print(f"target: report ({m}) at {r['ranks']} ranks x {r.get('steps', '?')} steps, "
                  f"client at most {bound} MiB: {'met' if ok else 'missed'}, "
                  f"{rep['client_peak_mib']:.0f} MiB in {rep['work_s']:.1f} s")
            if not ok:
                missed.append(f"{m} report memory at {r['ranks']} ranks")
    phases = [(m, m) for m in modes] + [(f"{m}_report", f"report ({m})") for m in modes]
    for a, b in itertools.pairwise(rows):
        grew = b["events"] / max(a["events"], 1)
        for key, label in phases:
            if key not in a or key not in b:
                continue
            took = b[key]["work_s"] / max(a[key]["work_s"], 1e-9)
            ok = took <= grew * LINEAR_SLACK
            print(f"target: {label} linear in events, {a['ranks']} -> {b['ranks']} ranks: "
                  f"{'met' if ok else 'missed'}, events {grew:.2f}x, time {took:.2f}x")
            if not ok:
                missed.append(f"{label} linear {a['ranks']}->{b['ranks']}")
    return missed


def report_bound(ranks: int) -> int | None:
    """The report's client bound (MiB) at `ranks` (REPORT_BOUNDS_MIB), None below the first."""
    at = [n for n in REPORT_BOUNDS_MIB if n <= ranks]
    return REPORT_BOUNDS_MIB[max(at)] if at else None


def _whatif_line(r: dict[str, Any], mode: str) -> str:
    w = r["whatif"]
    return (f"     step graph: {w['nodes'] / 1e6:.2f} M nodes {w['edges'] / 1e6:.2f} M edges "
            f"{w.get('levels', 0)} levels; "
            f"lanes {w['lanes_s']:.2f} s, build {w['build_s']:.2f} s, replay "
            f"{w['replay_s']:.2f} s, critical path + replay docs {w['docs_s']:.2f} s, "
            f"{w['projections']} projections {w['projections_s']:.2f} s; in all "
            f"{w['work_s']:.2f} s = {w['work_s'] / r[mode]['work_s']:.2f}x analyze ({mode}); "
            f"the diagnosis (which runs lanes..docs once) {w['diagnose_s']:.2f} s; client CPU: "
            f"replay {w['replay_s_cpu']:.2f} s, projections {w['projections_s_cpu']:.2f} s")


def whatif_targets(rows: list[dict[str, Any]], mode: str) -> list[str]:
    """Issue 26 item 8: the step graph's cost (critical path and default projections) against
    the analysis's at REPORT_AT_RANKS ranks or more, and linear in the graph's nodes from one
    rank count to the next (each part printed: which one grows faster)."""
    missed = []
    rows = [r for r in rows if "whatif" in r]
    for r in rows:
        if r["ranks"] < REPORT_AT_RANKS:
            continue
        ratio = r["whatif"]["work_s"] / max(r[mode]["work_s"], 1e-9)
        ok = ratio <= WHATIF_RATIO
        print(f"target: critical path + default projections at {r['ranks']} ranks, at most "
              f"{WHATIF_RATIO:g}x analyze ({mode}): {'met' if ok else 'missed'}, {ratio:.2f}x "
              f"({r['whatif']['work_s']:.2f} s against {r[mode]['work_s']:.2f} s)")
        if not ok:
            missed.append(f"whatif cost at {r['ranks']} ranks")
    for a, b in itertools.pairwise(rows):
        wa, wb = a["whatif"], b["whatif"]
        grew = wb["nodes"] / max(wa["nodes"], 1)
        took = wb["work_s"] / max(wa["work_s"], 1e-9)
        ok = took <= grew * LINEAR_SLACK
        parts = ", ".join(f"{k[:-2]} {wb[k] / max(wa[k], 1e-9):.2f}x" for k in
                          ("lanes_s", "build_s", "replay_s", "docs_s", "projections_s"))
        print(f"target: step graph linear in its nodes, {a['ranks']} -> {b['ranks']} ranks: "
              f"{'met' if ok else 'missed'}, nodes {grew:.2f}x, time {took:.2f}x ({parts})")
        if not ok:
            missed.append(f"whatif linear {a['ranks']}->{b['ranks']}")
    return missed


def _line(r: dict[str, Any], modes: list[str]) -> str:
    ev = r["events"]
    parts = [f"{r['ranks']:4d} ranks {ev / 1e6:6.2f} M events {r['json_bytes'] / 2**20:7.1f} MiB"]
    for m in modes:
        a, red = r[m], r[f"{m}_reduce"]
        parts.append(f"{m}: {a['work_s']:6.2f} s ({ev / a['work_s'] / 1e6:4.2f} M ev/s, "
                     f"{a['cpu_s']:6.1f} cpu-s) "
                     f"client {a['client_peak_mib']:4.0f} MiB"
                     + (f" (+{a['cluster_s']:.1f} s start)" if "cluster_s" in a else "")
                     + f", reduce {red['work_s']:5.2f} s {red['client_peak_mib']:4.0f} MiB")
        if f"{m}_report" in r:
            rep = r[f"{m}_report"]
            parts[-1] += (f", report {rep['work_s']:6.2f} s client "
                          f"{rep['client_peak_mib']:4.0f} MiB")
    return " | ".join(parts)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        phase, mode, run, derived, workers = sys.argv[2:7]
        print(json.dumps(child(phase, mode, Path(run), Path(derived), int(workers))))
    else:
        main()
