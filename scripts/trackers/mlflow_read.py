"""mlflow_read.py TRACKING_URI RUN_ID: print an MLflow run as JSON, read back with MlflowClient.

{"status": ..., "name": ..., "params": {...}, "tags": {...}, "artifacts": [paths, recursively],
 "history": {metric: [{"step": s, "value": v, "timestamp": ms}, ...]}}
"""
import json, sys
from mlflow.tracking import MlflowClient

uri, run_id = sys.argv[1], sys.argv[2]
client = MlflowClient(tracking_uri=uri)
run = client.get_run(run_id)

def artifacts(path=None):
    for f in client.list_artifacts(run_id, path):
        yield from artifacts(f.path) if f.is_dir else [f.path]

history = {key: [{"step": m.step, "value": m.value, "timestamp": m.timestamp}
                 for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]
           for key in sorted(run.data.metrics)}
tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
print(json.dumps({"status": run.info.status, "name": run.info.run_name, "params": run.data.params,
                  "tags": tags, "artifacts": list(artifacts()), "history": history}))
