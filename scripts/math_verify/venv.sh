#!/usr/bin/env bash
# Installs Hugging Face's math-verify with its LaTeX parser, pinned and
# hash-checked (scripts/math_verify/requirements.txt), into the git-ignored
# .deps/venv-math-verify for the differential test of crates/r2vpo-verify
# (scripts/math_verify/judge.py). Idempotent: returns at once when the venv
# holds exactly these requirements (a stamp of their hash).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=.deps/venv-math-verify
REQ=scripts/math_verify/requirements.txt
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "deps: $PYTHON not found; math-verify needs Python >= 3.10 (set PYTHON=...)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "deps: math-verify needs Python >= 3.10, $PYTHON is $("$PYTHON" -V 2>&1)" >&2
  exit 1
fi
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ -x $VENV/bin/python && -f $VENV/.requirements && $(cat "$VENV/.requirements") == "$want" ]]; then
  exit 0
fi
echo "deps: installing the pinned math-verify into $VENV"
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
"$VENV/bin/python" -c "
from importlib.metadata import version
import math_verify, latex2sympy2_extended, antlr4
print('deps: math-verify', version('math-verify'), '/ latex2sympy2_extended', version('latex2sympy2_extended'), '/ antlr4', version('antlr4-python3-runtime'))"
echo "$want" > "$VENV/.requirements"
