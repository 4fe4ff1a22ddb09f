"""Click parameter types shared by the commands: a step range and a list of ranks, so that every
command that takes them accepts the same syntax and says the same thing when it is wrong."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

__all__ = ["INPUT_PATH", "RANK_LIST", "STEP_RANGE", "FiniteRange", "InputPath", "RankList", "StepRange", "parse_ranks",
           "parse_steps"]


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """`A-B` (inclusive) or `N` -> (A, B); raises click.BadParameter."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m:
        raise click.BadParameter(f"{text!r}: use A-B or N, such as 10-12")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) is not None else lo
    if hi < lo:
        raise click.BadParameter(f"{text!r}: the range ends before it starts")
    return lo, hi


def parse_ranks(text: str | None) -> set[int] | None:
    """`0,2,4-7` -> {0, 2, 4, 5, 6, 7}; raises click.BadParameter."""
    if text is None:
        return None
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo or lo < 0:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                r = int(part)
                if r < 0:
                    raise ValueError
                out.add(r)
    except ValueError:
        raise click.BadParameter(f"{text!r}: use a list such as 0,2,4-7") from None
    if not out:
        raise click.BadParameter("no rank given")
    return out


_SIZE_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9,
               "GB": 10**9, "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
               "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """`500MB`, `5GB`, `2GiB`, `1.5G`, `1000000` (bytes): a size in bytes, at least 0."""
    number = text.strip()
    digits = number.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = number[len(digits):].strip().upper()
    try:
        value = float(digits)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a size (e.g. 500MB, 5GB)") from None
    if unit not in _SIZE_UNITS or not value >= 0 or value == float("inf"):
        raise click.BadParameter(f"{text!r} is not a size (e.g. 500MB, 5GB)")
    return int(value * _SIZE_UNITS[unit])


class _Parsed(click.ParamType):
    """A parameter whose text one of the parsers above turns into a value."""

    parser: Callable[[str], Any]

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # already converted (a default, or a second pass)
        try:
            return type(self).parser(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


class StepRange(_Parsed):
    """`--steps A-B` or `--steps N`: an inclusive range of steps, as (A, B)."""

    name = "A-B"
    parser = staticmethod(parse_steps)


class RankList(_Parsed):
    """`--ranks 0,2,4-7`: a set of ranks."""

    name = "LIST"
    parser = staticmethod(parse_ranks)


class ByteSize(_Parsed):
    """`--trace-disk-budget 5GB`: a size, as bytes."""

    name = "SIZE"
    parser = staticmethod(parse_size)


STEP_RANGE = StepRange()
BYTE_SIZE = ByteSize()
RANK_LIST = RankList()


class FiniteRange(click.FloatRange):
    """A float within a range that is also a number: click's FloatRange lets `nan` through
    (every comparison with it is false), and `--hang-timeout nan` would stop a healthy job."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if out != out or out in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return out


class InputPath(click.Path):
    """A run directory, a folder of traces or one trace file: a file that cannot be a trace
    (a corrupt gzip, a text file) is refused with its name and why, before anything is read or
    written beside it."""

    def __init__(self) -> None:
        super().__init__(exists=True, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        path = super().convert(value, param, ctx)
        if Path(path).is_file():
            from uberprof.ingest.gz import not_a_trace

            why = not_a_trace(path)
            if why is not None:
                self.fail(f"{path}: {why}", param, ctx)
        return path


INPUT_PATH = InputPath()
