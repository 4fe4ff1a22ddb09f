"""`uberprof diff` in the terminal: the verdict first, then where the time moved, the operators
that changed most, communication, counters, metadata and findings. Long lists are cut; `--json`
and `--html` have everything."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from uberprof.analysis.diff import Comparison
from uberprof.units import fmt_bytes, fmt_num, shorten

__all__ = ["render_diff"]

TOP_OPS = 8
MAX_RANK_ROWS = 16
COUNTER_CHANGE = 0.05  # counters shown when they differ by this fraction or more
VERDICT_STYLE = {"slower": "bold red", "faster": "bold green"}


def _ms(v: float | None, digits: int = 1, signed: bool = False) -> str:
    """A per-step time in ms as a table cell; `signed` for deltas."""
    if v is None or not signed:
        return fmt_num(v, digits, missing="-")
    return f"{v:+.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.0f}%"


def _bytes(b: int | None) -> str:
    return fmt_bytes(b, missing="-")


def _cut(text: str, n: int = 60) -> str:
    return shorten(text, n)


def _differing(a: str | None, b: str | None, n: int = 50) -> tuple[str, str]:
    """Both texts from shortly before where they first differ (long command lines)."""
    a, b = str(a), str(b)
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    start = max(0, i - 15)
    cut = (lambda s: s) if start == 0 else (lambda s: "…" + s[start:])
    return _cut(cut(a), n), _cut(cut(b), n)


def _side(c: dict[str, Any]) -> str:
    steps = c["steps"]
    span = ("whole trace" if steps == [-1] else f"steps {steps[0]}-{steps[-1]}" if steps
            else "no steps")
    return f"{c['run_id'] or c['path']} ({c['kind']}, {len(c['ranks'])} rank(s), {span})"


def render_diff(c: Comparison, console: Console) -> None:
    """Print the comparison on `console`."""
    doc = c.to_json()
    _headline(doc, console)
    _breakdown(doc, console)
    _ops(doc, console)
    _collectives(doc, console)
    _counters(doc, console)
    _metadata(doc, console)
    _findings(doc, console)


def _headline(doc: dict[str, Any], console: Console) -> None:
    st = doc["step_time_ms"]
    console.print(f"[bold]uberprof diff[/bold]  A: {_side(doc['a'])}", highlight=False)
    console.print(f"               B: {_side(doc['b'])}", highlight=False)
    a, b = st["a"], st["b"]
    ratio = f"x{st['ratio']:.3f}" if st["ratio"] is not None else ""
    console.print(f"step time  A median {_ms(a['median'])} ms (p90 {_ms(a['p90'])})   "
                  f"B median {_ms(b['median'])} ms (p90 {_ms(b['p90'])})   "
                  f"{_ms(st['delta'], signed=True)} ms {ratio}", highlight=False)
    test = st["test"]
    style = VERDICT_STYLE.get(st["verdict"], "bold")
    console.print(f"[{style}]{st['verdict'].upper()}[/{style}]: {test['reason']}",
                  highlight=False)
    console.print(f"[dim]test: {test['name']}, {test['resamples']} resamples, seed "
                  f"{test['seed']}, blocks of {test['block_steps']} step(s), significant only "
                  f"beyond {test['min_change_pct']:g}%; steps: A {test['n_a']}, B "
                  f"{test['n_b']}[/dim]", highlight=False)
    for n in doc["notes"]:
        console.print(f"[yellow]note[/yellow]: {escape(n)}", highlight=False)  # a path's [..]
    common = sorted(set(a["per_rank"]) & set(b["per_rank"]), key=int)
    if 1 < len(common) <= MAX_RANK_ROWS:
        t = Table("rank", "A median", "A p90", "B median", "B p90", "ratio",
                  title="step time per rank (ms)", title_justify="left")
        for r in common:
            ra, rb = a["per_rank"][r], b["per_rank"][r]
            ratio_r = rb["median"] / ra["median"] if ra["median"] and rb["median"] else None
            t.add_row(r, _ms(ra["median"]), _ms(ra["p90"]), _ms(rb["median"]), _ms(rb["p90"]),
                      f"x{ratio_r:.3f}" if ratio_r else "-")
        console.print(t)


def _breakdown(doc: dict[str, Any], console: Console) -> None:
    rows = [r for r in doc["breakdown"] if (r["a_ms"] or 0) or (r["b_ms"] or 0)]
    t = Table("part", "A", "B", "delta", "share", title=(
        "where the time moved (ms per step; share of the "
        f"{_ms(doc['mean_step_delta_ms'], signed=True)} ms change in mean step time)"),
        title_justify="left")
    for r in rows:
        label = r["label"] + ("" if r["device"] else " *")
        t.add_row(label, _ms(r["a_ms"]), _ms(r["b_ms"]), _ms(r["delta_ms"], signed=True),
                  _pct(r["share_pct"]))
    console.print(t)
    console.print("[dim]* inside or beside the device parts (not added to the step)[/dim]")


def _op_table(title: str, rows: list[dict[str, Any]]) -> Table:
    t = Table("kind", "name", "calls A", "calls B", "A ms", "B ms", "delta", "share",
              title=title, title_justify="left")
    for r in rows:
        t.add_row(r["kind"], _cut(r["name"]), _ms(r["a_calls"], 0), _ms(r["b_calls"], 0),
                  _ms(r["a_ms"], 2), _ms(r["b_ms"], 2), _ms(r["delta_ms"], 2, signed=True),
                  _pct(r["share_pct"]))
    return t


def _ops(doc: dict[str, Any], console: Console) -> None:
    ops = doc["ops"]
    worse = [r for r in ops if r["delta_ms"] > 0][:TOP_OPS]
    better = [r for r in ops if r["delta_ms"] < 0][:TOP_OPS]
    if worse:
        console.print(_op_table("operators and kernels that take longer (self time, ms per "
                                "step)", worse))
    if better:
        console.print(_op_table("operators and kernels that take less", better))
    for side, label in (("a", "only in A"), ("b", "only in B")):
        only = [r for r in ops if r["only_in"] == side]
        if only:
            names = ", ".join(_cut(r["name"], 40) for r in only[:6])
            more = f" (+{len(only) - 6} more)" if len(only) > 6 else ""
            console.print(f"{label}: {names}{more}", highlight=False)


def _pair(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str, digits: int = 1) -> str:
    return f"{_ms(a.get(key) if a else None, digits)} / {_ms(b.get(key) if b else None, digits)}"


def _collectives(doc: dict[str, Any], console: Console) -> None:
    rows = doc["collectives"]
    if not rows:
        return
    t = Table("group", "collective", "size", "calls A/B", "time A/B", "busbw Gbit/s A/B",
              "wait A/B", "transfer A/B", "exposed A/B",
              title="communication per collective class (ms per rank and step)",
              title_justify="left")
    for r in rows[:12]:
        a, b = r["a"], r["b"]
        t.add_row(_cut(r["group"], 16), r["collective"], _bytes(r["bytes"]),
                  _pair(a, b, "calls", 0), _pair(a, b, "time_ms"),
                  _pair(a, b, "busbw_gbit_s", 2), _pair(a, b, "wait_ms"),
                  _pair(a, b, "transfer_ms"), _pair(a, b, "exposed_ms"))
    console.print(t)


def _counters(doc: dict[str, Any], console: Console) -> None:
    rows = [r for r in doc["counters"]
            if r["ratio"] is not None and abs(r["ratio"] - 1) >= COUNTER_CHANGE]
    if not doc["counters"]:
        return
    if not rows:
        console.print(f"counters: none of {len(doc['counters'])} differs by "
                      f"{COUNTER_CHANGE:.0%} or more", highlight=False)
        return
    t = Table("source", "metric", "unit", "A", "B", "ratio",
              title="counters that differ (mean over the compared steps)", title_justify="left")
    for r in rows:
        t.add_row(r["source"], r["metric"], r["unit"] or "", f"{r['a']:.4g}", f"{r['b']:.4g}",
                  f"x{r['ratio']:.2f}")
    console.print(t)


def _metadata(doc: dict[str, Any], console: Console) -> None:
    rows = doc["metadata_changes"]
    if not rows:
        console.print("run metadata: nothing differs", highlight=False)
        return
    console.print("[bold]run metadata that differs[/bold]")
    for r in rows[:20]:
        va, vb = _differing(r["a"], r["b"])
        console.print(f"  {r['key']}: {va} -> {vb}",
                      highlight=False, markup=False)


def _findings(doc: dict[str, Any], console: Console) -> None:
    f = doc["findings"]
    if not any(f.values()):
        console.print("findings: none in either run", highlight=False)
        return
    console.print("[bold]findings[/bold] (time at stake, ms per step)")
    for r in f["new"]:
        console.print(f"  [red]new[/red]      {_ms(r['b_ms'])}  {r['title']}", highlight=False)
    for r in f["gone"]:
        console.print(f"  [green]gone[/green]     {_ms(r['a_ms'])}  {r['title']}",
                      highlight=False)
    for r in f["changed"]:
        console.print(f"  changed  {_ms(r['a_ms'])} -> {_ms(r['b_ms'])}  {r['title']}",
                      highlight=False)
