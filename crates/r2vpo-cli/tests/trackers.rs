//! Experiment trackers, real ones: an MLflow tracking server (PyPI's
//! `mlflow`, from the pinned `.deps/venv-trackers`) started here on a free
//! loopback port with a temp store receives `llm train` and `control train`
//! runs, and MLflow's own client reads them back; W&B's own client writes
//! offline runs that its record files show; a tracker that is down never
//! stops training.

mod common;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn venv() -> PathBuf {
    let v = root().join(".deps/venv-trackers");
    assert!(v.join("bin/python").exists(), "{} missing (run `make deps`)", v.display());
    v
}

/// The binary, with W&B kept inside `home` (its settings, cache and
/// credentials) and no API key from the caller's environment.
fn bin(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root())
        .env("HOME", home)
        .env("WANDB_CONFIG_DIR", home.join("wandb-config"))
        .env("WANDB_CACHE_DIR", home.join("wandb-cache"))
        .env("WANDB_DATA_DIR", home.join("wandb-data"))
        .env_remove("WANDB_API_KEY")
        .env_remove("WANDB_MODE");
    c
}

fn run_ok(mut c: Command) -> String {
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{c:?} failed:\n{err}");
    err
}

/// An `mlflow server` on a free loopback port with its store in `dir`,
/// stopped (its whole process group) on drop.
struct MlflowServer {
    child: Child,
    uri: String,
}

