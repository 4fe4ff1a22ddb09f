"""`uberprof dashboard` without a browser: its queries over synthetic runs (GPU counters,
throttling, a straggler, no traces, no counters), every page's layout, the safety rules (basic
authentication, Host check, nothing served from disk) and the command line."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from tests._jobs import PY, ROOT, job_env, load_script
from uberprof.cli import main
from uberprof.dashboards.queries import counters as counters_q
from uberprof.dashboards.queries import overview as overview_q
from uberprof.dashboards.queries import steps as steps_q
from uberprof.dashboards.queries import stragglers as stragglers_q
from uberprof.dashboards.queries.tables import heatmap_of_series

SYNTH_STRAGGLER = 5


def write_synth(out: Path, ranks: int = 8, steps: int = 60, counters: bool = True,
                straggler: int | None = SYNTH_STRAGGLER, cause: str = "throttle",
                step_ms: float = 100.0) -> Path:
    """A small synthetic GPU run (benchmarks/synth_run.py): 2 nodes of 4 GPUs, 3 traced
    steps, rank 5 throttled."""
    s = load_script(ROOT / "benchmarks" / "synth_run.py", "synth_run")
    cfg = s.Config(out=out, ranks=ranks, steps=steps, gpus_per_node=4, windows=[(20, 22)],
                   straggler=straggler, cause=cause, slow=1.3, counters=counters, seed=1,
                   step_ms=step_ms)
    s.write_run(cfg, log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def synth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synth(tmp_path_factory.mktemp("dash-synth") / "synth8")


@pytest.fixture(scope="session")
def synth_data(synth_run: Path) -> Any:
    from uberprof.dashboards.data import RunData

    data = RunData(root=synth_run, workers=1).load()
    data.warm()
    return data


def _pages() -> dict[str, Any]:
    from uberprof.dashboards.app import _pages

    return _pages()


def _text(component: Any) -> str:
    """All the text of a Dash component tree (for assertions on layouts)."""
    out: list[str] = []

    def walk(c: Any) -> None:
        if c is None:
            return
        if isinstance(c, (str, int, float)):
            out.append(str(c))
            return
        if isinstance(c, (list, tuple)):
            for x in c:
                walk(x)
            return
        walk(getattr(c, "children", None))

    walk(component)
    return " ".join(out)


def _component(component: Any, cid: str) -> Any:
    """The first component of a Dash tree whose id is `cid` (fails the test when none is)."""
    found: list[Any] = []

    def walk(c: Any) -> None:
        if isinstance(c, (list, tuple)):
            for x in c:
                walk(x)
        elif c is not None and not isinstance(c, (str, int, float)):
            if getattr(c, "id", None) == cid:
                found.append(c)
            walk(getattr(c, "children", None))

    walk(component)
    assert found, cid
    return found[0]


def _ids(component: Any) -> set[str]:
    found: set[str] = set()

    def walk(c: Any) -> None:
        if isinstance(c, (list, tuple)):
            for x in c:
                walk(x)
            return
        if c is None or isinstance(c, (str, int, float)):
            return
        if isinstance(getattr(c, "id", None), str):
            found.add(c.id)
        walk(getattr(c, "children", None))

    walk(component)
    return found


# --- the synthetic benchmark run itself ----------------------------------------------------------

def test_synth_run_cli_writes_a_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "s"
    proc = subprocess.run([PY, str(ROOT / "benchmarks" / "synth_run.py"), str(out), "--ranks",
                           "4", "--steps", "12", "--gpus-per-node", "2", "--trace-steps", "5-6",
                           "--straggler", "1"], capture_output=True, text=True, timeout=120, check=False,
                          env=job_env())
    assert proc.returncode == 0, proc.stderr
    assert (out / "run.json").is_file()
    for r in range(4):
        rd = out / "ranks" / str(r)
        assert (rd / "rank.json").is_file()
        assert len((rd / "steps.jsonl").read_text().splitlines()) == 12
        assert [p.name for p in (rd / "traces").iterdir()] == \
            ["steps-000005-000006.pt.trace.json.gz"]
    assert sorted(p.name for p in (out / "nodes").iterdir()) == ["gpu-node-00", "gpu-node-01"]
    assert (out / "nodes" / "gpu-node-00" / "counters" / "nvml.arrows").is_file()
    bad = subprocess.run([PY, str(ROOT / "benchmarks" / "synth_run.py"), str(tmp_path / "x"),
                          "--ranks", "2", "--straggler", "7"], capture_output=True, text=True, check=False,
                         timeout=60, env=job_env())
    assert bad.returncode == 2 and "not a rank" in bad.stderr


def test_gpu_clocks_are_each_ranks_own_samples(synth_data: Any) -> None:
    """The clocks grouped once per node against the per-rank definition: a rank's GPU's NVML
    samples in the window, median SM clock, max clock, share of slowdown samples, reasons."""
    from uberprof.analysis.diagnosis.gpu_clocks import gpu_clocks
    from uberprof.rundir.counters import counters_table, rank_gpus

    ctx = synth_data.ctx
    t = counters_table(ctx.root, sources=["nvml"], label_ranks=False)
    ts = t.column("ts_ns").to_numpy()
    window = (int(np.percentile(ts, 20)), int(np.percentile(ts, 80)))
    clocks = gpu_clocks(ctx, window)
    assert sorted(clocks) == sorted(rank_gpus(ctx.root)) == list(range(8))
    rows = [r for r in t.to_pylist() if window[0] <= r["ts_ns"] <= window[1]]
    for rank, (node, gpu) in rank_gpus(ctx.root).items():
        mine = [r for r in rows if r["node"] == node and r["device"] == gpu]

        def values(metric: str, mine: list = mine) -> np.ndarray:
            return np.array([r["value"] for r in mine if r["metric"] == metric])

        c = clocks[rank]
        assert c.samples == values("clock.sm").size > 0
        assert c.sm_clock_mhz == float(np.median(values("clock.sm")))
        assert c.sm_clock_max_mhz == float(values("clock.sm_max").max())
        assert c.slowdown_fraction == float(values("clocks_slowdown").mean())
        reasons = sorted({r["metric"] for r in mine if r["metric"].startswith("clocks_event.")}
                         - {"clocks_event.gpu_idle"})
        assert c.reasons == {m.split(".", 1)[1]: float(values(m).mean()) for m in reasons}
    assert clocks[SYNTH_STRAGGLER].slowdown_fraction > 0.5 > clocks[0].slowdown_fraction


def test_synth_run_is_diagnosed_as_written(synth_data: Any) -> None:
    """The generator's straggler and throttling come out of the real analysis."""
    h = overview_q.health(synth_data)
    assert h["ranks"] == 8 and h["hosts"] == 2 and h["steps"] == 60
    assert h["traced_steps"] == [20, 21, 22]
    assert h["device"] == "cuda"
    assert h["straggler"] is not None and h["straggler"]["rank"] == SYNTH_STRAGGLER
    assert h["straggler"]["cause"] == "clock_throttle"
    kinds = {f.kind for f in synth_data.findings()}
    assert "straggler" in kinds


