# batchd: `make demo` runs the whole flow locally, `make test` runs every test.
# Everything else is optional. `make help` lists the targets.

CARGO ?= cargo
SHELL := /bin/bash

.PHONY: help build demo test lint fmt clean deps bench examples-deps

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install (as root, with apt-get) or name what the tests need from the system: redis-server, faketime, promtool, chromium, chromedriver
	@scripts/deps.sh

build: ## Build the batchd and batchd-emulator binaries
	$(CARGO) build --workspace --bins

demo: deps build ## Start a private redis-server, the emulator (Cloudflare, OpenAI, Anthropic), the daemon and the dashboard; submit four sample jobs; stop everything (DEMO_KEEP_UI=1 keeps the dashboard up)
	@scripts/demo.sh

test: deps examples-deps lint-deploy ## Run every test (unit, golden, integration with real Redis and the emulator, deploy lint)
	$(CARGO) build --workspace --bins --tests
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run --workspace --no-fail-fast; \
	else \
		echo "cargo-nextest not found; using cargo test (install it with: cargo install cargo-nextest)"; \
		$(CARGO) test --workspace --no-fail-fast; \
	fi

examples-deps: ## Install the pinned packages of the example tests: redis-py (target/examples-venv), ioredis (examples/node)
	@command -v python3 >/dev/null || { echo "examples-deps: python3 (3.8 or newer, with venv) is needed: apt-get install python3 python3-venv"; exit 1; }
	@command -v npm >/dev/null || { echo "examples-deps: node 20 and npm are needed: apt-get install nodejs npm"; exit 1; }
	@if [ ! -f target/examples-venv/.installed ] || [ examples/python/requirements.txt -nt target/examples-venv/.installed ]; then \
		python3 -m venv target/examples-venv && \
		target/examples-venv/bin/pip install --quiet --disable-pip-version-check --require-hashes -r examples/python/requirements.txt && \
		touch target/examples-venv/.installed; \
	fi
	@if [ ! -f examples/node/node_modules/.installed ] || [ examples/node/package-lock.json -nt examples/node/node_modules/.installed ]; then \
		(cd examples/node && npm ci --no-audit --no-fund --loglevel=error) && \
		touch examples/node/node_modules/.installed; \
	fi

lint-deploy: ## Check deploy/: systemd-analyze verify + security, kustomize render + strict schema validation, dashboard JSON
	@scripts/lint-deploy.sh

bench: deps ## Benchmarks side by side with BullMQ and apalis-redis (release builds; table + target/bench/report.json; minutes)
	@scripts/bench.sh $(BENCH_ARGS)

.PHONY: chaos
# The release a rolling upgrade starts from (chaos scenario 11-upgrade): the last commit before packs (issue 33).
PREVIOUS_RELEASE ?= 275950c
chaos: deps ## Chaos suite: kill -9, Redis restarts and outages, rolling SIGTERM, a rolling upgrade from PREVIOUS_RELEASE, 100,000-job backlog, clocks ±300 s apart, hostile entries (~15 min, the first run builds the previous release; CHAOS="1-kill9 ..." picks scenarios); target/chaos/report.json
	$(CARGO) build --workspace --bins
	BATCHD_PREVIOUS_RELEASE_BIN="$$(PREVIOUS_RELEASE=$(PREVIOUS_RELEASE) scripts/previous-release.sh)" \
		$(CARGO) run --quiet -p batchd-tests --bin chaos -- $(CHAOS)

.PHONY: ui-screenshots
ui-screenshots: deps ## Refresh the dashboard screenshots of docs/ui.md (a private Redis, the emulator, a daemon, batchd ui, headless Chromium)
	$(CARGO) build --workspace --bins
	$(CARGO) run --quiet -p batchd-tests --bin ui-screenshots -- docs/ui

lint: ## rustfmt check and clippy with warnings denied
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

clean: ## Remove build output
	$(CARGO) clean
