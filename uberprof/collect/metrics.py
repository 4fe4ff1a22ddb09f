"""Live figures as Prometheus metrics (`uberprof run --metrics-port PORT`): each node's agent
serves `/metrics` in Prometheus's text format, so that an alert can tell someone a rank fell
behind, a job hung or its step time rose, while the job runs (docs/metrics.md).

Why in the node agent and not in the ranks: the agent already reads every local rank's step
timeline as it grows (the hang watchdog, collect/watchdog.py) and runs the slowdown trigger;
the figures are what it read, so serving them adds nothing to the job's processes. A scrape
reads the figures kept here (a few hundred floats a rank), the node's `hang.json` and the
local ranks' `rank.json` (their trace windows, re-read only when changed).

The server is `prometheus_client`'s, on a registry of its own (the process's default registry
and its collectors are never touched), in a daemon thread. It never harms the job: a port in
use, or any error while serving or scraping, is one line in the node's log (and on stderr for
the port), and the job goes on. Figures are as fresh as the watchdog's last read (every 5 s
at most).
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.collect.safety import AgentLog
from uberprof.rundir import RANK_FILE, RunDir, list_ranks
from uberprof.rundir.layout import NODE_HANG_FILE, read_json

RECENT_STEPS = 256  # steps per rank whose quantiles are served (the watchdog's own window)
QUANTILES = (0.5, 0.9, 0.99)
DEFAULT_HOST = "127.0.0.1"


@dataclass
class _RankFigures:
    """What the agent read of one local rank's steps."""

    count: int = 0
    total_s: float = 0.0
    last_s: float = 0.0
    last_step: int = -1
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))


