"""How often the slowdown trigger (`uberprof run --trace-on-slowdown`) fires on healthy runs:
its change-point test replayed on real step timelines, the false-trigger rate printed.

The test is deterministic given the step times, so it is replayed offline on each node's step
timelines exactly as the node agent feeds it (per step, the median over the node's ranks), on
run directories you give (`--replay RUN...`: every run is taken as healthy) or on healthy jobs
it makes (`--make N`: samples/train_ddp.py, 2 CPU/Gloo ranks, `--steps S`, under `uberprof run
--no-trace --counters none`, one after the other). A run shorter than the test's first
possible verdict (70 steps) is counted apart. Target: no trigger in any healthy run (exit 1
otherwise).

Examples:
  python benchmarks/slowdown.py --make 20 --steps 200
  python benchmarks/slowdown.py --replay uberprof-runs/*
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import ROOT, doc_parser, run_job

from tests._jobs import PY, job_limit, torchrun
from uberprof.collect.slowdown import SlowdownDetector, SlowdownSettings
from uberprof.rundir import list_ranks, ranks_by_id, read_steps


def replay(run: Path, settings: SlowdownSettings) -> tuple[int, int]:
    """(detections, steps replayed) over the nodes of `run`."""
    nodes: dict[str | None, dict[int, list[float]]] = {}
    for meta in ranks_by_id(list_ranks(run)).values():
        rows, _ = read_steps(meta.folder)
        per_step = nodes.setdefault(meta.node, {})
        for row in rows:
            if row.get("kind", "step") == "step":
                per_step.setdefault(row["step"], []).append(
                    (row["host_end_ns"] - row["host_start_ns"]) / 1e9)
    fired = steps = 0
    for per_step in nodes.values():
        detector = SlowdownDetector(settings)
        for step in sorted(per_step):
            steps += 1
            if detector.add(step, statistics.median(per_step[step]), now_ns=step) is not None:
                fired += 1
    return fired, steps


def make(n: int, steps: int, out: Path) -> list[Path]:
    runs = []
    for i in range(n):
        command = torchrun(2, ROOT / "samples" / "train_ddp.py", "--steps", str(steps))
        run_job([PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", f"healthy{i}",
                 "--no-trace", "--counters", "none", "--", *command], job_limit(command))
        runs.append(out / f"healthy{i}")
        print(f"made {runs[-1]}", flush=True)
    return runs


def main() -> None:
    p = doc_parser(__doc__)
    p.add_argument("--replay", nargs="*", type=Path, default=[], metavar="RUN")
    p.add_argument("--make", type=int, default=0, metavar="N", help="healthy jobs to make")
    p.add_argument("--steps", type=int, default=200, help="steps of each job made")
    p.add_argument("--out", type=Path, default=None, help="where made runs go (a temp dir)")
    args = p.parse_args()
    settings = SlowdownSettings()
    runs = list(args.replay)
    if args.make:
        runs += make(args.make, args.steps, args.out or Path(tempfile.mkdtemp()))
    short = 0
    fired_runs = []
    for run in runs:
        fired, steps = replay(run, settings)
        if steps < settings.min_baseline + settings.recent:
            short += 1
            continue
        print(f"{run}: {steps} steps, {fired} trigger(s)")
        if fired:
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