# --- queries ------------------------------------------------------------------------------------

def test_heatmap_bins_steps_and_keeps_the_slowest(synth_data: Any) -> None:
    hm = overview_q.step_heatmap(synth_data)
    assert hm.ranks == list(range(8)) and hm.bin_steps == 1 and hm.z.shape == (8, 60)
    binned = heatmap_of_series(synth_data.step_series("step_time_ns"), max_cols=7, max_rows=3)
    assert binned.bin_steps == 9 and binned.z.shape[1] == 7
    assert binned.bin_ranks == 3 and binned.ranks == [0, 3, 6]
    # each cell is the maximum of its bin, and names the step it came from
    t = synth_data.steps.to_pydict()
    by = {(r, s): v for r, s, v in zip(t["rank"], t["step"], t["step_time_ns"])}
    cell = max((by[(r, s)], s) for r in range(3) for s in range(9))
    assert binned.z[0, 0] == pytest.approx(cell[0] / 1e6, rel=1e-6)
    assert binned.steps[0, 0] == cell[1]


def test_breakdown_parts_add_up_to_the_window(synth_data: Any) -> None:
    from uberprof.dashboards.data import BREAKDOWN_PARTS

    t = synth_data.breakdown_by_rank().to_pylist()
    assert len(t) == 8
    for row in t:
        assert sum(row[f"{k}_pct"] for k, _ in BREAKDOWN_PARTS) == pytest.approx(100.0, abs=1e-6)
        assert sum(row[f"{k}_ns"] for k, _ in BREAKDOWN_PARTS) == row["window_ns"]
    straggler = next(r for r in t if r["rank"] == SYNTH_STRAGGLER)
    others = [r for r in t if r["rank"] != SYNTH_STRAGGLER]
    # the others wait for it: more exposed communication than the straggler itself
    assert straggler["exposed_comm_pct"] < min(r["exposed_comm_pct"] for r in others)


def test_step_timeline_is_aligned_and_marks_the_last_arrival(synth_data: Any) -> None:
    tl = steps_q.step_timeline(synth_data, 21)
    assert [r.rank for r in tl.ranks] == list(range(8))
    for r in tl.ranks:
        assert {"compute", "comm"} <= set(r.parts)
        s, e = r.parts["compute"]
        assert (e >= s).all() and (s[1:] >= e[:-1]).all()  # merged, ordered, disjoint
        assert r.window[0] >= -5.0  # aligned: every rank starts near the step's origin
    last = [a for a in tl.arrivals if a["last"]]
    assert last and all(a["rank"] == SYNTH_STRAGGLER for a in last)
    assert steps_q.step_timeline(synth_data, 3) is None  # not traced
    assert steps_q.step_ranks(synth_data, 3).num_rows == 8


def test_lateness_ranking_and_median_rank(synth_data: Any) -> None:
    ranking = stragglers_q.lateness_ranking(synth_data)
    assert ranking[0]["rank"] == SYNTH_STRAGGLER
    assert ranking[0]["last_in"] == ranking[0]["instances"]
    median = stragglers_q.median_rank(synth_data)
    assert median is not None and median != SYNTH_STRAGGLER
    hm = stragglers_q.lateness_heatmap(synth_data)
    assert hm.x == [20, 21, 22]
    row = hm.ranks.index(SYNTH_STRAGGLER)
    assert np.nanmin(hm.z[row]) > np.nanmax(np.delete(hm.z, row, axis=0))


