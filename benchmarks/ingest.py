"""Time `uberprof analyze` against Holistic Trace Analysis (HTA) and against the parsing floor.

    python benchmarks/ingest.py                     # the shared traces, each also as 8 ranks
    python benchmarks/ingest.py --replicas 0        # the shared traces as they are
    python benchmarks/ingest.py --json results.json
    python benchmarks/ingest.py --repeat 5          # fastest of 5 runs of each tool

For each data set (a folder of rank traces) three tools run, one after the other, each in a fresh
process so that memory is its own:

- uberprof: `uberprof.analysis.tables.pipeline.analyze` (ingest, per-step and whole-trace breakdowns,
  Parquet tables written), its default process pool;
- HTA: `TraceAnalysis(trace_dir)` + `get_temporal_breakdown()` (HTA 0.6, PyPI `traceinsight`,
  which needs pandas<3: installed by this script in benchmarks/.hta-venv);
- floor: gunzip + `orjson.loads` of the same files on the same number of processes: the least
  any JSON-based reader can do.

Wall time is measured inside each process around the work (imports excluded; the process total
is reported as well). Peak memory is the largest sum of the proportional set sizes (PSS) of the
process and its children, sampled every 25 ms (PSS counts pages that forked workers share once;
the RSS sum is in the --json output too). Each tool runs `--repeat` times per data set, the
three tools interleaved, and each figure is the best of those runs (the least wall time, CPU
time and memory): on a busy machine other work only ever adds. Throughput is also given per CPU
second (JSON MB over the CPU time of all processes), to compare with the parse floor of
simdjson on one core (PARSE_FLOOR_MBS, ../shared/FIELD-NOTES.md).

Each data set ends with issue 18's targets, met or not, and for a missed one what stands between:
at least TARGET_X_HTA times HTA's wall time (where that is less than the floor's own time, no
reader that builds Python objects of the JSON gets there), at most TARGET_MEMORY of HTA's peak
memory (against the memory uberprof's process holds after its imports, before any work), and on
inputs of LARGE_BYTES or more at most TARGET_X_FLOOR times the floor's wall time. Exit code 1 when
a target is missed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HTA_VENV = HERE / ".hta-venv"
DATA = HERE / ".bench-data"
SHARED = ROOT.parent / "shared" / "traces"
# The shared traces that HTA can read (see ../shared/traces/README.md).
HTA_READABLE = ["hta/trace_filter", "hta/nccl_parser_config", "hta/ns_resolution_trace",
                "hta/amd_trace", "hta/critical_path_simple_add",
                "tb_plugin/resnet50_num_workers_4"]
# Shaped like real NCCL jobs (many NCCL kernels and the CPU ops that launch them, per step):
# `--only nccl` runs these. HTA fails on the tb_plugin pair (IndexError): its row says so.
NCCL_SETS = ["hta/nccl_parser_config", "hta/trace_filter", "tb_plugin/test_distributed_nccl"]
DEFAULT_SETS = HTA_READABLE + [s for s in NCCL_SETS if s not in HTA_READABLE]

PARSE_FLOOR_MBS = 760.0  # pysimdjson's lazy parse on one core of this machine (FIELD-NOTES.md)
# Issue 18's targets.
TARGET_X_HTA = 10.0  # HTA's wall time over uberprof's, at least
TARGET_MEMORY = 0.35  # uberprof's peak memory over HTA's, at most
TARGET_X_FLOOR = 1.5  # uberprof's wall time over the floor's, at most, on large inputs
LARGE_BYTES = 64 << 20  # of JSON

HTA_SNIPPET = r"""
import json, logging, resource, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
def cpu():
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))
c, t = cpu(), time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
tb = a.get_temporal_breakdown(visualize=False)
work = time.perf_counter() - t
print(json.dumps({"work_s": work, "cpu_s": cpu() - c, "ranks": len(tb)}))
"""


def _cpu() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


# --- the tools, each run in its own process ----------------------------------------------------

def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.name.endswith((".json", ".json.gz")))


def _floor_one(path: str) -> int:
    import orjson

    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return len(orjson.loads(raw)["traceEvents"])


def _json_size(p: Path) -> int:
    """Read here, not with uberprof's `json_size`: this process must not map the libraries the
    tools load (numpy, pyarrow), or their PSS would share those pages with it and read lower."""
    raw = p.read_bytes()
    return len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)


def run_floor(folder: Path, workers: int) -> dict[str, Any]:
    files = [str(p) for p in _files(folder)]
    c, t = _cpu(), time.perf_counter()
    if workers > 1 and len(files) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(files)), mp.get_context("fork")) as ex:
            n = sum(ex.map(_floor_one, files))
    else:
        n = sum(_floor_one(f) for f in files)
    return {"work_s": time.perf_counter() - t, "cpu_s": _cpu() - c, "events": n}


def run_uberprof(folder: Path, workers: int) -> dict[str, Any]:
    import psutil

    sys.path.insert(0, str(ROOT))
    from uberprof.analysis.tables.pipeline import analyze, keep_pandas_out

    keep_pandas_out()  # as `uberprof analyze` does
    imports_mib = psutil.Process().memory_full_info().pss / 2**20

    with tempfile.TemporaryDirectory() as out:
        c, t = _cpu(), time.perf_counter()
        a = analyze(folder, out=out, workers=workers or None, force=True)
        work, cpu = time.perf_counter() - t, _cpu() - c
    return {"work_s": work, "cpu_s": cpu, "ranks": len(a.ranks), "imports_mib": imports_mib}


# --- measuring ---------------------------------------------------------------------------------

def _tree_memory(ps: Any) -> tuple[int, int]:
    """(PSS, RSS) summed over a process and its children. PSS counts a page shared by forked
    workers once in all (its share in each), RSS once in each: PSS is the machine's real cost."""
    import psutil

    pss = rss = 0
    for p in [ps, *ps.children(recursive=True)]:
        try:
            m = p.memory_full_info()
            pss += m.pss
            rss += m.rss
        except psutil.Error:
            pass
    return pss, rss


