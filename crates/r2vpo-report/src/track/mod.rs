//! Experiment trackers: a run's parameters, per-step metrics and final
//! artifacts sent to MLflow ([`mlflow`], its REST API) or Weights & Biases
//! ([`wandb`], its own Python client in a sidecar process), beside the run
//! folder's `metrics.jsonl`, which stays the record.
//!
//! **A tracker never stops training.** Each one runs on a thread of its own
//! behind a channel ([`Trackers`]), so the training loop only queues
//! records. A call that fails (server down, client missing) is said once on
//! stderr, kept queued (up to [`MAX_QUEUED`] records; older ones are dropped
//! with a count, as `metrics.jsonl` holds them all) and retried with a
//! backoff of 1 s doubling to 30 s; a tracker that comes back gets the
//! queue in order and a line saying so. At the end, [`Trackers::finish`]
//! waits at most `log.finish_wait_s` (30 s) for the queues to drain.
//!
//! **Resume.** Each tracker keeps its run's identity in the run folder
//! (`trackers/mlflow.json`, `trackers/wandb.json`); `--resume` continues
//! that run instead of starting another.

pub mod mlflow;
pub mod wandb;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Most records a tracker keeps queued while it is unreachable.
pub const MAX_QUEUED: usize = 100_000;

/// Default of `log.finish_wait_s`: the longest [`Trackers::finish`] waits
/// for the trackers to send what they hold.
pub const FINISH_WAIT_S: f64 = 30.0;

/// Longest wait between two tries of a failing call.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The `[log]` table of a training config: which trackers receive the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// MLflow tracking server URI, e.g. `http://127.0.0.1:5000` (empty: off).
    pub mlflow: String,
    /// MLflow experiment name (created if missing); empty: `r2vpo`.
    pub mlflow_experiment: String,
    /// Log to Weights & Biases through its own client (`make deps` builds
    /// the pinned venv `.deps/venv-trackers`).
    pub wandb: bool,
    /// W&B project; empty: `r2vpo`.
    pub wandb_project: String,
    /// W&B mode: `online`, `offline` (writes the run for `wandb sync`
    /// later) or empty to follow `WANDB_MODE` and W&B's own settings.
    pub wandb_mode: String,
    /// Longest a finished run waits for its trackers to take what they
    /// still hold (an unreachable one is then given up, with a line).
    pub finish_wait_s: f64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            mlflow: String::new(),
            mlflow_experiment: String::new(),
            wandb: false,
            wandb_project: String::new(),
            wandb_mode: String::new(),
            finish_wait_s: FINISH_WAIT_S,
        }
    }
}

impl LogConfig {
    /// Checks the values that need no network.
    pub fn validate(&self) -> Result<(), String> {
        let http = self.mlflow.starts_with("http://") || self.mlflow.starts_with("https://");
        if !self.mlflow.is_empty() && !http {
            return Err(format!(
                "log.mlflow = {:?}: an http(s) URI of a tracking server (`mlflow server`), e.g. http://127.0.0.1:5000",
                self.mlflow
            ));
        }
        if !(self.finish_wait_s.is_finite() && self.finish_wait_s >= 0.0) {
            return Err(format!("log.finish_wait_s = {}: seconds, 0 or more", self.finish_wait_s));
        }
        if !matches!(self.wandb_mode.as_str(), "" | "online" | "offline" | "disabled") {
            return Err(format!("log.wandb_mode = {:?}: one of online, offline, disabled, or empty", self.wandb_mode));
        }
        Ok(())
    }

    /// Whether any tracker is on.
    pub fn any(&self) -> bool {
        !self.mlflow.is_empty() || self.wandb
    }
}

/// How a run ended, as the trackers record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// Reached its budget.
    Finished,
    /// Stopped by a signal (it can be resumed).
    Killed,
    /// Ended by an error.
    Failed,
}

/// A file to attach to the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    /// The file.
    pub path: PathBuf,
    /// The folder it goes under in the tracker (`plots`, `model`, …).
    pub under: String,
}

