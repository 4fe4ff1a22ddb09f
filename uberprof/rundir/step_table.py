"""A rank's step timeline as columns: `read_step_timeline`'s rows, read 3x faster.

A 512-rank x 10,000-step run holds 10 M `steps.jsonl` rows; parsing and checking them one
Python dict at a time took 18 ms per rank. Arrow's JSON reader parses a well-formed file in
C++ and the row checks run on whole columns. "Well-formed" is decided conservatively, and any
file that is not takes the row path (`read_step_timeline`), which names what is wrong with it,
so both give the same table for every file (tests/unit/test_step_table.py compares them):

- ASCII only, no `null` anywhere (an explicit null in a `gpu` row erases a step row's field on
  the row path; absent fields do not: columns cannot tell the two apart), no blank line, one
  JSON object per line (Arrow reads `{..} {..}` on one line as two rows; the row path drops
  the line), every line starting with `{` (no blank or indented line), every line whole (a
  cut-off tail makes Arrow refuse the file);
- every column int64, string or bool (a float, NaN, an integer beyond 64 bits, a nested
  object, a type that changes between rows: the row path);
- every row passes `step_row_problem` (checked per column; one failure: the row path).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.rundir.layout import STEPS_FILE
from uberprof.rundir.ranks import (
    MAX_STEP,
    UNREADABLE,
    UNSIGNED_SUFFIXES,
    read_step_timeline,
    skipped_rows_line,
    unreadable_reason,
)

__all__ = ["StepTable", "StepTail", "read_step_table"]

StepTail = tuple[int, int | None, int | None]
"""A step timeline's step count, last step and that step's end (ns): what the crash evidence
needs of it."""


@dataclass(frozen=True)
class StepTable:
    """The step timeline's `names` columns (int64, null where a step has no int there), one
    row per step in step order (column `step` first); whether the file was cut off; the rows
    left out by reason."""

    table: pa.Table
    truncated: bool = False
    skipped: dict[str, int] = field(default_factory=dict)

    def problem(self, path: Path) -> str | None:
        """One line naming the file and the rows left out, or None when none were."""
        return skipped_rows_line(path, self.skipped)

    def tail(self) -> StepTail:
        """Steps, the last one, and its end (the table needs `host_end_ns`)."""
        if not self.table.num_rows:
            return 0, None, None
        return (self.table.num_rows, self.table.column("step")[-1].as_py(),
                self.table.column("host_end_ns")[-1].as_py())


def read_step_table(rank_dir: Path, names: Sequence[str]) -> StepTable:
    """The rank's step timeline as the columns `names` (besides `step`); never raises for what
    the file holds (the row path's rules: module docstring)."""
    cols = [n for n in names if n != "step"]
    path = rank_dir / STEPS_FILE
    if (why := unreadable_reason(path)) is not None:
        return StepTable(_table(np.zeros(0, np.int64), {}, cols),
                         skipped={f"{UNREADABLE}: {why}": 1})
    if not path.exists():
        return StepTable(_table(np.zeros(0, np.int64), {}, cols))
    fast = _columns(path.read_bytes(), cols)
    if fast is not None:
        return StepTable(fast)
    t = read_step_timeline(rank_dir)
    steps = np.fromiter((r["step"] for r in t.steps), np.int64, len(t.steps))
    values = {n: pa.array([v if type(v := r.get(n)) is int else None for r in t.steps],
                          pa.int64()) for n in cols}
    return StepTable(_table(steps, values, cols), t.truncated, dict(t.skipped))


def _table(steps: np.ndarray, values: dict[str, Any], cols: list[str]) -> pa.Table:
    empty = pa.nulls(steps.size, pa.int64())
    return pa.table({"step": pa.array(steps, pa.int64()),
                     **{n: values.get(n, empty) for n in cols}})


def _columns(data: bytes, cols: list[str]) -> pa.Table | None:
    """The table of a well-formed file (module docstring), or None for the row path."""
    import pyarrow.json as pj

    # On the bytes as an array: a line not starting with "{" (blank, indented) takes the row
    # path. Counting "\n" and "\n{" with bytes.count was 3.3 of a 10,000-line file's 20 ms.
    a = np.frombuffer(data, np.uint8)
    end = a.size - 1 if data.endswith(b"\n") else a.size
    newlines = np.flatnonzero(np.equal(a[:end], ord("\n"), out=_scratch(end)))
    lines = newlines.size + 1
    if not (end > 0 and a[0] == ord("{") and bool((a[newlines + 1] == ord("{")).all())
            and data.isascii()) or data.find(b"null") >= 0:
        return None
    try:
        # one block for the whole file (Arrow's default is 1 MiB): a 10,000-step timeline
        # (2.2 MB) parses in 10.6 ms instead of 13.3, no block boundary to stitch
        t = pj.read_json(pa.py_buffer(data), read_options=pj.ReadOptions(
            use_threads=False, block_size=max(1 << 20, len(data) + 1)))
    except (pa.ArrowInvalid, ValueError):
        return None
    if t.num_rows != lines:
        return None
    types = {f.name: f.type for f in t.schema}
    if types.get("step") != pa.int64() or any(
            not (pa.types.is_int64(ty) or pa.types.is_string(ty) or pa.types.is_boolean(ty))
            for ty in types.values()):
        return None
    step = t.column("step")
    if step.null_count or pc.min(step).as_py() < 0 or pc.max(step).as_py() >= MAX_STEP:
        return None
    for name, ty in types.items():
        if pa.types.is_int64(ty) and name.endswith(UNSIGNED_SUFFIXES) and (
                (lo := pc.min(t.column(name)).as_py()) is not None and lo < 0):
            return None
    if types.get("host_start_ns") == types.get("host_end_ns") == pa.int64() and pc.any(
            pc.less(t.column("host_end_ns"), t.column("host_start_ns"))).as_py():
        return None

    steps = step.to_numpy()
    kind = (t.column("kind").to_numpy(zero_copy_only=False) if types.get("kind") == pa.string()
            else np.full(t.num_rows, None, object))
    rows = _last_per_step(steps, kind == "step")  # the row path keeps a step's last row
    gpu = _last_per_step(steps, kind == "gpu")
    uniq = steps[rows]
    at = np.searchsorted(uniq, steps[gpu])
    merged = at < uniq.size
    merged[merged] = uniq[at[merged]] == steps[gpu][merged]
    values = {}
    for n in cols:
        if types.get(n) != pa.int64():
            continue
        col = t.column(n).combine_chunks()
        v = pc.take(col, pa.array(rows))
        g = pc.take(col, pa.array(gpu[merged]))
        if g.null_count < len(g):  # a gpu row's fields overwrite its step's
            ok = v.is_valid().to_numpy(zero_copy_only=False)
            has = g.is_valid().to_numpy(zero_copy_only=False)
            idx = at[merged][has]
            out = pc.fill_null(v, 0).to_numpy().copy()  # int64 throughout: ns exceed 2**53
            out[idx] = g.filter(pa.array(has)).to_numpy()
            ok[idx] = True
            v = pa.array(out, pa.int64(), mask=~ok)
        values[n] = v
    return _table(uniq, values, cols)


_SCRATCH_MAX = 64 << 20  # bytes of a steps.jsonl beyond which its scratch is not kept
_scratches = threading.local()  # one per thread: numpy lets go of the GIL while it fills one


def _scratch(n: int) -> np.ndarray:
    """A bool array of `n`, reused from call to call on this thread: a new one the size of the
    file each time (2 MB at 10,000 steps) was ~550 page faults a timeline, more system time
    than the check it served saved."""
    if n > _SCRATCH_MAX:  # a huge file: not kept for the next
        return np.empty(n, bool)
    have = getattr(_scratches, "array", None)
    if have is None or have.size < n:
        have = _scratches.array = np.zeros(min(max(n, 2 * (0 if have is None else have.size)),
                                               _SCRATCH_MAX), bool)
    return have[:n]


def _last_per_step(steps: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row indices of the last masked row of each step, in step order."""
    idx = np.flatnonzero(mask)[::-1]
    _, first = np.unique(steps[idx], return_index=True)
    return idx[first]
