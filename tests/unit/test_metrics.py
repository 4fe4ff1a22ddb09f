"""The node agent's Prometheus metrics (collect/metrics.py) without a job: figures fed as the
watchdog feeds them, scraped over HTTP from a real server on a free loopback port, parsed
with prometheus_client's own parser; a port in use; the agent's hook."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from uberprof.collect.config import CollectConfig
from uberprof.collect.metrics import MetricsServer, NodeFigures, fan_out, quantile
from uberprof.collect.node_agent import NodeAgent
from uberprof.collect.safety import AgentLog
from uberprof.rundir import NODE_FILE, RANK_FILE, RunDir, write_json_atomic
from uberprof.rundir.layout import NODE_HANG_FILE, read_json


def _figures(tmp_path: Path) -> tuple[RunDir, NodeFigures]:
    run = RunDir(tmp_path / "run")
    run.create("r1")
    node = run.claim_node_dir("n0")
    return run, NodeFigures(run, "r1", node, AgentLog("node", node / "agent.log"))


def _scrape(url: str) -> dict[str, list[Any]]:
    """Every sample served, by family name."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _value(samples: list[Any], name: str, **labels: str) -> float:
    found = [s.value for s in samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples)
    return float(found[0])


def test_quantile_is_a_step_time_that_happened() -> None:
    values = sorted(float(v) for v in range(1, 101))
    assert quantile(values, 0.5) == 50.0 and quantile(values, 0.9) == 90.0
    assert quantile(values, 0.99) == 99.0 and quantile([3.0], 0.99) == 3.0
    assert quantile([], 0.5) != quantile([], 0.5)  # NaN: nothing read yet


def test_scrape_serves_each_ranks_steps_quantiles_and_lateness(tmp_path: Path) -> None:
    _, figures = _figures(tmp_path)
    for step in range(10):
        figures.step_read(0, step, 0.1 * (step + 1), 2)
    for step in range(7):  # rank 1 three steps behind
        figures.step_read(1, step, 0.2, 2)
    server = MetricsServer(figures, port=0)
    url = server.start()
    try:
        assert url == f"http://127.0.0.1:{server.port}/metrics"
        got = _scrape(url)
    finally:
        server.stop()
    steps = got["uberprof_step_time_seconds"]
    assert _value(steps, "uberprof_step_time_seconds_count", rank="0") == 10
    assert _value(steps, "uberprof_step_time_seconds_sum", rank="0") == pytest.approx(5.5)
    assert _value(steps, "uberprof_step_time_seconds", rank="0", quantile="0.5") == \
        pytest.approx(0.5)
    assert _value(steps, "uberprof_step_time_seconds", rank="0", quantile="0.99") == \
        pytest.approx(1.0)
    assert _value(steps, "uberprof_step_time_seconds", rank="1", quantile="0.9") == \
        pytest.approx(0.2)
    assert _value(got["uberprof_step_last_seconds"], "uberprof_step_last_seconds",
                  rank="0", run="r1", node="n0") == pytest.approx(1.0)
    behind = got["uberprof_rank_lateness_steps"]
    assert _value(behind, "uberprof_rank_lateness_steps", rank="0") == 0
    assert _value(behind, "uberprof_rank_lateness_steps", rank="1") == 3
    assert _value(got["uberprof_hang"], "uberprof_hang") == 0
    assert _value(got["uberprof_slowdown_watch"], "uberprof_slowdown_watch") == 0


def test_scrape_reads_the_hang_record_and_the_ranks_windows(tmp_path: Path) -> None:
    run, figures = _figures(tmp_path)
    write_json_atomic(figures.node_dir / NODE_HANG_FILE, {"detected_ns": 1, "resumed_ns": None})
    folder = run.claim_rank_dir(0)
    triggers = [{"first": 3, "last": 5, "trigger": "schedule"},
                {"first": 40, "last": 42, "trigger": "on demand"},
                {"first": 90, "last": 92, "trigger": "on demand"}]
    write_json_atomic(folder / RANK_FILE, {"rank": 0, "node": "n0", "world_size": 1,
                                           "trace": {"triggers": triggers}})
    other = run.claim_rank_dir(1)  # another node's rank: not this node's to serve
    write_json_atomic(other / RANK_FILE, {"rank": 1, "node": "n1", "world_size": 2,
                                          "trace": {"triggers": triggers}})
    server = MetricsServer(figures, port=0)
    url = server.start()
    assert url is not None
    try:
        got = _scrape(url)
        assert _value(got["uberprof_hang"], "uberprof_hang") == 1
        windows = got["uberprof_trace_windows"]
        assert _value(windows, "uberprof_trace_windows_total", rank="0", trigger="on demand") == 2
        assert _value(windows, "uberprof_trace_windows_total", rank="0", trigger="schedule") == 1
        assert {s.labels["rank"] for s in windows} == {"0"}
        write_json_atomic(figures.node_dir / NODE_HANG_FILE,
                          {"detected_ns": 1, "resumed_ns": 2})
        assert _value(_scrape(url)["uberprof_hang"], "uberprof_hang") == 0  # steps resumed
    finally:
        server.stop()


