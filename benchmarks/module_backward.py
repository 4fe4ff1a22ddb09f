"""Could `uberprof run --modules` also mark each module's backward? What it would cost and
whether it is safe, measured in one process on one thread (no job):

    python benchmarks/module_backward.py [--rounds 10] [--steps 8]

1. The sample's model (samples/train_ddp.py's TinyTransformer at its default sizes) trains steps
   (forward, backward, SGD) under torch.profiler, rounds alternating between `--modules`' own
   forward marks (`collect/rank/modules.py`) and the same plus global full backward hooks
   (`register_module_full_backward_pre_hook` / `register_module_full_backward_hook`, each
   opening or closing a `module::<path>.backward` C++ record function): the thread's CPU time
   per step, as a ratio with its 95% interval.
2. The cost per module call where little else runs: 500 `nn.Linear(8, 8)` in a row, forward
   and backward, with and without the backward hooks.
3. Whether models that work without them still work with them: in-place operations on a
   module's output (`nn.ReLU(inplace=True)` after a layer, as torchvision's ResNets do, and a
   user's `y.add_(1)`).

docs/modules.md reports the figures and the decision.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead import SAMPLE, ratio_interval


def backward_hooks() -> list[Any]:
    """Global full backward hooks that mark each module's backward with a record function, as
    `--modules` would (the span opened when the module's output gradient is ready, closed when
    its input gradient is)."""
    import torch
    from torch.nn.modules import module as M

    fast = torch._C._profiler._RecordFunctionFast
    open_spans: dict[int, Any] = {}

    def pre(module: Any, grad_output: Any) -> None:
        rf = fast(f"module::{type(module).__name__}.backward")
        rf.__enter__()
        open_spans[id(module)] = rf

    def post(module: Any, grad_input: Any, grad_output: Any) -> None:
        rf = open_spans.pop(id(module), None)
        if rf is not None:
            rf.__exit__(None, None, None)

    return [M.register_module_full_backward_pre_hook(pre),
            M.register_module_full_backward_hook(post)]


def interleaved(rounds: int, run: Callable[[bool], float]) -> dict[bool, list[float]]:
    per: dict[bool, list[float]] = {False: [], True: []}
    run(False)
    run(True)
    for i in range(rounds):
        for hooks in ((False, True) if i % 2 == 0 else (True, False)):
            per[hooks].append(run(hooks))
    return per


def sample_steps(args: argparse.Namespace) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from uberprof.collect.rank.modules import ModuleMarks
    from uberprof.collect.safety import AgentLog

    spec = importlib.util.spec_from_file_location("train_ddp", SAMPLE)
    sample = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(sample)  # type: ignore[union-attr]
    a = sample.parse_args([])
    model = sample.TinyTransformer(a.vocab, a.dim, a.layers, a.heads, a.seq)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randint(0, a.vocab, (a.batch, a.seq))
    loss_fn = torch.nn.CrossEntropyLoss()
    calls = sum(1 for _ in model.modules()) + 1
    marks = ModuleMarks(AgentLog("benchmark"))

    def run(backward: bool) -> float:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            marks.start()
            handles = backward_hooks() if backward else []
            t0 = time.thread_time()
            for _ in range(args.steps):
                loss_fn(model(x).flatten(0, 1), x.flatten()).backward()
                opt.step()
                opt.zero_grad()
            t = (time.thread_time() - t0) / args.steps
            for h in handles:
                h.remove()
            marks.stop()
        return t

    per = interleaved(args.rounds, run)
    r, lo, hi = ratio_interval(per[True], per[False])
    extra = statistics.median(per[True]) - statistics.median(per[False])
    print(f"sample model, {calls} module calls per step: step CPU time "
          f"{statistics.median(per[False]) * 1e3:.2f} ms with --modules' forward marks, "
          f"{statistics.median(per[True]) * 1e3:.2f} ms with backward marks too: {r:.3f} "
          f"(95% interval {lo:.3f}-{hi:.3f}, {args.rounds} rounds); "
          f"{extra * 1e6 / calls:.1f} µs per module call")


def per_call(args: argparse.Namespace) -> None:
    import torch

    model = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(500)))
    x = torch.randn(4, 8, requires_grad=True)

    def run(backward: bool) -> float:
        handles = backward_hooks() if backward else []
        t0 = time.thread_time()
        for _ in range(args.steps):
            model(x).sum().backward()
        t = (time.thread_time() - t0) / (args.steps * 500)
        for h in handles:
            h.remove()
        return t

    per = interleaved(args.rounds, run)
    print(f"per module call (500 nn.Linear(8, 8), forward and backward): "
          f"{statistics.median(per[False]) * 1e6:.1f} µs without backward hooks, "
          f"{statistics.median(per[True]) * 1e6:.1f} µs with")


def in_place() -> None:
    import torch
    from torch import nn

    def relu_inplace() -> None:
        m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 1))
        m(torch.randn(2, 8)).sum().backward()

    def user_add() -> None:
        m = nn.Linear(8, 8)
        y = m(torch.randn(2, 8))
        y.add_(1)
        y.sum().backward()

    for name, f in (("nn.ReLU(inplace=True) after nn.Linear", relu_inplace),
                    ("y = linear(x); y.add_(1)", user_add)):
        f()  # works without the hooks
        handles = backward_hooks()
        try:
            f()
            print(f"{name}: works with backward hooks")
        except RuntimeError as exc:
            print(f"{name}: FAILS with backward hooks: {str(exc).splitlines()[0][:120]}")
        finally:
            for h in handles:
                h.remove()


def main() -> None:
    import warnings

    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    sample_steps(args)
    per_call(args)
    in_place()


if __name__ == "__main__":
    main()
