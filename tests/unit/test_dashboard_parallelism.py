"""The dashboard's `/parallelism` page without a browser: its layout for run documents of a
pipeline, a tensor parallel x FSDP2 mesh, a data-parallel job and a diagnosis saved without the
parallelism keys. Each document is the synthetic 8-rank run's diagnosis with its `run` keys
replaced by those of a real job (`uberprof report --json` of samples/train_pipeline.py and
samples/train_2d.py on CPU), so the page reads them through `RunData` as it does in use."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_dashboard import _client, _component, _ids, _route, _text, synth_run  # noqa: F401
from uberprof.analysis.diagnosis.model import Finding

# `uberprof report --json` of a 2-rank 1F1B pipeline whose stage 1 computes twice as much.
PIPE_RUN: dict[str, Any] = {
    "parallelism": {
        "kinds": ["pp"], "summary": "pipeline (2 stages, 1F1B, 8 micro-batches)", "dims": {},
        "groups": {"pp": [[0, 1]]}, "stage_of": {"0": 0, "1": 1},
        "evidence": {"pp": "point-to-point send/recv on 2 of 2 rank(s)"}, "ranks_read": 2},
    "pipeline": {
        "stages": 2, "microbatches": 8, "schedule": "1f1b", "schedule_words": "1F1B",
        "steps": 10, "ideal_bubble_pct": 11.1, "slowest_stage": 1,
        "per_stage": [
            {"stage": 0, "ranks": [0], "compute_ms": 119.735, "step_ms": 362.397,
             "wait_prev_ms": 0.0, "wait_next_ms": 177.675, "rest_ms": 64.987, "bubble_pct": 67.0,
             "slowest_in_steps": 0},
            {"stage": 1, "ranks": [1], "compute_ms": 232.871, "step_ms": 359.416,
             "wait_prev_ms": 0.0, "wait_next_ms": 0.0, "rest_ms": 126.545, "bubble_pct": 35.2,
             "slowest_in_steps": 10}]},
    "comm_by_group": [],
    "p2p": {"pairs": 160, "unmatched_calls": 0, "unmatched_examples": [], "by_direction": [
        {"src": 0, "dst": 1, "transfers": 80, "bytes": 32768, "wait_ms": 33.748,
         "transfer_ms": 115.511, "unsplittable": 0, "effective_gbit_s": 1.367},
        {"src": 1, "dst": 0, "transfers": 80, "bytes": 32768, "wait_ms": 1763.088,
         "transfer_ms": 69.699, "unsplittable": 0, "effective_gbit_s": 1.298}]},
}
IMBALANCE = Finding(
    kind="pipeline_imbalance", severity="high",
    title="Pipeline stage 1 is the slowest: 232.871 ms of compute per step against a mean of "
          "176.303 ms", ranks=[1], steps=[], cause=None, time_at_stake_ms=873.076,
    evidence={"slowest_stage": 1, "ranks": [1]},
    remedy="Rebalance the stages: move layers from the slowest stage to its neighbours.")

# A 2x2 tensor parallel x FSDP2 mesh (samples/train_2d.py --layout fsdp_tp).
MESH_RUN: dict[str, Any] = {
    "parallelism": {
        "kinds": ["tp", "fsdp2"], "summary": "tensor parallel (2) x FSDP2 (2)",
        "dims": {"dp": 2, "tp": 2},
        "groups": {"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]], "fsdp2": [[0, 2], [1, 3]]},
        "stage_of": {}, "evidence": {
            "dp": "mesh dimension 'dp' of size 2",
            "tp": "mesh dimension 'tp'; functional collectives on 4 of 4 rank(s)",
            "fsdp2": "FSDP:: annotations (fully_shard) on 4 of 4 rank(s)"}},
    "pipeline": None,
    "comm_by_group": [
        {"group": "1", "dim": "dp", "ranks": [0, 2], "collectives": {"allgather": 60},
         "time_ms": 774.986, "exposed_ms": 380.995, "exposed_pct_of_wall": 8.9},
        {"group": "4", "dim": "tp", "ranks": [2, 3], "collectives": {"allreduce": 120},
         "time_ms": 859.778, "exposed_ms": 828.362, "exposed_pct_of_wall": 19.3}],
    "p2p": {"pairs": 0, "unmatched_calls": 0, "unmatched_examples": [], "by_direction": []},
}
TP_FINDING = Finding(
    kind="tp_exposed_comm", severity="low",
    title="Tensor-parallel communication may be part of the exposed communication",
    ranks=[0, 1, 2, 3], steps=[], cause=None, time_at_stake_ms=0.0, evidence={},
    remedy="Tensor parallel: use sequence parallelism (SequenceParallel for the norms).")

DDP_RUN: dict[str, Any] = {
    "parallelism": {"kinds": ["ddp"], "summary": "DDP (8)", "dims": {},
                    "groups": {"ddp": [list(range(8))]}, "stage_of": {},
                    "evidence": {"ddp": "DistributedDataParallel.forward annotations on 8 of "
                                        "8 rank(s)"}},
    "pipeline": None,
    "comm_by_group": [{"group": "0", "dim": "world", "ranks": list(range(8)),
                       "collectives": {"allreduce": 12}, "time_ms": 196.9, "exposed_ms": 78.5,
                       "exposed_pct_of_wall": 21.0}],
    "p2p": {"pairs": 0, "unmatched_calls": 0, "unmatched_examples": [], "by_direction": []},
}


@pytest.fixture(scope="module")
def opened(synth_run: Path) -> Any:  # noqa: F811
    from uberprof.analysis import read

    return read.open_run(synth_run, workers=1)


def _data(opened: Any, run: dict[str, Any], findings: list[Finding] | None = None,
          drop: tuple[str, ...] = ()) -> Any:
    """The dashboard's RunData of the synthetic run with its diagnosis's `run` document
    updated by `run` (less the keys in `drop`), and `findings` in place of its own."""
    from uberprof.dashboards.data import RunData

    d = opened.diagnosis
    doc = {k: v for k, v in {**d.run, **copy.deepcopy(run)}.items() if k not in drop}
    diag = dataclasses.replace(d, run=doc, findings=list(findings or []))
    return RunData.of(dataclasses.replace(opened, diagnosis=diag), workers=1)


def _layout(data: Any) -> Any:
    from uberprof.dashboards.pages import parallelism
    from uberprof.dashboards.ui import Selection

    return parallelism.layout(data, Selection())


def _figure(layout: Any, graph_id: str) -> Any:
    return _component(layout, graph_id).figure


def test_pipeline_page_shows_each_stage_its_waits_and_names_stage_1_slowest(opened: Any
                                                                            ) -> None:
    layout = _layout(_data(opened, PIPE_RUN, [IMBALANCE]))
    ids = _ids(layout)
    assert {"parallelism-line", "parallelism-evidence", "pipeline-cards", "stage-table",
            "stage-breakdown", "pipeline-ideal", "p2p-waits", "parallelism-findings"} <= ids
    assert "parallelism-plain" not in ids and "group-comm" not in ids  # no collective groups
    text = _text(layout)
    assert "pipeline (2 stages, 1F1B, 8 micro-batches)" in text
    assert "ideal bubble 11.1% of the step" in text and "m = 8" in text
    assert "stage 0" in text and "stage 1 ◀ slowest" in text
    assert "177.7" in text  # stage 0 waits on the next stage
    assert IMBALANCE.remedy in text

    stages = _figure(layout, "stage-breakdown")
    parts = {t.name: list(t.y) for t in stages.data}
    assert list(parts) == ["compute", "waiting on the previous stage",
                           "waiting on the next stage", "rest of the step"]
    assert parts["compute"] == [119.735, 232.871]
    assert parts["waiting on the next stage"] == [177.675, 0.0]
    assert parts["rest of the step"][0] == pytest.approx(362.397 - 119.735 - 177.675)
    assert "slowest" in stages.data[0].x[1] and "slowest" not in stages.data[0].x[0]

    waits = _figure(layout, "p2p-waits").data[0]
    assert list(waits.y) == ["stage 0 (rank 0) waits on stage 1 (rank 1)",
                             "stage 1 (rank 1) waits on stage 0 (rank 0)"]
    assert list(waits.x) == [1763.088, 33.748]


def test_pipeline_without_the_finding_names_the_stage_slowest_in_most_steps(opened: Any
                                                                           ) -> None:
    from uberprof.dashboards.queries import parallelism as q

    data = _data(opened, PIPE_RUN)
    assert q.slowest_stage(data) == 1 and q.findings(data) == []
    assert "parallelism-findings" not in _ids(_layout(data))


def test_mesh_page_labels_each_group_by_dim_and_ranks_most_exposed_first(opened: Any) -> None:
    layout = _layout(_data(opened, MESH_RUN, [TP_FINDING]))
    ids = _ids(layout)
    assert {"group-comm", "group-table", "parallelism-findings"} <= ids
    assert not {"stage-table", "p2p-waits", "parallelism-plain"} & ids
    bars = _figure(layout, "group-comm").data[0]
    assert list(bars.y) == ["tp · ranks 2,3", "dp · ranks 0,2"]
    assert list(bars.x) == [19.3, 8.9]
    text = _text(layout)
    assert "tp size 2" in text and "{0,1} {2,3}" in text and TP_FINDING.remedy in text


def test_data_parallel_page_says_it_reads_as_data_parallel_and_draws_nothing_else(
        opened: Any) -> None:
    layout = _layout(_data(opened, DDP_RUN))
    ids = _ids(layout)
    assert "parallelism-plain" in ids
    assert not {"stage-table", "stage-breakdown", "p2p-waits", "group-comm"} & ids
    assert "This job reads as data-parallel (DDP (8))" in _text(layout)


def test_a_diagnosis_without_the_parallelism_keys_says_so_and_breaks_nothing(opened: Any
                                                                           ) -> None:
    data = _data(opened, {}, drop=("parallelism", "pipeline", "comm_by_group", "p2p"))
    layout = _layout(data)
    assert "parallelism-none" in _ids(layout) and "page-error" not in _ids(layout)
    assert "run `uberprof report` on the run again" in _text(layout)


def test_the_page_is_routed_and_in_the_navigation(opened: Any) -> None:
    status, body = _route(_client(_data(opened, PIPE_RUN, [IMBALANCE])), "/parallelism", "")
    assert status == 200 and "page-parallelism" in body and "nav-parallelism" in body
    assert "stage-table" in body and "This page failed" not in body
