"""The link a group of ranks crosses, and that link's peak (docs/DESIGN.md, §4): what
bandwidth.py compares each collective's busbw with.

The link is the slowest the group crosses (`link_of`): `inter-node` when its ranks are on
several hosts (the NIC or InfiniBand port that carried the traffic), else `intra-node` (NVLink
or PCIe between GPUs) or `loopback` (CPU ranks on one host). Its peak (`Peaks`) comes from
`uberprof calibrate` when the run has one (`read_calibration`: measured, the most faithful),
else from the node counters: the tc cap or link speed of the host's busiest NIC during the
analysed window, the InfiniBand rate, a GPU model's NVLink rate, or the PCIe generation and
width. Counters and calibration are read from the run directory only (uberprof.rundir).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.analysis.tables.context import RunContext
from uberprof.rundir import CALIBRATION_FILE, read_json

__all__ = [
    "CALIBRATION_FILE",
    "NVLINK_PEAK",
    "PCIE_LANE",
    "LinkPeak",
    "Peaks",
    "link_of",
    "read_calibration",
]

# Per-direction NVLink bandwidth per GPU (bytes/s) of common data-centre parts (SXM boards).
NVLINK_PEAK = {"A100": 300e9, "H100": 450e9, "H200": 450e9, "H800": 200e9, "A800": 200e9,
               "B200": 900e9, "GB200": 900e9, "V100": 150e9}
# PCIe per-lane bandwidth per direction by generation (bytes/s, after encoding).
PCIE_LANE = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


@dataclass
class LinkPeak:
    """The peak a link can reach, and where that number comes from."""

    link: str  # inter-node | intra-node | loopback | unknown
    kind: str | None  # NIC name, InfiniBand, NVLink, PCIe, loopback
    peak_Bps: float | None
    source: str | None  # calibration | tc cap | link speed | InfiniBand rate | PCIe | GPU model
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"link": self.link, "kind": self.kind, "peak_Bps": self.peak_Bps,
                "peak_gbit_s": round(self.peak_Bps * 8 / 1e9, 3) if self.peak_Bps else None,
                "source": self.source, **self.detail}


def read_calibration(root: Path) -> dict[str, Any] | None:
    """The run's `calibration.json` (written by `uberprof calibrate`), or None."""
    try:
        doc = read_json(root / CALIBRATION_FILE)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == "uberprof-calibration" else None


def link_of(hosts: set[str | None], mode: str) -> str:
    """Which link a group crosses, from its participants' hosts; `mode` "device" where the
    collective runs between devices (NCCL-like), else over the hosts' sockets (Gloo)."""
    if not hosts or None in hosts:
        return "unknown"
    if len(hosts) > 1:
        return "inter-node"
    return "intra-node" if mode == "device" else "loopback"


