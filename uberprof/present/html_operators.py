"""The HTML report's operator and kernel sections: the same saved values as the terminal's
(`run.operators`, `terminal/operators.py`), every row the document holds, full names on hover;
empty for a report that has none."""

from __future__ import annotations

import html
from typing import Any

from uberprof.present.terminal.operators import kernel_label
from uberprof.units import fmt_num

__all__ = ["operators_html"]


def operators_html(run: dict[str, Any]) -> str:
    """An <h2> section with the top operators, kernels and communication kernels tables."""
    ops = run["operators"] or {}
    parts = [_host_groupings(ops),
             _device(ops.get("kernels") or [], ops.get("kernels_total"), "Kernels"),
             _device(ops.get("comm_kernels") or [], ops.get("comm_kernels_total"),
                     "Communication kernels")]
    if not any(parts):
        return ""
    note = (f"<div class='dim'>Over {ops.get('rank_steps')} analysed rank-steps of "
            f"{ops.get('ranks')} rank(s), {_num(ops.get('step_time_ms'))} ms of step time; "
            f"{html.escape(str(ops.get('basis') or ''))}.</div>")
    return "<h2>Operators and kernels</h2>" + note + "".join(p for p in parts if p)


def _num(v: Any, digits: int = 2) -> str:
    return fmt_num(v, digits, missing="-")


def _spread(s: dict[str, Any] | None) -> list[str]:
    s = s or {}
    return [_num(s.get("min")), _num(s.get("median")), _num(s.get("max")),
            str(s.get("max_rank", "-"))]


def _table(title: str, head: list[str], rows: list[tuple[str, str, list[str]]]) -> str:
    """rows: (label, full name for the hover, cells)."""
    e = html.escape
    th = f"<th class='l'>{e(head[0])}</th>" + "".join(f"<th>{e(h)}</th>" for h in head[1:])
    body = "".join(f"<tr><td class='l' title='{e(full, quote=True)}'>{e(label)}</td>"
                   + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>"
                   for label, full, cells in rows)
    return f"<h3>{e(title)}</h3><table><tr>{th}</tr>{body}</table>"


def _title(what: str, total: int | None, shown: int) -> str:
    return f"{what} (top {shown} of {total})" if total and total > shown else what


# A toggle without script: two radio buttons, and the table of the checked one shown (CSS).
_TOGGLE_CSS = ("<style>.op-by-shapes{display:none}"
               "#opg-shapes:checked~.op-by-shapes{display:block}"
               "#opg-shapes:checked~.op-by-name{display:none}"
               ".opgroup label{margin-right:1em}</style>")


def _host_groupings(ops: dict[str, Any]) -> str:
    """The host operators by name, and, when the trace recorded input shapes, a toggle to the
    same operators by name and input shapes (`operators_by_shapes`)."""
    by_name = _host(ops.get("operators") or [], ops.get("operators_total"))
    shaped = ops.get("operators_by_shapes") or []
    if not by_name or not ops.get("shapes_recorded") or not shaped:
        return by_name
    by_shapes = _host(shaped, ops.get("operators_by_shapes_total"), shapes=True)
    return ("<div class='opgroup'>" + _TOGGLE_CSS
            + "<input type='radio' name='opgroup' id='opg-name' checked>"
              "<label for='opg-name'>by name</label>"
              "<input type='radio' name='opgroup' id='opg-shapes'>"
              "<label for='opg-shapes'>by name and input shapes</label>"
            + f"<div class='op-by-name'>{by_name}</div>"
            + f"<div class='op-by-shapes'>{by_shapes}</div></div>")


def _host(rows: list[dict[str, Any]], total: int | None, shapes: bool = False) -> str:
    if not rows:
        return ""
    if shapes:
        head = ["operator", "input shapes", "calls", "self ms", "self % of step", "total ms",
                "total % of step", "mean µs", "self mean µs", "ranks", "self ms/step min",
                "median", "max", "rank of max"]
        body = [(r["name"], r["name"],
                 [r.get("shapes") or "(not recorded)", str(r["calls"]), _num(r["self_ms"]),
                  _num(r["self_pct"]), _num(r["total_ms"]), _num(r["total_pct"]),
                  _num(r["mean_us"]), _num(r["self_mean_us"]), str(r["ranks"]),
                  *_spread(r.get("self_ms_per_step"))]) for r in rows]
        return _table(_title("Operators by name and input shapes, by self time", total,
                             len(rows)), head, body)
    head = ["operator", "calls", "self ms", "self % of step", "total ms", "total % of step",
            "mean µs", "self mean µs", "ranks", "self ms/step min", "median", "max",
            "rank of max"]
    body = [(r["name"], r["name"],
             [str(r["calls"]), _num(r["self_ms"]), _num(r["self_pct"]), _num(r["total_ms"]),
              _num(r["total_pct"]), _num(r["mean_us"]), _num(r["self_mean_us"]),
              str(r["ranks"]), *_spread(r.get("self_ms_per_step"))]) for r in rows]
    return _table(_title("Operators by self time", total, len(rows)), head, body)


def _device(rows: list[dict[str, Any]], total: int | None, what: str) -> str:
    if not rows:
        return ""
    head = ["kernel", "kind", "calls", "ms", "% of device time", "% of step", "mean µs",
            "ranks", "ms/step min", "median", "max", "rank of max"]
    body = [(kernel_label(r["name"], 96), r["name"],
             [r["kind"], str(r["calls"]), _num(r["time_ms"]), _num(r["device_pct"]),
              _num(r["step_pct"]), _num(r["mean_us"]), str(r["ranks"]),
              *_spread(r.get("ms_per_step"))]) for r in rows]
    return _table(_title(what + " by time", total, len(rows)), head, body)
