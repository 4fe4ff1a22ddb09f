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
           "uberprof/inventory.py", "uberprof/loader.py", "uberprof/units.py", "uberprof/rundir"]
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


# The one write of a reader: the live dashboard's "record a trace" button asks the job exactly
# as `uberprof trace` does, through the one function that writes a request (no copy of it).
READER_MAY_IMPORT = {("dashboards/live_trace.py", "uberprof.collect.trace_request")}


def test_readers_do_not_import_collect() -> None:
    files = reader_files()
    assert len(files) > 20, files  # the scan really looked at the readers
    assert ROOT / "uberprof/inventory.py" in files
    bad = [f"{f.relative_to(ROOT)}:{line}: imports {mod}"
           for f in files for line, mod in collect_imports(f.read_text(), str(f))
           if (str(f.relative_to(ROOT)), mod) not in READER_MAY_IMPORT]
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


# --- no import circle --------------------------------------------------------------------------

def module_name(path: Path) -> str:
    """The dotted name a source file is imported under (dashboards/ is uberprof.dashboards)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "dashboards":
        parts = ["uberprof", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(source: str, name: str, known: set[str], is_package: bool,
                     filename: str = "<source>") -> set[str]:
    """The modules of `known` that `source` (module `name`) imports, at any depth, type-only
    imports included: `from pkg import sub` names the submodule, `from pkg import obj` the
    package. Relative imports are resolved against `name`."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return out & known


def import_graph(folders: tuple[str, ...] = ("uberprof", "dashboards")) -> dict[str, set[str]]:
    files = [f for d in folders for f in sorted((ROOT / d).rglob("*.py"))]
    names = {module_name(f): f for f in files}
    known = set(names)
    return {n: imported_modules(f.read_text(), n, known, f.name == "__init__.py", str(f)) - {n}
            for n, f in names.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_the_circle_check_finds_a_circle_through_a_lazy_type_only_import() -> None:
    known = {"p", "p.a", "p.b", "p.c"}
    graph = {
        "p.a": imported_modules("from p.b import x\n", "p.a", known, False),
        "p.b": imported_modules("def f():\n    from p import c\n", "p.b", known, False),
        "p.c": imported_modules("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from .a import y\n", "p.c", known, False),
        "p": set(),
    }
    assert graph["p.b"] == {"p.c"} and graph["p.c"] == {"p.a"}
    assert import_circles(graph) == [["p.a", "p.b", "p.c"]]
    graph["p.c"] = set()
    assert import_circles(graph) == []


def test_no_import_circle_in_uberprof() -> None:
    graph = import_graph()
    assert "uberprof.analysis.diagnosis.advisor" in graph
    assert "uberprof.dashboards.app" in graph
    circles = import_circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


# --- views only read ---------------------------------------------------------------------------

VIEWS = ("uberprof/present", "dashboards")
# What a view may take from the analysis: the one way to open a run and read it, the
# diagnosis's model, the vocabulary of causes, the comparison's type for `diff`, and the
# progress protocol a view implements (a leaf of stage names: taking them from the model
# loaded numpy and pyarrow into `import uberprof.cli`, before any command ran).
VIEW_MAY_IMPORT = ("uberprof.analysis.read", "uberprof.analysis.diagnosis.model",
                   "uberprof.analysis.diagnosis.causes", "uberprof.analysis.progress")
VIEW_MAY_IMPORT_NAMES = {("uberprof.analysis.diff", "Comparison")}


def analysis_imports(source: str, filename: str = "<source>") -> list[tuple[int, str, str]]:
    """(line, module, name) of every import from `uberprof.analysis` in `source` that a view
    may not make (name "" for `import module`)."""
    def allowed(module: str, name: str) -> bool:
        full = f"{module}.{name}" if name else module
        return any(full == m or full.startswith(m + ".") or module == m
                   for m in VIEW_MAY_IMPORT) or (module, name) in VIEW_MAY_IMPORT_NAMES

    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, "") for a in node.names
                    if a.name.startswith("uberprof.analysis") and not allowed(a.name, "")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "uberprof" or node.module.startswith("uberprof.analysis")):
            for a in node.names:
                if node.module == "uberprof" and a.name != "analysis":
                    continue
                if not allowed(node.module, a.name):
                    out.append((node.lineno, node.module, a.name))
    return sorted(out)


def test_the_view_check_sees_an_analysis_function() -> None:
    src = ("from uberprof.analysis.read import open_run, OpenedRun\n"
           "from uberprof.analysis.diagnosis.model import Diagnosis\n"
           "def f():\n    from uberprof.analysis.tables import metrics as M\n"
           "from uberprof.analysis.diff import Comparison, compare\n"
           "import uberprof.analysis.diagnosis.saved\n"
           "from uberprof import analysis\n")
    assert [(line, name) for line, _, name in analysis_imports(src)] == \
        [(4, "metrics"), (5, "compare"), (6, ""), (7, "analysis")]
    assert analysis_imports("from uberprof.analysis.read import OpenedRun, sql_table\n") == []


def test_views_call_no_analysis_or_diagnosis_function() -> None:
    """present/ and dashboards/ read what the analysis saved (uberprof.analysis.read):
    they never run a metric, a finding producer or the advisor themselves."""
    files = reader_files(list(VIEWS))
    assert ROOT / "dashboards/queries/steps.py" in files
    bad = [f"{f.relative_to(ROOT)}:{line}: from {mod} import {name or '*'}" for f in files
           for line, mod, name in analysis_imports(f.read_text(), str(f))]
    assert not bad, "views read through uberprof.analysis.read:\n" + "\n".join(bad)


