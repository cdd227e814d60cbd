//! MLflow over its REST API (`/api/2.0/mlflow/…`), the one every MLflow
//! client speaks: no Python on the training side. Parameters and metrics go
//! through `runs/log-batch` (≤ 100 parameters and ≤ 1000 values a call, the
//! server's limits); files through the server's artifact proxy
//! (`mlflow server` serves artifacts by default: `PUT
//! /api/2.0/mlflow-artifacts/artifacts/<experiment>/<run>/artifacts/<path>`,
//! the path of the run's `mlflow-artifacts:` URI).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{load_identity, now_ms, save_identity, LogConfig, Record, RunStatus, TrackError, Tracker};

/// Most parameters in one `log-batch` call (MLflow's limit).
const PARAMS_PER_CALL: usize = 100;
/// Most metric values in one `log-batch` call (MLflow's limit).
const METRICS_PER_CALL: usize = 1000;
/// Longest parameter value MLflow stores.
const MAX_PARAM_VALUE: usize = 6000;

/// The run a folder logs to, kept in `trackers/mlflow.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MlflowRun {
    /// The tracking server.
    pub tracking_uri: String,
    /// The experiment's id.
    pub experiment_id: String,
    /// The run's id.
    pub run_id: String,
    /// Where the run's artifacts live (`mlflow-artifacts:/…`).
    pub artifact_uri: String,
}

/// An MLflow run of one run folder.
pub struct Mlflow {
    uri: String,
    experiment: String,
    run_dir: PathBuf,
    run_name: String,
    resume: bool,
    http: reqwest::blocking::Client,
    run: Option<MlflowRun>,
}

impl Mlflow {
    /// The tracker `cfg.mlflow` names for `run_dir` (nothing is sent until
    /// the first call).
    pub fn new(cfg: &LogConfig, run_dir: &Path, run_name: &str, resume: bool) -> Self {
        let experiment = if cfg.mlflow_experiment.is_empty() { "r2vpo".into() } else { cfg.mlflow_experiment.clone() };
        let http = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a reqwest client with timeouts");
        Self {
            uri: cfg.mlflow.trim_end_matches('/').to_owned(),
            experiment,
            run_dir: run_dir.to_path_buf(),
            run_name: run_name.to_owned(),
            resume,
            http,
            run: None,
        }
    }

    /// The run, once opened.
    pub fn run(&self) -> Option<&MlflowRun> {
        self.run.as_ref()
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value, TrackError> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.uri);
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            req = req.json(b);
        }
        // reqwest's message names the URL.
        let resp = req.send().map_err(|e| TrackError(one_line(&e)))?;
        let status = resp.status();
        let text = resp.text().unwrap_or_default();
        if !status.is_success() {
            let msg = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or(text);
            return Err(TrackError(format!("{url}: HTTP {status}: {msg}")));
        }
        if text.trim().is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_str(&text).map_err(|e| TrackError(format!("{url}: unreadable answer: {e}")))
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, TrackError> {
        self.call(reqwest::Method::POST, path, Some(body))
    }

    fn experiment_id(&self) -> Result<String, TrackError> {
        let got = self.call(
            reqwest::Method::GET,
            &format!("experiments/get-by-name?experiment_name={}", encode(&self.experiment)),
            None,
        );
        match got {
            Ok(v) => v["experiment"]["experiment_id"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| TrackError("experiments/get-by-name: no experiment_id in the answer".into())),
            Err(e) if e.0.contains("RESOURCE_DOES_NOT_EXIST") || e.0.contains("404") => {
                let v = self.post("experiments/create", &json!({ "name": self.experiment }))?;
                v["experiment_id"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| TrackError("experiments/create: no experiment_id in the answer".into()))
            }
            Err(e) => Err(e),
        }
    }

    fn log_batch(&self, run_id: &str, metrics: &[Value], params: &[Value], tags: &[Value]) -> Result<(), TrackError> {
        self.post("runs/log-batch", &json!({ "run_id": run_id, "metrics": metrics, "params": params, "tags": tags }))
            .map(|_| ())
    }

    fn upload(&self, run: &MlflowRun, file: &Path, under: &str) -> Result<(), TrackError> {
        let Some(rest) = run.artifact_uri.strip_prefix("mlflow-artifacts:") else {
            return Err(TrackError(format!(
                "the run's artifact store is {} and this server does not proxy it; start the server with \
                 artifact serving (the default of `mlflow server`)",
                run.artifact_uri
            )));
        };
        // `mlflow-artifacts:/1/<run>/artifacts`, or with a host part.
        let rest = rest.trim_start_matches('/');
        let rest = if run.artifact_uri.starts_with("mlflow-artifacts://") {
            rest.split_once('/').map_or("", |(_, p)| p)
        } else {
            rest
        };
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("file");
        let rel = if under.is_empty() { name.to_owned() } else { format!("{under}/{name}") };
        let url = format!("{}/api/2.0/mlflow-artifacts/artifacts/{rest}/{}", self.uri, encode_path(&rel));
        let bytes = std::fs::read(file).map_err(|e| TrackError(format!("{}: {e}", file.display())))?;
        let resp = self.http.put(&url).body(bytes).send().map_err(|e| TrackError(one_line(&e)))?;
        if !resp.status().is_success() {
            let status = resp.status();
            return Err(TrackError(format!("{url}: HTTP {status}: {}", resp.text().unwrap_or_default())));
        }
        Ok(())
    }
}

