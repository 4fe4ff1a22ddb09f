"""The vocabulary of causes: for every idle-gap cause, straggler cause and finding kind, its
label, the one sentence that explains it and the remedy, written once.

The advisor puts the remedies in its findings; the terminal and HTML reports, the dashboard's
pages and the trace export show the labels and sentences. A new cause is added here and every
view names it the same way. Remedies fit the run: a cause with a `cpu_remedy` gives it to runs
without an accelerator (`remedy_for`), so a CPU run is never told to pin memory or fuse its
optimizer on the device; communication remedies fit its parallelism (`exposed_comm_remedy`,
`link_remedy`), so an FSDP2 job is never told FSDP1's arguments nor a pipeline DDP's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMM_REMEDIES",
    "COMM_REMEDY_UNKNOWN",
    "CRASH_REMEDY",
    "FROZEN_REMEDY",
    "GAP_CAUSES",
    "HANG_REMEDY",
    "HOST_CPU",
    "LINK_VERDICTS",
    "MISMATCH_REMEDY",
    "PIPELINE_IMBALANCE",
    "PIPELINE_IMBALANCE_REMEDY",
    "REMEDIES",
    "STRAGGLER_CAUSES",
    "THROTTLE_REMEDY",
    "TP_EXPOSED_COMM",
    "WARMUP",
    "WARMUP_EVIDENCE",
    "Cause",
    "Remedy",
    "alltoall_imbalance_remedy",
    "exposed_comm_remedy",
    "gap_cause",
    "gap_remedy",
    "link_remedy",
    "remedies_table",
    "remedy_for",
    "straggler_cause_text",
    "straggler_remedy",
]


@dataclass(frozen=True)
class Cause:
    """One cause in the user's words."""

    key: str
    label: str  # a few words: legends, trace tracks ("idle: <label>")
    phrase: str  # the part of a finding's title that names it
    explanation: str  # one sentence: what was happening
    remedy: str  # what to do about it ("{r}" is the rank, for straggler causes)
    kind: str = ""  # the finding kind it becomes (gap causes)
    letter: str = ""  # one letter, for narrow terminal tables (gap causes)
    cpu_remedy: str = ""  # the remedy for runs without an accelerator, when it differs


# Why the device sat idle (gaps.py assigns them, first that applies, in this order).
GAP_CAUSES: dict[str, Cause] = {c.key: c for c in (
    Cause("data", "data loader", "waiting for the data loader",
          "the host was fetching the next batch (data loader)",
          "The device idles while the data loader fetches the next batch. Raise DataLoader "
          "num_workers, use pin_memory=True and persistent_workers=True, raise "
          "prefetch_factor, or move decoding and augmentation off the training process.",
          kind="data_stall", letter="D",
          cpu_remedy="The training process waits while the data loader fetches the next batch. "
          "Raise DataLoader num_workers (within the cores left free by the training "
          "processes), persistent_workers=True and prefetch_factor, or move decoding and "
          "augmentation off the training process."),
    Cause("sync", "host synchronisation", "host synchronisations",
          "the host was blocked in a synchronisation",
          "The host blocks on the device mid-step (cudaStreamSynchronize, .item(), .cpu(), "
          "printing a tensor), then the device waits for new work. Remove or defer these "
          "synchronisations (log every N steps, non_blocking copies).",
          kind="idle", letter="S"),
    Cause("launch", "launch-bound", "launch-bound (host too slow to launch work)",
          "the host launched the next work late, busy with other operators (launch-bound)",
          "The device waits for the host to launch kernels (eager-mode launch overhead). "
          "Use torch.compile (mode='reduce-overhead' adds CUDA graphs), capture the step "
          "with CUDA graphs, fuse small operators, or give each kernel more work (larger "
          "batch per rank).",
          kind="launch_bound", letter="L"),
    Cause("host", "host work", "host work",
          "the host was doing other work (optimizer on the CPU, Python, logging)",
          "The device idles while the host does other work (an optimizer step on the CPU, "
          "Python between operators, logging). Use a fused or foreach optimizer on the "
          "device, move host work off the step, or overlap it.",
          kind="idle", letter="H",
          cpu_remedy="The training threads sit idle outside operators and collectives "
          "(Python between operators, logging, the host waiting for CPU time). Move work off "
          "the step, and check that the ranks are not sharing too few cores (see the host "
          "CPU finding, torch.set_num_threads)."),
    Cause("other", "waiting on another stream", "waiting on other streams",
          "work was queued but waited on another stream or device",
          "The device idles although its next work was already queued: it waits on "
          "another stream or device. Inspect these gaps in the trace.",
          kind="idle", letter="O"),
    # tested first (gaps.py), listed last: it is not a steady-state cause and makes no finding
    Cause("warmup", "warm-up", "warm-up (one-time initialisation)",
          "the host was in one-time initialisation: runtime calls of 50 ms or more (CUDA "
          "context and streams, lazy kernel loading, memory pool growth, cuDNN autotuning)",
          "Warm-up, not a steady-state cost: trace steps after the first iterations "
          "(torch.profiler's schedule with wait and warmup steps, `uberprof run "
          "--trace-steps`).",
          kind="", letter="W"),
)}
WARMUP = "warmup"  # the gap cause that is warm-up: named, and left out of the verdicts

# What made a step warm-up (diagnosis/warmup.py), in the order the report names them.
WARMUP_EVIDENCE: dict[str, str] = {
    "compile": "compilation (torch.compile: Dynamo, Inductor, Triton autotuning)",
    "cudnn": "cuDNN autotuning (cudnnFind)",
    "kernel_load": "lazy kernel loading (cuModuleLoad)",
    "init": "CUDA initialisation (runtime calls of 50 ms or more)",
}

