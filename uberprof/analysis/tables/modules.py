"""Time per nn.Module of one trace: calls, total and self time per module path, what `uberprof
analyze` saves as `modules.parquet` (per input, then per rank in `derived/modules.parquet`) and
the report's `run.modules` reads (`diagnosis/top_modules.py`).

A module's spans come from the first source the trace has, in this order:

- `module::<path>` spans (kind `module`), which `uberprof run --modules` records: one per
  forward call, the path as the model names it (`encoder.layers.0.self_attn`);
- torch.profiler's own `nn.Module: <Class>_<n>` Python events (with `with_stack`/
  `with_modules`), named by class and instance number, not by path;
- the wrappers' own spans (`DistributedDataParallel.forward`, `FullyShardedDataParallel.forward`):
  the whole model's forward, nothing below it.

Spans nest on a thread as the modules do. **Self time** is a span's duration minus its direct
child modules' on the same thread (operators inside stay in it), so a module's total is its
self time plus its children's totals, and self times add up to the root's total. As for
operators (`tables/operators.py`), self times are worked out over the whole trace, then the
spans starting in the trace's steps are summed.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from uberprof.analysis.tables.metrics import kind_mask, name_mask
from uberprof.analysis.tables.operators import self_times, text_codes
from uberprof.analysis.tables.schemas import MODULE_SCHEMA
from uberprof.ingest import classify as K

__all__ = ["SOURCES", "module_table"]

SOURCES = ("hooks", "with_stack", "wrapper")  # MODULE_SCHEMA.source, in order of preference
_STACK = re.compile(r"^nn\.Module: ")
_WRAPPER = re.compile(r"^(DistributedDataParallel|FullyShardedDataParallel|DataParallel)"
                      r"\.forward$")
_STRIP = re.compile(r"^(module::|nn\.Module: )|\.forward$")


def module_table(events: pa.Table) -> pa.Table:
    """MODULE_SCHEMA rows of one trace's events (with their `step`): per module path, its
    calls, total and self time over the trace's steps (the whole trace without steps). Largest
    total first."""
    ev = _module_events(events)
    if ev is None:
        return MODULE_SCHEMA.empty_table()
    ev, source = ev
    ts = ev.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    dur = np.nan_to_num(ev.column("dur").to_numpy(zero_copy_only=False).astype(np.float64)
                        ).astype(np.int64)
    tid = ev.column("tid").to_numpy(zero_copy_only=False).astype(np.int64)
    self_ns = self_times(tid, ts, dur)
    keep = np.ones(ev.num_rows, dtype=bool)
    if "step" in ev.column_names:
        step = ev.column("step").to_numpy(zero_copy_only=False)
        if (step >= 0).any():
            keep = step >= 0
    # per distinct name, not per span: its path (prefix and `.forward` stripped), then the
    # spans summed by path on integer codes (pyarrow's group_by loaded its query engine,
    # acero, into every analysis process for this one table: 10-20 ms each)
    codes, names = text_codes(ev.column("name"))
    paths: dict[str | None, int] = {}
    path_of = np.array([paths.setdefault(_STRIP.sub("", nm), len(paths)) for nm in names]
                       + [paths.setdefault(None, len(paths)) if (codes < 0).any() else 0],
                       dtype=np.int64)
    group = path_of[codes[keep]]  # code -1 (no name): the last entry
    n = len(paths)
    calls = np.bincount(group, minlength=n)
    total, own = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    np.add.at(total, group, dur[keep])
    np.add.at(own, group, self_ns[keep])
    some = calls > 0
    out = pa.table({"module": pa.array(list(paths), pa.string()).filter(pa.array(some)),
                    "source": pa.array([source] * int(some.sum()), pa.string()),
                    "calls": pa.array(calls[some], pa.int64()),
                    "total_ns": pa.array(total[some], pa.int64()),
                    "self_ns": pa.array(own[some], pa.int64())}, schema=MODULE_SCHEMA)
    return out.sort_by([("total_ns", "descending"), ("module", "ascending")])


def _module_events(events: pa.Table) -> tuple[pa.Table, str] | None:
    """The module spans of the first source the trace has (module docstring), and its name."""
    if not events.num_rows:
        return None
    for source, mask in (
            ("hooks", lambda: kind_mask(events, (K.MODULE,))),
            ("with_stack", lambda: kind_mask(events, (K.PYTHON,)) & name_mask(events, _STACK)),
            ("wrapper", lambda: kind_mask(events, (K.ANNOTATION, K.OPERATOR))
             & name_mask(events, _WRAPPER))):
        m = mask()
        if m.any():
            return events.filter(pa.array(m)), source
    return None
