"""The one rank-id rule (uberprof.rundir.ranks) on well-formed and broken rank folders, and
that every reader (inventory, ingest, counters, step timelines) follows it without crashing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from uberprof.ingest.discover import discover
from uberprof.inventory import inventory
from uberprof.rundir import (
    MAX_RANKS,
    RunDir,
    list_nodes,
    list_ranks,
    parse_rank_dir_name,
    ranks_by_id,
    read_node,
    read_rank,
    read_steps,
)
from uberprof.rundir.counters import rank_pids


def rank_folder(run: Path, name: str, meta: Any = None, raw: str | None = None) -> Path:
    d = run / "ranks" / name
    d.mkdir(parents=True)
    if raw is not None:
        (d / "rank.json").write_text(raw)
    elif meta is not None:
        (d / "rank.json").write_text(json.dumps(meta))
    return d


def test_valid_rank_json_gives_its_rank_and_typed_fields(tmp_path: Path) -> None:
    d = rank_folder(tmp_path, "3", {"rank": 3, "world_size": 4, "host": "h", "pid": 42,
                                    "device": {"uuid": "GPU-1"}, "clock": {"offset": 1},
                                    "end_ns": 7, "local_rank": 1, "extra": [1]})
    m = read_rank(d)
    assert (m.rank, m.world_size, m.host, m.pid, m.local_rank) == (3, 4, "h", 42, 1)
    assert m.device == {"uuid": "GPU-1"} and m.clock == {"offset": 1}
    assert m.readable and m.finished and m.problem is None
    assert m.folder == d and m.raw["extra"] == [1]


def test_rank_json_wins_over_the_folder_name(tmp_path: Path) -> None:
    """The folder name is the agent's guess at claim time; the process group's rank decides."""
    m = read_rank(rank_folder(tmp_path, "1", {"rank": 0}))
    assert m.rank == 0 and m.problem is None


@pytest.mark.parametrize("raw", ["[1, 2]", '"rank"', "null", "7"])
def test_rank_json_not_an_object_falls_back_to_the_folder(tmp_path: Path, raw: str) -> None:
    m = read_rank(rank_folder(tmp_path, "2", raw=raw))
    assert m.rank == 2 and not m.readable
    assert "not a JSON object" in m.problem and "taken from the folder name" in m.problem


@pytest.mark.parametrize("bad", ["3", 3.0, True, None, -1, [3], {"r": 3}, 10**30, MAX_RANKS])
def test_rank_that_is_not_a_sane_int_falls_back_to_the_folder(tmp_path: Path, bad: Any) -> None:
    m = read_rank(rank_folder(tmp_path, "5", {"rank": bad, "world_size": 10**30,
                                              "pid": "12", "device": "cuda:0"}))
    assert m.rank == 5 and m.readable
    assert "is not a rank number" in m.problem and "rank 5 taken from the folder" in m.problem
    assert m.world_size is None and m.pid is None and m.device == {}


def test_huge_rank_everywhere_is_unreadable_and_named(tmp_path: Path) -> None:
    huge = str(10**30)
    m = read_rank(rank_folder(tmp_path, huge, {"rank": 10**30}))
    assert m.rank is None
    assert "not a rank number" in m.problem and "ignored" in m.problem


@pytest.mark.parametrize("raw", [None, '{"rank": 4, "wor', "[" * 100_000 + "]" * 100_000])
def test_missing_or_broken_rank_json_uses_the_folder(tmp_path: Path, raw: str | None) -> None:
    m = read_rank(rank_folder(tmp_path, "4", raw=raw))
    assert m.rank == 4 and not m.readable
    assert ("missing" if raw is None else "unreadable") in m.problem


def test_folder_names_that_are_not_ranks(tmp_path: Path) -> None:
    assert parse_rank_dir_name("0") == (0, 1)
    assert parse_rank_dir_name("0-2") == (0, 2)
    assert parse_rank_dir_name("0-x")[0] == 0
    for name in ("abc", "²", "-1", "x-0", ""):
        assert parse_rank_dir_name(name) is None, name
    m = read_rank(rank_folder(tmp_path, "²"))  # a Unicode digit: isdigit() but not int()
    assert m.rank is None and "ignored" in m.problem


def test_two_folders_for_one_rank(tmp_path: Path) -> None:
    """`0-2` beside `0`: both are listed in claim order, the first claimed is the rank's."""
    for name in ("0-10", "0-2", "0"):
        rank_folder(tmp_path, name, {"rank": 0, "host": name})
    rank_folder(tmp_path, "1", {"rank": 1})
    listed = list_ranks(tmp_path)
    assert [m.folder.name for m in listed] == ["0", "0-2", "0-10", "1"]
    assert [m.rank for m in listed] == [0, 0, 0, 1]
    by_id = ranks_by_id(tmp_path)
    assert sorted(by_id) == [0, 1] and by_id[0].folder.name == "0"
    assert ranks_by_id(listed) == by_id


