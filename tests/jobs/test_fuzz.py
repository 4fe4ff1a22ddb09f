"""Fuzz: real run directories and traces, mutated the ways files break (cut off, flipped bytes,
files and keys dropped or duplicated, huge and negative numbers, wrong types, odd file names),
then `info`, `analyze`, `report` and `export` on each. None may show a traceback or a warning,
each exits 0, or 1 with a named problem, no figure is impossible, and the untouched rank is
always analysed.

Seeded and bounded in time: case k of seed S is always the same mutation, so a failure names
what to replay (UBERPROF_FUZZ_SEED=S UBERPROF_FUZZ_CASE=k). UBERPROF_FUZZ_SECONDS sets the
budget (default 60 s after the fixtures; at least MIN_CASES cases run whatever the load).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import time
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas  # noqa: F401 - loaded before the in-process CLI runs: see keep_pandas_out
import pytest
from click.testing import CliRunner

from tests._runs import ShortRun
from uberprof.cli import main

SEED = int(os.environ.get("UBERPROF_FUZZ_SEED", "13"))
BUDGET_S = float(os.environ.get("UBERPROF_FUZZ_SECONDS", "60"))
ONLY = os.environ.get("UBERPROF_FUZZ_CASE")
MIN_CASES, MAX_CASES = 8, 200
INTERNAL: set[str] = set()  # "could not be analysed (...); please report this" lines seen
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"


@pytest.fixture(scope="module")
def real_run(short_ddp_run: ShortRun) -> Path:
    """A real 2-rank DDP job on CPU under `uberprof run`, with host counters (the session's
    short run: each case mutates a copy of it)."""
    return short_ddp_run[0]


# --- mutations ----------------------------------------------------------------------------------
# Each takes the copy's root and the case's generator, changes something that belongs to rank 1
# (or to the whole run, never to rank 0), and says what it did.

WEIRD: list[Any] = [10**30, 2**63, 2**64 + 1, -(2**63) - 1, -1, -(10**20), 1e19, -1e19, 1e308,
                    0, "x", "", [], [1, "a"], {}, {"a": 1}, None, True, False, 0.5]
RAW_WEIRD = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "99999999999999999999999999"]


def _victims(root: Path) -> list[Path]:
    """The files a case may damage: rank 1's and the run's own, never rank 0's."""
    files = [p for p in root.rglob("*") if p.is_file() and "derived" not in p.parts]
    return [p for p in files
            if not ({"0", "sampled_rank-0.json.gz"} & set(p.relative_to(root).parts))]


def _pick(rng: random.Random, root: Path, suffix: tuple[str, ...] = ()) -> Path | None:
    files = [p for p in _victims(root) if not suffix or p.name.endswith(suffix)]
    return rng.choice(sorted(files)) if files else None


def _read(p: Path) -> bytes:
    """A file's content, inflated when it is whole gzip; a gzip an earlier mutation of the same
    case cut or flipped is taken as it is (mutating it again is still a valid case)."""
    data = p.read_bytes()
    if p.name.endswith(".gz") and data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (EOFError, OSError, zlib.error):
            return data
    return data


def _write(p: Path, data: bytes) -> None:
    p.write_bytes(gzip.compress(data, 1) if p.name.endswith(".gz") else data)


def truncate(root: Path, rng: random.Random) -> str:
    p = _pick(rng, root)
    if p is None:
        return "nothing to cut"
    data = p.read_bytes()
    n = rng.randrange(len(data) + 1)
    p.write_bytes(data[:n])
    return f"cut {p.relative_to(root)} to {n} of {len(data)} bytes"


def flip_bytes(root: Path, rng: random.Random) -> str:
    p = _pick(rng, root)
    if p is None:
        return "nothing to flip"
    inside = p.name.endswith(".gz") and rng.random() < 0.7  # in the JSON, not the archive
    try:
        data = bytearray(_read(p) if inside else p.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile):
        return f"{p.relative_to(root)} already unreadable"
    if not data:
        return f"{p.relative_to(root)} empty"
    spots = [rng.randrange(len(data)) for _ in range(rng.randint(1, 8))]
    for i in spots:
        data[i] ^= 1 << rng.randrange(8)
    (_write if inside else Path.write_bytes)(p, bytes(data))
    return f"flipped {len(spots)} bit(s) in {p.relative_to(root)}" + (" (inside)" if inside else "")


def delete(root: Path, rng: random.Random) -> str:
    p = _pick(rng, root)
    if p is None:
        return "nothing to delete"
    if rng.random() < 0.2 and p.parent != root:
        shutil.rmtree(p.parent)
        return f"deleted folder {p.parent.relative_to(root)}"
    p.unlink()
    return f"deleted {p.relative_to(root)}"


