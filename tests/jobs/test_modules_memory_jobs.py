"""`uberprof run --modules --profile-memory` around the DDP sample (2 ranks, Gloo on CPU): the
report's time per module names the model's modules by path with times that nest, and its
memory timeline has a positive peak inside the trace window."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

from tests._jobs import PY, job_env, time_limit
from tests._runs import MODULES_MEMORY_WINDOW, ShortRun
from uberprof.analysis.tables.derived import read_modules

WINDOW = MODULES_MEMORY_WINDOW


def test_modules_and_memory_timeline_of_a_ddp_job(modules_memory_run: Path) -> None:
    run = modules_memory_run  # 2 ranks, 8 steps, --modules --profile-memory, traced on WINDOW
    trace = json.loads(gzip.decompress(next((run / "ranks" / "1" / "traces").glob(
        "*.json.gz")).read_bytes()))
    assert trace.get("profile_memory") == 1 or any(
        e.get("name") == "[memory]" for e in trace["traceEvents"])
    proc = subprocess.run([PY, "-m", "uberprof", "report", "--json", str(run)],
                          capture_output=True, text=True, timeout=time_limit(120),
                          env=job_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)["run"]

    mods = doc["modules"]
    assert mods is not None and mods["sources"] == ["hooks"] and mods["ranks"] == 2
    names = {m["module"] for m in mods["modules"]}
    assert {"encoder.layers.0.self_attn", "encoder.layers.0", "encoder", "head",
            "TinyTransformer", "DistributedDataParallel"} <= names, names
    top = mods["modules"][0]
    assert top["module"] == "DistributedDataParallel" and top["calls"] == 2 * 3  # per step
    assert top["total_ms"] > 0 and 0 < top["total_pct"] <= 100
    table = read_modules(run / "derived")
    for rank in (0, 1):
        total = {r["module"]: r["total_ns"] for r in table.to_pylist() if r["rank"] == rank}
        for child, t in total.items():  # a parent's time holds its children's
            if child in ("TinyTransformer", "DistributedDataParallel", "CrossEntropyLoss"):
                continue
            parent = child  # the nearest called ancestor (a ModuleList is never called)
            while parent not in ("TinyTransformer",) and (parent == child
                                                          or parent not in total):
                parent = parent.rsplit(".", 1)[0] if "." in parent else "TinyTransformer"
            assert total[parent] >= t > 0, (rank, parent, child)
        assert total["DistributedDataParallel"] >= total["TinyTransformer"]

    timeline = doc["memory_timeline"]
    assert timeline is not None and timeline["categories"] is None
    assert [(r["rank"], r["device"]) for r in timeline["ranks"]] == [(0, "cpu"), (1, "cpu")]
    for r in timeline["ranks"]:
        assert r["peak_allocated_bytes"] > 0 and r["events"] > 0
        assert WINDOW[0] <= r["peak_step"] <= WINDOW[1]
        assert r["peak_operator"], r
        assert r["peak_allocated_bytes"] >= max(r["first_allocated_bytes"],
                                                r["last_allocated_bytes"])
    text = subprocess.run([PY, "-m", "uberprof", "report", str(run)], capture_output=True,
                          text=True, timeout=time_limit(120), env=job_env(), check=False).stdout
    assert "time per module" in text and "encoder.layers.0" in text
    assert "memory timeline" in text


def test_without_the_options_no_module_spans_and_no_memory(short_ddp_run: ShortRun) -> None:
    run = short_ddp_run[0]  # 2 ranks, traced on steps 2-3, neither option given
    trace = gzip.decompress(next((run / "ranks" / "0" / "traces").glob("*.json.gz"))
                            .read_bytes())
    assert b'"module::' not in trace and b'"[memory]"' not in trace
