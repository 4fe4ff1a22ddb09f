"""What a hang or crash left behind, per rank, read once from the run directory.

Each rank's last finished step, exceptions, fatal-signal dump, the watchdog helper's stacks,
faulthandler's stacks, the Flight Recorder's collectives and the launcher's exit records, with
each node's hang record; and the helpers that find the user's frame in a stack. The `hang` and
`crash` findings (`findings/hang.py`, `findings/crash.py`) and the watchdog's one-line summary
judge from these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.rundir import RankMeta, RunDir, list_nodes, ranks_by_id
from uberprof.rundir.failures import (
    Collective,
    Stacks,
    read_exceptions,
    read_exits,
    read_fatal,
    read_flight_recorder,
    read_node_hang,
    read_rank_hang,
    read_stacks,
)
from uberprof.rundir.ranks import read_step_timeline
from uberprof.rundir.step_table import StepTail, read_step_table

__all__ = ["AT_FAILURE", "FR_REASONS", "LIBRARY_PARTS", "RankEvidence", "in_distributed", "load_evidence",
           "main_of", "user_frame", "where"]

LIBRARY_PARTS = ("site-packages", "dist-packages", "/lib/python3", "<frozen ", "/uberprof/")
FR_REASONS = ("exception", "hang", "peer_failed")  # the Flight Recorder dumps a rank may write
# A rank's collectives when the job failed: its own exception's dump, else the one its
# launcher asked for when a peer failed (`collect/rank/exits.ask_peers`)
AT_FAILURE = "at_failure"


@dataclass
class RankEvidence:
    """What one rank left behind, read once."""

    rank: int
    meta: RankMeta
    last_step: int | None = None
    last_step_end_ns: int | None = None
    steps: int = 0
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    fatal: Stacks | None = None
    hang: dict[str, Any] | None = None
    stacks: Stacks | None = None
    flight: dict[str, list[Collective]] = field(default_factory=dict)  # by dump reason
    exits: list[dict[str, Any]] = field(default_factory=list)
    _step_ends: list[tuple[int, int]] | None = field(default=None, repr=False)

    def step_ends(self) -> list[tuple[int, int]]:
        """(host_end_ns, step) of every finished step, in time order; read once, when a
        finding places collectives in steps."""
        if self._step_ends is None:
            self._step_ends = sorted(
                (r["host_end_ns"], r["step"]) for r in read_step_timeline(self.meta.folder).steps
                if isinstance(r.get("host_end_ns"), int) and isinstance(r.get("step"), int))
        return self._step_ends

    def main_stack(self) -> list[dict[str, Any]]:
        """The main thread's frames at the hang (innermost last), from the best source."""
        if self.hang:
            threads = [t for t in self.hang.get("threads") or [] if isinstance(t, dict)]
            main = next((t for t in threads if t.get("main")), threads[0] if threads else None)
            if main and main.get("frames"):
                return list(main["frames"])
        if self.stacks:
            return main_of(self.stacks)
        return []


def main_of(stacks: Stacks) -> list[dict[str, Any]]:
    """The main thread of a faulthandler dump: the one whose outermost frame is `<module>`."""
    for t in stacks.threads:
        if t["frames"] and t["frames"][0]["function"] == "<module>":
            return list(t["frames"])
    current = next((t for t in stacks.threads if t["current"]), None)
    return list(current["frames"]) if current else []


def load_evidence(roots: Iterable[Path], tails: Callable[[Path], StepTail | None] | None = None
                  ) -> tuple[dict[int, RankEvidence], list[dict[str, Any]]]:
    """Every rank's evidence and every node's hang record (with `node`) of a run. `tails`
    answers a rank folder's `StepTail` where the analysis already knows it (None: read the
    folder's steps.jsonl)."""
    ranks: dict[int, RankEvidence] = {}
    hangs: list[dict[str, Any]] = []
    exits: list[dict[str, Any]] = []
    for root in roots:
        run = RunDir(Path(root))
        for node in list_nodes(run):
            rec = read_node_hang(node.folder)
            if rec is not None:
                hangs.append({**rec, "node": node.node})
            exits += [{**e, "node": node.node} for e in read_exits(node.folder)]
        for rank, meta in ranks_by_id(run).items():
            if rank in ranks:
                continue
            tail = (tails(meta.folder) if tails is not None else None) or \
                _step_tail(meta.folder)
            ev = RankEvidence(rank=rank, meta=meta, steps=tail[0],
                              exceptions=read_exceptions(meta.folder),
                              fatal=read_fatal(meta.folder), hang=read_rank_hang(meta.folder),
                              stacks=read_stacks(meta.folder))
            if tail[0]:
                ev.last_step, ev.last_step_end_ns = tail[1], tail[2]
            for reason in FR_REASONS:
                fr = read_flight_recorder(meta.folder, reason)
                if fr is not None:
                    ev.flight[reason] = fr[1]
            for reason in ("exception", "peer_failed"):
                if reason in ev.flight:
                    ev.flight[AT_FAILURE] = ev.flight[reason]
                    break
            ranks[rank] = ev
    for e in exits:  # an exit belongs to the rank whose pid it names, on that node
        for ev in ranks.values():
            if ev.meta.pid == e.get("pid") and (ev.meta.node in (None, e["node"])):
                ev.exits.append(e)
    return ranks, hangs


def _step_tail(rank_dir: Path) -> StepTail:
    return read_step_table(rank_dir, ["host_end_ns"]).tail()


def user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame outside libraries (the user's line), else the innermost one."""
    for f in reversed(frames):
        if not any(p in str(f.get("file", "")) for p in LIBRARY_PARTS):
            return f
    return frames[-1] if frames else None


def where(frames: list[dict[str, Any]]) -> str | None:
    f = user_frame(frames)
    return f"{f.get('file')}:{f.get('line')} in {f.get('function')}" if f else None


def in_distributed(frames: list[dict[str, Any]]) -> bool:
    return any("torch/distributed" in str(f.get("file", "")) for f in frames[-6:])


def frames_lines(frames: list[dict[str, Any]], n: int = 6) -> list[str]:
    """The innermost `n` frames of a stack, innermost last, as a traceback shows them (the
    details a hang or crash finding saves for every view to print)."""
    cut = ["  ..."] if len(frames) > n else []
    return cut + [f"  {f.get('file')}:{f.get('line')} in {f.get('function')}"
                  for f in frames[-n:] if isinstance(f, dict)]
