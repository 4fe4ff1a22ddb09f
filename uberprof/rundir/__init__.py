"""The run directory: its layout and atomic writes (`layout`), and reading it back (`ranks`,
`nodes`, `counters`).

The collect side writes a run through `layout`; every other part reads it through this
package, never through `uberprof.collect` (tests/test_architecture.py holds that rule).
`counters` needs pyarrow and is imported on its own (`from uberprof.rundir.counters import
...`), so that the rank side, which imports this package, stays on the standard library.
"""

from uberprof.rundir._checked import is_utf8, shown
from uberprof.rundir.layout import (
    CALIBRATION_FILE,
    COUNTERS_DIR,
    COUNTERS_INDEX,
    COUNTERS_META,
    COUNTERS_SUFFIX,
    DERIVED_DIR,
    FORMAT_VERSION,
    LOG_FILE,
    NODE_FILE,
    RANK_FILE,
    RUN_FILE,
    STEPS_FILE,
    TRACES_DIR,
    RunDir,
    as_run_dir,
    claim_dir,
    parse_rank_dir_name,
    parse_trace_file_name,
    read_json,
    read_jsonl,
    trace_file_name,
    write_json_atomic,
)
from uberprof.rundir.nodes import NodeMeta, list_nodes, read_node
from uberprof.rundir.ranks import (
    MAX_RANKS,
    RankMeta,
    StepTimeline,
    folder_problems,
    list_ranks,
    ranks_by_id,
    read_rank,
    read_step_timeline,
    read_steps,
    step_row_problem,
    trace_windows,
)

__all__ = [
    "CALIBRATION_FILE",
    "COUNTERS_DIR",
    "COUNTERS_INDEX",
    "COUNTERS_META",
    "COUNTERS_SUFFIX",
    "DERIVED_DIR",
    "FORMAT_VERSION",
    "LOG_FILE",
    "MAX_RANKS",
    "NODE_FILE",
    "RANK_FILE",
    "RUN_FILE",
    "STEPS_FILE",
    "TRACES_DIR",
    "NodeMeta",
    "RankMeta",
    "RunDir",
    "StepTimeline",
    "as_run_dir",
    "claim_dir",
    "folder_problems",
    "is_utf8",
    "list_nodes",
    "list_ranks",
    "parse_rank_dir_name",
    "parse_trace_file_name",
    "ranks_by_id",
    "read_json",
    "read_jsonl",
    "read_node",
    "read_rank",
    "read_step_timeline",
    "read_steps",
    "shown",
    "step_row_problem",
    "trace_file_name",
    "trace_windows",
    "write_json_atomic",
]