def duplicate(root: Path, rng: random.Random) -> str:
    ranks = root / "ranks"
    if ranks.is_dir() and (ranks / "1").is_dir() and rng.random() < 0.5:
        name = rng.choice(["1-2", "0-2", "1-10", "2", "1-x"])
        if not (ranks / name).exists():
            shutil.copytree(ranks / "1", ranks / name)
            return f"copied ranks/1 to ranks/{name}"
    p = _pick(rng, root)
    if p is None:
        return "nothing to copy"
    if rng.random() < 0.5 and p.suffix in (".json", ".gz", ".jsonl"):
        text = _read(p)
        i = text.find(b'"', 1)
        if i > 0:  # a key written twice: JSON allows it, the last one wins
            j = text.find(b",", i)
            if j > 0:
                _write(p, text[:j + 1] + text[1:j + 1] + text[j + 1:])
                return f"repeated the first key of {p.relative_to(root)}"
    copy = p.with_name(rng.choice(["copy-" + p.name, p.name + ".bak",
                                   "steps-000002-000003.pt.trace.json", "rank-1.json"]))
    shutil.copyfile(p, copy)
    return f"copied {p.relative_to(root)} to {copy.name}"


def _json_doc(p: Path) -> Any:
    text = _read(p)
    if p.name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _dump(p: Path, doc: Any, raw: str | None) -> None:
    if p.name.endswith(".jsonl"):
        lines = [json.dumps(r) for r in doc]
        data = "\n".join(lines) + "\n"
    else:
        data = json.dumps(doc)
    if raw is not None:
        data = data.replace('"__RAW__"', raw)
    _write(p, data.encode())


def _containers(doc: Any, rng: random.Random) -> tuple[Any, Any] | None:
    """A random (container, key) inside doc: an object's key or a list's index."""
    node, found = doc, None
    for _ in range(rng.randint(1, 6)):
        if isinstance(node, dict) and node:
            k = rng.choice(sorted(node, key=str))
        elif isinstance(node, list) and node:
            k = rng.randrange(len(node))
        else:
            break
        found = (node, k)
        node = node[k]
    return found


def change_value(root: Path, rng: random.Random) -> str:
    """A value somewhere in a JSON file (rank.json, steps.jsonl, a trace, node.json) becomes
    huge, negative, not finite or of the wrong type, or its key goes."""
    p = _pick(rng, root, (".json", ".json.gz", ".jsonl"))
    if p is None:
        return "no JSON file"
    try:
        doc = _json_doc(p)
    except (ValueError, OSError, EOFError):
        return f"{p.relative_to(root)} is no JSON already"
    if p.name.endswith((".json.gz", ".json")) and isinstance(doc, dict) \
            and isinstance(doc.get("traceEvents"), list) and rng.random() < 0.8:
        events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
        if events:  # the fields readers use, most of the time
            e = rng.choice(events)
            key = rng.choice(["ts", "dur", "ph", "name", "cat", "pid", "tid", "args"])
            where: tuple[Any, Any] | None = (e, key)
            if key == "args" and isinstance(e.get("args"), dict) and e["args"]:
                where = (e["args"], rng.choice(sorted(e["args"])))
        else:
            where = _containers(doc, rng)
    else:
        where = _containers(doc, rng)
    if where is None:
        return f"nothing inside {p.relative_to(root)}"
    node, key = where
    raw = None
    roll = rng.random()
    if roll < 0.15 and isinstance(node, dict):
        node.pop(key, None)
        what = "dropped"
    elif roll < 0.3:
        raw = rng.choice(RAW_WEIRD)
        node[key] = "__RAW__"
        what = f"= {raw}"
    else:
        node[key] = rng.choice(WEIRD)
        what = f"= {node[key]!r}"[:60]
    _dump(p, doc, raw)
    return f"{p.relative_to(root)}: {key!r} {what}"


def not_an_object(root: Path, rng: random.Random) -> str:
    p = _pick(rng, root, (".json", ".json.gz", ".jsonl"))
    if p is None:
        return "no JSON file"
    raw = rng.choice(["[]", "[1, 2]", '"text"', "42", "null", "{}", '{"traceEvents": {}}',
                      '{"traceEvents": [1, "a", null]}'])
    if p.name.endswith(".jsonl"):
        with p.open("a") as f:
            f.write(raw + "\n")
        return f"appended {raw} to {p.relative_to(root)}"
    _write(p, raw.encode())
    return f"{p.relative_to(root)} is now {raw}"


def odd_name(root: Path, rng: random.Random) -> str:
    """A file or folder with a name that is not UTF-8, holds a newline, starts with a dash or
    is as long as a name may be; beside the traces, among the ranks, or rank 1's own."""
    ranks = root / "ranks"
    homes = [d for d in (ranks / "1" / "traces", ranks, root) if d.is_dir()]
    home = rng.choice(homes)
    name = rng.choice([b"rank-1\xff.pt.trace.json", b"\xfe\xfe", b"new\nline.json",
                       b"-rf.json", b"x" * 250 + b".json", b"steps-000002-000003\xff.pt.trace.json",
                       "r\u00e9sum\u00e9-1.json".encode(), b"1-\xff", b" 1 "])
    target = os.fsencode(home) + b"/" + name
    src = _pick(rng, root, (".json", ".json.gz"))
    if home == ranks and rng.random() < 0.5 and (ranks / "1").is_dir():
        os.rename(os.fsencode(ranks / "1"), target)
        return f"renamed ranks/1 to ranks/{name!r}"
    if src is not None and rng.random() < 0.7:
        shutil.copyfile(src, os.fsdecode(target))
        return f"copied {src.relative_to(root)} to {home.relative_to(root)}/{name!r}"
    os.mkdir(target)
    return f"made folder {home.relative_to(root)}/{name!r}"


