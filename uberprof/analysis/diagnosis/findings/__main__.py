"""`python -m uberprof.analysis.diagnosis.findings docs/findings.md`: write the table of finding
kinds, generated from their declarations, into the page (between its markers)."""

from __future__ import annotations

import sys
from pathlib import Path

from uberprof.analysis.diagnosis.findings import with_kinds_table

if __name__ == "__main__":
    page = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/findings.md")
    page.write_text(with_kinds_table(page.read_text()))
    print(f"wrote the kinds table into {page}")