impl Tracker for Mlflow {
    fn name(&self) -> &'static str {
        "mlflow"
    }

    fn open(&mut self) -> Result<(), TrackError> {
        if self.resume {
            if let Some(saved) = load_identity::<MlflowRun>(&self.run_dir, "mlflow") {
                if saved.tracking_uri == self.uri {
                    self.post("runs/update", &json!({ "run_id": saved.run_id, "status": "RUNNING" }))?;
                    self.log_batch(
                        &saved.run_id,
                        &[],
                        &[],
                        &[json!({ "key": "r2vpo.resumed_at_ms", "value": now_ms().to_string() })],
                    )?;
                    self.run = Some(saved);
                    return Ok(());
                }
            }
        }
        let experiment_id = self.experiment_id()?;
        let v = self.post(
            "runs/create",
            &json!({
                "experiment_id": experiment_id,
                "run_name": self.run_name,
                "start_time": now_ms(),
                "tags": [
                    { "key": "mlflow.runName", "value": self.run_name },
                    { "key": "mlflow.source.name", "value": "r2vpo" },
                    { "key": "r2vpo.run_dir", "value": self.run_dir.display().to_string() },
                ],
            }),
        )?;
        let info = &v["run"]["info"];
        let run = MlflowRun {
            tracking_uri: self.uri.clone(),
            experiment_id,
            run_id: info["run_id"]
                .as_str()
                .ok_or_else(|| TrackError("runs/create: no run_id in the answer".into()))?
                .to_owned(),
            artifact_uri: info["artifact_uri"].as_str().unwrap_or_default().to_owned(),
        };
        save_identity(&self.run_dir, "mlflow", &run)?;
        self.run = Some(run);
        // A resume without a saved run logs into a new one.
        self.resume = false;
        Ok(())
    }

    fn send(&mut self, record: &Record) -> Result<(), TrackError> {
        let run = self.run.clone().ok_or_else(|| TrackError("no open run".into()))?;
        match record {
            // Parameters are set once: a resumed run keeps the first ones
            // (MLflow refuses to change a logged value).
            Record::Params(_) if self.resume => Ok(()),
            Record::Params(params) => {
                let items: Vec<Value> = params
                    .iter()
                    .map(|(k, v)| {
                        let v: String = v.chars().take(MAX_PARAM_VALUE).collect();
                        json!({ "key": k, "value": v })
                    })
                    .collect();
                for chunk in items.chunks(PARAMS_PER_CALL) {
                    self.log_batch(&run.run_id, &[], chunk, &[])?;
                }
                Ok(())
            }
            Record::Metrics { step, timestamp_ms, values } => {
                let items: Vec<Value> = values
                    .iter()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(k, v)| json!({ "key": k, "value": v, "timestamp": timestamp_ms, "step": step }))
                    .collect();
                for chunk in items.chunks(METRICS_PER_CALL) {
                    self.log_batch(&run.run_id, chunk, &[], &[])?;
                }
                Ok(())
            }
            Record::Artifact(a) => self.upload(&run, &a.path, &a.under),
        }
    }

    fn close(&mut self, status: RunStatus) -> Result<(), TrackError> {
        let Some(run) = &self.run else { return Ok(()) };
        let status = match status {
            RunStatus::Finished => "FINISHED",
            RunStatus::Killed => "KILLED",
            RunStatus::Failed => "FAILED",
        };
        self.post("runs/update", &json!({ "run_id": run.run_id, "status": status, "end_time": now_ms() })).map(|_| ())
    }
}

/// An error and its causes on one line (reqwest nests the useful part).
fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Percent-encodes a path, keeping its `/`.
fn encode_path(s: &str) -> String {
    s.split('/').map(encode).collect::<Vec<_>>().join("/")
}
