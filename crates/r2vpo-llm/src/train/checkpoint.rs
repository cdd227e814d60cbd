//! Checkpoints: `RUN/checkpoints/iter-NNNNNN/` holds `model.safetensors` +
//! `config.json` (a Hugging Face folder, loadable on its own),
//! `optimizer.safetensors` (Adam moments) and `state.json` (counters, data
//! position, λ, the replay buffer with its sampler RNG, log line counts).
//!
//! Atomicity: a checkpoint is written into a `.tmp-…` folder, its files are
//! synced, the folder is renamed into place and only then does the
//! `checkpoints/latest` pointer (itself written atomically) move to it; older
//! checkpoints are deleted last. A crash at any point leaves `latest`
//! naming a complete checkpoint.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use r2vpo::dual::DualVariable;
use r2vpo::replay::ReplayBuffer;

use super::{Progress, RewardFn, Sample, TrainConfig, TrainError, TrainResult, Trainer, VerifierReward};

/// Bumped when the layout changes.
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct State {
    format: u32,
    progress: Progress,
    optimizer_steps: u64,
    dual: DualVariable,
    replay: ReplayBuffer<Sample>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io { path: path.to_path_buf(), source }
}

fn ckpt_err(path: &Path, message: impl Into<String>) -> TrainError {
    TrainError::Checkpoint { path: path.to_path_buf(), message: message.into() }
}

fn sync(path: &Path) -> TrainResult<()> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).map_err(io(path))
}

/// The folder `checkpoints/latest` points to, if any.
pub fn latest(run_dir: &Path) -> TrainResult<Option<PathBuf>> {
    let pointer = run_dir.join("checkpoints").join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = std::fs::read_to_string(&pointer).map_err(io(&pointer))?;
    let dir = run_dir.join("checkpoints").join(name.trim());
    if !dir.join("state.json").exists() {
        return Err(ckpt_err(&dir, "`latest` names a checkpoint without state.json"));
    }
    Ok(Some(dir))
}

