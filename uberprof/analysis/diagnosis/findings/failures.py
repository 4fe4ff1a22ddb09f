"""Hangs and crashes, judged from the run directory alone (no trace needed): which rank, where,
and why, as `hang` and `crash` findings that the advisor ranks before every other finding and
that `uberprof report` gives also for a run without any trace window.

Both read the same evidence of each rank (`failure_evidence.load_evidence`: its step timeline's
tail, stacks, exceptions, exit records and Flight Recorder dumps) and decide culprits from each
rank's own collective sequence (`collective_sequence.py`), never from an index. How a hang is
judged is in `hang.py`; a crash, and the desync or out-of-memory error behind it, in `crash.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.failure_evidence import load_evidence
from uberprof.analysis.diagnosis.findings.crash import CRASH, crash_finding
from uberprof.analysis.diagnosis.findings.hang import HANG, hang_finding
from uberprof.analysis.diagnosis.model import Finding
from uberprof.rundir import RunDir, list_nodes
from uberprof.rundir.step_table import StepTail

__all__ = ["KINDS", "failure_findings", "hang_summary", "run_failure_findings"]

KINDS = (HANG, CRASH)


def failure_findings(roots: Path | Iterable[Path],
                     tails: Callable[[Path], StepTail | None] | None = None) -> list[Finding]:
    """The `hang` and `crash` findings of a run directory (none for a healthy run); `tails`
    as for `load_evidence`."""
    roots = [roots] if isinstance(roots, Path | str) else list(roots)
    ranks, hangs = load_evidence([Path(r) for r in roots], tails)
    running = {n.node for r in roots for n in list_nodes(RunDir(Path(r)))
               if n.readable and n.end_ns is None}
    out = []
    hang = hang_finding(ranks, hangs)
    if hang is not None:
        out.append(hang)
    stopped_at = min((h["detected_ns"] for h in hangs if h.get("action") == "stop"
                      and isinstance(h.get("detected_ns"), int)), default=None)
    crash = crash_finding(ranks, stopped_at, running)
    if crash is not None:
        out.append(crash)
    return out


def hang_summary(root: Path) -> str:
    """The stuck rank(s) and where, in one phrase (for the watchdog's line on stderr)."""
    ranks, hangs = load_evidence([root])
    f = hang_finding(ranks, hangs)
    return f.title if f is not None else "no stuck rank could be named"


def run_failure_findings(facts: Facts) -> list[Finding]:
    """The producer: the hang and crash findings of a run directory (none for traces alone),
    from what the analysis already read of each step timeline."""
    ctx = facts.ctx
    if not ctx.is_run_dir:
        return []
    return failure_findings(ctx.root, ctx.run.step_tail)
