"""How ranks ended, as the launchers inside the job see it (they are the ranks' parents, and only
a parent learns a child's exit status: the signal of a SIGKILL leaves nothing in the rank).

- `torch.multiprocessing.spawn`: the worker wrapper catches the rank's exception to pass it to
  the parent, so no excepthook runs in the rank: the wrapper is wrapped to record it first;
  the parent's `ProcessContext.join` records the exit codes of the ranks that failed.
- torchrun: its agent builds a `ProcessFailure` per failed worker (pid, local rank, exit code).

Both append to `nodes/<node>/exits-<pid>.jsonl` (one file per launcher process). At the first
failure torchrun's agent sees, before it ends the other ranks, `ask_peers` asks those of its node
for a Flight Recorder dump (their helper threads answer within `capture.POLL_S`; it waits at most
`PEER_WAIT_S`): every rank's collective sequence at the failure, for the desync's culprit.
Patched at `import torch` in every process; inert where nothing fails.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uberprof.collect.config import ENV_NODE, ENV_RUN_DIR
from uberprof.collect.safety import AgentLog, swallowing
from uberprof.rundir.layout import (
    EXITS_PREFIX,
    FLIGHT_RECORDER_FILE,
    PEER_FAILED_REQUEST_FILE,
    RANK_FILE,
)

PEER_WAIT_S = 1.0  # the longest a launcher waits for its ranks' dumps after a failure

_on_exception: Callable[[BaseException], None] | None = None  # set by `install`


def install(log: AgentLog, on_exception: Callable[[BaseException], None] | None = None) -> None:
    """Record the exits the launchers see; `on_exception` is told a spawned rank's exception
    (the rank agent's capture: this module never imports the agent's activation)."""
    global _on_exception
    _on_exception = on_exception
    for name, patch in (("mp.spawn", _wrap_spawn), ("torchrun", _wrap_torchrun)):
        try:
            patch(log)
        except Exception as exc:  # noqa: BLE001 - a torch without that part: nothing to record
            log.write(f"not recording {name} exits: {exc!r}")


def record_exit(pid: int | None, exitcode: int | None, source: str,
                local_rank: int | None = None) -> None:
    """One exit, appended to this launcher's file in the node folder."""
    run_dir, node = os.environ.get(ENV_RUN_DIR), os.environ.get(ENV_NODE)
    if not run_dir or not node or exitcode in (None, 0):
        return
    assert exitcode is not None
    row = {"time_ns": time.time_ns(), "pid": pid, "local_rank": local_rank,
           "exitcode": exitcode, "signal": _signal_name(exitcode), "source": source}
    path = Path(run_dir) / "nodes" / node / f"{EXITS_PREFIX}{os.getpid()}.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


_asked = False  # once per launcher process: its first failure


def ask_peers(failed_pid: int | None, wait_s: float = PEER_WAIT_S) -> list[int]:
    """The first failure this launcher saw: ask every other live rank of this node for a
    Flight Recorder dump (`peer_failed`) and wait for them, at most `wait_s`, before the
    launcher ends them: each rank's collective sequence at the moment of the failure, which
    tells a rank that departed from a peer that only met it (docs/hangs.md). Returns the
    ranks asked."""
    global _asked
    run_dir, node = os.environ.get(ENV_RUN_DIR), os.environ.get(ENV_NODE)
    if _asked or not run_dir or not node:
        return []
    _asked = True
    asked: dict[int, Path] = {}
    request = {"failed_pid": failed_pid, "time_ns": time.time_ns()}
    for meta in sorted((Path(run_dir) / "ranks").glob(f"*/{RANK_FILE}")):
        try:
            doc = json.loads(meta.read_text())
            pid = doc.get("pid")
            if doc.get("node") != node or not isinstance(pid, int) or pid == failed_pid:
                continue
            os.kill(pid, 0)  # alive
            (meta.parent / PEER_FAILED_REQUEST_FILE).write_text(json.dumps(request))
            asked[int(doc.get("rank", -1))] = meta.parent / FLIGHT_RECORDER_FILE.format(
                reason="peer_failed")
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline:
        if all(_written_since(p, request["time_ns"]) for p in asked.values()):
            break
        time.sleep(0.02)
    return sorted(asked)


def _written_since(path: Path, t_ns: int) -> bool:
    try:
        return path.stat().st_mtime_ns >= t_ns - 10**9
    except OSError:
        return False


def _signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _wrap_spawn(log: AgentLog) -> None:
    import importlib

    # the module: `torch.multiprocessing.spawn` as an attribute is the function spawn()
    spawn = importlib.import_module("torch.multiprocessing.spawn")

    original_wrap = spawn._wrap

    @functools.wraps(original_wrap)  # same module and name: pickled by reference as before
    def _wrap(fn: Any, i: int, args: Any, *rest: Any, **kwargs: Any) -> Any:
        return original_wrap(_recording(fn), i, args, *rest, **kwargs)

    spawn._wrap = _wrap
    original_join = spawn.ProcessContext.join

    @functools.wraps(original_join)
    def join(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original_join(self, *args, **kwargs)
        except BaseException:
            _record_processes(self.processes)
            raise

    spawn.ProcessContext.join = join

    @swallowing(log, "recording mp.spawn exits")
    def _record_processes(processes: list[Any]) -> None:
        for i, p in enumerate(processes):
            record_exit(p.pid, p.exitcode, "mp.spawn", i)


def _recording(fn: Any) -> Any:
    @functools.wraps(fn)
    def worker(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            _rank_exception(exc)
            raise

    return worker


def _rank_exception(exc: BaseException) -> None:
    if _on_exception is not None:
        _on_exception(exc)


def _wrap_torchrun(log: AgentLog) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    original = ProcessFailure.__post_init__

    @functools.wraps(original)
    def __post_init__(self: Any) -> None:
        original(self)
        _record_failure(self)

    @swallowing(log, "recording torchrun exits")
    def _record_failure(failure: Any) -> None:
        record_exit(failure.pid, failure.exitcode, "torchrun", failure.local_rank)
        if failure.exitcode not in (None, 0):
            ask_peers(failure.pid)

    ProcessFailure.__post_init__ = __post_init__  # type: ignore[method-assign]