MUTATIONS: list[Callable[[Path, random.Random], str]] = [
    truncate, flip_bytes, delete, duplicate, change_value, change_value, change_value,
    not_an_object, odd_name]


# --- the commands -------------------------------------------------------------------------------

def run_cli(args: list[str]) -> tuple[int, str, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = CliRunner().invoke(main, args)
    where = " ".join(args[:2])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        tb = "".join(traceback.format_exception(res.exception))
        raise AssertionError(f"{where}: traceback\n{tb}")
    for text in (res.stdout, res.stderr):
        assert "Traceback" not in text, f"{where}:\n{text[-3000:]}"
        # caught by a reader's last resort: named, the rest analysed, but a defect to fix
        INTERNAL.update(line.strip() for line in text.splitlines() if "please report" in line)
    noisy = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
             if not issubclass(w.category, DeprecationWarning)]
    assert not noisy, f"{where}: warnings {noisy}"
    assert res.exit_code in (0, 1), f"{where}: exit {res.exit_code}\n{res.output[-2000:]}"
    if res.exit_code == 1:
        assert (res.stderr + res.stdout).strip(), f"{where}: exit 1 without a message"
    return res.exit_code, res.stdout, res.stderr


def check_figures(ranks: list[dict[str, Any]], where: str) -> None:
    """No impossible number: percentages in 0..100, times not negative."""
    for r in ranks:
        pcts = [v for k, v in r.items() if k.endswith("_pct")]
        pcts += list((r.get("breakdown_pct") or {}).values())
        pcts = [v for v in pcts if isinstance(v, int | float) and not isinstance(v, bool)]
        assert all(-0.01 <= v <= 100.01 for v in pcts), (where, r)
        st = r.get("step_time_ms") or {}
        assert all(v is None or v >= 0 for v in st.values()), (where, r)


def exercise(path: Path, out: Path, untouched: int) -> None:
    """info, analyze, report and export on one mutated copy."""
    if (path / "ranks").is_dir() or (path / "run.json").exists():
        run_cli(["info", str(path)])
        code, text, _ = run_cli(["info", "--json", str(path)])
        if code == 0:
            json.loads(text)
    code, text, _ = run_cli(["analyze", str(path), "--json", "--workers", "1"])
    doc = json.loads(text)
    assert code == 0 and untouched in [r["rank"] for r in doc["ranks"]], doc["problems"]
    check_figures(doc["ranks"], "analyze")
    code, text, _ = run_cli(["report", str(path), "--json", "--workers", "1"])
    rep = json.loads(text)
    assert code == 0 and untouched in rep["run"]["ranks"], rep["run"]["problems"]
    check_figures(rep["ranks"], "report")
    run_cli(["report", str(path), "--workers", "1"])
    code, _, err = run_cli(["export", str(path), "-o", str(out), "--workers", "1"])
    assert code == 0 or "nothing to export" in err, err


def test_fuzz_commands_on_broken_runs_and_traces(real_run: Path, tmp_path: Path) -> None:
    bases = {"run": (real_run, 0), "traces": (SHARED / "hta" / "trace_filter", 0)}
    cases = [int(ONLY)] if ONLY is not None else range(MAX_CASES)
    start, done = time.monotonic(), 0
    for case in cases:
        if done >= MIN_CASES and time.monotonic() - start > BUDGET_S:
            break
        rng = random.Random(f"{SEED}-{case}")
        kind = rng.choice(sorted(bases))
        base, untouched = bases[kind]
        copy = tmp_path / f"case{case}"
        shutil.copytree(base, copy, ignore=shutil.ignore_patterns("derived"))
        for p in copy.rglob("*"):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)  # the shared traces are read-only
        did = [rng.choice(MUTATIONS)(copy, rng) for _ in range(rng.randint(1, 3))]
        try:
            exercise(copy, tmp_path / f"case{case}.json", untouched)
        except Exception as exc:  # noqa: BLE001 - any failure names the case to replay
            raise AssertionError(f"fuzz case {case} (UBERPROF_FUZZ_SEED={SEED} "
                                 f"UBERPROF_FUZZ_CASE={case}), {kind}: {'; '.join(did)}\n"
                                 f"{exc}") from None
        shutil.rmtree(copy, ignore_errors=True)
        done += 1
    assert done >= min(MIN_CASES, len(cases))
    if INTERNAL:  # shown with -rP / -s: what the readers' last resort caught
        print(f"{done} cases; {len(INTERNAL)} problem line(s) from a last-resort catch:")
        print("\n".join(sorted(INTERNAL)[:20]))