# Why the straggler arrives last (analysis/diagnosis/stragglers/cause.py).
STRAGGLER_CAUSES: dict[str, Cause] = {c.key: c for c in (
    Cause("compute", "compute", "compute",
          "it computes longer than the others on the same work",
          "Rank {r} computes longer than the others on the same steps. Check what differs "
          "on it: another process on its GPU or CPU cores, its CPU/NUMA affinity, a slower "
          "or different device, uneven inputs (batch or sequence lengths: balance or pack "
          "them).",
          cpu_remedy="Rank {r} computes longer than the others on the same steps. Check what "
          "differs on it: other processes on its cores, its CPU affinity and thread count "
          "(torch.set_num_threads, OMP_NUM_THREADS), a slower or busier host, uneven inputs "
          "(batch or sequence lengths: balance or pack them)."),
    Cause("off_cpu", "off-CPU waits", "off_cpu",
          "its training thread waits off the CPU (sleep, blocking I/O, a lock) longer than "
          "the others', though the OS did not preempt it: its own behaviour",
          "Rank {r}'s training thread spends its extra time off the CPU by its own doing: a "
          "sleep, blocking I/O (logging, checkpoint writes, reading files on the step), or a "
          "lock held by another thread. Find the call: py-spy dump --pid <its pid> during a "
          "step, or the hang stacks; move I/O off the step (a background thread, async "
          "checkpointing, prefetching) and drop sleeps and polling on the training thread."),
    Cause("preempted", "preempted by other load", "preempted",
          "the OS kept its training thread from a core longer than the others' (other load "
          "on its host), more than it computed extra",
          "Rank {r}'s training thread waits for a core longer than the others' do: other "
          "load on its host takes its cores. Find what else runs there (top -H, ps -eLo "
          "psr,pcpu,comm: other jobs, data-loader workers, the ranks' own intra-op threads), "
          "give each rank cores of its own (taskset or numactl; OMP_NUM_THREADS and "
          "torch.set_num_threads at most the cores per rank) and keep other work off the "
          "node during training."),
    Cause("clock_throttle", "GPU clock throttle", "clock_throttle",
          "its GPU runs at lower clocks (throttled)",
          "Rank {r}'s GPU runs at lower clocks (throttle reasons set). Check its "
          "cooling and power cap (nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE); "
          "drain or replace the node if it persists."),
    Cause("data", "data loader", "data",
          "it waits longer for its data loader",
          "Rank {r} waits for its data loader. Raise DataLoader num_workers, use "
          "pin_memory=True, persistent_workers=True and prefetch_factor; check the storage "
          "or network read path of its node.",
          cpu_remedy="Rank {r} waits for its data loader. Raise DataLoader num_workers, "
          "persistent_workers=True and prefetch_factor; check the storage or network read "
          "path of its node."),
    Cause("host_launch", "host / launch", "host_launch",
          "its host issues work late",
          "Rank {r}'s host issues work late (host-side work or launch overhead only "
          "it has, such as logging, checkpointing or evaluation). Move that work off "
          "the step; torch.compile or CUDA graphs cut launch overhead.",
          cpu_remedy="Rank {r}'s training thread is idle outside operators more than the "
          "others' (host-side work only it has, such as logging, checkpointing or "
          "evaluation, or less CPU time on a busy host). Move that work off the step."),
    Cause("network", "network", "network",
          "it spends longer inside the collectives (its network)",
          "Rank {r} spends longer inside collectives. Check its NIC or InfiniBand port "
          "(errors, link speed, congestion) and that NCCL_SOCKET_IFNAME / "
          "GLOO_SOCKET_IFNAME select the fast interface."),
)}

# A collective class limited by its link (bandwidth.py verdicts that become findings).
LINK_VERDICTS: dict[str, Cause] = {c.key: c for c in (
    Cause("bandwidth-bound", "bandwidth-bound", "bandwidth-bound",
          "the collective moves its bytes near the link's peak: the link is the limit",
          "The link is the limit: send fewer bytes (bf16 or fp16 gradient "
          "compression through a DDP comm hook, PowerSGD; larger local batches for "
          "fewer steps), hide the transfer under compute (bucket_cap_mb, FSDP "
          "prefetch), or use a faster interconnect (more or faster NICs, "
          "InfiniBand/RoCE, NVLink).", kind="bandwidth"),
    Cause("latency-bound", "latency-bound", "latency-bound",
          "small messages far below the link's peak: each pays the latency",
          "Small messages pay latency, not bandwidth: coalesce them (raise DDP "
          "bucket_cap_mb, all-reduce metrics every N steps instead of every step, "
          "torch.distributed coalescing), or reduce their number.", kind="bandwidth"),
)}