impl Trainer {
    /// Writes a checkpoint of the current state and returns its folder.
    pub fn save_checkpoint(&mut self) -> TrainResult<PathBuf> {
        let root = self.run_dir.join("checkpoints");
        std::fs::create_dir_all(&root).map_err(io(&root))?;
        let name = format!("iter-{:06}", self.progress.iteration);
        let tmp = root.join(format!(".tmp-{name}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        std::fs::create_dir(&tmp).map_err(io(&tmp))?;

        // With adapters the base never changes: the checkpoint holds the
        // adapter alone, in PEFT's layout, and the base is the config's.
        let w = match (self.backend.lora(), self.backend.export_adapter()?) {
            (Some(lora), Some(adapter)) => {
                let d = tmp.join("adapter");
                crate::model::lora::save_peft(&d, lora, Some(&self.cfg.model.path), &adapter)
                    .map_err(|e| ckpt_err(&d, e.to_string()))?;
                d.join(crate::model::lora::ADAPTER_WEIGHTS)
            }
            _ => {
                let w = tmp.join("model.safetensors");
                self.backend
                    .save_weights(&w, self.progress.iteration as u64)
                    .map_err(|e| ckpt_err(&w, e.to_string()))?;
                w
            }
        };
        let c = tmp.join("config.json");
        std::fs::write(&c, self.backend.config().to_json_string() + "\n").map_err(io(&c))?;
        let o = tmp.join("optimizer.safetensors");
        // Under sharding the other ranks send their moments meanwhile
        // (`Trainer::checkpoint`).
        self.dp.write_optimizer(self.backend.as_mut(), Some(&o))?;
        let state = State {
            format: FORMAT,
            progress: self.progress.clone(),
            optimizer_steps: self.backend.optimizer_steps(),
            dual: self.learner.dual().clone(),
            replay: self.replay.clone(),
        };
        let s = tmp.join("state.json");
        let json = serde_json::to_vec(&state).map_err(|e| ckpt_err(&s, e.to_string()))?;
        std::fs::write(&s, json).map_err(io(&s))?;
        for f in [&w, &c, &o, &s] {
            sync(f)?;
        }
        let dest = root.join(&name);
        if dest.exists() {
            std::fs::remove_dir_all(&dest).map_err(io(&dest))?;
        }
        std::fs::rename(&tmp, &dest).map_err(io(&dest))?;
        r2vpo_report::atomic_write_string(&root.join("latest"), &name)?;
        // Keep the newest `keep_checkpoints` (names sort by iteration);
        // leftovers of interrupted writes go too.
        let mut kept: Vec<String> = Vec::new();
        for entry in std::fs::read_dir(&root).map_err(io(&root))? {
            let p = entry.map_err(io(&root))?.path();
            let file = p.file_name().and_then(|f| f.to_str()).unwrap_or("").to_string();
            if !p.is_dir() {
                continue;
            }
            if file.starts_with(".tmp-") {
                std::fs::remove_dir_all(&p).map_err(io(&p))?;
            } else if file.starts_with("iter-") && file > name {
                // Orphans of a run that was resumed from an earlier checkpoint.
                std::fs::remove_dir_all(&p).map_err(io(&p))?;
            } else if file.starts_with("iter-") {
                kept.push(file);
            }
        }
        kept.sort();
        let drop = kept.len().saturating_sub(self.cfg.keep_checkpoints.max(1));
        for file in &kept[..drop] {
            let p = root.join(file);
            std::fs::remove_dir_all(&p).map_err(io(&p))?;
        }
        Ok(dest)
    }

    /// Continues the run in `run_dir` from its latest checkpoint with
    /// `cfg` (normally the run's own `config.toml`, possibly with more
    /// iterations) and the verifier reward.
    pub fn resume(cfg: TrainConfig, run_dir: &Path) -> TrainResult<Self> {
        let reward = Box::new(VerifierReward(cfg.verify.clone()));
        Self::resume_with_reward(cfg, run_dir, reward)
    }

    /// [`Trainer::resume`] with a custom reward function.
    pub fn resume_with_reward(cfg: TrainConfig, run_dir: &Path, reward_fn: Box<dyn RewardFn>) -> TrainResult<Self> {
        Self::resume_from(cfg, run_dir, run_dir, reward_fn)
    }

    /// A rank other than 0 of a data-parallel job resuming the run in
    /// `run_dir`: it reads the run's latest checkpoint, as rank 0 does, and
    /// writes its own logs into `logs_dir`, leaving the run folder to rank 0.
    pub fn resume_follower(cfg: TrainConfig, run_dir: &Path, logs_dir: &Path) -> TrainResult<Self> {
        std::fs::create_dir_all(logs_dir).map_err(io(logs_dir))?;
        let reward = Box::new(VerifierReward(cfg.verify.clone()));
        Self::resume_from(cfg, run_dir, logs_dir, reward)
    }

    fn resume_from(
        cfg: TrainConfig,
        run_dir: &Path,
        logs_dir: &Path,
        reward_fn: Box<dyn RewardFn>,
    ) -> TrainResult<Self> {
        cfg.validate()?;
        let dir = latest(run_dir)?.ok_or_else(|| {
            ckpt_err(
                run_dir,
                format!(
                    "has no checkpoint to resume from (the run stopped before its first one; checkpoint_every = {}); \
                     start it afresh with its config.toml",
                    cfg.checkpoint_every
                ),
            )
        })?;
        let s = dir.join("state.json");
        let text = std::fs::read(&s).map_err(io(&s))?;
        let state: State = serde_json::from_slice(&text).map_err(|e| ckpt_err(&s, e.to_string()))?;
        if state.format != FORMAT {
            return Err(ckpt_err(&s, format!("format {} (this build reads {FORMAT})", state.format)));
        }
        let mut progress = state.progress;
        let iteration = progress.iteration;
        for (file, lines) in [
            ("metrics.jsonl", &mut progress.metrics_lines),
            ("eval.jsonl", &mut progress.eval_lines),
            ("ratio_hist.jsonl", &mut progress.hist_lines),
        ] {
            // What a killed run wrote after its checkpoint goes; so does a
            // torn line (a crash or power loss mid-write), which would make
            // the log unreadable once the resumed run appends to it.
            let path = logs_dir.join(file);
            let kept = r2vpo_report::jsonl::keep_complete_lines(&path, *lines)?;
            if let Some(torn) = kept.torn {
                // Every record of these logs starts with its iteration
                // (`iter`); a cut that took it leaves the line after the
                // last whole record's to name.
                let whose = match kept.torn_field("iter") {
                    Some(i) => format!("the record of iteration {i}"),
                    None => {
                        format!("a record whose iteration the cut did not leave (the one after line {})", kept.lines)
                    }
                };
                // The checkpoint counted these lines, so their iterations
                // are before the one it resumes at: nothing writes them again.
                let lost = *lines - kept.lines;
                let also =
                    if lost > 1 { format!(" and the {} complete lines after it", lost - 1) } else { String::new() };
                eprintln!(
                    "warning: {}: line {torn} is torn (cut short by a crash or power loss): {whose}{also} is lost \
                     and will not be written again, since the run resumes from its checkpoint at iteration \
                     {iteration}, after it; the log is cut back to its {} complete lines before it",
                    path.display(),
                    kept.lines
                );
            }
            *lines = kept.lines;
        }
        // Events are not counted by the checkpoint; a torn last one goes.
        r2vpo_report::jsonl::retain_records(&logs_dir.join("events.jsonl"), |_| true)?;
        // TensorBoard steps are iterations (evaluations at the iteration they
        // follow): keep up to the checkpoint's, so the replayed iterations
        // are not drawn twice.
        r2vpo_report::truncate_events_after(logs_dir, iteration as i64)?;
        let mut t = Self::build(cfg, logs_dir, reward_fn, progress)?;
        // Read one tensor at a time into the learner: a whole f32 copy of
        // the model never sits in host memory beside it.
        let adapter = dir.join("adapter");
        match t.backend.lora() {
            Some(lora) => {
                let (saved, files) =
                    crate::model::lora::open_peft(&adapter).map_err(|e| ckpt_err(&adapter, e.to_string()))?;
                if !saved.same_adapters(lora) {
                    return Err(ckpt_err(
                        &adapter,
                        format!(
                            "holds an adapter of rank {}, alpha {}, targets {:?}; the config asks for rank {}, alpha \
                             {}, targets {:?}",
                            saved.rank, saved.alpha, saved.targets, lora.rank, lora.alpha, lora.targets
                        ),
                    ));
                }
                t.backend.load_adapter(&files).map_err(|e| ckpt_err(&adapter, e.to_string()))?;
            }
            None if adapter.exists() => {
                return Err(ckpt_err(&adapter, "the run trained adapters; its config has no [model.lora]"));
            }
            None => {
                let w = dir.join("model.safetensors");
                crate::model::source::SafetensorsFiles::open(std::slice::from_ref(&w), w.clone())
                    .and_then(|source| t.backend.load(&source))
                    .map_err(|e| ckpt_err(&w, e.to_string()))?;
            }
        }
        let o = dir.join("optimizer.safetensors");
        t.backend.load_optimizer(&o, state.optimizer_steps).map_err(|e| ckpt_err(&o, e.to_string()))?;
        t.learner = r2vpo::learner::Learner::with_dual(t.cfg.objective.clone(), state.dual)?;
        t.replay = state.replay;
        if t.replay.capacity_iters() != t.cfg.replay.capacity_iters {
            return Err(ckpt_err(
                &s,
                format!(
                    "replay capacity {} in the checkpoint, {} in the config",
                    t.replay.capacity_iters(),
                    t.cfg.replay.capacity_iters
                ),
            ));
        }
        Ok(t)
    }
}
