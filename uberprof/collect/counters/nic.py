"""NIC counters: per interface, receive and transmit rates every tick (psutil), and at the
slow tier its driver, kind, negotiated link speed (/sys, ethtool) and the rate cap tc sets on
it, in bytes per second like the rates, so a rate and its ceiling compare directly.
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

from uberprof.collect.counters.host import RateTracker, sys_text
from uberprof.collect.counters.store import Row

__all__ = [
    "VIRTUAL_DRIVERS",
    "NicSource",
    "link_speed_bytes",
    "nic_driver",
    "nic_kind",
    "parse_tc_qdiscs",
    "parse_tc_rate",
    "sys_speed_bytes",
    "tc_caps",
]

SYS_NET = Path("/sys/class/net")
MAX_NICS = 64


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
        return "infiniband" if sys_text(base / "type") == "32" else "physical"
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
