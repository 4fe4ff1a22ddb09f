"""The uberprof dashboard: a Plotly Dash app over one run's analysis tables.

`uberprof dashboard RUN` serves it; in Python: `create_app(get_run(path))` (dashboards.app,
dashboards.data). Pages live in `dashboards.pages`, one module each.
"""
