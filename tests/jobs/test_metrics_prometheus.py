"""`uberprof run --metrics-port` scraped by a real Prometheus server (Debian's package): a real
2-rank Gloo job runs under `uberprof run --metrics-port 0` until the test has seen what it
needs (tests/_jobs.followed_job: it then ends by itself, exit 0); a Prometheus server started
here scrapes the port written in node.json and loads docs/metrics.md's alert rules; the test
reads the result through Prometheus's HTTP query API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests._jobs import ROOT, start_followed_job, stop, time_limit, wait_for_steps
from uberprof.dashboards.live_server import free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
if PROMETHEUS is None or PROMTOOL is None:
    pytest.skip("no prometheus/promtool binary (Debian: apt-get install prometheus; `make test` "
                "installs it when run as root)", allow_module_level=True)

DOC = ROOT / "docs" / "metrics.md"
RULES_BLOCK = re.compile(r"<!-- rules:[^\n]*-->\n```yaml\n(.*?)```", re.DOTALL)


def docs_rules(folder: Path) -> Path:
    """The alert rules of docs/metrics.md, as the file a user would save."""
    found = RULES_BLOCK.search(DOC.read_text())
    assert found, "docs/metrics.md has no rules block"
    path = folder / "rules.yml"
    path.write_text(found.group(1))
    return path


def metrics_url(run: Path, limit: float) -> str:
    """The URL the node agent wrote into node.json once it served."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for node in run.glob("nodes/*/node.json"):
            url = json.loads(node.read_text()).get("metrics", {}).get("url")
            if url:
                return str(url)
        time.sleep(0.2)
    raise AssertionError(f"no metrics URL in {run}/nodes/*/node.json in {limit:.0f} s")


def start_prometheus(folder: Path, target: str, rules: Path) -> tuple[subprocess.Popen[bytes],
                                                                       str]:
    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: [{json.dumps(str(rules))}]\n"
        "scrape_configs:\n  - job_name: uberprof\n"
        f"    static_configs:\n      - targets: [{json.dumps(target)}]\n")
    with open(folder / "prometheus.log", "wb") as log:  # the server keeps its own copy
        proc = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}",
                                 f"--storage.tsdb.path={folder / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.loads(resp.read())
    assert doc["status"] == "success", doc
    return doc["data"]


def wait_for(what: str, check: Any, limit: float) -> Any:
    """Poll `check()` (None or raising OSError: not yet) until it returns something."""
    deadline = time.monotonic() + limit
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError:
            last = None
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {limit:.0f} s")


def query(base: str, promql: str) -> dict[str, float]:
    """An instant query's value per rank."""
    result = api(base, "query", query=promql)["result"]
    return {r["metric"]["rank"]: float(r["value"][1]) for r in result}


def counts_past(base: str, floor: dict[str, float]) -> dict[str, float] | None:
    """Both ranks' step counts, once each is past its `floor`."""
    got = query(base, "uberprof_step_time_seconds_count")
    ok = set(got) == {"0", "1"} and all(got[r] > floor.get(r, 0) for r in got)
    return got if ok else None


def evaluated(base: str) -> list[dict[str, Any]] | None:
    """The loaded rule group's rules, once every one has been evaluated."""
    groups = api(base, "rules")["groups"]
    if not groups:
        return None
    rules = groups[0]["rules"]
    done = all(not str(r.get("lastEvaluation", "0001")).startswith("0001") for r in rules)
    return rules if done else None


def test_prometheus_scrapes_both_ranks_and_loads_the_fell_behind_rule(tmp_path: Path) -> None:
    """Prometheus scrapes both ranks' step-time series (counts that grow, quantiles) from the
    node agent, the docs' rules pass `promtool check rules` and are evaluated by the server
    without error, and the "a rank fell behind" expression has one series per rank (how far
    behind, 0 or 1 step in this healthy job); the job then ends with exit 0."""
    rules = docs_rules(tmp_path)
    check = subprocess.run([str(PROMTOOL), "check", "rules", str(rules)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0 and "3 rules found" in check.stdout, check.stdout + check.stderr
    job = start_followed_job(tmp_path, "prom", tmp_path / "stop", "--metrics-port", "0")
    run = tmp_path / "prom"
    prom = None
    try:
        url = metrics_url(run, time_limit(30))
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        wait_for_steps(run, 3, job, time_limit(60))
        prom, base = start_prometheus(tmp_path, url.split("/")[2], rules)
        counts = wait_for("both ranks' step counts scraped", lambda: counts_past(base, {}),
                          time_limit(60))
        grown = wait_for("both ranks' step counts grow", lambda: counts_past(base, counts),
                         time_limit(60))
        p90 = query(base, 'uberprof_step_time_seconds{quantile="0.9"}')
        assert set(p90) == {"0", "1"} and all(0 < v < 60 for v in p90.values()), p90
        rules_seen = {r["name"]: r for r in wait_for("the rules evaluated",
                                                     lambda: evaluated(base), time_limit(30))}
        assert set(rules_seen) == {"UberprofRankFellBehind", "UberprofJobHung",
                                   "UberprofStepTimeRose"}
        assert all(r["health"] == "ok" for r in rules_seen.values()), rules_seen
        fell = rules_seen["UberprofRankFellBehind"]["query"]
        behind = query(base, fell.rsplit(">=", 1)[0])
        assert set(behind) == {"0", "1"} and all(0 <= v <= 1 for v in behind.values()), behind
        assert rules_seen["UberprofRankFellBehind"]["state"] == "inactive"  # healthy job
        (tmp_path / "stop").touch()
        assert job.wait(timeout=time_limit(30)) == 0
        assert grown  # the counts grew between two scrapes while the job ran
    finally:
        stop([job])
        if prom is not None:
            stop([prom])  # type: ignore[list-item]
