"""The terminal report: the run, step time and breakdown per rank, then the findings, ranked.

Made to be read in a minute: one header, one table, the findings with their evidence and
remedy, the bandwidth classes, the top operators and kernels, and the longest idle gaps. Long
lists are cut with a pointer to `--json` or `--html`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from uberprof.analysis.diagnosis.causes import GAP_CAUSES, gap_cause
from uberprof.analysis.diagnosis.model import RANKING_RULE, Diagnosis, Finding
from uberprof.analysis.read import MIN_INSTANCES
from uberprof.present.terminal.memory import render_memory
from uberprof.present.terminal.modules import render_memory_timeline, render_modules
from uberprof.present.terminal.operators import render_operators
from uberprof.present.terminal.parallel import render_parallel
from uberprof.present.terminal.rank_comm import render_rank_comm
from uberprof.present.terminal.timeline import timeline_lines
from uberprof.present.terminal.whatif import render_critical_path
from uberprof.rundir import rank_ranges
from uberprof.units import fmt_bytes, fmt_num, shorten

__all__ = ["MAX_RANK_ROWS", "parallelism_line", "render_report", "scope_text"]

MAX_RANK_ROWS = 32
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}


def render_report(d: Diagnosis, console: Console) -> None:
    """Print the whole report on `console`."""
    _header(d, console)
    _ranks(d, console)
    render_rank_comm(d.ranks, console, _print_table)
    _findings(d, console)
    _bandwidth(d, console)
    render_parallel(d.run, console, _print_table)
    render_operators(d.run, console, _print_table)
    render_memory(d.run, console, _print_table)
    render_modules(d.run, console, _print_table)
    render_memory_timeline(d.run, console, _print_table)
    render_critical_path(d.run, console)
    _gaps(d, console)
    problems = d.run["problems"]
    if problems:
        console.print("[bold red]problems[/bold red]")
        for p in problems[:10]:
            console.print(f"  - {p}", markup=False, highlight=False)
        if len(problems) > 10:
            console.print(f"  ... {len(problems) - 10} more (see --json)")


def _print_table(console: Console, table: Table) -> None:
    """A table at its natural width when the output is a file or a pipe (`less`, `> out.txt`):
    cut to the 80 columns rich assumes there, it would lose names and numbers."""
    if console.is_terminal:
        console.print(table)
    else:
        width = console.width
        wide = Measurement.get(console, console.options.update_width(1 << 12), table).maximum
        console.width = max(width, wide)
        try:
            console.print(table)
        finally:
            console.width = width


def _ms(v: float | None, digits: int = 1) -> str:
    return fmt_num(v, digits, missing="-")


def _short(name: Any, n: int = 48) -> str:
    return shorten(name, n, missing="-")


def _of_world(r: dict[str, Any]) -> str:
    """"4", or "3 of 4" when ranks of the world are missing."""
    n = len(r["ranks"])
    return f"{n} of {r['world_size']}" if n < r["world_size"] else str(r["world_size"])


def scope_text(r: dict[str, Any]) -> str:
    """The run's ranks, hosts, backend and device, saying only what the document holds: "2 of
    128 rank(s)" where ranks are missing, "hosts unknown" where no rank's host is known, and
    "backend and device unknown" where no rank was read (the terminal's and the HTML's header)."""
    hosts = r["hosts"] or {}
    known = [h for h in hosts if h != "unknown"]
    if not r["ranks"]:
        return (f"no rank read (world size {r['world_size']})" if r["world_size"] else
                "no rank read") + "; hosts, backend and device unknown"
    where = (f"on {len(known)} host(s)" if known and len(known) == len(hosts) else
             f"on {len(known)} host(s) and hosts unknown for the rest" if known else
             "hosts unknown")
    return f"{_of_world(r)} rank(s) {where}, {r['backend'] or 'backend unknown'} / " \
           f"{r['device_type']}"


def _header(d: Diagnosis, console: Console) -> None:
    r = d.run
    steps = r["analysed_steps"]
    span = ("whole trace (no step annotations)" if steps == [-1] else
            f"steps {steps[0]}-{steps[-1]}" if steps else "no steps")
    title = Text(f"uberprof report  {r['run_id'] or r['path']}", style="bold")
    console.print(title)
    console.print(
        f"{scope_text(r)}; analysed {span} "
        f"({_ms(r['analysed_wall_ms'])} ms wall), median step {_ms(r['step_time_ms'])} ms",
        highlight=False)
    if r["traced_ranks"] is not None:
        console.print(f"traced ranks {rank_ranges(r['traced_ranks']) or 'none'} of "
                      f"{r['world_size']} (--trace-ranks); the others: step times and "
                      "Flight Recorder arrivals only", highlight=False)
    par = parallelism_line(r)
    if par:
        console.print(par, highlight=False)
    for line, lead in timeline_lines(r):
        console.print(line, style="bold yellow" if lead else "yellow", markup=False,
                      highlight=False)
    st = r["step_time"] or {}
    line = _step_time_line(st)
    if line:
        console.print(f"[dim]{line}[/dim]", highlight=False)
    if warmup_line(r):
        console.print(warmup_line(r), highlight=False, markup=False)
    t = (r["straggler_test"] or {}).get("test") or {}
    if t.get("sentence") and (r["straggler_test"] or {}).get("decision") == "none":
        console.print(f"[dim]straggler test: {t['sentence']}[/dim]", highlight=False)
    c = r["collectives"]
    line = (f"collectives: {c.get('matched_instances', 0)} matched instance(s), "
            f"{c.get('unmatched_calls', 0)} unmatched call(s)")
    console.print(line, highlight=False)
    for h in r["clock_alignment"]["hosts"]:
        if h["method"] == "reference" and len(r["hosts"]) <= 1:
            continue
        desc = f"clock {h['host']}: "
        if h["method"] == "reference":
            desc += "reference"
        else:
            desc += f"offset {h['offset_ns'] / 1e3:+.1f} µs"
            if h.get("error_bound_ns") is not None:
                desc += f" ± {h['error_bound_ns'] / 1e3:.0f} µs (error bound: {h['error_bound_basis']})"
            desc += f" ({h['method']}"
            if h.get("residual_ns") is not None:
                desc += (f", median exit spread {h['residual_ns'] / 1e3:.0f} µs after alignment "
                         "(not an error bound)")
            if h.get("online_offset_ns") is not None:
                unc = h.get("online_uncertainty_ns")
                desc += (f"; start-up estimate {h['online_offset_ns'] / 1e3:+.1f}"
                         + (f" ± {unc / 1e3:.0f}" if unc else "") + " µs")
            desc += ")"
        console.print(f"[dim]{desc}[/dim]", highlight=False)
    console.print()


def warmup_line(run: dict[str, Any]) -> str:
    """The warm-up the diagnosis left out, as saved (`run.warmup`): which steps (or, without
    step markers, how much of each trace's start), their wall time and why; "" when none."""
    w = run["warmup"]
    if not w:
        return ""
    parts = []
    if w["steps"]:
        parts.append(f"steps {rank_ranges(w['steps'])} ({_ms(w['ms'])} ms)")
    for r, ms in w["cut_ms"].items():
        parts.append(f"the first {_ms(ms)} ms of rank {r}'s trace (no step markers)")
    return (f"warm-up: {'; '.join(parts)}, left out of every verdict: "
            f"{w['why'] or 'evidence not kept'}")


def parallelism_line(run: dict[str, Any]) -> str:
    """"Parallelism: pipeline (2 stages) x DDP (2)" from the saved reading (`run.parallelism`),
    with each pipeline stage's ranks; "" for a saved diagnosis that has none."""
    p = run["parallelism"] or {}
    if not p.get("summary"):
        return ""
    line = f"Parallelism: {p['summary']}"
    stages: dict[int, list[str]] = {}
    for r, s in (p.get("stage_of") or {}).items():
        stages.setdefault(int(s), []).append(str(r))
    if stages and len(stages) <= 8:
        line += "; stages: " + ", ".join(f"{s}: rank {'/'.join(rs)}"
                                         for s, rs in sorted(stages.items()))
    return line


def _step_time_line(st: dict[str, Any]) -> str:
    """Step time's basis, the profiler's inflation and uberprof's own cost, intervals named."""
    if not st:
        return ""

    def group(g: dict[str, Any], what: str) -> str:
        iv = g.get("interval_ms")
        return (f"{what} {_ms(g.get('median_ms'))} ms over {g.get('steps')} step(s)"
                + (f" (95% interval {_ms(iv[0])}-{_ms(iv[1])})" if iv else ""))

    parts = [group(st.get("traced") or {}, "traced")]
    un = st.get("untraced") or {}
    if un.get("steps"):
        parts.append(group(un, "untraced"))
    if st.get("profiler_inflation"):
        iv = st.get("profiler_inflation_interval")
        parts.append(f"profiler inflation {st['profiler_inflation']}x"
                     + (f" (95% interval {iv[0]}-{iv[1]}x)" if iv else ""))
    if st.get("uberprof_cost_ms"):
        after = (st.get("after_trace") or {}).get("steps_list") or []
        parts.append(f"uberprof's own cost {_ms(st['uberprof_cost_ms'])} ms in step(s) "
                     + ", ".join(map(str, after[:5])) + " (after each trace window)")
    return "step time (longest rank per step): " + "; ".join(parts)


def _ranks(d: Diagnosis, console: Console) -> None:
    if not d.ranks:
        return
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    many_hosts = len(d.run["hosts"]) > 1
    any_gaps = any(x["idle_gaps"]["count"] for x in d.ranks)
    host_w = min(max((len(str(x["host"])) for x in d.ranks), default=4), 12)
    cols = ["rank", *(["host"] if many_hosts else []), "step ms", "comp%", "exp%", "idle%",
            *(["gaps ms"] if any_gaps else []), "late ms", "last"]
    for col in cols:
        wraps = col in ("host", "gaps ms")
        table.add_column(col, justify="left" if wraps else "right", no_wrap=not wraps,
                         overflow="fold" if wraps else "ellipsis",
                         min_width={"host": host_w, "gaps ms": 7}.get(col, len(col)))
    straggler = d.straggler.rank if d.straggler else None
    rows = d.ranks
    if len(rows) > MAX_RANK_ROWS:  # the slowest ranks and the straggler
        keep = sorted(rows, key=lambda x: -(x["step_time_ms"]["median"] or 0))[:MAX_RANK_ROWS]
        if straggler is not None and all(x["rank"] != straggler for x in keep):
            keep[-1] = next(x for x in rows if x["rank"] == straggler)
        rows = sorted(keep, key=lambda x: x["rank"])
    for x in rows:
        b = x["breakdown_pct"]
        g = x["idle_gaps"]["ms_by_cause"]
        gaps = " ".join(f"{gap_cause(k).letter}{v:.0f}" for k, v in g.items() if v) or "-"
        lt = x["lateness_ms"]
        style = "bold red" if x["rank"] == straggler else None
        host = [str(x["host"] or "-")] if many_hosts else []
        table.add_row(str(x["rank"]), *host, _ms(x["step_time_ms"]["median"]),
                      _ms(b["compute"]), _ms(b["exposed_comm"]), _ms(b["idle"]),
                      *([gaps] if any_gaps else []),
                      _ms(lt["median"]),
                      f"{lt['last_in']}/{lt['instances']}" if lt["instances"] else "-",
                      style=style)
    _print_table(console, table)
    letters = ", ".join(f"{c.letter} {c.key}" for c in GAP_CAUSES.values())
    console.print("[dim]step ms: median; comp/exp/idle: compute, exposed communication, idle % "
                  f"of the analysed time; gaps ms: idle gaps by cause ({letters}); late ms: "
                  "median lateness at collectives; last: times it alone arrived last (p90, "
                  "overlap and more: --json, --html)[/dim]")
    if len(d.ranks) > MAX_RANK_ROWS:
        console.print(f"[dim]{len(d.ranks) - MAX_RANK_ROWS} more ranks (the {MAX_RANK_ROWS} "
                      "slowest shown): see --json or --html[/dim]")
    console.print()


def _findings(d: Diagnosis, console: Console) -> None:
    if not d.ranks and not d.findings:  # a hang or crash is reported without traces
        console.print("[bold red]Nothing could be analysed[/bold red]: no rank has a usable "
                      "trace or step timeline (see the problems below).")
        console.print()
        return
    if not d.findings:
        console.print("[bold green]No findings[/bold green]: nothing holds this run back beyond "
                      "the thresholds (no straggler, idle, exposed communication or link limit).")
        console.print()
        return
    console.print(f"[bold]Findings[/bold] ({len(d.findings)}, {RANKING_RULE}; each "
                  "millisecond is counted once)")
    for i, f in enumerate(d.findings, 1):
        _finding(i, f, console)
    both = d.run.get("fix_top_two")
    if isinstance(both, dict) and both.get("sentence"):
        line = Text("Together", style="bold")
        line.append(f": {both['sentence']}")
        console.print(line, highlight=False)
    console.print()


def _finding(i: int, f: Finding, console: Console) -> None:
    share = f.evidence.get("share_pct")
    head = Text(f"{i:>2}. ")
    head.append(f"{f.severity.upper():<6}", style=SEVERITY_STYLE.get(f.severity))
    head.append(f" {f.kind}", style="bold")
    if f.cause:
        head.append(f" ({f.cause})")
    if f.confidence != "confirmed":
        head.append(f" {f.confidence.upper()}", style="italic")
    head.append(f"  {f.stake_words()}" + (f", {share}%" if share else ""))
    console.print(head)
    console.print(f"    {f.title}", markup=False, highlight=False)
    if f.evidence_sentence:  # its kind's words, saved with it (findings/kind.py)
        console.print(f"    [dim]evidence:[/dim] {f.evidence_sentence}", highlight=False)
    for line in f.details:
        console.print(f"    {line}", markup=False, highlight=False)
    test = (f.evidence.get("test") or {}).get("sentence")
    if test:
        console.print(f"    [dim]test:[/dim] {test}", highlight=False)
    if f.caused_by:
        links = "; ".join(f"{c.get('ms')} ms is {c.get('part') or c.get('kind')} (finding "
                          f"{(c['index'] + 1) if c.get('index') is not None else '?'})"
                          for c in f.caused_by)
        console.print(f"    [dim]accounted elsewhere:[/dim] {links}", highlight=False)
    if f.projected_gain:  # diagnosis/gains.py: its remedy replayed on the step graph
        g = f.projected_gain
        lo, hi = g.get("interval_ms") or (None, None)
        line = Text("    ")
        line.append(str(g["sentence"]), style="bold")
        line.append(f" (projected {fmt_num(lo, 1, missing='?')}-{fmt_num(hi, 1, missing='?')}"
                    " ms; uberprof whatif)")
        console.print(line, highlight=False)
        if g.get("note"):
            console.print(f"    [dim]projection:[/dim] {g['note']}", highlight=False)
    if f.projected_gain_why:  # no projection, or one that gains nothing: why (gains.py)
        console.print(f"    [dim]no gain projected:[/dim] {f.projected_gain_why}",
                      highlight=False)
    console.print(f"    [green]→[/green] {f.remedy}", highlight=False)


def _bandwidth(d: Diagnosis, console: Console) -> None:
    classes = d.run["bandwidth"]
    if not classes:
        return
    table = Table(show_edge=False, header_style="bold", pad_edge=False,
                  title="collectives: bandwidth", title_justify="left")
    for col in ("collective", "size", "link", "n", "busbw Gb/s", "peak", "%peak", "exp%",
                "verdict"):
        table.add_column(col, justify="left" if col in ("collective", "link", "verdict")
                         else "right", no_wrap=True)
    for c in classes[:8]:
        table.add_row(c["collective"], fmt_bytes(c["bytes"] or None, missing="-"), c["link"],
                      str(c["instances"]), _ms(c["busbw_gbit_s"], 2),
                      _ms(c["peak_gbit_s"], 2), _ms(c["busbw_of_peak_pct"]),
                      _ms(c["exposed_pct"]),
                      c["verdict"] + ("?" if c.get("confidence") == "suspected" else ""))
    _print_table(console, table)
    console.print("[dim]busbw from the transfer time: first exit - last arrival (waiting for "
                  f"peers excluded); ?: suspected, fewer than {MIN_INSTANCES} instances[/dim]")
    if len(classes) > 8:
        console.print(f"[dim]{len(classes) - 8} more classes: see --json[/dim]")
    console.print()


def _gaps(d: Diagnosis, console: Console) -> None:
    if not d.top_gaps:
        return
    table = Table(show_edge=False, header_style="bold", pad_edge=False,
                  title="longest idle gaps", title_justify="left")
    for col in ("rank", "step", "ms", "cause", "after op", "next op", "host was in"):
        table.add_column(col, justify="right" if col in ("rank", "step", "ms") else "left")
    for g in d.top_gaps[:5]:
        table.add_row(str(g["rank"]), str(g["step"]), f"{g['dur_ns'] / 1e6:.2f}", g["cause"],
                      _short(g.get("before"), 32), _short(g.get("after"), 32),
                      _short(g.get("host"), 40))
    _print_table(console, table)
    console.print()