def test_a_second_claim_that_names_another_rank(tmp_path: Path) -> None:
    """A process that claimed `0-2` but whose process group calls it rank 1 is rank 1."""
    rank_folder(tmp_path, "0", {"rank": 0})
    rank_folder(tmp_path, "0-2", {"rank": 1})
    assert {r: m.folder.name for r, m in ranks_by_id(tmp_path).items()} == {0: "0", 1: "0-2"}


def broken_run(tmp_path: Path) -> Path:
    run = RunDir(tmp_path / "run")
    run.create("r")
    rank_folder(run.root, "0", {"rank": 0, "world_size": 2, "end_ns": 1, "pid": 10,
                                "host": "h"})
    rank_folder(run.root, "0-2", {"rank": 0, "world_size": 2, "end_ns": 1})
    rank_folder(run.root, "1", {"rank": "one", "world_size": 10**30, "pid": 11, "host": "h",
                                "trace": ["not", "a", "dict"]})
    rank_folder(run.root, "7", raw="[]")
    rank_folder(run.root, str(10**30), {"rank": 10**30})
    rank_folder(run.root, "junk", raw="{")
    return run.root


def test_inventory_follows_the_rule_and_names_every_problem(tmp_path: Path) -> None:
    run = broken_run(tmp_path)
    inv = inventory([run], check_traces=False)
    assert [r["rank"] for r in inv["ranks"]] == [0, 0, 1, 7]
    assert [Path(r["dir"]).name for r in inv["ranks"]] == ["0", "0-2", "1", "7"]
    problems = " | ".join(inv["problems"])
    assert "rank 0 appears 2 times" in problems
    assert "rank 'one' is not a rank number" in problems
    assert "7/rank.json: not a JSON object; rank 7 taken from the folder name" in problems
    assert f"{10**30}/rank.json: rank {10**30} is not a rank number" in problems
    assert "junk/rank.json: unreadable" in problems and "junk ignored" in problems
    assert "rank 1 stopped abruptly" in problems
    assert "rank 7 stopped abruptly" not in problems  # unknown, not claimed


def test_other_readers_agree_with_the_rule(tmp_path: Path) -> None:
    run = broken_run(tmp_path)
    hints = {p.name: r for r, p in discover(run).rank_dirs}
    assert hints == {m.folder.name: m.rank for m in list_ranks(run)}
    assert hints["1"] == 1 and hints["7"] == 7 and hints["junk"] is None
    assert rank_pids(run, "h") == {10: 0, 11: 1}


