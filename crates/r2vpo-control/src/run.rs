//! A training run in a folder: `config.toml` (the resolved config),
//! `metrics.jsonl` (one record per update), a TensorBoard event file,
//! `checkpoints/`, `summary.json` and the learning-curve plot, started fresh
//! or resumed from the newest checkpoint. The CLI only adds the console and
//! the signal handlers (`r2vpo_report::edge`).

use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde::Serialize;

use r2vpo_report::edge::{open_run_folder, Existing};
use r2vpo_report::plot::{LineChart, Series};
use r2vpo_report::track::{RunStatus, Trackers};
use r2vpo_report::TensorBoardWriter;

use crate::error::{TrainError, TrainResult};
use crate::trainer::{TrainConfig, Trainer, UpdateMetrics};

/// `summary.json`: the run's outcome in one record.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Task name.
    pub task: String,
    /// Objective kind (`R2vpo`, `Clip`, …).
    pub objective: String,
    /// Master seed.
    pub seed: u64,
    /// Environment steps done.
    pub env_steps: u64,
    /// The last deterministic evaluation's mean return.
    pub final_eval_return: Option<f64>,
    /// The last training episodes' mean return.
    pub final_train_return: Option<f64>,
    /// Mean throughput over the run's updates.
    pub mean_env_steps_per_s: f64,
}

impl Summary {
    /// The summary of a run's full metric history.
    pub fn of(cfg: &TrainConfig, all: &[UpdateMetrics]) -> Summary {
        Summary {
            task: cfg.task.clone(),
            objective: format!("{:?}", cfg.objective.kind),
            seed: cfg.seed,
            env_steps: all.last().map_or(0, |m| m.env_steps),
            final_eval_return: all.iter().rev().find_map(|m| m.eval_return_mean),
            final_train_return: all.iter().rev().find_map(|m| m.episode_return_mean),
            mean_env_steps_per_s: all.iter().map(|m| m.env_steps_per_s).sum::<f64>() / all.len().max(1) as f64,
        }
    }
}

/// What [`train_in_folder`] did.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// The run's full metric history, earlier (pre-resume) records included.
    pub metrics: Vec<UpdateMetrics>,
    /// Whether `stop` ended the run before its budget (a checkpoint was written).
    pub stopped: bool,
}

/// Trains `cfg` into the run folder `dir`, calling `on_update` after every
/// update, until the budget is spent or `stop` is raised (then it writes a
/// checkpoint and returns with `stopped`).
///
/// `existing` says what to do with a folder that already holds files:
/// refuse, overwrite, or ([`Existing::Resume`]) continue the run there from
/// its newest checkpoint, first dropping the metric records and TensorBoard
/// points written after it.
pub fn train_in_folder(
    cfg: TrainConfig,
    dir: &Path,
    existing: Existing,
    stop: &AtomicBool,
    on_update: impl FnMut(&UpdateMetrics),
) -> TrainResult<RunOutcome> {
    let ckpt = dir.join("checkpoints");
    let metrics_path = dir.join("metrics.jsonl");
    // Everything that can fail on the config or the task fails before the
    // folder is touched, so a rejected run leaves nothing behind.
    let trainer = if existing == Existing::Resume {
        if crate::trainer::latest_checkpoint(&ckpt).is_err() {
            return Err(TrainError::File {
                path: dir.to_path_buf(),
                message: format!(
                    "has no checkpoint to resume from (the run stopped before its first one; checkpoint_every = {}). \
                     Start it afresh with --overwrite, or train into another --out",
                    cfg.checkpoint_every
                ),
            });
        }
        Trainer::resume(&ckpt, Some(cfg.clone()))?
    } else {
        Trainer::new(cfg.clone())?
    };
    let run = open_run_folder(dir, existing)?;
    let mut trainer = trainer;
    trainer.set_video_dir(&run.join("videos"), &run.join("plots").join("video_frame.png"));
    if existing == Existing::Resume {
        let update = trainer.counters().update;
        r2vpo_report::jsonl::retain_records(&metrics_path, |v| {
            v.get("update").and_then(|u| u.as_u64()).is_some_and(|u| u <= update)
        })?;
        r2vpo_report::truncate_events_after(run.path(), trainer.counters().env_steps as i64)?;
    }
    let text = toml::to_string_pretty(&cfg)
        .map_err(|e| TrainError::File { path: run.join("config.toml"), message: e.to_string() })?;
    run.write_config(&text)?;
    let mut log = run.metrics()?;
    let mut tb = TensorBoardWriter::create(run.path())?;
    let mut tb_error = None;
    // Trackers only queue here; a failed one closes its run as failed when
    // this returns early (Drop).
    let trackers = Trackers::start(&cfg.log, run.path(), &run_name(dir), existing == Existing::Resume);
    trackers.params(r2vpo_report::track::flat_params(&cfg));
    let mut on_update = on_update;
    let start = trainer.counters().env_steps;
    trainer.run(Some(&ckpt), Some(&mut log), stop, |m| {
        if tb_error.is_none() {
            tb_error = tb.scalars(m.env_steps as i64, &scalars(m)).err();
        }
        if let Ok(v) = serde_json::to_value(m) {
            trackers.metrics_json(m.env_steps as i64, &v);
        }
        on_update(m);
    })?;
    if let Some(e) = tb_error {
        return Err(e.into());
    }
    let stopped = !trainer.done();
    let all: Vec<UpdateMetrics> = r2vpo_report::jsonl::read_records(&metrics_path)?;
    if !all.is_empty() && trainer.counters().env_steps > start {
        r2vpo_report::atomic_write_json(&run.join("summary.json"), &Summary::of(&cfg, &all))?;
        learning_curve(&cfg, &all).save(&run.join("plots").join("learning_curve"))?;
    }
    trackers.artifacts_in(&run.join("plots"), &["png", "svg"], "plots");
    trackers.artifacts_in(&run.join("videos"), &["mp4"], "videos");
    trackers.artifacts_in(run.path(), &["json", "toml"], "");
    trackers.finish(if stopped { RunStatus::Killed } else { RunStatus::Finished });
    Ok(RunOutcome { metrics: all, stopped })
}

