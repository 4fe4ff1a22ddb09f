"""The dashboard's pages, in the navigation bar's order: (path, title). Apart from `ui.py` (which
re-exports them) so that `uberprof dashboard --help` lists them without importing Dash."""

from __future__ import annotations

__all__ = ["COMPARE_PAGE", "PAGES", "pages_text"]

PAGES = (
    ("/", "Overview"),
    ("/steps", "Steps"),
    ("/stragglers", "Stragglers"),
    ("/gaps", "Gaps"),
    ("/communication", "Communication"),
    ("/parallelism", "Parallelism"),
    ("/operators", "Operators"),
    ("/memory", "Memory"),
    ("/counters", "Counters"),
)
COMPARE_PAGE = ("/compare", "Compare")  # in the bar when a baseline run was given


def pages_text() -> str:
    """The pages as `--help` lists them: "/ (Overview) · /steps · ... and /compare with
    --compare A"."""
    return " · ".join(p if p != "/" else f"/ ({t.lower()})" for p, t in PAGES) + \
        f", and {COMPARE_PAGE[0]} with --compare A"
