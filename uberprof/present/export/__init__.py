"""`uberprof export`: every rank's traces merged into one clock-aligned timeline, with
uberprof's findings and the node counters beside them, for Perfetto or chrome://tracing.

    from uberprof.analysis.read import open_run
    from uberprof.present.export import ExportOptions, export_trace
    export_trace(open_run("uberprof-runs/RUN"), "run.json.gz", ExportOptions(steps=(10, 12)))

The export reads an opened run and computes nothing of the analysis. merge.py runs the stages:
window.py selects ranks, files and time span; plan.py lays out processes, marks and the size
budget's cut (budget.py), and autosteps.py the steps that fit when no `--steps` was given and
what is never dropped exceeds the budget (from stepfit.py's per-step tally); source.py scans a
trace file, events.py decides which of its events go, tracks.py writes them on the rank's
tracks; findings.py turns the diagnosis into marks and overlay.py writes them with the node
counters (counters.py); writer.py, chrome.py and perfetto.py write the file.
"""

from uberprof.present.export.merge import export_trace
from uberprof.present.export.options import (
    DEFAULT_MAX_MB,
    ExportError,
    ExportOptions,
    ExportResult,
)

__all__ = ["DEFAULT_MAX_MB", "ExportError", "ExportOptions", "ExportResult", "export_trace"]