def measure(cmd: list[str]) -> dict[str, Any]:
    """Run `cmd`; its JSON line plus process wall time and peak tree PSS and RSS (MiB)."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    peak = peak_rss = 0
    while proc.poll() is None:
        try:
            pss, rss = _tree_memory(ps)
            peak, peak_rss = max(peak, pss), max(peak_rss, rss)
        except psutil.Error:
            pass
        time.sleep(0.025)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({proc.returncode}):\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res.update(process_s=wall, peak_mib=peak / 2**20, peak_rss_mib=peak_rss / 2**20)
    return res


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The best of repeated runs, figure by figure (least time, least memory)."""
    out = dict(runs[0])
    for k in ("work_s", "cpu_s", "process_s", "peak_mib", "peak_rss_mib"):
        out[k] = min(r[k] for r in runs)
    out["runs"] = len(runs)
    return out


def ensure_hta() -> Path:
    py = HTA_VENV / "bin" / "python"
    if not py.exists():
        print(f"installing HTA (traceinsight, pandas<3) into {HTA_VENV} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "traceinsight", "pandas<3"],
                       check=True)
    return py


def replicate(folder: Path, ranks: int) -> Path:
    """`ranks` copies of the folder's traces (rank r from trace r mod their number, so a pair
    of ranks stays a pair), each claiming its own rank. Written under benchmarks/.bench-data
    (ignored by git); the sources are only read."""
    import orjson

    srcs = _files(folder)
    dest = DATA / f"{folder.name}-x{ranks}-v3"
    stamp = dest / ".complete"
    if stamp.exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        raw = srcs[r % len(srcs)].read_bytes()
        gz = raw[:2] == b"\x1f\x8b"
        doc = orjson.loads(gzip.decompress(raw) if gz else raw)
        info = dict(doc.get("distributedInfo") or {})
        info.update(rank=r, world_size=ranks)
        doc["distributedInfo"] = info
        # indented like Kineto's own output: HTA finds ranks with the regex '"rank":\s+(\d+)'
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
        name = f"rank-{r}.pt.trace.json" + (".gz" if gz else "")
        (dest / name).write_bytes(gzip.compress(data, 6) if gz else data)
    stamp.touch()
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=SHARED)
    ap.add_argument("--replicas", type=int, default=8, help="ranks per replicated set (0: none)")
    ap.add_argument("--workers", type=int, default=0,
                    help="uberprof's --workers (default: its own choice); the floor uses as many "
                         "processes, or one per CPU")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each tool per data set; the best of them counts")
    ap.add_argument("--only", nargs="*",
                    help="folders (relative to --traces) to run; `nccl`: the NCCL-shaped sets")
    args = ap.parse_args()

    hta_py = ensure_hta()
    only = args.only or DEFAULT_SETS
    if only == ["nccl"]:
        only = NCCL_SETS
    folders = [args.traces / f for f in only]
    sets: list[tuple[str, Path]] = [(f"{f.relative_to(args.traces)}", f) for f in folders]
    if args.replicas:
        sets += [(f"{f.relative_to(args.traces)} x{args.replicas}", replicate(f, args.replicas))
                 for f in folders]
    me = [sys.executable, str(Path(__file__).resolve())]
    rows = []
    for label, folder in sets:
        size = sum(_json_size(p) for p in _files(folder))
        cmds = {"floor": [*me, "_run", "floor", str(folder), str(args.workers or os.cpu_count() or 1)],
                "uberprof": [*me, "_run", "uberprof", str(folder), str(args.workers)],
                "hta": [str(hta_py), "-c", HTA_SNIPPET, str(folder)]}
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in cmds}
        hta_failed = None
        for _ in range(max(args.repeat, 1)):  # interleaved: a busy spell hits every tool alike
            for k, cmd in cmds.items():
                if k == "hta" and hta_failed:
                    continue
                try:
                    runs[k].append(measure(cmd))
                except RuntimeError as e:
                    if k != "hta":
                        raise
                    hta_failed = str(e).strip().splitlines()[-1][:200]
        floor, ours = best(runs["floor"]), best(runs["uberprof"])
        hta = best(runs["hta"]) if not hta_failed else None
        rows.append({"set": label, "files": len(_files(folder)), "bytes": size,
                     "floor": floor, "uberprof": ours, "hta": hta, "hta_failed": hta_failed})
        if hta is None:
            print(f"{label:38s} {rows[-1]['files']:2d} files {size / 2**20:6.1f} MiB | uberprof "
                  f"{ours['work_s']:5.2f} s ({ours['cpu_s']:5.2f} cpu) {ours['peak_mib']:4.0f} "
                  f"MiB | floor {floor['work_s']:5.2f} s | HTA failed: {hta_failed}", flush=True)
            rows[-1]["missed"] = []
            continue
        print(_line(rows[-1]), flush=True)
        rows[-1]["missed"] = _report_targets(rows[-1])
    rows_all, rows = rows, [r for r in rows if r["hta"] is not None]  # totals: where HTA ran
    total = {k: sum(r[k]["work_s"] for r in rows) for k in ("floor", "uberprof", "hta")}
    cpu = {k: sum(r[k]["cpu_s"] for r in rows) for k in ("floor", "uberprof", "hta")}
    for label, t in (("wall", total), ("cpu", cpu)):
        print(f"total {label}: uberprof {t['uberprof']:.2f} s, HTA {t['hta']:.2f} s "
              f"({t['hta'] / t['uberprof']:.1f}x faster), floor {t['floor']:.2f} s "
              f"({t['uberprof'] / t['floor']:.2f}x the floor)")
    mb = sum(r["bytes"] for r in rows) / 1e6
    print(f"total throughput: uberprof {mb / total['uberprof']:.0f} MB/s wall, "
          f"{mb / cpu['uberprof']:.0f} MB/s per CPU second "
          f"({PARSE_FLOOR_MBS / (mb / cpu['uberprof']):.1f}x the {PARSE_FLOOR_MBS:.0f} MB/s parse floor)")
    x_hta = total["hta"] / total["uberprof"]
    total_ok = x_hta >= TARGET_X_HTA
    print(f"  target in total: >= {TARGET_X_HTA:.0f}x HTA: {'met' if total_ok else 'missed'}, "
          f"{x_hta:.1f}x; the floor is {total['hta'] / total['floor']:.1f}x HTA")
    missed = [m for r in rows for m in r["missed"]] + ([] if total_ok else ["total"])
    print(f"targets: {'all met' if not missed else f'{len(missed)} missed'}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows_all, "total_work_s": total, "total_cpu_s": cpu,
                                         "missed": missed}, indent=2))
    sys.exit(1 if missed else 0)


