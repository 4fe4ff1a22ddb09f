"""torch.profiler's `[memory]` instant events (`profile_memory=True`) -> a trace's memory table.

Each allocation and free the profiler saw is an instant event (`ph` "i", category
`cpu_instant_event`, name `[memory]`) whose args give the change (`Bytes`: positive for an
allocation, negative for a free), the allocator's running totals on that device after it
(`Total Allocated`, `Total Reserved`), the device (`Device Type`: c10's DeviceType, 0 CPU,
1 CUDA; `Device Id`: -1 on the CPU) and the address. Nothing in them says what a block holds
(parameter, gradient, optimizer state, activation): PyTorch's own memory profiler infers that
from the in-process profile with stacks, and the exported trace does not carry it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["MEMORY_EVENT", "MEMORY_SCHEMA", "MemoryRows", "device_name"]

MEMORY_EVENT = "[memory]"

MEMORY_SCHEMA = pa.schema([  # one row per [memory] event of a trace, in time order
    ("ts", pa.int64()),  # ns, on the trace's clock (as the event table's ts)
    ("tid", pa.int64()),  # the thread that allocated or freed (as the event table's tid)
    ("device", pa.dictionary(pa.int8(), pa.string())),  # cpu, cuda:0, ...
    ("bytes", pa.int64()),  # the change: > 0 allocated, < 0 freed
    ("total_allocated", pa.int64()),  # the device's allocated bytes after it; null: unknown
    ("total_reserved", pa.int64()),  # the caching allocator's reserved bytes (0 on the CPU);
    # null where the event does not say (2021-era traces carry only `Bytes`: unknown, never 0)
])

_DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep",
                 6: "hip", 7: "fpga", 8: "maia", 9: "xla", 10: "vulkan", 11: "metal",
                 12: "xpu", 13: "mps", 14: "meta", 15: "hpu", 16: "ve", 17: "lazy", 18: "ipu",
                 19: "mtia", 20: "privateuse1"}


def device_name(device_type: Any, device_id: Any) -> str:
    """`cpu`, `cuda:0`, ...: the device of a [memory] event's args."""
    kind = _DEVICE_TYPES.get(device_type, str(device_type)) if isinstance(device_type, int) \
        else "cpu"
    return f"{kind}:{device_id}" if isinstance(device_id, int) and device_id >= 0 else kind


def _int(v: Any) -> int | None:
    """The integer an arg holds, or None where it holds none (absent, not a number)."""
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
        and np.isfinite(v) else None


class MemoryRows:
    """The [memory] events of a trace, gathered batch by batch while it is decoded."""

    def __init__(self) -> None:
        self.ts: list[Any] = []
        self.tid: list[Any] = []
        self.device: list[str] = []
        self.bytes: list[int] = []
        self.total: list[int | None] = []
        self.reserved: list[int | None] = []

    def add(self, events: list[Any]) -> None:
        """Keep the [memory] events among `events` (decoded IngestEvents)."""
        for e in events:
            a = e.args
            if a is None or not isinstance(e.ts, (int, float)):
                continue
            self.ts.append(float(e.ts))
            self.tid.append(e.tid)
            self.device.append(device_name(a.device_type, a.device_id))
            self.bytes.append(_int(a.mem_bytes) or 0)
            self.total.append(_int(a.total_allocated))
            self.reserved.append(_int(a.total_reserved))

    def __len__(self) -> int:
        return len(self.ts)

    def table(self, ts_ns: np.ndarray, tid: np.ndarray) -> pa.Table:
        """MEMORY_SCHEMA rows in time order, with the times (`ts_ns`) and thread ids (`tid`)
        converted as the event table's are."""
        order = np.argsort(ts_ns, kind="stable")
        devices = sorted(set(self.device))
        code = {d: i for i, d in enumerate(devices)}
        idx = np.fromiter((code[d] for d in self.device), np.int8, len(self.device))
        return pa.Table.from_arrays([
            pa.array(ts_ns[order], pa.int64()),
            pa.array(tid[order], pa.int64()),
            pa.DictionaryArray.from_arrays(pa.array(idx[order], pa.int8()),
                                           pa.array(devices, pa.string())),
            pa.array(np.asarray(self.bytes, np.int64)[order], pa.int64()),
            pa.array(self.total, pa.int64()).take(pa.array(order)),
            pa.array(self.reserved, pa.int64()).take(pa.array(order)),
        ], schema=MEMORY_SCHEMA)
