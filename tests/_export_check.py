"""Checks for merged trace exports: a Trace Event Format validator, and the comparison of an
export re-read by uberprof's own ingest with the source traces."""

from __future__ import annotations

import gzip
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.ingest.trace import ingest_trace

PHASES = set("XBEiIsftCMbenSTFPOND")
METADATA = {"process_name", "process_sort_index", "process_labels", "thread_name",
            "thread_sort_index"}
ON_THREAD = set("XBEstf")


def load(path: Path) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return orjson.loads(raw)


def us_to_ns(us: float) -> int:
    """As ingest reads µs: whole µs plus the rounded fraction."""
    whole = math.floor(us)
    return int(whole) * 1000 + round((us - whole) * 1000.0)


def validate_tef(doc: dict[str, Any]) -> list[str]:
    """Problems with `doc` as a Trace Event Format trace (empty: none). Beyond the format's
    per-event rules: metadata names every process and every thread that draws events, tids
    are unique across processes, complete events nest on every track, flows have both ends."""
    problems: list[str] = []
    evs = doc.get("traceEvents")
    if not isinstance(evs, list):
        return ["traceEvents is not a list"]
    proc_names: dict[int, str] = {}
    thread_names: dict[tuple[int, int], str] = {}
    pids_used: set[int] = set()
    threads_used: set[tuple[int, int]] = set()
    tid_owner: dict[int, int] = {}
    slices: dict[tuple[int, int], list[tuple[int, int]]] = {}
    flows: dict[tuple[str, Any], Counter[str]] = {}

    def bad(i: int, e: Any, why: str) -> None:
        if len(problems) < 50:
            problems.append(f"event {i}: {why}: {str(e)[:200]}")

    for i, e in enumerate(evs):
        if not isinstance(e, dict):
            bad(i, e, "not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            bad(i, e, "unknown phase")
            continue
        pid, tid = e.get("pid"), e.get("tid")
        if not isinstance(pid, int) or not isinstance(tid, int):
            bad(i, e, "pid/tid not integers")
            continue
        if not isinstance(e.get("ts"), (int, float)):
            bad(i, e, "ts not a number")
            continue
        if e["ts"] < 0:
            bad(i, e, "negative ts (Perfetto drops those events)")
        if ph == "M":
            name = e.get("name")
            args = e.get("args")
            if name not in METADATA or not isinstance(args, dict):
                bad(i, e, "unknown metadata event")
                continue
            if name == "process_name":
                if not isinstance(args.get("name"), str) or not args["name"]:
                    bad(i, e, "process_name without a name")
                proc_names[pid] = args.get("name")
            elif name == "thread_name":
                if not isinstance(args.get("name"), str) or not args["name"]:
                    bad(i, e, "thread_name without a name")
                thread_names[(pid, tid)] = args.get("name")
            elif name.endswith("sort_index") and not isinstance(args.get("sort_index"), int):
                bad(i, e, "sort_index not an integer")
            continue
        if not isinstance(e.get("name"), str):
            bad(i, e, "name not a string")
        pids_used.add(pid)
        if tid_owner.setdefault(tid, pid) != pid:
            bad(i, e, f"tid {tid} used by processes {tid_owner[tid]} and {pid}")
        scope = e.get("s", "t")
        if ph in ON_THREAD or (ph in "iI" and scope == "t"):
            threads_used.add((pid, tid))
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                bad(i, e, "complete event without a non-negative dur")
                continue
            s = us_to_ns(e["ts"])
            slices.setdefault((pid, tid), []).append((s, s + us_to_ns(dur)))
        elif ph in "iI" and scope not in ("t", "p", "g"):
            bad(i, e, "instant with an unknown scope")
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(
                    isinstance(v, (int, float)) for v in args.values()):
                bad(i, e, "counter without numeric args")
        elif ph in "stf":
            if "id" not in e or not isinstance(e.get("cat"), str):
                bad(i, e, "flow event without id or cat")
                continue
            flows.setdefault((e["cat"], e["id"]), Counter())[ph] += 1
    for pid in sorted(pids_used - set(proc_names)):
        problems.append(f"process {pid} has events but no process_name")
    for key in sorted(threads_used - set(thread_names)):
        problems.append(f"thread {key} has events but no thread_name")
    for key, ivs in slices.items():
        ivs.sort(key=lambda x: (x[0], -(x[1] - x[0])))
        stack: list[int] = []
        for s, e in ivs:
            while stack and stack[-1] <= s:
                stack.pop()
            if stack and e > stack[-1]:
                problems.append(f"track {key}: [{s}, {e}] overlaps its enclosing event "
                                f"(ends {stack[-1]}) without nesting")
                break
            stack.append(e)
    for key, c in flows.items():
        if not c["s"] or not (c["f"] or c["t"]):
            problems.append(f"flow {key} lacks a start or an end: {dict(c)}")
            if len(problems) > 80:
                break
    return problems


def rank_pids(doc: dict[str, Any]) -> dict[int, int]:
    """rank -> pid, from the process names ("rank 3 (host, device)")."""
    out = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            name = e["args"]["name"]
            if name.startswith("rank "):
                out[int(name.split()[1])] = e["pid"]
    return out


def compare_with_sources(export: Path, sources: dict[int, list[Path]],
                         offsets: dict[int, int] | None = None,
                         left_out: tuple[str, ...] = ("python_function",)) -> dict[int, int]:
    """Re-read `export` with ingest and check, per rank, that its complete events are the
    sources' (same count, same order, same names and durations, times shifted by the rank's
    clock offset), but for the categories the export leaves out. Returns events per rank."""
    doc = load(export)
    pids = rank_pids(doc)
    merged = ingest_trace(export).events
    merged = merged.filter(pc.not_equal(merged.column("cat"), "uberprof"))
    out = {}
    for rank, files in sources.items():
        tables = [ingest_trace(f).events for f in files]
        tables = [t.filter(pc.invert(pc.is_in(t.column("cat").cast("string"),
                                              value_set=pa.array(list(left_out), pa.string()))))
                  for t in tables]
        src_names: list[str] = []
        src_ts: list[int] = []
        src_dur: list[int] = []
        for t in tables:
            src_names += t.column("name").to_pylist()
            src_ts += t.column("ts").to_pylist()
            src_dur += t.column("dur").to_pylist()
        mine = merged.filter(pc.equal(merged.column("pid"), pids[rank]))
        names = mine.column("name").to_pylist()
        assert len(names) == len(src_names), (rank, len(names), len(src_names))
        assert names == src_names, f"rank {rank}: order or names differ"
        assert mine.column("dur").to_pylist() == src_dur, f"rank {rank}: durations differ"
        shift = np.array(mine.column("ts").to_pylist(), dtype=np.int64) - np.array(
            src_ts, dtype=np.int64)
        expect = (offsets or {}).get(rank, 0)
        assert (shift == expect).all(), (rank, np.unique(shift)[:5], expect)
        out[rank] = len(names)
    return out
