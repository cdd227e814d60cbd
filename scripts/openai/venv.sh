#!/usr/bin/env bash
# Installs the official OpenAI Python client, pinned and hash-checked
# (scripts/openai/requirements.txt), into the git-ignored .deps/venv-openai
# for the server's client tests. Run by `make deps`.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash scripts/pinned_venv.sh "OpenAI Python client" .deps/venv-openai scripts/openai/requirements.txt 3.8 min "
import openai
print('deps: openai', openai.__version__)"
