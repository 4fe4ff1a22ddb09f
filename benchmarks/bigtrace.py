"""Gigabyte traces: write eight ranks of ~1 GB of Kineto JSON each, and measure uberprof on them.

Users' traces are large (GPT-class jobs write over 1 GB per rank and step). This writes a set
from a real shared trace (default: ../shared/traces/hta/nccl_parser_config, an A100 NCCL job
with its kernels' collective metadata), its events repeated with shifted times until each rank
holds `--gb` of JSON: every copy moves ts by the source's span plus 1 ms, renumbers the
ProfilerStep#N spans, and shifts correlation, External id and flow ids, so launches and
collectives stay linked as in the source. Metadata events are written once. Ranks differ only in
their distributedInfo (rank r of `--ranks`). The sources are only read; the set goes under
`--out` (default /tmp/uberprof-bigtrace; delete it when done: 8 GB).

Then, each a whole process, one after the other:

- `uberprof analyze DIR --force`: wall time, and every process's peak resident memory (VmHWM,
  sampled from /proc every 50 ms) against the JSON a worker reads (one rank's file): the bound is
  1.5x that JSON per worker;
- with --hta, HTA (benchmarks/.hta-venv, see ingest.py) on the same folder, stopped when its
  process tree holds more than --hta-cap-gb of memory or runs past --hta-timeout;
- with --checks, on the analysed set: `uberprof report`, `uberprof export` (its default size
  budget, 500 MB of uncompressed JSON: what Perfetto's UI opens) and `uberprof dashboard` from
  started to the overview drawn in Chromium (benchmarks/dashboard.py's `start_to_drawn`).

    python benchmarks/bigtrace.py                        # write (if missing) and analyse
    python benchmarks/bigtrace.py --gb 0.25 --ranks 2    # a smaller set
    python benchmarks/bigtrace.py --hta --checks
    python benchmarks/bigtrace.py --clean                # delete the set
Exit code 1 when a worker's peak passes 1.5x the JSON it reads, or a check fails.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = ROOT.parent / "shared" / "traces" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
OUT = Path("/tmp/uberprof-bigtrace")
BOUND = 1.5  # a worker's peak memory over the JSON it reads, at most
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


# --- writing -----------------------------------------------------------------------------------

def _load(src: Path) -> dict[str, Any]:
    import orjson

    raw = src.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


_HOLE = "\x01"  # a placeholder orjson writes as "\u0001": where a copy's own values go
_IDS = ("correlation", "External id", "external id")


def _copies(events: list[dict[str, Any]], n: int) -> Any:
    """The source's timed events, `n` times, each copy's times, ids and step numbers shifted:
    yields each copy's events as compact JSON (no brackets). The source is serialised once
    with holes where those values go; a copy fills them from whole arrays (no per-event
    Python work per copy, so a gigabyte takes seconds, not minutes)."""
    import numpy as np
    import orjson

    timed = [dict(e) for e in events
             if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    span = (max(e["ts"] + (e.get("dur") or 0) for e in timed) - min(e["ts"] for e in timed)
            + 1000.0)  # µs, 1 ms between copies
    ts, ids, steps = [], [], []  # (order of the hole, source value)
    order = 0
    for e in timed:  # holes in the order orjson writes them (insertion order, depth first)
        for k, v in list(e.items()):
            if k == "ts":
                ts.append((order, float(v)))
            elif k == "id" and isinstance(v, int):
                ids.append((order, v))
            elif k == "name" and isinstance(v, str) and (m := _STEP.match(v)):
                steps.append((order, int(m.group(1))))
            elif k == "args" and isinstance(v, dict):
                args = e["args"] = dict(v)
                for ak, av in args.items():
                    if ak in _IDS and isinstance(av, int) and not isinstance(av, bool):
                        ids.append((order, av))
                        args[ak] = _HOLE
                        order += 1
                continue
            else:
                continue
            e[k] = _HOLE
            order += 1
    pieces = orjson.dumps(timed)[1:-1].decode().split('"\\u0001"')
    assert len(pieces) == order + 1, "a source value holds the placeholder"
    step_shift = (max(s for _, s in steps) - min(s for _, s in steps) + 1) if steps else 0
    id_shift = max((v for _, v in ids), default=0) + 1
    cols = {name: (np.array([i for i, _ in xs], dtype=np.int64),
                   np.array([v for _, v in xs], dtype=float if name == "ts" else np.int64))
            for name, xs in (("ts", ts), ("ids", ids), ("steps", steps))}
    out: list[str] = [""] * (2 * order + 1)
    out[0::2] = pieces
    values = np.empty(order, dtype=object)
    for k in range(n):
        where, base = cols["ts"]
        values[where] = list(map(repr, (base + k * span).tolist()))
        where, base = cols["ids"]
        values[where] = list(map(str, (base + k * id_shift).tolist()))
        where, base = cols["steps"]
        values[where] = [f'"ProfilerStep#{s}"' for s in (base + k * step_shift).tolist()]
        out[1::2] = values.tolist()
        yield "".join(out).encode()


def write(src: Path, out: Path, ranks: int, gb: float, gz: bool) -> list[Path]:
    """Write `ranks` traces of about `gb` GB of JSON each under `out`; returns their paths."""
    import orjson

    doc = _load(src)
    events = doc.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    one = len(orjson.dumps([e for e in events if e.get("ph") != "M"]))
    n = max(1, round(gb * 1e9 / one))
    out.mkdir(parents=True, exist_ok=True)
    files, heads = [], []
    for r in range(ranks):
        info = dict(doc.get("distributedInfo") or {})
        info.update(rank=r, world_size=ranks)
        pgs = info.get("pg_config")
        if isinstance(pgs, list) and pgs:
            info["pg_config"] = [dict(pgs[0], pg_size=ranks, ranks=list(range(ranks)))]
        head = dict(doc, distributedInfo=info)
        # indented like Kineto's header: HTA finds the rank with '"rank":\s+(\d+)'
        text = orjson.dumps(head, option=orjson.OPT_INDENT_2)[:-2]
        heads.append(text + b',\n  "traceEvents": [' + orjson.dumps(meta)[1:-1])
        path = out / (f"rank-{r}.pt.trace.json" + (".gz" if gz else ""))
        files.append(path)
    with ExitStack() as stack:
        opened = [stack.enter_context(gzip.open(p, "wb", compresslevel=1) if gz  # noqa: SIM115
                                      else open(p, "wb")) for p in files]  # noqa: SIM115
        for f, h in zip(opened, heads):
            f.write(h)
        for chunk in _copies(events, n):
            for f in opened:
                f.write(b"," + chunk)
        for f in opened:
            f.write(b"\n]}\n")
    (out / ".complete").write_text(json.dumps({"source": str(src), "copies": n, "gb": gb}))
    return files


# --- measuring ---------------------------------------------------------------------------------

def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def run_sampled(cmd: list[str], cap_bytes: int = 0, timeout: float = 0) -> dict[str, Any]:
    """Run `cmd`; wall time, each process's peak RSS (VmHWM) and the tree's peak RSS sum.
    Stopped (and marked) when the tree's RSS passes `cap_bytes` or the time `timeout`."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    ps = psutil.Process(proc.pid)
    peaks: dict[int, int] = {}
    tree_peak, stopped = 0, None
    while proc.poll() is None:
        try:
            procs = [ps, *ps.children(recursive=True)]
        except psutil.Error:
            procs = []
        total = 0
        for p in procs:
            peaks[p.pid] = max(peaks.get(p.pid, 0), _status_kib(p.pid, "VmHWM:") * 1024)
            total += _status_kib(p.pid, "VmRSS:") * 1024
        tree_peak = max(tree_peak, total)
        elapsed = time.perf_counter() - t0
        if (cap_bytes and total > cap_bytes) or (timeout and elapsed > timeout):
            stopped = (f"stopped at {total / 2**30:.1f} GiB held" if cap_bytes and
                       total > cap_bytes else f"stopped after {elapsed:.0f} s")
            for p in reversed(procs):
                with suppress(psutil.Error):
                    p.kill()
            break
        time.sleep(0.05)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    main_peak = peaks.pop(proc.pid, 0)
    return {"wall_s": wall, "rc": proc.returncode, "stopped": stopped,
            "main_peak": main_peak, "worker_peaks": sorted(peaks.values(), reverse=True),
            "tree_peak": tree_peak, "stdout": out.decode(errors="replace")[-2000:],
            "stderr": err.decode(errors="replace")[-2000:]}


