"""Counters: the store (crash safety, index), host/NIC/IB parsing, the sampler in-process, and the
one-sampler-per-host lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests._jobs import load_factor
from uberprof.collect.counters import CounterSettings, NodeSampler, read_counters
from uberprof.collect.counters.infiniband import InfinibandSource, parse_ib_rate
from uberprof.collect.counters.nic import parse_tc_qdiscs, parse_tc_rate
from uberprof.collect.counters.store import CounterStore
from uberprof.collect.safety import AgentLog
from uberprof.inventory import node_counters
from uberprof.rundir import COUNTERS_DIR, RunDir
from uberprof.rundir.counters import counter_meta, iter_batches, link_caps, read_index, scan_index

ROOT = Path(__file__).resolve().parents[2]


def _sampler(tmp_path: Path, hz: float = 10.0, mode: str = "host", run_id: str = "t",
             node: str = "n0", **kw: object) -> tuple[RunDir, NodeSampler]:
    run = RunDir(tmp_path / run_id)
    run.create(run_id)
    nd = run.claim_node_dir(node)
    log = AgentLog("node", nd / "uberprof.log")
    settings = CounterSettings(mode=mode, sample_hz=hz, flush_s=0.3)
    return run, NodeSampler(run, run_id, nd, settings, log, **kw)  # type: ignore[arg-type]


# ---- store ------------------------------------------------------------------------------------


def test_store_round_trip_index_and_cut_off_tail(tmp_path: Path) -> None:
    store = CounterStore(tmp_path / "c")
    store.add("host", 1_000, [("cpu", "cpu.util", 50.0, "%"), ("mem", "mem.used", 1e9, "B")])
    store.flush()
    store.add("host", 2_000, [("cpu", "cpu.util", 70.0, "%"), ("cpu", "bad", None, "%")])  # type: ignore[list-item]
    store.flush()
    store.close()
    index = {s["metric"]: s for s in read_index(tmp_path / "c") or []}
    assert index["cpu.util"]["samples"] == 2 and index["cpu.util"]["first_ns"] == 1_000
    assert index["mem.used"] == {**index["mem.used"], "samples": 1, "unit": "B", "devices": 1}
    assert "bad" not in index  # None values are not written
    assert sorted(scan_index(tmp_path / "c"), key=lambda s: s["metric"]) == \
        sorted(index.values(), key=lambda s: s["metric"])
    # A writer killed mid-batch: the reader keeps every whole batch.
    path = tmp_path / "c" / "host.arrows"
    assert sum(b.num_rows for b in iter_batches(path)) == 3
    data = path.read_bytes()
    path.write_bytes(data[:-60])
    assert sum(b.num_rows for b in iter_batches(path)) == 2
    path.write_bytes(b"")
    assert list(iter_batches(path)) == []


def test_a_batch_with_damaged_bytes_is_skipped_not_computed_on(tmp_path: Path) -> None:
    """Arrow checks only a batch's framing when it reads one; an offset damaged on disk then
    crashed `export` with a segfault in its first filter (fuzz, found under load). The batch
    is skipped and the whole ones around it are kept, in both readers (the follower's check
    runs in a child process: without the fix it would take the test run down with it)."""
    import pyarrow as pa

    from uberprof.collect.counters.store import schema

    def batch(metrics: list[str]) -> pa.RecordBatch:
        n = len(metrics)
        return pa.RecordBatch.from_arrays([
            pa.array(range(n), pa.int64()), pa.array(["cpu"] * n), pa.array(metrics),
            pa.array([1.0] * n), pa.array(["%"] * n)], schema=schema())

    path = tmp_path / "host.arrows"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, schema()) as w:
        w.write_batch(batch(["cpu.util"]))
        w.write_batch(batch(["gpu.power.draw", "gpu.power.draw"]))
        w.write_batch(batch(["cpu.util", "cpu.util"]))
    data = bytearray(path.read_bytes())
    offsets = np.array([0, 14, 28], np.int32).tobytes()  # the second batch's metric column
    at = data.find(offsets)
    assert at > 0 and data.find(offsets, at + 1) < 0
    data[at:at + 12] = np.array([0, 1 << 20, 28], np.int32).tobytes()  # one offset damaged
    path.write_bytes(bytes(data))
    assert [b.num_rows for b in iter_batches(path)] == [1, 2]
    follow = ("from pathlib import Path; from uberprof.rundir.follow import CounterFollower; "
              f"f = CounterFollower(Path({str(path)!r}), ('cpu.util',)); "
              "print(f.poll(), sorted(f.latest))")
    out = subprocess.run([sys.executable, "-c", follow], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "[('cpu',", "'cpu.util')]"]


def test_store_stops_writing_after_an_io_error(tmp_path: Path) -> None:
    store = CounterStore(tmp_path / "c")
    (tmp_path / "c" / "host.arrows").mkdir()  # opening it as a file fails
    store.add("host", 1, [("cpu", "cpu.util", 1.0, "%")])
    store.flush()
    assert store.error is not None
    store.add("host", 2, [("cpu", "cpu.util", 1.0, "%")])
    store.close()  # no exception


# ---- parsing ----------------------------------------------------------------------------------


def test_tc_caps_are_parsed_in_bytes_per_second() -> None:
    doc = [{"kind": "noqueue", "dev": "lo", "options": {}},
           {"kind": "tbf", "handle": "8001:", "dev": "veth0", "root": True,
            "options": {"rate": 125000000, "burst": 262125, "lat": 50000}},
           {"kind": "pfifo_fast", "dev": "eth0", "options": {"bands": 3}},
           {"kind": "tbf", "dev": "eth1", "options": {"rate": "100Mbit"}},
           {"kind": "cake", "dev": "eth2", "options": {"bandwidth": 2500000}}]
    assert parse_tc_qdiscs(doc) == {"veth0": 125e6, "eth1": 12.5e6, "eth2": 2.5e6}
    assert parse_tc_rate("1Gbit") == 125e6
    assert parse_tc_rate("800Kbit") == 100e3
    assert parse_tc_rate("1Mibit") == 1024**2 / 8
    assert parse_tc_rate("fast") is None and parse_tc_rate(0) is None
    assert parse_tc_qdiscs("nonsense") == {}


def test_infiniband_port_counters_are_words_of_four_bytes(tmp_path: Path) -> None:
    port = tmp_path / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "state").write_text("4: ACTIVE\n")

    def write(xmit: int, rcv: int) -> None:
        (port / "counters" / "port_xmit_data").write_text(f"{xmit}\n")
        (port / "counters" / "port_rcv_data").write_text(f"{rcv}\n")

    write(1_000, 0)
    ib = InfinibandSource(tmp_path)
    assert ib.present()
    ib.prime()
    time.sleep(0.2)
    write(1_000 + 5_000_000, 2_500_000)
    t0 = time.monotonic()
    rows = {m: v for _, m, v, _ in ib.sample()}
    elapsed = 0.2 + (time.monotonic() - t0)
    assert rows["tx_rate"] == pytest.approx(20e6 / 0.2, rel=0.5) and rows["tx_rate"] > 0
    assert rows["rx_rate"] == pytest.approx(rows["tx_rate"] / 2, rel=0.01)
    assert elapsed < 5
    links = ib.sample_links()
    assert links == [("mlx5_0/1", "link_speed", 25e9, "B/s")]
    assert ib.ports["mlx5_0/1"]["state"] == "4: ACTIVE"
    assert parse_ib_rate("400 Gb/sec (4X NDR)") == 50e9
    write(10, 10)  # a counter reset: no rate rather than a negative one
    assert [r for r in ib.sample() if r[1] == "tx_rate"] == []


def test_settings_validate_and_derive_slow_rates() -> None:
    s = CounterSettings(sample_hz=2)
    assert s.period_s == 0.5 and s.slow_period_s == 1.0 and s.pcie_period_s == 5.0
    assert CounterSettings(sample_hz=0.5).slow_period_s == 4.0
    with pytest.raises(ValueError):
        CounterSettings(mode="everything")
    with pytest.raises(ValueError):
        CounterSettings(sample_hz=0)


# ---- the sampler ------------------------------------------------------------------------------


def test_sampler_records_host_counters_at_the_configured_rate(tmp_path: Path) -> None:
    run, sampler = _sampler(tmp_path, hz=10.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        t0 = time.time_ns()
        assert sampler.start()
        time.sleep(2.0)
        sampler.stop()
        t1 = time.time_ns()
    finally:
        child.kill()
        child.wait()
    df = read_counters(run.root, "n0")
    cpu = df[(df.source == "host") & (df.metric == "cpu.util")]
    expected = (t1 - t0) / 1e9 * 10
    # on an idle machine: within 20% of the rate and 0.3 s of both ends; on a loaded one the
    # sampling thread waits for a core as long as anything does, so the slack grows with the
    # load (at most 4x: a sampler that misses most ticks still fails)
    slack = min(4.0, load_factor())
    assert abs(len(cpu) - expected) <= 0.2 * slack * expected, (len(cpu), expected, slack)
    assert cpu.ts_ns.is_monotonic_increasing
    assert (cpu.ts_ns.min() - t0) < 0.3e9 * slack and (t1 - cpu.ts_ns.max()) < 0.3e9 * slack
    assert set(df[df.source == "host"].metric) >= {"cpu.util", "cpu.util_max_core", "load1",
                                                   "mem.used", "mem.total"}
    # The child process of the agent is sampled, and the sum over the job.
    procs = df[df.source == "proc"]
    assert f"pid:{child.pid}" in set(procs.device) and "job" in set(procs.device)
    assert set(df.columns) == {"node", "ts_ns", "source", "device", "metric", "value", "unit"}
    meta = counter_meta(run.root, "n0")
    assert meta["settings"]["sample_hz"] == 10.0 and meta["stopped_ns"] >= meta["started_ns"]
    assert str(child.pid) in meta["processes"]
    # mode "host": no GPU backend tried, so no notice either.
    assert sampler.status()["notes"] == [] and "nvml" not in set(df.source)
    series = {(c["source"], c["metric"]): c for c in node_counters(run.nodes_dir / "n0")}
    assert series[("host", "cpu.util")]["samples"] == len(cpu)
    assert all(c["node"] == "n0" for c in series.values())


def test_filters_and_link_caps(tmp_path: Path) -> None:
    run, sampler = _sampler(tmp_path, hz=10.0)
    sampler.start()
    time.sleep(1.0)
    sampler.stop()
    df = read_counters(run.root, "n0", sources=["host"], metrics=["load1"])
    assert set(df.metric) == {"load1"} and len(df) >= 5
    mid = int(df.ts_ns.iloc[len(df) // 2])
    later = read_counters(run.root, "n0", sources=["host"], metrics=["load1"], start_ns=mid)
    assert len(later) == len(df) - len(df) // 2
    caps = link_caps(run.root, "n0")
    assert "lo" not in caps and all(v is None or v > 0 for v in caps.values())
    assert read_counters(run.root, "missing").empty


def test_one_sampler_per_host(tmp_path: Path) -> None:
    run, first = _sampler(tmp_path, run_id="srun", node="n0")
    second_dir = run.claim_node_dir("n0")
    second = NodeSampler(run, "srun", second_dir, first.settings, AgentLog("node"))
    assert first.start()
    assert not second.start()
    assert second.status()["sampled_by"].startswith("n0 pid")
    assert second.status()["sampling"] is False
    second.stop()
    first.stop()
    assert not (second_dir / COUNTERS_DIR).exists()
    # Released at stop: a later agent of the same run on this host may sample again.
    third = NodeSampler(run, "srun", second_dir, first.settings, AgentLog("node"))
    assert third.start()
    third.stop()


def test_mode_none_samples_nothing(tmp_path: Path) -> None:
    run, sampler = _sampler(tmp_path, mode="none")
    assert not sampler.start()
    sampler.stop()
    assert not (run.nodes_dir / "n0" / COUNTERS_DIR).exists()
    assert sampler.status()["mode"] == "none"


KILLED_AGENT = """
import sys, time
from pathlib import Path
from uberprof.collect.counters import CounterSettings, NodeSampler
from uberprof.collect.safety import AgentLog
from uberprof.rundir import RunDir
run = RunDir(Path(sys.argv[1])); run.create("k"); nd = run.claim_node_dir("n0")
NodeSampler(run, "k", nd, CounterSettings(mode="host", sample_hz=10, flush_s=0.3),
            AgentLog("node")).start()
