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


@pytest.fixture
def one_rank_process_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment of a one-rank torch.distributed job in this process (a free local
    port), for a test that makes a real Gloo process group; the group is destroyed after it
    and the environment restored."""
    import torch.distributed as dist

    from uberprof.dashboards.live_server import free_port

    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