class Peaks:
    """Finds the peak of the link a set of hosts crosses (cached per link and hosts)."""

    def __init__(self, ctx: RunContext, window: tuple[int, int] | None) -> None:
        self.ctx = ctx
        self.window = window
        self.calibration = read_calibration(ctx.root) if ctx.is_run_dir else None
        self._cache: dict[tuple[str, frozenset[str]], LinkPeak] = {}
        self._nodes: dict[str, str] | None = None  # host -> node folder with counters

    def peak(self, link: str, hosts: frozenset[str]) -> LinkPeak:
        key = (link, hosts)
        if key not in self._cache:
            self._cache[key] = self._find(link, hosts)
        return self._cache[key]

    def _find(self, link: str, hosts: frozenset[str]) -> LinkPeak:
        cal = self._from_calibration(link, hosts)
        if cal is not None:
            return cal
        if not self.ctx.is_run_dir or link in ("unknown", "loopback"):
            return LinkPeak(link, "loopback" if link == "loopback" else None, None, None)
        if link == "inter-node":
            return self._nic_peak(hosts)
        return self._gpu_link_peak(hosts)

    def _from_calibration(self, link: str, hosts: frozenset[str]) -> LinkPeak | None:
        if not self.calibration:
            return None
        best = None
        for g in self.calibration.get("groups") or []:
            if g.get("link") != link or not g.get("peak_busbw_Bps"):
                continue
            g_hosts = set(g.get("hosts") or [])
            if link != "inter-node" and g_hosts and not hosts <= g_hosts:
                continue
            if best is None or g["peak_busbw_Bps"] < best["peak_busbw_Bps"]:
                best = g
        if best is None:
            return None
        return LinkPeak(link, best.get("kind") or link, float(best["peak_busbw_Bps"]),
                        "calibration", {"half_peak_bytes": best.get("half_peak_bytes"),
                                        "calibrated_sizes": len(best.get("points") or [])})

    def _node_of_host(self) -> dict[str, str]:
        if self._nodes is None:
            from uberprof.rundir.counters import counter_meta, counter_nodes

            self._nodes = {}
            for node in counter_nodes(self.ctx.root):
                host = counter_meta(self.ctx.root, node).get("host") or node
                self._nodes.setdefault(host, node)
        return self._nodes

    def _nic_peak(self, hosts: frozenset[str]) -> LinkPeak:
        """The slowest host's busiest NIC (or InfiniBand port): its tc cap, else its speed."""
        from uberprof.rundir.counters import counter_meta, counters_table

        worst: LinkPeak | None = None
        nodes = self._node_of_host()
        for host in sorted(hosts):
            node = nodes.get(host)
            if node is None:
                return LinkPeak("inter-node", None, None, None,
                                {"note": f"no counters from host {host}"})
            meta = counter_meta(self.ctx.root, node)
            caps: dict[str, tuple[float, str]] = {}
            for nic, info in (meta.get("nics") or {}).items():
                if info.get("tc_rate"):
                    caps[nic] = (float(info["tc_rate"]), "tc cap")
                if info.get("link_speed") and (nic not in caps
                                               or info["link_speed"] < caps[nic][0]):
                    caps[nic] = (float(info["link_speed"]), "link speed")
            for port, info in (meta.get("ib_ports") or {}).items():
                if info.get("rate"):
                    caps[port] = (float(info["rate"]), "InfiniBand rate")
            if not caps:
                continue
            busiest = self._busiest(node, list(caps), counters_table)
            name = busiest if busiest in caps else (next(iter(caps)) if len(caps) == 1 else
                                                    max(caps, key=lambda k: caps[k][0]))
            rate, source = caps[name]
            kind = "InfiniBand" if source == "InfiniBand rate" else f"NIC {name}"
            if worst is None or (worst.peak_Bps or math.inf) > rate:
                worst = LinkPeak("inter-node", kind, rate, source, {"host": host, "device": name})
        return worst or LinkPeak("inter-node", None, None, None,
                                 {"note": "no NIC with a known speed or cap; run uberprof "
                                          "calibrate"})

    def _busiest(self, node: str, devices: list[str], counters_table: Any) -> str | None:
        """The device that moved the most bytes during the analysed window."""
        if self.window is None:
            return None
        try:
            t = counters_table(self.ctx.root, node, sources=["nic", "ib"],
                               metrics=["tx_rate", "rx_rate"], start_ns=self.window[0],
                               end_ns=self.window[1], label_ranks=False)
        except Exception:  # noqa: BLE001 - counters are optional evidence
            return None
        if t.num_rows == 0:
            return None
        totals: dict[str, float] = {}
        for d, v in zip(t.column("device").to_pylist(), t.column("value").to_pylist()):
            totals[d] = totals.get(d, 0.0) + (v or 0.0)
        cands = [d for d in devices if d in totals]
        return max(cands, key=lambda d: totals[d]) if cands else None

    def _gpu_link_peak(self, hosts: frozenset[str]) -> LinkPeak:
        """NVLink from the GPU model, else PCIe from the link generation and width."""
        from uberprof.rundir.counters import counter_meta, counters_table

        nodes = self._node_of_host()
        host = next(iter(hosts))
        node = nodes.get(host)
        if node is None:
            return LinkPeak("intra-node", None, None, None, {"note": "no counters"})
        meta = counter_meta(self.ctx.root, node)
        gpus = meta.get("gpus") or {}
        names = {str(g.get("name") or "") for g in gpus.values()}
        for model, rate in NVLINK_PEAK.items():
            if any(model in n and "PCIe" not in n for n in names):
                return LinkPeak("intra-node", "NVLink", rate, "GPU model",
                                {"gpu": min(names)})
        try:
            t = counters_table(self.ctx.root, node, sources=["nvml"],
                               metrics=["pcie.link_gen", "pcie.link_width"], label_ranks=False)
            gen = max((v for m, v in zip(t.column("metric").to_pylist(),
                                         t.column("value").to_pylist()) if m == "pcie.link_gen"),
                      default=None)
            width = max((v for m, v in zip(t.column("metric").to_pylist(),
                                           t.column("value").to_pylist())
                         if m == "pcie.link_width"), default=None)
        except Exception:  # noqa: BLE001
            gen = width = None
        if gen and width and int(gen) in PCIE_LANE:
            return LinkPeak("intra-node", "PCIe", PCIE_LANE[int(gen)] * width, "PCIe",
                            {"gen": int(gen), "width": int(width)})
        return LinkPeak("intra-node", None, None, None, {"note": "unknown GPU interconnect"})
