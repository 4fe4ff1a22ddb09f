"""Whether uberprof names the right culprit of a hang, a desync or a crash, and how soon: real
CPU/Gloo jobs (tests/scripts/faulty.py) in which one rank misbehaves, each under `uberprof run
--no-trace --hang-timeout 15 --on-hang stop`, then `uberprof report --json`.

    python benchmarks/hangs.py                         # every case, one after the other
    python benchmarks/hangs.py --cases stop,spin --ranks 4 --keep --out DIR

Cases (R: the rank that misbehaves; S: the step, 3 of 8 unless "last" (step 7)):

  mismatch-op-r0   rank 0 calls broadcast where the others all-reduce       hang  mismatch
  mismatch-op-r1   rank 1 does                                              hang  mismatch
  barrier          rank 0 skips an all-reduce and waits in a barrier        hang  mismatch
  barrier-last     ... at the last step                                     hang  mismatch
  skip             rank N/2 skips an all-reduce, waits in another group's   hang  skipped_collective
  skip-one         rank N/2 skips the gradients' all-reduce; its next one
                   (10,000 statistics) meets the others' gradients: Gloo
                   aborts in a peer                                         crash desync
  skip-one-last    ... at the last step                                     crash desync
  mismatch-size    rank N/2 skips a 1-element all-reduce (Gloo aborts)      crash desync
  skip-logged      DDP; rank N/2 skips the loss's all-reduce after its
                   optimizer step; its next (the bucket, in backward) meets
                   the others' loss: Gloo aborts a peer while rank N/2 is in
                   backward (its launcher asks it for its collectives)      crash desync
  sleep            rank N/2 sleeps forever in Python (a lock, stuck)        hang  stuck_rank
  spin             rank N/2 spins forever in a Python loop                  hang  stuck_rank
  stop             rank N/2 sends itself SIGSTOP (frozen)                   hang  frozen_rank
  segv             rank N/2 reads address 0 (SIGSEGV)                       crash signal
  exit             rank N/2 calls os._exit(3)                               crash exit_code
  kill             rank N/2 kills itself with SIGKILL                       crash signal
  raise            rank N/2 raises RuntimeError                             crash exception

The desync cases run with 2 and 4 ranks, the single-rank faults with 4 (--ranks runs every
case with the rank counts given). A case is right when the report's first hang or crash finding
has the expected kind and names exactly the rank that misbehaved; its cause is printed beside
the expected one. The verdict time runs from the fault to the verdict: for a hang, from the
last progress any rank made (the faulty rank's last step; `last_progress_ns` in the node's
hang.json) to the moment hang.json was written with every rank's stacks; for a crash, from the
first failure (`evidence.first.time_ns`) to the end of `uberprof run` (the job ended, its
record written). The target (issue 29): the culprit right in every case. Exit code 1 when any
culprit is wrong or missing.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import ROOT, doc_parser, run_job, uberprof_json

from tests._jobs import PY, torchrun

FAULTY = ROOT / "tests" / "scripts" / "faulty.py"
HANG_TIMEOUT_S = 15
STEPS = 8
AT_STEP = 3
LAST = STEPS - 1
DESYNC_RANKS = (2, 4)
SINGLE_RANKS = (4,)


@dataclass(frozen=True)
class Case:
    """One fault: faulty.py's --fault, the misbehaving rank (a function of the world size),
    the step, and what the report must say."""

    name: str
    fault: str
    kind: str  # hang or crash
    cause: str
    rank: str = "half"  # "0", "1" or "half" (N // 2)
    at_step: int = AT_STEP
    ranks: tuple[int, ...] = SINGLE_RANKS

    def culprit(self, n: int) -> int:
        return n // 2 if self.rank == "half" else int(self.rank)


CASES = {c.name: c for c in (
    Case("mismatch-op-r0", "mismatch-op", "hang", "mismatch", "0", ranks=DESYNC_RANKS),
    Case("mismatch-op-r1", "mismatch-op", "hang", "mismatch", "1", ranks=DESYNC_RANKS),
    Case("barrier", "barrier", "hang", "mismatch", "0", ranks=DESYNC_RANKS),
    Case("barrier-last", "barrier", "hang", "mismatch", "0", at_step=LAST, ranks=DESYNC_RANKS),
    Case("skip", "skip", "hang", "skipped_collective", ranks=DESYNC_RANKS),
    Case("skip-one", "skip-one", "crash", "desync", ranks=DESYNC_RANKS),
    Case("skip-one-last", "skip-one", "crash", "desync", at_step=LAST, ranks=DESYNC_RANKS),
    Case("mismatch-size", "mismatch", "crash", "desync"),
    Case("skip-logged", "skip-logged", "crash", "desync"),
    Case("sleep", "sleep", "hang", "stuck_rank"),
    Case("spin", "spin", "hang", "stuck_rank"),
    Case("stop", "stop", "hang", "frozen_rank"),
    Case("segv", "segv", "crash", "signal"),
    Case("exit", "exit", "crash", "exit_code"),
    Case("kill", "kill", "crash", "signal"),
    Case("raise", "raise", "crash", "exception"),
)}


@dataclass
class Outcome:
    case: str
    ranks: int
    culprit: int
    kind: str
    cause: str
    exit_code: int | None = None
    got_kind: str | None = None
    got_cause: str | None = None
    got_ranks: list[int] = field(default_factory=list)
    title: str = ""
    verdict_s: float | None = None
    verdict_basis: str = ""
    seconds: float = 0.0
    error: str | None = None

    @property
    def right(self) -> bool:
        return self.got_kind == self.kind and self.got_ranks == [self.culprit]

    @property
    def cause_right(self) -> bool:
        return self.right and self.got_cause == self.cause


def _report(run: Path, timeout: float) -> dict[str, Any]:
    """`uberprof report --json`: a run that hung before any trace exits 1 with a document."""
    return uberprof_json(["report", "--json", str(run)], timeout)


def _verdict(run: Path, finding: dict[str, Any], ended_ns: int) -> tuple[float | None, str]:
    """Seconds from the fault to the verdict, and what they were measured between."""
    ev = finding.get("evidence") or {}
    if finding.get("kind") == "hang":
        recs = sorted((run / "nodes").glob("*/hang.json"))
        if recs and ev.get("last_progress_ns"):
            written = min(r.stat().st_mtime_ns for r in recs)
            return (written - int(ev["last_progress_ns"])) / 1e9, "last progress -> hang.json"
        if ev.get("stalled_ms") is not None:
            return float(ev["stalled_ms"]) / 1e3, "stalled_ms"
        return None, ""
    first = ev.get("first") or {}
    if first.get("time_ns"):
        return (ended_ns - int(first["time_ns"])) / 1e9, "first failure -> job ended"
    return None, ""


def run_case(case: Case, n: int, out: Path, args: Any) -> Outcome:
    """One faulty job and its report, judged; a failure to run or report is an error."""
    culprit = case.culprit(n)
    o = Outcome(case.name, n, culprit, case.kind, case.cause)
    run_id = f"{case.name}-r{n}"
    shutil.rmtree(out / run_id, ignore_errors=True)
    job = torchrun(n, FAULTY, "--fault", case.fault, "--rank", str(culprit), "--at-step",
                   str(case.at_step), "--steps", str(STEPS))
    cmd = [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id,
           *args.uberprof_args.split(), "--hang-timeout", str(HANG_TIMEOUT_S),
           "--on-hang", "stop", "--", *job]
    t0 = time.monotonic()
    try:
        proc = run_job(cmd, args.run_timeout)
        ended_ns = time.time_ns()
        o.exit_code = proc.returncode
        (out / f"{run_id}.stderr.txt").write_text(proc.stderr)
        report = _report(out / run_id, args.run_timeout)
        (out / f"{run_id}.report.json").write_text(json.dumps(report, indent=1))
        f = next((x for x in report.get("findings") or [] if x.get("kind") in
                  ("hang", "crash")), None)
        if f is None:
            o.error = "no hang or crash finding"
        else:
            o.got_kind, o.got_cause = f.get("kind"), f.get("cause")
            o.got_ranks = list(f.get("ranks") or [])
            o.title = str(f.get("title") or "")
            o.verdict_s, o.verdict_basis = _verdict(out / run_id, f, ended_ns)
    except (subprocess.TimeoutExpired, RuntimeError, ValueError, OSError) as e:
        o.error = str(e)[-300:] or type(e).__name__
    o.seconds = time.monotonic() - t0
    if not args.keep:
        shutil.rmtree(out / run_id, ignore_errors=True)
    return o


def _line(o: Outcome) -> str:
    want = f"{o.kind}/{o.cause} rank {o.culprit}"
    got = o.error or f"{o.got_kind}/{o.got_cause} ranks {o.got_ranks}"
    mark = "right" if o.right else "WRONG"
    if o.right and not o.cause_right:
        mark += " (cause differs)"
    t = f"{o.verdict_s:6.1f} s" if o.verdict_s is not None else "     - "
    return (f"{o.case:<15} {o.ranks:>2} ranks  want {want:<32} got {got:<36} {mark:<22} "
            f"verdict {t}  exit {o.exit_code}  ({o.seconds:.0f} s)")


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Culprits right, causes as expected, and the verdict times (median, max)."""
    times = [o.verdict_s for o in outcomes if o.verdict_s is not None]
    return {"cases": len(outcomes), "right": sum(o.right for o in outcomes),
            "cause_right": sum(o.cause_right for o in outcomes),
            "wrong": [f"{o.case}-r{o.ranks}" for o in outcomes if not o.right],
            "verdict_median_s": round(statistics.median(times), 1) if times else None,
            "verdict_max_s": round(max(times), 1) if times else None,
            "hang_verdict_median_s": _median([o.verdict_s for o in outcomes
                                              if o.got_kind == "hang"]),
            "crash_verdict_median_s": _median([o.verdict_s for o in outcomes
                                               if o.got_kind == "crash"])}


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 1) if vals else None


