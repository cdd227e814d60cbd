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

.PHONY: vendor-check deps deps-torch build build-torch build-gpu venv-hf bench-hf demo test test-conformance test-peft bench lint clippy fmt fmt-check clean-deps

deps:
	@command -v $(PYTHON) >/dev/null || { echo "deps: error: $(PYTHON) not found; install Python 3 with pip" >&2; exit 1; }
	@$(PYTHON) scripts/deps.py
	@$(PYTHON) scripts/vendor_check.py fetch
	@bash scripts/redis.sh
	@bash scripts/egl.sh
	@PYTHON=$(PYTHON) bash scripts/openai/venv.sh
	@PYTHON=$(PYTHON) bash scripts/math_verify/venv.sh
	@PYTHON=$(PYTHON) bash scripts/brax/venv.sh
	@PYTHON=$(PYTHON) bash scripts/vllm/venv.sh
	@PYTHON=$(PYTHON) bash scripts/losses/venv.sh
	@PYTHON=$(PYTHON) bash scripts/trackers/venv.sh

build: deps
	$(CARGO) build --release -p r2vpo-cli

# libtorch for the torch compute backend (deps-torch.toml: the pinned torch
# 2.11.0 wheel from PyPI, 530 MB, and the two CUDA runtime libraries its CPU
# half loads): `make test` runs the CPU-libtorch parity tests with it.
# TORCH_CPU links the CPU half only and finds it at run time (rpath, or
# LD_LIBRARY_PATH for the tests); a GPU build links all of it and loads the
# GPU machine's own libtorch there (scripts/gpu/check.sh).
TORCH_ENV := LIBTORCH=$(CURDIR)/.deps/libtorch LIBTORCH_CXX11_ABI=1
TORCH_CPU := $(TORCH_ENV) LIBTORCH_LIB=$(CURDIR)/.deps/libtorch/cpu
TORCH_LD := $(CURDIR)/.deps/libtorch/cpu/lib:$(CURDIR)/.deps/cuda/lib
deps-torch:
	@$(PYTHON) scripts/deps.py --manifest deps-torch.toml

# The binary with the torch backend on libtorch's CPU kernels
# (`[model] backend = "torch"`, `bench step --backend torch`), in its own
# target folder: target/torch/release/r2vpo.
build-torch: deps deps-torch
	$(TORCH_CPU) RUSTFLAGS="-C link-arg=-Wl,--disable-new-dtags,-rpath,$(TORCH_LD)" \
	  $(CARGO) build --release -p r2vpo-cli --features torch --target-dir target/torch
	@echo "built: target/torch/release/r2vpo"

# The CUDA build for a GPU machine (not needed by demo/test/CI): fetches the
# pinned CUDA 13.0 toolchain and libraries and libtorch 2.11 from PyPI into
# .deps/, builds with the torch backend (libtorch through tch-rs, the GPU
# learner, with NCCL process groups for the distributed learner) and
# candle's CUDA backend for sm_$(CUDA_COMPUTE_CAP) (the comparison), and
# leaves in dist/gpu/ what to carry there (docs/gpu.md): the stripped
# binary xz-compressed (the raw one is above the 64 MiB carry limit; 32 MiB
# of it candle's prebuilt GGUF/MoE kernels), libmujoco, which it finds
# beside itself ($$ORIGIN), and the embedded SmolLM2's tokenizer as Hugging
# Face files (2 MB; the GPU check's random-weight runs use it, the 98 MB
# GGUF stays here), and PEFT's pure-Python wheels for the LoRA phase's
# PyTorch peer. The binary loads the GPU machine's own libtorch
# (2.11.0+cu130); libtorch_cuda's CUDA libraries are resolved there, not
# here (--allow-shlib-undefined).
CUDA_COMPUTE_CAP ?= 90
CUDA_DEPS := $(CURDIR)/.deps/cuda
build-gpu: build deps-torch
	@$(PYTHON) scripts/deps.py --manifest deps-gpu.toml
	@bash scripts/gpu/cuda_stub.sh $(CUDA_DEPS)
	PATH="$(CUDA_DEPS)/bin:$$PATH" CUDA_ROOT="$(CUDA_DEPS)" CUDARC_CUDA_VERSION=13000 \
	  CUDA_COMPUTE_CAP=$(CUDA_COMPUTE_CAP) LIBRARY_PATH="$(CUDA_DEPS)/lib:$(CUDA_DEPS)/lib/stubs" \
	  $(TORCH_ENV) RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
	  $(CARGO) build --release -p r2vpo-cli --features cuda,torch,nccl --target-dir target/gpu
	@rm -rf dist/gpu && mkdir -p dist/gpu
	strip -o target/gpu/r2vpo-stripped target/gpu/release/r2vpo
	xz -T2 -6 -c target/gpu/r2vpo-stripped > dist/gpu/r2vpo.xz
	cp -L .deps/mujoco/lib/libmujoco.so.3.17.0 dist/gpu/
	$(PYTHON) -m pip download -q --disable-pip-version-check --no-deps --require-hashes \
	  -r scripts/gpu/peft-wheels.txt -d dist/gpu/wheels
	$(BIN) llm info --save-tokenizer dist/gpu/tokenizer > /dev/null
	@ls -l target/gpu/r2vpo-stripped dist/gpu

