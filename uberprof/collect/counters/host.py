"""Host counters through psutil and /sys: CPU, memory, NICs (with link speed and tc cap),
InfiniBand ports, and the job's own processes.

Byte counters are turned into rates here (bytes per second over the sampling interval) because
every consumer wants rates, and a rate needs the previous reading that only the sampler has.
Link speeds and caps are bytes per second too, so a rate and its ceiling compare directly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from uberprof.collect.counters.store import Row
from uberprof.rundir import RunDir, read_rank

SYS_NET = Path("/sys/class/net")
SYS_IB = Path("/sys/class/infiniband")
MAX_NICS = 64
MAX_PROCESSES = 128


class RateTracker:
    """Turns monotonically growing counters into per-second rates; a counter that goes back
    (reset, 32-bit wrap) yields no rate for that interval rather than a nonsense one."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[float, float]] = {}

    def rate(self, device: str, metric: str, value: float, t: float) -> float | None:
        key = (device, metric)
        prev = self._last.get(key)
        self._last[key] = (value, t)
        if prev is None:
            return None
        dv, dt = value - prev[0], t - prev[1]
        if dt <= 0 or dv < 0:
            return None
        return dv / dt

    def forget_except(self, devices: set[str]) -> None:
        self._last = {k: v for k, v in self._last.items() if k[0] in devices}


class HostSource:
    """CPU utilisation (mean and busiest core), user/system/iowait, load, memory."""

    name = "host"

    def prime(self) -> None:
        psutil.cpu_percent(percpu=True)
        psutil.cpu_times_percent()

    def sample(self) -> list[Row]:
        per_core = psutil.cpu_percent(percpu=True)
        times = psutil.cpu_times_percent()
        mem = psutil.virtual_memory()
        rows: list[Row] = []
        if per_core:
            rows.append(("cpu", "cpu.util", sum(per_core) / len(per_core), "%"))
            rows.append(("cpu", "cpu.util_max_core", max(per_core), "%"))
        for field in ("user", "system", "iowait"):
            v = getattr(times, field, None)
            if v is not None:
                rows.append(("cpu", f"cpu.{field}", v, "%"))
        try:
            l1, l5, l15 = os.getloadavg()
            rows += [("cpu", "load1", l1, "count"), ("cpu", "load5", l5, "count"),
                     ("cpu", "load15", l15, "count")]
        except OSError:
            pass
        rows += [("mem", "mem.used", mem.used, "B"), ("mem", "mem.available", mem.available, "B"),
                 ("mem", "mem.total", mem.total, "B")]
        try:
            rows.append(("mem", "swap.used", psutil.swap_memory().used, "B"))
        except (OSError, RuntimeError):
            pass
        return rows

    def describe(self) -> dict[str, Any]:
        return {"cpus": psutil.cpu_count(), "cpus_physical": psutil.cpu_count(logical=False)}


# ---- NICs -----------------------------------------------------------------------------------------


VIRTUAL_DRIVERS = frozenset({"veth", "bridge", "tun", "dummy", "ifb", "vxlan", "geneve",
                             "openvswitch", "wireguard", "loopback"})
"""Software links: the speed they report (veth says 10 Gbit/s) is no physical limit."""


def nic_driver(name: str) -> str | None:
    """The NIC's driver (`mlx5_core`, `virtio_net`, `veth`, ...) through the ethtool ioctl;
    None where the kernel does not say."""
    import array
    import fcntl
    import struct

    # struct ethtool_drvinfo: cmd (ETHTOOL_GDRVINFO = 3), then driver[32], ... 196 bytes in all
    buf = array.array("B", struct.pack("I", 3) + bytes(192))
    ifreq = struct.pack("16sP", name.encode()[:15], buf.buffer_info()[0])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            fcntl.ioctl(s.fileno(), 0x8946, ifreq)  # SIOCETHTOOL
    except OSError:
        return None
    return buf[4:36].tobytes().split(b"\0")[0].decode(errors="replace") or None


