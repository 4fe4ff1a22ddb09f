"""Deciding which processes are ranks, and wiring the rank agent into torch.

The bootstrap runs in every Python process the wrapped command starts: the torchrun launcher,
the ranks, data-loader and compile workers, helper scripts. Most of them must stay untouched.
So nothing happens until `torch` is imported; then a few cheap, inert hooks are installed, and a
process becomes a rank only when it does what only ranks do:
  - it calls `torch.distributed.init_process_group`, or
  - it completes an optimizer step, calls `uberprof.step()` or steps its own profiler.
Forked children of an active rank (data-loader workers) are made inert at fork time.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from uberprof.collect.config import ENV_NODE, ENV_RUN_DIR, CollectConfig
from uberprof.collect.rank import exits
from uberprof.collect.rank.backend import default_backend
from uberprof.collect.safety import AgentLog, swallowing
from uberprof.rundir import RunDir

log = AgentLog("rank")


class _State:
    """Module-wide state; a class so that hooks see changes made after they were installed."""

    run: RunDir | None = None
    run_id: str = ""
    node: str | None = None
    config: CollectConfig = CollectConfig()
    agent: Any = None  # RankAgent once this process is a rank
    failed = False  # activation failed (e.g. unwritable run directory): stay out of the way
    hooks_installed = False
    first_activity_ns: int | None = None
    pending_data_wait_ns = 0
    pid = os.getpid()


S = _State


def configure(run_dir: Path, run_id: str, node: str | None, config: CollectConfig) -> None:
    S.run = RunDir(Path(run_dir))
    S.run_id = run_id
    S.node = node
    S.config = config


def configure_from_env() -> bool:
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return False
    try:
        config = CollectConfig.from_env()
    except Exception as exc:  # noqa: BLE001
        log.error("reading UBERPROF_CONFIG", exc)
        return False
    configure(Path(run_dir), Path(run_dir).name, os.environ.get(ENV_NODE), config)
    return True


def install_when_torch_imported() -> None:
    """Install the hooks as soon as torch is imported (now, if it already is)."""
    if "torch" in sys.modules:
        install_hooks()
    else:
        sys.meta_path.insert(0, _TorchImportWatcher())


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Wraps the loader of `torch` so that our hooks go in right after `import torch` finishes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _AfterExecLoader(spec.loader)
        return spec


class _AfterExecLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        install_hooks()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@swallowing(log, "installing hooks")
def install_hooks() -> None:
    if S.hooks_installed:
        return
    S.hooks_installed = True
    import torch
    import torch.distributed as dist
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    register_optimizer_step_post_hook(_on_optimizer_step)
    _wrap_init_process_group(dist)
    _wrap_new_group(dist)
    _wrap_profiler(torch)
    _wrap_dataloader(_BaseDataLoaderIter)
    _watch_first_forward(torch)
    exits.install(log, on_exception=_spawned_rank_exception)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    atexit.register(_at_exit)
    _wrap_os_exit()


def _mine() -> bool:
    return os.getpid() == S.pid and not S.failed


# ---- activation ------------------------------------------------------------------------------


def _spawned_rank_exception(exc: BaseException) -> None:
    """An exception of a rank started by mp.spawn, to this process's crash capture."""
    try:
        agent = current_agent(activate=False)
        if agent is not None:
            agent.capture.exception(exc, "mp.spawn")
    except Exception as e:  # noqa: BLE001
        log.error("recording a spawned rank's exception", e)


def current_agent(activate: bool = True) -> Any:
    """The rank agent of this process, activating it if this process is a rank."""
    if S.agent is not None or S.failed or not activate or S.run is None:
        return S.agent
    try:
        from uberprof.collect.rank.agent import RankAgent

        S.agent = RankAgent(
            S.run, S.run_id, S.node, S.config, _identity(), log, S.first_activity_ns
        )
        S.agent.timeline.data_wait_ns += S.pending_data_wait_ns
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            S.agent.process_group_ready()
    except Exception as exc:  # noqa: BLE001 - e.g. unwritable run directory
        S.failed = True
        S.agent = None
        log.error("starting the rank agent (this process will not be profiled)", exc)
    return S.agent