# What hides or shortens exposed communication, per parallel kind (`tables/parallelism.py`),
# in the names of that API only: FSDP2 (`fully_shard`) has none of FSDP1's arguments, and a
# pipeline's exposed time is mostly stages waiting for each other, which no overlap of
# gradient collectives cures. Checked against torch 2.13's APIs.
COMM_REMEDIES: dict[str, str] = {
    "pp": "Pipeline: its exposed time is mostly stages waiting for each other (the bubble, or "
          "a slower stage). Run more micro-batches per step (n_microbatches of at least 4x the "
          "stages), an interleaved schedule with several stages per rank "
          "(ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble), and rebalance layers "
          "across stages so that none computes longer than the others.",
    "tp": "Tensor parallel: use sequence parallelism (SequenceParallel for the norms and "
          "dropout: the all-reduces become a reduce-scatter and an all-gather over shorter "
          "activations), async TP to overlap the matmuls with their communication (torch.compile "
          "with torch._inductor.config._micro_pipeline_tp = True and symmetric memory on the TP "
          "group: torch.distributed._symmetric_memory.enable_symm_mem_for_group), and keep the "
          "TP group within a node's fast links (NVLink): a smaller TP degree, with data "
          "parallelism or FSDP across nodes.",
    "ep": "Expert parallel: the all-to-alls that dispatch tokens to their experts and combine "
          "them back wait for the slowest rank of the group, so unequal splits cost everyone. "
          "Balance the router's load (an auxiliary load-balancing loss, a capacity factor, "
          "token dropping), overlap the dispatch and combine with compute that does not need "
          "them (a shared expert, the next micro-batch), and keep the expert-parallel group "
          "within a node's fast links.",
    "embedding": "Embedding sharding (model-parallel embeddings): the all-to-alls that send "
                 "lookups to the ranks holding each table and pooled embeddings back are not "
                 "hidden by any gradient bucketing. Pipeline them with the dense part (TorchRec's "
                 "TrainPipelineSparseDist starts the next batch's input all-to-all during this "
                 "one's compute), rebalance the sharding plan so that no rank's tables receive "
                 "more lookups (EmbeddingShardingPlanner: table-wise, row-wise, column-wise), and "
                 "keep the large all-to-alls within a node where the plan allows.",
    "fsdp2": "FSDP2 (fully_shard): prefetch the next all-gathers explicitly "
             "(set_modules_to_forward_prefetch / set_modules_to_backward_prefetch on the "
             "FSDPModule), keep reshard_after_forward=True only where memory needs it (False, "
             "or an int to reshard to a smaller group, saves the backward all-gather), and with "
             "gradient accumulation skip the reduce-scatter of the micro-steps "
             "(set_requires_gradient_sync(False)).",
    "fsdp1": "FSDP (FullyShardedDataParallel): backward_prefetch=BackwardPrefetch.BACKWARD_PRE, "
             "forward_prefetch=True, limit_all_gathers=True, and with gradient accumulation "
             "skip the reduce-scatter of the micro-steps under model.no_sync().",
    "ddp": "DDP: tune bucket_cap_mb (smaller buckets start the all-reduce earlier in "
           "backward), keep gradient_as_bucket_view=True, avoid find_unused_parameters=True, "
           "and with gradient accumulation skip the all-reduce of the micro-steps under "
           "model.no_sync().",
}
# For a run whose traces name no parallel API: the usual overlap, by API.
COMM_REMEDY_UNKNOWN = (
    "Overlap communication with compute (the traces do not say which parallel API the job "
    "uses). DDP: tune bucket_cap_mb, keep gradient_as_bucket_view=True, avoid "
    "find_unused_parameters. FSDP: prefetch the next all-gathers (FSDP2's "
    "set_modules_to_forward_prefetch / set_modules_to_backward_prefetch; FSDP1's "
    "backward_prefetch and forward_prefetch).")
# Fewer bytes, in each API's words; a pipeline's and tensor parallelism's bytes are the
# activations, which only a faster link or a smaller degree shortens.
_FEWER_BYTES: dict[str, str] = {
    "fsdp2": "reduce in bf16 (MixedPrecisionPolicy(reduce_dtype=torch.bfloat16))",
    "fsdp1": "reduce in bf16 (MixedPrecision(reduce_dtype=torch.bfloat16))",
    "ddp": "bf16 gradients with a DDP comm hook (bf16_compress_hook)",
}

# The tensor-parallel group's exposed communication (findings/tp_comm.py).
TP_EXPOSED_COMM = Cause(
    "tp_exposed_comm", "tensor-parallel communication exposed",
    "tensor-parallel communication not hidden under compute",
    "the tensor-parallel all-reduces (or reduce-scatters and all-gathers) sit between the "
    "matmuls that need their results, and nothing computes meanwhile",
    COMM_REMEDIES["tp"], kind="tp_exposed_comm")


def exposed_comm_remedy(parallelism_kinds: tuple[str, ...] | list[str],
                        traits: dict[str, Any] | None = None) -> str:
    """The remedy for exposed communication that fits the run's parallelism: each kind's own
    (in `tables/parallelism.KIND_ORDER`) whose precondition holds on what the run shows
    (`traits`: `run.job_traits`; DDP's only where its all-reduces carry the communication),
    then fewer bytes in the words of the data-parallel API, never another API's option
    names."""
    t = traits or {}
    kinds = [k for k in parallelism_kinds if k in COMM_REMEDIES]
    said = [chosen_remedy(_SERVES[k], t).say(t) if k in _SERVES else COMM_REMEDIES[k]
            for k in kinds]
    if not kinds:
        return (COMM_REMEDY_UNKNOWN + " If the collectives are bandwidth-bound (see the "
                "bandwidth findings), send fewer bytes (bf16 gradients) or use a faster "
                "interconnect.")
    fewer = [_FEWER_BYTES[k] for k in kinds if k in _FEWER_BYTES
             and (k != "ddp" or ddp_buckets_matter(t))]
    if {"embedding", "ep"} & set(kinds):
        fewer.append(chosen_remedy(_A2A_BYTES, t).say(t))
    return (" ".join(said) + " If the collectives are bandwidth-bound (see the bandwidth "
            "findings), " + (f"send fewer bytes ({'; '.join(fewer)}) or " if fewer else "")
            + "use a faster interconnect.")


