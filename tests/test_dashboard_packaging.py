"""The dashboard ships inside uberprof: the top-level dashboards/ folder is installed as the
`uberprof.dashboards` package (pyproject's package-dir mapping), and the wheel holds nothing but
`uberprof/` (no top-level `dashboards`, `tests`, `samples` or `benchmarks`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folder(name: str, package_dir: dict[str, str]) -> Path:
    """The folder setuptools builds package `name` from (the longest mapped prefix wins)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in package_dir:
            return ROOT / package_dir[prefix] / Path(*parts[i:])
    return ROOT / Path(*parts)


def test_uberprof_dashboards_is_the_dashboards_folder() -> None:
    st = _setuptools()
    assert st["package-dir"] == {"uberprof.dashboards": "dashboards"}
    packages = st["packages"]
    assert not [p for p in packages if p == "dashboards" or p.startswith("dashboards.")]
    assert all(p == "uberprof" or p.startswith("uberprof.") for p in packages)
    assert _package_folder("uberprof.dashboards.pages", st["package-dir"]) == \
        ROOT / "dashboards" / "pages"
    # every folder with code is listed (a package left out would be missing from the wheel)
    code = {".".join(("uberprof", *p.parent.relative_to(ROOT / "uberprof").parts))
            for p in (ROOT / "uberprof").rglob("__init__.py")}
    code |= {".".join(("uberprof.dashboards", *p.parent.relative_to(ROOT / "dashboards").parts))
             for p in (ROOT / "dashboards").rglob("__init__.py")}
    assert code <= set(packages), sorted(code - set(packages))
    for p in packages:
        assert _package_folder(p, st["package-dir"]).is_dir(), p
    data = st["package-data"]
    assert data["uberprof.dashboards.assets"] == ["*"] and data["uberprof.dashboards.vendor"] == ["*"]


def test_the_installed_package_finds_its_assets() -> None:
    from uberprof.dashboards import app

    assert Path(app.__file__).resolve().parent == ROOT / "dashboards"
    assert (app.ASSETS / "style.css").is_file()
    assert next(app.LIGHT_DIR.glob("plotly-cartesian-*.min.js"), None) is not None


@pytest.mark.slow
def test_the_wheel_holds_only_uberprof(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: setuptools builds in the source tree
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("uberprof", "dashboards", "tests", "samples", "benchmarks"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
                          capture_output=True, text=True, timeout=300, check=False,
                          cwd=tmp_path)
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        pytest.skip("pip is not installed in this interpreter")
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = next(tmp_path.glob("uberprof-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"uberprof", wheel.name.split("-py")[0]
                                                 + ".dist-info"}
    for must in ("uberprof/dashboards/app.py", "uberprof/dashboards/pages/overview.py",
                 "uberprof/dashboards/queries/__init__.py", "uberprof/dashboards/assets/style.css",
                 "uberprof/dashboards/vendor/plotly.js-LICENSE", "uberprof/cli/dashboard.py"):
        assert must in names, must
    assert any(n.startswith("uberprof/dashboards/vendor/plotly-cartesian-") for n in names)