def _identity() -> dict[str, Any]:
    env = os.environ
    ident: dict[str, Any] = {
        "rank": int(env.get("RANK", "0")),
        "local_rank": int(env["LOCAL_RANK"]) if "LOCAL_RANK" in env else None,
        "world_size": int(env.get("WORLD_SIZE", "1")),
        "local_world_size": int(env["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in env else None,
        "group_rank": int(env["GROUP_RANK"]) if "GROUP_RANK" in env else None,
        "backend": None,
        "launcher": "torchrun" if "TORCHELASTIC_RUN_ID" in env else None,
    }
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        ident["rank"] = dist.get_rank()
        ident["world_size"] = dist.get_world_size()
        ident["backend"] = default_backend(dist)
        if ident["local_rank"] is None and ident["world_size"] > 1:
            # Spawned without torchrun: assume one host unless told otherwise.
            ident["local_rank"] = ident["rank"]
    return ident


def activate_if_distributed() -> Any:
    """For `uberprof.profile()` entered after `init_process_group`: this process is a rank."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return current_agent()
    return None


def close_agent(reason: str = "exit") -> None:
    agent = S.agent
    if agent is not None and _mine():
        try:
            agent.close(reason)
        except Exception as exc:  # noqa: BLE001
            log.error("closing the rank agent", exc)


def _after_fork_in_child() -> None:
    if S.agent is not None:
        # A forked child of a rank (data-loader worker, ...) is not that rank: stay inert.
        S.agent.capture.forked()
        S.agent = None
        S.failed = True
    else:
        # Forked before anything happened (a fork-started rank): it may become a rank itself.
        S.pid = os.getpid()
        S.first_activity_ns = None
        S.pending_data_wait_ns = 0


def _at_exit() -> None:
    close_agent("exit")


def _wrap_os_exit() -> None:
    """`os._exit` skips atexit: in the rank's own process it first lets the trace in flight
    finish writing (the exporter thread would die with the process), as long as a synchronous
    export would have held the training thread. Other processes (forked workers) go straight
    through."""
    original = os._exit

    def _exit(status: int) -> NoReturn:
        _finish_trace_export()
        original(status)

    _exit.__wrapped__ = original  # type: ignore[attr-defined]
    _exit.__doc__ = original.__doc__
    os._exit = _exit


@swallowing(log, "finishing the trace export at os._exit")
def _finish_trace_export() -> None:
    agent = S.agent
    if agent is not None and _mine():
        from uberprof.collect.rank.windows import EXIT_WAIT_S

        agent.windows.wait_for_export(EXIT_WAIT_S)


# ---- hooks -----------------------------------------------------------------------------------


def _tell_agent(event: str, *args: Any) -> None:
    """Call the agent's method `event` with `args`, in this process's own rank (`_mine`) and
    once it has an agent (started on first use)."""
    if not _mine():
        return
    agent = current_agent()
    if agent is not None:
        getattr(agent, event)(*args)


@swallowing(log, "optimizer step hook")
def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _tell_agent("optimizer_stepped", optimizer)


@swallowing(log, "uberprof.step()")
def explicit_step() -> None:
    _tell_agent("explicit_step")


def _wrap_c10d(dist: Any, name: str, after: Callable[[tuple[Any, ...], dict[str, Any]], None]
               ) -> None:
    """Replace torch.distributed's `name` (in distributed_c10d, where it is defined, and in
    `dist`) by a function that calls it, then `after(args, kwargs)`."""
    import torch.distributed.distributed_c10d as c10d

    original = getattr(c10d, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        after(args, kwargs)
        return result

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__doc__ = original.__doc__
    setattr(c10d, name, wrapper)
    setattr(dist, name, wrapper)


def _wrap_init_process_group(dist: Any) -> None:
    _wrap_c10d(dist, "init_process_group", lambda args, kwargs: _process_group_ready())


@swallowing(log, "process group start-up")
def _process_group_ready() -> None:
    if not _mine():
        return
    had_agent = S.agent is not None
    agent = current_agent()
    if agent is not None and had_agent:
        agent.process_group_ready()


def _wrap_new_group(dist: Any) -> None:
    _wrap_c10d(dist, "new_group", lambda args, kwargs: _record_group(
        kwargs.get("ranks", args[0] if args else None), kwargs.get("backend")))


@swallowing(log, "new_group hook")
def _record_group(ranks: Any, backend: Any) -> None:
    if _mine() and S.agent is not None:
        S.agent.new_group(ranks, backend)


def _wrap_profiler(torch: Any) -> None:
    from torch.autograd import profiler as autograd_profiler
    from torch.profiler import profile

    from uberprof.collect.rank.windows import is_own_profiler

    original_start = profile.start
    original_step = profile.step
    original_legacy_enter = autograd_profiler.profile.__enter__

    def start(self: Any) -> None:
        if not is_own_profiler(self):
            _user_profiler_started()
        return original_start(self)

    def step(self: Any) -> None:
        if not is_own_profiler(self):
            _user_profiler_stepped()
        return original_step(self)

    def legacy_enter(self: Any) -> Any:
        _user_profiler_started()
        return original_legacy_enter(self)

    profile.start = start
    profile.step = step
    autograd_profiler.profile.__enter__ = legacy_enter


@swallowing(log, "profiler start hook")
def _user_profiler_started() -> None:
    _tell_agent("user_profiler_started")


@swallowing(log, "profiler step hook")
def _user_profiler_stepped() -> None:
    _tell_agent("profiler_stepped")


def _wrap_dataloader(iter_cls: Any) -> None:
    original = iter_cls.__next__
    perf = time.perf_counter_ns

    def __next__(self: Any) -> Any:
        t0 = perf()
        try:
            return original(self)
        finally:
            t1 = perf()
            _data_waited(t0, t1)

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    iter_cls.__next__ = __next__


def _data_waited(t0: int, t1: int) -> None:
    try:
        if os.getpid() != S.pid or S.failed:
            return
        if S.first_activity_ns is None:
            _first_activity(time.time_ns() - (t1 - t0))
        agent = S.agent
        if agent is None:
            S.pending_data_wait_ns += t1 - t0
        else:
            agent.data_waited(t1 - t0, time.time_ns(), time.perf_counter_ns() - t1)
    except Exception as exc:  # noqa: BLE001
        log.error("data loader hook", exc)


def _first_activity(t_ns: int) -> None:
    """Step 0 starts here, also when the agent started earlier (at init_process_group)."""
    S.first_activity_ns = t_ns
    if S.agent is not None:
        S.agent.timeline.first_activity(t_ns)


def _watch_first_forward(torch: Any) -> None:
    """Step 0 starts at the first forward pass or batch, seen by a global forward pre-hook that
    removes itself on first use. `torch.compile(module)` warns when global module hooks exist,
    so compiling removes it first and watches the compiled module with a hook of its own."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    handles: list[Any] = []

    def first_forward(module: Any, args: Any) -> None:
        for h in handles:
            h.remove()
        if os.getpid() == S.pid and S.first_activity_ns is None:
            _first_activity(time.time_ns())
        return

    handles.append(register_module_forward_pre_hook(first_forward))
    compile_ = getattr(torch, "compile", None)
    if compile_ is None:
        return

    @functools.wraps(compile_)
    def compile_watching(*args: Any, **kwargs: Any) -> Any:
        for h in handles:
            h.remove()
        compiled = compile_(*args, **kwargs)
        if S.first_activity_ns is None and isinstance(compiled, torch.nn.Module):
            try:  # on the wrapper: its hooks run outside the compiled code
                handles.append(compiled.register_forward_pre_hook(first_forward))
            except Exception as exc:  # noqa: BLE001
                log.write(f"watching the first forward of a compiled module: {exc!r}")
        return compiled

    torch.compile = compile_watching
