"""Warm-up steps (diagnosis/warmup.py, issue 48): a leading step that one-time work makes much
longer than the rest is named and left out; a long step without such evidence, or one only
slightly longer, is not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from uberprof.analysis.diagnosis.warmup import EVIDENCE_SCHEMA, WARMUP_RATIO, warmup_of
from uberprof.analysis.tables.schemas import RUN_STEP_SCHEMA
from uberprof.cli import main

MS = 1_000_000


def _steps(times_ms: dict[int, list[float]]) -> pa.Table:
    """Analysed steps of each rank, back to back from 0, host and device windows alike."""
    rows: list[dict[str, Any]] = []
    for rank, times in times_ms.items():
        t = 0
        for i, ms in enumerate(times):
            d = int(ms * MS)
            row: dict[str, Any] = {f: None for f in RUN_STEP_SCHEMA.names}
            row.update(rank=rank, step=i + 1, host_start_ns=t, host_end_ns=t + d,
                       device_start_ns=t, device_end_ns=t + d, window_ns=d, compute_ns=d,
                       idle_ns=0, traced=True, step_time_ns=d)
            rows.append(row)
            t += d
    return pa.Table.from_pylist(rows, schema=RUN_STEP_SCHEMA)


def _evidence(rows: list[tuple[int, int, str, float]]) -> pa.Table:
    return pa.Table.from_pylist([{"rank": r, "step": s, "cause": c, "ns": int(ms * MS)}
                                 for r, s, c, ms in rows], schema=EVIDENCE_SCHEMA)


def test_a_first_step_long_from_compilation_is_warm_up_and_left_out() -> None:
    traced = _steps({0: [900, 100, 101, 99], 1: [880, 100, 100, 100]})
    w = warmup_of(traced, _evidence([(0, 1, "compile", 790), (1, 1, "compile", 770)]), {})
    assert w.steps == [1] and w.ranks == [0, 1]
    assert w.ns == 900 * MS  # the longest rank's step
    doc = w.doc()
    assert doc is not None and doc["steps"] == [1] and doc["ms"] == 900.0
    assert doc["evidence_ms"] == {"compile": 790.0} and "compilation" in doc["why"]
    assert sorted(set(w.steady(traced).column("step").to_pylist())) == [2, 3, 4]


def test_warm_up_on_one_rank_leaves_the_step_out_on_every_rank() -> None:
    """A rank compiling while the others wait: the step is nobody's steady state."""
    traced = _steps({0: [100, 100, 100], 1: [600, 100, 100]})
    w = warmup_of(traced, _evidence([(1, 1, "cudnn", 450)]), {})
    assert w.steps == [1] and w.ranks == [1]
    assert w.steady(traced).filter(pa.compute.equal(pa.compute.field("step"), 1)).num_rows \
        == 0


def test_leading_steps_are_warm_up_while_each_qualifies() -> None:
    traced = _steps({0: [900, 400, 100, 100, 100, 800]})
    ev = _evidence([(0, 1, "compile", 700), (0, 2, "kernel_load", 250), (0, 6, "init", 700)])
    w = warmup_of(traced, ev, {})
    assert w.steps == [1, 2]  # step 6 is not leading: a later slowdown is no warm-up


def test_a_long_first_step_without_evidence_is_not_warm_up() -> None:
    traced = _steps({0: [900, 100, 100, 100]})
    assert warmup_of(traced, _evidence([(0, 1, "compile", 100)]), {}).steps == []
    assert warmup_of(traced, _evidence([]), {}).doc() is None


def test_a_step_only_slightly_longer_is_not_warm_up_whatever_its_evidence() -> None:
    just_under = 100 * WARMUP_RATIO - 1
    traced = _steps({0: [just_under, 100, 100, 100]})
    assert warmup_of(traced, _evidence([(0, 1, "compile", just_under)]), {}).steps == []


def test_at_least_one_step_stays() -> None:
    traced = _steps({0: [900, 100]})
    w = warmup_of(traced, _evidence([(0, 1, "init", 800), (0, 2, "init", 90)]), {})
    assert w.steps == [1]
    traced = _steps({0: [900]})
    assert warmup_of(traced, _evidence([(0, 1, "init", 800)]), {}).steps == []


COMPILED = Path(__file__).resolve().parents[2] / "samples" / "compile" / \
    "compiled_mlp_cpu.pt.trace.json.gz"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """A real `torch.compile` run on CPU (samples/compile/README.md): its report document and
    its terminal report."""
    out = tmp_path_factory.mktemp("compiled")
    res = CliRunner().invoke(main, ["report", str(COMPILED), "--json", "--workers", "1",
                                    "--out", str(out / "d")])
    assert res.exit_code == 0, res.output
    text = CliRunner().invoke(main, ["report", str(COMPILED), "--workers", "1",
                                     "--out", str(out / "d")], terminal_width=200)
    return json.loads(res.stdout), text.output


def test_a_compiled_models_first_step_is_warm_up_named_and_left_out(
        compiled: tuple[dict[str, Any], str]) -> None:
    """Step 0 holds Dynamo's, AOTAutograd's and Inductor's compilation (seconds); steps 1-4
    run the compiled code (about a millisecond each on an idle machine)."""
    d, text = compiled
    w = d["run"]["warmup"]
    assert w is not None and w["steps"] == [0] and w["ranks"] == [0], w
    assert w["evidence_ms"]["compile"] >= 0.5 * w["ms"]
    assert d["run"]["analysed_steps"] == [1, 2, 3, 4]
    assert d["run"]["analysed_wall_ms"] < 0.01 * w["ms"]
    assert f"warm-up: steps 0 ({w['ms']:.1f} ms), left out of every verdict: compilation" \
        in " ".join(text.split())


def test_the_operator_table_of_a_run_with_warm_up_stays_within_its_steps(
        compiled: tuple[dict[str, Any], str]) -> None:
    """The operator table was summed over every traced step, the compilation included: its
    shares are of those steps, never above 100%."""
    ops = compiled[0]["run"]["operators"]
    assert ops["rank_steps"] == 5
    assert all(0 <= o["self_pct"] <= 100 for o in ops["operators"]), ops["operators"][:2]
