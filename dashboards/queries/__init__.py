"""One query module per page over the shared core (`uberprof.dashboards.data.RunData`)."""
