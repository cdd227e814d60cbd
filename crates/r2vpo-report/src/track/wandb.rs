//! Weights & Biases through its own client. W&B has no stable REST API for
//! logging, only the `wandb` Python package (whose Go core it starts
//! itself), so the trainer runs a small sidecar
//! (`scripts/trackers/wandb_sidecar.py`, built into the binary) on the
//! pinned venv `make deps` builds (`.deps/venv-trackers`) and drives it with
//! one JSON object a line on its stdin. Offline mode (`log.wandb_mode =
//! "offline"` or `WANDB_MODE=offline`) writes the run under
//! `<run>/wandb/` for `wandb sync` to upload later.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{load_identity, save_identity, LogConfig, Record, RunStatus, TrackError, Tracker};

/// The sidecar's source, run with `python -c`.
const SIDECAR: &str = include_str!("../../../../scripts/trackers/wandb_sidecar.py");

/// Environment variable naming the Python that has `wandb`.
pub const PYTHON_ENV_VAR: &str = "R2VPO_WANDB_PYTHON";

/// How long an online `wandb.init` may retry an unreachable server.
const INIT_TIMEOUT_S: u64 = 30;

/// The Python with the pinned `wandb`: `$R2VPO_WANDB_PYTHON`, else
/// `<workspace>/.deps/venv-trackers/bin/python`.
pub fn python_path() -> PathBuf {
    if let Some(p) = std::env::var_os(PYTHON_ENV_VAR).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/venv-trackers/bin/python")
}

/// The run a folder logs to, kept in `trackers/wandb.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WandbRun {
    /// The W&B project.
    pub project: String,
    /// The run id (chosen here, so a restarted sidecar continues it).
    pub id: String,
    /// The run's local folder, as `wandb` reported it.
    #[serde(default)]
    pub dir: String,
}

struct Sidecar {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Sidecar {
    fn send(&mut self, msg: &Value) -> Result<(), TrackError> {
        let mut line = serde_json::to_string(msg).map_err(|e| TrackError(e.to_string()))?;
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
            .map_err(|e| TrackError(format!("the wandb sidecar stopped reading ({e}); its stderr says why")))
    }

    fn reply(&mut self) -> Result<Value, TrackError> {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).map_err(|e| TrackError(format!("reading the wandb sidecar: {e}")))?;
        if n == 0 {
            let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
            return Err(TrackError(format!("the wandb sidecar exited ({status}); its stderr says why")));
        }
        let v: Value =
            serde_json::from_str(&line).map_err(|e| TrackError(format!("wandb sidecar said {line:?}: {e}")))?;
        if v["ok"].as_bool() == Some(true) {
            Ok(v)
        } else {
            Err(TrackError(v["error"].as_str().unwrap_or("wandb.init failed").to_owned()))
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        // Closing stdin finishes the run (exit code 1) if `finish` never
        // came; then it is reaped.
        let _ = self.child.try_wait();
    }
}

/// A W&B run of one run folder.
pub struct Wandb {
    project: String,
    mode: String,
    run_dir: PathBuf,
    run_name: String,
    resume: bool,
    run: Option<WandbRun>,
    sidecar: Option<Sidecar>,
    config: Value,
}

impl Wandb {
    /// The tracker `cfg.wandb` turns on for `run_dir` (nothing starts until
    /// the first call).
    pub fn new(cfg: &LogConfig, run_dir: &Path, run_name: &str, resume: bool) -> Self {
        Self {
            project: if cfg.wandb_project.is_empty() { "r2vpo".into() } else { cfg.wandb_project.clone() },
            mode: cfg.wandb_mode.clone(),
            run_dir: run_dir.to_path_buf(),
            run_name: run_name.to_owned(),
            resume,
            run: None,
            sidecar: None,
            config: json!({}),
        }
    }

    /// The run, once opened.
    pub fn run(&self) -> Option<&WandbRun> {
        self.run.as_ref()
    }

