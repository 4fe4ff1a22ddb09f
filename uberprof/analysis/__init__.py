"""Per-rank and cross-rank analysis of ingested traces.

- intervals: interval-set arithmetic (the only place set math lives)
- metrics: one function per metric definition of docs/DESIGN.md
- rank: the per-trace map (trace file -> tables), pool- and Dask-friendly
- derived: the derived folder (layout, manifest, freshness, atomic writing, table readers)
- pool: the map's processes (forked workers, or any executor such as Dask's)
- reduce: the cross-rank reduce (run-level tables)
- pipeline: `analyze`, discovery then the map then the reduce
"""