def test_the_run_directory_reader_knows_nothing_of_derived() -> None:
    """rundir/ names the derived folder in its layout (the run directory's format) and reads
    nothing inside it: what the analysis writes there is the analysis's to read."""
    files = [f for f in reader_files(["uberprof/rundir"]) if f.name not in ("layout.py",
                                                                           "__init__.py")]
    assert ROOT / "uberprof/rundir/follow.py" in files
    bad = [f"{f.relative_to(ROOT)}" for f in files
           if any(w in f.read_text() for w in ("derived_dir", "DERIVED_DIR", "diagnosis.json"))]
    assert not bad, bad


# --- derived file names: derived.py's alone -------------------------------------------------------

DERIVED_OWNER = "uberprof/analysis/tables/derived.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of `tree` (prose may name a file; code may not)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and n.body and isinstance(n.body[0], ast.Expr) \
                and isinstance(n.body[0].value, ast.Constant):
            out.add(id(n.body[0].value))
    return out


def derived_names(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, literal) of each string in code (not a docstring, not a sentence) that spells a
    derived file name: a `.parquet` or `.arrow` file, one of derived/'s JSON files or the
    reduce's `.parts-` folder, alone or at the end of a path (an f-string's literal parts
    included)."""
    import re

    tree = ast.parse(source, filename)
    docs = _docstrings(tree)
    name = re.compile(r"[\w./{}-]*(\.parquet|\.arrow|"
                      r"(diagnosis|manifest|reduce|shares|overview|summary|state)\.json)"
                      r"|\.parts-[\w-]*")
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and name.fullmatch(n.value)]


def test_the_derived_name_check_sees_a_path() -> None:
    assert derived_names('p = derived / "ranks.parquet"\n') == [(1, "ranks.parquet")]
    assert derived_names('p = f"{d}/diagnosis.json"\n') == [(1, "/diagnosis.json")]
    assert derived_names('p = d / f"rank-{r}.arrow"\n') == [(1, ".arrow")]
    assert derived_names('p = d / ".parts-"\n') == [(1, ".parts-")]
    assert derived_names('"""Reads derived/ranks.parquet."""\nx = "a sentence: x.parquet"\n') \
        == []


def test_only_derived_py_spells_a_derived_file_name() -> None:
    """Only `analysis/tables/derived.py` knows where a derived table lives (DESIGN §1): every
    other module asks it (its constants, paths and readers)."""
    files = [f for f in reader_files(["uberprof", "dashboards"])
             if f.relative_to(ROOT).as_posix() != DERIVED_OWNER]
    assert ROOT / "uberprof/present/terminal/analyze.py" in files
    bad = [f"{f.relative_to(ROOT)}:{line}: {text!r}" for f in files
           for line, text in derived_names(f.read_text(), str(f))]
    assert not bad, "derived file names belong to derived.py:\n" + "\n".join(bad)



# --- small functions: no function over 60 lines without a stated reason ---------------------------

MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS_ALLOWED = {  # "path::name": why it is longer
}


def long_functions(folders: tuple[str, ...] = ("uberprof/analysis", "uberprof/present")
                   ) -> dict[str, int]:
    """{"path::name": lines} of every function longer than MAX_FUNCTION_LINES."""
    out = {}
    for f in reader_files(list(folders)):
        for n in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    n.end_lineno is not None and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES:
                out[f"{f.relative_to(ROOT).as_posix()}::{n.name}"] = n.end_lineno - n.lineno + 1
    return out


def test_no_long_function_without_a_reason() -> None:
    """DESIGN §8: long work is split into named stages; a longer function says why here."""
    long = long_functions()
    bad = [f"{where}: {n} lines" for where, n in sorted(long.items())
           if where not in LONG_FUNCTIONS_ALLOWED]
    assert not bad, "split these (or say why in LONG_FUNCTIONS_ALLOWED):\n" + "\n".join(bad)
    stale = sorted(set(LONG_FUNCTIONS_ALLOWED) - set(long))
    assert not stale, f"no longer long (drop from LONG_FUNCTIONS_ALLOWED): {stale}"


# --- run directory file names: rundir's alone ------------------------------------------------------

def run_file_names(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, literal) of each string in code (not a docstring) that is a run directory's file
    name from `rundir/layout.py` (rank.json, steps.jsonl, ...), alone or ending a path."""
    from uberprof.rundir import layout as L

    names = {L.RUN_FILE, L.NODE_FILE, L.RANK_FILE, L.STEPS_FILE, L.LOG_FILE, L.COUNTERS_INDEX,
             L.COUNTERS_META, L.CALIBRATION_FILE, L.EXCEPTIONS_FILE, L.FATAL_FILE, L.STACKS_FILE,
             L.RANK_HANG_FILE, L.FLIGHT_LOG_FILE}
    tree = ast.parse(source, filename)
    docs = _docstrings(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and n.value.rsplit("/", 1)[-1] in names]


def test_the_run_file_name_check_sees_a_path() -> None:
    assert run_file_names('p = folder / "rank.json"\n') == [(1, "rank.json")]
    assert run_file_names('"""Reads rank.json."""\nx = "a sentence about rank.json"\n') == []


def test_only_rundir_spells_a_run_directory_file_name() -> None:
    """Readers name a run's files through `uberprof.rundir`'s layout (DESIGN §1: everyone reads
    a run through uberprof.rundir), so the format can change in one place."""
    files = [f for f in reader_files() if "rundir" not in f.relative_to(ROOT).parts]
    assert ROOT / "uberprof/analysis/diagnosis/findings/crash.py" in files
    bad = [f"{f.relative_to(ROOT)}:{line}: {text!r}" for f in files
           for line, text in run_file_names(f.read_text(), str(f))]
    assert not bad, "run directory file names belong to rundir/layout.py:\n" + "\n".join(bad)
