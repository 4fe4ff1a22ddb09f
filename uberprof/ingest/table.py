"""A trace's accumulated columns -> the event table `ingest_trace` returns (`EVENT_SCHEMA`).

Runs once per trace, after every batch is in (columns.py): whole-column numpy work, each
distinct (category, name) classified once rather than each event, then the Arrow arrays,
dictionary-encoded, in time order. Apart from the per-batch reduction because its cost grows
with the distinct names, not the events, and it is where the table's shape is decided.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from uberprof.ingest import classify as K
from uberprof.ingest.classify import is_device_category
from uberprof.ingest.collectives import collective_columns
from uberprof.ingest.columns import Columns

__all__ = ["EVENT_SCHEMA", "event_table"]

EVENT_SCHEMA = pa.schema([
    ("ts", pa.int64()),  # start, ns (epoch ns when the trace says how; see IngestedTrace.clock)
    ("dur", pa.int64()),  # ns
    ("kind", pa.dictionary(pa.int8(), pa.string())),  # see uberprof.ingest.classify
    ("name", pa.dictionary(pa.int32(), pa.string())),
    ("cat", pa.dictionary(pa.int32(), pa.string())),
    ("pid", pa.int64()),
    ("tid", pa.int64()),
    ("stream", pa.int64()),  # -1 on the host
    ("correlation", pa.int64()),  # links a launch (runtime call) to its device activity; -1
    ("external_id", pa.int64()),  # links operators to what they launched; -1
    ("coll_name", pa.dictionary(pa.int32(), pa.string())),  # collective metadata, null elsewhere
    ("dtype", pa.dictionary(pa.int32(), pa.string())),
    ("in_bytes", pa.int64()),
    ("out_bytes", pa.int64()),
    ("group_size", pa.int32()),
    ("pg_name", pa.dictionary(pa.int32(), pa.string())),
    ("pg_ranks", pa.dictionary(pa.int32(), pa.string())),
    ("seq", pa.int64()),
    ("peer", pa.int32()),  # send/recv launches (c10d::send, c10d::recv_): the peer's group rank
    # Host operators' input shapes (`Input Dims`, JSON text as the trace writes it: "[[64, 256],
    # [256]]"), recorded by record_shapes; null elsewhere. Operators group by name and shapes
    # on it (analysis/tables/operators.py).
    ("shapes", pa.dictionary(pa.int32(), pa.string())),
])


def event_table(path: Path, cols: Columns, ts_ns: np.ndarray, dur_ns: np.ndarray,
                keep: np.ndarray | None, problems: list[str]) -> tuple[pa.Table, str]:
    """The event table in time order, and the device type (cuda, rocm, ..., cpu) of the trace.

    `ts_ns`/`dur_ns`: every event's times; `keep`: those whose times passed the range check
    (None: all). Device activity in unknown categories is noted in `problems`.
    """
    cat_vals = [c if isinstance(c, str) else "" for c in cols.cats]
    name_vals = [n if isinstance(n, str) else str(n if n is not None else "") for n in cols.names]
    cat_idx = cols.array("cat", np.int32)
    name_idx = cols.array("name", np.int32)
    kind_codes, stream = _kinds_and_streams(path, cols, cat_vals, name_vals, cat_idx, name_idx,
                                            problems)
    table = _assemble(cols, ts_ns, dur_ns, kind_codes, cat_vals, name_vals, cat_idx, name_idx,
                      stream)
    return _in_time_order(table, ts_ns, keep), _device_type(name_vals, name_idx, kind_codes)


def _kinds_and_streams(path: Path, cols: Columns, cat_vals: list[str], name_vals: list[str],
                       cat_idx: np.ndarray, name_idx: np.ndarray,
                       problems: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each event's kind code and stream (-1 on the host): on a device is what classifies it."""
    has_stream = cols.array("has_stream", bool)
    stream = cols.array("stream", np.int64)
    device_cat = np.array([is_device_category(c) for c in cat_vals], dtype=bool)
    on_device = has_stream | device_cat[cat_idx]
    kind_codes, unknown = _kinds(cat_vals, name_vals, cat_idx, name_idx, on_device)
    if unknown:
        detail = ", ".join(f"'{c}' ({n})" for c, n in unknown.most_common())
        problems.append(f"{path}: device activity in categories uberprof does not know: "
                        f"{detail}; an unknown accelerator? Counted as compute")
    return kind_codes, np.where(on_device, stream, -1)


