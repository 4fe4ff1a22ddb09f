"""Collective metadata of a trace's events: what each batch keeps of the few events that may be
collectives, and the table's collective columns built from it once every batch is in.

NCCL events carry their collective in args (`Collective name`, element counts, dtype, process
group); Gloo's carry only input shapes, from which the bytes are worked out. Apart from the
per-event columns because it touches a handful of events per batch, by index, with rules of its
own.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa

from uberprof.ingest import classify as K

if TYPE_CHECKING:
    from uberprof.ingest.events import IngestArgs

__all__ = ["CommArgs", "collective_columns", "comm_args_of"]

CommArgs = tuple  # (name, coll_name, dtype, in_nelems, out_nelems, group_size, pg_name,
#                    pg_ranks, seq, input_dims bytes, input_type bytes, concrete_inputs bytes)

# c10d's point-to-point launches: their third input is the peer, a rank of the group.
_P2P_LAUNCHES = frozenset({"c10d::send", "c10d::recv_", "c10d::recv_any_source_"})

_COLL_NAME = operator.attrgetter("coll_name")
_ANY_DECODER = msgspec.json.Decoder()


def comm_args_of(names: list[Any], candidates: np.ndarray,
                 args: list[IngestArgs]) -> dict[int, CommArgs]:
    """The few fields collective metadata needs, for the events that may be collectives (a
    `gloo:*`/`nccl:*` name, or a collective name in args), as plain values (not raw slices of
    the JSON text, which would keep all of it alive)."""
    coll = np.fromiter(map(_COLL_NAME, args), object, len(args))
    out: dict[int, CommArgs] = {}
    for i in np.flatnonzero(candidates | np.not_equal(coll, None)).tolist():
        a = args[i]
        out[i] = (names[i], a.coll_name, a.dtype, a.in_nelems, a.out_nelems, a.group_size,
                  a.pg_name, a.pg_ranks, a.seq, bytes(a.input_dims), bytes(a.input_type),
                  bytes(a.concrete_inputs) if names[i] in _P2P_LAUNCHES else b"")
    return out


def collective_columns(n: int, comm_args: dict[int, CommArgs],
                       kind_codes: np.ndarray) -> list[pa.Array]:
    """Collective metadata columns: from NCCL's args where present, else from input shapes.
    A `c10d::` launch is named by what the program called (`_reduce_scatter_base_`, which Gloo
    runs as an all-reduce), and a send/recv launch also by its peer."""
    coll_name: list[str | None] = [None] * n
    dtype: list[str | None] = [None] * n
    in_bytes: list[int | None] = [None] * n
    out_bytes: list[int | None] = [None] * n
    group: list[int | None] = [None] * n
    pg_name: list[str | None] = [None] * n
    pg_ranks: list[str | None] = [None] * n
    seq: list[int | None] = [None] * n
    peer: list[int | None] = [None] * n
    code_of = {k: i for i, k in enumerate(K.ALL_KINDS)}
    comm_codes = {code_of[K.COMM_KERNEL], code_of[K.HOST_COMM], code_of[K.COMM_OP]}
    for i, (nm, cname, dt, in_n, out_n, gsize, pgn, pgr, sq, dims, types,
            concrete) in comm_args.items():
        if int(kind_codes[i]) not in comm_codes:
            continue
        if cname is not None:
            coll_name[i] = str(cname)
            dt = str(dt) if dt is not None else None
            dtype[i] = dt
            size = K.DTYPE_BYTES.get(dt or "", None)
            if isinstance(in_n, int) and size:
                in_bytes[i] = in_n * size
            if isinstance(out_n, int) and size:
                out_bytes[i] = out_n * size
            if isinstance(gsize, int):
                group[i] = gsize
            if pgn is not None:
                pg_name[i] = str(pgn)
            if pgr is not None:
                pg_ranks[i] = pgr if isinstance(pgr, str) else str(pgr)
            if isinstance(sq, int):
                seq[i] = sq
            elif isinstance(sq, str) and sq.isdigit():
                seq[i] = int(sq)
        elif nm.startswith("c10d::"):
            coll_name[i] = nm[6:].strip("_")
            peer[i] = _peer(concrete) if concrete else None
        else:
            coll_name[i] = nm.split(":", 1)[1]
            in_bytes[i], dtype[i] = _bytes_from_shapes(dims, types)
    return [
        pa.array(coll_name, pa.string()).dictionary_encode(),
        pa.array(dtype, pa.string()).dictionary_encode(),
        pa.array(in_bytes, pa.int64()),
        pa.array(out_bytes, pa.int64()),
        pa.array(group, pa.int32()),
        pa.array(pg_name, pa.string()).dictionary_encode(),
        pa.array(pg_ranks, pa.string()).dictionary_encode(),
        pa.array(seq, pa.int64()),
        pa.array(peer, pa.int32()),
    ]


def _peer(concrete_raw: bytes) -> int | None:
    """The peer of `c10d::send(tensors, group, dst, tag)` / `c10d::recv_(..., src, tag)`: the
    third of the Concrete Inputs, a rank within the group (e.g. `["", "", "1", "0"]`)."""
    try:
        values = _ANY_DECODER.decode(concrete_raw)
    except msgspec.DecodeError:
        return None
    if isinstance(values, list) and len(values) > 2 and isinstance(values[2], str):
        text = values[2].strip()
        if text.lstrip("-").isdigit() and int(text) >= 0:
            return int(text)
    return None


def _bytes_from_shapes(dims_raw: bytes, types_raw: bytes) -> tuple[int | None, str | None]:
    """Bytes of a collective's tensors from `Input Dims` x `Input type` (Gloo has nothing else)."""
    if not len(dims_raw) or not len(types_raw):
        return None, None
    try:
        dims = _ANY_DECODER.decode(dims_raw)
        types = _ANY_DECODER.decode(types_raw)
    except msgspec.DecodeError:
        return None, None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, None
    total = 0
    found = False
    dtype = None
    for shape, t in zip(dims, types):
        size = K.DTYPE_BYTES.get(t) if isinstance(t, str) else None
        if size is None or not isinstance(shape, list):
            continue
        if all(isinstance(d, int) for d in shape):
            n = 1
            for d in shape:
                n *= d
            total += n * size
            found = True
            dtype = dtype or t
    return (total, dtype) if found else (None, None)
