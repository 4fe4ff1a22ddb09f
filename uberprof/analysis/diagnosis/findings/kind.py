"""What a finding kind declares about itself, in its own module, so that nothing else in the
code base names the kind: every view prints what the declaration made and the document saved.

A kind declares:

- `role`: `failure` (the job stopped: ranked first, with no time at stake in the analysed
  steps), `context` (it explains other findings and stakes no time of its own) or `verdict`
  (it costs time in the analysed steps);
- `evidence`: its evidence as one sentence, from the finding's own evidence dict. It is made
  once and saved in the document (`Finding.evidence_sentence`), so the terminal, the HTML
  report, the dashboard and the export print the same words;
- `details`: supporting lines a reader checks the verdict with (a stuck rank's stack, a
  collective mismatch), saved as `Finding.details`; none for most kinds;
- `change`: the what-if change that fixing it amounts to (`whatif_changes.Change`), or None and
  the reason there is none. The projected gain of every finding comes from here (`gains.py`),
  and a finding without one is ranked by its own time at stake on the same scale;
- `page`: the dashboard page where it is looked at in detail;
- `remedy_from`: the name in `causes.py` its remedy is taken from (the one home of labels and
  remedies; checked to exist by tests/unit/test_finding_kinds.py).

To add a kind: declare it in its producer's module (`KINDS = (MY_KIND,)`), register the
producer in `findings.PRODUCERS`, write its remedy in `causes.py` and its section in
docs/findings.md. No view changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.diagnosis.whatif_changes import Change

__all__ = ["CONTEXT", "FAILURE", "VERDICT", "ChangeOf", "FindingKind", "Role", "always",
           "failure_kind", "no_change", "no_details"]

Role = Literal["failure", "context", "verdict"]
FAILURE: Role = "failure"
CONTEXT: Role = "context"
VERDICT: Role = "verdict"

# fixing the finding as a what-if change, or None and why there is none
ChangeOf = Callable[[Finding], tuple[Change | None, str]]


def no_change(why: str) -> ChangeOf:
    """A kind that no what-if change models, with the reason every such finding states."""
    return lambda f: (None, why)


def always(change: Change) -> ChangeOf:
    """A kind whose every finding is fixed by the same change."""
    return lambda f: (change, "")


def no_details(f: Finding) -> list[str]:
    """Most kinds say all they have in their evidence sentence."""
    return []


@dataclass(frozen=True)
class FindingKind:
    """One finding kind's declaration (module docstring)."""

    name: str
    role: Role
    evidence: Callable[[Finding], str]
    change: ChangeOf
    page: str = "/"
    remedy_from: str = ""
    details: Callable[[Finding], list[str]] = no_details
    summary: str = ""  # what it means, in a phrase (docs/findings.md has its section)
    whatif: str = ""  # the change in words, for the docs; "" where `change` says why none

    def whatif_words(self) -> str:
        """What fixing it is in the replay, or "none: <why>" (docs/findings.md's table)."""
        if self.whatif:
            return self.whatif
        _, why = self.change(Finding(self.name, "low", "", [], [], None, 0.0, {}, ""))
        return f"none: {why}"

    def declare(self, f: Finding) -> Finding:
        """Stamp `f` with what this kind declares: its role, page, evidence sentence and
        details (saved with it, printed by every view)."""
        f.role, f.page = self.role, self.page
        f.evidence_sentence, f.details = self.evidence(f), self.details(f)
        return f


def failure_kind(name: str, evidence: Callable[[Finding], str],
                 details: Callable[[Finding], list[str]], remedy_from: str,
                 summary: str) -> FindingKind:
    """A kind of job that stopped (hang, crash): ranked first, shown on the overview, and no
    step to replay without it."""
    return FindingKind(name, FAILURE, evidence,
                       no_change("a job that stops: there is no step to replay without it"),
                       remedy_from=remedy_from, details=details, summary=summary)
