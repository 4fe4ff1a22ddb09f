"""The docs a newcomer walks: every command has a page that names its options, the README stays
short and links every page, and docs/findings.md explains every finding kind the code can
report. Nothing here runs a job: `--help` goes through click's CliRunner in this process."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from uberprof.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 320
_CTX = click.Context(main)
COMMANDS = main.list_commands(_CTX)  # the group imports each on first use


def finding_kinds() -> tuple[str, ...]:
    """Every finding kind, from the code: the producers' registry, else the older tuples."""
    try:
        from uberprof.analysis.diagnosis.findings import finding_kinds as registry
    except ImportError:
        pass
    else:
        return tuple(registry())
    try:
        from uberprof.analysis.diagnosis.findings import FINDING_KINDS
    except ImportError:
        from uberprof.analysis.diagnosis.advisor import FINDING_KINDS
    return tuple(FINDING_KINDS)


def long_options(command: click.Command) -> list[str]:
    """The command's long option names (`--json`, `--out`, ...), `--help` aside."""
    names: list[str] = []
    for param in command.params:
        if isinstance(param, click.Option):
            names += [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
    return names


def test_the_commands_are_the_ten_documented_ones() -> None:
    assert set(COMMANDS) >= {"run", "info", "doctor", "analyze", "report", "dashboard",
                             "export", "diff", "watch", "calibrate"}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_a_docs_page_naming_its_options(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    page = DOCS / f"{name}.md"
    assert page.is_file(), f"docs/{name}.md is missing"
    text = page.read_text(encoding="utf-8")
    missing = [o for o in long_options(main.get_command(_CTX, name))
               if not re.search(re.escape(o) + r"(?![\w-])", text)]
    assert not missing, f"docs/{name}.md does not mention {missing}"


def test_uberprof_help_lists_every_command_with_a_one_line_summary() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=120)
    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:", 1)[1]
    for name in COMMANDS:
        line = re.search(rf"^  {re.escape(name)} +(\S.*)$", listed, re.MULTILINE)
        assert line is not None, f"`uberprof --help` does not list {name}"
        assert not line.group(1).endswith("..."), f"{name}'s summary is cut: {line.group(1)}"


def test_readme_is_at_most_320_lines_and_links_every_command_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    unlinked = [n for n in COMMANDS if f"(docs/{n}.md" not in text]
    assert not unlinked, f"README.md does not link docs/<command>.md for {unlinked}"


def test_findings_page_has_a_section_for_every_finding_kind() -> None:
    kinds = finding_kinds()
    assert kinds
    text = (DOCS / "findings.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^## `([^`]+)`\s*$", text, re.MULTILINE))
    missing = [k for k in kinds if k not in headings]
    assert not missing, f"docs/findings.md has no '## `kind`' section for {missing}"


def test_relative_links_in_readme_and_docs_point_at_existing_files() -> None:
    pages = [README, ROOT / "benchmarks" / "README.md", *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