# How each API hides a transfer or sends fewer, larger messages (`link_remedy`).
_HIDE: dict[str, str] = {
    "pp": "more micro-batches or an interleaved schedule, so stages compute while "
          "activations move",
    "tp": "async TP (torch._inductor.config._micro_pipeline_tp with torch.compile)",
    "ep": "the expert all-to-alls overlapped with a shared expert or the next micro-batch",
    "embedding": "TorchRec's TrainPipelineSparseDist (the next batch's input all-to-all under "
                 "this one's compute)",
    "fsdp2": "FSDP2 prefetch (set_modules_to_forward_prefetch / "
             "set_modules_to_backward_prefetch)",
    "fsdp1": "FSDP backward_prefetch=BACKWARD_PRE, forward_prefetch=True",
    "ddp": "DDP bucket_cap_mb",
}
_COALESCE: dict[str, str] = {
    "pp": "fewer, larger micro-batches (each send/recv carries one micro-batch's activations)",
    "tp": "fewer, larger collectives (sequence parallelism, a smaller TP degree)",
    "ep": "fewer, larger dispatches (more tokens per all-to-all)",
    "embedding": "fewer, larger all-to-alls (group the tables' lookups: fused "
                 "EmbeddingBagCollection sharding)",
    "fsdp2": "larger fully_shard units (fewer, larger all-gathers and reduce-scatters)",
    "fsdp1": "a coarser auto_wrap_policy (fewer, larger FSDP units)",
    "ddp": "raise DDP bucket_cap_mb",
}


def link_remedy(verdict: str, parallelism_kinds: tuple[str, ...] | list[str]) -> str:
    """The remedy of a bandwidth- or latency-bound class (`LINK_VERDICTS`) in the words of the
    run's parallel APIs; the generic one when the traces name none."""
    kinds = [k for k in parallelism_kinds if k in _HIDE]
    if not kinds or verdict not in LINK_VERDICTS:
        return LINK_VERDICTS[verdict].remedy if verdict in LINK_VERDICTS else ""
    if verdict == "bandwidth-bound":
        fewer = [_FEWER_BYTES[k] for k in kinds if k in _FEWER_BYTES]
        return ("The link is the limit: "
                + (f"send fewer bytes ({'; '.join(fewer)}), " if fewer else "")
                + f"hide the transfer under compute ({'; '.join(_HIDE[k] for k in kinds)}), "
                "or use a faster interconnect (more or faster NICs, InfiniBand/RoCE, NVLink).")
    return ("Small messages pay latency, not bandwidth: coalesce them "
            f"({'; '.join(_COALESCE[k] for k in kinds)}; all-reduce metrics every N steps "
            "instead of every step), or reduce their number.")


# A host whose CPUs are saturated (analysis/diagnosis/host_cpu.py).
HOST_CPU = Cause(
    "host_cpu", "host CPU saturated", "host CPU saturated",
    "the host's CPUs were busy nearly all the time: every process on it waits for CPU time",
    "The host's CPUs are saturated: the training processes, their data-loader workers and "
    "communication threads compete for cores. Give each rank fewer threads "
    "(torch.set_num_threads, OMP_NUM_THREADS) or fewer data-loader workers, run fewer ranks "
    "per host, or move other load (another job, a throttled node) off it.",
    kind="host_cpu")

THROTTLE_REMEDY = (
    "Throttled GPUs compute slower: check cooling (temperatures, fans, airflow), power "
    "caps (nvidia-smi -q -d POWER), and hardware slowdown events; drain the node if "
    "one GPU keeps throttling.")


def gap_cause(key: str) -> Cause:
    """The gap cause `key`; an unknown key (a newer run's) gets a neutral description."""
    return GAP_CAUSES.get(key) or Cause(key, key, key, key, "Inspect these gaps in the trace.",
                                        kind="idle", letter="?")


def straggler_cause_text(key: str | None) -> str:
    """The sentence that says why a straggler is late (the key itself when unknown)."""
    c = STRAGGLER_CAUSES.get(key or "")
    return c.explanation if c is not None else str(key)


def remedy_for(c: Cause, device_type: str | None) -> str:
    """The remedy of `c` that fits a run on `device_type` ("cpu": no accelerator)."""
    return c.cpu_remedy if device_type == "cpu" and c.cpu_remedy else c.remedy


# One pipeline stage computes longer than the others (findings/pipeline.py).
PIPELINE_IMBALANCE = Cause(
    "imbalance", "unbalanced pipeline stages", "a pipeline stage slower than the others",
    "every stage waits for the slowest one at each micro-batch, so the step runs at its pace",
    "Rebalance the stages: move layers (or the embedding / output head) from the slowest "
    "stage to its neighbours, where the model is split into stages (the split points given to "
    "torch.distributed.pipelining's pipeline() or the modules of each PipelineStage). Then "
    "shrink the bubble that remains: more micro-batches per step (n_microbatches of at least "
    "4x the stages) or an interleaved schedule with several stages per rank "
    "(ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble).",
    kind="pipeline_imbalance")
PIPELINE_IMBALANCE_REMEDY = PIPELINE_IMBALANCE.remedy


# Hangs and crashes (findings/hang.py, findings/crash.py): what to do about each.
HANG_REMEDY = ("Look at the stuck rank's stack: a rank that never joins the collective the "
               "others wait in is blocked elsewhere (I/O, a lock, a data loader, an infinite "
               "loop) or took another code path (a collective under a rank- or data-dependent "
               "condition). Make every rank issue the same collectives in the same order; "
               "a mismatch names the calls that differ.")
