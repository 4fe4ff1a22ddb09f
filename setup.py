"""The one thing pyproject.toml cannot say: the package list, found rather than kept by hand.

The wheel has two roots: uberprof/ and the top-level dashboards/ folder, installed as
`uberprof.dashboards` (the package-dir mapping in pyproject.toml). `[tool.setuptools.packages.find]`
names packages after the folders it finds them in, so it would call the second root `dashboards`;
here each root is searched and named for what it installs as. Every folder is a package (folders
without an __init__.py too: namespace packages, and the dashboard's assets/ and vendor/ data), so
nothing is left out of the wheel. Everything else is in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent
ROOTS = {"uberprof": "uberprof", "uberprof.dashboards": "dashboards"}  # package: folder


def packages(here: Path = HERE) -> list[str]:
    """Every package of the wheel: each root and every folder under it (no __pycache__)."""
    found: list[str] = []
    for name, folder in ROOTS.items():
        found += [name, *(f"{name}.{p}" for p in find_namespace_packages(
            str(here / folder), exclude=["__pycache__", "*.__pycache__"]))]
    return sorted(set(found))


if __name__ == "__main__":
    setup(packages=packages())