def test_counters_downsampled_and_throttling_found(synth_data: Any) -> None:
    cat = synth_data.counter_catalog()
    assert set(cat["nodes"]) == {"gpu-node-00", "gpu-node-01"} and cat["gpu"]
    node, gpu = synth_data.rank_gpu(SYNTH_STRAGGLER)
    assert (node, gpu) == ("gpu-node-01", "gpu1")
    cs = synth_data.counter_series(node, "nvml", "clock.sm", points=20)
    assert set(cs.devices) == {"gpu0", "gpu1", "gpu2", "gpu3"} and cs.unit == "MHz"
    t, v = cs.devices["gpu1"]
    assert len(t) <= 21 and (np.diff(t) > 0).all()
    assert np.median(v) < np.median(cs.devices["gpu0"][1]) - 200  # throttled clocks
    spans = counters_q.throttle_spans(synth_data, node)
    assert spans and {d for d, _, _ in spans} == {"gpu1"}
    assert all(hi >= lo for _, lo, hi in spans)
    assert counters_q.throttle_spans(synth_data, "gpu-node-00") == []
    starts, every = counters_q.step_boundaries(synth_data, 0, max_lines=25)
    assert every == 3 and len(starts) == 20 and starts[0] == pytest.approx(0.0, abs=0.01)


def test_every_page_renders_with_its_elements(synth_data: Any) -> None:
    from uberprof.dashboards.ui import Selection

    pages = _pages()
    expect = {
        "/": {"health", "findings", "step-heatmap", "rank-breakdown", "card-straggler"},
        "/steps": {"step-picker", "step-timeline", "arrivals-table", "step-ranks"},
        "/stragglers": {"straggler-verdict", "lateness-heatmap", "ranking-table",
                        "rank-counters"},
        "/gaps": {"gaps-rank", "gaps-by-rank"},
        "/communication": {"classes-table", "busbw", "comm-kinds", "comm-by-rank",
                           "rank-comm-table"},
        "/counters": {"counters-node", "counters-graph", "throttle-note"},
    }
    for path, ids in expect.items():
        sel = Selection(rank=SYNTH_STRAGGLER) if path == "/counters" else Selection()
        layout = pages[path].layout(synth_data, sel)
        assert ids <= _ids(layout), (path, ids - _ids(layout))
    over = _text(pages["/"].layout(synth_data, Selection()))
    assert f"rank {SYNTH_STRAGGLER}" in over and "clock_throttle" in over
    steps = pages["/steps"].layout(synth_data, Selection(step=4))
    assert "untraced-note" in _ids(steps) and "step-timeline" not in _ids(steps)


def test_run_without_traces_says_what_is_missing(tmp_path: Path) -> None:
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.ui import Selection

    run = write_synth(tmp_path / "nt", ranks=4, steps=20, counters=False, straggler=None)
    for rd in (run / "ranks").iterdir():
        shutil.rmtree(rd / "traces", ignore_errors=True)  # the window is past the last step
    data = RunData(root=run, workers=1).load()
    data.warm()
    assert not data.has_traces and data.diagnose() is None
    assert data.steps.num_rows == 80
    missing = " ".join(data.missing())
    assert "No traces" in missing and "No counters" in missing
    for path, page in _pages().items():
        layout = page.layout(data, Selection())
        assert "Traceback" not in _text(layout)
        if path == "/compare":  # about the baseline, not this run
            assert "no-baseline" in _ids(layout)
            continue
        assert "missing" in _ids(layout) or path == "/steps", path
    assert "step-heatmap" in _ids(_pages()["/"].layout(data, Selection()))


def test_cpu_run_without_gpu_counters(tmp_path: Path) -> None:
    """Host counters only (a CPU run): the GPU notice, host panels, no throttle marks."""
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.ui import Selection

    run = write_synth(tmp_path / "cpu", ranks=2, steps=30, straggler=None)
    for node in (run / "nodes").iterdir():
        (node / "counters" / "nvml.arrows").unlink()
        (node / "counters" / "index.json").unlink()
    data = RunData(root=run, workers=1).load()
    assert not data.counter_catalog()["gpu"]
    assert any("No GPU counters" in m for m in data.missing())
    layout = _pages()["/counters"].layout(data, Selection())
    assert "no-gpu-counters" in _ids(layout) and "throttle-note" not in _ids(layout)
    assert "No persistent straggler" in _text(_pages()["/stragglers"].layout(data, Selection()))


SHARED_TRACES = ROOT.parent / "shared" / "traces"


@pytest.mark.skipif(not (SHARED_TRACES / "hta" / "trace_filter").is_dir(),
                    reason=f"{SHARED_TRACES} not present")
def test_real_gpu_traces_folder(tmp_path: Path) -> None:
    """Two ranks of a 128-rank NCCL job recorded by others (a folder of traces, read-only):
    every page renders, the timeline has kernels and NCCL on both ranks, and it says that
    counters come with runs recorded by uberprof."""
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.ui import Selection

    data = RunData(root=SHARED_TRACES / "hta" / "trace_filter", out=tmp_path / "derived",
                   workers=1).load()
    data.warm()
    assert data.has_traces and not data.is_run_dir and data.ranks() == [0, 1]
    assert overview_q.health(data)["device"] == "cuda"
    step = data.traced_steps()[-1]
    tl = steps_q.step_timeline(data, step)
    assert [r.rank for r in tl.ranks] == [0, 1]
    assert all({"compute", "comm"} <= set(r.parts) for r in tl.ranks)
    assert any("folder of traces" in m for m in data.missing())
    for path, page in _pages().items():
        layout = page.layout(data, Selection())
        assert "page-error" not in _ids(layout), path
    assert data.findings()


def test_selection_round_trips_through_the_query() -> None:
    from uberprof.dashboards.ui import Selection

    sel = Selection.parse("?rank=3&step=120&node=n0")
    assert sel == Selection(rank=3, step=120, node="n0")
    assert sel.href("/gaps", step=None) == "/gaps?rank=3&node=n0"
    assert Selection.parse("?rank=x&step=") == Selection()
    assert Selection().query() == ""


# --- safety ---------------------------------------------------------------------------------------

