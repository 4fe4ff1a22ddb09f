"""The demo sample's --fault-steps (samples/train_ddp.py): a fault only on the steps named, so
that a problem and its fix can be measured inside one job (benchmarks/whatif.py --in-job)."""

from __future__ import annotations

import sys

import pytest

from tests._jobs import ROOT, load_script

sys.path.insert(0, str(ROOT / "samples"))  # the sample imports its siblings by name
T = load_script(ROOT / "samples" / "train_ddp.py", "_train_ddp_sample")


def test_fault_steps_read_ranges_and_single_steps() -> None:
    args = T.parse_args(["--fault-steps", "1,4-6,9"])
    assert args.fault_steps == {1, 4, 5, 6, 9}
    assert T.parse_args([]).fault_steps is None


@pytest.mark.parametrize("bad", ["x", "5-3", "-2", "1,x"])
def test_fault_steps_refuse_what_is_not_a_step_range(bad: str) -> None:
    with pytest.raises(SystemExit):
        T.parse_args(["--fault-steps", bad])


def test_the_slow_loader_waits_only_for_the_samples_of_the_faulty_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[int] = []
    data = T.SyntheticTokens(8, 4, 10, 0.5, delayed={1, 3}, per_step=2)
    for i in range(len(data)):
        monkeypatch.setattr(T.time, "sleep", lambda s, i=i: slept.append(i))
        data[i]
    assert slept == [2, 3, 6, 7]  # steps 1 and 3, two samples each


def test_link_rates_change_the_nodes_tc_rate_only_when_the_step_kind_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(T.subprocess, "run", lambda argv, **kw: calls.append(argv))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "vnode0")
    shaper = T.LinkShaper.from_option("1gbit,4gbit")
    for slow in (True, True, False, False, True):
        shaper.set(slow)
    assert [c[c.index("rate") + 1] for c in calls] == ["1gbit", "4gbit", "1gbit"]
    assert all(c[:5] == ["tc", "qdisc", "change", "dev", "vnode0"] for c in calls)
    assert T.LinkShaper.from_option(None) is None


def test_link_rates_refuse_a_node_without_its_interface_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with pytest.raises(SystemExit, match="GLOO_SOCKET_IFNAME"):
        T.LinkShaper.from_option("1gbit,4gbit")


P = load_script(ROOT / "samples" / "train_pipeline.py", "_train_pipeline_sample")
TINY = ["--dim", "16", "--heads", "2", "--seq", "4", "--vocab", "11", "--batch", "4",
        "--heavy-stage", "1", "--heavy-factor", "3"]  # stages of 2 + 6 blocks, 4 + 4 balanced


def _pipeline_args(*extra: str) -> object:
    p = P.base_parser(None)
    P.add_pipeline_options(p)
    args = p.parse_args([*TINY, *extra])
    P.check_pipeline_options(p, args, 2)
    return args


def test_a_pipeline_stage_with_fault_steps_holds_both_splits_and_trains_the_blocks_it_runs(
        ) -> None:
    args = _pipeline_args("--fault-steps", "0,2")
    heavy, light = P.StageModule(args, 1, 2), P.StageModule(args, 0, 2)
    assert (len(heavy.blocks), heavy.active) == (6, 6) and (len(light.blocks), light.active) \
        == (4, 2)
    heavy.active = 4  # a balanced step: the heavy stage runs 4 of its 6
    heavy(P.torch.randn(4, 4, 16)).sum().backward()
    grads = [all(q.grad is not None for q in b.parameters()) for b in heavy.blocks]
    assert grads == [True] * 4 + [False] * 2  # the optimizer skips what did not run


def test_pipeline_steps_alternate_the_split_on_the_fault_steps() -> None:
    args = _pipeline_args("--fault-steps", "1,3", "--steps", "4")
    module, seen = P.StageModule(args, 0, 2), []

    class Schedule:  # stands for the pipelining schedule: records the blocks each step runs
        def step(self, *a: object, **k: object) -> None:
            seen.append(module.active)

    P.train_steps(args, module, Schedule(), 0, 2, replica=0)
    assert seen == [4, 2, 4, 2]  # balanced 4 + 4, the heavy split's 2 on steps 1 and 3


def test_pipeline_fault_steps_need_a_split_that_shares_evenly(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _pipeline_args("--fault-steps", "0", "--heavy-factor", "1.5")  # 3 + 2 blocks
    assert "share evenly (5 over 2 stages)" in capsys.readouterr().err
