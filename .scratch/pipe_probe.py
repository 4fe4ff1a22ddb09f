"""Probe: the in-job pipeline test's cost and projection, N times, print each."""
import json, sys, tempfile
from pathlib import Path
import numpy as np
from click.testing import CliRunner
sys.path.insert(0, "/work/main")
from tests._jobs import ROOT, SAMPLES, load_script, torchrun, uberprof_run
from uberprof.cli import main
W = load_script(ROOT / "benchmarks" / "whatif.py", "_w")
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 16
extra = sys.argv[2:]
for i in range(int(__import__("os").environ.get("N", "1"))):
    out = Path(tempfile.mkdtemp())
    odd = ",".join(str(s) for s in range(1, steps, 2))
    uberprof_run(out, "pipe", torchrun(2, SAMPLES / "train_pipeline.py", "--steps", str(steps),
                 "--dim", "256", "--batch", "16", *(__import__("os").environ.get("SARGS") or "--heavy-stage 1 --heavy-factor 3").split(),
                 "--fault-steps", odd), "--trace-steps", __import__("os").environ.get("TRACE") or f"3-{steps - 3}", *(["--record-shapes", "off"] if __import__("os").environ.get("NOSHAPES") else []), "--counters", "none", *extra)
    run = out / "pipe"
    res = CliRunner().invoke(main, ["whatif", str(run), "--balance-stages", "--json"])
    raw = json.loads(res.stdout)
    doc = W.as_periods(raw, run)
    bad = [r["step"] for r in doc["steps"] if r["step"] % 2 == 1]
    asm = {**doc, "steps": [{**r, "projected_ms": r["measured_ms"]} for r in doc["steps"]]}
    c = np.array(W.neighbour_ratios(asm, bad)); p = np.array(W.neighbour_ratios(doc, bad))
    print(f"cost {np.median(c)-1:+.3f} proj {np.median(p)-1:+.3f} costs {np.round(c-1,2).tolist()} "
          f"proj {np.round(p-1,2).tolist()} sharing {raw.get('core_sharing')}", flush=True)
    print("  periods", [r['measured_ms'] for r in doc['steps']], flush=True)
