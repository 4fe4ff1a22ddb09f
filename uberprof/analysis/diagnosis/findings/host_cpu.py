"""The `host_cpu` finding: a saturated host, its CPUs busy nearly all the time (CPU and GPU runs).

Read from the node agents' host counters (`cpu.util`, percent of all cores, sampled every ~2 s;
`uberprof.rundir.counters`) over the analysed window, or the whole run when the window holds
fewer than `MIN_SAMPLES` samples. A host is saturated when the median sample is at least
`SATURATED_PCT`; confirmed when at least `MIN_SAMPLES` samples say so, else suspected.

Its time at stake is 0: a saturated CPU slows whatever runs on the host (compute on CPU runs,
launches and data loading on GPU runs), and that time is already counted by the findings that
measured it (a straggler, idle gaps, exposed communication). It is a condition that explains
them, not extra lost time, so it never breaks the accounting invariant.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uberprof.analysis.diagnosis.causes import HOST_CPU
from uberprof.analysis.diagnosis.evidence import Test
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.kind import CONTEXT, FindingKind, no_change
from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.tables.context import RunContext

__all__ = ["KINDS", "MIN_SAMPLES", "SATURATED_PCT", "host_cpu_findings", "saturated_hosts"]



def evidence_sentence(f: Finding) -> str:
    """The host's median and 10th-percentile CPU use, over how many samples of which span."""
    e = f.evidence
    return (f"median {e.get('median_pct')}%, p10 {e.get('p10_pct')}% over "
            f"{e.get('samples')} samples ({e.get('basis')})")


HOST_CPU_KIND = FindingKind(
    "host_cpu", CONTEXT, evidence_sentence,
    no_change("it explains other findings and stakes no time of its own"),
    page="/counters", remedy_from="HOST_CPU",
    summary="a saturated host, which explains the findings it slows")
KINDS = (HOST_CPU_KIND,)
SATURATED_PCT = 90.0
MIN_SAMPLES = 5


def saturated_hosts(ctx: RunContext, window: tuple[int, int] | None
                    ) -> list[dict[str, Any]]:
    """Per node with host counters whose median CPU use is >= SATURATED_PCT: node, host,
    samples, median and p10 (%), the share of samples at or above the threshold, and whether
    the samples are those of the analysed window or of the whole run."""
    if not ctx.is_run_dir:
        return []
    from uberprof.rundir.counters import counter_meta, counter_nodes, counters_table

    out = []
    for node in counter_nodes(ctx.root):
        try:
            util, basis = _samples(ctx, node, window, counters_table)
        except Exception:  # noqa: BLE001 - counters are optional evidence
            continue
        if util.size == 0 or float(np.median(util)) < SATURATED_PCT:
            continue
        host = counter_meta(ctx.root, node).get("host") or node
        out.append({"node": node, "host": host, "samples": int(util.size), "basis": basis,
                    "median_pct": round(float(np.median(util)), 1),
                    "p10_pct": round(float(np.percentile(util, 10)), 1),
                    "saturated_samples_pct": round(100 * float((util >= SATURATED_PCT).mean()),
                                                   1)})
    return out


def _samples(ctx: RunContext, node: str, window: tuple[int, int] | None,
             counters_table: Any) -> tuple[np.ndarray, str]:
    def read(lo: int | None, hi: int | None) -> np.ndarray:
        t = counters_table(ctx.root, node, sources=["host"], metrics=["cpu.util"],
                           start_ns=lo, end_ns=hi, label_ranks=False)
        return np.asarray([v for v in t.column("value").to_pylist() if v is not None],
                          dtype=np.float64)

    if window is not None:
        util = read(*window)
        if util.size >= MIN_SAMPLES:
            return util, "analysed window"
    return read(None, None), "whole run"


def host_cpu_findings(facts: Facts) -> list[Finding]:
    """One `host_cpu` finding per saturated host over the analysed window (see the module
    doc). The remedy is the same on CPU and GPU runs."""
    ctx = facts.ctx
    out = []
    for h in saturated_hosts(ctx, facts.window):
        ranks = sorted(r for r in ctx.rank_ids if ctx.host_of(r) == h["host"])
        confirmed = h["samples"] >= MIN_SAMPLES
        sentence = (f"CPU use on {h['host']}: median {h['median_pct']}% over {h['samples']} "
                    f"samples ({h['basis']}), {h['saturated_samples_pct']}% of them at or above "
                    f"{SATURATED_PCT:.0f}%"
                    + ("" if confirmed else f"; fewer than {MIN_SAMPLES} samples: suspected"))
        test = Test(name="median host CPU use", statistic=f"median {h['median_pct']}%",
                    instances=h["samples"],
                    threshold=f"median >= {SATURATED_PCT:.0f}% over >= {MIN_SAMPLES} samples",
                    sentence=sentence)
        title = (f"Host {h['host']} CPU saturated: median {h['median_pct']}% busy "
                 f"({len(ranks)} rank(s) on it)")
        severity = "high" if h["median_pct"] >= 97 else "medium"
        ev = {**h, "share_pct": 0.0, "test": test.as_dict(),
              "note": "a condition that slows everything on the host; its time is counted by "
                      "the findings that measured it"}
        out.append(Finding("host_cpu", severity, title, ranks, [], HOST_CPU.key, 0.0, ev,
                           HOST_CPU.remedy, confidence="confirmed" if confirmed else
                           "suspected"))
    return out
