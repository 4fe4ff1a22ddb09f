"""Evidence of a crash or a hang, left by the rank itself in its folder (layout.py names files).

- A fatal signal (SIGSEGV, SIGABRT from a C++ abort, ...): faulthandler writes every thread's
  Python stack to `fatal.txt` from its C signal handler, unless the script enabled faulthandler
  itself (its own file wins: faulthandler has one). So does SIGTERM while the script has no
  handler of its own (then the default action follows, as before): where a rank was when its
  launcher ended it after another rank failed.
- An uncaught exception: `sys.excepthook` and `threading.excepthook` are chained (the previous
  hook still runs) and mp.spawn's worker wrapper calls `exception()`: the exception and its
  frames go to `exceptions.jsonl`, and the Flight Recorder's ring of collectives to
  `flight-recorder-exception.json`.
- A hang: the node agent's watchdog sends `SIGNAL` (a real-time signal nobody else uses; only
  ranks whose rank.json names it get it), on which faulthandler writes all threads' stacks to
  `stacks.txt` from C, also while a thread is stuck in C++ holding the GIL; and it writes
  `.hang-request`, which a daemon thread polls once a second: it answers with `hang.json` (the
  stacks as Python sees them, the last step) and a Flight Recorder dump
  (`flight-recorder-hang.json`). A rank stuck in a
  collective has released the GIL (Gloo and NCCL waits do), so the thread runs.

Never harm the job: every path here swallows and logs its own errors, and nothing runs on the
training thread per step.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from uberprof.collect.safety import AgentLog
from uberprof.rundir.layout import (
    EXCEPTIONS_FILE,
    FATAL_FILE,
    FLIGHT_RECORDER_FILE,
    HANG_REQUEST_FILE,
    PEER_FAILED_REQUEST_FILE,
    RANK_HANG_FILE,
    STACKS_FILE,
    read_json,
    write_json_atomic,
)

SIGNAL: int | None = (signal.SIGRTMIN + 6) if hasattr(signal, "SIGRTMIN") else None
"""The watchdog's request for stacks (Linux: SIGRTMIN+6). Sent only to ranks that registered it."""
POLL_S = 0.25  # how often the helper thread looks for a request (a stat() each time)
HELPER_NAME = "uberprof-capture"
MAX_TRACEBACK_CHARS = 20_000


def _frames(tb: TracebackType | None) -> list[dict[str, Any]]:
    # walk_tb reads no source lines (extract_tb does: slow disk reads while a launcher's
    # SIGTERM may be on its way)
    return [{"file": f.f_code.co_filename, "line": line, "function": f.f_code.co_name}
            for f, line in traceback.walk_tb(tb)]


def _stack_frames(frame: Any) -> list[dict[str, Any]]:
    return [{"file": f.filename, "line": f.lineno, "function": f.name}
            for f in traceback.extract_stack(frame)]


