"""Two `RunProfile`s in, one `Comparison` out: a pure function, shared by `uberprof diff`'s
terminal and HTML views (and a dashboard page later), with `to_json()` for `--json`.

Every number is a per-step average (ms per step), so runs whose ranks or steps do not line up
compare all the same; `notes` says when they did not. Shares (`share_pct`) are of the change in
*mean* step time, so that the breakdown's device parts add up to it; the headline's verdict is
about the *median* (see `stats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from uberprof.analysis.diff.metadata import JOB_KEYS
from uberprof.analysis.diff.profiles import BREAKDOWN_PARTS, RunProfile
from uberprof.analysis.diff.stats import (
    DEFAULT_MIN_CHANGE_PCT,
    ShiftTest,
    median_ratio_test,
    quantile,
)

__all__ = ["SCHEMA_VERSION", "Comparison", "compare"]

SCHEMA_VERSION = 1


def _ms(ns: float | None, digits: int = 3) -> float | None:
    return None if ns is None else round(ns / 1e6, digits)


def _share(delta_ns: float | None, total_ns: float | None) -> float | None:
    """Percent of the change in mean step time (None when that change is below 1 µs)."""
    if delta_ns is None or total_ns is None or abs(total_ns) < 1e3:
        return None
    return round(100 * delta_ns / total_ns, 1)


def _dist(values: list[float]) -> dict[str, Any]:
    return {"median": _ms(quantile(values, 0.5)), "p90": _ms(quantile(values, 0.9)),
            "steps": len(values)}


@dataclass
class Comparison:
    """What changed from run A to run B (see `to_json` for the document)."""

    a: RunProfile
    b: RunProfile
    test: ShiftTest
    step_delta_ns: float | None  # mean step time, B - A
    breakdown: list[dict[str, Any]]
    ops: list[dict[str, Any]]
    collectives: list[dict[str, Any]]
    counters: list[dict[str, Any]]
    metadata_changes: list[dict[str, Any]]
    findings: dict[str, list[dict[str, Any]]]
    notes: list[str] = field(default_factory=list)
    job_changes: list[dict[str, Any]] = field(default_factory=list)  # under the job (JOB_KEYS)

    def step_time(self) -> dict[str, Any]:
        a, b = self.a, self.b
        sa, sb = _dist(a.step_ns), _dist(b.step_ns)
        for side, prof in ((sa, a), (sb, b)):
            side["mean"] = _ms(prof.step_mean_ns)
            side["per_rank"] = {str(r): _dist(v) for r, v in sorted(prof.rank_step_ns.items())}
        delta = None if sa["median"] is None or sb["median"] is None else \
            round(sb["median"] - sa["median"], 3)
        return {"a": sa, "b": sb, "delta": delta,
                "ratio": round(self.test.ratio, 4) if self.test.ratio is not None else None,
                "significant": self.test.significant, "verdict": self.test.verdict,
                "test": self.test.as_dict()}

    def to_json(self) -> dict[str, Any]:
        """The `uberprof diff --json` document (times in ms per step)."""
        return {"schema_version": SCHEMA_VERSION, "a": self.a.describe(),
                "b": self.b.describe(), "notes": self.notes, "step_time_ms": self.step_time(),
                "mean_step_delta_ms": _ms(self.step_delta_ns), "breakdown": self.breakdown,
                "ops": self.ops, "collectives": self.collectives, "counters": self.counters,
                "metadata_changes": self.metadata_changes, "findings": self.findings,
                "job_changes": self.job_changes}


def compare(a: RunProfile, b: RunProfile, min_change_pct: float = DEFAULT_MIN_CHANGE_PCT,
            seed: int = 0) -> Comparison:
    """Compare run B against run A (A is the baseline). Findings are matched by kind, cause
    and (bandwidth findings) collective class; their `a_ms`/`b_ms` are time at stake per
    analysed step."""
    test = median_ratio_test(a.step_ns, b.step_ns, min_change_pct=min_change_pct, seed=seed)
    delta = None if a.step_mean_ns is None or b.step_mean_ns is None else \
        b.step_mean_ns - a.step_mean_ns
    return Comparison(a=a, b=b, test=test, step_delta_ns=delta,
                      breakdown=_breakdown(a, b, delta), ops=_ops(a, b, delta),
                      collectives=_collectives(a, b), counters=_counters(a, b),
                      metadata_changes=_metadata(a, b), findings=_findings(a, b),
                      notes=_under_the_job(a, b) + _line_up(a, b), job_changes=job_changes(a, b))


def job_changes(a: RunProfile, b: RunProfile) -> list[dict[str, Any]]:
    """What changed under the job from A to B, in `JOB_KEYS`' order: the GPU model and count,
    world size, hosts, parallelism, PyTorch/CUDA/NCCL versions. A key one side does not say
    (a trace without a host name, a header without versions) is not a change."""
    out = []
    for k, words in JOB_KEYS.items():
        va, vb = a.metadata.get(k), b.metadata.get(k)
        if va is None or vb is None or va == vb or (k == "host_count" and "0" in (va, vb)):
            continue
        out.append({"key": k, "what": words, "a": va, "b": vb})
    return out


def _under_the_job(a: RunProfile, b: RunProfile) -> list[str]:
    """The first note: what changed under the job, before any time is attributed to an
    operator (the time below moved with it)."""
    changes = job_changes(a, b)
    if not changes:
        return []
    return ["under the job: " + "; ".join(f"{c['what']} {_value(c['key'], c['a'])} -> "
                                          f"{_value(c['key'], c['b'])}" for c in changes)
            + " (the time below moved with these as well as with the code)"]


def _value(key: str, v: str) -> str:
    if key.endswith("_bytes"):
        try:
            return ", ".join(f"{int(x) / 2**30:.1f} GiB" for x in v.split(", "))
        except ValueError:
            return v
    return v


def _line_up(a: RunProfile, b: RunProfile) -> list[str]:
    notes = [f"A: {n}" for n in a.notes] + [f"B: {n}" for n in b.notes]
    if a.world_size != b.world_size or a.ranks != b.ranks:
        notes.append(f"ranks differ (A: {len(a.ranks)} of world {a.world_size}, B: "
                     f"{len(b.ranks)} of world {b.world_size}): per-step averages over each "
                     "run's own ranks are compared")
    if a.steps != b.steps:
        notes.append(f"analysed steps differ (A: {_span(a.steps)}, B: {_span(b.steps)}): "
                     "per-step averages are compared")
    return notes


def _span(steps: list[int]) -> str:
    if steps == [-1]:
        return "whole trace, no step marks"
    return f"{len(steps)} step(s) {steps[0]}-{steps[-1]}" if steps else "none"


def _delta_row(a_ns: float | None, b_ns: float | None, total: float | None) -> dict[str, Any]:
    d = None if a_ns is None or b_ns is None else b_ns - a_ns
    return {"a_ms": _ms(a_ns), "b_ms": _ms(b_ns), "delta_ms": _ms(d), "share_pct": _share(d, total)}


def _by_delta(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: -abs(r.get("delta_ms") or 0.0))


def _breakdown(a: RunProfile, b: RunProfile, total: float | None) -> list[dict[str, Any]]:
    rows = [{"part": key, "label": label, "device": device,
             **_delta_row(a.breakdown_ns.get(key), b.breakdown_ns.get(key), total)}
            for key, label, device in BREAKDOWN_PARTS]
    return _by_delta(rows)


def _ops(a: RunProfile, b: RunProfile, total: float | None) -> list[dict[str, Any]]:
    rows = []
    for key in a.ops.keys() | b.ops.keys():
        oa, ob = a.ops.get(key), b.ops.get(key)
        only = "a" if ob is None else "b" if oa is None else None
        rows.append({
            "kind": key[0], "name": key[1],
            **_delta_row(oa.self_ns if oa else 0.0, ob.self_ns if ob else 0.0, total),
            "a_calls": round(oa.calls, 3) if oa else 0.0,
            "b_calls": round(ob.calls, 3) if ob else 0.0,
            "a_incl_ms": _ms(oa.incl_ns) if oa else 0.0,
            "b_incl_ms": _ms(ob.incl_ns) if ob else 0.0,
            "only_in": only})
    return sorted(rows, key=lambda r: (-abs(r["delta_ms"]), r["kind"], r["name"]))


def _coll_side(st: Any) -> dict[str, Any] | None:
    if st is None:
        return None
    return {"calls": round(st.calls, 3), "time_ms": _ms(st.time_ns),
            "busbw_gbit_s": round(st.busbw_Bps * 8 / 1e9, 3) if st.busbw_Bps else None,
            "wait_ms": _ms(st.wait_ns), "transfer_ms": _ms(st.transfer_ns),
            "exposed_ms": _ms(st.exposed_ns)}


def _collectives(a: RunProfile, b: RunProfile) -> list[dict[str, Any]]:
    rows = []
    for key in a.collectives.keys() | b.collectives.keys():
        ca, cb = a.collectives.get(key), b.collectives.get(key)
        ta = ca.time_ns if ca else 0.0
        tb = cb.time_ns if cb else 0.0
        rows.append({"group": key[0], "collective": key[1],
                     "bytes": None if key[2] < 0 else key[2],
                     "a": _coll_side(ca), "b": _coll_side(cb), "delta_ms": _ms(tb - ta),
                     "only_in": "a" if cb is None else "b" if ca is None else None})
    return sorted(rows, key=lambda r: (-abs(r["delta_ms"]), r["group"], r["collective"],
                                       r["bytes"] or -1))


def _counters(a: RunProfile, b: RunProfile) -> list[dict[str, Any]]:
    rows = []
    for key in sorted(a.counters.keys() & b.counters.keys()):
        ca, cb = a.counters[key], b.counters[key]
        rows.append({"source": key[0], "metric": key[1], "unit": ca.unit or cb.unit,
                     "a": round(ca.mean, 4), "b": round(cb.mean, 4),
                     "delta": round(cb.mean - ca.mean, 4),
                     "ratio": round(cb.mean / ca.mean, 4) if ca.mean else None})
    return rows


def _metadata(a: RunProfile, b: RunProfile) -> list[dict[str, Any]]:
    return [{"key": k, "a": a.metadata.get(k), "b": b.metadata.get(k)}
            for k in sorted(a.metadata.keys() | b.metadata.keys())
            if a.metadata.get(k) != b.metadata.get(k)]


def _finding_key(f: dict[str, Any]) -> tuple[Any, ...]:
    ev = f.get("evidence") or {}
    return (f["kind"], f.get("cause"), ev.get("group"), ev.get("collective"), ev.get("bytes"))


def _findings(a: RunProfile, b: RunProfile) -> dict[str, list[dict[str, Any]]]:
    fa = {_finding_key(f): f for f in a.findings}
    fb = {_finding_key(f): f for f in b.findings}

    def row(f: dict[str, Any], ms_a: float | None, ms_b: float | None) -> dict[str, Any]:
        return {"kind": f["kind"], "cause": f.get("cause"), "title": f["title"],
                "a_ms": ms_a, "b_ms": ms_b,
                "delta_ms": None if ms_a is None or ms_b is None else round(ms_b - ms_a, 3),
                "a_severity": fa[_finding_key(f)]["severity"] if _finding_key(f) in fa else None,
                "b_severity": fb[_finding_key(f)]["severity"] if _finding_key(f) in fb else None}

    new = [row(f, None, f["ms_per_step"]) for k, f in fb.items() if k not in fa]
    gone = [row(f, f["ms_per_step"], None) for k, f in fa.items() if k not in fb]
    changed = [row(fb[k], fa[k]["ms_per_step"], fb[k]["ms_per_step"])
               for k in fa.keys() & fb.keys()]
    return {"new": sorted(new, key=lambda r: -r["b_ms"]),
            "gone": sorted(gone, key=lambda r: -r["a_ms"]),
            "changed": _by_delta(changed)}
