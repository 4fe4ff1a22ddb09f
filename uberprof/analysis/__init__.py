"""From traces to verdicts, in two parts that follow the pipeline (docs/DESIGN.md §3-§5).

- `tables/`: what `uberprof analyze` writes under `derived/` (the per-trace map, the cross-rank
  reduce, the metric definitions, collective matching and clock alignment over the tables).
- `diagnosis/`: the findings made from those tables (the model, the finding producers and
  their registry, the advisor that runs them, the saved diagnosis).
- `read.py`: the one way a view opens a run: its tables and its diagnosis.
- `diff/`: two runs compared.
"""
