"""How long the dashboard takes to refresh a page that follows a running job, on a big run.

Target (issue 17): a 64-rank x 100,000-step run refreshes in well under a second.

1. Writes a synthetic run with benchmarks/synth_run.py (unless it is there already), then makes
   it look running: no end in node.json, and the last `--rounds` x `--per-round` steps of
   every rank held back (the job has not written them yet).
2. Loads it as `uberprof dashboard` does (the analysis when the derived tables are missing or
   stale), and builds the app, which follows the run (`dashboards/live.py`).
3. Each round the job "writes" `--per-round` more steps on every rank, then one refresh is
   timed: what a tick of an open overview costs the server (read what is new, the status line,
   the straggler and data-stall indications, the step-time heat map redrawn and serialised
   for the browser); and, in the same round and the same process, the baseline: the same
   figure after reading the whole run again (a fresh follower), which is what a refresh costs
   without incremental reading. The order alternates between rounds.
The run's files are restored at the end, so the next invocation reuses the run and its tables.

    python benchmarks/live.py                    # /tmp/uberprof-synth-live-64x100000
    python benchmarks/live.py --ranks 8 --steps 2000 --rounds 3 --json
Exit code 1 when the median refresh misses the target.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT, doc_parser, json_option, synth_options

TARGET_S = 1.0


def _hold_back(run: Path, lines: int) -> dict[Path, bytes]:
    """Cut every rank's steps.jsonl before its last `lines` lines and mark the job running;
    returns the whole files (what `_restore` writes back)."""
    whole: dict[Path, bytes] = {}
    for p in sorted(run.glob("ranks/*/steps.jsonl")):
        text = whole[p] = p.read_bytes()
        cut = len(text)
        for _ in range(lines):
            cut = text.rfind(b"\n", 0, cut - 1) + 1 if cut > 1 else 0
        p.write_bytes(text[:cut])
    for p in run.glob("nodes/*/node.json"):
        whole[p] = text = p.read_bytes()
        p.write_bytes(re.sub(rb'"end_ns": \d+', b'"end_ns": null', text))
    return whole


def _write_more(whole: dict[Path, bytes], lines: int) -> None:
    """The job writes its next `lines` steps on every rank."""
    for p, text in whole.items():
        if p.name != "steps.jsonl":
            continue
        have = p.stat().st_size
        end = have
        for _ in range(lines):
            nxt = text.find(b"\n", end)
            if nxt < 0:
                break
            end = nxt + 1
        with open(p, "ab") as f:
            f.write(text[have:end])


def _restore(whole: dict[Path, bytes]) -> None:
    for p, text in whole.items():
        p.write_bytes(text)


def _refresh(live: Any) -> float:
    """One tick of an open overview, as the server runs it; seconds."""
    from uberprof.dashboards.pages.overview import heatmap_figure

    t0 = time.perf_counter()
    state = live.poll()
    live.status(state)
    live.signals()
    d = live.current()
    heatmap_figure(d, d.straggler_rank()).to_json()
    return time.perf_counter() - t0


def _full_reread(base: Any) -> float:
    """The same figure after reading the whole run again (no incremental reading); seconds."""
    from uberprof.dashboards.pages.overview import heatmap_figure
    from uberprof.rundir.follow import RunFollower

    t0 = time.perf_counter()
    follower = RunFollower(base.root)
    follower.poll()
    d = base.followed(follower)
    heatmap_figure(d, d.straggler_rank()).to_json()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = doc_parser(__doc__)
    p.add_argument("--run", type=Path, help="an existing (ended) run directory to use")
    synth_options(p, steps=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-round", type=int, default=15,
                   help="steps each rank writes between two refreshes (3 s of 200 ms steps)")
    p.add_argument("--no-counters", action="store_true",
                   help="a synthetic run without node counters (faster to write)")
    p.add_argument("--diagnose", action="store_true",
                   help="diagnose the run when it is loaded, as `uberprof dashboard` does (once, "
                        "not per refresh; on 64 x 100,000 steps it takes long)")
    json_option(p)
    a = p.parse_args(argv)
    run = a.run
    written = None
    if run is None:
        run = Path(f"/tmp/uberprof-synth-live-{a.ranks}x{a.steps}")
        if not (run / "run.json").exists():
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import synth_run

            t = time.perf_counter()
            synth_run.main([str(run), "--ranks", str(a.ranks), "--steps", str(a.steps),
                            *(["--no-counters"] if a.no_counters else [])])
            written = round(time.perf_counter() - t, 1)
    from uberprof.dashboards.app import create_app
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.live import EXTENSION

    whole = _hold_back(run, a.rounds * a.per_round)
    try:
        t = time.perf_counter()
        data = RunData(root=run).load()
        if not a.diagnose:
            data._diagnosed = True  # no diagnosis: the refresh does not make one either
        live = create_app(data, warm=False).server.extensions.get(EXTENSION)
        if live is None:
            sys.exit(f"{run}: not followed (is it a uberprof run directory?)")
        _refresh(live)  # the first figure of the page
        startup = time.perf_counter() - t
        base = live._base
        refresh, baseline = [], []
        for i in range(a.rounds):
            _write_more(whole, a.per_round)
            if i % 2 == 0:
                refresh.append(_refresh(live))
                baseline.append(_full_reread(base))
            else:
                baseline.append(_full_reread(base))
                refresh.append(_refresh(live))
        rows = live.follower.rows()
    finally:
        _restore(whole)
    med, base_med = statistics.median(refresh), statistics.median(baseline)
    result = {
        "run": str(run), "ranks": len(live.follower.step_followers()), "step_rows": rows,
        "synthetic_run_written_s": written, "load_and_first_figure_s": round(startup, 1),
        "refresh_median_s": round(med, 3), "refresh_max_s": round(max(refresh), 3),
        "full_reread_median_s": round(base_med, 3), "speedup": round(base_med / med, 1),
        "target_s": TARGET_S, "meets_target": med < TARGET_S,
        "rounds": a.rounds, "steps_per_round": a.per_round,
        "refresh_s": [round(x, 3) for x in refresh],
        "full_reread_s": [round(x, 3) for x in baseline],
        "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
    }
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"run: {run} ({result['ranks']} ranks, {rows:,} step rows)"
              + (f", written in {written} s" if written else ""))
        print(f"load + first figure: {startup:.1f} s")
        print(f"refresh of a followed overview (read what is new, status, indications, heat "
              f"map), {a.per_round} new steps per rank, {a.rounds} rounds "
              f"(load average {result['load_average'][0]} on {result['cpus']} CPUs):")
        print(f"  incremental:        median {med:.3f} s, max {max(refresh):.3f} s "
              f"({'OK' if med < TARGET_S else 'MISSED'}, target {TARGET_S:.1f} s)")
        print(f"  whole run re-read:  median {base_med:.3f} s (baseline, same rounds): "
              f"{result['speedup']}x")
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