def _report_targets(r: dict[str, Any]) -> list[str]:
    """Print the set's targets, each met or what stands between; the missed ones' names."""
    u, h, f = r["uberprof"], r["hta"], r["floor"]
    missed = []
    x_hta = h["work_s"] / u["work_s"]
    need_s = h["work_s"] / TARGET_X_HTA
    if x_hta >= TARGET_X_HTA:
        speed = f"met, {x_hta:.1f}x"
    else:
        missed.append(f"{r['set']}: speed")
        below = "below" if need_s < f["work_s"] else "above"
        speed = (f"missed, {x_hta:.1f}x: {need_s:.3f} s needed, {below} the floor's "
                 f"{f['work_s']:.3f} s")
    memory = u["peak_mib"] / h["peak_mib"]
    need_mib = h["peak_mib"] * TARGET_MEMORY
    if memory <= TARGET_MEMORY:
        mem = f"met, {memory:.2f}"
    else:
        missed.append(f"{r['set']}: memory")
        imports = u.get("imports_mib", 0.0)
        mem = (f"missed, {memory:.2f}: {need_mib:.0f} MiB needed; uberprof's imports hold "
               f"{imports:.0f} MiB, the work {u['peak_mib'] - imports:.0f} MiB more")
    parts = [f">= {TARGET_X_HTA:.0f}x HTA: {speed}", f"<= {TARGET_MEMORY}x its memory: {mem}"]
    if r["bytes"] >= LARGE_BYTES:
        x_floor = u["work_s"] / f["work_s"]
        ok = x_floor <= TARGET_X_FLOOR
        parts.append(f"<= {TARGET_X_FLOOR}x the floor: {'met' if ok else 'missed'}, {x_floor:.2f}x")
        if not ok:
            missed.append(f"{r['set']}: floor")
    print("  targets: " + "; ".join(parts), flush=True)
    return missed


