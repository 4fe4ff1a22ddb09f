"""`bandwidth` findings: a collective class that is bandwidth-bound or latency-bound on its link.

The classes and their verdicts are `bandwidth.py`'s (busbw from the transfer time after the last
arrival, against the peak of the slowest link the group crosses); a class becomes a finding
when its time is material. Its time at stake is its exposed transfer time.
"""

from __future__ import annotations

from uberprof.analysis.diagnosis.bandwidth import SMALL_MESSAGE_BYTES, BandwidthClass
from uberprof.analysis.diagnosis.causes import LINK_VERDICTS, link_remedy
from uberprof.analysis.diagnosis.evidence import MIN_INSTANCES, Test, trace_more_hint
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind
from uberprof.analysis.diagnosis.model import MIN_SHARE, Finding, severity_of
from uberprof.analysis.diagnosis.whatif_changes import Change
from uberprof.units import fmt_bytes

__all__ = ["KINDS", "bandwidth_findings"]


def evidence_sentence(f: Finding) -> str:
    """Its instances and upper-quartile bus bandwidth (with the clock error's bound), the
    link's peak and source, and how much of its transfer was exposed."""
    e = f.evidence
    bound = e.get("busbw_bound_gbit_s")
    peak = (f"peak {e['peak_gbit_s']} Gbit/s ({e.get('peak_source') or 'source unknown'})"
            if e.get("peak_gbit_s") is not None else "no peak known")
    return (f"{e.get('instances')} instances, upper-quartile busbw {e.get('busbw_gbit_s')} "
            f"Gbit/s" + (f" (clock error bound {bound[0]}-{bound[1] or '∞'})" if bound else "")
            + f", {peak}, "
            f"{e.get('exposed_pct')}% of {e.get('transfer_ms')} ms transfer exposed"
            + (f" ({e['in_collective_ms']} ms in the collective, waiting included)"
               if e.get("in_collective_ms") is not None else ""))


def _change(f: Finding) -> tuple[Change | None, str]:
    ev = f.evidence
    peak, bus, size = ev.get("peak_gbit_s"), ev.get("busbw_gbit_s"), ev.get("bytes")
    if not peak or not bus or not size:
        return None, ("no peak known for its link: nothing to scale its transfers to "
                      "(uberprof calibrate measures one)")
    return Change("link", max(float(peak) / float(bus), 1.0), sizes=(int(size),)), ""


KINDS = (FindingKind("bandwidth", VERDICT, evidence_sentence, _change, page="/communication",
                     summary="a collective class bandwidth- or latency-bound on its link",
                     whatif="its class's transfers at the link's peak (--link-scale)",
                     remedy_from="link_remedy"),)


def bandwidth_findings(facts: Facts) -> list[Finding]:
    """One finding per bandwidth- or latency-bound class whose time is material, with the
    remedy in the words of the run's parallelism."""
    return _bandwidth_findings(facts.classes, facts.wall_ns, facts.parallelism.kinds)


def _bandwidth_findings(classes: list[BandwidthClass], wall_ns: int,
                        kinds: tuple[str, ...] = ()) -> list[Finding]:
    out = []
    for c in classes:
        if c.verdict not in ("bandwidth-bound", "latency-bound") or not wall_ns:
            continue
        if c.t_total_ns / wall_ns < MIN_SHARE / 4:
            continue
        stake = c.exposed_ns
        share = stake / wall_ns
        d = c.as_dict()
        size = fmt_bytes(c.bytes)
        if c.verdict == "bandwidth-bound":
            title = (f"{c.name} of {size} is bandwidth-bound on the {c.link} link "
                     f"({c.link_kind or 'unknown'}): busbw {d['busbw_gbit_s']} Gbit/s = "
                     f"{d['busbw_of_peak_pct']}% of its {d['peak_gbit_s']} Gbit/s peak")
        else:
            peak = f" = {d['busbw_of_peak_pct']}% of the peak" if d["busbw_of_peak_pct"] else ""
            title = (f"{c.name} of {size} is latency-bound on the {c.link} link: busbw "
                     f"{d['busbw_gbit_s']} Gbit/s{peak} over {c.instances} small messages")
        v = LINK_VERDICTS[c.verdict]
        sentence = (f"upper-quartile busbw of {c.instances} instance(s) over {len(c.steps)} "
                    f"step(s), from their transfer time (first exit - last arrival; waiting for "
                    f"peers excluded): {d['busbw_gbit_s']} Gbit/s"
                    + (f" = {d['busbw_of_peak_pct']}% of the {d['peak_gbit_s']} Gbit/s peak "
                       f"({c.peak_source})" if d["busbw_of_peak_pct"] is not None else
                       f", no peak known; {size} messages are latency-bound on any link"))
        if c.confidence == "suspected":
            sentence += (f"; a verdict from {c.instances} instance(s), fewer than "
                         f"{MIN_INSTANCES}: suspected; to confirm, " + trace_more_hint(c.steps))
        test = Test(name="busbw against the link's peak", statistic=f"{d['busbw_gbit_s']} Gbit/s",
                    instances=c.instances,
                    threshold=(f">= 80% of peak bandwidth-bound; < 50% with messages below "
                               f"{fmt_bytes(SMALL_MESSAGE_BYTES)} (or the calibrated half-peak size) "
                               "latency-bound"), sentence=sentence)
        out.append(Finding(v.kind, severity_of(share), title, [], c.steps, c.verdict,
                           stake / 1e6, {**d, "share_pct": round(100 * share, 1),
                                         "test": test.as_dict()}, link_remedy(c.verdict, kinds),
                           confidence=c.confidence))
    return out