    fn start_sidecar(&mut self) -> Result<(), TrackError> {
        let python = python_path();
        if !python.exists() {
            return Err(TrackError(format!(
                "no Python with wandb at {} (`make deps` builds .deps/venv-trackers; or set {PYTHON_ENV_VAR})",
                python.display()
            )));
        }
        let mut child = Command::new(&python)
            .arg("-c")
            .arg(SIDECAR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| TrackError(format!("starting {}: {e}", python.display())))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut sc = Sidecar { child, stdin, stdout };
        let run = self.run.clone().expect("identity chosen before the sidecar starts");
        let mode = if self.mode.is_empty() { Value::Null } else { json!(self.mode) };
        sc.send(&json!({
            "op": "init",
            "project": run.project,
            "name": self.run_name,
            "id": run.id,
            "dir": self.run_dir.display().to_string(),
            "config": self.config,
            "resume": true,
            "mode": mode,
            "init_timeout": INIT_TIMEOUT_S,
        }))?;
        let v = sc.reply()?;
        let dir = v["dir"].as_str().unwrap_or_default().to_owned();
        if let Some(r) = self.run.as_mut() {
            if r.dir != dir {
                r.dir = dir;
                save_identity(&self.run_dir, "wandb", r)?;
            }
        }
        self.sidecar = Some(sc);
        Ok(())
    }
}

impl Tracker for Wandb {
    fn name(&self) -> &'static str {
        "wandb"
    }

    fn open(&mut self) -> Result<(), TrackError> {
        if self.run.is_none() {
            let saved = if self.resume { load_identity::<WandbRun>(&self.run_dir, "wandb") } else { None };
            let run = match saved {
                Some(r) if r.project == self.project => r,
                _ => {
                    let r = WandbRun { project: self.project.clone(), id: new_id(), dir: String::new() };
                    // Saved before the first init, so a restart continues it.
                    save_identity(&self.run_dir, "wandb", &r)?;
                    r
                }
            };
            self.run = Some(run);
        }
        // The sidecar starts with the first record, so the run's config is
        // there at init (the parameters are the first record).
        Ok(())
    }

    fn send(&mut self, record: &Record) -> Result<(), TrackError> {
        if let Record::Params(params) = record {
            let mut cfg = serde_json::Map::new();
            for (k, v) in params {
                cfg.insert(k.clone(), json!(v));
            }
            self.config = Value::Object(cfg);
            if self.sidecar.is_none() {
                return self.start_sidecar();
            }
            return self.sidecar.as_mut().expect("started").send(&json!({ "op": "config", "config": self.config }));
        }
        if self.sidecar.is_none() {
            self.start_sidecar()?;
        }
        let sc = self.sidecar.as_mut().expect("started");
        let r = match record {
            Record::Params(_) => unreachable!("handled above"),
            Record::Metrics { step, values, .. } => {
                let metrics: serde_json::Map<String, Value> =
                    values.iter().filter(|(_, v)| v.is_finite()).map(|(k, v)| (k.clone(), json!(v))).collect();
                sc.send(&json!({ "op": "log", "step": step, "metrics": metrics }))
            }
            Record::Artifact(a) => {
                let name = a.path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
                let rel = if a.under.is_empty() { name.to_owned() } else { format!("{}/{name}", a.under) };
                let path = std::fs::canonicalize(&a.path).unwrap_or_else(|_| a.path.clone());
                sc.send(&json!({ "op": "file", "path": path.display().to_string(), "name": rel }))
            }
        };
        if r.is_err() {
            // A dead sidecar is started again (resuming the same id) on the
            // next try.
            self.sidecar = None;
        }
        r
    }

    fn close(&mut self, status: RunStatus) -> Result<(), TrackError> {
        let Some(mut sc) = self.sidecar.take() else { return Ok(()) };
        let code = if status == RunStatus::Finished { 0 } else { 1 };
        sc.send(&json!({ "op": "finish", "exit_code": code }))?;
        sc.reply()?;
        let _ = sc.child.wait();
        Ok(())
    }
}

/// An 8-character run id in W&B's alphabet (lower-case letters and digits),
/// from the clock and the process id.
fn new_id() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut x = (t as u64) ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15;
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..8)
        .map(|_| {
            // splitmix64 steps
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            alphabet[((z ^ (z >> 31)) % 36) as usize] as char
        })
        .collect()
}
