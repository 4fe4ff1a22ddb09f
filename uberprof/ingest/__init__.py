"""Kineto traces -> columnar event tables (see trace.py) and where to find them (discover.py)."""

from uberprof.ingest.table import EVENT_SCHEMA
from uberprof.ingest.trace import IngestedTrace, TraceError, ingest_trace

__all__ = ["EVENT_SCHEMA", "IngestedTrace", "TraceError", "ingest_trace"]