CRASH_REMEDY = ("Fix the first failure: the other ranks failing afterwards are victims that "
                "lost their peer. Its exception and stack say where; a rank killed without a "
                "trace (SIGKILL) is often the OOM killer: check host memory (dmesg, the "
                "node's counters) around that time.")
MISMATCH_REMEDY = ("The ranks issued different collectives at the same sequence number: a "
                   "collective skipped or added on some ranks (rank- or data-dependent control "
                   "flow), or tensors of different shape or dtype. Make every rank issue the "
                   "same collectives in the same order with the same shapes.")
FROZEN_REMEDY = ("A frozen rank answered nothing, not even the signal that makes any running "
                 "process write its stacks: it was stopped (SIGSTOP, a debugger, job control: "
                 "send SIGCONT or detach), is blocked in the kernel (uninterruptible I/O on a "
                 "hung file system or device: see /proc/<pid>/stack and dmesg) or swapped out "
                 "(check host memory). The others wait for it in the collective named.")


# A rank that ran out of device memory (findings/crash.py: its crash finding's cause).
OUT_OF_MEMORY = Cause(
    "out_of_memory", "out of memory", "a rank out of device memory",
    "an allocation asked for more device memory than was free",
    "Lower the memory per rank: a smaller micro-batch (with gradient accumulation for the same "
    "batch), activation checkpointing, bf16/fp16 (autocast), sharded parameters, gradients "
    "and optimizer state (FSDP2 fully_shard, ZeRO), or CPU offload. A peak far above what is "
    "in use between steps points at activations or a one-off allocation (the request size "
    "says which); memory in use that grows step after step is a leak (tensors kept across "
    "steps: losses appended without .item(), caches). PYTORCH_CUDA_ALLOC_CONF="
    "expandable_segments:True helps when the memory is free but fragmented.",
    kind="crash")



# --- Remedies whose precondition is read from the run (issue 50) ------------------------------
#
# `run.job_traits` (analysis/diagnosis/job_traits.py) says what the job already does; a remedy
# is given only where its precondition holds on it, else the next one in its list that holds
# (the last of each list always holds), and it says what it saw. docs/findings.md's remedy
# table is made from `REMEDIES` (`python -m uberprof.analysis.diagnosis.findings --write`).

_DDP_SHARE = 50.0
_SERVES = {"ddp": "exposed_comm (DDP)", "embedding": "exposed_comm (embedding sharding)",
           "ep": "exposed_comm (expert parallel)"}
_A2A_BYTES = "exposed_comm (embedding sharding, expert parallel)"  # DDP's bucket advice only where its all-reduces are this share of the time


