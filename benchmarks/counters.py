"""The counter sampler's cost on step time: the DDP sample under `uberprof run --no-trace`, with
counters on (the default, or a given --sample-hz) and off (`--counters none`), interleaved in one
invocation because step times on these machines drift between runs. Prints the ratio of median
step times (from each rank's steps.jsonl); target <= 1.01. Step times move by several percent
between runs on a shared machine, so it also prints the sampling threads' own CPU time (their
self-accounting in node.json), which bounds the cost without that noise.

    python benchmarks/counters.py [--rounds 6] [--steps 80] [--nproc 2] [--hz 2 10]
    python benchmarks/counters.py --toggle [--window 4] [--hz 2]   # one job, sampler on/off beside it
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "train_ddp.py"
WARMUP = 5


def step_times(run_dir: Path) -> list[float]:
    """Host step durations (s) of every rank, warm-up steps left out."""
    out: list[float] = []
    for steps in sorted(run_dir.glob("ranks/*/steps.jsonl")):
        rows = [json.loads(line) for line in steps.open() if line.strip()]
        rows = [r for r in rows if r.get("kind") == "step"][WARMUP:]
        out += [(r["host_end_ns"] - r["host_start_ns"]) / 1e9 for r in rows]
    return out


def run_once(out: Path, run_id: str, counters: list[str], nproc: int, steps: int,
             extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id,
           "--no-trace", *counters, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(SAMPLE), "--steps", str(steps), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UBERPROF_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    times = step_times(out / run_id)
    if not times:
        sys.exit(f"no steps recorded in {out / run_id}")
    return statistics.median(times)


def sampler_cpu_share(run_dir: Path) -> float | None:
    """CPU seconds the sampling threads used per wall second (their own accounting)."""
    for node in sorted(run_dir.glob("nodes/*/node.json")):
        share = (json.loads(node.read_text()).get("counters") or {}).get("cpu_share")
        if share is not None:
            return float(share)
    return None


TOGGLER = r"""
import json, sys, time
from pathlib import Path
from uberprof.collect.counters import CounterSettings, NodeSampler
from uberprof.collect.safety import AgentLog
from uberprof.rundir import RunDir
out, root_pid, hz, window = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
run = RunDir(out); run.create("toggled")
log = open(out / "windows.jsonl", "a")
i = 0
while True:
    s = NodeSampler(run, "toggled", run.claim_node_dir(f"w{i}"),
                    CounterSettings(sample_hz=hz), AgentLog("node"), root_pid=root_pid)
    s.start()
    s.wait_ready(30)
    t0 = time.time_ns()
    time.sleep(window)
    t1 = time.time_ns()
    s.stop()
    t2 = time.time_ns()
    time.sleep(window)
    t3 = time.time_ns()
    log.write(json.dumps({"on": [t0, t1], "off": [t2, t3]}) + "\n")
    log.flush()
    i += 1