print("started", flush=True)
time.sleep(60)
"""


def test_a_killed_agent_leaves_its_counters_readable(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILLED_AGENT, str(tmp_path / "k")],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        # kill it once it has flushed 8 samples (0.8 s of sampling on a quiet machine; a busy
        # one schedules its thread later, so wait for the samples, not for a time)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and \
                (read_counters(tmp_path / "k", "n0").metric == "cpu.util").sum() < 8:
            time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    df = read_counters(tmp_path / "k", "n0")
    assert (df.metric == "cpu.util").sum() >= 8
    series = node_counters(tmp_path / "k" / "nodes" / "n0")
    assert any(s["metric"] == "cpu.util" and s["samples"] >= 8 for s in series)
    meta = json.loads((tmp_path / "k" / "nodes" / "n0" / COUNTERS_DIR / "meta.json").read_text())
    assert meta["stopped_ns"] is None  # it never got to stop


# ---- the host lock: private, never following links, removed after use --------------------------


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_lock_lives_in_a_private_folder_and_is_removed(tmp_path: Path, private_tmp: Path) -> None:
    _, sampler = _sampler(tmp_path, run_id="lk")
    assert sampler.start()
    folder = private_tmp / f"uberprof-{os.getuid()}"
    locks = list(folder.iterdir())
    assert len(locks) == 1 and locks[0].name.endswith(".counters.lock")
    assert (folder.stat().st_mode & 0o777) == 0o700 and folder.stat().st_uid == os.getuid()
    assert (locks[0].stat().st_mode & 0o077) == 0
    sampler.stop()
    assert list(folder.iterdir()) == [], "the lock file outlived the run"


def test_lock_does_not_follow_a_planted_symlink(tmp_path: Path, private_tmp: Path) -> None:
    from uberprof.collect.counters.hostlock import HostLock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run, sampler = _sampler(tmp_path, run_id="sym")
    path = HostLock.path_for(run, "sym", sampler.host)
    path.symlink_to(victim)
    with pytest.raises(OSError):
        HostLock.acquire(path, "me")
    assert sampler.start()  # counters still on, without the lock, one notice
    sampler.stop()
    assert victim.read_text() == "precious"
    assert path.is_symlink()


@pytest.mark.parametrize("plant", ["symlink", "open-mode"])
def test_an_unsafe_lock_folder_is_refused(tmp_path: Path, private_tmp: Path,
                                          capsys: pytest.CaptureFixture[str], plant: str) -> None:
    from uberprof.collect.counters.hostlock import UnsafeLockFolder, private_folder

    folder = private_tmp / f"uberprof-{os.getuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if plant == "symlink":
        folder.symlink_to(elsewhere)
    else:
        folder.mkdir()
        folder.chmod(0o777)
    with pytest.raises(UnsafeLockFolder):
        private_folder()
    _, sampler = _sampler(tmp_path, run_id="unsafe")
    assert sampler.start()  # a planted folder must not switch the user's counters off
    sampler.stop()
    assert list(elsewhere.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("uberprof: counters: no host-wide lock") == 1