def quantile(sorted_values: list[float], q: float) -> float:
    """The `q` quantile by the nearest rank (no interpolation: a served figure is a step time
    that happened)."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


class NodeFigures:
    """The live figures of one node, fed by the watchdog's reads (`step_read`) and collected
    by Prometheus's client at each scrape (`collect`)."""

    def __init__(self, run: RunDir, run_id: str, node_dir: Path, log: AgentLog) -> None:
        self.run = run
        self.labels = {"run": run_id, "node": node_dir.name}
        self.node_dir = node_dir
        self.log = log
        self.watchdog: Any = None  # set by the agent: hang count and current timeout
        self.slowdown: Any = None  # set by the agent: the slowdown trigger, when on
        self._ranks: dict[int, _RankFigures] = {}
        self._lock = threading.Lock()
        self._windows: dict[Path, tuple[int, dict[str, int]]] = {}  # rank.json mtime, counts

    def step_read(self, rank: Any, step: int, seconds: float, local_ranks: int,
                  *more: Any) -> None:
        """Rank `rank` of this node finished `step` in `seconds` (the watchdog's on_step; what
        else it hands on, such as the step's CPU time, is not served); never raises."""
        try:
            with self._lock:
                r = self._ranks.setdefault(int(rank), _RankFigures())
                r.count += 1
                r.total_s += seconds
                r.last_s = seconds
                r.last_step = max(r.last_step, step)
                r.recent.append(seconds)
        except Exception as exc:  # noqa: BLE001 - figures are a courtesy, the job goes on
            self.log.error("the metrics' step figures", exc)

    # ---- a scrape ---------------------------------------------------------------------------

    def describe(self) -> list[Any]:
        return []  # no check at registration: collect() reads files

    def collect(self) -> Iterator[Any]:
        """Every family; a part that fails is left out (and logged), the others are served."""
        for part in (self._step_families, self._hang_families, self._slowdown_families,
                     self._window_families):
            try:
                yield from part()
            except Exception as exc:  # noqa: BLE001 - a scrape never breaks the agent
                self.log.error(f"serving metrics ({part.__name__})", exc)

    def _rank_labels(self, rank: int) -> list[str]:
        return [self.labels["run"], self.labels["node"], str(rank)]

    def _step_families(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, Metric

        with self._lock:
            ranks = {k: (v.count, v.total_s, v.last_s, v.last_step, sorted(v.recent))
                     for k, v in self._ranks.items()}
        names = ["run", "node", "rank"]
        summary = Metric("uberprof_step_time_seconds", "Host time of a rank's steps: quantiles "
                         f"over its last {RECENT_STEPS} steps, count and sum over all",
                         "summary")
        last = GaugeMetricFamily("uberprof_step_last_seconds",
                                 "Host time of the rank's last step read", labels=names)
        index = GaugeMetricFamily("uberprof_last_step", "The last step the rank finished "
                                  "(its index, the same on every rank of a job)", labels=names)
        behind = GaugeMetricFamily("uberprof_rank_lateness_steps", "Steps the rank is behind "
                                   "the node's fastest rank", labels=names)
        fastest = max((v[3] for v in ranks.values()), default=-1)
        for rank, (count, total, last_s, last_step, recent) in sorted(ranks.items()):
            labels = dict(self.labels, rank=str(rank))
            for q in QUANTILES:
                summary.add_sample("uberprof_step_time_seconds", dict(labels, quantile=str(q)),
                                   quantile(recent, q))
            summary.add_sample("uberprof_step_time_seconds_count", labels, count)
            summary.add_sample("uberprof_step_time_seconds_sum", labels, total)
            last.add_metric(self._rank_labels(rank), last_s)
            index.add_metric(self._rank_labels(rank), last_step)
            behind.add_metric(self._rank_labels(rank), fastest - last_step)
        yield from (summary, last, index, behind)

    def _hang_families(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        names, values = list(self.labels), list(self.labels.values())
        record = _read(self.node_dir / NODE_HANG_FILE)
        hung = GaugeMetricFamily("uberprof_hang", "1 while no local rank has finished a step "
                                 "for the hang timeout (the watchdog's verdict), else 0",
                                 labels=names)
        hung.add_metric(values, 1.0 if record and record.get("resumed_ns") is None else 0.0)
        yield hung
        if self.watchdog is None:
            return
        hangs = CounterMetricFamily("uberprof_hangs", "Hangs the watchdog detected on this "
                                    "node", labels=names)
        hangs.add_metric(values, float(self.watchdog.hangs))
        timeout = GaugeMetricFamily("uberprof_hang_timeout_seconds", "The hang timeout now "
                                    "(--hang-timeout, else derived from the step time)",
                                    labels=names)
        timeout.add_metric(values, float(self.watchdog.current_timeout()))
        yield from (hangs, timeout)

    def _slowdown_families(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        names, values = list(self.labels), list(self.labels.values())
        trigger = self.slowdown
        watching = GaugeMetricFamily("uberprof_slowdown_watch", "1 when the slowdown trigger "
                                     "watches the node's step time, else 0", labels=names)
        watching.add_metric(values, 0.0 if trigger is None else 1.0)
        yield watching
        if trigger is None:
            return
        detections = [d for d in list(getattr(trigger, "detections", [])) if isinstance(d, dict)]
        found = CounterMetricFamily("uberprof_slowdowns", "Rises the slowdown trigger detected "
                                    "(the straggler signal), by what rose: the step time "
                                    "(slowdown) or a rank's lateness", labels=names + ["trigger"])
        by_trigger: dict[str, int] = {"slowdown": 0}
        for d in detections:
            key = str(d.get("trigger") or "slowdown")
            by_trigger[key] = by_trigger.get(key, 0) + 1
        for key, n in sorted(by_trigger.items()):
            found.add_metric(values + [key], float(n))
        budget = getattr(trigger, "budget", None) or getattr(trigger, "detector", None)
        suppressed = CounterMetricFamily("uberprof_slowdowns_suppressed", "Detected rises "
                                         "left without a window by the budget", labels=names)
        suppressed.add_metric(values, float(getattr(budget, "suppressed", 0)))
        yield from (found, suppressed)
        if detections and isinstance(detections[-1].get("baseline_ms"), int | float):
            ratio = GaugeMetricFamily("uberprof_slowdown_ratio", "The last detected rise: its "
                                      "step-time level over the baseline before it",
                                      labels=names)
            d = detections[-1]
            ratio.add_metric(values, float(d["level_ms"]) / max(1e-9, float(d["baseline_ms"])))
            yield ratio
        yield from self._lateness_family(trigger)

    def _lateness_family(self, trigger: Any) -> Iterator[Any]:
        """Each rank's lateness level, where the trigger watches one per rank (`lateness`: a
        detector per rank whose `level()` is its recent level, or None before it has one)."""
        from prometheus_client.core import GaugeMetricFamily

        detectors = dict(getattr(trigger, "lateness", None) or {})
        if not detectors:
            return
        family = GaugeMetricFamily("uberprof_rank_lateness_ratio", "The rank's recent work per "
                                   "step (training thread's CPU time) over the median of its "
                                   "node's other ranks' (1: level with them)",
                                   labels=["run", "node", "rank"])
        for rank, detector in sorted(detectors.items()):
            try:
                level = detector.level()
            except RuntimeError:  # its history changed under this read: next scrape
                continue
            if level is not None:
                family.add_metric(self._rank_labels(rank), float(level[0].level_s))
        yield family

    def _window_families(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily("uberprof_trace_windows", "Trace windows a rank opened, by "
                                     "what opened them (schedule, on demand, slowdown)",
                                     labels=["run", "node", "rank", "trigger"])
        for meta in list_ranks(self.run):
            if meta.node != self.node_dir.name or meta.rank is None:
                continue
            for trigger, n in sorted(self._windows_of(meta.folder / RANK_FILE).items()):
                family.add_metric(self._rank_labels(meta.rank) + [trigger], float(n))
        yield family

    def _windows_of(self, path: Path) -> dict[str, int]:
        """Windows by trigger in a rank's rank.json (`trace.triggers`), read again only when
        the file changed."""
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return {}
        cached = self._windows.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        trace = (_read(path) or {}).get("trace")
        counts: dict[str, int] = {}
        for w in (trace.get("triggers") if isinstance(trace, dict) else None) or []:
            if isinstance(w, dict):
                key = str(w.get("trigger") or "schedule")
                counts[key] = counts.get(key, 0) + 1
        self._windows[path] = (mtime, counts)
        return counts


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = read_json(path)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class MetricsServer:
    """`/metrics` of one node's figures on `host:port` (port 0: any free one); `start` returns
    the URL served, or None (the reason is logged, the job goes on)."""

    def __init__(self, figures: NodeFigures, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.figures = figures
        self.host = host
        self.port = port
        self.url: str | None = None
        self._server: Any = None

    def start(self, say: Callable[[str], None] | None = None) -> str | None:
        log = self.figures.log
        try:
            self._server = _serve(self.figures, self.host, self.port)
        except OSError as exc:
            why = (f"port {self.port} on {self.host} is in use" if exc.errno == errno.EADDRINUSE
                   else f"{exc.strerror or exc}")
            line = f"cannot serve metrics on {self.host}:{self.port} ({why}); the job goes on " \
                   "without them"
            log.write(line)
            if say is not None:
                say(line)
            return None
        except Exception as exc:  # noqa: BLE001 - never harm the job
            log.error("starting the metrics server", exc)
            return None
        self.port = int(self._server.server_port)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}/metrics"
        return self.url

    def stop(self) -> None:
        if self._server is None:
            return
        try:
            self._server.shutdown()
            self._server.server_close()
        except Exception as exc:  # noqa: BLE001
            self.figures.log.error("stopping the metrics server", exc)
        self._server = None


def _serve(figures: NodeFigures, host: str, port: int) -> Any:
    """prometheus_client's WSGI app on a registry of its own, served by a thread per request
    from a daemon thread; what goes wrong in a request goes to the agent's log, never to the
    job's terminal (the standard servers print tracebacks on stderr)."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import CollectorRegistry, make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def handle_error(self, request: Any, client_address: Any) -> None:
            import sys

            figures.log.write(f"a metrics request from {client_address} failed: "
                              f"{sys.exc_info()[1]!r}")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(figures)  # type: ignore[arg-type]
    server = make_server(host, port, make_wsgi_app(registry), Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="uberprof-metrics", daemon=True).start()
    return server


def fan_out(*hooks: Callable[..., None] | None) -> Callable[..., None] | None:
    """One on_step hook for the watchdog that calls each given one with what the watchdog
    hands on, whatever it is (None: none given). Each hook never raises (their own rule)."""
    chosen = [h for h in hooks if h is not None]
    if not chosen:
        return None
    if len(chosen) == 1:
        return chosen[0]

    def each(*args: Any) -> None:
        for hook in chosen:
            hook(*args)
    return each