/// One thing to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// The run's parameters (flattened config), sent once at the start.
    Params(Vec<(String, String)>),
    /// Metrics at a step (ms since the epoch).
    Metrics {
        /// The run's x axis (iteration or env steps).
        step: i64,
        /// Wall-clock time of the record.
        timestamp_ms: i64,
        /// Name and value; non-finite values are the trackers' to refuse.
        values: Vec<(String, f64)>,
    },
    /// A file.
    Artifact(Artifact),
}

/// A tracker's error: what failed, said in one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TrackError(pub String);

/// One tracker backend. Calls may block (the network, a child process);
/// [`Trackers`] calls them from a thread of their own.
pub trait Tracker: Send {
    /// Its name in messages (`mlflow`, `wandb`).
    fn name(&self) -> &'static str;
    /// Opens the run (a new one, or the one `run_dir` names on resume).
    /// Called again after a failure until it succeeds.
    fn open(&mut self) -> Result<(), TrackError>;
    /// Sends one record. Called again with the same record after a failure.
    fn send(&mut self, record: &Record) -> Result<(), TrackError>;
    /// Closes the run with its status.
    fn close(&mut self, status: RunStatus) -> Result<(), TrackError>;
}

enum Msg {
    Record(Record),
    Finish(RunStatus),
}

/// The run's trackers, each on its own thread. Dropping it without
/// [`Trackers::finish`] closes the runs as failed.
pub struct Trackers {
    workers: Vec<(Sender<Msg>, JoinHandle<()>)>,
    finished: bool,
    wait: Duration,
}

impl std::fmt::Debug for Trackers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trackers").field("workers", &self.workers.len()).finish()
    }
}

impl Trackers {
    /// No tracker: every call is a no-op.
    pub fn none() -> Self {
        Self { workers: Vec::new(), finished: false, wait: Duration::ZERO }
    }

    /// The trackers `cfg` turns on for the run folder `run_dir` (`resume`:
    /// continue the runs its `trackers/` files name).
    pub fn start(cfg: &LogConfig, run_dir: &Path, run_name: &str, resume: bool) -> Self {
        let mut list: Vec<Box<dyn Tracker>> = Vec::new();
        if !cfg.mlflow.is_empty() {
            list.push(Box::new(mlflow::Mlflow::new(cfg, run_dir, run_name, resume)));
        }
        if cfg.wandb {
            list.push(Box::new(wandb::Wandb::new(cfg, run_dir, run_name, resume)));
        }
        Self::from_trackers(list, Duration::from_secs_f64(cfg.finish_wait_s))
    }

    /// Runs the given trackers (tests, other backends); [`Trackers::finish`]
    /// waits at most `wait` for them.
    pub fn from_trackers(list: Vec<Box<dyn Tracker>>, wait: Duration) -> Self {
        let workers = list
            .into_iter()
            .map(|t| {
                let (tx, rx) = mpsc::channel();
                let name = t.name();
                let handle = std::thread::Builder::new()
                    .name(format!("tracker-{name}"))
                    .spawn(move || worker(t, rx, wait))
                    .expect("spawning a tracker thread");
                (tx, handle)
            })
            .collect();
        Self { workers, finished: false, wait }
    }

    /// Whether any tracker is on.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Queues a record for every tracker.
    pub fn send(&self, record: Record) {
        for (tx, _) in &self.workers {
            // A worker that is gone has said why.
            let _ = tx.send(Msg::Record(record.clone()));
        }
    }

    /// Queues the run's parameters.
    pub fn params(&self, params: Vec<(String, String)>) {
        if !self.is_empty() {
            self.send(Record::Params(params));
        }
    }

    /// Queues the numbers of a JSON record (a `metrics.jsonl` line) at
    /// `step`, nested keys joined by `/`.
    pub fn metrics_json(&self, step: i64, record: &serde_json::Value) {
        if !self.is_empty() {
            self.send(Record::Metrics { step, timestamp_ms: now_ms(), values: numbers(record) });
        }
    }