def _json_bytes(path: Path) -> int:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            f.seek(0, 2)
            return f.tell()
    return path.stat().st_size


def analyze_measured(out: Path, workers: int, per_rank: int, failed: list[str]
                     ) -> dict[str, Any] | None:
    """`uberprof analyze OUT --force` measured and printed against the bound; None when it
    failed."""
    cmd = [sys.executable, "-m", "uberprof", "analyze", str(out), "--force"]
    if workers:
        cmd += ["--workers", str(workers)]
    r = run_sampled(cmd)
    if r["rc"] != 0:
        print(f"uberprof analyze failed ({r['rc']}):\n{r['stderr']}")
        return None
    worst = max(r["worker_peaks"] or [r["main_peak"]])
    ok = worst <= BOUND * per_rank
    if not ok:
        failed.append("memory")
    workers_said = (f"each worker's peak RSS "
                    f"{', '.join(f'{p / 2**20:.0f}' for p in r['worker_peaks'])} MiB (workers "
                    "replaced when big count again)" if r["worker_peaks"] else
                    "no worker (one trace, or one worker: analysed in the parent)")
    print(f"uberprof analyze: {r['wall_s']:.1f} s wall; {workers_said}, the parent "
          f"{r['main_peak'] / 2**20:.0f} MiB, the tree {r['tree_peak'] / 2**20:.0f} MiB; "
          f"worst {'worker' if r['worker_peaks'] else 'process'} {worst / per_rank:.2f}x the "
          f"{per_rank / 2**20:.0f} MiB it reads, bound {BOUND}x: {'met' if ok else 'MISSED'}")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=SOURCE, help="the real trace to repeat")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--gb", type=float, default=1.0, help="JSON per rank, in GB (1e9 bytes)")
    ap.add_argument("--gzip", action="store_true", help="write .json.gz (level 1)")
    ap.add_argument("--rewrite", action="store_true", help="write the set even if it is there")
    ap.add_argument("--workers", type=int, default=0, help="uberprof's --workers (default its own)")
    ap.add_argument("--hta", action="store_true", help="run HTA on the set too")
    ap.add_argument("--hta-cap-gb", type=float, default=12.0)
    ap.add_argument("--hta-timeout", type=float, default=900.0)
    ap.add_argument("--checks", action="store_true",
                    help="report, export and the dashboard on the analysed set")
    ap.add_argument("--no-analyze", action="store_true",
                    help="skip the analyze measurement (the set analysed before): only --hta "
                         "and --checks")
    ap.add_argument("--clean", action="store_true", help="delete the set and exit")
    a = ap.parse_args()
    if a.clean:
        shutil.rmtree(a.out, ignore_errors=True)
        print(f"deleted {a.out}")
        return 0
    if a.rewrite or not (a.out / ".complete").exists():
        shutil.rmtree(a.out, ignore_errors=True)
        t = time.perf_counter()
        files = write(a.source, a.out, a.ranks, a.gb, a.gzip)
        print(f"wrote {len(files)} traces under {a.out} in {time.perf_counter() - t:.0f} s")
    files = sorted(p for p in a.out.iterdir() if p.name.endswith((".json", ".json.gz")))
    sizes = [_json_bytes(p) for p in files]
    per_rank = max(sizes)
    print(f"set: {len(files)} ranks, {per_rank / 2**20:.0f} MiB of JSON per rank "
          f"({sum(sizes) / 2**30:.2f} GiB in all) from {a.source}")
    failed: list[str] = []

    r = analyze_measured(a.out, a.workers, per_rank, failed) if not a.no_analyze else None
    if r is None and not a.no_analyze:
        return 1

    if a.hta:
        from ingest import HTA_SNIPPET, ensure_hta

        h = run_sampled([str(ensure_hta()), "-c", HTA_SNIPPET, str(a.out)],
                        cap_bytes=int(a.hta_cap_gb * 2**30), timeout=a.hta_timeout)
        if h["rc"] == 0 and not h["stopped"]:
            print(f"HTA: {h['wall_s']:.1f} s wall, peak {h['tree_peak'] / 2**20:.0f} MiB"
                  + (f" ({h['wall_s'] / r['wall_s']:.1f}x uberprof's time; uberprof's tree "
                     f"{r['tree_peak'] / 2**20:.0f} MiB)" if r else ""))
        else:
            why = h["stopped"] or f"exit {h['rc']}: {h['stderr'].strip().splitlines()[-1:]}"
            print(f"HTA did not finish: {why}, after {h['wall_s']:.0f} s "
                  f"(memory cap {a.hta_cap_gb:.0f} GiB, timeout {a.hta_timeout:.0f} s)")

    if a.checks:
        rep = run_sampled([sys.executable, "-m", "uberprof", "report", str(a.out)])
        print(f"uberprof report: exit {rep['rc']}, {rep['wall_s']:.1f} s, peak "
              f"{rep['tree_peak'] / 2**20:.0f} MiB")
        if rep["rc"] != 0:
            failed.append("report")
            print(rep["stderr"][-800:])
        target = Path("/tmp") / f"{a.out.name}-export.json.gz"
        ex = run_sampled([sys.executable, "-m", "uberprof", "export", str(a.out), "-o",
                          str(target)])
        if ex["rc"] == 0 and target.exists():
            size = _json_bytes(target)
            print(f"uberprof export: {ex['wall_s']:.1f} s, peak {ex['tree_peak'] / 2**20:.0f} "
                  f"MiB, {size / 1e6:.0f} MB of JSON ({target.stat().st_size / 1e6:.0f} MB "
                  f"gzip), budget 500 MB: {'met' if size <= 500e6 else 'MISSED'}")
            if size > 500e6:
                failed.append("export budget")
            target.unlink()
        else:
            failed.append("export")
            print(f"uberprof export failed ({ex['rc']}): {ex['stderr'][-800:]}")
        from dashboard import start_to_drawn

        try:
            d = start_to_drawn(a.out)
            print(f"uberprof dashboard (analysed set): started -> overview drawn in Chromium "
                  f"{d['drawn_s']:.1f} s (URL printed {d['url_printed_s']:.1f} s)")
        except Exception as exc:  # noqa: BLE001 - printed as the check's result
            failed.append("dashboard")
            print(f"uberprof dashboard: overview not drawn ({exc})"[:800])
    print("bound and checks: " + ("all met" if not failed else "missed: " + ", ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
