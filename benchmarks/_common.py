"""What the benchmark scripts share: the repository on sys.path (they run from a checkout, not
an installed uberprof) and a command line whose help is the script's docstring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["ROOT", "doc_parser"]


def doc_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the docstring's first paragraph, the rest as its epilog."""
    first, _, rest = doc.partition("\n\n")
    return argparse.ArgumentParser(description=first, epilog=rest,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