impl MlflowServer {
    fn start(dir: &Path, port: u16) -> Self {
        let log = std::fs::File::create(dir.join("mlflow-server.log")).unwrap();
        let child = Command::new(venv().join("bin/mlflow"))
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string(), "--workers", "1"])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(dir.join("artifacts"))
            // Else its job runner respawns worker processes for ever.
            .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap();
        let uri = format!("http://127.0.0.1:{port}");
        let server = Self { child, uri };
        let http = reqwest::blocking::Client::new();
        let t0 = Instant::now();
        loop {
            if http.get(format!("{}/health", server.uri)).send().is_ok_and(|r| r.status().is_success()) {
                return server;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "mlflow server did not answer /health in 120 s: {}",
                std::fs::read_to_string(dir.join("mlflow-server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The run as MLflow's client reads it (scripts/trackers/mlflow_read.py).
    fn read(&self, run_id: &str) -> Value {
        let out = Command::new(venv().join("bin/python"))
            .arg(root().join("scripts/trackers/mlflow_read.py"))
            .args([&self.uri, run_id])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this test started.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGTERM) };
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

const CONTROL_SETS: [&str; 8] = [
    "num_envs=4",
    "unroll=8",
    "batch_size=4",
    "minibatches=2",
    "epochs=1",
    "total_env_steps=256",
    "eval_every=0",
    "eval_episodes=0",
];

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn identity(run: &Path, name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(run.join(format!("trackers/{name}.json"))).unwrap()).unwrap()
}

/// `history[key]` as (step, value) pairs.
fn series(history: &Value, key: &str) -> Vec<(i64, f64)> {
    history[key]
        .as_array()
        .unwrap_or_else(|| panic!("no metric {key} in {history}"))
        .iter()
        .map(|p| (p["step"].as_i64().unwrap(), p["value"].as_f64().unwrap()))
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn mlflow_receives_llm_and_control_runs_and_resume_continues_them() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    // control train starts before its server does: the tracker is down,
    // said so once, retried, and the whole run arrives once the server
    // answers (the run waits up to log.finish_wait_s for it).
    let control = tmp.path().join("control");
    let mut c = bin(tmp.path());
    c.args(["control", "train", "--quiet", "--task", "cartpole-balance", "--algo", "ppo", "--out"]).arg(&control);
    for s in CONTROL_SETS {
        c.args(["--set", s]);
    }
    c.args(["--set", &format!("log.mlflow=http://127.0.0.1:{port}"), "--set", "log.finish_wait_s=120"]);
    let early = c.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let server = MlflowServer::start(tmp.path(), port);
    let cfg = common::tiny_llm_config(tmp.path(), 3, 1);

    // llm train: 3 iterations, then resumed to 5 into the same MLflow run.
    let run = tmp.path().join("llm");
    let mut c = bin(tmp.path());
    c.args(["llm", "train", "--quiet", "--no-export", "--config"]).arg(&cfg).arg("--out").arg(&run);
    c.args(["--set", &format!("log.mlflow={}", server.uri), "--set", "log.mlflow_experiment=r2vpo-tests"]);
    run_ok(c);
    let id = identity(&run, "mlflow");
    let run_id = id["run_id"].as_str().unwrap().to_owned();
    assert_eq!(id["tracking_uri"].as_str(), Some(server.uri.as_str()));
    let got = server.read(&run_id);
    assert_eq!(got["status"], "FINISHED");
    assert_eq!(got["name"], "llm");
    assert_eq!(got["params"]["objective.kind"], "r2vpo");
    assert_eq!(got["params"]["log.mlflow"], server.uri.as_str());
    let ours: Vec<(i64, f64)> = records(&run.join("metrics.jsonl"))
        .iter()
        .map(|m| (m["iter"].as_i64().unwrap(), m["reward_mean"].as_f64().unwrap()))
        .collect();
    assert_eq!(ours.len(), 3);
    assert_eq!(series(&got["history"], "reward_mean"), ours);
    let artifacts: Vec<&str> = got["artifacts"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(artifacts.contains(&"model/model_card.md"), "{artifacts:?}");
    assert!(artifacts.contains(&"config.toml"), "{artifacts:?}");
    assert!(artifacts.iter().any(|a| a.starts_with("plots/") && a.ends_with(".png")), "{artifacts:?}");

    let mut c = bin(tmp.path());
    c.args(["llm", "train", "--quiet", "--resume"]).arg(&run).args(["--set", "iterations=5"]);
    run_ok(c);
    assert_eq!(identity(&run, "mlflow")["run_id"].as_str(), Some(run_id.as_str()), "resume opened another run");
    let got = server.read(&run_id);
    assert_eq!(got["status"], "FINISHED");
    assert!(got["tags"]["r2vpo.resumed_at_ms"].is_string(), "{}", got["tags"]);
    let ours: Vec<(i64, f64)> = records(&run.join("metrics.jsonl"))
        .iter()
        .map(|m| (m["iter"].as_i64().unwrap(), m["reward_mean"].as_f64().unwrap()))
        .collect();
    assert_eq!(ours.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    let theirs = series(&got["history"], "reward_mean");
    for p in &ours {
        assert!(theirs.contains(p), "{p:?} missing from MLflow's history {theirs:?}");
    }

    // The control run: every update's record at its env-step count.
    let out = early.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let down = err.lines().filter(|l| l.starts_with("warning: mlflow:") && l.contains("training goes on")).count();
    assert_eq!(down, 1, "{err}");
    assert!(err.contains("mlflow: reachable again"), "{err}");
    let got = server.read(identity(&control, "mlflow")["run_id"].as_str().unwrap());
    assert_eq!(got["status"], "FINISHED");
    let ours: Vec<(i64, f64)> = records(&control.join("metrics.jsonl"))
        .iter()
        .map(|m| (m["env_steps"].as_i64().unwrap(), m["policy_loss"].as_f64().unwrap()))
        .collect();
    assert!(ours.len() >= 2);
    assert_eq!(series(&got["history"], "policy_loss"), ours);
    let artifacts: Vec<&str> = got["artifacts"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(artifacts.contains(&"plots/learning_curve.png") && artifacts.contains(&"summary.json"), "{artifacts:?}");
}

/// The offline W&B run (`<run>/wandb/offline-run-*`), read back from its
/// record files (scripts/trackers/wandb_read.py: wandb 0.31 has no reader).
fn wandb_offline(run: &Path) -> Value {
    let out = Command::new(venv().join("bin/python"))
        .arg(root().join("scripts/trackers/wandb_read.py"))
        .arg(run.join("wandb"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn wandb_offline_runs_hold_the_metrics_and_resume_continues_them() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = common::tiny_llm_config(tmp.path(), 2, 1);
    let run = tmp.path().join("llm");
    let mut c = bin(tmp.path());
    c.args(["llm", "train", "--quiet", "--no-export", "--config"]).arg(&cfg).arg("--out").arg(&run);
    c.args(["--set", "log.wandb=true", "--set", "log.wandb_mode=offline", "--set", "log.wandb_project=r2vpo-tests"]);
    run_ok(c);
    let id = identity(&run, "wandb");
    assert_eq!(id["project"], "r2vpo-tests");
    let got = wandb_offline(&run);
    assert_eq!(got["id"], id["id"]);
    assert_eq!(got["exit_code"], 0);
    let history = got["history"].as_array().unwrap();
    let ours = records(&run.join("metrics.jsonl"));
    assert_eq!(history.len(), 2);
    for (h, m) in history.iter().zip(&ours) {
        assert_eq!(h["_step"], m["iter"]);
        assert_eq!(h["reward_mean"].as_f64(), m["reward_mean"].as_f64());
        assert_eq!(h["lambda"].as_f64(), m["lambda"].as_f64());
    }
    let files: Vec<&str> = got["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert!(files.contains(&"model/model_card.md"), "{files:?}");

    let mut c = bin(tmp.path());
    c.args(["llm", "train", "--quiet", "--resume"]).arg(&run).args(["--set", "iterations=4"]);
    run_ok(c);
    assert_eq!(identity(&run, "wandb")["id"], id["id"], "resume chose another run id");
    let got = wandb_offline(&run);
    let steps: Vec<i64> = got["history"].as_array().unwrap().iter().map(|h| h["_step"].as_i64().unwrap()).collect();
    assert_eq!(steps, [0, 1, 2, 3]);
    assert_eq!(got["exit_code"], 0);
}

/// A tracker that cannot be reached is said once; the run trains to its end
/// with every record in metrics.jsonl, and waits for it no longer than
/// `log.finish_wait_s`.
#[test]
fn a_tracker_that_is_down_never_stops_training() {
    let tmp = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = free_port();
    let run = tmp.path().join("control");
    let mut c = bin(tmp.path());
    c.args(["control", "train", "--quiet", "--task", "cartpole-balance", "--algo", "ppo", "--out"]).arg(&run);
    for s in CONTROL_SETS {
        c.args(["--set", s]);
    }
    // W&B online without an API key fails at init, like a server that is down.
    c.args(["--set", &format!("log.mlflow=http://127.0.0.1:{port}"), "--set", "log.wandb=true"]);
    c.args(["--set", "log.wandb_mode=online", "--set", "log.finish_wait_s=2"]);
    let t0 = Instant::now();
    let err = run_ok(c);
    assert!(t0.elapsed() < Duration::from_secs(60));
    // Said once each, however many records failed.
    let said = |who: &str| {
        err.lines().filter(|l| l.starts_with(&format!("warning: {who}:")) && l.contains("training goes on")).count()
    };
    assert_eq!((said("mlflow"), said("wandb")), (1, 1), "{err}");
    assert!(err.contains("Connection refused") && err.contains("No API key configured"), "{err}");
    assert!(err.contains("warning: mlflow: gave up"), "{err}");
    let ms = records(&run.join("metrics.jsonl"));
    assert_eq!(ms.last().unwrap()["env_steps"], 256);
    assert!(run.join("summary.json").exists());
}
