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
from uberprof.analysis.diagnosis.model import MIN_SHARE, Finding, severity_of
from uberprof.units import fmt_bytes

__all__ = ["KINDS", "bandwidth_findings"]

KINDS = ("bandwidth",)


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
