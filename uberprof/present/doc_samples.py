"""The report samples in README.md and docs/report.md, made by the code they show.

Each sample is a block between `<!-- sample: NAME -->` and `<!-- /sample -->` holding a fenced
block of `uberprof report`'s terminal output on a real trace (`SAMPLES`), 110 columns wide and
trimmed the same way every time (`trim`): everything up to the findings' header (less the
command line, the clock offsets and the rank table's legend), then per finding its heading,
its title and what fixing it projects (or why nothing), then "...".
`python -m uberprof.present.doc_samples --write README.md docs/report.md` rewrites them;
`--check` exits 1 when one is stale (tests/unit/test_doc_samples.py runs it).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

__all__ = ["SAMPLES", "regenerate", "render", "trim"]

ROOT = Path(__file__).resolve().parents[2]
# name -> the report's path argument, relative to the repository root (as the docs print it)
SAMPLES = {"trace_filter": "../shared/traces/hta/trace_filter",
           "straggler": "samples/gpu/straggler"}
WIDTH = 110
COMMAND = "python -m uberprof.present.doc_samples --write README.md docs/report.md"
_BLOCK = re.compile(r"(<!-- sample: (\w+) -->\n```\n)(.*?)(```\n<!-- /sample -->)", re.DOTALL)
_KEEP = ("fixing this:", "no gain projected:", "projection:")


def _logical(lines: list[str]) -> list[list[str]]:
    """Rich wraps a long line to column 0: a line that starts with a space begins a logical
    line, one that does not continues the one before."""
    out: list[list[str]] = []
    for ln in lines:
        if out and ln and not ln.startswith(" "):
            out[-1].append(ln)
        else:
            out.append([ln])
    return out


_DROPPED = ("clock ", "step ms: median")  # clock offsets and the rank table's legend


def _drop(lines: list[str]) -> list[str]:
    """`lines` without those from one that starts with `_DROPPED` to the end of its paragraph
    (the header's lines are not indented: a wrapped one cannot be told from the next)."""
    out, dropping = [], False
    for ln in lines:
        dropping = (dropping or ln.startswith(_DROPPED)) and bool(ln.strip())
        if not dropping:
            out.append(ln)
    return out


def trim(text: str) -> str:
    """The report up to its findings' header, then each finding's heading, title and
    projection lines, then "..." (the sections after the findings are left out)."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    lines = _drop(lines[1:] if lines and lines[0].startswith("uberprof report") else lines)
    try:
        head = next(i for i, ln in enumerate(lines) if ln.startswith("Findings ("))
    except StopIteration:
        return "\n".join(lines).strip() + "\n"
    end = head + 1
    while end < len(lines) and not lines[end].startswith(" "):
        end += 1  # the header's own wrapped lines
    out = lines[:end]
    body = []
    for ln in lines[end:]:
        if not ln.strip():
            break
        body.append(ln)
    for group in _logical(body):
        first = group[0]
        if re.match(r"^ ?\d+\. ", first):
            out.append(first)
            title = True
            continue
        stripped = first.strip()
        is_field = stripped.split(":")[0] in ("evidence", "test", "accounted elsewhere") or \
            stripped.startswith("→")
        if title and not is_field and not stripped.startswith(_KEEP):
            out.extend(group)  # the title (and its wrapped lines)
            continue
        title = False
        if stripped.startswith(_KEEP):
            out.extend(group)
    out.append(" ...")
    return "\n".join(out) + "\n"


def render(name: str) -> str:
    """The sample `name`: `uberprof report` on its trace, in the repository root, trimmed."""
    from click.testing import CliRunner

    from uberprof.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        old = Path.cwd()
        try:
            os.chdir(ROOT)
            res = CliRunner(env={"COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"}).invoke(
                main, ["report", SAMPLES[name], "--workers", "1", "--out", tmp])
        finally:
            os.chdir(old)
    if res.exit_code != 0:
        raise RuntimeError(f"sample {name}: {res.output[-2000:]}")
    return trim(res.stdout)


def regenerate(text: str, cache: dict[str, str] | None = None) -> str:
    """`text` with every sample block made again (`cache`: samples already rendered)."""
    cache = {} if cache is None else cache

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in cache:
            cache[name] = render(name)
        return m.group(1) + cache[name] + m.group(4)

    return _BLOCK.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m uberprof.present.doc_samples",
                                description="Regenerate the report samples of the docs.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", nargs="+", type=Path, metavar="MD")
    g.add_argument("--check", nargs="+", type=Path, metavar="MD")
    a = p.parse_args(argv)
    cache: dict[str, str] = {}
    stale = []
    for path in a.write or a.check:
        text = path.read_text(encoding="utf-8")
        new = regenerate(text, cache)
        if new != text:
            if a.write:
                path.write_text(new, encoding="utf-8")
            else:
                stale.append(str(path))
    if stale:
        print(f"{', '.join(stale)}: report samples are stale; run: {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
