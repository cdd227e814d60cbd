#!/usr/bin/env bash
# Installs the MLflow tracking server and client and the W&B client, pinned and
# hash-checked (scripts/trackers/requirements.txt), into the git-ignored
# .deps/venv-trackers for the experiment-tracker tests: an `mlflow server` on
# 127.0.0.1 that the trainer's REST client logs to, and the wandb sidecar
# (scripts/trackers/wandb_sidecar.py) in offline mode. Self-contained (75 MB
# of wheels); scripts/trackers/NOTES.md says how the tests use it.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash scripts/pinned_venv.sh "MLflow and W&B clients" .deps/venv-trackers scripts/trackers/requirements.txt 3.11 exact "
import warnings; warnings.simplefilter('ignore')
import mlflow.server.fastapi_app, uvicorn
from mlflow.tracking import MlflowClient
import wandb
from wandb.proto.wandb_internal_pb2 import Record
print('deps: mlflow', mlflow.__version__, '/ wandb', wandb.__version__)"
