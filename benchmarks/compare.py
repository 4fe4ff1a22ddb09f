"""Compare this checkout against an older commit, side by side: ingest, report at scale, dashboard start.

    python benchmarks/compare.py --base 226a987              # the three benchmarks, 3 pairs
    python benchmarks/compare.py --base 226a987 --only report --ranks 64 --pairs 2
    python benchmarks/compare.py --base v0.3 --head HEAD~1    # two commits, neither the work tree
    make bench-compare [BASE=226a987]                         # the last tag when BASE is not given

REF is checked out with `git worktree add --detach` under a temporary folder (removed at the
end) and run with this virtual environment's python and PYTHONPATH pointing at its tree: nothing
is installed. The top-level dashboards/ folder is installed as `uberprof.dashboards` (a
package-dir mapping); in the temporary tree a link uberprof/dashboards -> ../dashboards gives
it the same name, and each side is checked before it is measured (`uberprof` and
`uberprof.dashboards` must both import from its own tree, not from the editable install of the
work tree). Every command runs from an empty folder, so the current directory adds nothing to
sys.path. `--head` defaults to the work tree (uncommitted changes included). Both trees are
byte-compiled first (`compileall`), as an installed package is: the measured processes run
with PYTHONDONTWRITEBYTECODE, and a fresh worktree has no bytecode, so each process compiled
every module it imported again (measured: ~0.1 s of CPU per `analyze`, more for the side with
more code).

The benchmarks, each a whole process (`python -m uberprof ...`, imports included):

- ingest: `uberprof analyze --force` on benchmarks/ingest.py's NCCL-shaped sets (`--only nccl`),
  each as it is and as the eight-rank set ingest.py builds from ../shared/traces;
- report: `uberprof report --json` on `synth_run.py --ranks R --steps S --layers L
  --trace-steps 50-52` (512 x 200 x 8 by default), into a fresh --out each time (the analysis of
  the traces included, as on a run seen for the first time);
- dashboard: `uberprof dashboard --port 0` on the report's run with the tables that side's
  report wrote (analysed start), to the URL printed and to the server's "ready in" line (no
  browser: benchmarks/dashboard.py draws the pages).

The two sides run in interleaved pairs (base then head, head then base on the next pair), so a
busy spell on this shared machine falls on both. For each pair the ratio head / base is taken;
the table gives the median ratio and its spread (min-max over the pairs) for wall time, CPU time
(the child's and its workers', from wait4's rusage) and peak memory: the client's (the main
process's largest RSS, sampled every 50 ms) and the whole tree's (summed PSS of the process and
its workers). Below 1.00 the head is faster or smaller. The load average before and after is
printed: on a busy machine read CPU time and memory, not wall time. `--json FILE` keeps every
run. Exit code 1 when a side fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ingest
from _common import ROOT, doc_parser

PY = sys.executable
DATA = HERE / ".bench-data"
SAMPLE_S = 0.05


# --- the two checkouts -------------------------------------------------------------------------

def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def last_tag() -> str | None:
    try:
        return git("describe", "--tags", "--abbrev=0") or None
    except subprocess.CalledProcessError:
        return None


class Side:
    """One checkout: its tree and the environment that runs its code."""

    def __init__(self, label: str, tree: Path, commit: str, tmp: Path) -> None:
        self.label, self.tree, self.commit = label, tree, commit
        self.cwd = tmp / f"cwd-{label}"
        self.cwd.mkdir(exist_ok=True)
        self.env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
        self.env.pop("PYTHONSTARTUP", None)

    def cmd(self, *args: str) -> list[str]:
        return [PY, "-m", "uberprof", *args]

    def check(self) -> None:
        """Both packages import from this tree (not from the editable install of the work tree)."""
        code = ("import uberprof, uberprof.dashboards as d; "
                "print(uberprof.__file__); print(d.__file__)")
        out = subprocess.run([PY, "-c", code], cwd=self.cwd, env=self.env, capture_output=True,
                             text=True, check=True).stdout.split()
        for f in out:
            if not Path(f).resolve().is_relative_to(self.tree.resolve()):
                raise SystemExit(f"{self.label}: {f} is not in {self.tree}: the mapping is wrong")

    def compile(self) -> None:
        """Byte-compile the tree's packages once, as an install does: with
        PYTHONDONTWRITEBYTECODE every measured process compiled every module it imported
        from source again (~0.1 s of `analyze`'s 0.5 s, more for the side with more code)."""
        for folder in ("uberprof", "dashboards"):
            if (self.tree / folder).is_dir():
                subprocess.run([PY, "-m", "compileall", "-q", str(self.tree / folder)],
                               check=False, capture_output=True)


def checkout(ref: str, tmp: Path, label: str) -> Side:
    """REF in a detached worktree under `tmp`, with uberprof/dashboards linked to dashboards/."""
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = tmp / label
    git("worktree", "add", "--detach", str(tree), commit)
    link = tree / "uberprof" / "dashboards"
    if (tree / "dashboards").is_dir() and not link.exists():
        link.symlink_to(Path("..") / "dashboards")
    return Side(label, tree, commit, tmp)


def remove(side: Side) -> None:
    if side.tree != ROOT:
        subprocess.run(["git", "worktree", "remove", "--force", str(side.tree)], cwd=ROOT,
                       capture_output=True, check=False)


# --- measuring one process ---------------------------------------------------------------------

def _mem(ps: Any) -> tuple[int, int]:
    """(main process RSS, summed PSS of the tree)."""
    import psutil

    rss = pss = 0
    try:
        rss = ps.memory_info().rss
    except psutil.Error:
        pass
    for p in [ps, *ps.children(recursive=True)]:
        try:
            pss += p.memory_full_info().pss
        except psutil.Error:
            pass
    return rss, pss


def measure(cmd: list[str], side: Side, until: str | None = None,
            timeout: float = 3600) -> dict[str, Any]:
    """Run `cmd` for `side`: wall, CPU (the process and the workers it waited for), peak client
    RSS and tree PSS. `until`: stop it (SIGTERM) once a line of its output contains this
    (a server), timing the first line with a URL as well."""
    import psutil

    t0 = time.perf_counter()
    out_f = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(cmd, cwd=side.cwd, env=side.env, stdout=out_f,
                            stderr=subprocess.STDOUT, text=True)  # a file: never a full pipe
    ps = psutil.Process(proc.pid)
    try:
        status, ru, url_s, wall, stopped, peak_rss, peak_pss = _watch(
            proc, ps, t0, until, out_f, timeout)
    except BaseException:  # the benchmark stopped (SIGTERM, Ctrl-C): so is what it measures
        proc.kill()
        proc.wait()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    out_f.seek(0)
    out = out_f.read()
    out_f.close()
    if not stopped and (proc.returncode != 0 or until):
        raise RuntimeError(f"{side.label}: {' '.join(cmd[2:])} exited {proc.returncode}:\n"
                           f"{out[-2000:]}")
    res = {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
           "rss_mib": peak_rss / 2**20, "pss_mib": peak_pss / 2**20,
           "maxrss_mib": ru.ru_maxrss / 1024}
    if until:
        res["url_s"] = url_s
    return res


def _watch(proc: subprocess.Popen[str], ps: Any, t0: float, until: str | None, out_f: Any,
           timeout: float) -> tuple[int, Any, float | None, float, bool, int, int]:
    """Sample the process's memory until it exits (wait4: its rusage and its waited-for
    children's); with `until`, SIGTERM it once its output has that line."""
    peak_rss = peak_pss = 0
    url_s = None
    wall = 0.0
    stopped = False
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if not stopped:
            rss, pss = _mem(ps)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        if until and not stopped:
            out_f.seek(0)
            text = out_f.read()
            if url_s is None and "http://" in text:
                url_s = time.perf_counter() - t0
            if until in text:
                wall = time.perf_counter() - t0
                proc.terminate()
                stopped = True
        if time.perf_counter() - t0 > timeout:
            proc.kill()
        time.sleep(SAMPLE_S)
    if not stopped:
        wall = time.perf_counter() - t0
    return status, ru, url_s, wall, stopped, peak_rss, peak_pss


# --- the benchmarks ----------------------------------------------------------------------------

def ingest_cases(replicas: int) -> list[tuple[str, Path]]:
    folders = [(name, ingest.SHARED / name) for name in ingest.NCCL_SETS]
    cases = [(f"analyze {n}", f) for n, f in folders]
    if replicas:
        cases += [(f"analyze {n} x{replicas}", ingest.replicate(f, replicas)) for n, f in folders]
    return cases


def synth(ranks: int, steps: int, layers: int) -> Path:
    dest = DATA / f"compare-r{ranks}-s{steps}-l{layers}-v1"
    if not (dest / ".complete").exists():
        t = time.perf_counter()
        subprocess.run([PY, str(HERE / "synth_run.py"), str(dest / "run"), "--ranks", str(ranks),
                        "--steps", str(steps), "--layers", str(layers), "--trace-steps",
                        "50-52"], check=True, capture_output=True)
        (dest / ".complete").touch()
        print(f"wrote {dest / 'run'} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return dest / "run"


def pairs_of(label: str, sides: list[Side], pairs: int,
             run_one: Any) -> dict[str, Any]:
    """`pairs` interleaved pairs of `run_one(side, i)`, the order swapped every other pair."""
    runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in sides}
    for i in range(pairs):
        for s in (sides if i % 2 == 0 else sides[::-1]):
            runs[s.label].append(run_one(s, i))
    row = {"case": label, "runs": runs}
    print(line(row, sides), flush=True)
    return row


KEYS = [("wall_s", "wall s"), ("cpu_s", "cpu s"), ("rss_mib", "client MiB"),
        ("pss_mib", "tree PSS MiB")]


def ratio(row: dict[str, Any], sides: list[Side], key: str) -> tuple[float, float, float]:
    base, head = (row["runs"][s.label] for s in sides)
    rs = [h[key] / b[key] for b, h in zip(base, head, strict=True) if b.get(key)]
    return statistics.median(rs), min(rs), max(rs)


def _figures(row: dict[str, Any], sides: list[Side], key: str) -> tuple[str, str]:
    """"base -> head" medians of `key` and "ratio (spread)" for one benchmark row."""
    base, head = (row["runs"][s.label] for s in sides)
    b = statistics.median(r[key] for r in base)
    h = statistics.median(r[key] for r in head)
    m, lo, hi = ratio(row, sides, key)
    fmt = "{:.2f}" if key.endswith("_s") else "{:.0f}"
    return f"{fmt.format(b)} -> {fmt.format(h)}", f"{m:.2f}x ({lo:.2f}-{hi:.2f})"


def line(row: dict[str, Any], sides: list[Side]) -> str:
    base, head = (row["runs"][s.label] for s in sides)
    parts = [f"{row['case']}:"]
    for key, name in KEYS:
        medians, r = _figures(row, sides, key)
        parts.append(f"{name} {medians} = {r}")
    if "url_s" in base[0]:
        b = statistics.median(r["url_s"] or 0 for r in base)
        h = statistics.median(r["url_s"] or 0 for r in head)
        parts.append(f"URL printed {b:.2f} -> {h:.2f} s")
    return "\n  ".join(parts)


def markdown(rows: list[dict[str, Any]], sides: list[Side]) -> str:
    out = [("| benchmark | pairs | wall s, base -> head | wall ratio (spread) | CPU s | CPU ratio "
           "(spread) | client peak RSS MiB | ratio | tree peak PSS MiB | ratio |"),
           "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = row["runs"][sides[0].label]
        cells = [row["case"], str(len(base))]
        for key, _ in KEYS:
            medians, r = _figures(row, sides, key)
            m, spread = r.split(" ", 1)
            cells += [medians, f"**{m}** {spread}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    p = doc_parser(__doc__)
    p.add_argument("--base", default=None, help="the commit to compare against (default: the "
                   "last tag)")
    p.add_argument("--head", default=None, help="the commit measured (default: the work tree)")
    p.add_argument("--only", default="ingest,report,dashboard",
                   help="comma-separated: ingest, report, dashboard")
    p.add_argument("--pairs", type=int, default=3, help="interleaved pairs per benchmark")
    p.add_argument("--report-pairs", type=int, default=None,
                   help="pairs for report and dashboard (default: --pairs)")
    p.add_argument("--replicas", type=int, default=8, help="ranks of the copied NCCL sets (0: none)")
    p.add_argument("--sets", default="all", help="ingest: 'x8' for the eight-rank copies only")
    p.add_argument("--ranks", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--workers", type=int, default=None, help="--workers of every command")
    p.add_argument("--json", type=Path, help="write every run here")
    args = p.parse_args()

    base_ref = args.base or last_tag()
    if base_ref is None:
        raise SystemExit("no tag to compare against: give --base REF")
    only = set(args.only.split(","))
    # SIGTERM (a background job ignores Ctrl-C) ends it as an exception would: the worktree
    # and the measured process go with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    wk = ["--workers", str(args.workers)] if args.workers else []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="uberprof-compare-") as t:
        tmp = Path(t)
        base = checkout(base_ref, tmp, "base")
        head = (Side("head", ROOT, git("rev-parse", "HEAD") + "+work tree", tmp)
                if args.head is None else checkout(args.head, tmp, "head"))
        sides = [base, head]
        try:
            for s in sides:
                s.check()
                s.compile()
            print(f"base {base_ref} = {base.commit[:12]}; head {head.commit[:12] if args.head else head.commit}"
                  f" ({head.tree}); load average {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f} on "
                  f"{os.cpu_count()} CPUs; ratios are head / base (median of the pairs, "
                  f"min-max)", flush=True)
            rows: list[dict[str, Any]] = []
            if "ingest" in only:
                cases = ingest_cases(args.replicas)
                if args.sets == "x8":
                    cases = [c for c in cases if " x" in c[0]]
                for label, folder in cases:
                    def one(s: Side, i: int, folder: Path = folder) -> dict[str, Any]:
                        out = tmp / f"ingest-{s.label}"
                        shutil.rmtree(out, ignore_errors=True)
                        return measure(s.cmd("analyze", str(folder), "--out", str(out), "--force",
                                             *wk), s)
                    rows.append(pairs_of(label, sides, args.pairs, one))
            rp = args.report_pairs or args.pairs
            if only & {"report", "dashboard"}:
                run = synth(args.ranks, args.steps, args.layers)
                size = f"{args.ranks} ranks x {args.steps} steps, {args.layers} layers"
                analysed: dict[str, Path] = {}

                def rep(s: Side, i: int) -> dict[str, Any]:
                    out = tmp / f"report-{s.label}-{i}"
                    r = measure(s.cmd("report", str(run), "--json", "--out", str(out), *wk), s)
                    if s.label in analysed:
                        shutil.rmtree(out, ignore_errors=True)
                    else:
                        analysed[s.label] = out
                    return r
                if "report" in only:
                    rows.append(pairs_of(f"report --json, {size}", sides, rp, rep))
                else:
                    for s in sides:
                        rep(s, 0)
                if "dashboard" in only:
                    def dash(s: Side, i: int) -> dict[str, Any]:
                        return measure(s.cmd("dashboard", str(run), "--out",
                                             str(analysed[s.label]), "--port", "0"), s,
                                       until="ready in", timeout=900)
                    rows.append(pairs_of(f"dashboard start (analysed), {size}", sides, rp, dash))
        finally:
            for s in sides:
                remove(s)
    load1 = os.getloadavg()
    print(f"\nload average after: {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}\n")
    print(markdown(rows, sides))
    if args.json:
        args.json.write_text(json.dumps({"base": base.commit, "head": head.commit,
                                         "load_before": load0, "load_after": load1,
                                         "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
