"""The diagnosis: from the tables to findings with evidence, remedies and time at stake.

`model.py` holds what a diagnosis is (`Finding`, `Diagnosis`, the schema version); the advisor
(`advisor.py`) runs the per-rank passes, the cross-rank tests and then each finding producer
registered in `findings/`, in order; `saved.py` keeps the result under `derived/`.
"""
