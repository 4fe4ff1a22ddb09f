"""How often the slowdown trigger (on by default in `uberprof run`) fires on healthy runs: the
node agent's own trigger (step time and each rank's lateness) replayed on real step timelines,
the false-trigger rate printed with its count.

The test is deterministic given the step times and CPU times, so it is replayed offline on each
node's step timelines exactly as the node agent feeds it, on run directories you give
(`--replay RUN...`: every run is taken as healthy) or on healthy jobs it makes (`--make N`:
`--samples` in turn, default samples/train_ddp.py, with `--ranks` CPU/Gloo ranks in turn, 2 and
4 by default, `--steps S`, seed i for the i-th job, under `uberprof run` with its default
options, one after the other). Each run also prints its closest approach: the largest share of
a threshold's rise that the step time's and the ranks' lateness's levels reached (1 triggers).
A run shorter than the test's first possible verdict (70 steps) is counted apart. Target: no
trigger in any healthy run (exit 1 otherwise).

`--cost` measures instead the trigger's own CPU time per step (synthetic steps, in-process).

Examples:
  python benchmarks/slowdown.py --make 24 --steps 300 --ranks 2,4 --out /tmp/healthy
  python benchmarks/slowdown.py --cost
  python benchmarks/slowdown.py --replay uberprof-runs/*
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import ROOT, doc_parser, run_job

from tests._jobs import PY, job_limit, torchrun
from uberprof.collect.safety import AgentLog
from uberprof.collect.slowdown import SlowdownSettings, SlowdownTrigger
from uberprof.rundir import list_ranks, ranks_by_id, read_steps


def replay(run: Path, settings: SlowdownSettings) -> tuple[list[dict[str, Any]], int,
                                                            dict[str, float]]:
    """(detections, steps replayed, closest approach) over the nodes of `run`: each node's
    steps fed to the node agent's own trigger (step time and lateness) in step order, its
    requests written to a scratch folder, never to `run`. The closest approach of each signal
    is the largest share of its threshold's rise that its level reached (1: a trigger)."""
    nodes: dict[str | None, dict[int, dict[int, tuple[float, float | None]]]] = {}
    for rank, meta in ranks_by_id(list_ranks(run)).items():
        rows, _ = read_steps(meta.folder)
        per_step = nodes.setdefault(meta.node, {})
        for row in rows:
            if row.get("kind", "step") == "step":
                cpu = row.get("cpu_ns")
                per_step.setdefault(row["step"], {})[rank] = (
                    (row["host_end_ns"] - row["host_start_ns"]) / 1e9,
                    cpu / 1e9 if isinstance(cpu, int) else None)
    found: list[dict[str, Any]] = []
    closest = {"step time": 0.0, "lateness": 0.0}
    steps = 0
    for per_step in nodes.values():
        local = max(len(v) for v in per_step.values())
        with tempfile.TemporaryDirectory() as scratch:
            trigger = SlowdownTrigger(Path(scratch), AgentLog("replay"), settings)
            for step in sorted(per_step):
                steps += 1
                for rank, (seconds, cpu) in sorted(per_step[step].items()):
                    trigger.step_read(rank, step, seconds, local, cpu)
                _approach(closest, trigger)
            found += trigger.detections
    return found, steps, closest


def _approach(closest: dict[str, float], trigger: SlowdownTrigger) -> None:
    for name, detectors in (("step time", [trigger.detector]),
                            ("lateness", list(trigger.lateness.values()))):
        for d in detectors:
            if (got := d.level()) is not None:
                f = got[0]
                share = (f.level_s - f.baseline_s) / max(f.threshold_s - f.baseline_s, 1e-12)
                closest[name] = max(closest[name], share)


