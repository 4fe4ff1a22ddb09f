"""Counters of real jobs under `uberprof run`: a 2-rank DDP run on this (GPU-less) machine, the
`--counters none` switch, and two agents on one host (srun: one `uberprof run` per rank)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests._jobs import PY, SAMPLES, info_json, job_env, torchrun, uberprof_run
from uberprof.collect.capabilities import torch_build_has_gpu
from uberprof.collect.counters import read_counters
from uberprof.rundir import COUNTERS_DIR


def _has_nvml() -> bool:
    from uberprof.collect.counters.nvml import Nvml, NvmlUnavailable

    try:
        Nvml.open().close()
        return True
    except NvmlUnavailable:
        return False


def test_ddp_run_holds_host_counters_for_its_whole_duration(tmp_path: Path) -> None:
    hz = 4.0
    # 30 steps: with the start-up, 10 s or more at 4 Hz, 40 samples or more to count (a
    # sample more or less at either end is a few per cent, against the 20 % allowed), and
    # seconds of training for the ranks' own CPU samples (it ran 60)
    proc = uberprof_run(tmp_path, "cnt", torchrun(2, SAMPLES / "train_ddp.py", "--steps", "30"),
                        "--no-trace", "--sample-hz", str(hz))
    lines = [line for line in proc.stderr.splitlines() if "no NVIDIA GPU" in line]
    if not _has_nvml() and torch_build_has_gpu() is not False:
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("uberprof: no NVIDIA GPU (NVML: ")
        assert lines[0].endswith("): host counters only")
    elif not _has_nvml():  # a CPU-only torch build expects no GPU: no warning, a note in info
        assert lines == [] and "torch build" not in proc.stderr, proc.stderr

    run = tmp_path / "cnt"
    [node] = [p.name for p in (run / "nodes").iterdir()]
    meta = json.loads((run / "nodes" / node / "node.json").read_text())
    start, end = meta["start_ns"], meta["end_ns"]
    assert meta["counters"]["sampling"] is True and meta["counters"]["sample_hz"] == hz
    df = read_counters(run, node)
    cpu = df[(df.source == "host") & (df.metric == "cpu.util")]
    expected = (end - start) / 1e9 * hz
    assert abs(len(cpu) - expected) <= 0.2 * expected, (len(cpu), expected)
    # The whole duration: sampling began before the ranks did (their agents start after
    # torch's import) and went on until the last rank had ended, within one period; the
    # sampler is a thread that a busy machine schedules late, so no tighter bound on its start.
    ranks_meta = [json.loads(p.read_text()) for p in (run / "ranks").glob("*/rank.json")]
    assert cpu.ts_ns.min() < min(m["start_ns"] for m in ranks_meta)
    assert cpu.ts_ns.max() >= max(m["end_ns"] for m in ranks_meta) - 1e9 / hz
    assert start <= cpu.ts_ns.min()
    # NICs, and both ranks' processes (labelled by rank through their rank.json).
    assert {"rx_rate", "tx_rate"} <= set(df[df.source == "nic"].metric)
    ranks = df[(df.source == "proc") & df.device.str.startswith("rank:")]
    assert set(ranks.device) == {"rank:0", "rank:1"}
    assert ranks[ranks.metric == "cpu.util"].value.max() > 10

    info = info_json(run)
    series = {(c["source"], c["metric"]): c for c in info["counters"]}
    assert series[("host", "cpu.util")]["samples"] == len(cpu)
    assert series[("host", "cpu.util")]["unit"] == "%"
    assert all(set(c) >= {"node", "source", "metric", "unit", "samples"}
               for c in info["counters"])
    text = subprocess.run([PY, "-m", "uberprof", "info", str(run)], capture_output=True,
                          text=True, env=job_env(), timeout=120, check=True).stdout
    assert "counters" in text and "cpu.util" in text
    if not _has_nvml() and torch_build_has_gpu() is False:
        assert text.count("a CPU-only torch build: host counters only") == 1
        assert "NVML" not in text


def test_counters_none_samples_nothing(tmp_path: Path) -> None:
    uberprof_run(tmp_path, "off", [PY, "-c", "import time; time.sleep(0.5)"], "--counters", "none")
    [node_dir] = list((tmp_path / "off" / "nodes").iterdir())
    assert not (node_dir / COUNTERS_DIR).exists()
    assert json.loads((node_dir / "node.json").read_text())["counters"]["mode"] == "none"
    assert info_json(tmp_path / "off")["counters"] == []


def test_one_sampler_per_host_with_one_agent_per_rank(tmp_path: Path) -> None:
    """Like srun: two `uberprof run` on one host for the same job; only one samples."""
    cmd = [PY, "-m", "uberprof", "run", "--out", str(tmp_path), "--run-id", "srun",
           "--sample-hz", "5", "--", PY, "-c", "import time; time.sleep(2)"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=job_env()) for _ in range(2)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    nodes = sorted((tmp_path / "srun" / "nodes").iterdir())
    assert len(nodes) == 2
    status = [json.loads((n / "node.json").read_text())["counters"] for n in nodes]
    sampling = [s["sampling"] for s in status]
    assert sorted(sampling) == [False, True]
    sampler = nodes[sampling.index(True)].name
    other = status[sampling.index(False)]
    assert other["sampled_by"].startswith(f"{sampler} pid")
    assert (nodes[sampling.index(True)] / COUNTERS_DIR).is_dir()
    assert not (nodes[sampling.index(False)] / COUNTERS_DIR).exists()
    # One "no NVIDIA GPU" line for the host, not one per agent (none for a CPU-only torch).
    if not _has_nvml():
        expected = 0 if torch_build_has_gpu() is False else 1
        assert sum("no NVIDIA GPU" in e for e in errs) == expected