def _client(data: Any, **kw: Any) -> Any:
    from uberprof.dashboards.app import create_app

    return create_app(data, warm=False, **kw).server.test_client()


def test_basic_auth_is_enforced(synth_data: Any) -> None:
    c = _client(synth_data, auth=("ada", "s3cret"))
    r = c.get("/")
    assert r.status_code == 401 and "Basic" in r.headers["WWW-Authenticate"]
    assert c.get("/_dash-layout").status_code == 401
    bad = base64.b64encode(b"ada:wrong").decode()
    assert c.get("/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
    good = base64.b64encode(b"ada:s3cret").decode()
    r = c.get("/", headers={"Authorization": f"Basic {good}"})
    assert r.status_code == 200 and r.headers["X-Frame-Options"] == "DENY"


def test_only_loopback_host_names_on_loopback(synth_data: Any) -> None:
    c = _client(synth_data)
    assert c.get("/", headers={"Host": "127.0.0.1:8050"}).status_code == 200
    assert c.get("/", headers={"Host": "localhost:8050"}).status_code == 200
    assert c.get("/", headers={"Host": "evil.example:8050"}).status_code == 421
    anywhere = _client(synth_data, allowed_hosts=None)
    assert anywhere.get("/", headers={"Host": "gpu-box:8050"}).status_code == 200


def test_nothing_is_served_from_disk(synth_data: Any, tmp_path: Path) -> None:
    c = _client(synth_data)
    for path in ("/static/../../etc/passwd", "/assets/../../../etc/passwd",
                 "/assets/%2e%2e/%2e%2e/etc/passwd", "/_dash-component-suites/dash/../../os.py",
                 f"/assets/{synth_data.root}/run.json", "/run.json", "/derived/steps.parquet"):
        r = c.get(path)
        assert b"root:" not in r.data and b"uberprof-run" not in r.data, path
        assert r.status_code in (200, 404), path
        if r.status_code == 200:  # unknown paths are the app's page (it says "Not found")
            assert r.mimetype == "text/html", path
    assert c.get("/assets/style.css").status_code == 200


# --- the command line -----------------------------------------------------------------------------

def test_cli_refuses_other_hosts_without_credentials(synth_run: Path) -> None:
    r = CliRunner().invoke(main, ["dashboard", str(synth_run), "--host", "0.0.0.0"],
                           env={"UBERPROF_DASHBOARD_AUTH": ""})
    assert r.exit_code == 2
    assert "refusing to listen on 0.0.0.0 without credentials" in r.output
    r = CliRunner().invoke(main, ["dashboard", str(synth_run), "--auth", "nopassword"])
    assert r.exit_code == 2 and "user:password" in r.output


def test_cli_nothing_to_show(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a run")
    r = CliRunner().invoke(main, ["dashboard", str(tmp_path / "empty"), "--port", "0"])
    assert r.exit_code == 1, r.output
    assert "nothing to show" in r.output


def test_cli_parse_auth_and_loopback() -> None:
    from uberprof.dashboards.server import is_loopback, parse_auth

    assert parse_auth("a:b:c") == ("a", "b:c")
    assert parse_auth(None) is None
    for bad in ("a", ":b", "a:"):
        with pytest.raises(ValueError):
            parse_auth(bad)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("127.0.1.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5")
    assert not is_loopback("gpu-box")


def test_server_credentials_exposure_and_serving(tmp_path: Path) -> None:
    """dashboards/server.py without the command line: where credentials come from, the refusal
    to expose a run, a port that is taken, and a server stopped when there is nothing to show."""
    import socket

    from uberprof.dashboards.server import (
        AUTH_ENV,
        ServeError,
        check_exposure,
        credentials,
        make_server,
        serve,
    )

    c = credentials(None, None, {AUTH_ENV: "ada:s3cret"})
    assert (c.auth, c.source, c.notes) == (("ada", "s3cret"), AUTH_ENV, ())
    assert credentials(None, None, {}).auth is None
    c = credentials("a:b", None, {})
    assert c.auth == ("a", "b") and c.source == "--auth" and "`ps`" in c.notes[0]
    creds = tmp_path / "creds"
    creds.write_text("ada:s3cret\n")
    creds.chmod(0o644)
    c = credentials(None, creds, {AUTH_ENV: "x:y"})
    assert c.auth == ("ada", "s3cret") and c.notes[0].startswith("warning: ")
    for args in (("a:b", creds), ("nopassword", None), (None, tmp_path / "absent")):
        with pytest.raises(ServeError) as exc:
            credentials(*args, {})
        assert exc.value.code == 2
    check_exposure("127.0.0.1", None)
    check_exposure("0.0.0.0", ("a", "b"))
    with pytest.raises(ServeError, match="refusing to listen on 0.0.0.0") as exc:
        check_exposure("0.0.0.0", None)
    assert exc.value.code == 2

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b""]

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ServeError, match="cannot listen on 127.0.0.1") as exc:
            make_server("127.0.0.1", s.getsockname()[1], app)
        assert exc.value.code == 1
    assert serve(make_server("127.0.0.1", 0, app), lambda: False) is False


def _serve(args: list[str], env: dict[str, str] | None = None,
           early: list[tuple[int, bytes]] | None = None
           ) -> tuple[subprocess.Popen[str], str, list[str]]:
    """`uberprof dashboard ARGS` until it says the run is ready: (process, URL, its lines).
    `early` gets what the URL answered as soon as it was printed (status, body)."""
    proc = subprocess.Popen([PY, "-m", "uberprof", "dashboard", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env or job_env())
    assert proc.stdout is not None
    lines: list[str] = []
    url = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"(http://\S+/)", line)
        if m and url is None:
            url = m.group(1)
            if early is not None:
                try:
                    with urllib.request.urlopen(url, timeout=30) as r:
                        early.append((r.status, r.read()))
                except urllib.error.HTTPError as e:
                    early.append((e.code, e.read()))
        if url is not None and "ready in" in line:
            return proc, url, lines
    proc.kill()
    raise AssertionError("no URL, or never ready, from uberprof dashboard:\n" + "".join(lines))