def test_a_port_in_use_is_said_and_logged_and_nothing_raises(tmp_path: Path) -> None:
    _, figures = _figures(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said: list[str] = []
        server = MetricsServer(figures, port=port)
        assert server.start(said.append) is None
    assert len(said) == 1 and f"port {port} on 127.0.0.1 is in use" in said[0]
    assert "the job goes on" in said[0]
    assert f"port {port}" in (figures.node_dir / "agent.log").read_text()


def test_a_failing_part_of_a_scrape_leaves_the_others_served(tmp_path: Path) -> None:
    _, figures = _figures(tmp_path)
    figures.step_read(0, 0, 0.1, 1)

    class Broken:
        hangs = 0

        def current_timeout(self) -> float:
            raise RuntimeError("broken watchdog")

    figures.watchdog = Broken()
    names = {family.name for family in figures.collect()}
    assert "uberprof_step_time_seconds" in names and "uberprof_trace_windows" in names
    assert "broken watchdog" in (figures.node_dir / "agent.log").read_text()


def test_fan_out_calls_every_hook_given_with_what_the_watchdog_hands_on(tmp_path: Path) -> None:
    seen: list[tuple[Any, ...]] = []
    assert fan_out(None, None) is None

    def hook(*args: Any) -> None:
        seen.append(args)

    assert fan_out(None, hook) is hook
    _, figures = _figures(tmp_path)
    both = fan_out(hook, figures.step_read)
    assert both is not None
    both(0, 7, 0.1, 1)
    both(0, 8, 0.2, 1, 0.15)  # a step's CPU time too, as the slowdown trigger takes it
    assert seen == [(0, 7, 0.1, 1), (0, 8, 0.2, 1, 0.15)]
    count = [s for f in figures.collect() if f.name == "uberprof_step_time_seconds"
             for s in f.samples if s.name.endswith("_count")]
    assert [s.value for s in count] == [2]


def test_the_slowdown_state_is_served_by_what_rose(tmp_path: Path) -> None:
    """Detections by trigger (the step time, a rank's lateness), the budget's refusals, the
    last rise's ratio and each rank's lateness level, from the trigger's own records."""
    _, figures = _figures(tmp_path)

    class Level:
        def __init__(self, value: float) -> None:
            self.level_s = value

    class Lateness:
        def __init__(self, value: float | None) -> None:
            self.value = value

        def level(self) -> tuple[Level, bool] | None:
            return None if self.value is None else (Level(self.value), False)

    class Trigger:
        def __init__(self) -> None:
            self.detections = [
                {"trigger": "slowdown", "baseline_ms": 100.0, "level_ms": 150.0},
                {"trigger": "lateness", "baseline_ms": 100.0, "level_ms": 180.0}]
            self.budget = type("Budget", (), {"suppressed": 2})()
            self.lateness = {0: Lateness(1.0), 1: Lateness(1.6), 2: Lateness(None)}

    figures.slowdown = Trigger()
    got = {f.name: f.samples for f in figures.collect()}
    assert _value(got["uberprof_slowdown_watch"], "uberprof_slowdown_watch") == 1
    rises = got["uberprof_slowdowns"]
    assert _value(rises, "uberprof_slowdowns_total", trigger="slowdown") == 1
    assert _value(rises, "uberprof_slowdowns_total", trigger="lateness") == 1
    assert _value(got["uberprof_slowdowns_suppressed"], "uberprof_slowdowns_suppressed_total") \
        == 2
    assert _value(got["uberprof_slowdown_ratio"], "uberprof_slowdown_ratio") == \
        pytest.approx(1.8)
    late = got["uberprof_rank_lateness_ratio"]
    assert {s.labels["rank"]: s.value for s in late} == {"0": 1.0, "1": 1.6}


def test_the_agent_writes_the_url_in_node_json_and_feeds_the_figures(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    agent = NodeAgent(run, "r1", ["true"], CollectConfig(), {}, None)
    try:
        url = agent.start_metrics("127.0.0.1", 0)
        assert url is not None and agent.metrics is not None
        meta = read_json(agent.dir / NODE_FILE)
        assert meta["metrics"] == {"url": url, "host": "127.0.0.1",
                                   "port": agent.metrics.port}
        agent.start_watchdog(job_pid=0, timeout_s=None, action="report")
        assert agent.watchdog is not None and agent.watchdog.on_step is not None
        agent.watchdog.on_step(0, 4, 0.25, 1)
        got = _scrape(url)
        assert _value(got["uberprof_last_step"], "uberprof_last_step", rank="0") == 4
        assert _value(got["uberprof_hang_timeout_seconds"],
                      "uberprof_hang_timeout_seconds") == 300
    finally:
        agent.finish(0)
    with pytest.raises(OSError):  # served no longer once the job ended
        urllib.request.urlopen(url, timeout=5)
