#!/usr/bin/env bash
# Installs Google's Brax and JAX (CPU), pinned and hash-checked
# (scripts/brax/requirements.txt: CPython 3.11 x86-64 wheels), into the
# git-ignored .deps/venv-brax for the differential test of the control
# trainer's brax flavour (crates/r2vpo-control/tests/brax.rs,
# scripts/brax/loss_cases.py). ~900 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
JAX_PLATFORMS=cpu exec bash scripts/pinned_venv.sh "Brax and JAX" .deps/venv-brax scripts/brax/requirements.txt 3.11 exact "
from importlib.metadata import version
import brax.training.agents.ppo.losses
print('deps: brax', version('brax'), '/ jax', version('jax'), '/ jaxlib', version('jaxlib'))"
