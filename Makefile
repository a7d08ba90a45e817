# fenced-lease. `make test` is what CI runs; it installs or builds what it needs.
SHELL := bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: help test deps lint fmt crds up down bench
help: ## show the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

test: deps lint ## everything: lint, unit and integration tests against a real control plane
	@eval "$$(hack/control-plane up)" && $(CARGO) test --locked

deps: ## Debian packages, Rust components, and the control-plane binaries (cached)
	@hack/deps

lint: ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

fmt: ## format the code
	$(CARGO) fmt --all

crds: ## regenerate crds/ from the Rust types in src/api/
	$(CARGO) run --locked --quiet --bin fenced-lease-crdgen -- --dir crds

up: ## start the local control plane; then: eval "$$(hack/control-plane env)"
	@hack/control-plane up

down: ## stop the local control plane and remove its data
	@hack/control-plane down

bench: deps ## BENCHMARKS.md's tables in one run (not part of test; BENCH_* options: see hack/bench)
	@hack/bench