def _assemble(cols: Columns, ts_ns: np.ndarray, dur_ns: np.ndarray, kind_codes: np.ndarray,
              cat_vals: list[str], name_vals: list[str], cat_idx: np.ndarray,
              name_idx: np.ndarray, stream: np.ndarray) -> pa.Table:
    """The Arrow table of every event in `EVENT_SCHEMA`, strings dictionary-encoded."""
    coll = collective_columns(cols.n, cols.comm_args, kind_codes)
    return pa.Table.from_arrays(
        [
            pa.array(ts_ns, pa.int64()),
            pa.array(dur_ns, pa.int64()),
            pa.DictionaryArray.from_arrays(pa.array(kind_codes, pa.int8()),
                                           pa.array(K.ALL_KINDS, pa.string())),
            pa.DictionaryArray.from_arrays(pa.array(name_idx, pa.int32()),
                                           pa.array(name_vals, pa.string())),
            pa.DictionaryArray.from_arrays(pa.array(cat_idx, pa.int32()),
                                           pa.array(cat_vals, pa.string())),
            pa.array(cols.array("pid", np.int64), pa.int64()),
            pa.array(cols.array("tid", np.int64), pa.int64()),
            pa.array(stream, pa.int64()),
            pa.array(cols.array("correlation", np.int64), pa.int64()),
            pa.array(cols.array("external_id", np.int64), pa.int64()),
            *coll,
            _shapes(cols, kind_codes),
        ],
        schema=EVENT_SCHEMA,
    )


def _shapes(cols: Columns, kind_codes: np.ndarray) -> pa.DictionaryArray:
    """The `shapes` column: each operator's `Input Dims` text where the trace recorded them,
    null on every other event (device work, runtime calls, operators without shapes). The
    texts are decoded once per distinct value, not per event."""
    texts = list(cols.shape_texts)
    codes = cols.array("shapes", np.int32)
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    keep = kind_codes == K.ALL_KINDS.index(K.OPERATOR)
    if empty:
        keep &= ~np.isin(codes, empty)
    if not keep.any():
        return pa.DictionaryArray.from_arrays(pa.nulls(cols.n, pa.int32()),
                                              pa.array([], pa.string()))
    return pa.DictionaryArray.from_arrays(
        pa.array(codes, pa.int32(), mask=~keep),
        pa.array([t.decode("utf-8", "replace") for t in texts], pa.string()))


def _in_time_order(table: pa.Table, ts_ns: np.ndarray, keep: np.ndarray | None) -> pa.Table:
    """The table less the events `keep` leaves out, sorted by start: every consumer wants that,
    and Parquet compresses it better."""
    if keep is not None:
        table, ts_ns = table.filter(pa.array(keep)), ts_ns[keep]
    order = np.argsort(ts_ns, kind="stable")
    if not (order[1:] > order[:-1]).all():
        table = table.take(pa.array(order))
    return table


def _kinds(cat_vals: list[str], name_vals: list[str], cat_idx: np.ndarray, name_idx: np.ndarray,
           on_device: np.ndarray) -> tuple[np.ndarray, Counter[str]]:
    """Kind code per event, classifying each distinct (cat, name, on_device) once."""
    key = (cat_idx * (len(name_vals) + 1) + name_idx) * 2 + on_device.astype(np.int64)
    uniq, inverse = np.unique(key, return_inverse=True)
    code_of = {k: i for i, k in enumerate(K.ALL_KINDS)}
    ucodes = np.empty(uniq.size, dtype=np.int8)
    unknown_cats: set[str] = set()
    for j, k in enumerate(uniq.tolist()):
        dev = bool(k & 1)
        rest = k >> 1
        c, nm = divmod(rest, len(name_vals) + 1)
        kind = K.classify(cat_vals[c], name_vals[nm], dev)
        if kind == K.DEVICE_OTHER:
            unknown_cats.add(cat_vals[c])
            kind_code = code_of[K.DEVICE_OTHER]
        else:
            kind_code = code_of[kind]
        ucodes[j] = kind_code
    codes = ucodes[inverse.reshape(-1)]
    unknown: Counter[str] = Counter()
    if unknown_cats:
        other = code_of[K.DEVICE_OTHER]
        for c in unknown_cats:
            ci = cat_vals.index(c)
            unknown[c] = int(((codes == other) & (cat_idx == ci)).sum())
    return codes, unknown


def _device_type(name_vals: list[str], name_idx: np.ndarray, kind_codes: np.ndarray) -> str:
    """cuda, rocm, mtia or gpu (vendor unknown), told by the runtime calls of a trace with device
    activity; cpu for one without."""
    code_of = {k: i for i, k in enumerate(K.ALL_KINDS)}
    device_codes = np.array([code_of[k] for k in K.DEVICE_KINDS
                             if k not in (K.DEVICE_ANNOTATION, K.DEVICE_SYNC)])
    if not np.isin(kind_codes, device_codes).any():
        return "cpu"
    runtime = set(np.unique(name_idx[kind_codes == code_of[K.RUNTIME]]).tolist())
    names = [name_vals[i] for i in runtime]
    if any(n.startswith(("hip", "hsa")) for n in names):
        return "rocm"
    if any(n.startswith("cu") for n in names):
        return "cuda"
    if any(n.startswith("mtia") or "mtia" in n for n in names):
        return "mtia"
    return "gpu"
