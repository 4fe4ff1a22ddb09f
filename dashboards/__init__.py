"""The uberprof dashboard: a Plotly Dash app over one run's analysis tables and diagnosis.

Installed as `uberprof.dashboards` (the top-level dashboards/ folder of the source tree).
`uberprof dashboard RUN` serves it; in Python: `create_app(get_run(path))`
(`uberprof.dashboards.app`, `uberprof.dashboards.data`). `data.RunData` is the shared core;
each page is a module in `pages/` with a query module of the same name in `queries/`.
"""
