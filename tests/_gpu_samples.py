"""The real GPU run directories kept in samples/gpu/, for CPU tests: copied (the analysis
writes derived/ into a run directory) and reported once per test module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from uberprof.cli import main

GPU = Path(__file__).resolve().parents[1] / "samples" / "gpu"


def copy_samples(root: Path, names: tuple[str, ...]) -> dict[str, Path]:
    """Copies of the named sample runs under `root`."""
    return {r: Path(shutil.copytree(GPU / r, root / r)) for r in names}


def report_all(runs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each run's `uberprof report --json` (which also saves its diagnosis)."""
    out = {}
    for name, path in runs.items():
        res = CliRunner().invoke(main, ["report", str(path), "--json"])
        # exit 3: the report found the job crashed (the oom run), by its verdict
        assert res.exit_code == (3 if name == "oom" else 0), (name, res.output)
        out[name] = json.loads(res.stdout)
    return out


def sample_fixtures(names: tuple[str, ...], folder: str) -> tuple[Any, Any]:
    """A test module's `runs` (copies of the named samples, in a temporary `folder`) and
    `reports` (`report_all` of them) fixtures, module-scoped: `runs, reports =
    sample_fixtures(RUNS, "my-samples")`."""
    @pytest.fixture(scope="module")
    def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
        return copy_samples(tmp_path_factory.mktemp(folder), names)

    @pytest.fixture(scope="module")
    def reports(runs: dict[str, Path]) -> dict[str, dict[str, Any]]:
        return report_all(runs)

    return runs, reports
