"""The dashboard in a real browser (Debian's headless Chromium driven by Playwright): every
page of a real 2-rank run of samples/train_ddp.py, of a real 4-rank run whose rank 2 runs its
forward pass 16 times (the straggler), and of a synthetic 8-GPU run with a throttled GPU. Each page
must show its elements with no browser console error; the straggler must stand out. Screenshots
go to test-artifacts/dashboard/ (gitignored) for people to look at.

Skipped when Chromium or Playwright is missing (`make test` installs Chromium)."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._jobs import ROOT, SAMPLES, browser_timeout_ms
from tests.unit.test_dashboard import SYNTH_STRAGGLER, baseline_run, synth_run  # noqa: F401

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
PAGES = {"/": "page-overview", "/steps": "page-steps", "/stragglers": "page-stragglers",
         "/gaps": "page-gaps", "/communication": "page-communication",
         "/counters": "page-counters", "/compare": "page-compare", "/memory": "page-memory",
         "/operators": "page-operators"}
STRAGGLER = 2  # slow_compute_run: rank 2 runs its forward pass 16 times

if not CHROMIUM.exists():
    pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium; `make test` does)",
                allow_module_level=True)
if importlib.util.find_spec("playwright") is None:
    pytest.skip("the playwright Python package is not installed (pip install -e '.[dev]')",
                allow_module_level=True)

# Every figure drawn, no callback pending: the page is what the user sees.
SETTLED = """(pageId) => {
  const page = document.getElementById(pageId);
  if (!page) return false;
  if (document.querySelector('[data-dash-is-loading="true"]')) return false;
  const graphs = page.querySelectorAll('.dash-graph');
  for (const g of graphs) { if (!g.querySelector('.main-svg')) return false; }
  return true;
}"""


@pytest.fixture(scope="session")
def sample_run(ddp_runs: dict[int, Path]) -> Path:
    """A healthy 2-rank CPU run with host counters, traced on steps 4-6 (the session's 2-rank
    run: tests/_runs.py)."""
    return ddp_runs[2]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope: Playwright's sync API allows one instance per thread at a time, and the
    # export's browser tests start their own.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def _quiet_handler() -> Any:
    from werkzeug.serving import WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        def log_request(self, *args: Any) -> None:
            pass

    return Quiet


_Quiet = _quiet_handler()


class Served:
    """A run's dashboard on a free loopback port, in a thread of this process."""

    def __init__(self, run: Path, baseline: Path | None = None) -> None:
        from werkzeug.serving import make_server

        from uberprof.dashboards.app import create_app
        from uberprof.dashboards.data import RunData

        self.data = RunData(root=run, baseline=baseline).load()
        self.data.warm()
        self.server = make_server("127.0.0.1", 0, create_app(self.data).server, threaded=True,
                                  request_handler=_Quiet)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


def _served(run: Path, baseline: Path | None = None) -> Iterator[Served]:
    s = Served(run, baseline)
    yield s
    s.close()


@pytest.fixture(scope="module")
def sample(sample_run: Path) -> Iterator[Served]:
    yield from _served(sample_run)


@pytest.fixture(scope="module")
def straggler(slow_compute_run: Path) -> Iterator[Served]:
    yield from _served(slow_compute_run)


@pytest.fixture(scope="module")
def synthetic(synth_run: Path) -> Iterator[Served]:  # noqa: F811
    yield from _served(synth_run)


@pytest.fixture(scope="module")
def compared(synth_run: Path, baseline_run: Path) -> Iterator[Served]:  # noqa: F811
    yield from _served(synth_run, baseline_run)


@pytest.fixture(scope="module", autouse=True)
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


