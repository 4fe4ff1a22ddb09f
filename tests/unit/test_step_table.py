"""The columnar step timeline (`read_step_table`) against the row path it replaces
(`read_step_timeline`): the same columns for well-formed files (read by Arrow) and for every
kind of damage (which must fall back to the rows)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from uberprof.rundir import step_table
from uberprof.rundir.ranks import read_step_timeline
from uberprof.rundir.step_table import read_step_table

NAMES = ["host_start_ns", "host_end_ns", "data_wait_ns", "cpu_ns", "gpu_time_ns"]


def _rows(steps: int, gpu: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    t = 1_700_000_000_000_000_000
    for s in range(steps):
        rows.append({"kind": "step", "step": s, "host_start_ns": t, "host_end_ns": t + 900 + s,
                     "data_wait_ns": 10 * s, "cpu_ns": 700 + s, "source": "optimizer"})
        if gpu and s % 3:  # device times arrive later, not for every step
            rows.append({"kind": "gpu", "step": s, "gpu_time_ns": 800 + s,
                         "gpu_mem_peak_bytes": 1 << 30})
        if gpu and s % 5 == 0:  # a device row that carries a field of the step row
            rows.append({"kind": "gpu", "step": s, "host_end_ns": t + 950 + s})
        t += 1000 + s
    rows.insert(2, {"kind": "event", "step": 1, "what": "trace window"})  # other kinds: no step
    return rows


def _expected(rank_dir: Path) -> tuple[list[list[Any]], bool, dict[str, int]]:
    """The row path's answer, column by column (ints only, as the table keeps them)."""
    t = read_step_timeline(rank_dir)
    cols = [[r["step"] for r in t.steps]]
    cols += [[v if type(v := r.get(n)) is int else None for r in t.steps] for n in NAMES]
    return cols, t.truncated, t.skipped


def _check(rank_dir: Path, text: bytes) -> bool:
    """Compare both paths on `text`; True when the fast (columnar) path took it."""
    (rank_dir / "steps.jsonl").write_bytes(text)
    got = read_step_table(rank_dir, NAMES)
    cols, truncated, skipped = _expected(rank_dir)
    assert [got.table.column(n).to_pylist() for n in ["step", *NAMES]] == cols, text[:300]
    assert (got.truncated, got.skipped) == (truncated, skipped)
    assert got.problem(rank_dir / "steps.jsonl") == \
        read_step_timeline(rank_dir).problem(rank_dir / "steps.jsonl")
    return step_table._columns(text, NAMES) is not None


