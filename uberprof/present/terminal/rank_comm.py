"""The report's per-rank communication section: each rank's exposed communication split into
waiting for late peers (the peer it waited for most, and where) and transfer, and what of its
exposed and idle time no finding explains. It prints what the diagnosis saved
(`ranks[].exposed_comm`, `ranks[].accounted`: docs/json.md), nothing of its own.

Why after the rank table: the table says how much each rank loses to exposed communication and
idle time; this says for whom it waits and whether the findings below account for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from uberprof.units import fmt_num

__all__ = ["render_rank_comm", "unexplained_line", "wait_text", "waits_text"]

PrintTable = Callable[[Console, Table], None]
MAX_ROWS = 16  # ranks shown, the most exposed first
SAY_FROM_MS = 0.05  # an unexplained remainder under this is rounding, not said


def _num(v: Any, digits: int = 1) -> str:
    return fmt_num(v, digits, missing="-")


def wait_text(w: dict[str, Any], ms: Callable[[Any], str] = _num) -> str:
    """One of a rank's largest waits (`exposed_comm.top_waits[]`) in words, as every view of
    the per-rank communication table says it: whom, in which collective (and group), how long."""
    who = f"rank {w['peer']}" if w.get("peer") is not None else "peers"
    group = "" if w.get("group") in (None, "default") else f" ({w['group']})"
    return f"{who} in {w['name']}{group} {ms(w['ms'])} ms"


def waits_text(waits: list[dict[str, Any]], ms: Callable[[Any], str] = _num, n: int = 3) -> str:
    """A rank's `n` largest waits in words, "-" when it waited for none."""
    return "; ".join(wait_text(w, ms) for w in waits[:n]) or "-"


def _waits_most(c: dict[str, Any]) -> str:
    return waits_text(c.get("top_waits") or [], n=1)


def _unexplained(x: dict[str, Any], part: str) -> float:
    return float(((x.get("accounted") or {}).get(part) or {}).get("unexplained_ms") or 0.0)


def render_rank_comm(ranks: list[dict[str, Any]], console: Console,
                     print_table: PrintTable) -> None:
    """The table of the ranks with exposed communication, the most exposed first, then the
    line that names what no finding explains."""
    rows = sorted((x for x in ranks if (x.get("exposed_comm") or {}).get("exposed_ms")),
                  key=lambda x: -x["exposed_comm"]["exposed_ms"])
    if rows:
        table = Table(show_edge=False, header_style="bold", pad_edge=False, title_justify="left",
                      title="exposed communication per rank (analysed steps)")
        for col in ("rank", "exposed ms", "waiting ms", "transfer ms", "unmatched ms",
                    "waits most for", "unexplained ms"):
            table.add_column(col, justify="left" if col == "waits most for" else "right",
                             no_wrap=True)
        for x in rows[:MAX_ROWS]:
            c = x["exposed_comm"]
            table.add_row(str(x["rank"]), _num(c["exposed_ms"]), _num(c["wait_ms"]),
                          _num(c["transfer_ms"]), _num(c["unmatched_ms"]), _waits_most(c),
                          _num(_unexplained(x, "exposed_comm")))
        print_table(console, table)
        if len(rows) > MAX_ROWS:
            console.print(f"[dim]{len(rows) - MAX_ROWS} more ranks: see --json or --html[/dim]")
    line = unexplained_line(ranks)
    if line:
        console.print(line, markup=False, highlight=False)
    if rows or line:
        console.print()


def unexplained_line(ranks: list[dict[str, Any]]) -> str:
    """One sentence naming each rank's exposed communication and idle time that no finding
    explains (`ranks[].accounted.*.unexplained_ms`), the largest first; "" when none is."""
    said = []
    for part, words in (("exposed_comm", "exposed communication"), ("idle", "idle")):
        left = sorted(((x["rank"], _unexplained(x, part)) for x in ranks),
                      key=lambda kv: -kv[1])
        left = [(r, v) for r, v in left if v >= SAY_FROM_MS]
        if left:
            said.append(f"{words} " + ", ".join(f"rank {r} {_num(v, 2)} ms"
                                               for r, v in left[:4])
                        + (f" (+{len(left) - 4} ranks)" if len(left) > 4 else ""))
    if not said:
        return ""
    return ("unexplained by any finding (under the findings' thresholds, or in no finding's "
            "scope): " + "; ".join(said))
