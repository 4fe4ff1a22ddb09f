"""uberprof's cost on a training job, as ratios measured in one run (these machines are noisy).

1. Always-on collection: the DDP sample under `torchrun`, plain and under
   `uberprof run --no-trace` (rank agents, node counters, the hang watchdog and the Flight
   Recorder uberprof turns on), interleaved; ratio of median step times (target <= 1.02, goal
   1.01). Also with `--counters none`, to separate the rank agent's share from the counter
   sampler's, and with the Flight Recorder off (TORCH_FR_BUFFER_SIZE=0), for its share. Beside
   wall time, the training thread's CPU time per step (`time.thread_time`, written by the
   sample): the work the agent adds there, which the scheduler's noise does not hide, with a
   95% bootstrap interval over the interleaved rounds.
2. A trace window's cost: under `uberprof run` with a window in the middle of the run (a few
   runs), traced steps against untraced ones, the window's stall on the training thread (the
   agent's own time in the step after it: the profiler's stop and the Flight Recorder's dump;
   median and max over the windows, and against the run's untraced step), the teardown (extra
   wall time of the steps after the window), and the median step after the window against the
   one before it (target <= 1.02). `--hog` runs each round again beside one busy process per
   core.
3. Self-accounting: the agent's own time on the training thread per step, from steps.jsonl.
5. `--side-by-side`: plain and `uberprof run --no-trace` at once, on equal terms
   (`tests/side_by_side.py`: both start their steps together and trade the two cores every
   10 ms), each round a pair; the training thread's CPU time and wall time per step, B against
   A in the same seconds, so the machine's drift from one run to the next (on this VM a core's
   CPU time per step once read 46 ms against 26 ms minutes apart) cancels.
6. `uberprof run --metrics-port 0` (mode `metrics`): the node agent serving Prometheus metrics,
   scraped every second from here while the job runs (a real scraper asks every 5-15 s),
   against the same run without it, interleaved; the ratio of median step times with a 95%
   bootstrap interval (target <= 1.01: not measurable), and one scrape's CPU time in the
   agent (8 local ranks of 256 steps, in this process).
7. The slowdown trigger's watching (mode `watcher`: `--no-trace --trace-on-slowdown`) against
   `--no-trace` alone, interleaved: step time and training-thread CPU ratios with 95% intervals,
   and the trigger's own CPU time per step in the node agent (target: not measurable).
4. `uberprof run --dashboard`: the dashboard served beside the job (a niced process that loads
   the run and follows it), against the same run without it, interleaved; the ratio of median
   step times with a 95% bootstrap interval over the rounds (target <= 1.01: not measurable).

    python benchmarks/overhead.py [--rounds 5] [--steps 80] [--nproc 2]
    python benchmarks/overhead.py --modes plain,uberprof,dashboard --no-window
    python benchmarks/overhead.py --modes plain,uberprof,metrics --no-window
    python benchmarks/overhead.py --modes plain,uberprof,watcher --no-window --rounds 6
    python benchmarks/overhead.py --side-by-side --rounds 10
    python benchmarks/overhead.py --side-by-side --pair metrics --rounds 8
    python benchmarks/overhead.py --side-by-side --pair watcher --rounds 8 --steps 150
        (the slowdown trigger's watching, against the same run without it)
    python benchmarks/overhead.py --modes plain,uberprof --rounds 1 --window-rounds 4 --hog \
        [--sync-baseline]   (the window's stall, beside a CPU hog; against the old sync export)
    python benchmarks/overhead.py --module-hooks [--rounds 20]   (in one process, no job)
    python benchmarks/overhead.py --modes plain,uberprof --rounds 1 \
        --window-variants ",--modules,--profile-memory"   (what each option adds to a window)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "train_ddp.py"
WARMUP = 5


def torchrun(nproc: int, steps: int, times: Path, extra: list[str]) -> list[str]:
    """The sample; rank 0 writes its steps' wall times to `times` and their training-thread
    CPU times beside it (`cpu_file`)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", str(SAMPLE), "--steps", str(steps),
            "--step-times", str(times), "--step-cpu-times", str(cpu_file(times)), *extra]


