"""The report's "top operators" and "top kernels" sections: the views users had in TensorBoard's
profiler plugin, printed from what the diagnosis saved (`run.operators`, docs/json.md) and
nothing for a saved report that has none. Short on purpose: the top few by self time (kernels by
time, communication kernels apart); `--json` and `--html` have the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from uberprof.units import fmt_num, shorten

__all__ = ["TOP_ROWS", "kernel_label", "render_operators"]

TOP_ROWS = 8
PrintTable = Callable[[Console, Table], None]


def render_operators(run: dict[str, Any], console: Console, print_table: PrintTable) -> None:
    """Print the top operators, then (device runs) the top kernels and communication kernels."""
    ops = run["operators"] or {}
    if not ops.get("operators") and not ops.get("kernels") and not ops.get("comm_kernels"):
        return
    _host(ops, console, print_table)
    _device(ops, "kernels", "top kernels", console, print_table)
    _device(ops, "comm_kernels", "communication kernels", console, print_table)
    device = "dev%: of device time; " if ops.get("device_time_ms") is not None else ""
    console.print(f"[dim]over {ops.get('rank_steps')} analysed rank-step(s) of "
                  f"{ops.get('ranks')} rank(s), {_num(ops.get('step_time_ms'))} ms; step%: of "
                  f"that time; {device}per step: min-max over ranks (the rank of the max); "
                  "grouped by name, self time as torch.profiler's key_averages() "
                  "(docs/operators.md)[/dim]")
    console.print()


def _num(v: Any, digits: int = 1) -> str:
    return fmt_num(v, digits, missing="-")


def _spread(s: dict[str, Any] | None, ranks: int) -> str:
    """"1.2-3.4 r3": per-step min and max over ranks, with the rank of the max."""
    if not s or ranks < 2:
        return _num((s or {}).get("max"), 2)
    return f"{_num(s.get('min'), 2)}-{_num(s.get('max'), 2)} r{s.get('max_rank')}"


def kernel_label(name: str, n: int = 64) -> str:
    """A kernel's name as a table shows it: without the `void ` and the parameter list that
    C++ demangling adds (the template arguments, which tell kernels apart, stay), cut to `n`."""
    label = name[5:] if name.startswith("void ") else name
    if label.endswith(")"):
        depth = 0
        for i in range(len(label) - 1, 0, -1):
            depth += {")": 1, "(": -1}.get(label[i], 0)
            if depth == 0:
                label = label[:i]
                break
    return shorten(label, n)


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(show_edge=False, header_style="bold", pad_edge=False, title=title,
                  title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right", no_wrap=True)
    return table


def _more(total: int | None, shown: int) -> str:
    return f" ({shown} of {total}; the rest: --json)" if total and total > shown else ""


def _host(ops: dict[str, Any], console: Console, print_table: PrintTable) -> None:
    rows = (ops.get("operators") or [])[:TOP_ROWS]
    if not rows:
        return
    n_ranks = ops.get("ranks") or 0
    table = _table("top operators by self time" + _more(ops.get("operators_total"), len(rows)),
                   ("operator", "calls", "self ms", "step%", "total ms", "mean µs",
                    "self ms/step"))
    for r in rows:
        table.add_row(shorten(r["name"], 56), str(r["calls"]), _num(r["self_ms"]),
                      _num(r["self_pct"]), _num(r["total_ms"]), _num(r["mean_us"]),
                      _spread(r.get("self_ms_per_step"), n_ranks))
    print_table(console, table)


def _device(ops: dict[str, Any], key: str, title: str, console: Console,
            print_table: PrintTable) -> None:
    limit = TOP_ROWS if key == "kernels" else TOP_ROWS // 2
    rows = (ops.get(key) or [])[:limit]
    if not rows:
        return
    n_ranks = ops.get("ranks") or 0
    table = _table(title + _more(ops.get(f"{key}_total"), len(rows)),
                   ("kernel", "calls", "ms", "dev%", "step%", "mean µs", "ms/step"))
    for r in rows:
        name = kernel_label(r["name"]) + ("" if r["kind"] in ("kernel", "comm_kernel")
                                         else f" [{r['kind']}]")
        table.add_row(name, str(r["calls"]), _num(r["time_ms"]), _num(r["device_pct"]),
                      _num(r["step_pct"]), _num(r["mean_us"]),
                      _spread(r.get("ms_per_step"), n_ranks))
    print_table(console, table)
