"""Where everything goes in the merged trace, and the ids that keep it apart.

One process per rank (pid = rank), then one for uberprof's findings and one per node for its
counters. Thread ids are unique across the whole file, not only within their process, because
viewers key threads by tid alone (Perfetto's JSON importer names and merges threads by tid), and
two ranks' main threads would otherwise share one track. Flow ids are renumbered for the same
reason: every rank's Kineto numbers its launch flows from its own correlation ids.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["IdSpace", "ProcessInfo", "TrackInfo", "nest_lanes", "qualify"]


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    name: str
    sort_index: int
    labels: str | None = None


@dataclass(frozen=True)
class TrackInfo:
    pid: int
    tid: int
    name: str
    sort_index: int


@dataclass
class IdSpace:
    """pids and tids for a trace of `max_pid + 1` processes, and fresh flow ids.

    tid = base + pid * stride + k for the k-th track of a process, base being the first power
    of ten above every pid (and at least `stride`): so a tid is never a pid, never shared by
    two processes, and fits the 32 bits Perfetto's JSON importer allows up to millions of
    ranks (rank r's tracks read (r + 1) * 1000 + k below a thousand ranks). A process with
    more than `stride` tracks (not seen in practice) continues above every process's range.
    """

    max_pid: int
    stride: int = 1000
    base: int = 0
    _next_k: dict[int, int] = field(default_factory=dict)
    _overflow: itertools.count = field(default_factory=lambda: itertools.count())
    _flow: itertools.count = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        if not self.base:
            self.base = max(self.stride, 10 ** len(str(self.max_pid + 1)))

    def new_tid(self, pid: int) -> int:
        k = self._next_k.get(pid, 0)
        self._next_k[pid] = k + 1
        if k < self.stride:
            return self.base + pid * self.stride + k
        return self.base + (self.max_pid + 1) * self.stride + next(self._overflow)

    def new_flow_id(self) -> int:
        return next(self._flow)


def qualify(name: str, note: str) -> str:
    """`name` with `note` in its closing parentheses: "rank 2" -> "rank 2 (vm, CPU)", and
    "idle gaps (uberprof)" -> "idle gaps (uberprof, lane 2)". Viewers append a pid or tid to
    process and track names (Perfetto: "rank 2 (vm, CPU) 2"); a name that ends in a
    parenthesis keeps that number apart from the name's own words ("CPU 2" read as a CPU
    number, "idle gaps 3000" as a count)."""
    if name.endswith(")") and " (" in name:
        return f"{name[:-1]}, {note})"
    return f"{name} ({note})"


def nest_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane per interval such that the intervals of each lane nest or follow each other, as
    complete events on one track must. Lane 0 takes all it can (every interval, for a well
    formed track); an interval that overlaps a neighbour partially moves to the next lane.

    Touching intervals (one ends where the next starts) are siblings; equal ones nest.
    """
    n = len(starts)
    lanes = np.zeros(n, dtype=np.int32)
    if n == 0:
        return lanes
    order = np.lexsort((-(ends - starts), starts))  # by start, longest first
    stacks: list[list[int]] = [[]]
    s_list = starts.tolist()
    e_list = ends.tolist()
    for i in order.tolist():
        s, e = s_list[i], e_list[i]
        for lane, st in enumerate(stacks):
            while st and st[-1] <= s:
                st.pop()
            if not st or e <= st[-1]:
                st.append(e)
                lanes[i] = lane
                break
        else:
            stacks.append([e])
            lanes[i] = len(stacks) - 1
    return lanes


def sort_processes(ranks: Sequence[int], host_of: dict[int, str | None],
                   nodes: Iterable[tuple[str, str | None]]) -> dict[tuple[str, object], int]:
    """sort_index for ranks (sorted by rank), with each node's counters right after the last
    rank of its host and the findings first: {("findings", None) | ("rank", r) |
    ("node", name): index}."""
    keys: list[tuple[tuple[int, int, str], tuple[str, object]]] = [((-1, 0, ""), ("findings", None))]
    last_of_host: dict[str, int] = {}
    for r in ranks:
        keys.append(((r, 0, ""), ("rank", r)))
        h = host_of.get(r)
        if h:
            last_of_host[h] = max(last_of_host.get(h, r), r)
    top = max(ranks) + 1 if ranks else 0
    for name, host in nodes:
        after = last_of_host.get(host or "", top)
        keys.append(((after, 1, name), ("node", name)))
    keys.sort(key=lambda k: k[0])
    return {k: i for i, (_, k) in enumerate(keys)}