def _assert_basic_auth(url: str, credentials: bytes) -> None:
    """`url` answers 401 without credentials and 200 with them."""
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, timeout=30)
    assert e.value.code == 401
    req = urllib.request.Request(url, headers={
        "Authorization": "Basic " + base64.b64encode(credentials).decode()})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_cli_serves_the_run_and_requires_auth_off_loopback(synth_run: Path) -> None:
    early: list[tuple[int, bytes]] = []
    proc, url, lines = _serve([str(synth_run), "--port", "0"], early=early)
    try:
        assert url.startswith("http://127.0.0.1:")
        assert "8 rank(s), 60 step(s), 3 traced" in "".join(lines)
        # it listens at once: the URL comes before the run is ready, and answers (the page
        # that says how far preparation got, or the dashboard if it was that quick)
        assert next(i for i, x in enumerate(lines) if "http://" in x) < \
            next(i for i, x in enumerate(lines) if "ready in" in x)
        status, body = early[0]
        assert status == 200 or (status == 503 and b"Preparing the dashboard" in body)
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200 and b"uberprof" in r.read()
        with urllib.request.urlopen(url + "_dash-layout", timeout=30) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    env = {**job_env(), "UBERPROF_DASHBOARD_AUTH": "ada:s3cret"}
    proc, url, lines = _serve([str(synth_run), "--port", "0", "--host", "0.0.0.0"], env=env)
    try:
        assert "basic authentication required: user 'ada'" in "".join(lines)
        port = url.rsplit(":", 1)[1].strip("/")
        _assert_basic_auth(f"http://127.0.0.1:{port}/", b"ada:s3cret")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_page_while_preparing_says_how_far_behind_the_same_gate() -> None:
    import flask
    from werkzeug.test import Client

    from uberprof.dashboards.preparing import RELOAD_S, Switch, preparing_app

    stage = ["reading traces: 3 of 8"]
    app = preparing_app("run <7>", lambda: stage[0], ("ada", "s3cret"), ("127.0.0.1",))
    switch = Switch(app)
    client = Client(switch)
    here = "http://127.0.0.1:8050"  # the address it listens on
    auth = {"Authorization": "Basic " + base64.b64encode(b"ada:s3cret").decode()}
    r = client.get("/steps?rank=1", headers=auth, base_url=here)
    assert r.status_code == 503 and r.headers["Retry-After"] == str(RELOAD_S)
    page = r.get_data(as_text=True)
    assert "reading traces: 3 of 8" in page and "run &lt;7&gt;" in page  # escaped
    assert f"http-equiv='refresh' content='{RELOAD_S}'" in page
    assert r.headers["X-Frame-Options"] == "DENY" and r.headers["Cache-Control"] == "no-store"
    stage[0] = "diagnosing 8 rank(s)"
    assert "diagnosing 8 rank(s)" in client.get("/", headers=auth, base_url=here).get_data(as_text=True)
    assert client.get("/", base_url=here).status_code == 401  # the dashboard's gate, already
    assert client.get("/", headers=auth, base_url="http://evil.example").status_code == 421
    done = flask.Flask("done")
    done.add_url_rule("/", "root", lambda: "the dashboard")
    switch.to(done.wsgi_app)
    r = client.get("/", headers=auth, base_url=here)
    assert r.status_code == 200 and r.get_data(as_text=True) == "the dashboard"


def test_the_preparing_pages_question_is_held_until_its_stage_changes_or_the_dashboard_answers(
        ) -> None:
    """The page's script asks (HEAD, naming the stage it shows) and the server holds the
    question: answered with the new stage once it changes (not sooner than STAGE_EVERY_S),
    with 204 once the dashboard answers in its place, else after hold_s with the same stage."""
    import threading
    import time
    from urllib.parse import quote, unquote

    import flask
    from werkzeug.test import Client

    from uberprof.dashboards.preparing import (
        SHOWN_HEADER,
        STAGE_EVERY_S,
        STAGE_HEADER,
        Switch,
        preparing_app,
    )

    stage = ["reading traces: 3 of 8"]
    hold_s = 60.0  # far longer than any answer below should take
    switch = Switch(preparing_app("run", lambda: stage[0], None, None,
                                  moved=lambda: switch.moved, hold_s=hold_s))
    quick = Switch(preparing_app("run", lambda: stage[0], None, None, hold_s=0.3))

    def ask(app: Switch, answers: list[tuple[Any, float]]) -> threading.Thread:
        def _ask() -> None:
            t0 = time.monotonic()
            r = Client(app).head("/", headers={SHOWN_HEADER: quote(stage[0], safe="")})
            answers.append((r, time.monotonic() - t0))
        thread = threading.Thread(target=_ask)
        thread.start()
        return thread

    changed: list[tuple[Any, float]] = []
    thread = ask(switch, changed)
    time.sleep(0.2)
    assert not changed  # held
    stage[0] = "diagnosing 8 rank(s)"
    thread.join(timeout=30)
    (r, took), = changed
    assert r.status_code == 503 and unquote(r.headers[STAGE_HEADER]) == "diagnosing 8 rank(s)"
    assert STAGE_EVERY_S <= took < hold_s

    same: list[tuple[Any, float]] = []
    ask(quick, same).join(timeout=30)
    (r, took), = same
    assert r.status_code == 503 and unquote(r.headers[STAGE_HEADER]) == stage[0]
    assert took >= 0.3  # nothing changed: held for hold_s

    moved: list[tuple[Any, float]] = []
    thread = ask(switch, moved)
    time.sleep(0.2)
    done = flask.Flask("done")
    done.add_url_rule("/", "root", lambda: "the dashboard")
    switch.to(done.wsgi_app)
    thread.join(timeout=30)
    (r, took), = moved
    assert r.status_code == 204 and took < hold_s  # the page reloads into the dashboard


