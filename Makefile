# r2vpo — the two commands that matter are `make demo` and `make test`.
# Both fetch what they need first (`make deps`: pinned, checksum-verified
# wheels from PyPI, unpacked into the git-ignored .deps/).

SHELL := /bin/bash
PYTHON ?= python3
CARGO ?= cargo
# candle re-reads /proc/cpuinfo on every matmul unless this is set.
export RAYON_NUM_THREADS ?= $(shell nproc 2>/dev/null || echo 2)
export CARGO_BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BIN := target/release/r2vpo

.PHONY: deps build demo test test-conformance bench lint clippy fmt fmt-check clean-deps

deps:
	@command -v $(PYTHON) >/dev/null || { echo "deps: error: $(PYTHON) not found; install Python 3 with pip" >&2; exit 1; }
	@$(PYTHON) scripts/deps.py
	@bash scripts/redis.sh

build: deps
	$(CARGO) build --release -p r2vpo-cli

demo: build
	@bash scripts/demo.sh $(BIN)

test: deps
	$(CARGO) test --workspace

# Opt-in: the rollout/log-prob contract against llama.cpp's server
# (llama-cpp-python, compiled on first use, ~5 min), which nobody here wrote.
test-conformance: deps
	@bash scripts/conformance/setup.sh
	$(CARGO) test --workspace --test conformance_llamacpp -- --ignored

bench: build
	$(BIN) bench core

lint clippy: deps
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clean-deps:
	rm -rf .deps
