"""`uberprof watch`: a run followed in the terminal (rich Live), for people on SSH.

Per rank the last step time, the median so far, data wait, lateness at the collectives (from a
saved diagnosis), GPU utilisation and SM clock (from the NVML counters); above them whether the
job runs; below, the straggler and data-stall indications of the step timelines and the
findings. Refreshes every `interval` seconds, reading only what the job
appended (`uberprof.rundir.follow`); stops when the job ends, or on q / Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from uberprof.analysis.read import live_signals, saved_findings
from uberprof.rundir.follow import LiveState, RunFollower

if TYPE_CHECKING:
    from uberprof.analysis.read import SavedFindings

MAX_ROWS = 32  # ranks shown; the slowest first when there are more


def _ms(ns: float | None) -> str:
    return "–" if ns is None else f"{ns / 1e6:,.1f}"


def live_notes(follower: RunFollower) -> list[str]:
    """What the step timelines already show, before any diagnosis, or once the job ended
    the saved diagnosis's straggler verdict: `uberprof.analysis.read.live_signals`, the same
    as the live dashboard's, each with where it comes from."""
    return [f"{s.title}  ({s.source})" for s in live_signals(follower)]


def render(state: LiveState, saved: SavedFindings | None, title: str,
           following: bool = True, notes: list[str] | None = None) -> Group:
    """The whole screen for one look at the run."""
    style = "bold green" if state.running else "bold yellow" if state.ended else "bold"
    head = Text.assemble((state.status_line(), style), (f"  {title}", "bold"))
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("rank", "steps", "last ms", "median ms", "data wait ms", "GPU ms",
                "late ms", "GPU %", "SM MHz"):
        table.add_column(col, justify="right")
    ranks = state.ranks
    if len(ranks) > MAX_ROWS:
        ranks = sorted(ranks, key=lambda r: -(r.median_ns or 0))[:MAX_ROWS]
    lateness = saved.lateness_ns if saved is not None else {}
    for r in ranks:
        clock = "–" if r.sm_clock_mhz is None else f"{r.sm_clock_mhz:,.0f}" + (
            f"/{r.sm_clock_max_mhz:,.0f}" if r.sm_clock_max_mhz else "")
        table.add_row(str(r.rank), str(r.steps), _ms(r.last_ns), _ms(r.median_ns),
                      _ms(r.data_wait_ns), _ms(r.gpu_time_ns), _ms(lateness.get(r.rank)),
                      "–" if r.gpu_util is None else f"{r.gpu_util:.0f}", clock)
    parts: list = [head]
    if saved is not None and saved.parallelism:
        parts.append(Text(f"parallelism: {saved.parallelism} (saved diagnosis)", "dim"))
    parts.append(table)
    if len(state.ranks) > MAX_ROWS:
        parts.append(Text(f"{MAX_ROWS} slowest of {len(state.ranks)} ranks shown", "dim"))
    parts += [Text("• " + n, "cyan")
              for n in notes or []]
    if saved is not None and saved.findings:
        fresh = saved.fresh_for(state)
        parts.append(Text("findings (saved diagnosis):" if fresh else
                          "findings of an older diagnosis (run `uberprof report` after the "
                          "job ends for the final one):", "bold" if fresh else "dim"))
        parts += [Text(f"  [{f.get('severity', '?')}] {f.get('title', '')}",
                       "" if fresh else "dim") for f in saved.findings[:5]]
    elif state.ended:
        parts.append(Text("job ended: `uberprof report` diagnoses it", "dim"))
    if following and not state.ended:
        parts.append(Text("q or Ctrl-C: quit", "dim"))
    return Group(*parts)


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """A `wait(seconds) -> key or None` that returns early on a key press (stdin in cbreak
    mode while watching, restored after); a plain sleep when stdin is not a terminal."""
    if not sys.stdin.isatty():
        import time

        def sleep(seconds: float) -> str | None:
            time.sleep(seconds)
            return None

        yield sleep
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def wait(seconds: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], seconds)
        return os.read(fd, 1).decode(errors="replace") if ready else None

    try:
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def watch(run: Path, console: Console, interval: float = 2.0, once: bool = False) -> LiveState:
    """Follow `run` until its job ends (or q / Ctrl-C); the last state seen."""
    follower = RunFollower(run)
    title = run.resolve().name
    state = follower.poll()
    saved = saved_findings(run)
    if once:
        console.print(render(state, saved, title, following=False,
                             notes=live_notes(follower)))
        return state
    with _keys() as wait, Live(render(state, saved, title, notes=live_notes(follower)),
                               console=console, auto_refresh=False) as live:
        try:
            while not state.ended:
                key = wait(interval)
                if key in ("q", "Q"):
                    break
                state = follower.poll()
                saved = saved_findings(run)
                live.update(render(state, saved, title, notes=live_notes(follower)),
                            refresh=True)
        except KeyboardInterrupt:
            pass
    return state
