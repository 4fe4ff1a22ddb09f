"""`uberprof run --trace-ranks`: trace windows on the chosen ranks only, on a real 4-rank
Gloo job; every rank keeps its step timeline, and `info` and `report` read the untraced ranks
as chosen, not as missing or broken."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests._jobs import PY, SAMPLES, info_json, job_env, time_limit, torchrun, uberprof_run

STEPS = 12
WINDOW = [5, 8]


def test_trace_ranks_traces_only_the_chosen_ranks_and_report_reads_the_others_as_chosen(
        tmp_path: Path) -> None:
    proc = uberprof_run(tmp_path, "some", torchrun(4, SAMPLES / "train_ddp.py", "--steps",
                                                   str(STEPS)),
                        "--trace-steps", f"{WINDOW[0]}-{WINDOW[1]}", "--trace-ranks", "0,2")
    assert "(traces: steps 5-8 on ranks 0, 2)" in proc.stderr
    run = tmp_path / "some"
    for rank in range(4):  # every rank keeps its step timeline and Flight Recorder
        assert (run / "ranks" / str(rank) / "steps.jsonl").stat().st_size > 0
        assert (run / "ranks" / str(rank) / "flight-recorder.jsonl").exists()
    traced = sorted(int(p.parent.parent.name) for p in run.glob("ranks/*/traces/*.json.gz"))
    assert traced == [0, 2]

    info = info_json(run)
    assert info["problems"] == []  # untraced ranks are not a problem: they were chosen
    assert info["traced_ranks"] == "0, 2 of 4 (--trace-ranks 0,2)"
    by_rank = {r["rank"]: r for r in info["ranks"]}
    assert [r["steps"] for r in info["ranks"]] == [STEPS] * 4
    assert {r: [w["steps"] for w in by_rank[r]["trace_windows"]] for r in range(4)} == \
        {0: [WINDOW], 1: [], 2: [WINDOW], 3: []}
    assert [by_rank[r]["trace_selected"] for r in range(4)] == [True, False, True, False]
    assert all(w["trigger"] == "schedule" for r in (0, 2) for w in by_rank[r]["trace_windows"])

    rep = subprocess.run([PY, "-m", "uberprof", "report", "--json", str(run)],
                         capture_output=True, text=True, env=job_env(), check=False,
                         timeout=time_limit(60))
    assert rep.returncode == 0, rep.stderr[-3000:]
    doc = json.loads(rep.stdout)
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2, 3]
    assert doc["run"]["traced_ranks"] == [0, 2]
    problems = " ".join(doc["run"]["problems"])
    assert "no usable trace window" not in problems and "missing ranks" not in problems, problems
