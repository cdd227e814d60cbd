#!/usr/bin/env bash
# Installs PyTorch, transformers and Hugging Face PEFT, pinned and
# hash-checked (scripts/peft/requirements.txt, ~5.6 GB with torch's CUDA
# libraries), into the git-ignored .deps/venv-peft for the LoRA
# differential test (crates/r2vpo-llm/tests/lora_peft.rs,
# scripts/peft/peft_logits.py). `make test-peft` runs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash scripts/pinned_venv.sh peft .deps/venv-peft scripts/peft/requirements.txt 3.11 exact "
from importlib.metadata import version
import torch, transformers, peft
print('deps: peft', version('peft'), '/ transformers', version('transformers'), '/ torch', version('torch'))"
