"""What each trace event is: the event kinds every analysis is written against.

Classification works on distinct (category, name) pairs, not on events, so its cost does not grow
with the trace. Names follow Kineto's conventions for CUDA (CUPTI), ROCm (roctracer) and the CPU
profiler, old (2021: `Kernel`, `Runtime`, `Operator`) and new (`kernel`, `cuda_runtime`, `cpu_op`).
"""

from __future__ import annotations

import functools
import re

# Device kinds: activity on an accelerator stream.
KERNEL = "kernel"  # compute kernel
COMM_KERNEL = "comm_kernel"  # NCCL / RCCL / HCCL collective or point-to-point kernel
MEMCPY = "memcpy"
MEMSET = "memset"
DEVICE_SYNC = "device_sync"  # CUPTI synchronisation records drawn on a stream: not work
DEVICE_ANNOTATION = "device_annotation"  # gpu_user_annotation: a span over other activity
DEVICE_OTHER = "device_other"  # an accelerator category uberprof does not know

# Host kinds.
OPERATOR = "operator"  # aten / autograd operators
RUNTIME = "runtime"  # CUDA/HIP runtime and driver calls (launches, allocations, ...)
SYNC = "sync"  # host blocked on the device: *Synchronize calls
STEP = "step"  # ProfilerStep#N
DATALOADER = "dataloader"  # enumerate(DataLoader)#...__next__: a data-loader fetch
OPTIMIZER = "optimizer"  # Optimizer.step#<Class>.step
HOST_COMM = "host_comm"  # gloo:* on the Gloo worker threads: the collective itself
COMM_OP = "comm_op"  # c10d::*, record_param_comms, nccl:*, functional collectives (launch, wait)
ANNOTATION = "annotation"  # other user annotations (record_function)
PYTHON = "python"  # python_function (with_stack)
MODULE = "module"  # module::<path>: an nn.Module's forward (`uberprof run --modules`)
OTHER = "other"

DEVICE_KINDS = frozenset({KERNEL, COMM_KERNEL, MEMCPY, MEMSET, DEVICE_SYNC, DEVICE_ANNOTATION,
                          DEVICE_OTHER})
ALL_KINDS = (KERNEL, COMM_KERNEL, MEMCPY, MEMSET, DEVICE_SYNC, DEVICE_ANNOTATION, DEVICE_OTHER,
             OPERATOR, RUNTIME, SYNC, STEP, DATALOADER, OPTIMIZER, HOST_COMM, COMM_OP,
             ANNOTATION, PYTHON, OTHER, MODULE)

_KERNEL_CATS = frozenset({"kernel", "Kernel", "gpu_kernel", "mtia_kernel"})
_MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy", "mtia_memcpy"})
_MEMSET_CATS = frozenset({"gpu_memset", "Memset", "mtia_memset"})
_DEVICE_SYNC_CATS = frozenset({"cuda_sync"})
_DEVICE_ANNOTATION_CATS = frozenset({"gpu_user_annotation", "cuda_profiler_range"})
_OPERATOR_CATS = frozenset({"cpu_op", "Operator", "operator"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "runtime", "mtia_runtime",
                           "privateuse1_runtime", "privateuse1_driver", "xpu_runtime"})
_ANNOTATION_CATS = frozenset({"user_annotation", "gpu_user_annotation"})
_PYTHON_CATS = frozenset({"python_function", "python"})
# Host categories that are neither work nor time spans of interest.
_HOST_OTHER_CATS = frozenset({"overhead", "Trace", "ac2g", "fwdbwd", "async", "flow_link",
                              "cpu_instant_event", "Record Window", "Iteration"})

_DEVICE_CATS = (_KERNEL_CATS | _MEMCPY_CATS | _MEMSET_CATS | _DEVICE_SYNC_CATS
                | frozenset({"gpu_user_annotation"}))

# NCCL (ncclKernel_*, ncclDevKernel_*), RCCL (ROCm ships NCCL's kernel names and rccl_*),
# HCCL (Habana) and the oneCCL family.
_COMM_KERNEL = re.compile(r"nccl|rccl|hccl|ccl_kernel|oneccl", re.IGNORECASE)
_STEP = re.compile(r"^ProfilerStep\s*#\s*(-?\d+)")
# Host spans that launch or wait for communication. The functional collectives of DTensor and
# tensor parallelism (`_c10d_functional::all_reduce`, then `_c10d_functional::wait_tensor`,
# where the rank blocks) are communication, never the model's compute.
_COMM_OP_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "_c10d_functional::",
                     "_c10d_functional_autograd::", "c10d_functional::")
