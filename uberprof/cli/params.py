"""Click parameter types shared by the commands: a step range and a list of ranks, so that every
command that takes them accepts the same syntax and says the same thing when it is wrong."""

from __future__ import annotations

import re
from typing import Any

import click

__all__ = ["RANK_LIST", "STEP_RANGE", "RankList", "StepRange", "parse_ranks", "parse_steps"]


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


class StepRange(click.ParamType):
    """`--steps A-B` or `--steps N`: an inclusive range of steps, as (A, B)."""

    name = "A-B"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        try:
            out = parse_steps(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)
        assert out is not None
        return out


class RankList(click.ParamType):
    """`--ranks 0,2,4-7`: a set of ranks."""

    name = "LIST"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> set[int]:
        if isinstance(value, set):
            return value
        try:
            out = parse_ranks(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)
        assert out is not None
        return out


STEP_RANGE = StepRange()
RANK_LIST = RankList()
