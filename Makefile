# batchd: `make demo` runs the whole flow locally, `make test` runs every test.
# Everything else is optional. `make help` lists the targets.

CARGO ?= cargo
SHELL := /bin/bash

.PHONY: help build demo test lint fmt clean deps

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Check (and, where possible, install) what the tests and the demo need: redis-server
	@scripts/ensure-redis.sh

build: ## Build the batchd and batchd-emulator binaries
	$(CARGO) build --workspace --bins

demo: deps build ## Start a private redis-server, the emulator and the daemon; submit sample jobs; stop everything
	@scripts/demo.sh

test: deps ## Run every test (unit, golden and integration; real Redis, emulator over HTTP)
	$(CARGO) build --workspace --bins --tests
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run --workspace --no-fail-fast; \
	else \
		echo "cargo-nextest not found; using cargo test (install it with: cargo install cargo-nextest)"; \
		$(CARGO) test --workspace --no-fail-fast; \
	fi

lint-deploy: ## Check deploy/: systemd-analyze verify + security, kustomize render + strict schema validation, dashboard JSON
	@scripts/lint-deploy.sh

lint: ## rustfmt check and clippy with warnings denied
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

clean: ## Remove build output
	$(CARGO) clean