def cpu_file(times: Path) -> Path:
    return times.with_suffix(".cpu.json")


def run(cmd: list[str], extra_env: dict[str, str] | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")


def wait_dashboard_gone(run_dir: Path, limit_s: float = 900) -> None:
    """Wait until the dashboard `run --dashboard` started for `run_dir` has left (after the
    job, it diagnoses the whole run and serves it a few seconds more)."""
    import time

    import psutil

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if not any("uberprof.dashboards.live_server" in " ".join(p.info["cmdline"] or [])
                   and str(run_dir) in " ".join(p.info["cmdline"] or [])
                   for p in psutil.process_iter(["cmdline"])):
            return
        time.sleep(0.5)


def ratio_interval(a: list[float], b: list[float], draws: int = 2000
                   ) -> tuple[float, float, float]:
    """median(a) / median(b), and its 95% bootstrap interval (rounds resampled in pairs: they
    ran interleaved, under the same load)."""
    rng = random.Random(0)
    pairs = list(zip(a, b))
    boot = sorted(statistics.median(x for x, _ in s) / statistics.median(y for _, y in s)
                  for s in ([rng.choice(pairs) for _ in pairs] for _ in range(draws)))
    return (statistics.median(a) / statistics.median(b), boot[int(0.025 * draws)],
            boot[int(0.975 * draws) - 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--sample-args", default="", help="extra arguments for the sample")
    ap.add_argument("--modes", default="plain,uberprof,watcher,agent-only,no-flight-recorder,"
                    "dashboard,metrics",
                    help="the modes to interleave (plain and uberprof always run)")
    ap.add_argument("--side-by-side", action="store_true",
                    help="plain and uberprof (--no-trace) at once, cores traded, each round")
    ap.add_argument("--pair", choices=["uberprof", "metrics", "watcher"], default="uberprof",
                    help="with --side-by-side: uberprof = plain against uberprof run --no-trace; "
                    "metrics = that against the same with --metrics-port, scraped every second; "
                    "watcher = that against the same with --trace-on-slowdown")
    ap.add_argument("--no-window", action="store_true",
                    help="skip the trace window's measurement")
    ap.add_argument("--window-rounds", type=int, default=3,
                    help="runs with a trace window in the middle")
    ap.add_argument("--hog", action="store_true",
                    help="run each trace-window round also beside one busy process per core")
    ap.add_argument("--sync-baseline", action="store_true",
                    help="each trace-window round also with the export on the training thread "
                    "(UBERPROF_SYNC_EXPORT=1), as before the exporter thread")
    ap.add_argument("--window-args", default="",
                    help="extra `uberprof run` options for them (e.g. '--record-shapes off')")
    ap.add_argument("--window-variants", default=None, metavar="A,B,...",
                    help="compare windows under these `uberprof run` options, interleaved "
                    "(comma-separated; an empty item is the plain window), e.g. "
                    "',--modules,--profile-memory'")
    ap.add_argument("--module-hooks", action="store_true",
                    help="only the cost of --modules' hooks inside a window: the sample's model, "
                    "forward and backward under torch.profiler, with and without them")
    args = ap.parse_args()
    if args.module_hooks:
        module_hooks(args)
        return
    extra = args.sample_args.split()
    tmp = Path(tempfile.mkdtemp(prefix="uberprof-overhead-"))
    if args.side_by_side:
        side_by_side(args, tmp, extra)
        return
    modes = {"plain": None, "uberprof": ["--no-trace"],
             "watcher": ["--no-trace", "--trace-on-slowdown"],
             "agent-only": ["--no-trace", "--counters", "none"],
             "no-flight-recorder": ["--no-trace"],
             "dashboard": ["--no-trace", "--dashboard"],
             "metrics": ["--no-trace", "--metrics-port", "0"]}
    wanted = {"plain", "uberprof", *args.modes.split(",")}
    modes = {m: o for m, o in modes.items() if m in wanted}
    mode_env = {"no-flight-recorder": {"TORCH_FR_BUFFER_SIZE": "0"}}
    medians: dict[str, list[float]] = {m: [] for m in modes}
    cpu_medians: dict[str, list[float]] = {m: [] for m in modes}
    self_time: list[float] = []
    for i in range(args.rounds):
        order = list(modes) if i % 2 == 0 else list(reversed(modes))
        for mode in order:
            times = tmp / f"{mode}-{i}.json"
            cmd = torchrun(args.nproc, args.steps, times, extra)
            if modes[mode] is not None:
                cmd = [sys.executable, "-m", "uberprof", "run", "--out", str(tmp), "--run-id",
                       f"{mode}-{i}", *modes[mode], "--", *cmd]
            with scraping(tmp / f"{mode}-{i}" if mode == "metrics" else None):
                run(cmd, mode_env.get(mode))
            if mode == "dashboard":  # it outlives the job a little: not into the next one
                wait_dashboard_gone(tmp / f"{mode}-{i}")
            steps = json.loads(times.read_text())[WARMUP:]
            medians[mode].append(statistics.median(steps))
            cpu_medians[mode].append(statistics.median(
                json.loads(cpu_file(times).read_text())[WARMUP:]))
        rows = [json.loads(x) for x in (tmp / f"uberprof-{i}/ranks/0/steps.jsonl").open()]
        rows = [r for r in rows if r["kind"] == "step"][WARMUP:]
        self_time += [r["uberprof_ns"] / (r["host_end_ns"] - r["host_start_ns"]) for r in rows]
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(
            f"{m} {medians[m][-1] * 1e3:.2f} ms" for m in modes), flush=True)

    base = statistics.median(medians["plain"])
    ratio = statistics.median(medians["uberprof"]) / base
    print()
    print(f"always-on (--no-trace) / plain, median step time: {ratio:.4f}  (target <= 1.02)")
    # the training thread's CPU time per step: the work, without the scheduler's noise
    for mode in (m for m in modes if m != "plain"):
        r, lo, hi = ratio_interval(cpu_medians[mode], cpu_medians["plain"])
        print(f"  {mode} / plain, training thread's CPU time per step: {r:.4f} "
              f"(95% interval {lo:.4f}-{hi:.4f} over {args.rounds} rounds; target <= 1.01)")
    if "agent-only" in modes:
        print(f"  rank agents only (--counters none) / plain:     "
              f"{statistics.median(medians['agent-only']) / base:.4f}")
    if "no-flight-recorder" in modes:
        fr = statistics.median(medians["uberprof"]) / statistics.median(
            medians["no-flight-recorder"])
        print(f"  Flight Recorder on / off (both under uberprof):  {fr:.4f}")
    if "watcher" in modes:
        watcher_cost(tmp, args.rounds, medians, cpu_medians)
    if "dashboard" in modes:
        r, lo, hi = ratio_interval(medians["dashboard"], medians["uberprof"])
        print(f"run --dashboard / run, median step time:          {r:.4f}  "
              f"(95% interval {lo:.4f}-{hi:.4f} over {args.rounds} rounds; target <= 1.01)")
    if "metrics" in modes:
        r, lo, hi = ratio_interval(medians["metrics"], medians["uberprof"])
        print(f"run --metrics-port (scraped 1/s) / run, step time: {r:.4f}  "
              f"(95% interval {lo:.4f}-{hi:.4f} over {args.rounds} rounds; target <= 1.01)")
        print(f"  one scrape in the node agent (8 ranks x 256 steps): "
              f"{scrape_cpu_ms():.2f} ms of CPU")
    print(f"agent's own time on the training thread:          "
          f"{statistics.median(self_time) * 100:.3f}% of a step (median), "
          f"{max(self_time) * 100:.3f}% at most")
    if args.no_window:
        return

    if args.window_variants is not None:
        window_variants(args, tmp, extra)
    else:
        window_cost(args, tmp, extra)


@contextlib.contextmanager
def scraping(run_dir: Path | None, every_s: float = 1.0) -> Iterator[None]:
    """While the body runs: scrape the metrics URL the node agent wrote in node.json, every
    `every_s` (None: nothing to scrape)."""
    import threading
    import urllib.request

    if run_dir is None:
        yield
        return
    done = threading.Event()

    def loop() -> None:
        url = None
        while not done.wait(every_s):
            try:
                if url is None:
                    node = next(run_dir.glob("nodes/*/node.json"), None)
                    url = node and json.loads(node.read_text()).get("metrics", {}).get("url")
                if url:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        resp.read()
            except (OSError, ValueError):
                pass  # not served yet, or the job ended
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def scrape_cpu_ms(ranks: int = 8, steps: int = 256, repeat: int = 50) -> float:
    """The CPU time of one scrape's work in the node agent (collect and format the figures
    of `ranks` local ranks holding `steps` steps each; no files to read), median of `repeat`."""
    import time

    from prometheus_client import CollectorRegistry, generate_latest

    from uberprof.collect.metrics import NodeFigures
    from uberprof.collect.safety import AgentLog
    from uberprof.rundir import RunDir

    run = RunDir(Path(tempfile.mkdtemp(prefix="uberprof-scrape-")) / "run")
    run.create("bench")
    figures = NodeFigures(run, "bench", run.claim_node_dir("n0"), AgentLog("node"))
    for rank in range(ranks):
        for step in range(steps):
            figures.step_read(rank, step, random.uniform(0.1, 0.2), ranks)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(figures)  # type: ignore[arg-type]
    spent = []
    for _ in range(repeat):
        t0 = time.process_time()
        generate_latest(registry)
        spent.append(time.process_time() - t0)
    return statistics.median(spent) * 1e3


def watcher_cost(tmp: Path, rounds: int, medians: dict[str, list[float]],
                 cpu_medians: dict[str, list[float]]) -> None:
    """The slowdown trigger's watching (`--trace-on-slowdown`, on by default) against the same
    run without it, interleaved: step time and training-thread CPU ratios, and the trigger's
    own CPU time per step in the node agent (node.json's `slowdowns`)."""
    r, lo, hi = ratio_interval(medians["watcher"], medians["uberprof"])
    print(f"slowdown watching on / off (both --no-trace), median step time: {r:.4f}  "
          f"(95% interval {lo:.4f}-{hi:.4f} over {rounds} rounds; target: not measurable)")
    r, lo, hi = ratio_interval(cpu_medians["watcher"], cpu_medians["uberprof"])
    print(f"  training thread's CPU time per step: {r:.4f} (95% interval {lo:.4f}-{hi:.4f})")
    per_step = []
    for i in range(rounds):
        (node,) = (tmp / f"watcher-{i}").glob("nodes/*/node.json")
        watch = json.loads(node.read_text()).get("slowdowns") or {}
        if watch.get("watched_steps"):
            per_step.append(watch["watch_cpu_ms"] * 1e3 / watch["watched_steps"])
    if per_step:
        print(f"  the trigger's own CPU time in the node agent: "
              f"{statistics.median(per_step):.0f} µs a step (median over {len(per_step)} runs; "
              f"another process than the ranks')")


def median_interval(values: list[float], draws: int = 2000) -> tuple[float, float, float]:
    """The median of `values` (one per pair: both jobs ran in the same seconds, so each ratio
    is free of the machine's drift) and its 95% bootstrap interval."""
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choice(values) for _ in values) for _ in range(draws))
    return statistics.median(values), boot[int(0.025 * draws)], boot[int(0.975 * draws) - 1]