    /// Queues the files of `dir` whose extension is one of `exts`, under
    /// `under` in the trackers.
    pub fn artifacts_in(&self, dir: &Path, exts: &[&str], under: &str) {
        if self.is_empty() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| exts.iter().any(|x| e == *x)))
            .collect();
        files.sort();
        for path in files {
            self.send(Record::Artifact(Artifact { path, under: under.into() }));
        }
    }

    /// Closes every run with `status`, waiting at most `log.finish_wait_s`
    /// for queued records to go out.
    pub fn finish(mut self, status: RunStatus) {
        self.finish_inner(status);
    }

    fn finish_inner(&mut self, status: RunStatus) {
        if self.finished {
            return;
        }
        self.finished = true;
        // The workers keep the same deadline; a little more here lets them
        // say that they gave up.
        let deadline = Instant::now() + self.wait + Duration::from_millis(500);
        let workers = std::mem::take(&mut self.workers);
        for (tx, _) in &workers {
            let _ = tx.send(Msg::Finish(status));
        }
        for (tx, handle) in workers {
            drop(tx);
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if handle.is_finished() {
                let _ = handle.join();
            }
            // A worker still waiting on an unreachable tracker at the
            // deadline is left behind; the process's exit ends it.
        }
    }
}

impl Drop for Trackers {
    fn drop(&mut self) {
        self.finish_inner(RunStatus::Failed);
    }
}

/// The thread behind one tracker: sends records in order, holding them
/// while the tracker fails (see the module docs).
fn worker(mut t: Box<dyn Tracker>, rx: Receiver<Msg>, finish_wait: Duration) {
    let name = t.name();
    let mut queue: VecDeque<Record> = VecDeque::new();
    let mut dropped = 0usize;
    let mut opened = false;
    let mut down: Option<Instant> = None;
    let mut backoff = Duration::from_secs(1);
    let mut finish: Option<(RunStatus, Instant)> = None;
    loop {
        // Take what has arrived; wait for more only when nothing is due.
        let wait = match (queue.is_empty() && opened, down) {
            _ if finish.is_some() => Duration::ZERO,
            (true, _) => Duration::from_secs(3600),
            (false, Some(since)) => (since + backoff).saturating_duration_since(Instant::now()),
            (false, None) => Duration::ZERO,
        };
        match rx.recv_timeout(wait) {
            Ok(Msg::Record(r)) => {
                if queue.len() >= MAX_QUEUED {
                    queue.pop_front();
                    dropped += 1;
                }
                queue.push_back(r);
                while let Ok(m) = rx.try_recv() {
                    match m {
                        Msg::Record(r) => {
                            if queue.len() >= MAX_QUEUED {
                                queue.pop_front();
                                dropped += 1;
                            }
                            queue.push_back(r)
                        }
                        Msg::Finish(s) => finish = Some((s, Instant::now() + finish_wait)),
                    }
                }
            }
            Ok(Msg::Finish(s)) => finish = Some((s, Instant::now() + finish_wait)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                if finish.is_none() {
                    finish = Some((RunStatus::Failed, Instant::now() + finish_wait));
                }
            }
        }
        if let Some(since) = down {
            if Instant::now() < since + backoff && finish.is_none() {
                continue;
            }
        }
        if let Some((_, deadline)) = finish {
            if down.is_some() && Instant::now() >= deadline {
                give_up(name, queue.len(), opened);
                return;
            }
        }
        // Try: open, then the queue in order.
        let result = (|| {
            if !opened {
                t.open()?;
                opened = true;
            }
            while let Some(r) = queue.front() {
                t.send(r)?;
                queue.pop_front();
            }
            Ok::<(), TrackError>(())
        })();
        match result {
            Ok(()) => {
                if down.take().is_some() {
                    eprintln!("{name}: reachable again; the queued records went out");
                }
                if dropped > 0 {
                    eprintln!(
                        "{name}: {dropped} older records were dropped while it was down (metrics.jsonl has them)"
                    );
                    dropped = 0;
                }
                backoff = Duration::from_secs(1);
            }
            Err(e) => {
                if down.is_none() {
                    eprintln!(
                        "warning: {name}: {e}; training goes on, metrics.jsonl keeps every record, and {name} is \
                         retried (up to every {} s)",
                        MAX_BACKOFF.as_secs()
                    );
                } else {
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                down = Some(Instant::now());
            }
        }
        if let Some((status, deadline)) = finish {
            if opened && queue.is_empty() {
                if let Err(e) = t.close(status) {
                    eprintln!("warning: {name}: closing the run: {e}");
                }
                return;
            }
            if Instant::now() >= deadline {
                give_up(name, queue.len(), opened);
                return;
            }
            std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
}

fn give_up(name: &str, unsent: usize, opened: bool) {
    eprintln!(
        "warning: {name}: gave up with {unsent} records unsent ({}); metrics.jsonl has them",
        if opened { "the tracker stayed unreachable" } else { "the run never opened" }
    );
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The numbers of a JSON value, nested keys joined by `/` (arrays by index);
/// booleans as 0/1; strings and nulls skipped.
pub fn numbers(v: &serde_json::Value) -> Vec<(String, f64)> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, f64)>) {
        let key = |k: &str| if prefix.is_empty() { k.to_owned() } else { format!("{prefix}/{k}") };
        match v {
            serde_json::Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.push((prefix.to_owned(), x));
                }
            }
            serde_json::Value::Bool(b) => out.push((prefix.to_owned(), f64::from(u8::from(*b)))),
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    walk(&key(k), v, out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    walk(&key(&i.to_string()), v, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", v, &mut out);
    out
}

/// A config as `key.path = value` pairs (TOML values, strings unquoted).
pub fn flat_params<T: Serialize>(cfg: &T) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut Vec<(String, String)>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&key, v, out);
                }
            }
            toml::Value::String(s) => out.push((prefix.to_owned(), s.clone())),
            other => out.push((prefix.to_owned(), other.to_string())),
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = toml::Value::try_from(cfg) {
        walk("", &v, &mut out);
    }
    out
}

