"""Scale-out (issue 8): the per-rank map on a Dask cluster gives the same tables as the local
process pool; clear messages when Dask is missing, the cluster cannot be reached, or a worker
cannot see the traces or the derived folder; the cross-rank reduce streams rank by rank."""

from __future__ import annotations

import gzip
import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests._jobs import ROOT, load_script
from uberprof.analysis.tables import derived, pool
from uberprof.analysis.tables.derived import read_small
from uberprof.analysis.tables.pipeline import analyze
from uberprof.cli import main

HAVE_DASK = importlib.util.find_spec("distributed") is not None
needs_dask = pytest.mark.skipif(
    not HAVE_DASK, reason="dask.distributed is not installed (pip install 'uberprof[dask]'; "
                          "`make test` installs it through the dev extra)")
STRAGGLER = 5


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 synthetic NCCL ranks on 2 nodes (benchmarks/synth_run.py), 2 trace windows each,
    rank 5 throttled; plus what must fail the same way everywhere: rank 2 without traces and
    rank 3 with one window's trace cut off."""
    s = load_script(ROOT / "benchmarks" / "synth_run.py", "synth_run")
    out = tmp_path_factory.mktemp("scale") / "run8"
    cfg = s.Config(out=out, ranks=8, steps=40, gpus_per_node=4, windows=[(10, 12), (30, 31)],
                   straggler=STRAGGLER, cause="throttle", slow=1.3, counters=False, seed=3,
                   step_ms=100.0, layers=2)
    s.write_run(cfg, log=lambda *_: None)
    shutil.rmtree(out / "ranks" / "2" / "traces")
    bad = next((out / "ranks" / "3" / "traces").glob("steps-000030*"))
    raw = gzip.decompress(bad.read_bytes())
    bad.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    return out


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two single-threaded worker processes: the map really crosses process boundaries."""
    if not HAVE_DASK:
        pytest.skip("dask.distributed is not installed")
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=40) as lc, Client(lc) as client:
        yield client


def tables(derived: Path) -> dict[str, Any]:
    """Every table and document under a derived folder, by relative path (the manifest as a
    mapping: the order in which workers finish is not a result)."""
    out: dict[str, Any] = {}
    for p in sorted(derived.rglob("*")):
        rel = p.relative_to(derived).as_posix()
        if p.suffix == ".parquet":
            out[rel] = pq.read_table(p)
        elif p.suffix == ".arrow":  # an input's small tables, a rank's step timeline
            out[rel] = read_small(p)
        elif p.suffix == ".json":
            out[rel] = orjson.loads(p.read_bytes())
    return out


def assert_same(a: Path, b: Path) -> None:
    ta, tb = tables(a), tables(b)
    assert sorted(ta) == sorted(tb)
    assert sum(k.endswith("events.arrow") for k in ta) == 13  # 8 ranks x 2, less 3
    for k, va in ta.items():
        vb = tb[k]
        if k.endswith((".parquet", ".arrow")):
            assert va.schema == vb.schema, k
            if k.startswith("diagnosis/"):
                # The diagnosis orders some rows by time only, and ranks of one host can tie
                # (collectives.py: unmatched ORDER BY start_ns): compare its rows as a set.
                keys = [(c, "ascending") for c in va.column_names]
                va, vb = va.sort_by(keys), vb.sort_by(keys)
            assert va.equals(vb), f"{k} differs"
        else:
            assert va == vb, f"{k} differs"


@needs_dask
def test_dask_map_gives_the_tables_of_the_local_pool(run: Path, cluster: Any,
                                                     tmp_path: Path) -> None:
    from uberprof.analysis.diagnosis.advisor import diagnose
    from uberprof.analysis.diagnosis.saved import save as save_diagnosis

    local = analyze(run, out=tmp_path / "local", workers=2)
    remote = analyze(run, out=tmp_path / "dask", executor=cluster.get_executor(pure=False))
    assert remote.analysed == local.analysed == 14
    assert remote.summary == local.summary
    assert remote.ranks == local.ranks
    assert any("truncated" in p or "cut off" in p or "gzip" in p
               for p in remote.summary["problems"]), remote.summary["problems"]
    assert any("rank(s) 2" in p for p in remote.summary["problems"])
    assert_same(tmp_path / "local", tmp_path / "dask")

    # The report built on either set of tables is the same, with its per-rank part run in
    # this process, on forked workers or on the cluster.
    serial = diagnose(run, out=tmp_path / "local", workers=1)
    assert serial.straggler is not None and serial.straggler.rank == STRAGGLER
    assert serial.gaps.num_rows > 0 and serial.top_gaps
    for name, d in (("local", diagnose(run, out=tmp_path / "local", workers=2)),
                    ("dask", diagnose(run, out=tmp_path / "dask",
                                      executor=cluster.get_executor(pure=False)))):
        assert d.to_json() == serial.to_json(), name
        assert d.gaps.equals(serial.gaps), name
        assert d.top_gaps == serial.top_gaps, name
        save_diagnosis(d)
    assert_same(tmp_path / "local", tmp_path / "dask")

    # Up to date: nothing is sent to the cluster again.
    again = analyze(run, out=tmp_path / "dask", executor=cluster.get_executor(pure=False))
    assert again.analysed == 0 and again.summary == local.summary


@needs_dask
def test_cli_dask_local_prints_what_the_local_pool_prints(run: Path, tmp_path: Path) -> None:
    def cli(*args: str) -> tuple[int, str, str]:
        res = CliRunner().invoke(main, ["analyze", str(run), "--json", *args])
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            raise res.exception
        return res.exit_code, res.stdout, res.stderr

    code_l, out_l, _ = cli("--out", str(tmp_path / "local"))
    code_d, out_d, err_d = cli("--out", str(tmp_path / "dask"), "--dask", "local",
                               "--workers", "1")
    assert code_l == code_d == 0, err_d
    assert orjson.loads(out_d) == orjson.loads(out_l)
    assert_same(tmp_path / "local", tmp_path / "dask")


def test_missing_dask_is_one_clear_line(run: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from uberprof.analysis.tables.distributed import DaskUnavailable, dask_executor

    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(DaskUnavailable, match=r"pip install 'uberprof\[dask\]'"), \
            dask_executor("local"):
        pass
    res = CliRunner().invoke(main, ["analyze", str(run), "--out", str(tmp_path / "d"),
                                    "--dask", "tcp://127.0.0.1:8786"])
    assert res.exit_code == 2
    assert "Dask is not installed" in res.stderr and "uberprof[dask]" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "d").exists()  # nothing analysed


@needs_dask
def test_unreachable_scheduler_is_named(run: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from uberprof.analysis.tables import distributed as D

    monkeypatch.setattr(D, "CONNECT_TIMEOUT_S", 1)
    res = CliRunner().invoke(main, ["analyze", str(run), "--out", str(tmp_path / "d"),
                                    "--dask", "tcp://127.0.0.1:9"])
    assert res.exit_code == 2, res.output
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in res.stderr


def test_a_worker_that_cannot_see_the_trace_or_the_tables_says_so(run: Path,
                                                                  tmp_path: Path) -> None:
    """What a worker elsewhere reports (no shared file system), and what the client concludes
    when a worker wrote its tables where the client cannot read them."""
    missing = pool.analyze_shared(str(tmp_path / "nowhere.json"), str(tmp_path / "o"))
    assert missing["status"] == "error"
    assert "not found on worker" in missing["message"] and "shared file system" in \
        missing["message"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    trace = next(run.glob("ranks/0/traces/*.gz"))
    res = pool.analyze_shared(str(trace), str(blocked / "o"))
    assert res["status"] == "error" and "cannot write its tables" in res["message"]

    ok = pool.analyze_shared(str(trace), str(tmp_path / "o"))
    assert ok["status"] == "ok" and set(ok) == {"status", "message", "host", "format"}

    def job(out: Path) -> Any:
        return pool.Job("t", {}, {}, str(trace), str(trace), str(out), trace=True)

    elsewhere = pool._visible(job(tmp_path / "not-here"), ok)
    assert elsewhere["status"] == "error" and "not visible here" in elsewhere["message"]
    old = pool._visible(job(tmp_path / "o"), {**ok, "format": -1})
    assert old["status"] == "error" and "same uberprof version" in old["message"]
    assert pool._visible(job(tmp_path / "o"), ok) is ok

    # A rank's step timeline goes through the same wrapper.
    tl = pool.analyze_shared(str(run / "ranks" / "0"), str(tmp_path / "t" / "0.arrow"),
                                 False)
    assert tl["status"] == "ok" and tl["rows"] == 40 and tl["truncated"] is False
    assert read_small(tmp_path / "t" / "0.arrow").num_rows == 40


def test_step_timelines_are_read_in_the_map_and_again_only_when_they_change(
        run: Path, tmp_path: Path) -> None:
    """steps.jsonl becomes a small table per rank in the map (on the workers, cached like the
    traces); the cross-rank step reads only those tables. A live run's growing timeline is
    read again, and a cut-off last line is reported."""
    live = tmp_path / "live"
    shutil.copytree(run, live, ignore=shutil.ignore_patterns("derived"))
    out = tmp_path / "d"
    first = analyze(live, out=out, workers=1)
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert sorted(manifest["timelines"]) == [f"ranks/{r}" for r in range(8)]
    assert all(e["status"] == "ok" and e["rows"] == 40 for e in manifest["timelines"].values())
    assert len(list((out / "timelines").glob("*.arrow"))) == 8

    tl = live / "ranks" / "6" / "steps.jsonl"
    last = orjson.loads(tl.read_bytes().splitlines()[-1])
    extra = {**last, "step": 40, "host_start_ns": last["host_end_ns"],
             "host_end_ns": last["host_end_ns"] + 90_000_000}
    with tl.open("ab") as f:
        f.write(orjson.dumps(extra) + b"\n" + b'{"kind": "step", "st')
    again = analyze(live, out=out, workers=1)
    assert again.analysed == 0  # no trace read again
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["timelines"]["ranks/6"]["rows"] == 41
    assert manifest["timelines"]["ranks/6"]["truncated"] is True
    assert next(r for r in again.ranks if r["rank"] == 6)["steps"] == 41
    assert next(r for r in first.ranks if r["rank"] == 6)["steps"] == 40
    assert any(p.startswith(str(tl)) and "cut-off line; 41 whole steps kept" in p
               for p in again.summary["problems"])
    steps = pq.read_table(out / "steps.parquet").to_pylist()
    new = [r for r in steps if r["rank"] == 6 and r["step"] == 40]
    assert len(new) == 1 and new[0]["traced"] is False and new[0]["step_time_ns"] == 90_000_000


def test_reduce_streams_rank_by_rank(run: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Run-level tables written in many small row groups hold the same rows as one piece."""
    analyze(run, out=tmp_path / "one", workers=1)
    monkeypatch.setattr(derived.ParquetOut, "GROUP_ROWS", 7)
    analyze(run, out=tmp_path / "many", workers=1)
    steps = pq.ParquetFile(tmp_path / "many" / "steps.parquet")
    assert steps.metadata.num_row_groups >= 8  # one per rank at least
    assert_same(tmp_path / "one", tmp_path / "many")
    assert not list((tmp_path / "many").glob(".*.tmp"))