/// A run's name in the trackers: its folder's last two components
/// (`cartpole-swingup/r2vpo-seed0` in a comparison).
fn run_name(dir: &Path) -> String {
    let parts: Vec<String> =
        dir.components().rev().take(2).map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// The TensorBoard scalars of one update (env steps on the x axis).
fn scalars(m: &UpdateMetrics) -> Vec<(&'static str, f64)> {
    let mut v = vec![
        ("ratio/var", m.ratio_var),
        ("ratio/sq_dev", m.sq_dev),
        ("lambda", m.lambda),
        ("clip_frac", m.clip_frac),
        ("approx_kl", m.approx_kl),
        ("entropy", m.entropy),
        ("loss/policy", m.policy_loss),
        ("loss/value", m.value_loss),
        ("grad_norm", m.grad_norm),
        ("explained_variance", m.explained_variance),
        ("time/env_steps_per_s", m.env_steps_per_s),
    ];
    if let Some(r) = m.episode_return_mean {
        v.push(("return/train", r));
    }
    if let Some(r) = m.eval_return_mean {
        v.push(("return/eval", r));
    }
    v
}

/// Training and evaluation return against env steps.
fn learning_curve(cfg: &TrainConfig, all: &[UpdateMetrics]) -> LineChart {
    let mut chart = LineChart::new(
        format!("{} — {:?}, seed {}", cfg.task, cfg.objective.kind, cfg.seed),
        "env steps",
        "episode return",
    );
    let train: Vec<(f64, f64)> =
        all.iter().filter_map(|m| m.episode_return_mean.map(|r| (m.env_steps as f64, r))).collect();
    let eval: Vec<(f64, f64)> =
        all.iter().filter_map(|m| m.eval_return_mean.map(|r| (m.env_steps as f64, r))).collect();
    chart.push(Series::line("training episodes", train).with_color(0));
    if !eval.is_empty() {
        chart.push(Series::points("deterministic eval", eval).with_color(1));
    }
    chart
}

/// What a resumable sweep (`control compare`) does with one run's folder.
#[derive(Debug)]
pub enum SweepRun {
    /// The run reached `total_env_steps`: its metrics, read back.
    Finished(Vec<UpdateMetrics>),
    /// The run stopped after a checkpoint: resume it.
    Resume,
    /// Nothing usable (no folder, or no checkpoint; a partial metrics log
    /// is removed): train it afresh.
    Fresh,
}

/// Refuses a run folder made with another config than `cfg` (naming the
/// first differing key; `total_env_steps` may grow, which continues the
/// run), so a sweep never reads back or resumes a run it did not ask for.
pub fn check_same_config(cfg: &TrainConfig, dir: &Path) -> TrainResult<()> {
    let path = dir.join("config.toml");
    if !path.exists() {
        return Ok(());
    }
    let file = |message: String| TrainError::File { path: path.clone(), message };
    let text = std::fs::read_to_string(&path).map_err(|e| file(e.to_string()))?;
    let was: TrainConfig = toml::from_str(&text).map_err(|e| file(e.to_string()))?;
    let json = |c: &TrainConfig| serde_json::to_value(c).map_err(|e| file(e.to_string()));
    match first_difference(&json(&was)?, &json(cfg)?, "") {
        Some(key) => Err(file(format!(
            "this run was made with a different `{key}` than asked for now; use a new --out (or delete the folder)"
        ))),
        None => Ok(()),
    }
}

/// The first key (dotted path) whose value differs, `total_env_steps` aside.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, path: &str) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().filter(|k| !(path.is_empty() && k.as_str() == "total_env_steps")).find_map(|k| {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => first_difference(u, v, &p),
                    _ => Some(p),
                }
            })
        }
        _ => (a != b).then(|| path.to_string()),
    }
}

