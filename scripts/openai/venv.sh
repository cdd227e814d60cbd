#!/usr/bin/env bash
# Installs the official OpenAI Python client, pinned and hash-checked
# (scripts/openai/requirements.txt), into the git-ignored .deps/venv-openai
# for the server's client tests. Run by `make deps`. Idempotent: returns at
# once when the venv holds exactly these requirements (a stamp of their hash).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=.deps/venv-openai
REQ=scripts/openai/requirements.txt
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ -x $VENV/bin/python && -f $VENV/.requirements && $(cat "$VENV/.requirements") == "$want" ]]; then
  exit 0
fi
echo "deps: installing the pinned OpenAI Python client into $VENV"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$REQ"
"$VENV/bin/python" -c "import openai; print('deps: openai', openai.__version__)"
echo "$want" > "$VENV/.requirements"
