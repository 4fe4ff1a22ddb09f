"""Following a run directory while its job writes it: read only what was appended since the
last look, so that a 64-rank x 100,000-step run refreshes in a fraction of a second.

- `steps.jsonl` is appended line by line: each `StepFollower` keeps a byte offset and reads only
  new complete lines; a half-written last line waits for the next poll.
- `counters/<source>.arrows` are Arrow IPC streams appended a batch per flush: each
  `CounterFollower` keeps the schema and the offset after the last whole message, and reads only
  the messages after it (a cut-off tail waits).
- `node.json` says whether the job still runs (no `end_ns` yet) and how it ended.

`RunFollower.poll()` does one round and returns a `LiveState`: what `uberprof watch` and the
dashboard's live pages show.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from uberprof.rundir.counters import is_valid
from uberprof.rundir.layout import (
    COUNTERS_DIR,
    COUNTERS_SUFFIX,
    MAX_JSONL_BYTES,
    STEPS_FILE,
    TRACES_DIR,
    RunDir,
    as_run_dir,
    check_readable,
    parse_trace_file_name,
)
from uberprof.rundir.nodes import list_nodes
from uberprof.rundir.ranks import ranks_by_id, step_row_problem

GPU_METRICS = ("util.gpu", "clock.sm", "clock.sm_max")
"""The NVML metrics the live views show per rank (utilisation %, SM clock and its maximum)."""


class _Column:
    """A growing int64 array (amortised doubling): appending is cheap, reading is a view."""

    def __init__(self) -> None:
        self._buf = np.empty(1024, np.int64)
        self.n = 0

    def extend(self, values: list[int]) -> None:
        need = self.n + len(values)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf)), np.int64)
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n:need] = values
        self.n = need

    @property
    def values(self) -> np.ndarray:
        return self._buf[: self.n]


class StepFollower:
    """One rank's `steps.jsonl`, read incrementally: step times, data waits and GPU times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.step = _Column()
        self.duration_ns = _Column()  # host_end_ns - host_start_ns
        self.data_wait_ns = _Column()
        self.end_ns = _Column()
        self.cpu_ns = _Column()  # the training thread's CPU time; -1 where the row has none
        self.run_wait_ns = _Column()  # its time runnable, waiting for a core; -1: none
        self.last_gpu_time_ns: int | None = None
        self.skipped = 0  # rows that are not usable step rows (see `step_row_problem`)
        self._medians: tuple[int, int, int] | None = None  # (rows, step, data wait)

    def medians(self) -> tuple[int, int] | None:
        """Median step time and data wait over every step so far; recomputed only when steps
        were added (a refresh of a run whose ranks did not move costs nothing)."""
        n = self.step.n
        if n == 0:
            return None
        if self._medians is None or self._medians[0] != n:
            self._medians = (n, int(np.median(self.duration_ns.values)),
                             int(np.median(self.data_wait_ns.values)))
        return self._medians[1], self._medians[2]

    def poll(self) -> int:
        """Read the complete lines appended since the last poll; how many step rows were new."""
        try:  # a regular file within the step files' limit: a link to /dev/zero never ends
            check_readable(self.path, MAX_JSONL_BYTES)
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(max(0, MAX_JSONL_BYTES - self.offset))
        except OSError:
            return 0
        cut = chunk.rfind(b"\n") + 1  # a last line without its newline is still being written
        if cut == 0:
            return 0
        self.offset += cut
        steps: list[int] = []
        durations: list[int] = []
        waits: list[int] = []
        ends: list[int] = []
        cpus: list[int] = []
        run_waits: list[int] = []
        for line in chunk[:cut].splitlines():
            if not line.strip():
                continue
            try:
                row: Any = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.skipped += 1
                continue
            if step_row_problem(row) is not None:
                self.skipped += 1
                continue
            kind = row.get("kind")
            if kind == "gpu":
                gpu = row.get("gpu_time_ns")
                if isinstance(gpu, int) and not isinstance(gpu, bool):
                    self.last_gpu_time_ns = gpu
                continue
            start, end = row.get("host_start_ns"), row.get("host_end_ns")
            if kind != "step" or not isinstance(start, int) or not isinstance(end, int):
                continue
            wait = row.get("data_wait_ns")
            steps.append(row["step"])
            durations.append(end - start)
            waits.append(wait if isinstance(wait, int) and not isinstance(wait, bool) else 0)
            ends.append(end)
            cpu = row.get("cpu_ns")
            cpus.append(cpu if isinstance(cpu, int) and not isinstance(cpu, bool) else -1)
            rw = row.get("run_wait_ns")
            run_waits.append(rw if isinstance(rw, int) and not isinstance(rw, bool) else -1)
        for col, vals in ((self.step, steps), (self.duration_ns, durations),
                          (self.data_wait_ns, waits), (self.end_ns, ends),
                          (self.cpu_ns, cpus), (self.run_wait_ns, run_waits)):
            col.extend(vals)
        return len(steps)


