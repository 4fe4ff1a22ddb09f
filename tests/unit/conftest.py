"""Unit tests start no jobs: a test under tests/unit/ that starts torchrun, `uberprof run` or
`calibrate`, a browser, tmux or a network namespace fails (the rule and the guard:
tests/_no_jobs.py).

The guard is on while each unit test is set up, runs and is torn down: its fixtures are covered
too, a session-wide one such as a real run from tests/_diag_runs.py included."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._no_jobs import NoJobs, guarded

GUARD = pytest.StashKey[NoJobs]()


def _phase(item: pytest.Item) -> Iterator[None]:
    with guarded(item.stash.setdefault(GUARD, NoJobs())):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    return (yield from _phase(item))


@pytest.fixture
def no_jobs(request: pytest.FixtureRequest) -> NoJobs:
    """The guard's record for this test (for the guard's own test)."""
    return request.node.stash.setdefault(GUARD, NoJobs())
