"""JSON values as a trace has them -> int64 column values: pid/tid ids, stream args, the device
stream named in a tid ("stream 7"), integer args.

Kineto writes these as numbers, numeric strings or free text, and the rules for each are per
value; a batch holds only a handful of distinct ones, so each distinct value is converted once and
the result spread by index (falling back to value by value where a dict cannot tell the values
apart). Kept apart from the batch accumulation (columns.py) so that the rules, and the shortcut's
agreement with them, can be read and tested on their own.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

__all__ = ["Coder", "id_column", "int_column", "stream_column", "stream_from_tid"]

_STREAM_TID = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
_EXACT_KEYS = frozenset((int, str, type(None)))


class Coder(dict):  # type: ignore[type-arg]
    """value -> dense code, assigned on first sight."""

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self)
        return code


def id_column(values: list[Any], codes: dict[str, int]) -> np.ndarray:
    """pid/tid as int64: numbers as they are, numeric strings parsed, other strings coded < 0
    (`codes` keeps those codes the same across batches)."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    distinct = _distinct(values)
    if distinct is not None:  # few distinct values ("stream 7" tids): convert each once
        keys, idx = distinct
        return np.array([_id(v, codes) for v in keys], dtype=np.int64)[idx]
    return np.array([_id(v, codes) for v in values], dtype=np.int64)


def _id(v: Any, codes: dict[str, int]) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return codes.setdefault(str(v), -2 - len(codes))


def _distinct(values: list[Any]) -> tuple[list[Any], np.ndarray] | None:
    """The distinct values in order of first sight and each value's index among them; None
    when a dict cannot tell them apart exactly (unhashable values; 1, 1.0 and True are one key,
    so only ints, strings and None qualify)."""
    if not set(map(type, values)) <= _EXACT_KEYS:
        return None
    coder = Coder()
    idx = np.fromiter(map(coder.__getitem__, values), np.int64, len(values))
    return list(coder), idx


def stream_column(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Which events carry a numeric stream arg, and its value (-1 when none)."""
    distinct = _distinct(values)
    if distinct is not None:  # a handful of streams: convert each once
        keys, idx = distinct
        pairs = [_stream(v) for v in keys]
        return (np.array([h for h, _ in pairs], dtype=bool)[idx],
                np.array([v for _, v in pairs], dtype=np.int64)[idx])
    pairs = [_stream(v) for v in values]
    return (np.array([h for h, _ in pairs], dtype=bool).reshape(-1),
            np.array([v for _, v in pairs], dtype=np.int64).reshape(-1))


def _stream(v: Any) -> tuple[bool, int]:
    """(has a stream, the stream or -1)."""
    if type(v) is int:
        return v >= 0, v
    if isinstance(v, str) and v.isdigit():  # "0x0"-style pointers on runtime calls are not
        return True, int(v)
    return False, -1


def stream_from_tid(raw: Any, tid: int) -> int:
    """The stream of device activity without a stream arg (old traces): the number in a tid
    like "stream 7", else the tid itself (0 for a negative code)."""
    n = _stream_in_name(raw) if isinstance(raw, str) else None
    return max(tid, 0) if n is None else n


@functools.lru_cache(maxsize=4096)  # a trace has a few distinct device tids, and many events
def _stream_in_name(raw: str) -> int | None:
    m = _STREAM_TID.search(raw)
    return int(m.group(1)) if m else None


_NONE_AS_MINUS_1: dict[Any, int] = {None: -1}


def int_column(values: list[Any]) -> np.ndarray:
    """Integer args (correlation, external id) as int64, -1 for None; when some value does not
    convert, -1 for every value that is not an int."""
    try:
        # dict.get mapped in C: -1 for None, the value itself otherwise (no Python loop)
        return np.array(list(map(_NONE_AS_MINUS_1.get, values, values)), dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([v if isinstance(v, int) and not isinstance(v, bool) else -1
                         for v in values], dtype=np.int64)
