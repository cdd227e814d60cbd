#!/usr/bin/env bash
# Installs Hugging Face's math-verify with its LaTeX parser, pinned and
# hash-checked (scripts/math_verify/requirements.txt), into the git-ignored
# .deps/venv-math-verify for the differential test of crates/r2vpo-verify
# (scripts/math_verify/judge.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash scripts/pinned_venv.sh math-verify .deps/venv-math-verify scripts/math_verify/requirements.txt 3.10 min "
from importlib.metadata import version
import math_verify, latex2sympy2_extended, antlr4
print('deps: math-verify', version('math-verify'), '/ latex2sympy2_extended', version('latex2sympy2_extended'), '/ antlr4', version('antlr4-python3-runtime'))"
