"""How numbers look to people: one way to write bytes, milliseconds and percentages.

One place so that a byte count or a duration reads the same in every view. Each helper takes
the text to show for a missing value (`missing`), because the terminal's tables use "-" and the
dashboard "–"; a value that is present is formatted the same everywhere.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fmt_bytes", "fmt_count", "fmt_ms", "fmt_num", "fmt_pct", "ns_to_ms", "shorten"]

_BINARY = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def fmt_bytes(b: float | None, missing: str = "–", spec: str = ".1f") -> str:
    """A size in binary units: 1536 -> '1.5 KiB'; `spec` formats the number above 1 KiB."""
    if b is None:
        return missing
    for unit, f in _BINARY:
        if b >= f:
            return f"{b / f:{spec}} {unit}"
    return f"{int(b)} B"


def fmt_num(v: float | None, digits: int = 1, missing: str = "–", unit: str = "") -> str:
    """A plain number with a fixed number of decimals (table cells), and an optional unit."""
    return missing if v is None else f"{v:.{digits}f}{unit}"


def fmt_ms(v: float | None, digits: int = 1, missing: str = "–") -> str:
    """A duration given in ms, with its unit; from a second on it switches to seconds."""
    if v is None:
        return missing
    if abs(v) >= 1000:
        return f"{v / 1000:.2f} s"
    return f"{v:.{digits}f} ms"


def fmt_pct(v: float | None, digits: int = 1, missing: str = "–") -> str:
    """A percentage given in percent (not a fraction)."""
    return missing if v is None else f"{v:.{digits}f}%"


def fmt_count(n: int | None, missing: str = "–") -> str:
    """A count with thousands separators: 1234567 -> '1,234,567'."""
    return missing if n is None else f"{n:,}"


def shorten(text: Any, n: int = 48, missing: str = "") -> str:
    """`text` cut to `n` characters with an ellipsis (operator names can be very long)."""
    if text is None or text == "":
        return missing
    s = str(text)
    return s if len(s) <= n else s[: n - 1] + "…"


def ns_to_ms(ns: float | None) -> float | None:
    """ns -> ms rounded to the µs, the unit of every duration in the JSON documents."""
    return None if ns is None else round(float(ns) / 1e6, 3)
