"""docs/DESIGN.md's pointers stay true, and the rules it states that no other test keeps.

DESIGN names, for each rule, the test that keeps it (`test_...` in backticks) and the modules it
describes (`path.py`). A renamed test or a moved module would leave the map pointing at nothing:
these tests fail instead. docs/findings.md's straggler decision table points at tests the same
way and is held to the same check.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

from uberprof.analysis.diagnosis.bandwidth import BandwidthClass
from uberprof.analysis.diagnosis.evidence import count_test
from uberprof.analysis.diagnosis.model import severity_of
from uberprof.rundir import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs/DESIGN.md"
POINTING = (DESIGN, ROOT / "docs/findings.md")  # pages whose rules name their tests
SOURCES = ("uberprof", "dashboards", "tests", "benchmarks")  # where a named module lives


def _quoted(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def cited_tests(text: str) -> set[str]:
    """The test names `text` cites in backticks (`test_x`, `file.py::test_x`, `::test_x`),
    not test files (`test_x.py`) nor a module's attribute (`test_architecture.NAME`)."""
    out = set()
    for q in _quoted(text):
        out |= {m.group(1) for m in re.finditer(r"(?<![\w/.])(test_\w+)\b(?![.\w])", q)}
    return out


@functools.cache
def defined_tests() -> frozenset[str]:
    """Every test function and test module name under tests/."""
    names = set()
    for f in (ROOT / "tests").rglob("*.py"):
        names.add(f.stem)
        for n in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    n.name.startswith("test_"):
                names.add(n.name)
    return frozenset(names)


def test_the_citation_reader_sees_names_not_files() -> None:
    text = ("(`test_a`; `tests/unit/test_b.py`; `test_c.py::test_d`, `::test_e`; "
            "`test_f.NAME`) test_g")
    assert cited_tests(text) == {"test_a", "test_d", "test_e"}


@pytest.mark.parametrize("page", POINTING, ids=lambda p: p.name)
def test_every_test_the_design_names_exists(page: Path) -> None:
    cited = cited_tests(page.read_text())
    if page == DESIGN:
        assert len(cited) >= 30, "DESIGN.md names the tests that keep its rules"
    missing = sorted(cited - defined_tests())
    assert not missing, f"{page.name} names tests that tests/ does not define: {missing}"


def test_every_file_the_design_names_exists() -> None:
    """A backticked `x.py` or `tests/...` in DESIGN.md is a file or folder of the repository
    (a bare module name may be under any folder: the text around it says which)."""
    files = {p.relative_to(ROOT).as_posix() for top in SOURCES
             for p in (ROOT / top).rglob("*.py")}
    missing = []
    for q in _quoted(DESIGN.read_text()):
        if " " in q or "<" in q or "*" in q or not (q.endswith(".py") or q.startswith("tests/")):
            continue
        name = q.split("::")[0].rstrip("/")
        if not name.endswith(".py") and "." in name.rsplit("/", 1)[-1]:
            name = name.rsplit(".", 1)[0] + ".py"  # a module's attribute: `tests/_jobs.x`
        ok = (ROOT / name).exists() or any(f.endswith("/" + name) for f in files)
        if not ok:
            missing.append(q)
    assert not missing, f"DESIGN.md names files that do not exist: {missing}"


# --- §2: JSON is written atomically --------------------------------------------------------------

def test_a_json_write_that_fails_leaves_the_old_file_whole(tmp_path: Path) -> None:
    """A writer killed mid-write (here: failing half-way) leaves the last whole file and no
    temporary beside it; a reader never sees half a document."""
    path = tmp_path / "rank.json"
    write_json_atomic(path, {"rank": 3})

    class Unwritable:
        def __repr__(self) -> str:
            raise RuntimeError("killed mid-write")

        __str__ = __repr__

    with pytest.raises((TypeError, RuntimeError)):  # orjson refuses it, or json's str() fails
        write_json_atomic(path, {"rank": 4, "bad": Unwritable()})
    assert json.loads(path.read_text()) == {"rank": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["rank.json"]
    write_json_atomic(path, {"rank": 4})
    assert json.loads(path.read_text()) == {"rank": 4}


# --- §5: severity is the own share ---------------------------------------------------------------

@pytest.mark.parametrize(("share", "severity"), [
    (0.0, "low"), (0.0499, "low"), (0.05, "medium"), (0.1499, "medium"), (0.15, "high"),
    (1.0, "high")])
def test_severity_is_the_own_share_high_from_15_medium_from_5_percent(share: float,
                                                                       severity: str) -> None:
    assert severity_of(share) == severity


# --- §5: thin evidence is suspected ----------------------------------------------------------------

def _bandwidth_class(instances: int) -> BandwidthClass:
    return BandwidthClass(grp="0", name="allreduce", bytes=1 << 20, link="intra-node",
                          link_kind=None, instances=instances, steps=[0], busbw_Bps=None,
                          busbw_median_Bps=None, busbw_max_Bps=None, peak_Bps=None,
                          peak_source=None, t_total_ns=0, exposed_ns=0, verdict="fine")


def test_idle_verdicts_from_fewer_than_3_steps_and_bandwidth_from_fewer_than_8_are_suspected(
        ) -> None:
    assert count_test("idle", 40, 2)[0] == "suspected"
    assert count_test("idle", 3, 3)[0] == "confirmed"
    assert _bandwidth_class(7).confidence == "suspected"
    assert _bandwidth_class(8).confidence == "confirmed"
