"""`uberprof export`: every rank's traces merged into one clock-aligned timeline, with
uberprof's findings and the node counters beside them, for Perfetto or chrome://tracing.

    from uberprof.present.export import ExportOptions, export_trace
    export_trace("uberprof-runs/RUN", "run.json.gz", ExportOptions(steps=(10, 12)))
"""

from uberprof.present.export.merge import (
    DEFAULT_MAX_MB,
    ExportError,
    ExportOptions,
    ExportResult,
    export_trace,
)

__all__ = ["DEFAULT_MAX_MB", "ExportError", "ExportOptions", "ExportResult", "export_trace"]
