"""torch.profiler's own sums on a real CUDA job, kept beside its trace: what the operator and
kernel tables are checked against on CPU machines (tests/unit/test_gpu_samples.py).

Profiles four steps of the DDP sample's model on one GPU (CPU and CUDA activities), exports the
Kineto trace and writes `key_averages()` as JSON: per key its count, self CPU total, CPU total
and self device total (µs). Run on a GPU machine:

    python benchmarks/gpu_key_averages.py OUTDIR      # OUTDIR/gpu-profile.pt.trace.json.gz
                                                      # OUTDIR/gpu-profile.key_averages.json
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))
from train_ddp import TinyTransformer  # noqa: E402


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "gpu-profile.pt.trace.json"
    torch.manual_seed(0)
    model = TinyTransformer(4096, 256, 2, 4, 128).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 4096, (8, 128), device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:
        for _ in range(6):
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            torch.nn.functional.cross_entropy(logits.reshape(-1, 4096), x.reshape(-1)).backward()
            opt.step()
            torch.cuda.synchronize()
            prof.step()
    rows = {e.key: {"count": e.count, "self_cpu_us": e.self_cpu_time_total,
                    "cpu_total_us": e.cpu_time_total,
                    "self_device_us": getattr(e, "self_device_time_total", None),
                    "device_total_us": getattr(e, "device_time_total", None)}
            for e in prof.key_averages()}
    (out / "gpu-profile.key_averages.json").write_text(json.dumps(
        {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows},
        indent=1, sort_keys=True))
    with trace.open("rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