class CounterFollower:
    """One `counters/<source>.arrows` stream, read incrementally: the latest value of each
    (device, metric) asked for."""

    def __init__(self, path: Path, metrics: tuple[str, ...] = GPU_METRICS) -> None:
        self.path = path
        self.metrics = metrics
        self.offset = 0
        self.schema: Any = None
        self.latest: dict[tuple[str, str], tuple[int, float]] = {}  # -> (ts_ns, value)

    def poll(self) -> int:
        """Read the whole messages appended since the last poll; how many batches were new."""
        import pyarrow as pa
        import pyarrow.compute as pc

        batches = []
        try:
            with pa.OSFile(str(self.path), "rb") as f:
                if f.size() <= self.offset:
                    return 0
                f.seek(self.offset)
                reader = pa.ipc.MessageReader.open_stream(f)
                while True:
                    try:
                        msg = reader.read_next_message()
                    except StopIteration:
                        break
                    except (OSError, pa.ArrowInvalid):
                        break  # a message still being written: read it next time
                    if self.schema is None:
                        self.schema = pa.ipc.read_schema(msg)
                    else:
                        batch = pa.ipc.read_record_batch(msg, self.schema)
                        if is_valid(batch):  # damaged bytes: skipped, never computed on
                            batches.append(batch)
                    self.offset = f.tell()
        except (OSError, pa.ArrowInvalid):
            return 0
        want = pa.array(self.metrics, pa.string())
        for batch in batches:
            batch = batch.filter(pc.is_in(batch.column("metric"), value_set=want))
            for ts, dev, metric, value in zip(*(batch.column(c).to_pylist() for c in
                                                ("ts_ns", "device", "metric", "value"))):
                key = (dev, metric)
                if key not in self.latest or ts >= self.latest[key][0]:
                    self.latest[key] = (ts, value)
        return len(batches)


@dataclass(frozen=True)
class RankLive:
    """What the live views show of one rank."""

    rank: int
    steps: int  # step rows so far
    last_step: int | None
    last_ns: int | None  # the last step's host time
    median_ns: int | None  # median step time over the whole run so far
    data_wait_ns: int | None  # the last step's data wait
    data_wait_median_ns: int | None
    last_end_ns: int | None  # when the last step ended (epoch ns)
    gpu_time_ns: int | None = None  # the last GPU step time measured (CUDA events)
    gpu_util: float | None = None  # % (NVML), latest sample of the rank's GPU
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None


@dataclass(frozen=True)
class LiveState:
    """One look at a run: whether the job runs, and per rank its step times and GPU."""

    running: bool | None  # None: no node.json says (a run directory not written by `run`)
    exit_code: int | None
    end_ns: int | None  # when the job ended (the last node to end)
    now_ns: int
    ranks: list[RankLive] = field(default_factory=list)
    skipped_rows: int = 0

    @property
    def ended(self) -> bool:
        return self.running is False

    @property
    def steps(self) -> int:
        """Steps completed by every rank so far (the slowest rank's count)."""
        return min((r.steps for r in self.ranks), default=0)

    @property
    def last_end_ns(self) -> int | None:
        return max((r.last_end_ns for r in self.ranks if r.last_end_ns is not None),
                   default=None)

    def status_line(self) -> str:
        """`running · 120 steps · last step 2 s ago`, `ended (exit 0) · 500 steps`."""
        if self.running:
            head = "running"
        elif self.running is None:
            head = "state unknown"
        else:
            head = "ended" + (f" (exit {self.exit_code})" if self.exit_code is not None else "")
        parts = [head, f"{self.steps} steps"]
        last = self.last_end_ns
        if self.running and last is not None:
            parts.append(f"last step {max(0, self.now_ns - last) / 1e9:.0f} s ago")
        return " · ".join(parts)


