import sys, tempfile, json
from pathlib import Path
sys.path.insert(0, "/work/main")
from tests._jobs import ROOT, SAMPLES, load_script, torchrun, uberprof_run
W = load_script(ROOT / "benchmarks" / "whatif.py", "_w")
steps = int(sys.argv[1]); script = sys.argv[2]; extra = sys.argv[3:]
sargs = ["--dim", "256", "--batch", "16", "--heavy-stage", "1", "--heavy-factor", "3"] if "pipeline" in script else []
out = Path(tempfile.mkdtemp())
uberprof_run(out, "r", torchrun(2, SAMPLES / script, "--steps", str(steps), *sargs), "--counters", "none", *extra)
ends = {}; cpu = {}
for row in W.timeline_rows(out / "r"):
    if row.get("kind", "step") == "step" and isinstance(row.get("host_end_ns"), int):
        ends[row["step"]] = max(ends.get(row["step"], 0), row["host_end_ns"])
print(" ".join(f"{s}:{(ends[s]-ends[s-1])/1e6:.0f}" for s in sorted(ends) if s-1 in ends))
