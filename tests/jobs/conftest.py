"""The real runs that several test files of tests/jobs/ read, registered here once.

pytest keeps a fixture per place it is defined, and a fixture imported into a test module is
defined in that module: a session-scoped run imported by six files ran six times (about 14
extra jobs a suite). Registered in this conftest, each runs once per session; test files name
the fixture as an argument and import nothing of it (a test file that imports one is refused at
collection). A test that changes a run works on its own copy (`tests/_made_once.copy_run`).

Under pytest-xdist (`make test` runs this folder on JOBS_WORKERS processes, `--dist loadfile`:
a file's module-scoped runs stay on one worker) each shared run is still made once, by the first
worker that needs it, and read by the others (tests/_made_once.py). About half of this
folder's time is waiting (hang timeouts, browsers, jobs starting), which the second worker
fills."""

from __future__ import annotations

import pytest

from tests._diag_runs import (
    healthy_run,
    logging_run,
    sleeping_rank_run,
    slow_compute_run,
    slow_data_run,
)
from tests._export_traces import counters_run
from tests._parallel_runs import (
    fsdp2_run,
    fsdp_tp_run,
    moe_plain_run,
    moe_run,
    pipeline_run,
    pp_dp_run,
    tp_run,
)
from tests._runs import ddp_runs, modules_memory_run, short_ddp_run

SHARED = {f.__name__: f for f in (healthy_run, logging_run, sleeping_rank_run, slow_compute_run,
                                  slow_data_run, counters_run, tp_run, fsdp2_run, pipeline_run,
                                  pp_dp_run, fsdp_tp_run, ddp_runs, short_ddp_run,
                                  modules_memory_run, moe_run, moe_plain_run)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test module that imports a shared run: it would make that run again."""
    again: set[str] = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        for name, fixture in SHARED.items():
            if getattr(module, name, None) is fixture:
                again.add(f"{item.path.name} imports {name}")
    if again:
        raise pytest.UsageError(
            "a shared run imported into a test module runs again for that module; name it as "
            "an argument only (tests/jobs/conftest.py provides it): " + ", ".join(sorted(again)))