class Visit:
    """One page load: the Playwright page, and the console errors it raised."""

    def __init__(self, browser: Any, served: Served, path: str, name: str) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.set_default_timeout(browser_timeout_ms())
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.served = served
        self.name = name
        self.goto(path)

    def goto(self, path: str) -> None:
        self.page.goto(self.served.url + path)
        self.settle(PAGES[path.split("?")[0]])

    def settle(self, page_id: str) -> None:
        self.page.wait_for_function(SETTLED, arg=page_id, timeout=browser_timeout_ms(40),
                                    polling=100)
        self.page.wait_for_timeout(300)

    def text(self, selector: str) -> str:
        """All the text under `selector`, SVG text of figures included."""
        return self.page.locator(selector).first.text_content() or ""

    def count(self, selector: str) -> int:
        return self.page.locator(selector).count()

    def done(self) -> None:
        """Screenshot, then no console error may have happened."""
        self.page.screenshot(path=str(ARTIFACTS / f"{self.name}.png"), full_page=True)
        errors, self.errors = self.errors, []
        self.page.close()
        assert not errors, f"browser console errors on {self.name}: {errors}"


def _visit(browser: Any, served: Served, path: str, label: str) -> Visit:
    name = f"{label}-{path.strip('/').split('?')[0] or 'overview'}"
    return Visit(browser, served, path, name)


# --- a real healthy run -----------------------------------------------------------------------

def test_sample_run_every_page(browser: Any, sample: Served) -> None:
    # No fault injected, but on a busy 2-core machine one rank can really be slower: the page
    # must say what the diagnosis says (tests/test_dashboard.py covers "none" deterministically).
    found = sample.data.straggler_rank()
    v = _visit(browser, sample, "/", "sample")
    assert v.count("#health .card") >= 5
    assert "2" in v.text("#card-ranks")
    assert ("none" if found is None else f"rank {found}") in v.text("#card-straggler")
    assert v.count("#step-heatmap .main-svg") and v.count("#rank-breakdown .main-svg")
    assert v.count("#step-heatmap .hm image") or v.count("#step-heatmap .heatmaplayer")
    assert v.count("#rank-breakdown .barlayer .point") >= 2 * 5 - 1
    assert v.count("#findings .finding, #findings .notice") >= 1
    v.done()

    v = _visit(browser, sample, "/steps?step=5", "sample")
    assert v.count("#step-timeline .main-svg") and v.count("#arrivals-table tr") >= 3
    assert "rank 0" in v.text("#step-timeline") and "rank 1" in v.text("#step-timeline")
    v.done()

    v = _visit(browser, sample, "/stragglers", "sample")
    assert ("No persistent straggler" if found is None else f"rank {found}") in \
        v.text("#straggler-verdict")
    assert v.count("#lateness-heatmap .main-svg") and v.count("#ranking-table tr") == 3
    v.done()

    v = _visit(browser, sample, "/gaps", "sample")
    assert v.count("#gaps-by-rank .main-svg") and v.count("#gaps-table tr") >= 2
    v.done()

    v = _visit(browser, sample, "/communication", "sample")
    assert "allreduce" in v.text("#classes-table") and v.count("#busbw .main-svg")
    v.done()

    v = _visit(browser, sample, "/counters", "sample")
    assert v.count("#counters-graph .main-svg")
    assert "host CPU" in v.text("#counters-graph")
    assert "No GPU counters" in v.text("#page-counters")  # a CPU machine: it says so
    v.done()


