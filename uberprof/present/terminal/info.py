"""`uberprof info` on a terminal: the run, its ranks and trace windows, counters, problems."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["render_info"]


def render_info(inv: dict[str, Any], console: Console) -> None:
    """Print an inventory (`uberprof.inventory.inventory`) on `console`."""
    cmd = " ".join(inv["command"] or []) or "?"
    console.print(f"[bold]run[/bold] {inv['run_id']}  [dim]{', '.join(inv['paths'])}[/dim]")
    console.print(f"[bold]command[/bold] {cmd}")
    exit_code = inv["exit_code"]
    status = ("[green]0[/green]" if exit_code == 0 else
              "[yellow]unknown (still running or killed)[/yellow]" if exit_code is None else
              f"[red]{exit_code}[/red]")
    console.print(f"[bold]exit code[/bold] {status}   [bold]duration[/bold] {_duration(inv)}")
    hosts = ", ".join(f"{n['node']} ({n['host']})" for n in inv["nodes"]) or "none recorded"
    console.print(f"[bold]nodes[/bold] {hosts}")
    par = inv.get("parallelism") or {}
    if par.get("summary"):
        console.print(f"[bold]parallelism[/bold] {par['summary']}  [dim](from "
                      f"{par.get('basis') or 'the traces'})[/dim]", highlight=False)

    table = Table(title=None, show_edge=False, header_style="bold")
    for col in ("rank", "host", "device", "steps", "trace windows", "clock offset"):
        table.add_column(col, justify="right" if col in ("rank", "steps") else "left")
    for r in inv["ranks"]:
        windows = ", ".join(_window(w) for w in r["trace_windows"])
        if not windows:
            why = r["trace_disabled_reason"] or (
                "not traced (--trace-ranks)" if not r.get("trace_selected", True) else "none")
            windows = f"[dim]{why}[/dim]"
        steps = "?" if r["steps"] is None else str(r["steps"]) if r["finished"] \
            else f"[yellow]{r['steps']}*[/yellow]"
        table.add_row(str(r["rank"]), r["host"] or "?", _device(r.get("device")), steps, windows,
                      _offset(r.get("clock") or {}))
    console.print(table)
    if inv.get("traced_ranks"):
        console.print(f"[bold]traced ranks[/bold] {inv['traced_ranks']}; the others keep "
                      "their step timeline and Flight Recorder", highlight=False)
    _triggers(inv, console)
    _counters(inv, console)
    if inv["problems"]:
        console.print("[bold red]problems[/bold red]")
        for p in inv["problems"]:
            console.print(f"  - {p}", markup=False, highlight=False)
    else:
        console.print("[green]no problems found[/green]")


def _window(w: dict[str, Any]) -> str:
    """A trace window's steps, and what opened it unless it was the schedule."""
    a, b = w["steps"]
    trigger = w.get("trigger") or "schedule"
    return f"{a}-{b}" if trigger == "schedule" else f"{a}-{b} ({trigger})"


def _triggers(inv: dict[str, Any], console: Console) -> None:
    """Each rise a node's slowdown trigger saw: what rose, and the window it asked for or why
    it asked for none (the budget)."""
    rows = [(n["node"], d) for n in inv["nodes"]
            for d in (n.get("slowdowns") or {}).get("detected", [])]
    apart = [(n["node"], n["slowdowns"]) for n in inv["nodes"]
             if (n.get("slowdowns") or {}).get("shared") is False]
    if not rows and not apart:
        return
    console.print("[bold]triggered windows[/bold]")
    for node, s in apart:
        console.print(f"  {node}: the run directory shows {s.get('ranks_seen')} of the job's "
                      f"{s.get('world_size')} ranks (not shared): a slowdown this node sees "
                      "opens a window on its own ranks only, at steps of its own",
                      markup=False, highlight=False)
    for node, d in rows:
        window = d.get("window") or ["?", "?"]
        if d.get("refused"):
            what = f"no window: {d['refused']}"
        else:
            ranks = d.get("ranks")
            on = "every rank" if ranks is None else f"ranks {','.join(map(str, ranks))}"
            asker = (d.get("asked_by") or {}).get("host")
            what = f"steps {window[0]}-{window[1]} on {on}" + \
                ("" if d.get("requested") else
                 f" (asked by node {asker})" if asker else " (asked by another node)")
        console.print(f"  {node}: {d.get('trigger', 'slowdown')} at step {d.get('step')} "
                      f"({d.get('reason') or d.get('slowdown') or ''}): {what}",
                      markup=False, highlight=False)


def _counters(inv: dict[str, Any], console: Console) -> None:
    """One row per node and source: metrics, devices, samples and the rate they amount to."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in inv["counters"]:
        groups.setdefault((c["node"], c["source"]), []).append(c)
    notes = [(n["node"], note) for n in inv["nodes"] for note in
             ((n.get("counters") or {}).get("notes") or [])]
    notes += [(n["node"], f"this host's counters were sampled by {n['counters']['sampled_by']}")
              for n in inv["nodes"] if (n.get("counters") or {}).get("sampled_by")]
    if not groups:
        off = [n["node"] for n in inv["nodes"] if (n.get("counters") or {}).get("mode") == "none"]
        console.print("[bold]counters[/bold] " + ("off (--counters none)" if off else "none"))
    else:
        table = Table(title=None, show_edge=False, header_style="bold")
        for col in ("node", "source", "metrics", "devices", "samples", "rate"):
            table.add_column(col, justify="left" if col in ("node", "source", "metrics")
                             else "right")
        for (node, source), series in sorted(groups.items()):
            names = [s["metric"] for s in series]
            shown = ", ".join(names[:4]) + (f", … (+{len(names) - 4})" if len(names) > 4 else "")
            per_device = [s["samples"] / max(1, s.get("devices") or 1) for s in series]
            spans = [(s["last_ns"] - s["first_ns"]) / 1e9 for s in series
                     if s.get("first_ns") and s.get("last_ns")]
            span = max(spans, default=0.0)
            rate = f"{(max(per_device) - 1) / span:.2g} Hz" if span > 0 else "-"
            table.add_row(node, source, shown, str(max(s.get("devices") or 0 for s in series)),
                          str(sum(s["samples"] for s in series)), rate)
        console.print("[bold]counters[/bold]")
        console.print(table)
    for node, note in notes:
        console.print(f"  [dim]{node}: {note}[/dim]", highlight=False)


def _duration(inv: dict[str, Any]) -> str:
    if inv["start_ns"] and inv["end_ns"]:
        return f"{(inv['end_ns'] - inv['start_ns']) / 1e9:.1f} s"
    if inv["start_ns"]:
        return "started " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(inv["start_ns"] / 1e9))
    return "?"


def _device(device: dict[str, Any] | None) -> str:
    if not device:
        return "cpu"
    return f"{device.get('name', device.get('type'))} #{device.get('index', '?')}"


def _offset(clock: dict[str, Any]) -> str:
    off, unc = clock.get("offset_to_rank0_ns"), clock.get("offset_uncertainty_ns")
    if off is None:
        return "[dim]shared with host[/dim]" if clock.get("method") == "host-shared" else "-"
    return f"{off / 1e3:+.0f} ± {unc / 1e3:.0f} µs" if unc else f"{off / 1e3:+.0f} µs"