def side_by_side(args: argparse.Namespace, tmp: Path, extra: list[str]) -> None:
    """Mode 5 of the module docstring; with `--pair metrics`, A is `uberprof run --no-trace`
    and B the same with `--metrics-port 0`, scraped every second (mode 6, side by side); with
    `--pair watcher`, B has `--trace-on-slowdown` (mode 7, side by side)."""
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, str(ROOT))
    from tests.side_by_side import open_gate_when_ready, start_on, trading_cores, two_cpus

    a, b = ("plain", "uberprof") if args.pair == "uberprof" else ("uberprof", args.pair)
    options = {"uberprof": ["--no-trace"], "metrics": ["--no-trace", "--metrics-port", "0"],
               "watcher": ["--no-trace", "--trace-on-slowdown"]}
    cpus = two_cpus()
    wall: dict[str, list[float]] = {a: [], b: []}
    cpu: dict[str, list[float]] = {a: [], b: []}
    for i in range(args.rounds):
        gate = tmp / f"gate-{i}"
        times = {m: tmp / f"pair-{m}-{i}.json" for m in wall}
        cmds = {m: torchrun(args.nproc, args.steps, times[m], [*extra, "--start-gate", str(gate)])
                for m in wall}
        for m in (a, b):
            if m in options:
                cmds[m] = [sys.executable, "-m", "uberprof", "run", "--out", str(tmp),
                           "--run-id", f"pair-{m}-{i}", *options[m], "--", *cmds[m]]
        order = list(wall) if i % 2 == 0 else list(reversed(wall))  # who starts on core 0

        def one(mode: str, core: int, cmds: dict[str, list[str]] = cmds, i: int = i) -> None:
            start_on(core, cpus)
            with scraping(tmp / f"pair-{mode}-{i}" if mode == "metrics" else None):
                run(cmds[mode])

        with trading_cores((str(times[order[0]]), str(times[order[1]])), cpus), \
                ThreadPoolExecutor(2) as pool:
            jobs = [pool.submit(one, m, c) for m, c in zip(order, cpus * 2)]
            open_gate_when_ready(gate, 2 * args.nproc, jobs, 600)
            for j in jobs:
                j.result()
        for m, walls in wall.items():
            walls.append(statistics.median(json.loads(times[m].read_text())[WARMUP:]))
            cpu[m].append(statistics.median(
                json.loads(cpu_file(times[m]).read_text())[WARMUP:]))
        print(f"pair {i + 1}/{args.rounds}: {b} / {a} CPU "
              f"{cpu[b][-1] / cpu[a][-1]:.4f}, wall "
              f"{wall[b][-1] / wall[a][-1]:.4f}", flush=True)
    print()
    for what, values in (("training thread's CPU time", cpu), ("wall time", wall)):
        r, lo, hi = median_interval([y / x for x, y in zip(values[a], values[b])])
        print(f"side by side, {b} / {a}, {what} per step: {r:.4f} "
              f"(median of the pairs' ratios, 95% interval {lo:.4f}-{hi:.4f} over "
              f"{args.rounds} pairs; target <= 1.01)")


