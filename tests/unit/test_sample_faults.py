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
