"""The live dashboard's "record a trace" button's answers without a job (dashboards/live_trace.py):
what it says when the request cannot be made, in `uberprof trace`'s words. The running job's
side is tests/jobs/test_live_trace_button.py."""

from __future__ import annotations

from pathlib import Path

from uberprof.dashboards.live_trace import answer, layout
from uberprof.rundir import NODE_FILE, RunDir, write_json_atomic


def _text(div: object) -> str:
    children = getattr(div, "children", "")
    if isinstance(children, list):
        return " ".join(_text(c) for c in children)
    return str(children)


def _by_id(component: object) -> dict[str, object]:
    """Every component with an id under `component`."""
    out: dict[str, object] = {}
    if getattr(component, "id", None):
        out[component.id] = component  # type: ignore[attr-defined]
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        if child is not None and not isinstance(child, str | int | float):
            out.update(_by_id(child))
    return out


def test_the_button_offers_steps_and_ranks_with_uberprof_traces_default() -> None:
    parts = _by_id(layout())
    assert {"trace-button", "trace-steps", "trace-ranks", "trace-answer"} <= set(parts)
    assert parts["trace-steps"].value == 3 and parts["trace-steps"].max == 100  # type: ignore
    assert parts["trace-ranks"].value == ""  # type: ignore[attr-defined]  # every rank


def test_an_ended_job_is_the_reason_given(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.create("r1")
    node = run.claim_node_dir("n0")
    write_json_atomic(node / NODE_FILE, {"run_id": "r1", "node": "n0", "start_ns": 1,
                                         "end_ns": 2_000_000_000, "exit_code": 0})
    said = answer(run.root, 3, "")
    assert said.id == "trace-outcome" and "warn" in said.className
    assert "cannot record a trace: the job ended" in _text(said)


def test_a_folder_that_is_no_run_is_the_reason_given(tmp_path: Path) -> None:
    assert "not a uberprof run directory" in _text(answer(tmp_path, 3, None))


def test_bad_ranks_and_steps_are_said_not_raised(tmp_path: Path) -> None:
    assert "cannot ask for a trace: ranks" in _text(answer(tmp_path, 3, "1-x"))
    assert "is no number of steps" in _text(answer(tmp_path, "three", ""))
    assert "covers 1 to 100 steps, not 500" in _text(answer(tmp_path, 500, ""))