def _pid_or_die(i: int) -> int:
    import os

    if i == 3:
        os._exit(7)
    return os.getpid()


def test_map_calls_runs_each_call_in_a_worker_and_survives_one_that_dies() -> None:
    """The diagnosis's per-rank part runs on the analysis's forked workers: each call in another
    process, and a call whose process dies is reported as such, the others kept."""
    import os

    got = dict(pool.map_calls(_pid_or_die, [(i,) for i in range(6)], workers=2))
    assert sorted(got) == list(range(6))
    assert isinstance(got[3], RuntimeError) and "exit code 7" in str(got[3])
    pids = {v for k, v in got.items() if k != 3}
    assert os.getpid() not in pids and len(pids) >= 1


def test_a_reduce_whose_rank_parts_are_made_on_workers_writes_the_tables_made_in_one_process(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from uberprof.analysis.tables import reduce

    sent: list[Any] = []
    on_workers = reduce.map_calls

    def counted(fn: Any, arg_lists: Any, workers: int, executor: Any = None) -> Any:
        # (the folder its parts' step rows are handed over in, what, ...)
        sent.extend(args[3] if args[1] == "rank" else args[1] for args in arg_lists)
        return on_workers(fn, arg_lists, workers, executor)

    monkeypatch.setattr(reduce, "map_calls", counted)
    monkeypatch.setattr(reduce, "PARALLEL_RANKS", 2)  # the 8 ranks' parts go to the workers
    run = _copied(run, tmp_path / "run")
    (run / "ranks" / "4" / "flight-recorder.jsonl").write_bytes(b"not a dump\n")
    one = analyze(run, out=tmp_path / "one", workers=1)
    assert sent == []  # one worker: made here
    two = analyze(run, out=tmp_path / "two", workers=2)
    assert sent == ["damage", *range(8)]  # the damage check and every rank's part, on the
    #                                          (forked) workers
    assert two.summary == one.summary and two.ranks == one.ranks
    assert "flight-recorder.jsonl" in two.summary["problems"][0]  # the damage named first
    assert [r["rank"] for r in two.ranks] == list(range(8))  # written in rank order
    assert_same(tmp_path / "one", tmp_path / "two")
    assert not list((tmp_path / "two").glob(".parts-*"))  # the handed-over rows' files gone


def test_a_reduce_removes_the_rows_a_killed_reduce_handed_over_and_keeps_a_running_ones(
        tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from uberprof.analysis.tables import reduce

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    left = tmp_path / f"{reduce.PARTS_PREFIX}{dead}-0a1b2c3d"
    running = tmp_path / f"{reduce.PARTS_PREFIX}{os.getpid()}-0a1b2c3d"
    for folder in (left, running):
        folder.mkdir()
        (folder / "rank-3.arrow").write_bytes(b"rows")
    reduce.clear_stale_parts(tmp_path)
    assert not left.exists() and (running / "rank-3.arrow").exists()


def _copied(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("derived"))
    return to


def test_a_worker_stops_when_its_parent_dies_without_telling_it(tmp_path: Path) -> None:
    """A forked worker must not outlive its parent (a dashboard stopped with Ctrl-C while it
    analysed): it held its own pipe's other end, so it never saw the parent go and waited for
    ever."""
    import subprocess

    import psutil

    script = (
        "import multiprocessing, os, time\n"
        "from uberprof.analysis.tables import pool\n"
        "calls = pool.map_calls(time.sleep, [(0.0,)] * 4, workers=2)\n"
        "next(calls)\n"  # both workers forked, one answered: they wait for the next call
        "print(' '.join(str(p.pid) for p in multiprocessing.active_children()), flush=True)\n"
        "os._exit(0)\n")  # gone, without a word to its workers
    said = tmp_path / "pids"
    with said.open("w") as f:  # a file, not a pipe: a worker left behind would hold a pipe open
        subprocess.run([sys.executable, "-c", script], stdout=f, timeout=120, cwd=ROOT,
                       check=True)
    out = said.read_text()
    workers = [psutil.Process(int(pid)) for pid in out.split() if psutil.pid_exists(int(pid))]
    _, left = psutil.wait_procs(workers, timeout=30)
    assert not left, f"workers still running after their parent died: {[p.pid for p in left]}"


def test_analyze_tells_its_progress_in_stages_traces_then_timelines_then_ranks_combined(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preparing page and the bar stayed on "reading traces: N of N" while a 512-rank run's
    step timelines were read and its ranks combined (10 of its 20 s): each stage counts."""
    from uberprof.analysis.tables import reduce

    monkeypatch.setattr(reduce, "PARALLEL_RANKS", 2)  # told from this many ranks
    seen: list[tuple[str, int, int]] = []
    analyze(_copied(run, tmp_path / "run"), out=tmp_path / "d", workers=2,
            progress=lambda done, total, label, stage="reading traces":
            seen.append((stage, done, total)))
    stages = [s for i, (s, _, _) in enumerate(seen) if i == 0 or seen[i - 1][0] != s]
    assert stages == ["reading traces", "reading step timelines", "combining ranks"]
    for stage, n in (("reading traces", 14), ("reading step timelines", 8),
                     ("combining ranks", 8)):  # rank 2 has no trace
        counts = [(d, t) for s, d, t in seen if s == stage]
        assert counts[-1] == (n, n) and all(t == n for _, t in counts)
        done = [d for d, _ in counts]
        assert done == sorted(set(done))  # only forward