def window_cost(args: argparse.Namespace, tmp: Path, extra: list[str]) -> None:
    """A trace window's cost, from `--window-rounds` runs with a window in the middle: traced
    steps against untraced ones, the window's stall on the training thread (the agent's own
    time in the step after it, from its self-accounting: the profiler's stop and the Flight
    Recorder's dump; the trace's export and compression run on the exporter thread), against
    the run's own untraced median step, with its parts from the agent's log, the teardown (the
    extra wall time of the 3 steps after the window), and the steps after against those
    before. With `--hog`, every round runs again beside one busy process per core."""
    n = args.steps * 2
    first = n // 2
    last = first + 2
    conditions = ["quiet", "hog"] if args.hog else ["quiet"]
    if args.sync_baseline:  # the export on the training thread, as before its own thread
        conditions += [f"{c}, sync export" for c in conditions]
    res: dict[str, dict[str, list[float]]] = {
        c: {k: [] for k in ("traced", "teardown", "stall", "base", "after", "stop", "export")}
        for c in conditions}
    for i in range(args.window_rounds):
        for cond in (conditions if i % 2 == 0 else conditions[::-1]):
            rid = f"window-{conditions.index(cond)}-{i}"
            times = tmp / f"{rid}.json"
            with cpu_hog(cond.startswith("hog")):
                run([sys.executable, "-m", "uberprof", "run", "--out", str(tmp), "--run-id",
                     rid, "--trace-steps", f"{first}-{last}", *args.window_args.split(), "--",
                     *torchrun(args.nproc, n, times, extra)],
                    {"UBERPROF_SYNC_EXPORT": "1"} if cond.endswith("sync export") else None)
            r = res[cond]
            for rank_dir in sorted((tmp / f"{rid}/ranks").iterdir()):
                # the uberprof step timeline: steps numbered as the window's
                rows = [json.loads(x) for x in (rank_dir / "steps.jsonl").open()]
                wall = {r["step"]: (r["host_end_ns"] - r["host_start_ns"]) / 1e6 for r in rows
                        if r["kind"] == "step"}
                mine = {r["step"]: r["uberprof_ns"] / 1e6 for r in rows if r["kind"] == "step"}
                before = statistics.median(wall[s] for s in range(WARMUP, first))
                r["base"].append(before)
                r["stall"].append(mine[last + 1])
                r["traced"].append(statistics.median(wall[s] for s in range(first + 1, last + 1))
                                   / before)
                r["teardown"].append(sum(wall[s] for s in range(last + 1, last + 4)) - 3 * before)
                r["after"].append(statistics.median(wall[s] for s in wall if s > last + 3)
                                  / before)
                for part, ms in window_parts(rank_dir).items():
                    r[part].append(ms)
            print(f"window round {i + 1}/{args.window_rounds} ({cond}): stall "
                  f"{r['stall'][-1]:.0f} ms on the training thread (untraced step "
                  f"{r['base'][-1]:.0f} ms), traced {r['traced'][-1]:.3f}x, teardown "
                  f"{r['teardown'][-1]:.0f} ms", flush=True)
    med = statistics.median
    for cond in conditions:
        r = res[cond]
        ratios = [s / b for s, b in zip(r["stall"], r["base"])]
        print(f"[{cond}] {len(r['stall'])} windows (ranks x runs):")
        print(f"  the window's stall on the training thread:      median {med(r['stall']):.0f} ms,"
              f" max {max(r['stall']):.0f} ms; {med(ratios):.2f}x the run's untraced step "
              f"(median; max {max(ratios):.2f}x; untraced step median {med(r['base']):.0f} ms)")
        if r["stop"]:
            where = "on" if cond.endswith("sync export") else "off"
            print(f"    of which the profiler's stop:                 median "
                  f"{med(r['stop']):.0f} ms; the export ({where} the training thread): median "
                  f"{med(r['export']):.0f} ms, max {max(r['export']):.0f} ms")
        print(f"  traced steps / untraced:                        {med(r['traced']):.3f}")
        print(f"  teardown, extra wall time of the 3 steps after: {med(r['teardown']):.0f} ms")
        print(f"  steps after a trace window / before it:         {med(r['after']):.4f}  "
              f"(target <= 1.02)")