"""


def toggled(args: argparse.Namespace, tmp: Path) -> None:
    """One long job without counters; beside it, the same sampler (sampling the job's process
    tree) switched on and off every few seconds. Steps inside on-windows against steps inside
    off-windows: the machine's drift cancels out, because the two alternate quickly."""
    hz = args.hz[0]
    cmd = [sys.executable, "-m", "uberprof", "run", "--out", str(tmp), "--run-id", "job",
           "--no-trace", "--counters", "none", "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.nproc}", str(SAMPLE), "--steps", str(args.toggle_steps)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UBERPROF_")}
    env["OMP_NUM_THREADS"] = "1"
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=env)
    toggler = subprocess.Popen([sys.executable, "-c", TOGGLER, str(tmp / "toggler"),
                                str(job.pid), str(hz), str(args.window)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                               cwd=ROOT)
    try:
        _, err = job.communicate()
    finally:
        toggler.kill()
        toggler.wait()
    if job.returncode != 0:
        sys.exit(f"the job failed:\n{err[-3000:]}")
    windows = [json.loads(line) for line in (tmp / "toggler" / "windows.jsonl").open()]
    steps = []
    for path in sorted((tmp / "job").glob("ranks/*/steps.jsonl")):
        rows = [json.loads(line) for line in path.open() if line.strip()]
        steps += [r for r in rows if r.get("kind") == "step"][WARMUP:]

    def inside(a: int, b: int) -> list[float]:
        return [(r["host_end_ns"] - r["host_start_ns"]) / 1e9 for r in steps
                if r["host_start_ns"] >= a and r["host_end_ns"] <= b]

    on = [inside(*w["on"]) for w in windows]
    off = [inside(*w["off"]) for w in windows]
    pairs = [statistics.median(a) / statistics.median(b) for a, b in zip(on, off) if a and b]
    if not pairs:
        sys.exit("no whole window inside the job: raise --toggle-steps")
    all_on = [x for w in on for x in w]
    all_off = [x for w in off for x in w]
    ratio = statistics.median(all_on) / statistics.median(all_off)
    print(f"toggled every {args.window:g} s at {hz:g} Hz, {len(pairs)} window pairs, "
          f"{len(all_on)} steps on, {len(all_off)} off")
    print(f"median step time on {statistics.median(all_on) * 1e3:.2f} ms, "
          f"off {statistics.median(all_off) * 1e3:.2f} ms: ratio {ratio:.4f} "
          f"(median of window pairs {statistics.median(pairs):.4f}); target <= 1.01: "
          f"{'ok' if ratio <= 1.01 else 'ABOVE TARGET'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--hz", type=float, nargs="+", default=[2.0],
                    help="sampling rates to measure (each against sampling off)")
    ap.add_argument("--sample-args", default="", help="extra arguments for the sample")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--toggle", action="store_true",
                    help="instead: one long job, the sampler switched on and off beside it")
    ap.add_argument("--window", type=float, default=4.0, help="seconds per on/off window")
    ap.add_argument("--toggle-steps", type=int, default=1000)
    args = ap.parse_args()
    extra = args.sample_args.split()
    tmp = Path(tempfile.mkdtemp(prefix="uberprof-counters-bench-"))
    if args.toggle:
        toggled(args, tmp)
        return
    modes: dict[str, list[str]] = {"off": ["--counters", "none"]}
    for hz in args.hz:
        modes[f"{hz:g} Hz"] = ["--counters", "auto", "--sample-hz", f"{hz:g}"]
    medians: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(args.rounds):
        order = list(modes) if i % 2 == 0 else list(reversed(modes))
        for m in order:
            rid = f"{m.replace(' ', '')}-{i}"
            medians[m].append(run_once(tmp, rid, modes[m], args.nproc, args.steps, extra))
            share = sampler_cpu_share(tmp / rid)
            if share is not None:
                cpu[m].append(share)
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(
            f"{m} {medians[m][-1] * 1e3:.2f} ms" for m in modes), flush=True)

    off = statistics.median(medians["off"])
    results = {"rounds": args.rounds, "steps": args.steps, "nproc": args.nproc,
               "median_step_s": {m: statistics.median(v) for m, v in medians.items()},
               "ratio": {}, "paired_ratio": {},
               "sampler_cpu_share": {m: statistics.median(v) for m, v in cpu.items() if v}}
    print(f"\nmedian step time with counters off: {off * 1e3:.2f} ms")
    for m in modes:
        if m == "off":
            continue
        ratio = statistics.median(medians[m]) / off
        paired = statistics.median(a / b for a, b in zip(medians[m], medians["off"]))
        results["ratio"][m] = ratio
        results["paired_ratio"][m] = paired
        verdict = "ok" if ratio <= 1.01 else "ABOVE TARGET"
        print(f"counters at {m}: ratio of median step times {ratio:.4f} "
              f"(round by round: {paired:.4f}); target <= 1.01: {verdict}")
        if cpu[m]:
            share = statistics.median(cpu[m])
            print(f"  the sampling threads' own CPU time (steady state, without the one-off "
                  f"set-up): {share * 100:.2f}% of one core "
                  f"({share / (os.cpu_count() or 1) * 100:.2f}% of this machine's "
                  f"{os.cpu_count()} cores)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"runs in {tmp}")


if __name__ == "__main__":
    main()