def test_links_carry_the_selection(browser: Any, sample: Served) -> None:
    v = _visit(browser, sample, "/steps?rank=1&step=5", "sample-nav")
    assert v.text("#sel-rank") == "rank 1" and v.text("#sel-step") == "step 5"
    v.page.click("#nav-gaps")
    v.page.wait_for_url("**/gaps?rank=1&step=5")
    v.settle("page-gaps")
    assert "Largest gaps of rank 1" in v.text("#largest-gaps")
    v.page.click("#nav-overview")
    v.page.wait_for_url("**/?rank=1&step=5")
    v.settle("page-overview")
    # a heatmap cell opens that step on /steps
    # The heat map sits below the findings; how far depends on the run's findings, and a
    # mouse click outside the 900-pixel viewport reaches nothing: bring it into view first.
    cells = v.page.locator("#step-heatmap .nsewdrag").first
    cells.scroll_into_view_if_needed()
    box = cells.bounding_box()
    assert box is not None
    v.page.mouse.click(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.25)
    v.page.wait_for_url("**/steps?rank=0&step=*")
    v.settle("page-steps")
    assert v.text("#sel-rank") == "rank 0"
    # picking a step changes the URL and the page
    # Open the menu, enter the filter, pick the one option left. Dash 4's dropdown re-renders
    # while it filters: key-by-key typing lost a character under load ("sep 6": no option),
    # so the filter goes in whole, as a paste does; Enter then takes whichever option is
    # highlighted (measured: step 0, or none), and a mouse click can chase a re-rendered
    # option for a minute: a click event sent to the option itself is what a click amounts to.
    v.page.click("#step-picker")
    v.page.locator("input.dash-dropdown-search:visible").fill("step 6")  # the open menu
    option = v.page.get_by_role("option", name="step 6 · traced", exact=True)
    option.wait_for()
    option.dispatch_event("click")
    v.page.wait_for_url("**/steps?rank=0&step=6")
    v.settle("page-steps")
    assert "Step 6 on every rank" in v.text("#timeline")
    v.done()


# --- a real run with a straggler ----------------------------------------------------------------

def test_straggler_run_highlights_the_straggler(browser: Any, straggler: Served) -> None:
    assert straggler.data.straggler_rank() == STRAGGLER
    label = f"rank {STRAGGLER} ◀ straggler"

    v = _visit(browser, straggler, "/", "straggler")
    assert f"rank {STRAGGLER}" in v.text("#card-straggler")
    assert "bad" in (v.page.get_attribute("#card-straggler", "class") or "")
    finding = v.page.locator("#findings .finding[data-kind='straggler']")
    assert finding.count() == 1
    assert finding.get_attribute("data-ranks") == str(STRAGGLER)
    assert "Remedy" in finding.inner_text()
    assert label in v.text("#rank-breakdown") and label in v.text("#step-heatmap")
    v.done()

    v = _visit(browser, straggler, "/stragglers", "straggler")
    assert v.page.get_attribute("#straggler-verdict", "data-rank") == str(STRAGGLER)
    assert v.page.get_attribute("#straggler-cause", "data-cause") == "compute"
    row = v.page.locator("#ranking-table tr.straggler")
    assert row.count() == 1 and f"rank {STRAGGLER}" in row.inner_text()
    assert label in v.text("#lateness-heatmap")
    v.done()

    traced = straggler.data.traced_steps()
    v = _visit(browser, straggler, f"/steps?step={traced[len(traced) // 2]}", "straggler")
    assert label in v.text("#step-timeline")
    rows = v.page.locator("#arrivals-table tr.straggler")
    assert rows.count() >= 1 and f"rank {STRAGGLER}" in rows.first.inner_text()
    v.done()

    for path in ("/gaps", "/communication", "/counters"):
        v = _visit(browser, straggler, path, "straggler")
        if path == "/counters":  # recorded with --counters none
            assert v.count("#no-counters") == 1 and "No counters" in v.text("#missing")
        elif path == "/gaps":
            assert label in v.text("#gaps-by-rank")
        else:
            assert label in v.text("#comm-by-rank")
        v.done()


# --- a synthetic GPU run: GPU counters, throttling -----------------------------------------------

