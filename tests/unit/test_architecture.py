"""The pipeline's direction, checked on the source (docs/DESIGN.md, "One pipeline").

- Collect writes, the others read: the parts that read a run never import the collect side.
  They read a run directory through `uberprof.rundir` (layout, ranks, nodes, counters), so what
  the node and rank agents write can change without the readers following the agents' code,
  and the agents never drag analysis code into a training job. `uberprof.rundir` itself may be
  imported by collect, so it must not import collect back.
- Data flows forward: rundir, ingest and analysis never import a presenter (present,
  dashboards) or the CLI; a number a view needs is computed in analysis and handed on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READERS = ["uberprof/analysis", "uberprof/present", "uberprof/ingest", "dashboards",
           "uberprof/inventory.py", "uberprof/rundir"]
FORBIDDEN = "uberprof.collect"


UPSTREAM = ["uberprof/rundir", "uberprof/ingest", "uberprof/analysis"]
DOWNSTREAM = ("uberprof.present", "uberprof.dashboards", "dashboards", "uberprof.cli")


def forbidden_imports(source: str, forbidden: tuple[str, ...] = (FORBIDDEN,),
                      filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) of every import of a `forbidden` package in `source`, at any depth
    (imports inside functions count: lazy imports are still dependencies)."""
    def hit(module: str) -> bool:
        return any(module == f or module.startswith(f + ".") for f in forbidden)

    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if hit(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if hit(node.module):
                out.append((node.lineno, node.module))
            else:
                out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                        if hit(f"{node.module}.{a.name}")]
    return out


def collect_imports(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    return forbidden_imports(source, (FORBIDDEN,), filename)


def reader_files(folders: list[str] = READERS) -> list[Path]:
    files: list[Path] = []
    for rel in folders:
        p = ROOT / rel
        files += [p] if p.is_file() else sorted(p.rglob("*.py"))
    return files


def test_the_check_sees_every_form_of_import() -> None:
    src = ("import uberprof.collect.counters.store\n"
           "from uberprof.collect.counters import read_counters\n"
           "from uberprof import collect\n"
           "def f():\n    from uberprof.collect import runid\n"
           "import uberprof.collector_like, uberprof.rundir\n"
           "from uberprof.rundir.counters import read_counters\n")
    assert sorted(line for line, _ in collect_imports(src)) == [1, 2, 3, 5]


def test_readers_do_not_import_collect() -> None:
    files = reader_files()
    assert len(files) > 20, files  # the scan really looked at the readers
    assert ROOT / "uberprof/inventory.py" in files
    bad = [f"{f.relative_to(ROOT)}:{line}: imports {mod}"
           for f in files for line, mod in collect_imports(f.read_text(), str(f))]
    assert not bad, "readers must read the run through uberprof.rundir:\n" + "\n".join(bad)


def test_the_check_sees_a_presenter_import() -> None:
    src = ("from uberprof.units import fmt_bytes\n"
           "from uberprof.present.report_terminal import render_report\n"
           "def f():\n    from uberprof import present\n"
           "import uberprof.dashboards.data\n")
    assert sorted(line for line, _ in forbidden_imports(src, DOWNSTREAM)) == [2, 4, 5]


def test_analysis_does_not_import_presenters() -> None:
    files = reader_files(UPSTREAM)
    assert ROOT / "uberprof/analysis/diagnosis/advisor.py" in files
    bad = [f"{f.relative_to(ROOT)}:{line}: imports {mod}" for f in files
           for line, mod in forbidden_imports(f.read_text(), DOWNSTREAM, str(f))]
    assert not bad, "data flows forward; analysis must not import a view:\n" + "\n".join(bad)


@pytest.mark.parametrize("gone", ["uberprof/collect/counters/read.py", "uberprof/rundir.py"])
def test_moved_readers_are_gone(gone: str) -> None:
    """One definition: the counter readers and the layout live in uberprof/rundir/ only."""
    assert not (ROOT / gone).exists()
