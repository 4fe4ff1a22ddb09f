#!/bin/bash
# a CI-like neighbour: 4-rank DDP jobs under uberprof run, back to back, until killed
cd /work/main
while true; do
  d=$(mktemp -d); .venv/bin/uberprof run -o $d --counters none -- .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node=4 samples/train_ddp.py --steps 30 >/dev/null 2>&1
  .venv/bin/uberprof report $d/* >/dev/null 2>&1; rm -rf $d
done
