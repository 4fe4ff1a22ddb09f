"""One module per page: `PATH`, `TITLE`, `layout(data, selection)` and `register(app, data_of)`
for the page's callbacks (which only ever change the URL)."""