def test_synthetic_gpu_run_counters_and_throttle(browser: Any, synthetic: Served) -> None:
    v = _visit(browser, synthetic, "/", "synthetic")
    assert f"rank {SYNTH_STRAGGLER}" in v.text("#card-straggler")
    assert "clock_throttle" in v.text("#card-straggler")
    v.done()

    v = _visit(browser, synthetic, f"/stragglers?rank={SYNTH_STRAGGLER}", "synthetic")
    text = v.text("#rank-counters")
    assert "SM clock" in text and "temperature" in text and f"rank {SYNTH_STRAGGLER}" in text
    v.done()

    v = _visit(browser, synthetic, f"/counters?rank={SYNTH_STRAGGLER}", "synthetic")
    assert "gpu1" in v.text("#throttle-note")
    assert "GPU SM clock" in v.text("#counters-graph")
    assert v.count("#counters-graph .shapelayer path") >= 1  # throttle and traced bands
    v.done()

    for path in ("/steps", "/gaps", "/communication"):
        _visit(browser, synthetic, path, "synthetic").done()


# --- a real GPU run: memory per rank -------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_sample(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """samples/gpu/gloo2 (two ranks sharing an H100, samples/gpu/README.md), copied: the
    analysis writes into the run directory."""
    import shutil

    run = Path(shutil.copytree(SAMPLES / "gpu" / "gloo2",
                               tmp_path_factory.mktemp("dash-gpu") / "gloo2"))
    yield from _served(run)


def test_gpu_sample_memory_page(browser: Any, gpu_sample: Served) -> None:
    import json

    v = _visit(browser, gpu_sample, "/memory?rank=1", "gpu")
    assert v.count("#memory-gpu .main-svg") and v.count("#memory-rss .main-svg")
    assert v.count("#memory-gpu .scatterlayer .trace") == 4  # in use and peak, per rank
    assert v.count("#memory-rss .scatterlayer .trace") == 2
    assert "rank 1 in use" in v.text("#memory-gpu") and "GiB allocated" in v.text("#memory-gpu")
    assert v.count("#memory-table tbody tr") == 2
    assert "selected" in (v.page.locator("#memory-table tbody tr").nth(1)
                          .get_attribute("class") or "")
    truth = json.loads((SAMPLES / "gpu" / "gloo2.memory.1").read_text())["max_memory_allocated"]
    from uberprof.units import fmt_bytes

    assert fmt_bytes(truth) in v.text("#memory-table")
    assert v.text("#nav-memory") == "Memory"
    v.done()


@pytest.fixture(scope="module")
def memory_run(modules_memory_run: Path) -> Iterator[Served]:
    """A 2-rank CPU run of samples/train_ddp.py whose window records the allocator's events
    (`--profile-memory`, steps 3-5; the session's run of tests/_runs.py)."""
    yield from _served(modules_memory_run)


def test_memory_page_draws_the_trace_windows_timeline(browser: Any, memory_run: Served
                                                      ) -> None:
    from uberprof.units import fmt_bytes

    entries = memory_run.data.diagnose().run["memory_timeline"]["ranks"]
    v = _visit(browser, memory_run, "/memory", "memory-window")
    assert v.count("#memory-window .main-svg")
    assert v.count("#memory-window .scatterlayer .trace") == 2 * len(entries)  # line, peak
    drawn = v.text("#memory-window")
    assert "MiB allocated" in drawn
    top = max(entries, key=lambda e: e["peak_allocated_bytes"])  # labelled; the rest on hover
    assert (f"peak {fmt_bytes(top['peak_allocated_bytes'])}, step {top['peak_step']}, "
            f"{top['peak_operator']}") in drawn
    assert v.count("#memory-window-table tbody tr") == len(entries)
    v.done()


def _column(v: Visit, column: str) -> list[str]:
    """The cells of one column of the operators table, top to bottom, as shown."""
    return [c.strip() for c in v.page.locator(
        f'#operators-table td.dash-cell[data-dash-column="{column}"]').all_inner_texts()]


def test_gpu_sample_operators_page(browser: Any, gpu_sample: Served) -> None:
    """The report's operators in a table that sorts in the browser; a row picked draws that
    operator on both ranks; the kind selector switches to the kernels."""
    doc = gpu_sample.data.diagnose().run["operators"]
    v = _visit(browser, gpu_sample, "/operators", "gpu")
    assert v.text("#nav-operators") == "Operators"
    names = _column(v, "name")
    assert len(names) == len(doc["operators"]) == 30 and names[0] == doc["operators"][0]["name"]
    assert v.count("#operators-ranks .barlayer .point") == 2  # the top operator, per rank
    assert names[0] in v.text("#operators-picked")

    calls = [int(c) for c in _column(v, "calls")]
    assert calls != sorted(calls)  # by self time, not by calls
    v.page.click('#operators-table th[data-dash-column="calls"] .column-header--sort')
    v.page.wait_for_function("""(first) => {
        const c = document.querySelector(
            '#operators-table td.dash-cell[data-dash-column="calls"]');
        return c && c.innerText.trim() !== first; }""", arg=str(calls[0]))
    shown = [int(c) for c in _column(v, "calls")]
    assert shown in (sorted(calls), sorted(calls, reverse=True)) and sorted(shown) == sorted(calls)
    v.page.screenshot(path=str(ARTIFACTS / "gpu-operators-sorted.png"), full_page=True)

    pick = _column(v, "name")[4]  # a row of the sorted table: the same operator is drawn
    v.page.locator('#operators-table td.dash-cell[data-dash-column="name"]').nth(4).click()
    v.page.wait_for_function(
        "(n) => document.querySelector('#operators-picked').innerText.startsWith(n + ':')",
        arg=pick)
    v.settle("page-operators")
    assert v.count("#operators-ranks .barlayer .point") == 2
    assert "rank 1" in v.text("#operators-ranks") and "self time per step" in \
        v.text("#operators-ranks")

    v.page.get_by_label("kernels", exact=False).first.check()
    v.page.wait_for_function(
        "() => document.querySelector('#operators-table th[data-dash-column=\"total_pct\"]')"
        "?.innerText.includes('device')")
    v.settle("page-operators")
    kernels = [e for e in doc["kernels"] if e["kind"] == "kernel"]
    assert len(_column(v, "name")) == len(kernels)
    assert v.count("#operators-ranks .barlayer .point") == 2
    assert "device time per step" in v.text("#operators-ranks")
    v.done()


# --- two runs compared, and values of the URL the run does not have ----------------------------

def test_compare_page(browser: Any, compared: Served) -> None:
    from uberprof.dashboards.queries.compare import comparison

    doc = comparison(compared.data).doc
    st = doc["step_time_ms"]
    v = _visit(browser, compared, "/compare", "compared")
    assert v.page.get_attribute("#compare-verdict", "data-verdict") == st["verdict"] == "slower"
    assert f"{st['ratio']:.3f}" in v.text("#card-ratio")
    assert st["test"]["reason"] in v.text("#compare-headline")
    assert v.count("#compare-breakdown-table tbody tr") == len(doc["breakdown"])
    assert v.count("#compare-ops-table tbody tr") == min(len(doc["ops"]), 30)
    assert v.count("#compare-breakdown-graph .main-svg")
    assert "bad" in (v.page.get_attribute("#card-verdict", "class") or "")
    v.page.screenshot(path=str(ARTIFACTS / "compared-compare-page.png"), full_page=True)
    v.page.click("#nav-overview")  # the other pages are this run's (B)
    v.page.wait_for_url("**/")
    v.settle("page-overview")
    assert v.count("#nav-compare") == 1
    v.done()


def test_a_rank_the_run_does_not_have(browser: Any, synthetic: Served) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(browser_timeout_ms())
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(synthetic.url + "/steps?rank=99999999999999999999999")
    page.wait_for_selector("#page-bad-selection", timeout=browser_timeout_ms(40))
    text = page.locator("#page-bad-selection").inner_text()
    assert "No such rank" in text and "Traceback" not in text
    assert str(synthetic.data.root) not in page.content()
    page.screenshot(path=str(ARTIFACTS / "synthetic-bad-rank.png"), full_page=True)
    page.close()
    assert not errors
