#!/usr/bin/env bash
# Installs the third-party server `make test-conformance` talks to:
# llama-cpp-python (llama.cpp, compiled from its sdist: ~5 min on 2 cores)
# and `gguf` (to write the tiny test model), into .deps/venv-conformance.
# The two packages are pinned and checked against their sha256; their own
# dependencies (fastapi, uvicorn, numpy, …) come from PyPI by pip's resolver.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.deps/venv-conformance
STAMP=$VENV/.r2vpo-conformance-0.3.36
[[ -f $STAMP ]] && exit 0
PYTHON=${PYTHON:-python3}
rm -rf "$VENV" .deps/conformance-dl
mkdir -p .deps/conformance-dl
"$PYTHON" -m pip download -q --no-deps -d .deps/conformance-dl 'llama-cpp-python==0.3.36' 'gguf==0.19.0'
(cd .deps/conformance-dl && sha256sum -c - <<'SUMS'
832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e  llama_cpp_python-0.3.36.tar.gz
70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd  gguf-0.19.0-py3-none-any.whl
SUMS
)
"$PYTHON" -m venv "$VENV"
# Portable build (no -march=native), no examples or tests.
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
  "$VENV/bin/pip" install -q ".deps/conformance-dl/llama_cpp_python-0.3.36.tar.gz[server]" \
  .deps/conformance-dl/gguf-0.19.0-py3-none-any.whl
touch "$STAMP"
