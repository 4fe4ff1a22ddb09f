"""InfiniBand counters: per port (/sys/class/infiniband), transmit and receive rates in bytes
per second (the port counters count 4-byte words), packet rates and congestion wait every
tick, and the port's rate at the slow tier.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from uberprof.collect.counters.host import RateTracker, sys_text
from uberprof.collect.counters.store import Row

__all__ = ["InfinibandSource", "parse_ib_rate"]

SYS_IB = Path("/sys/class/infiniband")

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
                raw = sys_text(port / "counters" / fname)
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
            rate = parse_ib_rate(sys_text(port / "rate") or "")
            self.ports[label] = {"rate": rate, "state": sys_text(port / "state"),
                                 "link_layer": sys_text(port / "link_layer")}
            if rate is not None:
                rows.append((label, "link_speed", rate, "B/s"))
        return rows

    def describe(self) -> dict[str, Any]:
        return {"ib_ports": self.ports}
