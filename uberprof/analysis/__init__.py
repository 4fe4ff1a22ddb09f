"""Per-rank and cross-rank analysis of ingested traces.

- intervals: interval-set arithmetic (the only place set math lives)
- metrics: one function per metric definition of DESIGN.md
- rank: the per-trace map (trace file -> tables), pool- and Dask-friendly
- pipeline: discovery, the map on a process pool, the cross-rank reduce, derived tables
"""