/// Where the run in `dir` stands for a sweep asking for `cfg` (see
/// [`SweepRun`]); call [`check_same_config`] first.
pub fn sweep_state(cfg: &TrainConfig, dir: &Path) -> TrainResult<SweepRun> {
    let metrics = dir.join("metrics.jsonl");
    if dir.join("summary.json").exists() {
        let ms: Vec<UpdateMetrics> = r2vpo_report::jsonl::read_records(&metrics)?;
        if ms.last().is_some_and(|m| m.env_steps >= cfg.total_env_steps) {
            return Ok(SweepRun::Finished(ms));
        }
    }
    if crate::trainer::latest_checkpoint(&dir.join("checkpoints")).is_ok() {
        return Ok(SweepRun::Resume);
    }
    if metrics.exists() {
        std::fs::remove_file(&metrics)
            .map_err(|e| TrainError::File { path: metrics.clone(), message: e.to_string() })?;
    }
    Ok(SweepRun::Fresh)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    fn tiny() -> TrainConfig {
        TrainConfig {
            task: "cartpole-balance".into(),
            total_env_steps: 4 * 16 * 8,
            num_envs: 4,
            unroll: 16,
            batch_size: 4,
            minibatches: 2,
            epochs: 1,
            eval_every: 0,
            eval_episodes: 0,
            checkpoint_every: 0,
            ..TrainConfig::default()
        }
    }

    #[test]
    fn a_stopped_run_checkpoints_and_resumes_without_duplicate_points() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let stop = AtomicBool::new(false);
        let mut updates = 0;
        let first = train_in_folder(tiny(), &out, Existing::Refuse, &stop, |_| {
            updates += 1;
            stop.store(true, Ordering::SeqCst);
        })
        .unwrap();
        // Raised during the first update's report, seen at the end of the second.
        assert!(first.stopped && updates == 2, "{updates}");
        assert!(out.join("checkpoints").read_dir().unwrap().count() >= 2, "a checkpoint on stop");
        // A fresh start into the folder is refused; resuming finishes the run.
        let e = train_in_folder(tiny(), &out, Existing::Refuse, &AtomicBool::new(false), |_| {}).unwrap_err();
        assert!(e.to_string().contains("--overwrite"), "{e}");
        let rest = train_in_folder(tiny(), &out, Existing::Resume, &AtomicBool::new(false), |_| {}).unwrap();
        assert!(!rest.stopped);
        let steps: Vec<u64> = rest.metrics.iter().map(|m| m.env_steps).collect();
        assert!(steps.windows(2).all(|w| w[0] < w[1]), "no replayed records: {steps:?}");
        assert!(out.join("plots/learning_curve.png").exists() && out.join("summary.json").exists());
        let events = std::fs::read_dir(&out)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("events.out.tfevents"));
        assert!(events.count() >= 1);
    }

    #[test]
    fn resume_without_checkpoints_says_so_and_a_bad_config_leaves_no_folder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("never");
        let e = train_in_folder(tiny(), &out, Existing::Resume, &AtomicBool::new(false), |_| {}).unwrap_err();
        assert!(e.to_string().contains("no checkpoint") && e.to_string().contains("--overwrite"), "{e}");
        let bad = TrainConfig { task: "no-such-task".into(), ..tiny() };
        assert!(train_in_folder(bad, &out, Existing::Refuse, &AtomicBool::new(false), |_| {}).is_err());
        assert!(!out.exists(), "a rejected run must leave no folder");
    }
}
