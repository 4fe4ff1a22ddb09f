"""The finding producers, one module per kind of problem, and the one list the advisor runs.

The contract, stated once: a producer is a plain function `(facts: Facts) -> list[Finding]`.
It reads the cross-rank facts (`diagnosis/facts.py`) and the findings made before it
(`facts.found`, in the order below), and returns its own, each with evidence that states its
test and strength (`evidence.count_test` or a `Test`), "suspected" when the evidence is thin,
its remedy from `causes.py`, and only the time no earlier finding counts (`caused_by` links the
rest). It computes no shared statistic of its own: those live in the modules beside this
package. The advisor then ranks them and holds the accounting invariant (`advisor.account`).

To add a finding: a module here with its `KINDS` and producer, its entry in `PRODUCERS` (after
the producers whose findings it links to), its label and remedy in `causes.py`, its section in
docs/findings.md, and a test on a run that has the problem and one that does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings import (
    bandwidth,
    exposed_comm,
    failures,
    host_cpu,
    idle,
    pipeline,
    straggler,
    throttle,
    tp_comm,
)
from uberprof.analysis.diagnosis.model import Finding

__all__ = ["PRODUCERS", "Producer", "finding_kinds", "produce"]


@dataclass(frozen=True)
class Producer:
    """One registered producer: the finding kinds it makes and the function that makes them."""

    kinds: tuple[str, ...]
    make: Callable[[Facts], list[Finding]]


PRODUCERS: tuple[Producer, ...] = (
    Producer(failures.KINDS, failures.run_failure_findings),  # a job that stops costs most
    Producer(straggler.KINDS, straggler.straggler_findings),
    Producer(idle.KINDS, idle.idle_findings),  # links idle on the straggler to it
    Producer(pipeline.KINDS, pipeline.pipeline_findings),
    Producer(bandwidth.KINDS, bandwidth.bandwidth_findings),
    # links to both above; on a tensor-parallel-only run tp_exposed_comm holds its time
    Producer(exposed_comm.KINDS,
             tp_comm.unless_tensor_parallel_only(exposed_comm.exposed_comm_findings)),
    Producer(tp_comm.KINDS, tp_comm.tp_exposed_comm_findings),  # links to exposed_comm
    Producer(throttle.KINDS, throttle.throttle_findings),
    Producer(host_cpu.KINDS, host_cpu.host_cpu_findings),  # explains others, stakes no time
)


def finding_kinds() -> tuple[str, ...]:
    """Every finding kind the diagnosis can report, in registry order."""
    return tuple(dict.fromkeys(k for p in PRODUCERS for k in p.kinds))


def produce(facts: Facts) -> list[Finding]:
    """Run every producer in order; each sees the findings of those before it."""
    for p in PRODUCERS:
        facts.found += p.make(facts)
    return facts.found
