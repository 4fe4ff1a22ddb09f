"""The finding producers, one module per kind of problem, and the one list the advisor runs.

The contract, stated once: a producer is a plain function `(facts: Facts) -> list[Finding]`.
It reads the cross-rank facts (`diagnosis/facts.py`) and the findings made before it
(`facts.found`, in the order below), and returns its own, each with evidence that states its
test and strength (`evidence.count_test` or a `Test`), "suspected" when the evidence is thin,
its remedy from `causes.py`, and only the time no earlier finding counts (`caused_by` links the
rest). It computes no shared statistic of its own: those live in the modules beside this
package. The advisor then ranks them and holds the accounting invariant (`advisor.account`).

Each kind declares itself in its producer's module (`kind.FindingKind`: its role, evidence
sentence, what-if change or the reason it has none, dashboard page and remedy), and `produce`
stamps every finding with its declaration, so that no view and no other stage names a kind.

To add a finding: a module here with its `KINDS` (declarations) and producer, its entry in
`PRODUCERS` (after the producers whose findings it links to), its remedy in `causes.py`, its
section in docs/findings.md, and a test on a run that has the problem and one that does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from uberprof.analysis.diagnosis.causes import remedies_table
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings import (
    alltoall,
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
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind, no_change
from uberprof.analysis.diagnosis.model import Finding

__all__ = ["PRODUCERS", "Producer", "declare", "finding_kinds", "kind_of", "produce"]


@dataclass(frozen=True)
class Producer:
    """One registered producer: the finding kinds it makes and the function that makes them."""

    kinds: tuple[FindingKind, ...]
    make: Callable[[Facts], list[Finding]]


PRODUCERS: tuple[Producer, ...] = (
    Producer(failures.KINDS, failures.run_failure_findings),  # a job that stops costs most
    Producer(straggler.KINDS, straggler.straggler_findings),
    Producer(idle.KINDS, idle.idle_findings),  # links idle on the straggler to it
    Producer(pipeline.KINDS, pipeline.pipeline_findings),
    Producer(bandwidth.KINDS, bandwidth.bandwidth_findings),
    # links to the straggler; exposed_comm links its waiting to it
    Producer(alltoall.KINDS, alltoall.alltoall_imbalance_findings),
    # links to both above; on a tensor-parallel-only run tp_exposed_comm holds its time
    Producer(exposed_comm.KINDS,
             tp_comm.unless_tensor_parallel_only(exposed_comm.exposed_comm_findings)),
    Producer(tp_comm.KINDS, tp_comm.tp_exposed_comm_findings),  # links to exposed_comm
    Producer(throttle.KINDS, throttle.throttle_findings),
    Producer(host_cpu.KINDS, host_cpu.host_cpu_findings),  # explains others, stakes no time
)


def finding_kinds() -> tuple[str, ...]:
    """Every finding kind the diagnosis can report, in registry order."""
    return tuple(dict.fromkeys(k.name for p in PRODUCERS for k in p.kinds))


def kind_of(name: str) -> FindingKind:
    """The declaration of kind `name` (read from the registry at each call, so that a kind
    registered later, as tests do, is found). An unknown kind gets a plain verdict's."""
    for p in PRODUCERS:
        for k in p.kinds:
            if k.name == name:
                return k
    return FindingKind(name, VERDICT, lambda f: "",
                       no_change(f"no what-if change models a '{name}' finding"))


def declare(found: list[Finding]) -> list[Finding]:
    """Stamp each finding with its kind's declaration (`FindingKind.declare`)."""
    for f in found:
        kind_of(f.kind).declare(f)
    return found


def produce(facts: Facts) -> list[Finding]:
    """Run every producer in order, each finding stamped with its kind's declaration; each
    producer sees the findings of those before it."""
    for p in PRODUCERS:
        facts.found += declare(p.make(facts))
    return facts.found


KINDS_TABLE_BEGIN = "<!-- generated from the kinds' declarations: python -m " \
    "uberprof.analysis.diagnosis.findings docs/findings.md -->"
KINDS_TABLE_END = "<!-- end of the generated table -->"


def kinds_table() -> str:
    """Every registered kind as its declaration says it, one markdown row each (the table in
    docs/findings.md, which tests/unit/test_finding_kinds.py compares with this)."""
    rows = [("| kind | role | what it is | fixing it, in the what-if replay | dashboard page | "
             "remedy (`causes.py`) |"), "|---|---|---|---|---|---|"]
    for p in PRODUCERS:
        for k in p.kinds:
            rows.append(f"| [`{k.name}`](#{k.name}) | {k.role} | {k.summary} | "
                        f"{k.whatif_words()} | `{k.page}` | `{k.remedy_from}` |")
    return "\n".join(rows)


REMEDIES_TABLE_BEGIN = "<!-- generated from causes.py's remedies: python -m " \
    "uberprof.analysis.diagnosis.findings docs/findings.md -->"
REMEDIES_TABLE_END = "<!-- end of the generated remedies table -->"


def _between(text: str, begin: str, end: str, table: str) -> str:
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"the markers {begin!r} and {end!r} are missing")
    return f"{head}{begin}\n{table}\n{end}{tail}"


def with_kinds_table(text: str) -> str:
    """`text` (docs/findings.md) with the generated tables between their markers replaced: the
    kinds (`kinds_table`) and every remedy with its precondition (`causes.remedies_table`)."""
    text = _between(text, KINDS_TABLE_BEGIN, KINDS_TABLE_END, kinds_table())
    return _between(text, REMEDIES_TABLE_BEGIN, REMEDIES_TABLE_END, remedies_table())
