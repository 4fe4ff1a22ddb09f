"""The node agent: the `uberprof run` process on one node.

It owns the node's folder in the run directory, prepares the environment that arms the rank
agent in every Python process of the job, records the invocation (command, times, exit code,
versions, options) in `node.json`, and runs the node's counter sampler (background threads,
started before the command and stopped after it exits).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import uberprof
from uberprof.collect import diskfull
from uberprof.collect.bootstrap import BOOTSTRAP_DIR
from uberprof.collect.config import ENV_CONFIG, ENV_HOME, ENV_NODE, ENV_RUN_DIR, CollectConfig
from uberprof.collect.counters.sampler import CounterSettings, NodeSampler
from uberprof.collect.metrics import MetricsServer, NodeFigures, fan_out
from uberprof.collect.rank.flight_log import FR_ENV
from uberprof.collect.safety import AgentLog
from uberprof.collect.slowdown import SlowdownSettings, SlowdownTrigger
from uberprof.collect.watchdog import HangWatchdog
from uberprof.rundir import LOG_FILE, NODE_FILE, RunDir, write_json_atomic


class NodeAgent:
    def __init__(self, run: RunDir, run_id: str, command: Sequence[str], config: CollectConfig,
                 options: Mapping[str, Any], counters: CounterSettings | None = None) -> None:
        self.run = run
        self.run_id = run_id
        self.command = list(command)
        self.config = config
        self.log = AgentLog("node")
        diskfull.configure(run.root)
        run.create(run_id)
        self.dir: Path = run.claim_node_dir()
        self.log.set_path(self.dir / LOG_FILE)
        self.meta: dict[str, Any] = {
            "run_id": run_id,
            "node": self.dir.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "command": self.command,
            "cwd": os.getcwd(),
            "start_ns": time.time_ns(),
            "end_ns": None,
            "exit_code": None,
            "options": dict(options),
            "versions": versions(),
            "platform": platform.platform(),
        }
        write_json_atomic(self.dir / NODE_FILE, self.meta)
        self.sampler: NodeSampler | None = None
        self.watchdog: HangWatchdog | None = None
        self.slowdown: SlowdownTrigger | None = None
        self.metrics: MetricsServer | None = None
        self._start_counters(counters or CounterSettings())

    def _start_counters(self, settings: CounterSettings) -> None:
        """Start sampling in the background (returns at once); a failure costs counters only."""
        try:
            sampler = NodeSampler(self.run, self.run_id, self.dir, settings, self.log)
            sampler.start()
            self.sampler = sampler
            self.meta["counters"] = sampler.status()
            write_json_atomic(self.dir / NODE_FILE, self.meta)
        except Exception as exc:  # noqa: BLE001 - never harm the job
            self.log.error("starting the counter sampler", exc)

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The job's environment plus what arms the rank agent in every process."""
        env = dict(base)
        pythonpath = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + pythonpath if pythonpath else "")
        env[ENV_RUN_DIR] = str(self.run.root)
        env[ENV_NODE] = self.dir.name
        env[ENV_CONFIG] = self.config.to_env()
        env[ENV_HOME] = str(Path(uberprof.__file__).resolve().parent.parent)
        # Kineto keeps CUPTI attached after a window unless told otherwise, slowing later steps.
        env.setdefault("TEARDOWN_CUPTI", "1")
        fr = flight_recorder_env(env)
        env.update(fr)
        size = next((env[n] for n in FR_ENV if n in env), None)
        self.meta["flight_recorder"] = {"buffer_size": size, "set_by": "uberprof" if fr else "user"}
        return env

    def start_watchdog(self, job_pid: int, timeout_s: float | None, action: str,
                       on_hang: Callable[[dict[str, Any]], None] | None = None,
                       slowdown: SlowdownSettings | None = None) -> None:
        """Watch the local ranks for a hang (collect/watchdog.py), and with `slowdown` their
        step times and lateness for a rise (collect/slowdown.py); a failure costs the
        watchdog."""
        try:
            if slowdown is not None:
                self.slowdown = SlowdownTrigger(self.run.root, self.log, slowdown,
                                                trace_ranks=self.config.trace_ranks,
                                                on_detection=self._slowdowns_changed,
                                                node=self.dir.name, host=self.meta["host"],
                                                ask_at_poll_end=True)
            on_step = self.slowdown.step_read if self.slowdown is not None else None
            figures = self.metrics.figures if self.metrics is not None else None
            on_step = fan_out(on_step, figures.step_read if figures is not None else None)
            trigger = self.slowdown
            self.watchdog = HangWatchdog(
                self.run, self.dir, self.log, timeout_s, action, on_hang, on_step=on_step,
                on_peer_step=trigger.peer_read if trigger is not None else None,
                on_scope=trigger.scope if trigger is not None else None)
            if figures is not None:
                figures.watchdog, figures.slowdown = self.watchdog, self.slowdown
            self.watchdog.start(job_pid)
        except Exception as exc:  # noqa: BLE001 - never harm the job
            self.watchdog = None
            self.log.error("starting the hang watchdog", exc)

    def start_metrics(self, host: str, port: int, say: Callable[[str], None] | None = None
                      ) -> str | None:
        """Serve the node's live figures to Prometheus (collect/metrics.py) before the job
        starts; the URL, also in node.json's `metrics`, or None (why is logged and said)."""
        try:
            server = MetricsServer(NodeFigures(self.run, self.run_id, self.dir, self.log), host,
                                   port)
            url = server.start(say)
            if url is None:
                return None
            self.metrics = server
            self.meta["metrics"] = {"url": url, "host": host, "port": server.port}
            write_json_atomic(self.dir / NODE_FILE, self.meta)
            return url
        except Exception as exc:  # noqa: BLE001 - never harm the job
            self.log.error("starting the metrics server", exc)
            return None

    def _slowdowns_changed(self) -> None:
        """node.json lists each detection as it comes (`uberprof info` on a running job)."""
        self._record_slowdowns()
        try:
            write_json_atomic(self.dir / NODE_FILE, self.meta)
        except OSError as exc:
            self.log.error("writing node.json after a slowdown", exc)

    def _record_slowdowns(self) -> None:
        if self.slowdown is not None:
            self.meta["slowdowns"] = {"detected": list(self.slowdown.detections),
                                      "suppressed": self.slowdown.budget.suppressed,
                                      "watched_steps": self.slowdown.watched,
                                      "watch_cpu_ms": round(self.slowdown.cpu_ns / 1e6, 3),
                                      # lateness against how many other nodes' ranks, and
                                      # whether the run directory shows every rank (null:
                                      # not judged yet)
                                      "peer_ranks": len(self.slowdown.peer_ranks),
                                      "shared": self.slowdown.shared,
                                      "ranks_seen": self.slowdown.ranks_seen,
                                      "world_size": self.slowdown.world_size}

    def finish(self, exit_code: int) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
            self.meta["hangs"] = self.watchdog.hangs
            self.meta["stopped_after_hang"] = self.watchdog.stopped_job
        self._record_slowdowns()
        self.meta["end_ns"] = time.time_ns()
        self.meta["exit_code"] = exit_code
        if self.sampler is not None:
            try:
                self.sampler.stop()
                self.meta["counters"] = self.sampler.status()
            except Exception as exc:  # noqa: BLE001
                self.log.error("stopping the counter sampler", exc)
        try:
            diskfull.write_json_final(self.dir / NODE_FILE, self.meta)
        except OSError as exc:
            self.log.error("writing node.json at the end of the run", exc)


FR_BUFFER_SIZE = 2000
"""Flight Recorder entries per rank when the user set none (cost: benchmarks/overhead.py)."""


def flight_recorder_env(env: Mapping[str, str]) -> dict[str, str]:
    """Turn torch's Flight Recorder on (the last collectives of each rank, for hangs and
    crashes) unless the user set its size, under either name, to anything (0 included)."""
    if any(name in env for name in FR_ENV):
        return {}
    return {FR_ENV[0]: str(FR_BUFFER_SIZE)}


def versions() -> dict[str, str | None]:
    """Versions of what matters for reading the data later; cheap (no import of torch)."""
    out: dict[str, str | None] = {"uberprof": uberprof.__version__, "python": sys.version.split()[0]}
    for dist in ("torch", "nvidia-ml-py"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out
