"""The vocabulary of causes: for every idle-gap cause, straggler cause and finding kind, its
label, the one sentence that explains it and the remedy, written once.

The advisor puts the remedies in its findings; the terminal and HTML reports, the dashboard's
pages and the trace export show the labels and sentences. A new cause is added here and every
view names it the same way. Remedies fit the run: a cause with a `cpu_remedy` gives it to runs
without an accelerator (`remedy_for`), so a CPU run is never told to pin memory or fuse its
optimizer on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "EXPOSED_COMM_REMEDY",
    "GAP_CAUSES",
    "HOST_CPU",
    "LINK_VERDICTS",
    "STRAGGLER_CAUSES",
    "THROTTLE_REMEDY",
    "Cause",
    "gap_cause",
    "remedy_for",
    "straggler_cause_text",
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
)}

# Why the straggler arrives last (analysis/diagnosis/stragglers.py `straggler_cause`).
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

EXPOSED_COMM_REMEDY = (
    "Overlap communication with compute. DDP: tune bucket_cap_mb (smaller buckets "
    "start all-reduce earlier in backward), keep gradient_as_bucket_view=True, avoid "
    "find_unused_parameters. FSDP: backward_prefetch=BACKWARD_PRE, "
    "forward_prefetch=True, limit_all_gathers=True. If the collectives are "
    "bandwidth-bound (see the bandwidth findings), send fewer bytes (bf16 gradients "
    "with a DDP comm hook) or use a faster interconnect.")

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