def _jsonl(rows: list[Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_well_formed_files_take_the_columnar_path_with_the_same_table(tmp_path: Path,
                                                                      gpu: bool) -> None:
    rows = _rows(50, gpu)
    assert _check(tmp_path, _jsonl(rows))
    again = next(r for r in rows if r["kind"] == "step" and r["step"] == 5)
    rows += [{**again, "host_end_ns": again["host_end_ns"] + 7}]  # a step again: the last wins
    rows += [{"kind": "gpu", "step": 4, "gpu_time_ns": 5}]  # a gpu row again: the last wins
    rows += [{"kind": "gpu", "step": 999, "gpu_time_ns": 5}]  # a gpu row without its step
    assert _check(tmp_path, _jsonl(rows))
    assert _check(tmp_path, _jsonl(rows).rstrip(b"\n"))  # a whole last line without newline


DAMAGE = {
    "cut-off tail": lambda b: b[:-17],
    "blank line": lambda b: b.replace(b"\n", b"\n\n", 1),
    "two objects on a line": lambda b: b.replace(b"}\n", b"} ", 1),
    "explicit null": lambda b: b.replace(b'"cpu_ns":701', b'"cpu_ns":null'),
    "null in a gpu row": lambda b: b.replace(b'"gpu_time_ns":801', b'"gpu_time_ns":null'),
    "float": lambda b: b.replace(b'"cpu_ns":702', b'"cpu_ns":702.5'),
    "NaN": lambda b: b.replace(b'"cpu_ns":702', b'"cpu_ns":NaN'),
    "beyond 64 bits": lambda b: b.replace(b'"cpu_ns":702', b'"cpu_ns":99999999999999999999'),
    "negative time": lambda b: b.replace(b'"data_wait_ns":20', b'"data_wait_ns":-20'),
    "negative step": lambda b: b.replace(b'"step":3,', b'"step":-3,'),
    "step too large": lambda b: b.replace(b'"step":3,', b'"step":9007199254740993,'),
    "no step": lambda b: b.replace(b'"step":3,', b""),
    "step as string": lambda b: b.replace(b'"step":3,', b'"step":"3",'),
    "bool in a number field": lambda b: b.replace(b'"cpu_ns":702', b'"cpu_ns":true'),
    "end before start": lambda b: b.replace(b'"host_end_ns":', b'"host_end_ns":1', 1),
    "not an object": lambda b: b + b"[1, 2]\n",
    "a number alone": lambda b: b + b"42\n",
    "nested object": lambda b: b.replace(b'"source":"optimizer"', b'"source":{"a":1}', 1),
    "duplicate key": lambda b: b.replace(b'"cpu_ns":702', b'"cpu_ns":702,"cpu_ns":5'),
    "non-ASCII": lambda b: b.replace(b'"optimizer"', '"optimizér"'.encode(), 1),
    "invalid UTF-8": lambda b: b.replace(b'"optimizer"', b'"optim\xffzer"', 1),
    "string everywhere": lambda b: b.replace(b'"cpu_ns":', b'"cpu_ns":"').replace(
        b',"source"', b'","source"'),
    "empty file": lambda b: b"",
    "whitespace only": lambda b: b" \n\n",
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_damaged_files_give_the_row_paths_table(tmp_path: Path, damage: str) -> None:
    text = DAMAGE[damage](_jsonl(_rows(12, gpu=True)))
    assert text != _jsonl(_rows(12, gpu=True)) or damage == "none"
    _check(tmp_path, text)


def test_random_damage_agrees_with_the_row_path(tmp_path: Path) -> None:
    """Random bytes and lines changed in well-formed files: whichever path reads them, the
    table is the row path's."""
    rng = random.Random(7)
    base = _jsonl(_rows(30, gpu=True))
    fast = 0
    for _ in range(150):
        text = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(text))
            op = rng.random()
            if op < 0.4:
                text[i] = rng.choice(b'0123456789-",:{}[] \nabenul.')
            elif op < 0.7:
                del text[i:i + rng.randint(1, 20)]
            else:
                text[i:i] = rng.choice([b"-", b"0", b"\n", b'"x":1,', b"9" * 20, b".5"])
        fast += _check(tmp_path, bytes(text))
    assert 0 < fast < 150  # both paths were exercised


def test_a_missing_file_is_an_empty_table(tmp_path: Path) -> None:
    t = read_step_table(tmp_path, NAMES)
    assert t.table.num_rows == 0 and t.table.column_names == ["step", *NAMES]
    assert t.tail() == (0, None, None) and not t.truncated


def test_threads_reading_timelines_at_once_each_get_their_own_files_table(
        tmp_path: Path) -> None:
    """The line check reuses a scratch array per thread: threads reading files of different
    lengths at once (the dashboard's diagnosis beside a page) must not see each other's."""
    from concurrent.futures import ThreadPoolExecutor

    dirs = []
    for i, steps in enumerate([40, 4000, 400, 12000, 7, 2500]):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "steps.jsonl").write_bytes(_jsonl(_rows(steps, gpu=bool(i % 2))))
        dirs.append(d)
    alone = [read_step_table(d, NAMES).table for d in dirs]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            together = list(pool.map(lambda d: read_step_table(d, NAMES).table, dirs * 4))
            assert all(t.equals(alone[i % len(dirs)]) for i, t in enumerate(together))
    assert all(step_table._columns((d / "steps.jsonl").read_bytes(), NAMES) is not None
               for d in dirs)  # every one on the columnar path, where the scratch is used
