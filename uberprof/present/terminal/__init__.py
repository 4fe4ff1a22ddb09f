"""Terminal presenters: the rich tables and text each CLI verb prints, one module per verb.

The CLI modules parse options and call these; nothing here computes a metric.
(`uberprof report`'s renderer is `uberprof.present.report_terminal`.)
"""
