"""The tables: what `uberprof analyze` writes under `derived/` and every later stage reads.

Each Kineto trace is read once (the map, `rank.py`, on `pool.py`'s processes or Dask) into
per-trace tables; the reduce (`reduce.py`) joins them into run tables; `context.py` hands them
to the diagnosis; `collectives.py` matches collective calls across ranks and `align.py` puts the
ranks on one clock. `derived.py` alone knows where a table lives and whether it is fresh.
Nothing here reads a verdict: the diagnosis (`uberprof.analysis.diagnosis`) builds on these.
"""
