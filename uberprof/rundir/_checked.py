"""Field checks for the JSON files of a run: a value of the wrong type reads as absent.

Metadata files may be cut off, hand-edited or written by another version; readers take what is
well-formed and never trust a type.
"""

from __future__ import annotations

from typing import Any


def as_int(v: Any, lo: int = -(1 << 63), hi: int = 1 << 63) -> int | None:
    """`v` when it is an int (not a bool) with lo <= v < hi, else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi else None


def as_str(v: Any) -> str | None:
    """`v` when it is a non-empty string, else None."""
    return v if isinstance(v, str) and v else None


def as_dict(v: Any) -> dict[str, Any]:
    """`v` when it is a JSON object, else {}."""
    return v if isinstance(v, dict) else {}
