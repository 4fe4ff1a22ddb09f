"""The idle and exposed_comm findings name the activity around the time they count
(`gaps.exposed_around`, `gaps.around_evidence`): on a synthetic GPU trace whose gaps and exposed
communication sit between known kernels, and on the evidence's arithmetic alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import _traces as T
from uberprof.analysis.diagnosis.advisor import diagnose
from uberprof.analysis.diagnosis.gaps import around_evidence

MM, TANH, SIG, RELU = ("void mm_kernel()", "void tanh_kernel()", "void sigmoid_kernel()",
                       "void relu_kernel()")
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _step(n: int, t0: float) -> list[dict]:
    """One 2000 µs step: mm, a 600 µs idle gap, tanh, sigmoid, an all-reduce under no compute
    (500 µs), relu; each kernel launched just before it runs."""
    c = 10 * n
    k = T.kernel
    return [
        T.step(n, t0, 2000),
        T.launch(t0 + 5, c + 1), k(t0 + 10, 190, c + 1, name=MM),  # ends at +200
        T.launch(t0 + 790, c + 2), k(t0 + 800, 100, c + 2, name=TANH),  # idle +200..+800
        T.launch(t0 + 895, c + 3), k(t0 + 900, 100, c + 3, name=SIG),  # ends at +1000
        T.launch(t0 + 995, c + 4), k(t0 + 1000, 500, c + 4, name=NCCL, stream=20),
        T.launch(t0 + 1495, c + 5), k(t0 + 1500, 400, c + 5, name=RELU),  # +1500..+1900
    ]


def test_findings_name_the_kernels_around_their_gaps_and_exposed_comm(tmp_path: Path) -> None:
    steps = 4
    ev = [e for n in range(steps) for e in _step(n, 1000.0 + 2000 * n)]
    T.write(tmp_path / "traces" / "rank-0.json", T.trace(ev, rank=0, world=1))
    d = diagnose(tmp_path / "traces", out=tmp_path / "derived")
    by_kind = {f.kind: f for f in d.findings}
    idle = by_kind["idle"].evidence["around"]
    # the 600 µs gap of each step comes after mm and ends with tanh (the step boundary's
    # 100 µs gap, relu -> next mm, is the rest)
    assert idle["before"][0]["name"] == MM and idle["after"][0]["name"] == TANH, idle
    assert idle["before"][0]["count"] == steps and idle["after"][0]["count"] == steps
    assert idle["before"][0]["ms"] == pytest.approx(steps * 0.6)
    # the sentence names kernels without `void`, template arguments and parameters
    assert idle["sentence"].startswith(f"after mm_kernel {steps}x"), idle["sentence"]
    assert f"before tanh_kernel {steps}x" in idle["sentence"]
    exposed = by_kind["exposed_comm"].evidence["around"]
    assert exposed["before"] == [{"name": SIG, "count": steps, "ms": pytest.approx(2.0),
                                  "pct": 100.0}], exposed
    assert [a["name"] for a in exposed["after"]] == [RELU]
    assert exposed["sentence"] == (f"after sigmoid_kernel {steps}x (100%); "
                                   f"before relu_kernel {steps}x (100%)")
    assert exposed["ms"] == pytest.approx(by_kind["exposed_comm"].evidence[
        "exposed_ms_all_ranks_pay"])
    # both reports print the sentence with the finding
    from uberprof.present.report_html import render_html

    page = render_html(d)
    for f in (by_kind["idle"], by_kind["exposed_comm"]):
        sentence = f.evidence["around"]["sentence"]
        assert f"around it: {sentence}" in f.evidence_sentence
        assert f"around it: {sentence}" in page


def test_around_evidence_orders_by_time_and_shares_the_counted_time() -> None:
    ev = around_evidence(["aten::item", "aten::mm", "aten::item", None],
                         ["aten::mm", "aten::mm", "aten::add", "aten::mm"],
                         [3_000_000, 4_000_000, 2_000_000, 1_000_000], [3, 1, 2, 1])
    assert ev is not None
    assert ev["before"] == [{"name": "aten::item", "count": 5, "ms": 5.0, "pct": 50.0},
                            {"name": "aten::mm", "count": 1, "ms": 4.0, "pct": 40.0}]
    assert [a["name"] for a in ev["after"]] == ["aten::mm", "aten::add"]
    assert ev["after"][0] == {"name": "aten::mm", "count": 5, "ms": 8.0, "pct": 80.0}
    assert ev["sentence"] == ("after aten::item 5x (50%), aten::mm 1x (40%); "
                              "before aten::mm 5x (80%), aten::add 2x (20%)")
    assert ev["ms"] == 10.0 and ev["stretches"] == 7


def test_around_evidence_is_none_when_nothing_was_counted() -> None:
    assert around_evidence([], [], [], []) is None