def main() -> None:
    ap = doc_parser(__doc__)
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated, from the list above (default: all)")
    ap.add_argument("--ranks", default=None,
                    help="rank counts for every case, e.g. 2,4 (default: per case, above)")
    ap.add_argument("--uberprof-args", default="--no-trace",
                    help="`uberprof run` options besides the hang's (default --no-trace)")
    ap.add_argument("--run-timeout", type=float, default=300, help="seconds per run/report")
    ap.add_argument("--out", type=Path, help="runs and reports go here (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    args = ap.parse_args()
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    try:
        forced = [int(x) for x in args.ranks.split(",")] if args.ranks else None
    except ValueError:
        ap.error(f"--ranks {args.ranks!r}: expected rank counts such as 2,4")
    if forced and min(forced) < 2:
        ap.error("--ranks: every case needs at least 2 ranks")
    out = args.out or Path(tempfile.mkdtemp(prefix="uberprof-hangs-"))
    out.mkdir(parents=True, exist_ok=True)
    plan = [(CASES[c], n) for c in names for n in (forced or CASES[c].ranks)]
    outcomes = []
    for i, (case, n) in enumerate(plan):
        o = run_case(case, n, out, args)
        outcomes.append(o)
        print(f"[{i + 1}/{len(plan)}] {_line(o)}", flush=True)
    summ = summary(outcomes)
    (out / "hangs.json").write_text(json.dumps(
        {"summary": summ, "outcomes": [{**asdict(o), "right": o.right} for o in outcomes]},
        indent=1))
    for o in outcomes:
        if not o.right and o.title:
            print(f"  {o.case}-r{o.ranks}: {o.title}")
    print(f"culprit right in {summ['right']} of {summ['cases']} (cause as expected in "
          f"{summ['cause_right']}), verdict time median {summ['verdict_median_s']} s / max "
          f"{summ['verdict_max_s']} s (hangs {summ['hang_verdict_median_s']} s, crashes "
          f"{summ['crash_verdict_median_s']} s median); results in {out}")
    sys.exit(0 if summ["right"] == summ["cases"] else 1)


if __name__ == "__main__":
    main()