def flight_recorder_json() -> bytes | None:
    """torch's Flight Recorder dump (JSON bytes), or None without a process group or recorder."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    import torch

    return bytes(torch._C._distributed_c10d._dump_fr_trace_json(True, True))


class Capture:
    """The rank's failure evidence; `agent` gives the folder (it may move) and the last step."""

    def __init__(self, agent: Any, log: AgentLog) -> None:
        self.agent = agent
        self.log = log
        self.pid = os.getpid()
        self.exception_seen = False
        self._files: list[tuple[str, IO[str]]] = []
        self._fatal: IO[str] | None = None
        self._holding = False
        self._handled_request: Any = None
        self._handled_peer_failed: Any = None
        self._stop = threading.Event()
        self.status: dict[str, Any] = {"signal": None, "fatal": False, "helper": False}

    @property
    def dir(self) -> Path:
        return Path(self.agent.dir)

    def arm(self) -> dict[str, Any]:
        """Install every capture path that is free to take; returns what was installed."""
        for name, step in (("fatal", self._arm_fatal), ("signal", self._arm_signal),
                           ("hooks", self._arm_hooks), ("helper", self._arm_helper)):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - less evidence, never a broken job
                self.log.error(f"arming crash/hang capture ({name})", exc)
        return dict(self.status)

    def _open(self, name: str) -> IO[str]:
        f = open(self.dir / name, "a")  # noqa: SIM115 - kept open for the C handler
        self._files.append((name, f))
        return f

    def _arm_fatal(self) -> None:
        if faulthandler.is_enabled():
            self.log.write("faulthandler already enabled by the script: no fatal.txt")
            return
        fatal = self._fatal = self._open(FATAL_FILE)
        faulthandler.enable(file=fatal, all_threads=True)
        self.status["fatal"] = True
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            # where a rank was when its launcher ended it; then the default action, unchanged
            faulthandler.register(signal.SIGTERM, file=fatal, all_threads=True, chain=True)
            self.status["sigterm"] = True

    def _arm_signal(self) -> None:
        if SIGNAL is None or signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None):
            return
        faulthandler.register(SIGNAL, file=self._open(STACKS_FILE), all_threads=True,
                              chain=False)
        self.status["signal"] = int(SIGNAL)

    def _arm_hooks(self) -> None:
        previous = sys.excepthook

        def excepthook(t: type[BaseException], v: BaseException, tb: TracebackType | None) -> None:
            if issubclass(t, KeyboardInterrupt):
                previous(t, v, tb)
                return
            with self._sigterm_held(True):  # the user's own traceback print included
                self.exception(v, "excepthook")
                previous(t, v, tb)

        sys.excepthook = excepthook
        previous_thread = threading.excepthook

        def thread_hook(args: Any) -> None:
            if args.exc_value is not None and args.exc_type is not SystemExit:
                self.exception(args.exc_value, "threading",
                               args.thread.name if args.thread else None, dump=False)
            previous_thread(args)

        threading.excepthook = thread_hook

    def _arm_helper(self) -> None:
        threading.Thread(target=self._serve, name=HELPER_NAME, daemon=True).start()
        self.status["helper"] = True

    # ---- writing evidence -----------------------------------------------------------------

    def exception(self, exc: BaseException, where: str, thread: str | None = None,
                  dump: bool = True) -> None:
        """Record an uncaught exception (and, when it ends the rank, its last collectives)."""
        if os.getpid() != self.pid:
            return
        try:
            self.exception_seen = self.exception_seen or dump
            with self._sigterm_held(dump):
                row = {"time_ns": time.time_ns(),
                       "thread": thread or threading.current_thread().name,
                       "where": where, "type": type(exc).__qualname__,
                       "module": type(exc).__module__, "message": str(exc)[:4000],
                       "frames": _frames(exc.__traceback__), "last_step": self._last_step()}
                text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                row["traceback"] = text[-MAX_TRACEBACK_CHARS:]
                _append_line(self.dir / EXCEPTIONS_FILE, row)
                if dump:
                    self.flight_recorder("exception")
        except Exception as e:  # noqa: BLE001
            self.log.error("recording an uncaught exception", e)

    @contextlib.contextmanager
    def _sigterm_held(self, ending: bool) -> Iterator[None]:
        """Hold the launcher's SIGTERM while the exception that ends the rank is written.

        When one rank dies, the launcher ends the others within ~100 ms, often while they are
        formatting the exception Gloo just raised in them: without the hold they die with no
        record and a stack inside this hook. The hold covers pure Python, one file append,
        the Flight Recorder dump and the traceback print (milliseconds); a SIGTERM that came
        meanwhile is sent again at its end and takes its usual course (stacks to fatal.txt,
        then the default action)."""
        held = (ending and not self._holding and self.status.get("sigterm")
                and self._fatal is not None
                and threading.current_thread() is threading.main_thread()
                # the script set a handler of its own since: it stays, and decides
                and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None))
        pending: list[int] = []
        if held:
            try:
                faulthandler.unregister(signal.SIGTERM)
                signal.signal(signal.SIGTERM, lambda signum, _frame: pending.append(signum))
                self._holding = True
            except Exception as exc:  # noqa: BLE001 - then no hold, as before
                self.log.error("holding SIGTERM while recording an exception", exc)
                held = False
        try:
            yield
        finally:
            if held:
                self._holding = False
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                faulthandler.register(signal.SIGTERM, file=self._fatal, all_threads=True,
                                      chain=True)
                if pending:
                    os.kill(os.getpid(), signal.SIGTERM)

    def flight_recorder(self, reason: str) -> bool:
        try:
            raw = flight_recorder_json()
        except Exception as exc:  # noqa: BLE001
            self.log.write(f"Flight Recorder dump failed: {exc!r}")
            return False
        if raw is None:
            return False
        body = b'{"time_ns": %d, "reason": "%s", "dump": ' % (time.time_ns(), reason.encode())
        name = FLIGHT_RECORDER_FILE.format(reason=reason)
        tmp = self.dir / f".{name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(body + raw + b"}\n")
        os.replace(tmp, self.dir / name)
        return True

    def _serve(self) -> None:
        """The helper thread: answer the watchdog's requests (hang.json, Flight Recorder)."""
        while not self._stop.wait(POLL_S):
            try:
                self._answer_peer_failed()
                req = self._new_request(HANG_REQUEST_FILE, self._handled_request)
                if req is None:
                    continue
                self._handled_request = req
                self._answer(req)
            except Exception as exc:  # noqa: BLE001
                self.log.error("answering the hang watchdog", exc)

    def _new_request(self, name: str, handled: Any) -> Any:
        """The request in this rank's file `name`, None when there is none or it is the one
        already `handled`."""
        request = self.dir / name
        if not request.exists():
            return None
        req = read_json(request)
        return None if req is None or req == handled else req

    def _answer_peer_failed(self) -> None:
        """A local rank failed (the launcher asks, `exits.ask_peers`): dump this rank's
        collectives as they are now, before the launcher ends it, so that every rank's
        sequence is read, not only the ranks that raised."""
        req = self._new_request(PEER_FAILED_REQUEST_FILE, self._handled_peer_failed)
        if req is None:
            return
        self._handled_peer_failed = req
        self.flight_recorder("peer_failed")

    def _answer(self, req: Any) -> None:
        names = {t.ident: t for t in threading.enumerate()}
        threads = []
        for ident, frame in sys._current_frames().items():
            t = names.get(ident)
            if t is not None and t.name == HELPER_NAME:
                continue
            threads.append({"name": t.name if t else str(ident), "id": ident,
                            "main": t is threading.main_thread(),
                            "daemon": bool(t and t.daemon), "frames": _stack_frames(frame)})
        fr = self.flight_recorder("hang")
        write_json_atomic(self.dir / RANK_HANG_FILE,
                          {"request": req, "time_ns": time.time_ns(), "pid": os.getpid(),
                           "last_step": self._last_step(), "threads": threads,
                           "flight_recorder": fr})
        self.log.write(f"answered hang request {req}")

    def _last_step(self) -> int | None:
        step = getattr(getattr(self.agent, "timeline", None), "step", None)
        return step - 1 if isinstance(step, int) and step > 0 else None

    def forked(self) -> None:
        """In a forked child of the rank (a data-loader worker): disarm, so that its signals
        and crashes never write into the rank's files."""
        self._stop.set()
        try:
            if self.status["fatal"]:
                faulthandler.disable()
            for sig in (self.status["signal"], signal.SIGTERM if self.status.get("sigterm")
                        else None):
                if sig is not None:
                    faulthandler.unregister(sig)
        except Exception:  # noqa: BLE001 - nothing to harm in the child either
            pass

    def close(self) -> None:
        """At a normal exit: stop the helper, disarm, and drop the capture files left empty."""
        self._stop.set()
        if os.getpid() != self.pid:
            return
        try:
            if self.status["signal"] is not None:
                faulthandler.unregister(self.status["signal"])
                # ignored from now on, not the default (which ends the process): a watchdog
                # that asks for stacks as the job winds down (its steps stop for the timeout)
                # killed two exiting ranks of a CI job with it (exit codes -40)
                signal.signal(self.status["signal"], signal.SIG_IGN)
                self.status["signal"] = None
            if self.status.get("sigterm"):
                faulthandler.unregister(signal.SIGTERM)
        except Exception:  # noqa: BLE001
            pass
        for name, f in self._files:
            try:
                if name != FATAL_FILE:  # faulthandler still writes fatal.txt until the very end
                    f.close()
                p = self.dir / name
                if p.exists() and p.stat().st_size == 0:
                    p.unlink()
            except OSError:
                pass

def _append_line(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
