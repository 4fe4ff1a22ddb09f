"""The dashboard ships inside uberprof: the top-level dashboards/ folder is installed as the
`uberprof.dashboards` package (pyproject's package-dir mapping), and the wheel holds nothing but
`uberprof/` (no top-level `dashboards`, `tests`, `samples` or `benchmarks`). The packages are
found (setup.py), not listed: every folder with code is in the wheel."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
ROOTS = {"uberprof": "uberprof", "uberprof.dashboards": "dashboards"}  # package: folder


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _setup_py() -> ModuleType:
    """setup.py as a module (setup() runs only as a script)."""
    spec = importlib.util.spec_from_file_location("uberprof_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _package_folder(name: str, package_dir: dict[str, str]) -> Path:
    """The folder setuptools builds package `name` from (the longest mapped prefix wins)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in package_dir:
            return ROOT / package_dir[prefix] / Path(*parts[i:])
    return ROOT / Path(*parts)


def _code_folders(root: Path = ROOT) -> set[str]:
    """Every folder under uberprof/ and dashboards/ with an __init__.py or any module, named as
    it is installed: what the wheel must hold."""
    out = set()
    for name, folder in ROOTS.items():
        for py in (root / folder).rglob("*.py"):
            if "__pycache__" not in py.parts:
                out.add(".".join((name, *py.parent.relative_to(root / folder).parts)))
    return out


def test_uberprof_dashboards_is_the_dashboards_folder() -> None:
    st = _setuptools()
    assert st["package-dir"] == {"uberprof.dashboards": "dashboards"}
    assert "packages" not in st  # found by setup.py, never a hand-kept list
    packages = _setup_py().packages()
    assert not [p for p in packages if p == "dashboards" or p.startswith("dashboards.")]
    assert all(p == "uberprof" or p.startswith("uberprof.") for p in packages)
    assert not [p for p in packages if "__pycache__" in p]
    assert _package_folder("uberprof.dashboards.pages", st["package-dir"]) == \
        ROOT / "dashboards" / "pages"
    # every folder with code is found (a package left out would be missing from the wheel)
    code = _code_folders()
    assert {"uberprof.analysis.tables", "uberprof.analysis.diagnosis",
            "uberprof.dashboards.queries", "uberprof.collect.bootstrap"} <= code
    assert code <= set(packages), sorted(code - set(packages))
    for p in packages:
        assert _package_folder(p, st["package-dir"]).is_dir(), p
    assert {"uberprof.dashboards.assets", "uberprof.dashboards.vendor"} <= set(packages)
    data = st["package-data"]
    assert data["uberprof.dashboards.assets"] == ["*"] and data["uberprof.dashboards.vendor"] == ["*"]


def test_a_new_package_is_found_without_listing_it(tmp_path: Path) -> None:
    """Discovery, on a made-up tree: a new package at any depth in either folder (one without an
    __init__.py too), never a __pycache__."""
    for rel in ("uberprof/__init__.py", "uberprof/analysis/__init__.py",
                "uberprof/analysis/diagnosis/findings/__init__.py",
                "uberprof/analysis/diagnosis/__init__.py", "uberprof/newpart/loose.py",
                "uberprof/analysis/__pycache__/x.cpython-311.pyc", "dashboards/__init__.py",
                "dashboards/pages/__init__.py", "dashboards/pages/admin/__init__.py",
                "dashboards/assets/style.css", "tests/__init__.py", "samples/x/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    found = set(_setup_py().packages(tmp_path))
    assert _code_folders(tmp_path) <= found
    assert found == {"uberprof", "uberprof.analysis", "uberprof.analysis.diagnosis",
                     "uberprof.analysis.diagnosis.findings", "uberprof.newpart",
                     "uberprof.dashboards", "uberprof.dashboards.pages",
                     "uberprof.dashboards.pages.admin", "uberprof.dashboards.assets"}


def test_the_installed_package_finds_its_assets() -> None:
    from uberprof.dashboards import app

    assert Path(app.__file__).resolve().parent == ROOT / "dashboards"
    assert (app.ASSETS / "style.css").is_file()
    assert next(app.LIGHT_DIR.glob("plotly-cartesian-*.min.js"), None) is not None


def test_the_wheel_holds_only_uberprof(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: setuptools builds in the source tree
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("uberprof", "dashboards", "tests", "samples", "benchmarks"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
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
    # every file of both folders, and nothing else: each package (found, not listed) with its
    # __init__.py, the dashboard's data (assets/, vendor/), collect/bootstrap's sitecustomize.py
    source = {f"{package.replace('.', '/')}/{p.relative_to(src / folder).as_posix()}"
              for package, folder in ROOTS.items() for p in (src / folder).rglob("*")
              if p.is_file()}
    held = {n for n in names if n.startswith("uberprof/")}
    assert source == held, (sorted(source - held), sorted(held - source))
    assert "uberprof/collect/bootstrap/sitecustomize.py" in held
    assert "uberprof/analysis/diagnosis/__init__.py" in held
