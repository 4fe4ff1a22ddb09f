"""A trace window's memory budget (collect/rank/window_memory.py): when a window stops early,
and how `info` names a window that did."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.test_bad_input_run import make_run
from uberprof.collect.config import CollectConfig
from uberprof.collect.rank.window_memory import MB, WindowMemory
from uberprof.inventory import inventory


def _readings(*values: int | None):
    it = iter(values)
    return lambda: next(it)


def test_a_window_stops_once_its_memory_grew_past_the_given_budget() -> None:
    m = WindowMemory(100, local_ranks=4, resident=_readings(500 * MB, 550 * MB, 600 * MB,
                                                            601 * MB),
                     available=lambda: 1 << 40)
    m.start()
    assert m.budget == 100 * MB  # given: the host's memory plays no part
    assert m.over() is None  # +50 MB
    assert m.over() is None  # +100 MB: not beyond
    cut = m.over()
    assert cut is not None and cut.grown == 101 * MB and "101 MB" in cut.words()


def test_the_default_budget_is_half_the_available_memory_shared_by_the_hosts_ranks() -> None:
    m = WindowMemory(None, local_ranks=4, resident=lambda: 0, available=lambda: 16_000 * MB)
    m.start()
    assert m.budget == 2_000 * MB


def test_no_budget_holds_when_turned_off_or_memory_cannot_be_read() -> None:
    for m in (WindowMemory(0, 1, resident=lambda: 0, available=lambda: MB),
              WindowMemory(None, 1, resident=lambda: None, available=lambda: MB),
              WindowMemory(None, 1, resident=lambda: 0, available=lambda: None)):
        m.start()
        assert m.budget is None and m.over() is None


def test_the_budget_travels_to_the_ranks_and_a_bad_one_reads_as_the_default() -> None:
    env = {"UBERPROF_CONFIG": CollectConfig(window_memory_mb=64).to_env()}
    assert CollectConfig.from_env(env).window_memory_mb == 64
    env = {"UBERPROF_CONFIG": json.dumps({"window_memory_mb": "lots"})}
    assert CollectConfig.from_env(env).window_memory_mb is None


def test_info_names_a_window_cut_short_with_its_growth_and_budget(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    meta_file = run / "ranks" / "1" / "rank.json"
    meta = json.loads(meta_file.read_text())
    meta["trace"]["cut_short"] = [{"window": [2, 9], "last": 5, "grown_mb": 2100,
                                   "budget_mb": 2000}]
    meta_file.write_text(json.dumps(meta))
    inv = inventory([run])
    [said] = [p for p in inv["problems"] if "stopped after step 5" in p]
    assert said.startswith("rank 1: trace window 2-9 stopped after step 5")
    assert "2100 MB" in said and "2000 MB" in said and "--window-memory-mb" in said
    assert [r["trace_cut_short"] != [] for r in inv["ranks"]] == [False, True]