def make(n: int, steps: int, out: Path, ranks: list[int], samples: list[str]) -> list[Path]:
    """`n` healthy jobs under `uberprof run` with its default options (the scheduled window,
    counters, the trigger itself: what every job test runs with), each its own seed, the
    rank counts and samples taken in turn."""
    runs = []
    for i in range(n):
        world, sample = ranks[i % len(ranks)], samples[i % len(samples)]
        name = f"healthy-{Path(sample).stem}-r{world}-s{i}"
        command = torchrun(world, ROOT / "samples" / sample, "--steps", str(steps),
                           "--seed", str(i))
        proc = run_job([PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", name, "--",
                        *command], job_limit(command) * 2)
        runs.append(out / name)
        print(f"made {runs[-1]} (exit {proc.returncode})", flush=True)
    return runs


def cost(nodes: list[tuple[int, int]], steps: int = 2000) -> None:
    """The trigger's own CPU time per step (the node agent's watchdog thread), in this
    process on synthetic healthy steps of a node of `ranks` ranks that also reads `peers`
    ranks of other nodes (a shared run directory: each local rank's lateness against the
    job's median): the step time and every local rank's lateness watched."""
    for n, peers in nodes:
        rng = random.Random(n)
        data = [[(0.1 * rng.lognormvariate(0, 0.1), 0.05 * rng.lognormvariate(0, 0.05))
                 for _ in range(n + peers)] for _ in range(steps)]
        with tempfile.TemporaryDirectory() as scratch:
            trigger = SlowdownTrigger(Path(scratch), AgentLog("cost"))
            for step, row in enumerate(data):
                for rank, (_, cpu) in enumerate(row[n:], start=n):
                    trigger.peer_read(rank, step, cpu)
                for rank, (seconds, cpu) in enumerate(row[:n]):
                    trigger.step_read(rank, step, seconds, n, cpu)
        print(f"{n} ranks a node, {peers} of other nodes read: {trigger.cpu_ns / 1e3 / steps:.0f}"
              f" µs of the agent's CPU a step ({len(trigger.detections)} detection(s) in "
              f"{steps} steps)")


def main() -> None:
    p = doc_parser(__doc__)
    p.add_argument("--replay", nargs="*", type=Path, default=[], metavar="RUN")
    p.add_argument("--make", type=int, default=0, metavar="N", help="healthy jobs to make")
    p.add_argument("--steps", type=int, default=200, help="steps of each job made")
    p.add_argument("--out", type=Path, default=None, help="where made runs go (a temp dir)")
    p.add_argument("--ranks", default="2,4", help="rank counts of the jobs made, in turn")
    p.add_argument("--samples", default="train_ddp.py",
                   help="samples/ scripts of the jobs made, in turn (comma-separated)")
    p.add_argument("--cost", action="store_true",
                   help="only the trigger's CPU time per step, for 2 and 8 ranks a node, "
                   "with 0 or 8 ranks of other nodes read (1 and 1: two nodes of one rank)")
    args = p.parse_args()
    if args.cost:
        cost([(2, 0), (8, 0), (1, 1), (2, 8), (8, 8)])
        return
    settings = SlowdownSettings()
    runs = list(args.replay)
    if args.make:
        runs += make(args.make, args.steps, args.out or Path(tempfile.mkdtemp()),
                     [int(r) for r in args.ranks.split(",")], args.samples.split(","))
    short = 0
    fired_runs = []
    for run in runs:
        found, steps, closest = replay(run, settings)
        if steps < settings.min_baseline + settings.recent:
            short += 1
            continue
        near = ", ".join(f"{k} {v:.2f}" for k, v in closest.items())
        print(f"{run}: {steps} steps, {len(found)} trigger(s); closest approach: {near}"
              + "".join(f"\n  {d['trigger']} at step {d['step']}: {d['reason']}" for d in found))
        if found:
            fired_runs.append(run)
    counted = len(runs) - short
    if not counted:
        print("no run long enough to replay", file=sys.stderr)
        sys.exit(1)
    print(f"false-trigger rate: {len(fired_runs)} of {counted} healthy run(s) "
          f"({100 * len(fired_runs) / counted:.0f}%); {short} too short to count; target 0")
    sys.exit(1 if fired_runs else 0)


if __name__ == "__main__":
    main()
