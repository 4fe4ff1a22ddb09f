"""One shape of the report document (docs/json.md): `RunDoc` and `RankDoc` own every key, every
document (full, failures only, empty) has all of them, and docs/json.md's field tables are
generated from the classes (`schema_doc.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests import _traces as T
from uberprof.analysis.diagnosis.advisor import diagnose
from uberprof.analysis.diagnosis.document import empty_diagnosis, failures_only_diagnosis
from uberprof.analysis.diagnosis.report_doc import RUN_KEYS, RankDoc, RunDoc
from uberprof.analysis.diagnosis.schema_doc import (
    COMMAND,
    TABLES,
    json_schema,
    markdown_table,
    regenerate,
    schema_rows,
)

ROOT = Path(__file__).resolve().parents[2]
RANK_KEYS = [f.name for f in dataclasses.fields(RankDoc)]


def _full(tmp_path: Path) -> Any:
    """A diagnosed two-rank GPU run (synthetic traces, tests/_traces.py)."""
    for r in (0, 1):
        T.write(tmp_path / "traces" / f"rank-{r}.json", T.gpu_step_trace(rank=r))
    return diagnose(tmp_path / "traces", out=tmp_path / "derived", workers=1)


def test_every_document_has_every_field_in_one_order(tmp_path: Path) -> None:
    from tests.unit.test_hangs_units import _crashed_before_its_traces

    full = _full(tmp_path / "full")
    empty = empty_diagnosis(tmp_path / "nothing", [])
    failed = failures_only_diagnosis(_crashed_before_its_traces(tmp_path / "crash").root,
                                     ["no traces"])
    assert failed.findings and failed.findings[0].kind == "crash"
    for name, d in (("full", full), ("empty", empty), ("failures only", failed)):
        assert list(d.run) == list(RUN_KEYS), name
        doc = orjson.loads(orjson.dumps(d.to_json()))  # as `report --json` prints it
        assert list(doc["run"]) == list(RUN_KEYS), name
    assert [list(r) for r in full.ranks] == [RANK_KEYS, RANK_KEYS]
    # where nothing was analysed, the analysed fields are null or empty, never missing
    for d in (empty, failed):
        assert d.run["p2p"] is None and d.run["pipeline"] is None
        assert d.run["comm_by_group"] == [] and d.run["modules"] is None
        assert d.run["memory_timeline"] is None and d.run["straggler_test"] is None
    assert full.run["p2p"] is not None and full.run["accounting"] is not None


def test_no_undeclared_field_can_be_set() -> None:
    doc = RunDoc(path="x", kind="traces", world_size=0)
    doc.p2p = {"pairs": 0}  # declared: fine
    with pytest.raises(AttributeError):
        doc.p2p_pairs = 0  # type: ignore[attr-defined]


def test_every_field_says_what_it_means() -> None:
    for cls in TABLES.values():
        for name, tp, doc in schema_rows(cls):
            assert doc and "\n" not in doc and tp, (cls.__name__, name)


def test_the_json_docs_tables_are_generated_from_the_classes() -> None:
    path = ROOT / "docs" / "json.md"
    text = path.read_text(encoding="utf-8")
    for name in TABLES:
        assert f"<!-- generated: {name}" in text, name
    assert regenerate(text) == text, f"docs/json.md's field tables are stale; run: {COMMAND}"


@dataclass(slots=True, kw_only=True)
class _Toy:
    """A toy document."""

    n: int = field(metadata={"doc": "a count"})
    names: list[str] = field(default_factory=list, metadata={"doc": "names | or none"})
    by: dict[str, list[int]] | None = field(default=None, metadata={"doc": "groups"})
    extra: dict[str, Any] | None = None


def test_the_generator_reads_any_documented_dataclass() -> None:
    assert schema_rows(_Toy) == [("n", "integer", "a count"),
                                 ("names", "string[]", "names | or none"),
                                 ("by", "{string: integer[]} or null", "groups"),
                                 ("extra", "object or null", "")]
    table = markdown_table(schema_rows(_Toy))
    assert table.splitlines()[:3] == ["| field | type | meaning |", "|---|---|---|",
                                      "| `n` | integer | a count |"]
    assert "names \\| or none" in table  # a pipe does not split the row
    text = "a\n<!-- generated: toy; see x -->\nold\n<!-- end generated -->\nb\n"
    assert regenerate(text, {"toy": _Toy}) == (
        "a\n<!-- generated: toy; see x -->\n\n" + table + "\n<!-- end generated -->\nb\n")
    schema = json_schema(_Toy)["$defs"]["_Toy"]
    assert list(schema["properties"]) == ["n", "names", "by", "extra"]
    assert schema["required"] == ["n", "names", "by", "extra"]
    assert schema["properties"]["n"]["description"] == "a count"
    run = json_schema(RunDoc)["$defs"]["RunDoc"]
    assert list(run["properties"]) == list(RUN_KEYS) == run["required"]


def test_a_saved_document_without_a_field_is_diagnosed_again(tmp_path: Path) -> None:
    """A view reads `run[key]`: a saved diagnosis.json that lacks a field every document has
    (saved before `RunDoc` declared it) is not read back."""
    from uberprof.analysis.diagnosis.saved import load, save
    from uberprof.analysis.tables.context import load_context
    from uberprof.analysis.tables.derived import DIAGNOSIS_FILE

    d = _full(tmp_path)
    save(d)
    ctx = load_context(tmp_path / "traces", out=tmp_path / "derived")
    back = load(ctx)
    assert back is not None and list(back.run) == list(RUN_KEYS)
    path = tmp_path / "derived" / DIAGNOSIS_FILE
    doc = orjson.loads(path.read_bytes())
    del doc["run"]["modules"]
    path.write_bytes(orjson.dumps(doc))
    assert load(ctx) is None
