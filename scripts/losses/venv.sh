#!/usr/bin/env bash
# Installs verl's and TRL's loss code, pinned and hash-checked
# (scripts/losses/requirements.txt), into the git-ignored .deps/venv-losses
# for the policy-loss differential test (crates/r2vpo/tests/upstream_losses.rs,
# scripts/losses/cases.py). torch, transformers and numpy come from
# .deps/venv-vllm through a .pth file (BASE_VENV), so this is ~25 MB of
# downloads instead of a second 3 GB torch; scripts/vllm/venv.sh runs first.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE_VENV=.deps/venv-vllm exec bash scripts/pinned_venv.sh "verl and TRL loss code" .deps/venv-losses scripts/losses/requirements.txt 3.11 exact "
import sys, types
from importlib.metadata import version
ray = types.ModuleType('ray'); ray.ObjectRef = type('ObjectRef', (), {}); sys.modules.setdefault('ray', ray)
sys.modules['vllm'] = None
from verl.trainer.ppo import core_algos
import trl.trainer.grpo_trainer
print('deps: verl', version('verl'), '/ trl', version('trl'), '/ torch', version('torch'))"
