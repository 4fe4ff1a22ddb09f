#!/usr/bin/env bash
# Real GPU runs of the DDP sample under `uberprof run`, for the checks on a lent GPU machine
# (issue 30) and the GPU samples the CPU tests read (samples/gpu/).
#
#   bash benchmarks/gpu_capture.sh OUTDIR            (RUNS="nccl1 oom" for some of them)
#
# Runs (each 40 steps, a trace window on steps 10-12, counters on):
#   nccl1      one rank, NCCL (a process group and DDP at world size 1: NCCL kernels)
#   gloo2      two ranks on the one GPU, Gloo on CUDA tensors (NCCL refuses two ranks per device)
#   straggler  gloo2 with rank 1 running its forward pass twice (extra GPU compute)
#   oom        gloo2 with rank 1 asking for more than the GPU holds at step 25
# Then `analyze`, `report --json` and `export` on each, and the job's own memory figures
# (torch.cuda.max_memory_allocated) beside the run, for the memory view's check.
set -u
out=${1:?usage: gpu_capture.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
model="--steps 40 --dim 512 --layers 4 --heads 8 --batch 16 --seq 256 --vocab 4096"
up() { "$py" -m uberprof "$@"; }
job() {  # name nproc sample-args...
    local name=$1 nproc=$2; shift 2
    [[ -z "${RUNS:-}" || " $RUNS " == *" $name "* ]] || return 0
    echo "== $name"
    local t0=$SECONDS
    up run --out "$out" --run-id "$name" --trace-steps 10-12 --sample-hz 10 -- \
        "$py" -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
        samples/train_ddp.py $model --memory-file "$out/$name.memory" "$@" \
        >"$out/$name.log" 2>&1
    echo "rc=$? in $((SECONDS - t0)) s"; tail -3 "$out/$name.log"
    up analyze "$out/$name" >"$out/$name.analyze.log" 2>&1; echo "analyze rc=$?"
    up report "$out/$name" --json >"$out/$name.report.json" 2>"$out/$name.report.err"
    echo "report rc=$?"; up report "$out/$name" 2>&1 | head -60
    up export "$out/$name" -o "$out/$name.trace.json" >/dev/null 2>&1; echo "export rc=$?"
}
job nccl1 1 --backend nccl --device cuda
job gloo2 2 --backend gloo --device cuda
job straggler 2 --backend gloo --device cuda --slow-rank 1 --slow-compute 2
job oom 2 --backend gloo --device cuda --oom-rank 1 --oom-step 25