_PARTS = re.compile(r"profiler stop ([0-9.]+) ms on the training thread, export ([0-9.]+) ms")


def window_parts(rank_dir: Path) -> dict[str, float]:
    """The window's profiler stop and export times (ms) from the rank agent's log line."""
    for log in rank_dir.glob("*.log"):
        m = _PARTS.search(log.read_text(errors="replace"))
        if m:
            return {"stop": float(m.group(1)), "export": float(m.group(2))}
    return {}


@contextlib.contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    """One busy-looping process per core beside the job while the block runs (when `on`): the
    busy machine on which a window's end stalls the most."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(os.cpu_count() or 1)] if on else []
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def window_variants(args: argparse.Namespace, tmp: Path, extra: list[str]) -> None:
    """The trace window's cost under each of `--window-variants` (such as `--modules`), runs
    interleaved round by round: each variant's traced steps against its own untraced steps
    before the window, and that ratio against the plain window's (the first variant)."""
    variants = [v.strip() for v in args.window_variants.split(",")]
    n = args.steps * 2
    first, last = n // 2, n // 2 + 2
    traced: dict[str, list[float]] = {v: [] for v in variants}
    stop: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(args.window_rounds):
        order = variants if i % 2 == 0 else list(reversed(variants))
        for j, v in enumerate(order):
            rid = f"variant-{i}-{variants.index(v)}"
            run([sys.executable, "-m", "uberprof", "run", "--out", str(tmp), "--run-id", rid,
                 "--trace-steps", f"{first}-{last}", *v.split(), "--",
                 *torchrun(args.nproc, n, tmp / f"{rid}.json", extra)])
            rows = [json.loads(x) for x in (tmp / f"{rid}/ranks/0/steps.jsonl").open()]
            wall = {r["step"]: (r["host_end_ns"] - r["host_start_ns"]) / 1e6 for r in rows
                    if r["kind"] == "step"}
            mine = {r["step"]: r["uberprof_ns"] / 1e6 for r in rows if r["kind"] == "step"}
            before = statistics.median(wall[s] for s in range(WARMUP, first))
            # the window's first step holds the profiler's start: left out, as in window_cost
            traced[v].append(statistics.median(wall[s] for s in range(first + 1, last + 1))
                             / before)
            stop[v].append(mine[last + 1])
        print(f"window round {i + 1}/{args.window_rounds}: " + ", ".join(
            f"[{v or 'window'}] traced {traced[v][-1]:.3f}x, stop {stop[v][-1]:.0f} ms"
            for v in variants), flush=True)
    med = statistics.median
    base = variants[0]
    for v in variants:
        print(f"[{v or 'window'}] traced steps / untraced: {med(traced[v]):.3f} (median of "
              f"{args.window_rounds}); window stop on the training thread {med(stop[v]):.0f} ms"
              + ("" if v == base else f"; traced steps against [{base or 'window'}]: "
                 f"{med(traced[v]) / med(traced[base]):.3f}x"))


