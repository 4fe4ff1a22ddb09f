"""A full disk under the run directory: the job is unharmed, uberprof says so once, stops writing,
leaves what it wrote readable and no temporary file, and `info` says the disk was full."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests._jobs import PY, info_json, uberprof_run

FILLS_THE_DISK = """
import os, sys
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step():
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
for _ in range(5):
    step()
# the window of steps 2-3 is exported and compressed on a thread that may still be at it (a
# loaded machine): wait for its .gz, or the uncompressed trace it then deletes would free room
# after the disk was filled
import glob, time
deadline = time.monotonic() + 120
while time.monotonic() < deadline and not (
        glob.glob(sys.argv[2] + "/ranks/*/traces/*.json.gz")
        and not glob.glob(sys.argv[2] + "/ranks/*/traces/*.json")
        and not glob.glob(sys.argv[2] + "/ranks/*/traces/*.tmp")):
    time.sleep(0.05)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 65536)
except OSError:
    pass
for _ in range(60):  # a few pages of steps.jsonl: its appends meet the full disk
    step()
print("job done", flush=True)
"""


@pytest.fixture
def small_disk(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_is_one_line_and_info_says_so(small_disk: Path) -> None:
    command = [PY, "-c", FILLS_THE_DISK, str(small_disk / "filler"), str(small_disk / "full")]
    proc = uberprof_run(small_disk, "full", command, "--trace-steps", "2-3", "--sample-hz", "10")
    assert proc.returncode == 0 and proc.stdout == "job done\n"
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("uberprof:")]
    full = [ln for ln in notes if "is full" in ln]
    assert len(full) == 1, proc.stderr
    assert "stopped writing" in full[0] and "your job is not affected" in full[0]
    assert "internal error" not in proc.stderr and "No space left" not in proc.stderr
    run = small_disk / "full"
    assert (run / "disk-full").exists()
    assert [p for p in run.rglob("*") if ".tmp" in p.name] == []
    # What was written stays readable; the ends of the run are recorded in place.
    rank = json.loads((run / "ranks/0/rank.json").read_text())
    node = json.loads(next((run / "nodes").glob("*/node.json")).read_text())
    assert rank["end_ns"] is not None and node["exit_code"] == 0
    info = info_json(run)
    [r] = info["ranks"]
    assert 5 <= r["steps"] < 65 and r["finished"]
    assert info["exit_code"] == 0
    problems = " | ".join(info["problems"])
    assert f"the disk holding {run} was full at" in problems
    assert "stopped abruptly" not in problems and "did not finish" not in problems


def test_final_metadata_is_rewritten_in_place_on_a_full_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from uberprof.collect import diskfull

    path = tmp_path / "node.json"
    path.write_text(json.dumps({"exit_code": None, "pad": "x" * 200}, indent=2))

    def no_space(p: Path, obj: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(diskfull, "write_json_atomic", no_space)
    monkeypatch.setattr(diskfull._State, "full", False)
    monkeypatch.setattr(diskfull._State, "root", tmp_path)
    diskfull.write_json_final(path, {"exit_code": 0})
    assert json.loads(path.read_text()) == {"exit_code": 0}
    assert diskfull.is_full() and (tmp_path / "disk-full").exists()
    diskfull.declare()  # said once per run
    assert capsys.readouterr().err.count("is full") == 1
    monkeypatch.setattr(diskfull, "write_json_atomic",
                        lambda p, o: (_ for _ in ()).throw(PermissionError(errno.EACCES, "no")))
    with pytest.raises(PermissionError):  # other errors are not a full disk
        diskfull.write_json_final(path, {"exit_code": 1})