_SYNC_NAMES = re.compile(r"Synchronize$|^cudaStreamQuery$|^cuStreamSynchronize|^cuCtxSynchronize")


def step_number(name: str) -> int | None:
    """The N of a `ProfilerStep#N` annotation, or None."""
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=8192)  # ranks of one job share their names: classify each once
def classify(cat: str, name: str, on_device: bool) -> str:
    """The kind of one (category, name) pair; `on_device` says the event carries a stream."""
    if cat in _KERNEL_CATS:
        return COMM_KERNEL if _COMM_KERNEL.search(name) else KERNEL
    if cat in _MEMCPY_CATS:
        return MEMCPY
    if cat in _MEMSET_CATS:
        return MEMSET
    if cat in _DEVICE_SYNC_CATS:
        return DEVICE_SYNC if on_device else SYNC
    if cat == "gpu_user_annotation" or (cat in _DEVICE_ANNOTATION_CATS and on_device):
        return DEVICE_ANNOTATION
    if cat in _ANNOTATION_CATS:
        return _named_kind(name, ANNOTATION)
    if cat in _OPERATOR_CATS:
        # 2021 traces file enumerate(DataLoader) as operators; --modules' spans are C++
        # record functions (cpu_op)
        return _named_kind(name, OPERATOR)
    if cat in _RUNTIME_CATS:
        return SYNC if _SYNC_NAMES.search(name) else RUNTIME
    if cat in _PYTHON_CATS:
        return PYTHON
    if cat in _HOST_OTHER_CATS or not on_device:
        return OTHER
    # An event on a device stream in a category this table does not know.
    return DEVICE_OTHER


# Host spans whose name says what they are, as operators or annotations (prefixes disjoint)
_NAMED_KINDS = (("ProfilerStep#", STEP), ("enumerate(DataLoader)", DATALOADER),
                ("Optimizer.step#", OPTIMIZER), ("gloo:", HOST_COMM),
                *((p, COMM_OP) for p in _COMM_OP_PREFIXES), ("module::", MODULE))


def _named_kind(name: str, default: str) -> str:
    """The kind `_NAMED_KINDS` gives `name`, else `default`."""
    for prefix, kind in _NAMED_KINDS:
        if name.startswith(prefix):
            return kind
    return default


_COLL_SUFFIX = re.compile(r"(base|intotensor|coalesced|tensor)$")


def canonical_collective(name: str) -> str:
    """One spelling per collective across sources: NCCL metadata says `allreduce`, the
    `nccl:`/`gloo:` spans say `all_reduce`, older ones `_all_gather_base`."""
    n = name.lower().replace("_", "").replace(" ", "")
    return _COLL_SUFFIX.sub("", n) or n


def is_device_category(cat: str) -> bool:
    """Whether events of `cat` run on an accelerator stream (whatever their args say)."""
    return cat in _DEVICE_CATS


def is_known_category(cat: str) -> bool:
    """Whether `cat` is one uberprof classifies on purpose (others on a stream are reported)."""
    return cat in (_KERNEL_CATS | _MEMCPY_CATS | _MEMSET_CATS | _DEVICE_SYNC_CATS
                   | _DEVICE_ANNOTATION_CATS | _OPERATOR_CATS | _RUNTIME_CATS | _ANNOTATION_CATS
                   | _PYTHON_CATS | _HOST_OTHER_CATS)


# Bytes per element of the dtype names Kineto writes (`Input type`, NCCL `dtype`).
DTYPE_BYTES: dict[str, int] = {}
for _names, _size in (
    (("float", "Float", "float32", "c10::Float"), 4),
    (("double", "Double", "float64"), 8),
    (("c10::Half", "Half", "half", "float16"), 2),
    (("c10::BFloat16", "BFloat16", "bfloat16"), 2),
    (("long int", "long", "Long", "int64", "int64_t", "long long"), 8),
    (("int", "Int", "int32", "int32_t", "unsigned int", "UInt32"), 4),
    (("short", "Short", "int16", "unsigned short", "UInt16"), 2),
    (("signed char", "unsigned char", "Byte", "Char", "char", "int8", "uint8", "bool", "Bool",
      "c10::Float8_e4m3fn", "c10::Float8_e5m2", "Float8_e4m3fn", "Float8_e5m2",
      "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz"), 1),
    (("c10::complex<float>", "ComplexFloat"), 8),
    (("c10::complex<double>", "ComplexDouble"), 16),
    (("c10::complex<c10::Half>", "ComplexHalf"), 4),
    (("unsigned long", "UInt64", "uint64"), 8),
):
    for _n in _names:
        DTYPE_BYTES[_n] = _size