def test_a_dashboard_that_answers_before_its_run_is_ready_serves_its_scripts_and_waits_for_it(
        synth_data: Any) -> None:
    """The early switch of `uberprof dashboard`: the page and Dash's scripts are served at
    once (the browser loads them while the run is read), a page's callback waits for the run
    and then draws it, and a run that failed to prepare says why instead of waiting forever."""
    import threading

    from uberprof.dashboards.app import create_app
    from uberprof.dashboards.preparing import RunSoon

    soon = RunSoon("run-soon")
    c = create_app(soon).server.test_client()
    index = c.get("/")
    assert index.status_code == 200 and "<title>uberprof · run-soon</title>" in index.get_data(
        as_text=True)
    scripts = re.findall(r'<script src="([^"]+)"', index.get_data(as_text=True))
    assert scripts and all(c.get(s).status_code == 200 for s in scripts)  # before the run
    answered: list[tuple[int, str]] = []
    asking = threading.Thread(target=lambda: answered.append(_route(c, "/", "")))
    asking.start()
    asking.join(0.5)
    assert asking.is_alive() and not answered  # waits for the run
    soon.ready(synth_data)
    asking.join(30)
    [(status, body)] = answered
    assert status == 200 and "page-overview" in body and "step-heatmap" in body

    failed = RunSoon("run-failed")
    f = create_app(failed).server.test_client()
    failed.failed("nothing to show")
    status, body = _route(f, "/", "")
    assert status == 200 and "This run could not be read" in body and "nothing to show" in body


