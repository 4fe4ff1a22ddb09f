"""Suite-wide isolation for commands run in-process (click's CliRunner)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _pandas_stays_importable() -> Iterator[None]:
    """`report`, `export` and `analyze` keep pandas out of their own process
    (`analysis.pool.keep_pandas_out`); run in-process, that guard must not outlive the test."""
    before = list(sys.meta_path)
    yield
    sys.meta_path[:] = [f for f in sys.meta_path
                        if f in before or type(f).__name__ != "_NoPandas"]
