"""A document dataclass's schema, for people and for programs: the fields of any dataclass whose
fields carry their meaning in `field(metadata={"doc": ...})` as rows (`schema_rows`), a
markdown table of them (`markdown_table`) and a JSON Schema (`json_schema`, msgspec's, with
each field's meaning as its description).

docs/json.md's field tables are generated from the report document's classes (`TABLES`),
between marker comments:

    <!-- generated: run fields; ... -->
    ...the table...
    <!-- end generated -->

Regenerate them with

    python -m uberprof.analysis.diagnosis.schema_doc --write docs/json.md

(`--check docs/json.md` says whether they are current, `--json-schema run` prints the JSON
Schema of `run`); tests/unit/test_report_doc.py fails when the file is stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import msgspec

from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.diagnosis.report_doc import RankDoc, RunDoc

__all__ = ["TABLES", "json_schema", "markdown_table", "regenerate", "schema_rows", "type_text"]

# marker name -> the dataclass whose table goes there (docs/json.md)
TABLES: dict[str, type] = {"run fields": RunDoc, "ranks fields": RankDoc,
                           "findings fields": Finding}
COMMAND = "python -m uberprof.analysis.diagnosis.schema_doc --write docs/json.md"

_NAMES = {int: "integer", float: "number", str: "string", bool: "boolean",
          type(None): "null", Any: "any"}
_MARKED = re.compile(r"(<!-- generated: (?P<name>[^;>]+?)(?:;[^>]*)? -->\n)(.*?)"
                     r"(<!-- end generated -->)", re.DOTALL)


def type_text(tp: Any) -> str:
    """A type annotation in JSON's words: `integer`, `string or null`, `integer[]`,
    `{string: integer[]}`, `object` (a dict of anything), a dataclass by its name."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _NAMES:
        return _NAMES[tp]
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(parts + (["null"] if type(None) in args else []))
    if origin is typing.Literal:
        return " or ".join(f"`{a!r}`" if not isinstance(a, str) else f'`"{a}"`' for a in args)
    if origin in (list, tuple, set, frozenset):
        inner = type_text(args[0]) if args else "any"
        return f"({inner})[]" if " " in inner else f"{inner}[]"
    if origin is dict or tp is dict:
        value = args[1] if len(args) == 2 else Any
        return "object" if value is Any else f"{{string: {type_text(value)}}}"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


def schema_rows(cls: type) -> list[tuple[str, str, str]]:
    """`(name, type_text, meaning)` for each field of the dataclass `cls`, in declared order
    (the meaning from `field(metadata={"doc": ...})`, empty when a field has none), then
    the keys its document adds that are not fields (`cls.DERIVED`: (name, type, meaning))."""
    hints = typing.get_type_hints(cls)
    return [(f.name, type_text(hints[f.name]), f.metadata.get("doc", ""))
            for f in dataclasses.fields(cls)] + list(getattr(cls, "DERIVED", ()))


def markdown_table(rows: list[tuple[str, str, str]]) -> str:
    """The rows as a markdown table `| field | type | meaning |` (pipes escaped)."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| field | type | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {cell(tp)} | {cell(doc)} |" for name, tp, doc in rows]
    return "\n".join(lines) + "\n"


def json_schema(cls: type, all_required: bool = True) -> dict[str, Any]:
    """msgspec's JSON Schema of the dataclass `cls`, each property described by its field's
    meaning; `all_required`: every field is required (a document that always writes each)."""
    schema = msgspec.json.schema(cls)
    body = schema["$defs"][cls.__name__]
    props = body["properties"]
    body["properties"] = {f.name: props[f.name] for f in dataclasses.fields(cls)}  # declared
    for f in dataclasses.fields(cls):
        if "doc" in f.metadata:
            body["properties"][f.name]["description"] = f.metadata["doc"]
    if all_required:
        body["required"] = [f.name for f in dataclasses.fields(cls)]
    return schema


def regenerate(text: str, tables: dict[str, type] | None = None) -> str:
    """`text` with every generated table (between its markers) made again from its class;
    raises KeyError for a marker that names no class in `tables`."""
    tables = TABLES if tables is None else tables

    def table(m: re.Match[str]) -> str:
        cls = tables[m.group("name").strip()]
        return m.group(1) + "\n" + markdown_table(schema_rows(cls)) + "\n" + m.group(4)

    return _MARKED.sub(table, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m uberprof.analysis.diagnosis.schema_doc",
                                description="Regenerate the report document's field tables.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path, metavar="MD", help="rewrite the tables in MD")
    g.add_argument("--check", type=Path, metavar="MD", help="exit 1 when MD's are stale")
    g.add_argument("--json-schema", choices=[n.split()[0] for n in TABLES],
                   help="print the JSON Schema of `run` or of an item of `ranks`")
    a = p.parse_args(argv)
    if a.json_schema:
        cls = next(c for n, c in TABLES.items() if n.split()[0] == a.json_schema)
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(json_schema(cls))).decode()
                         + "\n")
        return 0
    path = a.write or a.check
    text = path.read_text(encoding="utf-8")
    new = regenerate(text)
    if a.check:
        if new != text:
            print(f"{path}: the generated tables are stale; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
