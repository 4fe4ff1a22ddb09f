"""The suite's two folders, and isolation for commands run in-process (click's CliRunner).

tests/unit/: fast, and starts no job (tests/unit/conftest.py refuses it; `make test-fast`).
tests/jobs/: real jobs, browsers, terminals, network namespaces; each test is marked `jobs`
(`-m "not jobs"` leaves them out). A test file anywhere else is an error: it must say its cost.
Helpers shared by both stay here in tests/ (`from tests._jobs import ...`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
UNIT, JOBS = HERE / "unit", HERE / "jobs"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    elsewhere = set()
    for item in items:
        path = item.path.resolve()
        if path.is_relative_to(JOBS):
            item.add_marker(pytest.mark.jobs)
        elif not path.is_relative_to(UNIT) and path.is_relative_to(HERE):
            elsewhere.add(str(path.relative_to(HERE.parent)))
    if elsewhere:
        raise pytest.UsageError(
            "tests live in tests/unit/ (fast, no jobs) or tests/jobs/ (real jobs, browsers, "
            "terminals, network namespaces); move: " + ", ".join(sorted(elsewhere)))


@pytest.fixture(autouse=True)
def _pandas_stays_importable() -> Iterator[None]:
    """`report`, `export` and `analyze` keep pandas out of their own process
    (`analysis.pool.keep_pandas_out`); run in-process, that guard must not outlive the test."""
    before = list(sys.meta_path)
    yield
    sys.meta_path[:] = [f for f in sys.meta_path
                        if f in before or type(f).__name__ != "_NoPandas"]