def _line(r: dict[str, Any]) -> str:
    u, h, f = r["uberprof"], r["hta"], r["floor"]
    return (f"{r['set']:38s} {r['files']:2d} files {r['bytes'] / 2**20:6.1f} MiB | "
            f"uberprof {u['work_s']:5.2f} s ({u['cpu_s']:5.2f} cpu) {u['peak_mib']:4.0f} MiB | "
            f"HTA {h['work_s']:5.2f} s ({h['cpu_s']:5.2f}) {h['peak_mib']:4.0f} MiB | "
            f"floor {f['work_s']:5.2f} s ({f['cpu_s']:5.2f}) {f['peak_mib']:4.0f} MiB | "
            f"HTA/uberprof {h['work_s'] / u['work_s']:4.1f}x ({h['cpu_s'] / u['cpu_s']:4.1f}x cpu), "
            f"memory {u['peak_mib'] / h['peak_mib']:.2f}; uberprof/floor "
            f"{u['work_s'] / f['work_s']:.2f}x ({u['cpu_s'] / f['cpu_s']:.2f}x cpu); "
            f"{r['bytes'] / 1e6 / u['work_s']:.0f} MB/s, "
            f"{r['bytes'] / 1e6 / u['cpu_s']:.0f} MB/s per CPU second")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_run":
        tool, folder, workers = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
        res = run_floor(folder, workers) if tool == "floor" else run_uberprof(folder, workers)
        print(json.dumps(res))
    else:
        main()