def module_hooks(args: argparse.Namespace) -> None:
    """`--modules`' cost inside a trace window, in one process on one thread: the sample's
    model (its --sample-args sizes) trains a step (forward, backward, SGD) under torch.profiler,
    rounds alternating with and without the module hooks (`collect/rank/modules.py`); the
    thread's CPU time per step, the ratio with its 95% interval, and the cost per module call.
    Outside windows the hooks are not registered, so they cost nothing there."""
    import importlib.util
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(ROOT))
    from uberprof.collect.rank.modules import ModuleMarks
    from uberprof.collect.safety import AgentLog

    spec = importlib.util.spec_from_file_location("train_ddp", SAMPLE)
    sample = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(sample)  # type: ignore[union-attr]
    a = sample.parse_args(args.sample_args.split())
    torch.set_num_threads(1)
    model = sample.TinyTransformer(a.vocab, a.dim, a.layers, a.heads, a.seq)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randint(0, a.vocab, (a.batch, a.seq))
    loss_fn = torch.nn.CrossEntropyLoss()
    calls = sum(1 for _ in model.modules()) + 1  # every module is called once, and the loss
    marks = ModuleMarks(AgentLog("benchmark"))

    def steps(n: int, hooks: bool) -> float:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            if hooks:
                marks.start()
            t0 = time.thread_time()
            for _ in range(n):
                loss_fn(model(x).flatten(0, 1), x.flatten()).backward()
                opt.step()
                opt.zero_grad()
            t = (time.thread_time() - t0) / n
            marks.stop()
        return t

    steps(3, False)
    per: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.rounds):
        for hooks in ((False, True) if i % 2 == 0 else (True, False)):
            per[hooks].append(steps(args.steps // 4 or 1, hooks))
    r, lo, hi = ratio_interval(per[True], per[False])
    extra_us = (statistics.median(per[True]) - statistics.median(per[False])) * 1e6
    print(f"module hooks in a window: {calls} module calls per step, step CPU time "
          f"{statistics.median(per[False]) * 1e3:.2f} ms without, "
          f"{statistics.median(per[True]) * 1e3:.2f} ms with: {r:.4f} (95% interval "
          f"{lo:.4f}-{hi:.4f} over {args.rounds} rounds); {extra_us / calls:.1f} µs per call")
    # the cost per call, where little else runs: 500 empty modules (nn.Identity), forward only
    model = torch.nn.Sequential(*(torch.nn.Identity() for _ in range(500)))
    x = torch.zeros(1)
    per = {False: [], True: []}

    def calls_only(hooks: bool) -> float:
        with profile(activities=[ProfilerActivity.CPU]):
            if hooks:
                marks.start()
            t0 = time.thread_time()
            for _ in range(20):
                model(x)
            t = (time.thread_time() - t0) / (20 * 501)
            marks.stop()
        return t

    calls_only(True)
    for i in range(args.rounds):
        for hooks in ((False, True) if i % 2 == 0 else (True, False)):
            per[hooks].append(calls_only(hooks))
    print(f"per module call (500 nn.Identity, forward): "
          f"{statistics.median(per[False]) * 1e6:.2f} µs without hooks, "
          f"{statistics.median(per[True]) * 1e6:.2f} µs with")


if __name__ == "__main__":
    main()