def sys_speed_bytes(name: str, sys_net: Path = SYS_NET) -> float | None:
    """What /sys/class/net/<nic>/speed says, in bytes/s; None when it fails or gives -1."""
    try:
        mbit = int((sys_net / name / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return mbit * 125_000.0 if mbit > 0 else None


def link_speed_bytes(name: str, driver: str | None, sys_net: Path = SYS_NET) -> float | None:
    """The NIC's negotiated speed in bytes/s; None where there is no physical speed to report
    (veth and other software links, down links, drivers that do not know)."""
    if driver in VIRTUAL_DRIVERS:
        return None
    return sys_speed_bytes(name, sys_net)


def nic_kind(name: str, driver: str | None, sys_net: Path = SYS_NET) -> str:
    """`physical` when backed by a device (or `infiniband` for IPoIB), else the software kind."""
    base = sys_net / name
    if driver in VIRTUAL_DRIVERS:
        return driver
    if (base / "device").exists():
        return "infiniband" if _read(base / "type") == "32" else "physical"
    try:
        m = re.search(r"^DEVTYPE=(\S+)", (base / "uevent").read_text(), re.MULTILINE)
        if m:
            return m.group(1)
    except OSError:
        pass
    return "virtual"


_RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_tc_rate(value: Any) -> float | None:
    """A tc rate in bytes/s: `tc -j` gives an integer in bytes/s; older versions give text such as
    `1Gbit` or `125Mbps` (bit and byte suffixes as tc prints them)."""
    if isinstance(value, (int, float)):
        return float(value) if value > 0 else None
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"\s*([\d.]+)\s*([kKmMgGtT]?)(i?)(bit|bps)?\s*", value)
    if not m:
        return None
    num = float(m.group(1))
    scale = _RATE_UNITS[m.group(2).lower()]
    if m.group(3):
        scale = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[m.group(2).lower()]
    unit = m.group(4) or "bit"
    return num * scale / 8 if unit == "bit" else num * scale


def parse_tc_qdiscs(doc: Any) -> dict[str, float]:
    """Per interface, the tightest rate cap among its qdiscs (tbf `rate`, cake `bandwidth`)
    from `tc -j qdisc show` output."""
    caps: dict[str, float] = {}
    if not isinstance(doc, list):
        return caps
    for q in doc:
        if not isinstance(q, dict):
            continue
        dev, opts = q.get("dev"), q.get("options") or {}
        if not dev or not isinstance(opts, dict):
            continue
        rate = None
        if q.get("kind") == "tbf":
            rate = parse_tc_rate(opts.get("rate64", opts.get("rate")))
        elif q.get("kind") == "cake":
            rate = parse_tc_rate(opts.get("bandwidth"))
        if rate:
            caps[dev] = min(rate, caps.get(dev, rate))
    return caps


def tc_caps(timeout_s: float = 2.0) -> dict[str, float] | None:
    """Rate caps set with tc on this network namespace's interfaces; None without `tc`."""
    exe = shutil.which("tc") or next((p for p in ("/usr/sbin/tc", "/sbin/tc")
                                      if os.access(p, os.X_OK)), None)
    if exe is None:
        return None
    try:
        # Its own session: a Ctrl-C meant for the job must not kill it half-way.
        out = subprocess.run([exe, "-j", "qdisc", "show"], capture_output=True, timeout=timeout_s,
                             check=False, stdin=subprocess.DEVNULL, start_new_session=True)
        return parse_tc_qdiscs(json.loads(out.stdout or b"[]"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


class NicSource:
    """Per-NIC receive/transmit rates every tick; link speed and tc cap at the slow tier."""

    name = "nic"

    def __init__(self, sys_net: Path = SYS_NET, use_tc: bool = True) -> None:
        self.sys_net = sys_net
        self.use_tc = use_tc
        self._rates = RateTracker()
        self.links: dict[str, dict[str, Any]] = {}
        self.tc_available: bool | None = None
        self._up: set[str] | None = None

    def _counters(self) -> dict[str, Any]:
        counters = psutil.net_io_counters(pernic=True)
        names = [n for n in counters if n != "lo" and (self._up is None or n in self._up)]
        return {n: counters[n] for n in names[:MAX_NICS]}

    def _refresh_up(self) -> dict[str, Any]:
        """Interfaces that are up: a down one (unused ifb, docker0 without containers) is noise."""
        stats = psutil.net_if_stats()
        self._up = {n for n, st in stats.items() if st.isup}
        return stats

    def prime(self) -> None:
        self._refresh_up()
        t = time.monotonic()
        for nic, c in self._counters().items():
            self._rates.rate(nic, "rx", c.bytes_recv, t)
            self._rates.rate(nic, "tx", c.bytes_sent, t)

    def sample(self) -> list[Row]:
        t = time.monotonic()
        rows: list[Row] = []
        for nic, c in self._counters().items():
            rx = self._rates.rate(nic, "rx", c.bytes_recv, t)
            tx = self._rates.rate(nic, "tx", c.bytes_sent, t)
            if rx is not None:
                rows.append((nic, "rx_rate", rx, "B/s"))
            if tx is not None:
                rows.append((nic, "tx_rate", tx, "B/s"))
        return rows

    def sample_links(self) -> list[Row]:
        """Link speeds and caps: they rarely change, and reading caps runs `tc`."""
        caps = tc_caps() if self.use_tc else None
        self.tc_available = caps is not None
        stats = self._refresh_up()
        rows: list[Row] = []
        for nic in self._counters():
            driver = nic_driver(nic)
            speed = link_speed_bytes(nic, driver, self.sys_net)
            cap = (caps or {}).get(nic)
            st = stats.get(nic)
            self.links[nic] = {"kind": nic_kind(nic, driver, self.sys_net), "driver": driver,
                               "link_speed": speed, "tc_rate": cap,
                               "reported_speed": sys_speed_bytes(nic, self.sys_net),
                               "mtu": st.mtu if st else None, "up": st.isup if st else None}
            if speed is not None:
                rows.append((nic, "link_speed", speed, "B/s"))
            if cap is not None:
                rows.append((nic, "tc_rate", cap, "B/s"))
        return rows

    def describe(self) -> dict[str, Any]:
        return {"nics": self.links, "tc": self.tc_available}


# ---- InfiniBand -----------------------------------------------------------------------------------

_IB_COUNTERS = (
    # file, metric, bytes per unit (data counters count 4-byte words)
    ("port_xmit_data", "tx_rate", 4, "B/s"),
    ("port_rcv_data", "rx_rate", 4, "B/s"),
    ("port_xmit_packets", "tx_packets_rate", 1, "1/s"),
    ("port_rcv_packets", "rx_packets_rate", 1, "1/s"),
    ("port_xmit_wait", "xmit_wait_rate", 1, "ticks/s"),
)


def parse_ib_rate(text: str) -> float | None:
    """`200 Gb/sec (4X HDR)` -> bytes/s."""
    m = re.match(r"\s*([\d.]+)\s*Gb/sec", text)
    return float(m.group(1)) * 1e9 / 8 if m else None


class InfinibandSource:
    """Per IB port transmit/receive rates (port counters are in 4-byte words), congestion wait,
    and the port's rate."""

    name = "ib"

    def __init__(self, root: Path = SYS_IB) -> None:
        self.root = root
        self._rates = RateTracker()
        self.ports: dict[str, dict[str, Any]] = {}

    def _port_dirs(self) -> list[tuple[str, Path]]:
        out = []
        try:
            for dev in sorted(self.root.iterdir()):
                ports = dev / "ports"
                if ports.is_dir():
                    out += [(f"{dev.name}/{p.name}", p) for p in sorted(ports.iterdir())]
        except OSError:
            pass
        return out

    def present(self) -> bool:
        return bool(self._port_dirs())

    def prime(self) -> None:
        self.sample()

    def sample(self) -> list[Row]:
        t = time.monotonic()
        rows: list[Row] = []
        for label, port in self._port_dirs():
            for fname, metric, scale, unit in _IB_COUNTERS:
                raw = _read(port / "counters" / fname)
                if raw is None:
                    continue
                try:
                    value = float(int(raw)) * scale
                except ValueError:
                    continue
                r = self._rates.rate(label, metric, value, t)
                if r is not None:
                    rows.append((label, metric, r, unit))
        return rows

    def sample_links(self) -> list[Row]:
        rows: list[Row] = []
        for label, port in self._port_dirs():
            rate = parse_ib_rate(_read(port / "rate") or "")
            self.ports[label] = {"rate": rate, "state": _read(port / "state"),
                                 "link_layer": _read(port / "link_layer")}
            if rate is not None:
                rows.append((label, "link_speed", rate, "B/s"))
        return rows

    def describe(self) -> dict[str, Any]:
        return {"ib_ports": self.ports}


# ---- the job's processes --------------------------------------------------------------------------


class ProcessSource:
    """CPU and resident memory of every process the node agent started (launcher, ranks, data
    loader workers), plus ranks on this host that another agent started (srun: one agent per
    rank). Devices are `pid:<pid>` (stable for a process's life; a rank's rank.json may appear
    after its process does) and `job` for the sum; `read_counters` labels rank pids `rank:<r>`."""

    name = "proc"

    def __init__(self, run: RunDir | None, root_pid: int | None = None,
                 rank_scan_s: tuple[float, float, float] = (2.0, 120.0, 30.0)) -> None:
        self.run = run
        self.root_pid = root_pid or os.getpid()
        self.host = socket.gethostname()
        # Look for new rank.json files every 2 s for the first 2 minutes (ranks start), then
        # every 30 s: listing ranks/ on a shared file system from every node has a cost.
        self.rank_scan_s = rank_scan_s
        self._t0 = time.monotonic()
        self._procs: dict[int, psutil.Process] = {}
        self._ranks: dict[int, int] = {}  # pid -> rank
        self._seen_rank_dirs: set[str] = set()
        self._last_rank_scan = -1e18
        self.processes: dict[str, dict[str, Any]] = {}
        self.changed = False

    def refresh(self) -> None:
        """Find the current process tree (cheap: /proc walk of our own children)."""
        now = time.monotonic()
        early, start_phase, late = self.rank_scan_s
        every = early if now - self._t0 < start_phase else late
        if self.run is not None and now - self._last_rank_scan >= every:
            self._last_rank_scan = now
            self._scan_ranks()
        try:
            tree = psutil.Process(self.root_pid).children(recursive=True)
        except psutil.Error:
            tree = []
        pids = {p.pid for p in tree} | set(self._ranks)
        pids = set(sorted(pids)[:MAX_PROCESSES])
        procs = dict(self._procs)
        for pid in set(procs) - pids:
            del procs[pid]
        for pid in pids - set(procs):
            try:
                p = psutil.Process(pid)
                p.cpu_percent(None)  # start its CPU accounting
                procs[pid] = p
                self.processes[str(pid)] = {"name": _safe(p.name), "ppid": _safe(p.ppid),
                                            "rank": self._ranks.get(pid)}
                self.changed = True
            except psutil.Error:
                continue
        for pid, rank in self._ranks.items():
            entry = self.processes.get(str(pid))
            if entry is not None and entry.get("rank") != rank:
                entry["rank"] = rank
                self.changed = True
        self._procs = procs

    def _scan_ranks(self) -> None:
        assert self.run is not None
        try:
            names = os.listdir(self.run.ranks_dir)
        except OSError:
            return
        if len(names) == len(self._seen_rank_dirs):
            return  # nothing new (a listing is cheap; reading every rank.json is not)
        for d in self.run.rank_dirs():
            if d.name in self._seen_rank_dirs:
                continue
            meta = read_rank(d)
            if not meta.readable:
                continue  # not written yet: look again next time
            self._seen_rank_dirs.add(d.name)
            if meta.host == self.host and meta.pid is not None:
                self._ranks[meta.pid] = meta.rank

    def prime(self) -> None:
        self.refresh()

    def sample(self) -> list[Row]:
        rows: list[Row] = []
        total_cpu = total_rss = 0.0
        for pid, p in list(self._procs.items()):
            try:
                with p.oneshot():
                    if p.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped
                        raise psutil.NoSuchProcess(pid)
                    cpu = p.cpu_percent(None)
                    rss = p.memory_info().rss
            except psutil.Error:
                self._procs.pop(pid, None)
                continue
            label = f"pid:{pid}"
            rows += [(label, "cpu.util", cpu, "%"), (label, "mem.rss", rss, "B")]
            total_cpu += cpu
            total_rss += rss
        if self._procs:
            rows += [("job", "cpu.util", total_cpu, "%"), ("job", "mem.rss", total_rss, "B")]
        return rows

    def describe(self) -> dict[str, Any]:
        return {"processes": self.processes}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except psutil.Error:
        return None
