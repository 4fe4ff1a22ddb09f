"""What is damaged among a run's files besides its rank folders and step timelines: run.json,
each node's node.json, each rank's flight-recorder.jsonl and the counters' Arrow streams.

Worded once, here, so that every command that reads a run (`info`, `analyze`, `report`,
`export`, `diff`, the dashboard) names the same files with the same words; each reader goes on
with what it could read. Imports pyarrow (the counters), so it is imported on its own, like
`uberprof.rundir.counters`.
"""

from __future__ import annotations

from pathlib import Path

from uberprof.rundir.counters import counter_file_problems
from uberprof.rundir.flight_log import flight_log_problem
from uberprof.rundir.layout import RunDir, as_run_dir
from uberprof.rundir.nodes import metadata_problems
from uberprof.rundir.ranks import ranks_by_id

__all__ = ["damage_problems", "data_file_problems"]


def data_file_problems(run: RunDir | Path | str) -> list[str]:
    """The lines naming damaged Flight Recorder logs (of the ranks read: one folder per rank)
    and counters files: what `info` adds to its own lines about run.json and node.json."""
    run = as_run_dir(run)
    flight = [p for m in ranks_by_id(run).values()
              if (p := flight_log_problem(m.folder)) is not None]
    return flight + counter_file_problems(run)


def damage_problems(run: RunDir | Path | str) -> list[str]:
    """Every line about damaged run-level files: run.json and node.json
    (`nodes.metadata_problems`), then `data_file_problems`."""
    return metadata_problems(run) + data_file_problems(run)
