# Two commands: `make demo` and `make test`. Both set up everything they need in .venv first.
# `make test-fast`: the unit tests alone (tests/unit: no job, browser, terminal or namespace).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build on a machine without GPU; set TORCH_SPEC (e.g. TORCH_SPEC=torch) for a GPU build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
DEMO_OUT := uberprof-runs
DEMO_RUN := demo-$(shell date +%Y%m%d-%H%M%S)
DEMO_PORT ?= 8050

.PHONY: setup demo test test-fast bench bench-compare lint clean netns-tools browser terminal-tools \
	prometheus

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	@echo "== a 2-rank DDP job on this machine, under uberprof run"
	$(BIN)/uberprof run --out $(DEMO_OUT) --run-id $(DEMO_RUN) -- \
		$(BIN)/torchrun --standalone --nproc_per_node=2 samples/train_ddp.py --steps 30
	@echo "== what was collected"
	$(BIN)/uberprof info $(DEMO_OUT)/$(DEMO_RUN)
	@echo "== what holds it back"
	-$(BIN)/uberprof report $(DEMO_OUT)/$(DEMO_RUN)
	@echo "== its dashboard (Ctrl-C to stop)"
	$(BIN)/uberprof dashboard $(DEMO_OUT)/$(DEMO_RUN) --port $(DEMO_PORT)

# tests/unit first (fast, no jobs), then tests/jobs (real jobs, browsers, terminals, namespaces).
# The unit tests start no job, so they run on UNIT_WORKERS processes (pytest-xdist), a test
# file per worker at a time. tests/jobs runs on JOBS_WORKERS (0: serial): run serially it used
# 57% of two cores (hang timeouts, browsers and jobs starting are waits); a file's tests stay on
# one worker, and each run that files share is made once, by the first worker that needs it
# (tests/_made_once.py). Tests marked
# `solo` time their jobs against each other (what-if projections against the measured fix),
# which a neighbouring test's jobs would change: they run after the rest, one at a time.
UNIT_WORKERS ?= 2
JOBS_WORKERS ?= 2
UNIT_PYTEST := $(BIN)/python -m pytest -q -ra -n $(UNIT_WORKERS) --dist loadfile tests/unit

test: $(STAMP) netns-tools browser terminal-tools prometheus
	$(UNIT_PYTEST)
	$(BIN)/python -m pytest -q -ra -n $(JOBS_WORKERS) --dist loadfile --durations=25 \
		-m "not solo" tests/jobs
	$(BIN)/python -m pytest -q -ra -m solo tests/jobs

# tests/unit only: no training job, browser, terminal or network namespace (a minute or two).
test-fast: $(STAMP)
	$(UNIT_PYTEST)

# Multi-node tests run "nodes" in network namespaces; they need root, iproute2 and unshare.
netns-tools:
	@command -v ip >/dev/null || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null)

# The dashboard's browser tests drive Debian's Chromium (Playwright's own download does not work).
browser:
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# `uberprof run --metrics-port` is scraped by a real Prometheus server (Debian's, with promtool).
prometheus:
	@command -v prometheus >/dev/null || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && apt-get install -y -qq prometheus >/dev/null)

# `uberprof watch` and `uberprof run`'s terminal handling are tested in a real terminal (tmux).
terminal-tools:
	@command -v tmux >/dev/null || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && apt-get install -y -qq tmux >/dev/null)

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

# This checkout against an older one, interleaved pairs (benchmarks/compare.py): BASE=commit,
# else the last tag. COMPARE_ARGS passes more options (e.g. --only report --ranks 64).
BASE ?=
COMPARE_ARGS ?=
bench-compare: $(STAMP)
	$(BIN)/python benchmarks/compare.py $(if $(BASE),--base $(BASE)) $(COMPARE_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check uberprof dashboards tests benchmarks samples

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
