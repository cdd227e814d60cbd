#!/usr/bin/env bash
# Installs Google's Brax and JAX (CPU), pinned and hash-checked
# (scripts/brax/requirements.txt), into the git-ignored .deps/venv-brax for
# the differential test of the control trainer's brax flavour
# (crates/r2vpo-control/tests/brax.rs, scripts/brax/loss_cases.py).
# Idempotent: returns at once when the venv holds exactly these
# requirements (a stamp of their hash).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=.deps/venv-brax
REQ=scripts/brax/requirements.txt
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "deps: $PYTHON not found; Brax's pinned wheels need Python 3.11 (set PYTHON=...)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "deps: Brax's pinned wheels need Python 3.11, $PYTHON is $("$PYTHON" -V 2>&1)" >&2
  exit 1
fi
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ -x $VENV/bin/python && -f $VENV/.requirements && $(cat "$VENV/.requirements") == "$want" ]]; then
  exit 0
fi
echo "deps: installing the pinned Brax and JAX (~900 MB) into $VENV"
rm -rf "$VENV"
if ! "$PYTHON" -m venv "$VENV"; then
  echo "deps: '$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)" >&2
  exit 1
fi
if ! "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$REQ"; then
  echo "deps: pip could not install $REQ into $VENV (is PyPI reachable? a hash mismatch means a changed file)" >&2
  rm -rf "$VENV"
  exit 1
fi
JAX_PLATFORMS=cpu "$VENV/bin/python" -c "
from importlib.metadata import version
import brax.training.agents.ppo.losses
print('deps: brax', version('brax'), '/ jax', version('jax'), '/ jaxlib', version('jaxlib'))" 2>&1 | grep '^deps:'
echo "$want" > "$VENV/.requirements"
