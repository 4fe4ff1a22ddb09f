"""Field checks for the JSON files of a run: a value of the wrong type reads as absent.

Metadata files may be cut off, hand-edited or written by another version; readers take what is
well-formed and never trust a type. File names are not trusted either: a POSIX name may hold
bytes that are not UTF-8, which Python keeps as lone surrogates that JSON, Parquet and the
terminal all refuse.
"""

from __future__ import annotations

from typing import Any


def as_int(v: Any, lo: int = -(1 << 63), hi: int = 1 << 63) -> int | None:
    """`v` when it is an int (not a bool) with lo <= v < hi, else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi else None


def as_str(v: Any) -> str | None:
    """`v` when it is a non-empty string that can be stored (valid UTF-8), else None."""
    return v if isinstance(v, str) and v and is_utf8(v) else None


def as_dict(v: Any) -> dict[str, Any]:
    """`v` when it is a JSON object, else {}."""
    return v if isinstance(v, dict) else {}


def is_utf8(name: str) -> bool:
    """Whether a file name (as Python decoded it) is valid UTF-8, and so can be stored."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(name: str | object) -> str:
    """A path or name as it can be printed and stored: bytes that are not UTF-8 as `\\xff`."""
    return str(name).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
