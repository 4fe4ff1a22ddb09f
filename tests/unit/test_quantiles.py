"""The numpy quantiles that replaced the reduce's two DuckDB queries (issue 51): the same
figures as DuckDB's `median`, `quantile_cont` and GROUP BY on the same data."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from uberprof.analysis.tables import quantiles as Q
from uberprof.analysis.tables.overview import step_quantiles
from uberprof.analysis.tables.shares import COLLECTIVE_KINDS_SCHEMA, collective_kinds


def _sets(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 10 ** int(rng.integers(1, 13)), int(rng.integers(1, 80)))
            for _ in range(count)]


def test_median_is_duckdbs_to_the_bit_and_p90_to_the_last_bit() -> None:
    for v in _sets(7, 300):
        with duckdb.connect() as con:
            con.register("s", pa.table({"x": v}))
            med, p90 = con.execute("SELECT median(x), quantile_cont(x, 0.9) FROM s").fetchone()
        assert Q.quantile_cont(v, 0.5) == med
        assert Q.quantile_cont(v, 0.9) == pytest.approx(p90, rel=4e-16, abs=0)


def test_quantile_of_nothing_is_none_and_of_one_value_that_value() -> None:
    assert Q.quantile_cont(np.zeros(0, np.int64), 0.5) is None
    assert Q.quantile_cont(np.array([42]), 0.9) == 42.0
    assert Q.quantile_cont(np.array([4, 1, 3, 2]), 0.5) == 2.5


def test_group_quantiles_are_duckdbs_grouped_medians_and_nan_for_an_empty_group() -> None:
    rng = np.random.default_rng(3)
    v = rng.integers(0, 10**9, 500)
    g = rng.choice([0, 1, 2, 4], 500)  # group 3 has no value
    out = Q.group_quantiles(g, v, 5, 0.5)
    with duckdb.connect() as con:
        con.register("s", pa.table({"x": v, "g": g}))
        want = dict(con.execute("SELECT g, median(x) FROM s GROUP BY g").fetchall())
    assert {k: out[k] for k in want} == want
    assert math.isnan(out[3])


def _collectives(seed: int, n: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 10**9, n)
    names = rng.choice(["allreduce", "broadcast", None], n)
    size = rng.choice([1024, 4096, -1], n)
    return pa.table({
        "rank": rng.integers(0, 4, n),
        "name": pa.array(names.tolist(), pa.string()),
        "event": pa.array([f"ncclKernel_{i % 3}" for i in range(n)], pa.string()),
        "start_ns": start, "end_ns": start + rng.integers(1, 10**7, n),
        "in_bytes": pa.array([None if s < 0 or i % 5 == 0 else int(s)
                              for i, s in enumerate(size)], pa.int64()),
        "out_bytes": pa.array([None if s < 0 else 2 * int(s) for s in size], pa.int64()),
    })


def test_collective_kinds_are_what_the_query_they_replace_gives() -> None:
    c = _collectives(11, 400)
    got = collective_kinds(c)
    with duckdb.connect() as con:
        con.register("c", c)
        want = con.sql("""
            SELECT coalesce(name, event) AS name, coalesce(in_bytes, out_bytes) AS bytes,
                   count(*) AS calls, count(DISTINCT rank) AS ranks,
                   sum(end_ns - start_ns) / 1e6 AS total_ms,
                   median(end_ns - start_ns) / 1e6 AS median_ms
            FROM c GROUP BY ALL ORDER BY total_ms DESC, name, bytes
        """).to_arrow_table()
    assert got.schema == COLLECTIVE_KINDS_SCHEMA
    assert got.to_pylist() == want.to_pylist()
    assert collective_kinds(c.slice(0, 0)).num_rows == 0


def test_step_quantiles_leave_out_untimed_and_negative_steps() -> None:
    steps = pa.table({
        "step": pa.array([-1, 0, 1, 1, 2, 3, None], pa.int64()),
        "step_time_ns": pa.array([10**9, 2_000_000, 4_000_000, 6_000_000, None, 8_000_000,
                                  10**9], pa.int64()),
        "data_wait_ns": pa.array([5, 1_000_000, None, 3_000_000, 7, 2_000_000, 5], pa.int64()),
    })
    q = step_quantiles(steps)
    assert q == {"step_ms_median": 5.0, "step_ms_p90": 7.4, "steps": 3, "first_step": 0,
                 "last_step": 3, "data_wait_ms_median": 2.0}
    none = step_quantiles(steps.slice(0, 1))
    assert none == {"step_ms_median": None, "step_ms_p90": None, "steps": 0,
                    "first_step": None, "last_step": None, "data_wait_ms_median": None}
