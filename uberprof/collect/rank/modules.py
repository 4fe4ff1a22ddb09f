"""`uberprof run --modules`: nn.Module boundaries as `module::<path>` spans in trace windows.

torch.profiler's traces name operators, not the model's modules (its `with_modules` and
`nn.Module: ...` events come only with Python stacks, and name classes, not paths). With
`--modules` a trace window also records one span per module call, named by the module's
qualified path in its model (`module::encoder.layers.0.self_attn`), which the analysis turns
into the module table (`analysis/tables/modules.py`).

Cost is kept to the windows: the global forward pre- and post-hooks are registered when a
window starts and removed when it stops, so between windows the model runs exactly as without
uberprof (no global hook for `torch.compile` or `Module.__call__`'s slow path to see). Inside a
window each module call costs two Python hooks and a C++ record function
(`torch._C._profiler._RecordFunctionFast`, about 1 us a span, where the dispatcher's
`record_function` ops cost 20-45 us). Names come from the outermost module called (the root:
its `named_modules()`, found on its first call, wrappers such as DistributedDataParallel,
FullyShardedDataParallel and torch.compile's OptimizedModule left out of the paths); a module
no root holds is a root of its own, named by its class.

Forward only: backward is not marked. Module backward hooks (`register_full_backward_hook`)
wrap every module's inputs and outputs in an autograd function, which costs on every call (a
traced step of the sample 1.23x, `benchmarks/module_backward.py`) and breaks in-place operations
on module outputs in user code (docs/modules.md); the backward's operators remain in the
operator table (`autograd::engine::evaluate_function: ...`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from uberprof.collect.safety import AgentLog

__all__ = ["PREFIX", "ModuleMarks", "module_paths"]

PREFIX = "module::"
# Wrappers and the attribute that holds the model they wrap: left out of the paths, so a
# module's path is the wrapped model's, as the user names it.
_WRAPPED = {"DistributedDataParallel": "module", "DataParallel": "module",
            "FullyShardedDataParallel": "_fsdp_wrapped_module",
            "CheckpointWrapper": "_checkpoint_wrapped_module", "OptimizedModule": "_orig_mod"}


def module_paths(root: Any) -> dict[Any, str]:
    """Module -> its path under `root` as the user writes it (`encoder.layers.0`); the root,
    and a model a wrapper holds at the top, by class name."""
    out: dict[Any, str] = {}

    def walk(m: Any, path: str) -> None:
        if m in out:
            return
        out[m] = path or type(m).__name__
        inner = _WRAPPED.get(type(m).__name__)
        for name, child in m.named_children():
            walk(child, path if name == inner else f"{path}.{name}" if path else name)

    walk(root, "")
    return out


class ModuleMarks:
    """The global module hooks of one rank, registered for the duration of a trace window."""

    def __init__(self, log: AgentLog) -> None:
        self._log = log
        self._handles: list[Any] = []
        self._names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._failed = False

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def start(self) -> None:
        """Register the hooks (at a window's start)."""
        if self._handles or self._failed:
            return
        try:
            self._register()
        except Exception as exc:  # noqa: BLE001 - the window goes on without module spans
            self._failed = True
            self._log.error("registering the module hooks (--modules)", exc)

    def stop(self) -> None:
        """Close the spans still open on this thread and remove the hooks (before the
        profiler stops)."""
        stack = getattr(self._local, "stack", None)
        while stack:
            _, rf = stack.pop()
            try:
                rf.__exit__(None, None, None)
            except Exception:  # noqa: BLE001, S110 - a span the profiler already closed
                pass
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._local = threading.local()  # other threads' stacks die with the window

    def _register(self) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        fast = _span_factory()
        names, local = self._names, self._local

        def pre(module: Any, args: Any) -> None:
            try:
                name = names.get(module)
                if name is None:
                    name = self._name(module)
                stack = getattr(local, "stack", None)
                if stack is None:
                    stack = local.stack = []
                rf = fast(PREFIX + name)
                rf.__enter__()
                stack.append((module, rf))
            except Exception as exc:  # noqa: BLE001 - never into the user's forward
                self._give_up(exc)

        def post(module: Any, args: Any, output: Any) -> None:
            stack = getattr(local, "stack", None)
            if not stack:
                return
            try:
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i][0] is module:
                        while len(stack) > i:  # inner spans a raised exception left open
                            stack.pop()[1].__exit__(None, None, None)
                        return
            except Exception as exc:  # noqa: BLE001
                self._give_up(exc)

        self._handles.append(register_module_forward_pre_hook(pre))
        self._handles.append(register_module_forward_hook(post, always_call=True))

    def _name(self, module: Any) -> str:
        """Name `module`: under the outermost module open on this thread when that root holds
        it (scanned again: modules added since), else as a root of its own."""
        stack = getattr(self._local, "stack", None)
        if stack:
            outer = stack[0][0]
            paths = module_paths(outer)
            if module in paths:
                for m, p in paths.items():
                    self._names.setdefault(m, p)
                return self._names[module]
        for m, p in module_paths(module).items():
            self._names[m] = p  # a larger root names its submodules again, fully
        return self._names[module]

    def _give_up(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self._log.error("module hook (--modules); module spans stop here", exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _span_factory() -> Any:
    """A record-function context manager class: the C++ one where torch has it."""
    try:
        from torch._C._profiler import _RecordFunctionFast

        return _RecordFunctionFast
    except ImportError:
        import torch

        return torch.profiler.record_function