class RunFollower:
    """Follows a run directory: each `poll()` reads only what was appended since the last."""

    def __init__(self, run: RunDir | Path | str) -> None:
        self.run = as_run_dir(run)
        self._steps: dict[int, StepFollower] = {}
        self._counters: dict[tuple[str, str], CounterFollower] = {}
        self._gpus: dict[int, tuple[str, str]] = {}

    def step_followers(self) -> dict[int, StepFollower]:
        """The ranks followed so far, by rank."""
        return dict(self._steps)

    def rows(self) -> int:
        """Step rows read so far, all ranks together (grows when a poll found new steps)."""
        return sum(f.step.n for f in self._steps.values())

    def series(self, column: str = "duration_ns") -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per rank: (rank, its steps, one of `StepFollower`'s columns: `duration_ns`,
        `data_wait_ns`, `end_ns`, `cpu_ns` or `run_wait_ns`), as read so far; views of the followers' arrays,
        no copy."""
        return [(r, f.step.values, getattr(f, column).values)
                for r, f in sorted(self._steps.items()) if f.step.n]

    def gpu_times_seen(self) -> bool:
        """Whether any rank's timeline has device times (a device run)."""
        return any(f.last_gpu_time_ns is not None for f in self._steps.values())

    def counters_size(self) -> int:
        """Bytes of the counter streams read so far (grows when a poll found new samples)."""
        return sum(c.offset for c in self._counters.values())

    def _discover(self) -> None:
        """Pick up rank folders and counter files that appeared since the last poll."""
        for rank, meta in ranks_by_id(self.run).items():
            if rank not in self._steps:
                self._steps[rank] = StepFollower(meta.folder / STEPS_FILE)
        for nd in self.run.node_dirs():
            cdir = nd / COUNTERS_DIR
            if not cdir.is_dir():
                continue
            for p in cdir.iterdir():
                if p.name.endswith(COUNTERS_SUFFIX) and p.name.startswith("nvml"):
                    self._counters.setdefault((nd.name, p.name), CounterFollower(p))
        if self._counters and len(self._gpus) < len(self._steps):
            from uberprof.rundir.counters import rank_gpus

            self._gpus = rank_gpus(self.run)

    def running(self) -> bool | None:
        """Whether the job still runs (None: no node.json says), from its nodes' metadata
        alone: what `poll` says, without reading any step."""
        return _running([n for n in list_nodes(self.run) if n.readable])

    def ended_ns(self) -> int | None:
        """When the job ended (its last node), None while it runs or where no node.json says:
        from the nodes' metadata alone, without reading any step."""
        nodes = [n for n in list_nodes(self.run) if n.readable]
        if _running(nodes) is not False:
            return None
        return max((n.end_ns for n in nodes if n.end_ns is not None), default=None)

    def poll(self) -> LiveState:
        """Read what is new and say where the job stands."""
        self._discover()
        for f in self._steps.values():
            f.poll()
        for c in self._counters.values():
            c.poll()
        nodes = [n for n in list_nodes(self.run) if n.readable]
        running = _running(nodes)
        codes = [n.exit_code for n in nodes if n.exit_code is not None]
        ends = [n.end_ns for n in nodes if n.end_ns is not None]
        return LiveState(
            running=running,
            exit_code=max(codes, key=abs) if codes else None,
            end_ns=max(ends) if ends and not running else None,
            now_ns=time.time_ns(),
            ranks=[self._rank_live(r, f) for r, f in sorted(self._steps.items())],
            skipped_rows=sum(f.skipped for f in self._steps.values()),
        )

    def _rank_live(self, rank: int, f: StepFollower) -> RankLive:
        n = f.step.n
        med = f.medians()
        gpu: dict[str, float] = {}
        where = self._gpus.get(rank)
        if where is not None:
            node, label = where
            for c in (c for (cn, _), c in self._counters.items() if cn == node):
                for metric in GPU_METRICS:
                    hit = c.latest.get((label, metric))
                    if hit is not None:
                        gpu[metric] = hit[1]
        return RankLive(
            rank=rank,
            steps=n,
            last_step=int(f.step.values[-1]) if n else None,
            last_ns=int(f.duration_ns.values[-1]) if n else None,
            median_ns=med[0] if med else None,
            data_wait_ns=int(f.data_wait_ns.values[-1]) if n else None,
            data_wait_median_ns=med[1] if med else None,
            last_end_ns=int(f.end_ns.values[-1]) if n else None,
            gpu_time_ns=f.last_gpu_time_ns,
            gpu_util=gpu.get("util.gpu"),
            sm_clock_mhz=gpu.get("clock.sm"),
            sm_clock_max_mhz=gpu.get("clock.sm_max"),
        )


def steps_table(follower: RunFollower) -> Any:
    """Every step row read so far as a pyarrow Table (rank, step, host_start_ns, host_end_ns,
    step_time_ns, data_wait_ns): the step timelines of a run followed while its job runs."""
    import pyarrow as pa

    parts = [(r, f) for r, f in sorted(follower.step_followers().items()) if f.step.n]

    def cat(arrays: list[np.ndarray]) -> Any:
        return pa.array(np.concatenate(arrays) if arrays else np.empty(0, np.int64))

    end = [f.end_ns.values for _, f in parts]
    dur = [f.duration_ns.values for _, f in parts]
    return pa.table({
        "rank": cat([np.full(f.step.n, r, np.int64) for r, f in parts]),
        "step": cat([f.step.values for _, f in parts]),
        "host_start_ns": cat([e - d for e, d in zip(end, dur)]),
        "host_end_ns": cat(end),
        "step_time_ns": cat(dur),
        "data_wait_ns": cat([f.data_wait_ns.values for _, f in parts]),
    })


def trace_files(run: RunDir | Path | str) -> frozenset[str]:
    """The trace windows the ranks have written so far (`ranks/<r>/traces/<name>`, whole
    files only: a window is renamed into place when complete). A new one is worth analysing."""
    found = set()
    for rd in as_run_dir(run).rank_dirs():
        try:
            names = [p.name for p in (rd / TRACES_DIR).iterdir()]
        except OSError:
            continue
        found |= {f"{rd.name}/{n}" for n in names if parse_trace_file_name(n) is not None}
    return frozenset(found)


def _running(nodes: list[Any]) -> bool | None:
    """A job runs while a node has not written its end (None: no readable node.json)."""
    return any(n.end_ns is None for n in nodes) if nodes else None