def _coll(t: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [c for c in t.get("collectives") or [] if c.get("name") == name]


def _share(t: dict[str, Any], name: str) -> float:
    return sum(c.get("share_pct") or 0.0 for c in _coll(t, name))


def ddp_buckets_matter(t: dict[str, Any]) -> bool:
    """DDP's bucket remedy holds: the run's all-reduces carry at least half of its collective
    time, or the traces do not say (no collective table)."""
    return not (t.get("collectives")) or _share(t, "allreduce") >= _DDP_SHARE


def _mix(t: dict[str, Any]) -> str:
    by: dict[str, float] = {}
    for c in t.get("collectives") or []:
        by[c["name"]] = by.get(c["name"], 0.0) + (c.get("share_pct") or 0.0)
    return ", ".join(f"{n} {v:.0f}%" for n, v in sorted(by.items(), key=lambda kv: -kv[1]))


def _ddp_not_the_traffic(t: dict[str, Any]) -> str:
    return ("DDP wraps part of the model, but its gradient all-reduces are only "
            f"{_share(t, 'allreduce'):.0f}% of the communication time (by collective: "
            f"{_mix(t)}): tuning its buckets would not touch the rest.")


def _bucket_numbers(t: dict[str, Any]) -> str:
    ar = _coll(t, "allreduce")
    sizes = [c for c in ar if c.get("mb_median") is not None]
    if not sizes:
        return ""
    c = max(sizes, key=lambda c: c.get("ms") or 0)
    suggest = max(1, round((c["mb_median"] or 0) / 2))
    return (f" Seen: {c['calls_per_step']} all-reduces a step of {c['mb_min']}-{c['mb_max']} MB "
            f"(median {c['mb_median']} MB; DDP's default bucket_cap_mb is 25): try "
            f"bucket_cap_mb={suggest} and compare the exposed time.")


def _all_to_all_numbers(t: dict[str, Any]) -> str:
    a2a = _coll(t, "alltoall")
    if not a2a:
        return ""
    c = max(a2a, key=lambda c: c.get("ms") or 0)
    lo, hi = c.get("largest_mb_across_ranks") or (None, None)
    spread = (f"; the largest a step is {lo} MB on one rank and {hi} MB on another: unequal "
              "splits, the ranks that send more are waited for" if lo is not None and hi
              and lo < 0.9 * hi else "")
    return (f" Seen: {c['calls_per_step']} all-to-alls a step, up to {c['mb_max']} MB each, "
            f"{_share(t, 'alltoall'):.0f}% of the communication time{spread}.")


def _all_to_all_fewer_bytes(t: dict[str, Any]) -> str:
    if "fp8" in (t.get("precision") or []):
        return ("a smaller embedding dimension or fewer features: the all-to-all already "
                "runs quantised, FP8 kernels seen")
    if (t.get("embeddings") or {}).get("present"):
        return ("quantise the all-to-all: TorchRec's qcomm codecs, fp16/bf16 or FP8 forward and "
                "backward")
    return "dispatch and combine the tokens in bf16, or FP8 with a scale per token"


def _opt_words(t: dict[str, Any]) -> str:
    o = t.get("optimizer") or {}
    cls = "/".join(o.get("classes") or []) or "optimizer"
    bits = []
    if o.get("host_ms_per_step") is not None:
        bits.append(f"{o['host_ms_per_step']} ms of host time a step in {o.get('region')}")
    if o.get("top_op"):
        bits.append(f"{o['top_op']['name']} {o['top_op']['ms_per_call']} ms a call")
    return f"{cls}" + (f" ({'; '.join(bits)})" if bits else "")


def _impl(t: dict[str, Any]) -> str | None:
    return (t.get("optimizer") or {}).get("implementation")


@dataclass(frozen=True)
class Remedy:
    """One remedy of a finding (a gap cause or a finding kind), given where `holds` is true of
    the run's job traits; `say` writes it with the run's numbers."""

    key: str
    serves: str  # the gap cause or finding kind it is a remedy of
    precondition: str  # in words, for docs/findings.md
    holds: Callable[[dict[str, Any]], bool]
    say: Callable[[dict[str, Any]], str]


_HOST = GAP_CAUSES["host"].remedy
_LAUNCH = GAP_CAUSES["launch"].remedy

REMEDIES: tuple[Remedy, ...] = (
    Remedy("host_fused_already", "idle (host)",
           "the optimizer already runs fused kernels (aten::_fused_*)",
           lambda t: _impl(t) == "fused",
           lambda t: (f"The optimizer is already fused: {_opt_words(t)}. The host time is "
                      "elsewhere (Python between operators, logging, metrics): move it off the "
                      "step or overlap it; torch.compile of the step cuts Python overhead.")),
    Remedy("host_foreach_already", "idle (host)",
           "the optimizer already runs foreach operators (aten::_foreach_*), none fused",
           lambda t: _impl(t) == "foreach",
           lambda t: (f"Already uses a foreach optimizer: {_opt_words(t)}. Where the idle time "
                      "lies in that region, a fused optimizer on the device "
                      "(fused=True for Adam, AdamW, SGD, Adagrad; torch.compile of the optimizer "
                      "step for those without one) launches one kernel per group instead of "
                      "several per parameter list, or overlap the step with backward (an "
                      "optimizer in backward through register_post_accumulate_grad_hook). Move "
                      "other host work off the step.")),
    Remedy("host_plain_optimizer", "idle (host)",
           "an optimizer step is seen, neither foreach nor fused (a per-parameter loop)",
           lambda t: _impl(t) == "plain",
           lambda t: (f"The optimizer loops over its parameters one by one: {_opt_words(t)}. "
                      + _HOST)),
    Remedy("host_generic", "idle (host)", "always (no optimizer step seen in the traces)",
           lambda t: True,
           lambda t: "No optimizer step is seen in the traces. " + _HOST),
    Remedy("launch_graphs_already", "launch_bound",
           "the trace shows cudaGraphLaunch calls",
           lambda t: bool((t.get("cuda_graphs") or {}).get("present")),
           lambda t: ("The step already replays CUDA graphs ("
                      + (f"{n} cudaGraphLaunch calls"
                         if (n := (t.get("cuda_graphs") or {}).get("launches"))
                         else "cudaGraphLaunch in the trace") + "): "
                      "the launch-bound gaps are in work outside the captured graphs. Extend "
                      "the captured region (fix the graph breaks and dynamic shapes that leave "
                      "work out: TORCH_LOGS=graph_breaks), fuse the small operators left, or "
                      "give each kernel more work (larger batch per rank).")),
    Remedy("launch_compiled_no_graphs", "launch_bound",
           "compiled (Triton) kernels are present, no cudaGraphLaunch",
           lambda t: bool((t.get("compiled") or {}).get("present")),
           lambda t: ("The job is already compiled ("
                      f"{(t.get('compiled') or {}).get('triton_kernels')} Triton kernels seen) "
                      "but replays no CUDA graph: torch.compile(mode='reduce-overhead') captures "
                      "the compiled step in CUDA graphs; fix graph breaks so that more of the "
                      "step is compiled (TORCH_LOGS=graph_breaks), or give each kernel more "
                      "work (larger batch per rank).")),
    Remedy("launch_eager", "launch_bound", "always (eager mode: neither seen)",
           lambda t: True,
           lambda t: ("No cudaGraphLaunch nor compiled (Triton) kernel in the traces: the step "
                      "runs eagerly. " + _LAUNCH)),
    Remedy("data_in_process", "data_stall",
           "the trace shows the single-process data-loader iterator (num_workers=0)",
           lambda t: t.get("data_loader_workers") == "none",
           lambda t: ("The data loader runs in the training process (the trace shows "
                      "_SingleProcessDataLoaderIter: num_workers=0), so each batch is made "
                      "while the device waits. Give it worker processes (DataLoader "
                      "num_workers=4 or more, persistent_workers=True, pin_memory=True, "
                      "prefetch_factor), or move decoding and augmentation off the training "
                      "process.")),
    Remedy("data_workers_already", "data_stall",
           "the trace shows the multi-process data-loader iterator (num_workers > 0)",
           lambda t: t.get("data_loader_workers") == "several",
           lambda t: ("The data loader already has worker processes (the trace shows "
                      "_MultiProcessingDataLoaderIter) and the device still waits: they do not "
                      "keep up. Raise num_workers and prefetch_factor within the host's free "
                      "cores, use pin_memory=True and persistent_workers=True, move decoding and "
                      "augmentation out of the workers' per-step path (pre-processed data, "
                      "decoding on the device), and check the storage or network read path.")),
    Remedy("data_generic", "data_stall", "always (the data-loader fetch not seen)",
           lambda t: True, lambda t: GAP_CAUSES["data"].remedy),
    Remedy("straggler_data_in_process", "straggler (data)",
           "the trace shows the single-process data-loader iterator (num_workers=0)",
           lambda t: t.get("data_loader_workers") == "none",
           lambda t: ("Rank {r} waits for its data loader, which runs in the training process "
                      "(the trace shows _SingleProcessDataLoaderIter: num_workers=0). Give it "
                      "worker processes (num_workers, persistent_workers=True, pin_memory=True, "
                      "prefetch_factor); check what makes its batches slower (its inputs, the "
                      "storage or network read path of its node).")),
    Remedy("straggler_data_workers_already", "straggler (data)",
           "the trace shows the multi-process data-loader iterator (num_workers > 0)",
           lambda t: t.get("data_loader_workers") == "several",
           lambda t: ("Rank {r} waits for its data loader although it has worker processes "
                      "(_MultiProcessingDataLoaderIter): they do not keep up on it. Check the "
                      "storage or network read path of its node and the cores its workers get; "
                      "raise num_workers and prefetch_factor.")),
    Remedy("straggler_data_generic", "straggler (data)", "always (the data-loader fetch not "
           "seen)", lambda t: True, lambda t: STRAGGLER_CAUSES["data"].remedy),
    Remedy("ddp_buckets", "exposed_comm (DDP)",
           f"DDP is read and all-reduces are at least {_DDP_SHARE:.0f}% of the collective time",
           ddp_buckets_matter,
           lambda t: COMM_REMEDIES["ddp"] + _bucket_numbers(t)),
    Remedy("ddp_not_the_traffic", "exposed_comm (DDP)",
           f"DDP is read but all-reduces are under {_DDP_SHARE:.0f}% of the collective time",
           lambda t: True, _ddp_not_the_traffic),
    Remedy("embedding_all_to_all", "exposed_comm (embedding sharding)",
           "all-to-alls and embedding kernels (fbgemm, TorchRec, EmbeddingBag)",
           lambda t: True, lambda t: COMM_REMEDIES["embedding"] + _all_to_all_numbers(t)),
    Remedy("all_to_all_quantised_already", "exposed_comm (embedding sharding, expert parallel)",
           "FP8 kernels are seen (the all-to-all is already quantised)",
           lambda t: "fp8" in (t.get("precision") or []), _all_to_all_fewer_bytes),
    Remedy("all_to_all_quantise", "exposed_comm (embedding sharding, expert parallel)",
           "always (no FP8 kernels seen)", lambda t: True, _all_to_all_fewer_bytes),
    Remedy("alltoall_imbalance_sharding", "alltoall_imbalance",
           "embedding kernels are seen (fbgemm, TorchRec, EmbeddingBag): sharded tables",
           lambda t: bool((t.get("embeddings") or {}).get("present")),
           lambda t: ("Rebalance the sharding plan: the ranks named hold the hot tables or "
                      "rows; plan the shards with the measured per-table cost (TorchRec's "
                      "planner with its cost estimates), split the hottest tables row-wise over "
                      "several ranks, and keep each rank's lookup and pooling work equal."
                      + _all_to_all_numbers(t))),
    Remedy("alltoall_imbalance_experts", "alltoall_imbalance",
           "always (no embedding kernels: expert parallel or other all-to-all traffic)",
           lambda t: True,
           lambda t: ("Balance the experts' load: the ranks named get more tokens or work than "
                      "the others, and every all-to-all waits for them. Add or strengthen the "
                      "router's load-balancing (an auxiliary balance loss, or a bias on the "
                      "router's scores per expert), cap each expert's tokens with a capacity "
                      "factor, or replicate the hot experts on other ranks (expert placement by "
                      "measured load)." + _all_to_all_numbers(t))),
    Remedy("expert_all_to_all", "exposed_comm (expert parallel)",
           "all-to-alls without embedding kernels, or a mesh dimension 'ep'",
           lambda t: True, lambda t: COMM_REMEDIES["ep"] + _all_to_all_numbers(t)),
)


def chosen_remedy(serves: str, traits: dict[str, Any] | None) -> Remedy:
    """The first remedy of `serves` whose precondition holds on `traits`."""
    t = traits or {}
    return next(r for r in REMEDIES if r.serves == serves and r.holds(t))


def gap_remedy(c: Cause, device_type: str | None, traits: dict[str, Any] | None) -> str:
    """The remedy of idle cause `c` that fits the run: the CPU one on a run without an
    accelerator, else, for host work and launch-bound gaps, the first of `REMEDIES` whose
    precondition holds on what the job already does (`traits`)."""
    if device_type == "cpu" and c.cpu_remedy:
        return c.cpu_remedy
    serves = {"host": "idle (host)", "launch": "launch_bound", "data": "data_stall"}.get(c.key)
    if serves is None or traits is None:
        return remedy_for(c, device_type)
    return chosen_remedy(serves, traits).say(traits)


# An example run's traits, for the table of remedies in docs/findings.md (its numbers are an
# example's; a finding's remedy quotes its own run's).
EXAMPLE_TRAITS: dict[str, Any] = {
    "optimizer": {"classes": ["AdamW"], "implementation": "foreach", "device": "cuda",
                  "region": "Optimizer.step", "host_ms_per_step": 12.5,
                  "top_op": {"name": "aten::_foreach_mul_", "ms_per_call": 1.2}},
    "cuda_graphs": {"present": False, "launches": 40},
    "compiled": {"present": False, "triton_kernels": 120, "examples": []},
    "collectives": [
        {"group": "default", "name": "alltoall", "calls_per_step": 2.0, "mb_median": 160.0,
         "mb_min": 0.1, "mb_max": 400.0, "largest_mb_across_ranks": [324.0, 400.0],
         "ms": 400.0, "share_pct": 55.0},
        {"group": "default", "name": "allreduce", "calls_per_step": 4.0, "mb_median": 25.0,
         "mb_min": 8.0, "mb_max": 30.0, "largest_mb_across_ranks": [30.0, 30.0],
         "ms": 300.0, "share_pct": 45.0}],
    "embeddings": {"present": True}, "precision": ["bf16"],
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def remedies_table() -> str:
    """Every remedy and its precondition, one markdown row each: first the remedies chosen by
    what the job already does (`REMEDIES`, in the order they are tried; the sentence with an
    example run's numbers, `EXAMPLE_TRAITS`), then those that depend only on the run's device
    or parallelism (docs/findings.md's table, compared with this by
    tests/unit/test_remedy_preconditions.py)."""
    rows = ["| remedy of | key | precondition (tried in this order) | what it says |",
            "|---|---|---|---|"]
    for r in REMEDIES:
        rows.append(f"| {r.serves} | `{r.key}` | {_cell(r.precondition)} | "
                    f"{_cell(r.say(EXAMPLE_TRAITS))} |")
    for c in GAP_CAUSES.values():
        if c.key in ("host", "launch", "data"):
            rows.append(f"| {c.kind} ({c.key}) | `GAP_CAUSES[{c.key!r}]` | a run without an "
                        f"accelerator (before the rows above) | {_cell(c.cpu_remedy)} |")
            continue
        rows.append(f"| {c.kind} ({c.key}) | `GAP_CAUSES[{c.key!r}]` | a run with an "
                    f"accelerator{'' if c.cpu_remedy else ' or without'} | {_cell(c.remedy)} |")
        if c.cpu_remedy:
            rows.append(f"| {c.kind} ({c.key}) | `GAP_CAUSES[{c.key!r}]` | a run without an "
                        f"accelerator | {_cell(c.cpu_remedy)} |")
    for k in ("pp", "tp", "fsdp2", "fsdp1"):
        rows.append(f"| exposed_comm | `COMM_REMEDIES[{k!r}]` | parallelism read as `{k}` | "
                    f"{_cell(COMM_REMEDIES[k])} |")
    rows.append(f"| exposed_comm | `COMM_REMEDY_UNKNOWN` | no parallelism read | "
                f"{_cell(COMM_REMEDY_UNKNOWN)} |")
    for c in STRAGGLER_CAUSES.values():
        if c.key == "data":
            rows.append(f"| straggler (data) | `STRAGGLER_CAUSES['data']` | its cause is data, "
                        f"a run without an accelerator (else the rows above) | "
                        f"{_cell(c.cpu_remedy)} |")
            continue
        rows.append(f"| straggler ({c.key}) | `STRAGGLER_CAUSES[{c.key!r}]` | its cause is "
                    f"{c.key}{' (a run with an accelerator)' if c.cpu_remedy else ''} | "
                    f"{_cell(c.remedy)} |")
        if c.cpu_remedy:
            rows.append(f"| straggler ({c.key}) | `STRAGGLER_CAUSES[{c.key!r}]` | its cause is "
                        f"{c.key}, a run without an accelerator | {_cell(c.cpu_remedy)} |")
    for v in ("bandwidth-bound", "latency-bound"):
        rows.append(f"| bandwidth ({v}) | `link_remedy` | the class is {v}; no parallelism "
                    f"read (else in each kind's words) | {_cell(LINK_VERDICTS[v].remedy)} |")
    for name, text in (("TP_EXPOSED_COMM", TP_EXPOSED_COMM.remedy),
                       ("PIPELINE_IMBALANCE", PIPELINE_IMBALANCE.remedy),
                       ("HOST_CPU", HOST_CPU.remedy), ("THROTTLE_REMEDY", THROTTLE_REMEDY),
                       ("HANG_REMEDY", HANG_REMEDY), ("MISMATCH_REMEDY", MISMATCH_REMEDY),
                       ("FROZEN_REMEDY", FROZEN_REMEDY), ("CRASH_REMEDY", CRASH_REMEDY),
                       ("OUT_OF_MEMORY", OUT_OF_MEMORY.remedy)):
        rows.append(f"| {name.lower().removesuffix('_remedy')} | `{name}` | always | "
                    f"{_cell(text)} |")
    return "\n".join(rows)


def alltoall_imbalance_remedy(traits: dict[str, Any] | None) -> str:
    """The remedy of unequal all-to-alls: rebalance the sharding plan where the job shards
    embeddings, else the experts' load (`REMEDIES`, tried in order on what the job does)."""
    return chosen_remedy("alltoall_imbalance", traits).say(traits or {})


def straggler_remedy(cause: str, device_type: str | None, traits: dict[str, Any] | None,
                     rank: int) -> str:
    """The remedy of a straggler of `cause` on `rank`: the CPU one on a run without an
    accelerator; for a data straggler the first `REMEDIES` row whose precondition holds on what
    the job already does (its data loader's workers)."""
    c = STRAGGLER_CAUSES[cause]
    if cause == "data" and traits is not None and not (device_type == "cpu" and c.cpu_remedy):
        return chosen_remedy("straggler (data)", traits).say(traits).format(r=rank)
    return remedy_for(c, device_type).format(r=rank)
