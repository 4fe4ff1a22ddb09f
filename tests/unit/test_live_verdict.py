"""`uberprof watch`, the live dashboard and `uberprof report` give the same straggler verdict
on the same steps (issue 29 item 3): once the job ended and a diagnosis was saved, the step
timelines' indication gives way to the diagnosis's verdict (`step_signals.diagnosed`)."""

from __future__ import annotations

from uberprof.analysis.diagnosis.saved import SavedFindings
from uberprof.analysis.diagnosis.step_signals import (
    SOURCE_DIAGNOSIS,
    SOURCE_LIVE,
    Signal,
    diagnosed,
)

HINT = Signal("straggler", 1, "confirmed", "rank 1 is a straggler: the longest CPU time", {})
STALL = Signal("data_stall", 3, "confirmed", "rank 3 waits for data 30% of its step time", {})
NAMED = {"kind": "straggler", "ranks": [2], "confidence": "suspected",
         "title": "Rank 2 may be a straggler (suspected) (compute): last at 9/12 collectives",
         "evidence": {"test": {"sentence": "rank 2 alone arrived last at 9 of 12 ..."}}}
CLEARED = {"rank": 1, "decision": "none",
           "test": {"sentence": "no straggler: rank 1 alone arrived last at 30 of 100 ..."}}


def _saved(findings: list[dict], saved_ns: int, test: dict | None = None) -> SavedFindings:
    return SavedFindings(findings, {}, saved_ns, None, test)


def test_the_saved_diagnosis_straggler_replaces_the_live_indication_after_the_job_ended(
        ) -> None:
    out = diagnosed([HINT, STALL], _saved([NAMED], saved_ns=200), ended_ns=100)
    [s] = [s for s in out if s.kind == "straggler"]
    assert (s.rank, s.confidence, s.title) == (2, "suspected", NAMED["title"])
    assert s.source == SOURCE_DIAGNOSIS and s.test == NAMED["evidence"]["test"]
    assert STALL in out  # the data-stall indication is not the straggler verdict's business


def test_a_straggler_the_diagnosis_cleared_is_said_cleared_with_its_reason() -> None:
    out = diagnosed([HINT, STALL], _saved([], saved_ns=200, test=CLEARED), ended_ns=100)
    [s] = [s for s in out if s.kind == "straggler"]
    assert s.confidence == "none" and s.rank == -1 and s.source == SOURCE_DIAGNOSIS
    assert "hinted at rank 1" in s.title and CLEARED["test"]["sentence"] in s.title
    # nothing hinted, nothing named: nothing to say
    assert diagnosed([STALL], _saved([], saved_ns=200, test=CLEARED), ended_ns=100) == [STALL]


def test_a_running_job_or_an_older_diagnosis_keeps_the_live_indication() -> None:
    older = _saved([NAMED], saved_ns=50)
    assert diagnosed([HINT, STALL], older, ended_ns=100) == [HINT, STALL]
    assert diagnosed([HINT, STALL], _saved([NAMED], saved_ns=200), ended_ns=None) == \
        [HINT, STALL]
    assert diagnosed([HINT], None, ended_ns=100) == [HINT]
    assert HINT.source == SOURCE_LIVE
