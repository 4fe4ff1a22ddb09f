"""The real runs that several test files of tests/jobs/ read, registered here once.

pytest keeps a fixture per place it is defined, and a fixture imported into a test module is
defined in that module: a session-scoped run imported by six files ran six times (about 14
extra jobs a suite). Registered in this conftest, each runs once per session; test files name
the fixture as an argument and import nothing of it (a test file that imports one is refused at
collection). A test that changes a run works on its own copy (shutil.copytree, as they do).

Under pytest-xdist (`make test` runs this folder on JOBS_WORKERS processes, `--dist loadgroup`)
every file that uses a shared run is in one group, so each shared run is still made once, on
one worker; any other file is a group of its own, beside it (its module-scoped runs stay single
too). About half of this folder's time is waiting (hang timeouts, browsers, jobs starting),
which the second worker fills."""

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
from tests._parallel_runs import fsdp2_run, fsdp_tp_run, pipeline_run, pp_dp_run, tp_run
from tests._runs import ddp_runs, modules_memory_run, short_ddp_run

SHARED = {f.__name__: f for f in (healthy_run, logging_run, sleeping_rank_run, slow_compute_run,
                                  slow_data_run, counters_run, tp_run, fsdp2_run, pipeline_run,
                                  pp_dp_run, fsdp_tp_run, ddp_runs, short_ddp_run,
                                  modules_memory_run)}


SHARED_GROUP = "shared-runs"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test module that imports a shared run: it would make that run again. Group the
    tests for pytest-xdist (module docstring): a file that uses a shared run goes whole to the
    shared group (its own module-scoped fixtures stay on one worker), any other file is a group
    of its own. First of the hooks: xdist's own reads the groups into the tests' ids (run after
    it, the groups were ignored and every module's runs were made on both workers)."""
    users = {item.path for item in items
             if set(getattr(item, "fixturenames", ())) & SHARED.keys()}
    for item in items:
        group = SHARED_GROUP if item.path in users else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))
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


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test that pytest-xdist's `--dist loadgroup` did not group: each worker would make
    every run its tests share (pytest 9.2 with pytest-xdist 3.8 did so, silently)."""
    config = item.config
    if hasattr(config, "workerinput") and config.getvalue("loadgroup") and "@" not in item.nodeid:
        pytest.fail(f"pytest-xdist's loadgroup did not group {item.nodeid}, so the runs it shares "
                    f"would be made on every worker (pytest {pytest.__version__} with this "
                    "pytest-xdist): use the versions pyproject.toml's dev extra names",
                    pytrace=False)
