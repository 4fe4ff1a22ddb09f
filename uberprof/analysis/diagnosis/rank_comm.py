"""Each rank's exposed communication, split into waiting for late peers (by the peer that
arrived last, and by collective and process group) and transfer: the one definition the report
document's `ranks[].exposed_comm`, the findings that account for a rank's exposed time and every
view's per-rank communication table read.

Why per rank: the `exposed_comm` finding counts what every rank pays (per step the least exposed
rank's), since ranks run in parallel; a rank that pays far more than that is waiting for
someone, and the reader needs to know for whom and in which collective (issue 48).

The split, per rank and analysed step: its exposed communication E (the step table's
`exposed_comm_ns`) against its time inside matched collectives, W before the last participant
arrived (`lateness.wait_ns`) and T after (`transfer_ns`), plus its matched sends and receives
(before and after both sides posted). The exposed part of each is in the proportion q = E /
(W + T), at most 1, the same proportion `findings/exposed_comm.py` uses for what every rank
pays; each instance's exposed wait goes to the participant(s) that arrived last (a tie shares
it). What E holds beyond W + T (communication in no matched collective: unmatched calls, a
group whose other ranks are not traced) is `unmatched`. So per rank `wait + transfer +
unmatched = exposed`, to rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from uberprof.units import ns_to_ms as _ms

__all__ = ["P2P_NAME", "RankComm", "WaitKey", "rank_comm"]

P2P_NAME = "send/recv"  # the collective name of matched sends and receives' waiting
WaitKey = tuple[int | None, str, str]  # (the peer waited for or None, collective, group)
TOP = 5  # waits listed per rank in the document


@dataclass
class RankComm:
    """One rank's exposed communication over the analysed steps (ns), split (module
    docstring)."""

    rank: int
    exposed_ns: float = 0.0
    transfer_ns: float = 0.0
    unmatched_ns: float = 0.0
    waits: dict[WaitKey, float] = field(default_factory=dict)

    @property
    def wait_ns(self) -> float:
        return sum(self.waits.values())

    def wait_for(self, peers: set[int], names: set[str] | None = None) -> float:
        """Its exposed waiting for any of `peers`, in collectives named `names` (all: None)."""
        return sum(v for (p, n, _), v in self.waits.items()
                   if p in peers and (names is None or n in names))

    def by_peer(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for (p, _, _), v in self.waits.items():
            if p is not None:
                out[p] = out.get(p, 0.0) + v
        return out

    def by_collective(self) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for (_, n, g), v in self.waits.items():
            out[(n, g)] = out.get((n, g), 0.0) + v
        return out

    def as_dict(self) -> dict[str, Any]:
        """`ranks[].exposed_comm` of the report document (docs/json.md)."""
        top = sorted(self.waits.items(), key=lambda kv: -kv[1])[:TOP]
        return {
            "exposed_ms": _ms(self.exposed_ns), "wait_ms": _ms(self.wait_ns),
            "transfer_ms": _ms(self.transfer_ns), "unmatched_ms": _ms(self.unmatched_ns),
            "wait_by_peer": [{"rank": p, "ms": _ms(v)} for p, v in
                             sorted(self.by_peer().items(), key=lambda kv: -kv[1]) if v > 0],
            "wait_by_collective": [{"name": n, "group": g, "ms": _ms(v)} for (n, g), v in
                                   sorted(self.by_collective().items(), key=lambda kv: -kv[1])
                                   if v > 0],
            "top_waits": [{"peer": p, "name": n, "group": g, "ms": _ms(v)}
                          for (p, n, g), v in top if v > 0]}


def _exposed(traced: pa.Table) -> dict[tuple[int, int], float]:
    """(rank, step) -> its exposed communication (ns) over the analysed steps."""
    out: dict[tuple[int, int], float] = {}
    for r, s, x in zip(*(traced.column(c).to_pylist()
                         for c in ("rank", "step", "exposed_comm_ns"))):
        out[(r, s)] = out.get((r, s), 0.0) + float(x or 0)
    return out


def _in_collectives(lat: pa.Table, group_of: Mapping[int, str],
                    keys: set[tuple[int, int]]) -> dict[tuple[int, int], list[tuple[
                        WaitKey | None, float, float]]]:
    """(rank, step) -> [(what it waited for, wait ns, transfer ns)] per matched instance it took
    part in: the peer(s) last to arrive get the wait (a tie shares it); a rank whose steps are
    one pseudo-step -1 (no step annotations) gets every instance in it."""
    cols = [lat.column(c).to_pylist() for c in
            ("instance", "rank", "step", "name", "last", "wait_ns", "transfer_ns")]
    last_of: dict[int, list[int]] = {}
    for i, r, _, _, last, _, _ in zip(*cols):
        if last:
            last_of.setdefault(i, []).append(r)
    pseudo = {r for r, s in keys if s == -1}
    out: dict[tuple[int, int], list[tuple[WaitKey | None, float, float]]] = {}
    for i, r, s, name, _, w, t in zip(*cols):
        key = (r, -1) if r in pseudo else (r, s)
        if key not in keys:
            continue
        peers = [p for p in last_of.get(i, []) if p != r]
        w, t = max(float(w or 0), 0.0), max(float(t or 0), 0.0)
        grp = group_of.get(i, "default")
        rows = out.setdefault(key, [])
        if peers and w > 0:
            rows += [((p, name, grp), w / len(peers), 0.0) for p in peers]
            rows.append((None, 0.0, t))
        else:
            rows.append((None, 0.0, t + w))  # no later peer: its time is its own transfer
    return out


def rank_comm(traced: pa.Table, lat: pa.Table, group_of: Mapping[int, str] | None = None,
              p2p_split: Mapping[tuple[int, int], tuple[int, int]] | None = None
              ) -> dict[int, RankComm]:
    """Each rank's exposed communication over the analysed steps, split (module docstring).
    `group_of`: matched instance id -> its process group; `p2p_split`: (rank, step) ->
    (waiting, transfer) ns of its matched sends and receives (`P2P.per_rank_step`)."""
    exposed = _exposed(traced)
    parts = _in_collectives(lat, group_of or {}, set(exposed))
    for key, (w, t) in (p2p_split or {}).items():
        if key in exposed:
            parts.setdefault(key, []).append(((None, P2P_NAME, "p2p"), float(w), float(t)))
    out: dict[int, RankComm] = {}
    for (r, s), e in sorted(exposed.items()):
        rc = out.setdefault(r, RankComm(rank=r))
        rc.exposed_ns += e
        rows = parts.get((r, s), [])
        inside = sum(w + t for _, w, t in rows)
        q = min(1.0, e / inside) if inside > 0 else 0.0
        for what, w, t in rows:
            rc.transfer_ns += t * q
            if what is not None and w > 0:
                rc.waits[what] = rc.waits.get(what, 0.0) + w * q
        rc.unmatched_ns += max(e - inside * q, 0.0)
    return out