def test_cli_port_in_use(synth_run: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([PY, "-m", "uberprof", "dashboard", str(synth_run), "--port",
                            str(port)], capture_output=True, text=True, timeout=300, check=False,
                           env=job_env())
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stdout + r.stderr


# --- bad values in the URL, loopback addresses, credentials ----------------------------------------

def _route(client: Any, path: str, search: str) -> tuple[int, str]:
    """What the router callback answers for a URL (the request the browser makes)."""
    r = client.post("/_dash-update-component", json={
        "output": "..nav.children...page.children..",
        "outputs": [{"id": "nav", "property": "children"},
                    {"id": "page", "property": "children"}],
        "inputs": [{"id": "url", "property": "pathname", "value": path},
                   {"id": "url", "property": "search", "value": search}],
        "changedPropIds": ["url.pathname"], "state": []})
    return r.status_code, r.get_data(as_text=True)


def test_a_rank_or_step_the_run_does_not_have_says_so(synth_data: Any) -> None:
    c = _client(synth_data)
    huge = "99999999999999999999999"
    for path in ("/steps", "/gaps", "/stragglers", "/counters", "/"):
        status, body = _route(c, path, f"?rank={huge}")
        assert status == 200, (path, body[:300])
        assert "No such rank" in body and f"no rank {huge} (ranks: 0–7)" in body, path
        assert "Traceback" not in body and "File \\\"" not in body, path
    status, body = _route(c, "/steps", "?step=123456789012345678901234567890")
    assert status == 200 and "No such step" in body and "(steps: 0–59)" in body
    status, body = _route(c, "/gaps", "?rank=3")  # a rank it has: the page itself
    assert "page-gaps" in body and "No such rank" not in body


def test_a_failing_page_shows_no_traceback(synth_data: Any, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    from uberprof.dashboards.pages import gaps

    def broken(data: Any, sel: Any) -> Any:
        raise OSError(f"[Errno 2] No such file: '{synth_data.root}/secret.parquet'")

    monkeypatch.setattr(gaps, "layout", broken)
    status, body = _route(_client(synth_data), "/gaps", "")
    assert status == 200 and "This page failed" in body and "OSError" in body
    assert str(synth_data.root) not in body and "Traceback" not in body


def test_any_loopback_address_is_an_accepted_host(synth_data: Any) -> None:
    from uberprof.dashboards.app import LOOPBACK_HOSTS, loopback_hosts

    assert loopback_hosts("127.0.0.1") == LOOPBACK_HOSTS
    c = _client(synth_data, allowed_hosts=loopback_hosts("127.0.0.2"))
    assert c.get("/", headers={"Host": "127.0.0.2:8050"}).status_code == 200
    assert c.get("/", headers={"Host": "localhost:8050"}).status_code == 200
    assert c.get("/", headers={"Host": "127.0.0.3:8050"}).status_code == 421
    assert c.get("/", headers={"Host": "evil.example:8050"}).status_code == 421


def test_cli_help_and_auth_file_options(synth_run: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["dashboard", "--help"], terminal_width=200)
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "--auth-file" in text and "`ps`" in text and "--compare" in text
    creds = tmp_path / "creds"
    creds.write_text("ada:s3cret\n")
    r = CliRunner().invoke(main, ["dashboard", str(synth_run), "--auth", "a:b",
                                  "--auth-file", str(creds)])
    assert r.exit_code == 2 and "not both" in r.output
    r = CliRunner().invoke(main, ["dashboard", str(synth_run), "--host", "0.0.0.0",
                                  "--auth-file", str(tmp_path / "absent")])
    assert r.exit_code == 2 and "--auth-file: cannot read" in r.output
    creds.write_text("nopassword\n")
    r = CliRunner().invoke(main, ["dashboard", str(synth_run), "--auth-file", str(creds)])
    assert r.exit_code == 2 and "user:password" in r.output


def test_cli_auth_file_on_another_loopback_address(synth_run: Path, tmp_path: Path) -> None:
    """--host 127.0.0.2 answers (its own address is an accepted Host), and --auth-file's
    credentials are required; a file others can read is warned about."""
    creds = tmp_path / "creds"
    creds.write_text("ada:s3cret\n")
    creds.chmod(0o644)
    proc, url, lines = _serve([str(synth_run), "--port", "0", "--host", "127.0.0.2",
                               "--auth-file", str(creds)])
    try:
        text = " ".join("".join(lines).split())
        assert url.startswith("http://127.0.0.2:")
        assert "can be read by other users" in text
        assert "ada:s3cret" not in text and "s3cret" not in text
        _assert_basic_auth(url, b"ada:s3cret")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_saved_diagnosis_is_read_not_made(synth_run: Path, synth_data: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """What `uberprof dashboard` says before it serves: a fresh saved diagnosis is read
    (and no diagnosis work is done); a run diagnosed with other inputs is not."""
    from uberprof.analysis.diagnosis import advisor
    from uberprof.dashboards.data import RunData

    assert synth_data.diagnose() is not None  # the fixture diagnosed it, and saved it
    data = RunData(root=synth_run, workers=1).load()

    def fail(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("diagnosed again")

    monkeypatch.setattr(advisor, "diagnose_context", fail)
    assert data.read_saved_diagnosis() is True
    assert data.diagnose().straggler.rank == SYNTH_STRAGGLER


def test_without_a_saved_diagnosis_nothing_is_read(tmp_path: Path) -> None:
    from uberprof.dashboards.data import RunData

    run = write_synth(tmp_path / "fresh", ranks=2, steps=30, counters=False, straggler=None)
    data = RunData(root=run, workers=1).load()
    assert data.read_saved_diagnosis() is False
    assert data.diagnose() is not None  # then diagnosed (and saved)
    again = RunData(root=run, workers=1).load()
    assert again.read_saved_diagnosis() is True


def test_the_pages_read_the_run_as_it_was_opened(synth_run: Path, synth_data: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """RunData holds the OpenedRun its caller made (`read.open_run`) and the comparison it was
    given: no page diagnoses or compares again; a rank's largest gaps are the diagnosis's own
    (`Diagnosis.top_gaps`), its longest gaps, longest first."""
    from uberprof.analysis import read
    from uberprof.analysis.diagnosis import advisor
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.queries import gaps as gaps_q
    from uberprof.dashboards.queries.compare import Compared, comparison
    from uberprof.dashboards.ui import Selection

    opened = read.open_run(synth_run, workers=1)

    def fail(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("computed again")

    monkeypatch.setattr(advisor, "diagnose_context", fail)
    monkeypatch.setattr(read, "compare_runs", fail)
    given = Compared(None, "the comparison it was given")
    data = RunData.of(opened, workers=1, baseline=synth_run, comparison=given)
    assert data.diagnose() is opened.diagnosis and comparison(data) is given
    for path, page in _pages().items():
        assert "page-error" not in _ids(page.layout(data, Selection())), path
    d = opened.diagnosis
    for rank in range(8):
        durs = sorted((g for g in d.gaps.to_pylist() if g["rank"] == rank),
                      key=lambda g: -g["dur_ns"])
        top = gaps_q.largest_gaps(data, rank)
        assert [g["dur_ns"] for g in top] == [g["dur_ns"] for g in durs[:5]]
        assert all(g["rank"] == rank and "host" in g for g in top)
    whole = [g["dur_ns"] for g in gaps_q.largest_gaps(data)]
    assert whole == sorted(whole, reverse=True) and len(whole) == min(15, len(d.top_gaps))


# --- comparing two runs ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def baseline_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run A for the comparison: like synth_run, 30 % faster steps and no straggler."""
    return write_synth(tmp_path_factory.mktemp("dash-base") / "base8", counters=False,
                       straggler=None, step_ms=70.0)


def test_compare_page_shows_what_uberprof_diff_says(synth_run: Path, baseline_run: Path
                                                    ) -> None:
    from uberprof.analysis.diff import diff_runs
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.ui import Selection
    from uberprof.units import fmt_ms

    data = RunData(root=synth_run, workers=1, baseline=baseline_run).load()
    layout = _pages()["/compare"].layout(data, Selection())
    ids = _ids(layout)
    assert {"compare-headline", "card-step-a", "card-step-b", "card-ratio", "compare-verdict",
            "compare-breakdown-table", "compare-ops-table", "compare-breakdown-graph"} <= ids
    doc = diff_runs(baseline_run, synth_run, workers=1).to_json()
    st = doc["step_time_ms"]
    assert st["ratio"] > 1.2 and st["verdict"] == "slower"
    text = _text(layout)
    assert fmt_ms(st["a"]["median"]) in text and fmt_ms(st["b"]["median"]) in text
    assert f"{st['ratio']:.3f}" in text and st["test"]["reason"] in text
    assert st["test"]["name"] in text
    for row in doc["breakdown"]:
        assert row["label"] in text
    assert doc["ops"][0]["kind"] in text
    # the bar carries the page when a baseline was given, and only then
    status, body = _route(_client(data), "/compare", "")
    assert status == 200 and "nav-compare" in body and "page-compare" in body
    status, body = _route(_client(RunData(root=synth_run, workers=1).load()), "/", "")
    assert "nav-compare" not in body


def test_compare_with_a_run_without_traces(tmp_path: Path, synth_run: Path) -> None:
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.ui import Selection

    empty = tmp_path / "empty"
    empty.mkdir()
    data = RunData(root=synth_run, workers=1, baseline=empty).load()
    layout = _pages()["/compare"].layout(data, Selection())
    assert "no-comparison" in _ids(layout) and "nothing to compare" in _text(layout)


def test_the_straggler_card_says_what_the_test_decided() -> None:
    """No straggler: the card states the test's sentence (the numbers that decided), never a
    bare "none"; a suspected one is named as such, in amber, with the test on hover."""
    from uberprof.dashboards.pages.overview import health_cards

    base = {"ranks": 2, "hosts": 1, "steps": 30, "traced_steps": [10, 11],
            "step_ms_median": 1.0, "step_ms_p90": 2.0, "findings": {"high": 0, "medium": 0, "low": 0}}
    why = "rank 1 alone arrived last at 5 of 6 collectives; the chance of this is 22%"
    none = health_cards({**base, "straggler": None,
                         "straggler_test": {"decision": "none", "test": {"sentence": why}}})
    assert why in str(none)
    sus = health_cards({**base, "straggler": {
        "rank": 1, "cause": "compute", "last": 5, "instances": 6, "lead_ms": 3.0,
        "confidence": "suspected"}, "straggler_test": {"test": {"sentence": why}}})
    card = next(c for c in sus.children if c.id == "card-straggler")
    assert "rank 1 (suspected)" in str(card) and "warn" in card.className and card.title == why


def test_several_counter_metrics_read_at_once_equal_each_read_alone(synth_data: Any) -> None:
    """`counter_series_of` (one read of a node's stream for a page's panels) gives each metric
    the series `counter_series` gives it alone: its own units, buckets and devices."""
    import pyarrow.compute as pc

    node, _ = synth_data.rank_gpu(SYNTH_STRAGGLER)
    metrics = ["clock.sm", "temp.gpu", "power", "util.gpu"]
    together = synth_data.counter_series_of(node, "nvml", metrics, points=50)
    raw = synth_data.counters(node, ["nvml"], metrics)
    for m in metrics:
        alone = synth_data.counter_series(node, "nvml", m, points=50)
        got = together[m]
        assert got is not None and alone is not None
        assert (got.metric, got.unit, got.bucket_s) == (m, alone.unit, alone.bucket_s)
        assert list(got.devices) == list(alone.devices)
        for d, (t, v) in got.devices.items():
            np.testing.assert_allclose(t, alone.devices[d][0])
            np.testing.assert_allclose(v, alone.devices[d][1])
            rows = raw.filter((pc.field("metric") == m) & (pc.field("device") == d))
            vals = rows.column("value").to_numpy()
            assert len(t) <= 51 and vals.min() - 1e-9 <= v.min() and v.max() <= vals.max() + 1e-9
    assert synth_data.counter_series_of(node, "nvml", ["no.such"])["no.such"] is None


def test_ctrl_c_while_the_run_is_analysed_stops_the_dashboard_and_its_workers(
        tmp_path: Path) -> None:
    """Stopped while its analysis runs on forked workers, the dashboard exits 0 at once, says
    nothing of its own shutdown, and leaves no worker behind (a worker held its own pipe's
    other end and waited for ever; the interpreter's shutdown could also abort, exit 134, in
    the analysing thread's C++ code)."""
    import signal

    import psutil

    run = write_synth(tmp_path / "run", ranks=64, steps=4000, counters=False)
    proc = subprocess.Popen([PY, "-m", "uberprof", "dashboard", str(run), "--port", "0",
                             "--workers", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=job_env())
    me = psutil.Process(proc.pid)
    workers: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    while not workers and proc.poll() is None and time.monotonic() < deadline:
        workers = me.children(recursive=True)  # the map's forked workers
        time.sleep(0.02)
    assert workers, "the dashboard forked no worker to analyse a 64-rank run"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "FATAL" not in out and "terminate called" not in out
    _, left = psutil.wait_procs(workers, timeout=30)
    assert not left, f"workers left running: {[p.pid for p in left]}"


def test_communication_page_shows_whom_each_rank_waits_for_as_the_report_saved_it(
        synth_data: Any) -> None:
    """The per-rank table reads `ranks[].exposed_comm` and `accounted`: the others' largest
    wait is for the straggler, and every row's numbers are the document's."""
    from uberprof.dashboards.queries import communication as q
    from uberprof.dashboards.ui import Selection

    rows = q.rank_comm(synth_data)
    saved = {x["rank"]: x for x in synth_data.diagnose().ranks}
    assert rows and [r["rank"] for r in rows] == sorted(
        (r for r in saved if (saved[r]["exposed_comm"] or {}).get("exposed_ms")),
        key=lambda r: -saved[r]["exposed_comm"]["exposed_ms"])
    others = [r for r in rows if r["rank"] != SYNTH_STRAGGLER and r["top_waits"]]
    assert others and all(r["top_waits"][0]["peer"] == SYNTH_STRAGGLER for r in others)
    text = _text(_pages()["/communication"].layout(synth_data, Selection()))
    assert f"rank {SYNTH_STRAGGLER} in " in text