def test_step_timeline_skips_rows_it_cannot_place(tmp_path: Path) -> None:
    d = rank_folder(tmp_path, "0", {"rank": 0})
    rows = [{"kind": "step", "step": 1, "host_start_ns": 1}, {"kind": "step"},
            {"kind": "step", "step": "2"}, {"kind": "step", "step": True}, [1], 3,
            {"kind": "gpu", "step": 1, "gpu_ns": 5}, {"kind": "step", "step": 0}]
    (d / "steps.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    steps, truncated = read_steps(d)
    assert not truncated
    assert steps == [{"step": 0}, {"step": 1, "host_start_ns": 1, "gpu_ns": 5}]


def test_node_json_read_safely(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    good = run.nodes_dir / "n1"
    good.mkdir(parents=True)
    (good / "node.json").write_text(json.dumps({"node": "other", "host": "h", "exit_code": 0,
                                                "command": ["torchrun", 3], "end_ns": 2}))
    bad = run.nodes_dir / "n2"
    bad.mkdir()
    (bad / "node.json").write_text("[]")
    n = read_node(good)
    assert (n.node, n.host, n.exit_code, n.command, n.end_ns) == ("n1", "h", 0,
                                                                  ["torchrun", "3"], 2)
    assert n.readable and n.problem is None
    nodes = list_nodes(tmp_path)
    assert [x.node for x in nodes] == ["n1", "n2"]
    assert not nodes[1].readable and "not a JSON object" in nodes[1].problem


def test_dashboard_step_timelines_follow_the_rule(tmp_path: Path) -> None:
    """A run without traces: the dashboard names ranks as rank.json does, once per rank."""
    from uberprof.dashboards.data import RunData

    run = RunDir(tmp_path / "run")
    run.create("r")
    rows = "".join(json.dumps({"kind": "step", "step": s, "host_start_ns": 10 * s,
                               "host_end_ns": 10 * s + 5}) + "\n" for s in range(3))
    for name, rank in (("0", 0), ("0-2", 0), ("5", 1)):
        d = rank_folder(run.root, name, {"rank": rank, "host": f"h{name}"})
        (d / "steps.jsonl").write_text(rows)
    data = RunData(root=run.root, workers=1).load()
    ranks = data.steps.column("rank").to_pylist()
    assert sorted(ranks) == [0, 0, 0, 1, 1, 1]
    assert data.host_of(0) == "h0" and data.host_of(1) == "h5"


@pytest.mark.parametrize("kind", ["folder", "device link", "dangling link"])
def test_a_step_file_that_cannot_be_read_is_named_and_read_as_empty(tmp_path: Path,
                                                                    kind: str) -> None:
    from uberprof.rundir.ranks import read_step_timeline
    from uberprof.rundir.step_table import read_step_table

    d = rank_folder(tmp_path / "run", "0", {"rank": 0, "end_ns": 2, "exit": "exit"})
    (tmp_path / "run" / "run.json").write_text(json.dumps({"run_id": "r"}))
    steps = d / "steps.jsonl"
    if kind == "folder":
        steps.mkdir()
    elif kind == "device link":
        steps.symlink_to("/dev/zero")  # read to the end, it never ends
    else:
        steps.symlink_to(d / "gone.jsonl")
    timeline = read_step_timeline(d)
    assert timeline.steps == [] and timeline.unread
    assert read_step_table(d, ("host_end_ns",)).table.num_rows == 0
    inv = inventory([tmp_path / "run"], check_traces=False)
    [rank] = inv["ranks"]
    assert rank["steps"] is None  # unknown, not 0
    problems = " | ".join(inv["problems"])
    assert f"{steps}: not read" in problems
    assert "recorded 0 steps" not in problems  # no advice about optimizer.step()


def test_inside_listed_once_a_run_is_listed_once_and_outside_afresh(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The dashboard's start lists the ranks once for the analysis, the diagnosis and the
    counters: inside `listed_once` every reader of a run gets the first listing (a folder
    added meanwhile is not seen, nor read again); after it, a listing is read afresh."""
    from uberprof.rundir import ranks as mod

    for r in range(3):
        rank_folder(tmp_path, str(r), {"rank": r})
    reads: list[str] = []
    real = mod.read_rank
    monkeypatch.setattr(mod, "read_rank", lambda p: reads.append(p.name) or real(p))
    with mod.listed_once():
        first = list_ranks(tmp_path)
        rank_folder(tmp_path, "3", {"rank": 3})
        with mod.listed_once():  # nested: the outer listing still
            again = list_ranks(RunDir(tmp_path / "ranks" / ".."))
        assert sorted(ranks_by_id(tmp_path)) == [0, 1, 2]
    assert [m.rank for m in again] == [m.rank for m in first] == [0, 1, 2]
    assert sorted(reads) == ["0", "1", "2"]
    assert [m.rank for m in list_ranks(tmp_path)] == [0, 1, 2, 3]