/// Reads a tracker's saved run identity from `run_dir/trackers/<name>.json`.
fn load_identity<T: serde::de::DeserializeOwned>(run_dir: &Path, name: &str) -> Option<T> {
    let text = std::fs::read_to_string(run_dir.join("trackers").join(format!("{name}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

/// Saves a tracker's run identity (atomically).
fn save_identity<T: Serialize>(run_dir: &Path, name: &str, id: &T) -> Result<(), TrackError> {
    crate::atomic_write_json(&run_dir.join("trackers").join(format!("{name}.json")), id)
        .map_err(|e| TrackError(format!("saving the run's identity: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A tracker that fails its first `fail` calls, then records.
    struct Flaky {
        fail: usize,
        seen: Arc<Mutex<Vec<String>>>,
    }

    impl Tracker for Flaky {
        fn name(&self) -> &'static str {
            "flaky"
        }
        fn open(&mut self) -> Result<(), TrackError> {
            if self.fail > 0 {
                self.fail -= 1;
                return Err(TrackError("down".into()));
            }
            self.seen.lock().unwrap().push("open".into());
            Ok(())
        }
        fn send(&mut self, r: &Record) -> Result<(), TrackError> {
            if let Record::Metrics { step, .. } = r {
                self.seen.lock().unwrap().push(format!("step {step}"));
            }
            Ok(())
        }
        fn close(&mut self, s: RunStatus) -> Result<(), TrackError> {
            self.seen.lock().unwrap().push(format!("close {s:?}"));
            Ok(())
        }
    }

    /// Records sent while the tracker is down reach it in order once it is
    /// back, and the caller never waits on it.
    #[test]
    fn a_tracker_that_comes_back_gets_the_queue_in_order() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let t = Trackers::from_trackers(
            vec![Box::new(Flaky { fail: 2, seen: Arc::clone(&seen) })],
            Duration::from_secs(30),
        );
        let t0 = Instant::now();
        for step in 0..3 {
            t.metrics_json(step, &serde_json::json!({ "loss": 1.0 }));
        }
        assert!(t0.elapsed() < Duration::from_millis(500), "sending waited on the tracker");
        t.finish(RunStatus::Finished);
        assert_eq!(*seen.lock().unwrap(), ["open", "step 0", "step 1", "step 2", "close Finished"]);
    }

    #[test]
    fn numbers_flatten_nested_records() {
        let v = serde_json::json!({ "a": 1, "b": { "c": 2.5, "d": "x" }, "e": [3, null], "f": true });
        assert_eq!(numbers(&v), vec![("a".into(), 1.0), ("b/c".into(), 2.5), ("e/0".into(), 3.0), ("f".into(), 1.0)]);
    }
}
