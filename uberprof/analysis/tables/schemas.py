"""The derived tables' schemas: the columns of each table `uberprof analyze` writes (one
trace's steps, collectives, activity and operators; a rank folder's step timeline; the run's
steps, collectives, operators and ranks), with what each column means.

Where a table lives, when it is fresh and how it is written and read is derived.py's, the one
owner of the derived folder; this module only says what the tables hold, so that what builds a
table (rank.py, reduce.py) and what reads one (the diagnosis) can share its columns without
depending on the folder.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "ACTIVITY_SCHEMA",
    "BREAKDOWN_FIELDS",
    "COLLECTIVE_SCHEMA",
    "MEMORY_TIMELINE_SCHEMA",
    "MODULE_SCHEMA",
    "OPERATOR_SCHEMA",
    "RANK_SCHEMA",
    "RUN_COLLECTIVE_SCHEMA",
    "RUN_MEMORY_TIMELINE_SCHEMA",
    "RUN_MODULE_SCHEMA",
    "RUN_OPERATOR_SCHEMA",
    "RUN_STEP_SCHEMA",
    "STEP_SCHEMA",
    "TIMELINE_SCHEMA",
]

BREAKDOWN_FIELDS = ("window_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns",
                    "memory_ns", "idle_ns")

STEP_SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("host_start_ns", pa.int64()),  # the ProfilerStep#N span on the host
    ("host_end_ns", pa.int64()),
    ("device_start_ns", pa.int64()),  # the step's device window (docs/DESIGN.md)
    ("device_end_ns", pa.int64()),
    *[(f, pa.int64()) for f in BREAKDOWN_FIELDS],
    ("data_wait_ns", pa.int64()),  # host inside data-loader fetches during the host window
    ("optimizer_ns", pa.int64()),  # host inside Optimizer.step during the host window
    ("comm_bytes", pa.int64()),  # bytes of the collectives launched in the step
    ("collectives", pa.int64()),
    ("device_incomplete", pa.bool_()),  # launches whose device work the trace lacks (cut off)
])

COLLECTIVE_SCHEMA = pa.schema([
    ("name", pa.string()),  # canonical: allreduce, allgather, reducescatter, alltoall, ...
    ("event", pa.string()),  # the kernel or span it comes from
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
    # when it was issued: a kernel's launching host call; a Gloo span's own start, but for a
    # send/recv its c10d call's (the post: launches.py)
    ("launch_ns", pa.int64()),
    ("step", pa.int64()),
    ("in_bytes", pa.int64()),
    ("out_bytes", pa.int64()),
    ("dtype", pa.string()),
    ("group_size", pa.int32()),
    ("pg_name", pa.string()),
    ("pg_ranks", pa.string()),
    ("seq", pa.int64()),
    ("stream", pa.int64()),
    ("tid", pa.int64()),
    ("peer", pa.int64()),  # send/recv: the peer as the program named it (a rank of its group)
])

OPERATOR_SCHEMA = pa.schema([  # one trace's operators and device activity over its steps
    ("kind", pa.string()),  # operator, kernel, comm_kernel, memcpy, memset (ingest/classify.py)
    ("name", pa.string()),  # the event's name
    ("shapes", pa.string()),  # operators' input shapes (Input Dims) where recorded, else null
    ("calls", pa.int64()),
    ("self_ns", pa.int64()),  # operators: minus direct children on the thread; device: = incl
    ("incl_ns", pa.int64()),  # the events' durations, summed (key_averages' total time)
])

MODULE_SCHEMA = pa.schema([  # one trace's nn.Modules over its steps (tables/modules.py)
    ("module", pa.string()),  # path in the model (encoder.layers.0.self_attn), or as the source
    ("source", pa.string()),  # hooks (--modules), with_stack (nn.Module: ...), wrapper
    ("calls", pa.int64()),
    ("total_ns", pa.int64()),  # the spans' durations, summed
    ("self_ns", pa.int64()),  # minus direct child modules on the same thread
])

MEMORY_TIMELINE_SCHEMA = pa.schema([  # one trace's [memory] events (tables/memory_timeline.py)
    ("ts", pa.int64()),  # ns, the trace's clock (as its steps' host_start_ns)
    ("device", pa.string()),  # cpu, cuda:0, ...
    ("bytes", pa.int64()),  # > 0 allocated, < 0 freed
    ("total_allocated", pa.int64()),  # the device's allocated bytes after the event
    ("total_reserved", pa.int64()),  # the caching allocator's reserved bytes (0 on the CPU)
    ("step", pa.int64()),  # the step it falls in, -1 outside every step
    ("operator", pa.string()),  # the innermost operator open on its thread, null if none
])

TIMELINE_SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("host_start_ns", pa.int64()),
    ("host_end_ns", pa.int64()),
    ("data_wait_ns", pa.int64()),
    ("cpu_ns", pa.int64()),  # the training thread's CPU time (busy time: diagnosis/busy.py)
    ("ctx_vol", pa.int64()),  # its voluntary context switches (own waits: sleep, I/O, locks)
    ("ctx_invol", pa.int64()),  # its involuntary ones (preempted by other load)
    ("run_wait_ns", pa.int64()),  # its time runnable but waiting for a core (the OS's delay)
    ("gpu_time_ns", pa.int64()),  # device time between step boundaries (device runs)
    ("gpu_mem_peak_bytes", pa.int64()),  # caching allocator's all-time peak allocated so far
    ("gpu_mem_bytes", pa.int64()),  # allocated now: both read at the step's gpu row
])

RUN_STEP_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    *STEP_SCHEMA,
    ("traced", pa.bool_()),  # False: the step is known from the step timeline only
    ("step_time_ns", pa.int64()),  # host window length
    ("trace", pa.string()),  # the input it comes from (relative path)
])

RUN_COLLECTIVE_SCHEMA = pa.schema([("rank", pa.int64()), *COLLECTIVE_SCHEMA,
                                   ("trace", pa.string())])

RUN_OPERATOR_SCHEMA = pa.schema([("rank", pa.int64()), *OPERATOR_SCHEMA,
                                 ("trace", pa.string())])

RUN_MODULE_SCHEMA = pa.schema([("rank", pa.int64()), *MODULE_SCHEMA, ("trace", pa.string())])

RUN_MEMORY_TIMELINE_SCHEMA = pa.schema([("rank", pa.int64()), *MEMORY_TIMELINE_SCHEMA,
                                        ("trace", pa.string())])

ACTIVITY_SCHEMA = pa.schema([  # merged intervals of one trace's activity, its own clock
    ("role", pa.dictionary(pa.int8(), pa.string())),  # compute | comm | memory
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
])

RANK_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    ("mode", pa.string()),  # device or cpu
    ("device_type", pa.string()),
    ("host", pa.string()),
    ("traces", pa.int64()),
    ("steps", pa.int64()),
    *[(f, pa.int64()) for f in BREAKDOWN_FIELDS],
    ("idle_pct", pa.float64()),
    ("compute_pct", pa.float64()),
    ("non_compute_pct", pa.float64()),
    ("overlap_pct", pa.float64()),
    ("exposed_comm_pct", pa.float64()),
    ("memory_pct", pa.float64()),
    ("step_time_median_ms", pa.float64()),
    ("step_time_p90_ms", pa.float64()),
])
