"""Reading a run's counters: the accessor that analysis, the report and the dashboard share.

The node agent writes them (`uberprof.collect.counters.store`); everything that reads them goes
through here, so that no reader depends on the collect side:

    counters/<source>.arrows   Arrow IPC stream: ts_ns int64 (epoch ns), device, metric,
                               value float64, unit; one batch per flush, a cut-off tail skipped
    counters/index.json        per (source, metric): unit, samples, devices, first/last ts_ns
    counters/meta.json         settings, GPUs (UUIDs), NICs (speed, tc cap), processes, notes

Filters (sources, metrics, time range) apply batch by batch while reading, so memory stays
bounded by what was asked for, not by the length of the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.rundir._checked import as_int, as_str
from uberprof.rundir.layout import (
    COUNTERS_DIR,
    COUNTERS_INDEX,
    COUNTERS_META,
    COUNTERS_SUFFIX,
    RunDir,
    as_run_dir,
    read_json,
)
from uberprof.rundir.ranks import list_ranks, ranks_by_id

COLUMNS = ["node", "ts_ns", "source", "device", "metric", "value", "unit"]


def normalize_gpu_uuid(uuid: str | None) -> str | None:
    """`GPU-8f2e...` (NVML) and `8f2e...` (torch) to one form, so ranks map to GPUs."""
    if not uuid:
        return None
    u = str(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        u = u.removeprefix(prefix)
    return u


@dataclass
class SeriesStats:
    """What index.json says of one (source, metric): kept by the writer as it flushes, and
    rebuilt by `scan_index` from the tables when index.json is missing."""

    unit: str
    rows: int = 0
    devices: set[str] = field(default_factory=set)
    first_ns: int | None = None
    last_ns: int | None = None

    def add(self, rows: int, devices: Iterable[str], first_ns: int, last_ns: int) -> None:
        self.rows += rows
        self.devices.update(devices)
        self.first_ns = first_ns if self.first_ns is None else min(self.first_ns, first_ns)
        self.last_ns = last_ns if self.last_ns is None else max(self.last_ns, last_ns)

    def entry(self, source: str, metric: str) -> dict[str, Any]:
        """The index.json row."""
        return {"source": source, "metric": metric, "unit": self.unit, "samples": self.rows,
                "devices": len(self.devices), "first_ns": self.first_ns, "last_ns": self.last_ns}


def source_files(counters_dir: Path) -> dict[str, Path]:
    """The sources a counters folder holds, by name."""
    if not counters_dir.is_dir():
        return {}
    return {p.name[: -len(COUNTERS_SUFFIX)]: p for p in sorted(counters_dir.iterdir())
            if p.name.endswith(COUNTERS_SUFFIX) and p.is_file()}


def iter_batches(path: Path, on_damage: Callable[[str], None] | None = None) -> Iterator[Any]:
    """Every whole, valid batch of one stream file, up to the first damage: stops at a cut-off
    tail (writer killed mid-write) or bytes that are not a batch, and skips a batch whose bytes
    were damaged inside (`is_valid`). Never raises for what the file holds (a damaged length
    can make Arrow ask for more memory than there is: that is damage too). `on_damage` is told
    one line naming the file and the damage, so that no sample is lost silently
    (`counter_file_problems`)."""
    import pyarrow as pa

    kept = rows = invalid = 0
    size = 0

    def damaged(what: str, rest: bool = True) -> None:
        if on_damage is None:
            return
        bad = f", {invalid} damaged batch(es) left out" if invalid and rest else ""
        tail = (f"{kept} whole batch(es) before it kept ({rows} sample(s)){bad}, the rest left "
                "out" if rest else f"{kept} whole batch(es) kept ({rows} sample(s))")
        on_damage(f"{path}: {what}; {tail}" if kept or not rest else
                  f"{path}: {what}; no sample could be read")

    try:
        with pa.OSFile(str(path), "rb") as f:
            size = f.size()
            if size == 0:
                return
            # one flush per batch, a few KB each: threads cost more than they save (~40%)
            reader = pa.ipc.open_stream(f, options=pa.ipc.IpcReadOptions(use_threads=False))
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    at = f.tell()
                    if at < size:  # an end-of-stream marker with bytes after it
                        damaged(f"{size - at} byte(s) after the end of the stream (at byte "
                                f"{at} of {size}) not read")
                    elif invalid:
                        damaged(f"{invalid} damaged batch(es) left out", rest=False)
                    return
                except (OSError, pa.ArrowException, MemoryError) as exc:
                    at = f.tell()
                    damaged("cut off in its last batch (the writer stopped mid-write)"
                            if at >= size else
                            f"damaged at byte {at} of {size} ({_short_error(exc)})")
                    return
                if is_valid(batch):
                    kept += 1
                    rows += batch.num_rows
                    yield batch
                else:
                    invalid += 1
    except (OSError, pa.ArrowException, MemoryError) as exc:
        damaged(f"not an Arrow stream ({_short_error(exc)})" if not kept else
                f"unreadable ({_short_error(exc)})")
        return


def _short_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def counter_file_problems(run_dir: str | Path | RunDir) -> list[str]:
    """One line per damaged counters file of a run (`iter_batches`'s damage: cut off, garbled,
    bytes after the stream's end), naming the file and what was kept: what `info`, `analyze`
    and `report` say, since every counter reader keeps only the whole batches before it."""
    out: list[str] = []
    for nd in as_run_dir(run_dir).node_dirs():
        for path in source_files(nd / COUNTERS_DIR).values():
            for _ in iter_batches(path, out.append):
                pass
    return out


def is_valid(batch: Any) -> bool:
    """Whether a batch read from disk is whole inside: Arrow checks only the framing when it
    reads one, and a damaged offset or length then crashes the process (a segfault, not an
    error) in the first computation on it. A full validation is linear and cheap next to it."""
    import pyarrow as pa

    try:
        batch.validate(full=True)
    except pa.ArrowException:  # ArrowInvalid and its kin
        return False
    return True


def read_index(counters_dir: Path) -> list[dict[str, Any]] | None:
    """index.json's series, or None when it is missing, unreadable or holds a row that is not
    what `SeriesStats.entry` writes (the tables are scanned instead: they are the truth)."""
    try:
        rows = list(read_json(counters_dir / COUNTERS_INDEX)["series"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return rows if all(_index_row_ok(r) for r in rows) else None


def _index_row_ok(row: Any) -> bool:
    return (isinstance(row, dict) and all(as_str(row.get(k)) for k in ("source", "metric"))
            and (row.get("unit") is None or isinstance(row.get("unit"), str))
            and all(as_int(row.get(k), 0) is not None for k in ("samples", "devices"))
            and all(row.get(k) is None or as_int(row.get(k)) is not None
                    for k in ("first_ns", "last_ns")))


def scan_index(counters_dir: Path) -> list[dict[str, Any]]:
    """The index rebuilt from the tables themselves, for folders whose index.json is missing."""
    import pyarrow as pa

    out = []
    for source, path in source_files(counters_dir).items():
        series: dict[str, SeriesStats] = {}
        for batch in iter_batches(path):
            groups = pa.Table.from_batches([batch]).group_by(["metric", "unit"]).aggregate(
                [("ts_ns", "min"), ("ts_ns", "max"), ("ts_ns", "count"), ("device", "distinct")])
            for g in groups.to_pylist():
                series.setdefault(g["metric"], SeriesStats(unit=g["unit"])).add(
                    g["ts_ns_count"], g["device_distinct"], g["ts_ns_min"], g["ts_ns_max"])
        out += [s.entry(source, m) for m, s in sorted(series.items())]
    return out


def series_index(counters_dir: Path) -> list[dict[str, Any]]:
    """The series a counters folder holds: from index.json, else by scanning the tables."""
    index = read_index(counters_dir)
    return scan_index(counters_dir) if index is None else index


def read_meta(counters_dir: Path) -> dict[str, Any]:
    """meta.json of a counters folder, {} when missing or unreadable. Its `host` is a name or
    absent (None): every reader uses it as one, and findings quote it."""
    try:
        meta = read_json(counters_dir / COUNTERS_META)
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict):
        return {}
    if "host" in meta:
        meta["host"] = as_str(meta["host"])
    return meta


def counter_nodes(run_dir: str | Path | RunDir) -> list[str]:
    """Nodes (folder names under nodes/) that hold counters."""
    return [p.name for p in as_run_dir(run_dir).node_dirs() if source_files(p / COUNTERS_DIR)]


def rank_pids(run_dir: str | Path | RunDir, host: str | None) -> dict[int, int]:
    """pid -> rank for the ranks that ran on `host` (from their rank.json)."""
    return {m.pid: m.rank for m in list_ranks(run_dir)
            if m.pid is not None and m.rank is not None and (host is None or m.host == host)}


def counters_table(run_dir: str | Path | RunDir, node: str | None = None,
                   sources: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
                   start_ns: int | None = None, end_ns: int | None = None,
                   label_ranks: bool = True) -> Any:
    """The counters as a pyarrow Table (columns: node, ts_ns, source, device, metric, value,
    unit); `node=None` reads every node of the run. With `label_ranks`, process rows of rank
    processes read `rank:<r>` instead of `pid:<pid>`."""
    import pyarrow as pa

    run = as_run_dir(run_dir)
    nodes = [node] if node is not None else counter_nodes(run)
    want_sources = set(sources) if sources is not None else None
    want_metrics = pa.array(sorted(set(metrics)), pa.string()) if metrics is not None else None
    parts = []
    ranks_by_node: dict[str, dict[str, str]] = {}
    for n in nodes:
        for source, path in source_files(run.nodes_dir / n / COUNTERS_DIR).items():
            if want_sources is not None and source not in want_sources:
                continue
            whole = _shared_stream(path)
            chunks = [whole] if whole is not None else _chunks(iter_batches(path))
            batches = [_filtered(chunk, want_metrics, start_ns, end_ns) for chunk in chunks]
            batches = [b for b in batches if b.num_rows]
            if not batches:
                continue
            t = pa.concat_tables(batches)
            rows = t.num_rows
            device = t.column("device")
            if source == "proc" and label_ranks:
                if n not in ranks_by_node:
                    host = read_meta(run.nodes_dir / n / COUNTERS_DIR).get("host")
                    ranks_by_node[n] = {f"pid:{pid}": f"rank:{r}"
                                        for pid, r in rank_pids(run, host).items()}
                names = ranks_by_node[n]
                device = pa.array([names.get(d, d) for d in device.to_pylist()], pa.string())
            parts.append(pa.table({
                "node": pa.repeat(pa.scalar(n, pa.string()), rows),
                "ts_ns": t.column("ts_ns"),
                "source": pa.repeat(pa.scalar(source, pa.string()), rows),
                "device": device,
                "metric": t.column("metric"),
                "value": t.column("value"),
                "unit": t.column("unit"),
            }))
    if not parts:
        return pa.table({c: pa.array([], t) for c, t in zip(
            COLUMNS, [pa.string(), pa.int64(), pa.string(), pa.string(), pa.string(),
                      pa.float64(), pa.string()])})
    out = pa.concat_tables(parts)
    if len(parts) == 1 and _ascending(out.column("ts_ns")):  # one writer's file: in time order
        return out
    return out.sort_by([("ts_ns", "ascending")])


_STORED = ["ts_ns", "device", "metric", "value", "unit"]
_CHUNK_ROWS = 1 << 18  # batches filtered together: one flush is a few thousand rows
_SHARED_MAX_BYTES = 4 << 20  # a stream kept whole while shared: host, nic, ib, proc; not a GPU one
_shared: dict[str, tuple[tuple[int, int, int], Any]] | None = None


@contextmanager
def shared_reads() -> Iterator[None]:
    """Within it, each counters stream of at most a few MB is read once and kept (by inode,
    size and mtime: a growing file is read again), then filtered for each reader. A
    diagnosis reads one node's host stream for its memory, its CPU and its crash evidence,
    each time hundreds of small batches (0.05 ms each: reading and checking them is the cost,
    not the filter). Memory: the small streams of every node, for the time of the block."""
    global _shared
    outer = _shared
    if outer is None:
        _shared = {}
    try:
        yield
    finally:
        if outer is None:
            _shared = None


def _shared_stream(path: Path) -> Any:
    """The stream's valid batches as one table of `_STORED` columns, when inside
    `shared_reads` and the file is small enough; else None (read it batch by batch)."""
    import pyarrow as pa

    cache = _shared
    if cache is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    if st.st_size > _SHARED_MAX_BYTES:
        return None
    ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    seen = cache.get(str(path))
    if seen is not None and seen[0] == ident:
        return seen[1]
    parts = [b.select(_STORED) for b in iter_batches(path)]
    if not parts:
        return None  # nothing readable: the batch path finds the same nothing
    table = pa.Table.from_batches(parts).combine_chunks()
    cache[str(path)] = (ident, table)
    return table


def _chunks(batches: Iterable[Any]) -> Iterator[Any]:
    """A stream's batches as tables of about `_CHUNK_ROWS` rows: filtering a few large tables
    is much cheaper than thousands of small batches, and memory stays bounded."""
    import pyarrow as pa

    group: list[Any] = []
    rows = 0
    for b in batches:
        group.append(b.select(_STORED))
        rows += b.num_rows
        if rows >= _CHUNK_ROWS:
            yield pa.Table.from_batches(group)
            group, rows = [], 0
    if group:
        yield pa.Table.from_batches(group)


def _filtered(t: Any, metrics: Any, start_ns: int | None, end_ns: int | None) -> Any:
    """The rows of `t` with a metric in `metrics` (all when None) between the times."""
    import pyarrow.compute as pc

    mask = None
    if start_ns is not None:
        mask = pc.greater_equal(t.column("ts_ns"), start_ns)
    if end_ns is not None:
        m = pc.less_equal(t.column("ts_ns"), end_ns)
        mask = m if mask is None else pc.and_(mask, m)
    if mask is not None:  # the times first (integers, cheap): fewer names to compare
        t = t.filter(mask)
    if metrics is not None and t.num_rows:
        # one array, not the hundreds of flushes' chunks (half the time of is_in on them)
        t = t.filter(pc.is_in(t.column("metric").combine_chunks(), value_set=metrics))
    return t


def _ascending(ts: Any) -> bool:
    import numpy as np

    v = ts.to_numpy()
    return bool((np.diff(v) >= 0).all())


def read_counters(run_dir: str | Path | RunDir, node: str | None = None,
                  sources: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
                  start_ns: int | None = None, end_ns: int | None = None,
                  label_ranks: bool = True) -> Any:
    """A node's counters as a pandas DataFrame in long format, sorted by time:
    node, ts_ns (epoch ns, comparable with steps and traces), source, device, metric, value, unit.

    Sources: host (cpu.*, load*, mem.*), nic (rx_rate, tx_rate, link_speed, tc_rate), ib, proc
    (`rank:<r>`, other processes `pid:<pid>`, and `job`), nvml (per `gpu<N>`), gpm, dcgm.
    See docs/counters.md.
    """
    return counters_table(run_dir, node, sources, metrics, start_ns, end_ns,
                          label_ranks).to_pandas()


def counter_meta(run_dir: str | Path | RunDir, node: str) -> dict[str, Any]:
    """meta.json of a node's counters: settings, GPUs with UUIDs, NICs with link speed and tc cap
    (bytes/s, None where unknown), InfiniBand ports, processes, unsupported metrics, notes."""
    return read_meta(as_run_dir(run_dir).nodes_dir / node / COUNTERS_DIR)


def counter_series(run_dir: str | Path | RunDir, node: str) -> list[dict[str, Any]]:
    """The series a node's counters hold (`series_index` of its counters folder)."""
    return series_index(as_run_dir(run_dir).nodes_dir / node / COUNTERS_DIR)


def link_caps(run_dir: str | Path | RunDir, node: str) -> dict[str, float | None]:
    """Per NIC (and IB port), the ceiling a rate can reach in bytes/s: the tc cap when one is
    set, else the link speed, else None (veth and other virtual links report no speed)."""
    meta = counter_meta(run_dir, node)
    caps: dict[str, float | None] = {}
    for nic, info in (meta.get("nics") or {}).items():
        candidates = [v for v in (info.get("tc_rate"), info.get("link_speed")) if v]
        caps[nic] = min(candidates) if candidates else None
    for port, info in (meta.get("ib_ports") or {}).items():
        caps[port] = info.get("rate")
    return caps


def rank_gpus(run_dir: str | Path | RunDir) -> dict[int, tuple[str, str]]:
    """rank -> (node, GPU label such as `gpu3`), matched on GPU UUID between the rank's
    rank.json (torch's view, after CUDA_VISIBLE_DEVICES) and the node's NVML devices."""
    run = as_run_dir(run_dir)
    by_uuid: dict[tuple[str, str], tuple[str, str]] = {}
    for nd in run.node_dirs():
        meta = read_meta(nd / COUNTERS_DIR)
        for label, gpu in (meta.get("gpus") or {}).items():
            uuid = normalize_gpu_uuid(gpu.get("uuid"))
            if uuid:
                by_uuid[(meta.get("host") or "", uuid)] = (nd.name, label)
    out: dict[int, tuple[str, str]] = {}
    for rank, meta in ranks_by_id(run).items():
        uuid = normalize_gpu_uuid(meta.device.get("uuid"))
        hit = by_uuid.get((meta.host or "", uuid)) if uuid else None
        if hit is None and uuid:  # host names written differently: UUIDs are unique anyway
            hit = next((v for (h, u), v in by_uuid.items() if u == uuid), None)
        if hit is not None:
            out[rank] = hit
    return out