demo: build
	@bash scripts/demo.sh $(BIN)

# First the vendored candle-core against crates.io's source plus its patch
# (scripts/vendor_check.py). Then --no-fail-fast: every suite runs even when
# one fails; then the torch backend's suites, built with libtorch's CPU half
# (the parity tests against candle, the binary with the torch backend, and
# the server's contract tests again with every server decoding on libtorch,
# and the distributed layer: c10d's Gloo groups, real ranks on loopback,
# data-parallel `llm train` against the one-process run);
# the totals (scripts/test_totals.py) close the output, after what the
# pinned and kernel checks compared (their check-report.txt). Before the
# tests, scripts/check_figures.py recomputes the figures quoted in
# results/**/README.md, docs and the README's status rows from the committed
# raw files. The exit status fails if the vendor check, the figure check or
# cargo failed.
CHECK_REPORT := $(or $(CARGO_TARGET_DIR),target)/tmp/check-report.txt
test: deps deps-torch
	@rm -f $(CHECK_REPORT)
	@vrc=0; $(PYTHON) scripts/vendor_check.py check || vrc=$$?; \
	  frc=0; $(PYTHON) scripts/check_figures.py || frc=$$?; \
	  set -o pipefail; $(CARGO) test --workspace --no-fail-fast 2>&1 | tee .deps/test.log; rc=$$?; \
	  $(TORCH_CPU) LD_LIBRARY_PATH=$(TORCH_LD) $(CARGO) test --no-fail-fast -p r2vpo-llm -p r2vpo-cli \
	    --features r2vpo-llm/torch,r2vpo-cli/torch --test torch_backend --test torch_cli --test serve \
	    --test openai_client --test dist_c10d --test dist_train --test dist --test llm_dist --test gpu_check 2>&1 | tee -a .deps/test.log; \
	  trc=$$?; [ $$rc -ne 0 ] || rc=$$trc; \
	  $(PYTHON) scripts/test_totals.py .deps/test.log $(CHECK_REPORT); \
	  if [ $$vrc -ne 0 ]; then echo "make test: the vendor check failed (above the test output)" >&2; exit $$vrc; fi; \
	  if [ $$frc -ne 0 ]; then echo "make test: a quoted figure differs from its raw file (scripts/check_figures.py, above the test output)" >&2; exit $$frc; fi; \
	  exit $$rc

# Opt-in: the rollout/log-prob contract against llama.cpp's server
# (llama-cpp-python, compiled on first use, ~5 min), which nobody here wrote.
test-conformance: deps
	@bash scripts/conformance/setup.sh
	$(CARGO) test --workspace --test conformance_llamacpp -- --ignored

# Opt-in: LoRA adapters against Hugging Face PEFT (scripts/peft: a pinned,
# hash-checked venv of torch + transformers + PEFT, ~5.6 GB with torch's
# CUDA libraries from PyPI): r2vpo's adapters load in PEFT and PEFT's in
# r2vpo with the same log-probs.
test-peft: deps
	@bash scripts/peft/venv.sh
	$(CARGO) test -p r2vpo-llm --test lora_peft -- --ignored

bench: build
	$(BIN) bench core

# CPU speed and memory against PyTorch + transformers, side by side (#16):
# a pinned venv (scripts/hf/requirements.txt, ~4.7 GB with torch's CUDA
# libraries from PyPI) and one run of scripts/hf/compare.sh, written to
# runs/bench/hf-compare/<date>-<machine>/ (a run kept in git goes to
# results/bench/hf-compare/ under the same name: results/bench/README.md).
venv-hf:
	@test -x .deps/venv-hf/bin/python || $(PYTHON) -m venv .deps/venv-hf
	.deps/venv-hf/bin/pip install -q --disable-pip-version-check -r scripts/hf/requirements.txt

bench-hf: build venv-hf
	bash scripts/hf/compare.sh

# What `make test` checks first: vendor/candle-core is the published crate
# plus vendor/candle-core.patch, byte for byte.
vendor-check:
	@$(PYTHON) scripts/vendor_check.py fetch
	@$(PYTHON) scripts/vendor_check.py check

lint clippy: deps deps-torch
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(TORCH_CPU) $(CARGO) clippy -p r2vpo-llm -p r2vpo-cli --features r2vpo-llm/torch,r2vpo-cli/torch \
	  --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clean-deps:
	rm -rf .deps
