//! `r2vpo llm train`: RL fine-tuning runs (R²VPO-ON/OFF and the baselines)
//! with a progress bar, Ctrl-C checkpointing and `--resume`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use r2vpo_report::track::{flat_params, Artifact, Record, RunStatus, Trackers};

use r2vpo_llm::queue::{ExperienceQueue, MemoryQueue, QueueError};
use r2vpo_llm::rollout::RolloutSource;
use r2vpo_llm::train::asynchronous::{run_actor, QueueOpener};
use r2vpo_llm::train::{Event, Outcome, QueueBackend, QueueConfig, RolloutBackend, TrainConfig, Trainer};
use r2vpo_queue::{RedisQueue, SharedWeights};
use r2vpo_report::edge::{open_run_folder, Existing, Progress, Stop, StopSignal};

use crate::args::{RunArgs, Stopped};
use crate::config;

/// `r2vpo llm train` arguments.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// `--config`, `--set`, `--seed`, `--out`, `--quiet`.
    #[command(flatten)]
    pub run: RunArgs,
    /// Algorithm from the one table (`r2vpo::algo::ALGORITHMS`), applied before
    /// `--set`: r2vpo-on, r2vpo-off, r2vpo, ppo, grpo, grpo-ch, gppo, topr,
    /// grpo-kl, is-pg, grpo-off, grpo-ch-off, m2po, m2po-off, log-ratio-sq,
    /// log-ratio-sq-dual, spo, gspo, cispo, sapo, dppo-tv, dppo-kl, dr-grpo
    /// (default: the config's own objective and mode).
    #[arg(long)]
    pub algo: Option<String>,
    /// Continue the run in this folder from its latest checkpoint, with its
    /// `config.toml` plus any `--set` (e.g. `--set iterations=40`).
    #[arg(long, conflicts_with_all = ["config", "algo", "seed", "out"])]
    pub resume: Option<PathBuf>,
    /// Do not export the final policy as a Hugging Face folder (`RUN/model`);
    /// sets `export = false`, which the run's config.toml keeps for
    /// `--resume`.
    #[arg(long)]
    pub no_export: bool,
    /// Asynchronous actor–learner (`--set actors.async=true`): actor
    /// threads sample ahead of the learner through the `[queue]`, at most
    /// `actors.max_staleness` weight versions behind.
    #[arg(long = "async")]
    pub asynchronous: bool,
}

/// Loads a train config: defaults → file → algorithm preset → seed → `--set`
/// ([`r2vpo_llm::train::config::load`]).
pub fn load_config(file: Option<&Path>, algo: Option<&str>, seed: Option<u64>, sets: &[String]) -> Result<TrainConfig> {
    Ok(r2vpo_llm::train::config::load(file, algo, seed, sets)?)
}

/// [`load_config`] checking the values only, not whether this binary can
/// run them (`config show`, `llm plan`: a torch recipe resolves in a
/// binary without the torch backend).
pub fn load_config_values(
    file: Option<&Path>,
    algo: Option<&str>,
    seed: Option<u64>,
    sets: &[String],
) -> Result<TrainConfig> {
    Ok(r2vpo_llm::train::config::load_values(file, algo, seed, sets)?)
}

/// Which process `train_as` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `llm train`: the learner with in-process sampling, or with actor
    /// threads (`--async`).
    Train,
    /// `llm learn`: the learner alone; actor processes (`llm actor`) sample.
    Learn,
}

/// `r2vpo llm train`.
pub fn train(a: &TrainArgs) -> Result<()> {
    train_as(a, Role::Train)
}

/// `r2vpo llm train` or `r2vpo llm learn`.
pub fn train_as(a: &TrainArgs, role: Role) -> Result<()> {
    // Started by torchrun, srun or `r2vpo launch`: a data-parallel job
    // (docs/distributed.md).
    let launch = r2vpo_llm::parallel::Launch::from_env()?;
    let mut sets = a.run.cfg.sets.clone();
    if a.asynchronous || role == Role::Learn {
        sets.insert(0, "actors.async=true".into());
    }
    if a.no_export {
        sets.push("export=false".into());
    }
    let command = if role == Role::Learn { "learn" } else { "train" };
    // A launcher's restart (torchrun --max-restarts, a requeued Slurm job)
    // runs the same command again: it continues the run it started, from
    // its newest checkpoint, or starts it afresh if it stopped before one.
    let restarted = launch.as_ref().is_some_and(|l| l.restart > 0) && a.resume.is_none();
    let restart_from = match (&a.run.out, restarted) {
        (Some(out), true) if r2vpo_llm::train::checkpoint::latest(out)?.is_some() => {
            eprintln!(
                "restart {} of the job: resuming {} from its newest checkpoint",
                launch.as_ref().map_or(0, |l| l.restart),
                out.display()
            );
            Some(out.clone())
        }
        _ => None,
    };
    let (cfg, dir, resume) = match a.resume.as_ref().or(restart_from.as_ref()) {
        Some(dir) => {
            let file = dir.join("config.toml");
            if !file.exists() {
                bail!("{} has no config.toml: not a run folder", dir.display());
            }
            if r2vpo_llm::train::checkpoint::latest(dir)?.is_none() {
                bail!(
                    "{} has no checkpoint to resume from (the run stopped before its first one); start it afresh \
                     with: r2vpo llm {command} --config {} --out {} --overwrite",
                    dir.display(),
                    file.display(),
                    dir.display()
                );
            }
            (load_config(Some(&file), None, None, &sets)?, dir.clone(), true)
        }
        None => {
            let cfg = load_config(a.run.cfg.config.as_deref(), a.algo.as_deref(), a.run.seed, &sets)?;
            let name =
                a.algo.clone().unwrap_or_else(|| format!("{:?}-{:?}", cfg.objective.kind, cfg.mode).to_lowercase());
            let dir = a.run.out.clone().unwrap_or_else(|| PathBuf::from(format!("runs/llm/{name}-seed{}", cfg.seed)));
            let mut cfg = cfg;
            if cfg.queue.backend == QueueBackend::Redis && cfg.queue.key.is_empty() {
                // Written into config.toml, so actor processes started from
                // it find the same stream.
                cfg.queue.key = default_queue_key(&dir);
            }
            (cfg, dir, false)
        }
    };
    // A job of one rank on the torch backend runs the data-parallel path
    // as a job of eight does (as torchrun's jobs of one do); on candle,
    // which trains in one process only, it runs alone.
    let launch = launch.filter(|l| l.world_size > 1 || cfg.model.backend == r2vpo_llm::train::BackendKind::Torch);
    // Every rank of a data-parallel job joins here; rank 0 goes on as a
    // run of its own, the others follow it.
    let group = match &launch {
        Some(l) => {
            let group = join_job(l, &cfg)?;
            if l.rank != 0 {
                return follow(for_rank(cfg, launch.as_ref()), &dir, resume, group);
            }
            Some(group)
        }
        None => None,
    };
    let http_actors = cfg.rollout.backend == RolloutBackend::Http && cfg.actors.asynchronous && role == Role::Train;
    if http_actors && cfg.rollout.urls.len() < cfg.actors.count {
        bail!(
            "rollout.urls: {} server(s) for actors.count = {} actor threads; each actor pushes its weights to \
             servers of its own, so give at least one URL per actor (or fewer actors)",
            cfg.rollout.urls.len(),
            cfg.actors.count
        );
    }
    let existing = match (resume, restarted) {
        (true, _) => Existing::Resume,
        // Restarted before its first checkpoint: the folder is this job's.
        (false, true) if r2vpo_llm::train::checkpoint::latest(&dir)?.is_none() => Existing::Overwrite,
        (false, true) => bail!(
            "restarted by the launcher, and {} holds checkpoints of this run; give the run folder as --out (or \
             --resume {}) so a restart continues it",
            dir.display(),
            dir.display()
        ),
        (false, false) => a.run.existing(),
    };
    let fresh_folder = !dir.exists();
    // Held until this process ends: a second `--resume` or `--overwrite`
    // of a live run is refused before it touches the folder or the stream.
    let run = open_run_folder(&dir, existing)?;
    if cfg.queue.backend == QueueBackend::Redis && cfg.actors.asynchronous {
        if let Err(e) = take_queue(&cfg, &dir, resume) {
            // A run that never started leaves no folder behind.
            if fresh_folder {
                let _ = std::fs::remove_dir_all(&dir);
            }
            return Err(e);
        }
    }
    // A resumed run's config.toml is rewritten (with the new --set values)
    // only once its checkpoint has loaded, so a failed --resume leaves the
    // folder as it was.
    if !resume {
        run.write_config(&config::to_toml(&cfg)?)?;
    }
    let started = if resume {
        Trainer::resume(for_rank(cfg.clone(), launch.as_ref()), &dir)
            .with_context(|| format!("resuming {}", dir.display()))
    } else {
        Trainer::new(for_rank(cfg.clone(), launch.as_ref()), &dir)
            .with_context(|| format!("starting {}", dir.display()))
    };
    let mut trainer = match started {
        Ok(t) => t,
        Err(e) => {
            // A run that never started leaves no folder behind.
            if fresh_folder {
                let _ = std::fs::remove_dir_all(&dir);
            }
            return Err(e);
        }
    };
    if let Some(g) = group {
        trainer.set_group(g)?;
    }
    let rollout_weights = cfg.rollout.weights_dir.as_ref().map_or_else(|| dir.join("weights"), PathBuf::from);
    if cfg.rollout.backend == RolloutBackend::Http && !cfg.actors.asynchronous {
        let source = r2vpo_serve::HttpRollout::new(&cfg.rollout, &rollout_weights)?;
        trainer.set_rollout_source(Box::new(source))?;
    }
    if resume {
        run.write_config(&config::to_toml(&cfg)?)?;
    }
    // Rank 0 reports for the job; trackers only queue here (their own
    // threads send), and a run that fails closes them as failed (Drop).
    let trackers = if launch.as_ref().is_none_or(|l| l.rank == 0) {
        let name = dir.file_name().map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned());
        Trackers::start(&cfg.log, &dir, &name, resume)
    } else {
        Trackers::none()
    };
    trackers.params(flat_params(&cfg));
    let stop = Stop::install().context("installing the SIGINT/SIGTERM handlers")?;
    let mut progress = Progress::new(cfg.iterations as u64, "iterations", a.run.quiet, Duration::ZERO)
        .starting_at(trainer.progress().iteration as u64);
    // Skipped prompts and data lines are reported above the bar, not through it.
    trainer.set_warning_handler(progress.printer());
    if cfg.model.device == "cpu" && !a.run.quiet {
        // Runs on different kernels round differently (docs/cpu-speed.md).
        progress.println(&format!("learner's products on the CPU: {}", r2vpo_kernels::dispatch::path()));
    }
    let mut last = String::new();
    let mut on_event = |e: Event| match e {
        Event::Phase { name, iter } => {
            if !a.run.quiet {
                progress.status(iter as u64, &format!("{name}…  {last}"));
                if name == "eval" {
                    // An evaluation takes minutes and moves no bar.
                    progress.println(&format!(
                        "evaluating after {iter} iterations: avg@{} on the held-out problems…",
                        cfg.eval.k
                    ));
                }
            }
        }
        Event::Iteration(m) => {
            last = iteration_line(m);
            progress.update(m.iter as u64 + 1, &last);
            if let Ok(v) = serde_json::to_value(m) {
                trackers.metrics_json(m.iter as i64, &v);
            }
        }
        Event::Eval(r) => {
            progress.println(&format!(
                "eval after {} iterations: avg@{} {:.3}  pass@{} {:.3}  maj@{} {:.3}",
                r.iter, r.k, r.avg_at_k, r.k, r.pass_at_k, r.k, r.maj_at_k
            ));
            if let Ok(v) = serde_json::to_value(r) {
                trackers.metrics_json(r.iter as i64, &serde_json::json!({ "eval": v }));
            }
        }
        Event::Checkpoint(p) => progress.println(&format!("checkpoint: {}", p.display())),
        Event::BadStep(d) => progress.println(&format!("skipped a non-finite step: {d}")),
    };
    let outcome = if role == Role::Learn {
        if cfg.queue.backend != QueueBackend::Redis {
            bail!("llm learn: queue.backend must be \"redis\" (actor processes reach the learner through Redis)");
        }
        let open = open_queue(&cfg, &dir)?;
        let wdir = cfg.queue.weights_dir.as_ref().map_or_else(|| dir.join("actor-weights"), PathBuf::from);
        let weights =
            SharedWeights::open(open_owned(&cfg.queue, &dir).map_err(|e| anyhow::anyhow!("queue.url: {e}"))?, &wdir)?
                .with_stop(stop.shared());
        trainer.run_learner(&*open, &weights, stop.flag(), &mut on_event)
    } else if cfg.actors.asynchronous {
        let open = open_queue(&cfg, &dir)?;
        // Actor threads over rollout servers: actor i owns every count-th
        // URL and pushes its weights there, from a folder of its own.
        let actor_sources = |i: usize| -> r2vpo_llm::train::TrainResult<Box<dyn RolloutSource>> {
            let mut rc = cfg.rollout.clone();
            rc.urls = cfg.rollout.urls.iter().skip(i).step_by(cfg.actors.count).cloned().collect();
            let source = r2vpo_serve::HttpRollout::new(&rc, &rollout_weights.join(format!("actor-{i}")))?;
            Ok(Box::new(source))
        };
        let sources: Option<&r2vpo_llm::train::asynchronous::SourceFactory<'_>> =
            if http_actors { Some(&actor_sources) } else { None };
        trainer.run_async(&*open, sources, stop.flag(), &mut on_event)
    } else {
        trainer.run(stop.flag(), &mut on_event)
    };
    progress.finish();
    let resume_with = format!("r2vpo llm {command} --resume {}", dir.display());
    let outcome = outcome.map_err(|e| {
        // A run that failed mid-way (every rollout server gone, its queue
        // emptied) keeps its newest checkpoint: say how to go on from it.
        if dir.join("checkpoints/latest").exists() {
            anyhow::anyhow!("{e}\nthe newest checkpoint is kept; once that is fixed, continue with: {resume_with}")
        } else {
            anyhow::Error::from(e)
        }
    })?;
    match outcome {
        Outcome::Stopped => {
            let signal = stop.requested().unwrap_or(StopSignal::Interrupt);
            trackers.finish(RunStatus::Killed);
            return Err(Stopped { signal, resume: resume_with }.into());
        }
        Outcome::Finished => {
            // `llm learn` closed its stream through the weight channel;
            // actor threads have none, so the run closes it here, and the
            // key is free for another run.
            if role == Role::Train && cfg.queue.backend == QueueBackend::Redis && cfg.actors.asynchronous {
                redis_queue(&cfg)?
                    .close()
                    .map_err(|e| anyhow::anyhow!("closing the stream `{}`: {e}", cfg.queue.key))?;
            }
        }
    }
    if cfg.export {
        let out = dir.join("model");
        trainer.export(&out).with_context(|| format!("exporting the policy to {}", out.display()))?;
        if cfg.model.lora.is_some() {
            println!("adapter (PEFT folder; `r2vpo llm merge` folds it into the base): {}", out.display());
        } else {
            println!("policy (Hugging Face folder): {}", out.display());
        }
    }
    let plots = crate::llm_plot::plot_runs(std::slice::from_ref(&dir), &dir.join("plots"), None)?;
    for p in plots {
        println!("plot: {}", p.display());
    }
    let card = if cfg.export { dir.join("model").join("README.md") } else { dir.join("model_card.md") };
    r2vpo_report::atomic_write_string(&card, &model_card(&cfg, &dir, a.algo.as_deref()))?;
    println!("model card: {}", card.display());
    trackers.artifacts_in(&dir.join("plots"), &["png", "svg"], "plots");
    trackers.send(Record::Artifact(Artifact { path: card, under: "model".into() }));
    trackers.artifacts_in(&dir, &["toml"], "");
    trackers.finish(RunStatus::Finished);
    println!("run folder: {}", dir.display());
    Ok(())
}

/// The trained policy's model card (Hugging Face's README.md with YAML
/// front matter): what it was trained from, how, and how it scored, from
/// the run's own files.
fn model_card(cfg: &TrainConfig, dir: &Path, algo: Option<&str>) -> String {
    let last = |name: &str| -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(dir.join(name)).ok()?;
        text.lines().rev().find_map(|l| serde_json::from_str(l).ok())
    };
    let kind = cfg.objective.kind.as_str();
    let algo = algo.unwrap_or(kind);
    let adapter = cfg.model.lora.is_some();
    let mut s = String::new();
    s.push_str("---\n");
    s.push_str(&format!("base_model: {}\n", cfg.model.path));
    s.push_str(if adapter { "library_name: peft\n" } else { "library_name: transformers\n" });
    s.push_str(&format!("tags:\n- r2vpo\n- reinforcement-learning\n- {algo}\n---\n\n"));
    s.push_str(&format!("# {}\n\n", dir.file_name().map_or("r2vpo run".into(), |n| n.to_string_lossy())));
    s.push_str(&format!(
        "{} of `{}` fine-tuned with r2vpo's `{algo}` (objective `{kind}`) for {} iterations of {} prompts × {} \
         samples, seed {}.\n\n",
        if adapter { "A LoRA adapter" } else { "The policy" },
        cfg.model.path,
        cfg.iterations,
        cfg.prompts_per_iter,
        cfg.group_size,
        cfg.seed
    ));
    if let Some(m) = last("metrics.jsonl") {
        s.push_str("## Last iteration\n\n| metric | value |\n|---|---|\n");
        for k in ["iter", "reward_mean", "accuracy", "response_len_mean", "lambda", "loss"] {
            if let Some(v) = m.get(k) {
                s.push_str(&format!("| {k} | {v} |\n"));
            }
        }
        s.push('\n');
    }
    if let Some(e) = last("eval.jsonl") {
        let k = e.get("k").and_then(|v| v.as_u64()).unwrap_or(0);
        s.push_str(&format!("## Held-out evaluation (after iteration {})\n\n", e.get("iter").unwrap_or(&0.into())));
        s.push_str("| metric | value |\n|---|---|\n");
        for (name, key) in [("avg", "avg_at_k"), ("pass", "pass_at_k"), ("maj", "maj_at_k")] {
            if let Some(v) = e.get(key) {
                s.push_str(&format!("| {name}@{k} | {v} |\n"));
            }
        }
        s.push('\n');
    }
    s.push_str(
        "## Reproduce\n\nThe run folder's `config.toml` is the whole configuration: \
         `r2vpo llm train --config config.toml`. Its `metrics.jsonl` holds every iteration.\n",
    );
    s
}

/// `cfg` as one rank of `launch` trains it, on its own GPU
/// ([`r2vpo_llm::parallel::rank_device`]); config.toml keeps the job's
/// `cuda`, so a resumed job maps it again.
fn for_rank(mut cfg: TrainConfig, launch: Option<&r2vpo_llm::parallel::Launch>) -> TrainConfig {
    if let Some(l) = launch {
        cfg.model.device = r2vpo_llm::parallel::rank_device(&cfg.model.device, l.local_rank);
    }
    cfg
}

/// Joins the data-parallel job `launch` describes, after checking that
/// every rank runs the same binary and the same resolved config.
#[cfg(feature = "torch")]
fn join_job(launch: &r2vpo_llm::parallel::Launch, cfg: &TrainConfig) -> Result<Box<dyn r2vpo_llm::parallel::Group>> {
    if cfg.model.backend != r2vpo_llm::train::BackendKind::Torch {
        bail!(
            "started as rank {} of {}: data-parallel training runs on the torch backend; set model.backend = \
             \"torch\"",
            launch.rank,
            launch.world_size
        );
    }
    let text = config::to_toml(cfg)?;
    use sha2::Digest;
    let config_hash = format!("{:x}", sha2::Sha256::digest(text.as_bytes()))[..16].to_string();
    // The gradients, parameters and moments live on the GPUs with cuda.
    let pg = r2vpo_llm::parallel::c10d::ProcessGroup::join_checked(
        launch,
        Duration::from_secs_f64(cfg.dist.timeout_s),
        cfg.model.device.starts_with("cuda"),
        &[("config", &config_hash)],
    )?;
    Ok(Box::new(pg))
}

#[cfg(not(feature = "torch"))]
fn join_job(launch: &r2vpo_llm::parallel::Launch, _: &TrainConfig) -> Result<Box<dyn r2vpo_llm::parallel::Group>> {
    bail!(
        "started as rank {} of {}, but this r2vpo was built without the torch backend, on which data-parallel \
         training runs: build it with `make build-torch` (or `make build-gpu`)",
        launch.rank,
        launch.world_size
    )
}

/// A rank other than 0 of a data-parallel job: the same trainer, fed rank
/// 0's rollouts (or its share of them, or with `--async`/`llm learn` the
/// groups rank 0 takes from its queue), writing nothing into the run folder (its own logs go to a
/// temporary folder, removed at the end); rank 0 reports, evaluates,
/// checkpoints and exports.
fn follow(cfg: TrainConfig, dir: &Path, resume: bool, group: Box<dyn r2vpo_llm::parallel::Group>) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("r2vpo-rank{}-{}", group.rank(), std::process::id()));
    let started = if resume { Trainer::resume_follower(cfg, dir, &scratch) } else { Trainer::new(cfg, &scratch) };
    let rank = group.rank();
    let outcome = started.and_then(|mut t| {
        t.set_group(group)?;
        let stop =
            Stop::install().map_err(|e| r2vpo_llm::train::TrainError::Io { path: scratch.clone(), source: e })?;
        let out = if t.config().actors.asynchronous {
            // Rank 0 holds the queue and the actors; this rank learns from
            // what it takes.
            t.follow_learner(stop.flag(), &mut |_| {})
        } else {
            t.run(stop.flag(), &mut |_| {})
        };
        out.map(|o| (o, stop))
    });
    let _ = std::fs::remove_dir_all(&scratch);
    match outcome.with_context(|| format!("rank {rank}"))? {
        (Outcome::Stopped, stop) => {
            let signal = stop.requested().unwrap_or(StopSignal::Interrupt);
            std::process::exit(i32::from(signal.exit_code()));
        }
        (Outcome::Finished, _) => Ok(()),
    }
}

/// The progress line's summary of an iteration.
fn iteration_line(m: &r2vpo_llm::train::IterMetrics) -> String {
    let mut line = format!(
        "reward {:.3}  acc {:.3}  len {:.0}  λ {:.4}  E[(ρ−1)²] {:.1e}  {:.0}/{:.0} tok/s",
        m.reward_mean,
        m.accuracy,
        m.response_len_mean,
        m.lambda,
        m.sq_dev,
        m.timing.rollout_tokens_per_s,
        m.timing.train_tokens_per_s
    );
    if let Some(q) = &m.queue {
        // The fresh groups' lag is what actors.max_staleness bounds;
        // replayed samples are older by design, so shown apart.
        let fresh = q.fresh_lag.iter().map(|&(lag, _)| lag).max().unwrap_or(0);
        line += &format!("  fresh lag ≤{fresh}  trained lag ≤{}  dropped {}", m.version_lag_max, q.stale_dropped);
    }
    line
}

/// The run folder as an absolute path, as the owner of its Redis stream.
fn absolute(dir: &Path) -> PathBuf {
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// `r2vpo:<folder name>-<8 hex digits of the absolute path's hash>`: the
/// name keeps the key readable in `redis-cli`, the hash keeps apart runs
/// whose folders share a name (`runs/seed0/off`, `runs/seed1/off`), and the
/// same folder gets the same key.
fn default_queue_key(dir: &Path) -> String {
    let abs = absolute(dir);
    let name = abs.file_name().map_or("run".into(), |n| n.to_string_lossy().into_owned());
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = abs
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("r2vpo:{name}-{:08x}", hash >> 32)
}

/// Takes the run's Redis stream for the run in `dir`
/// ([`RedisQueue::take_for`]): emptied, with its leases and weight
/// announcements, when the run starts afresh; refused, before the run
/// folder is touched, while another run that has not closed owns it.
fn take_queue(cfg: &TrainConfig, dir: &Path, resume: bool) -> Result<()> {
    let owner = absolute(dir);
    redis_queue(cfg)?.take_for(&owner.to_string_lossy(), resume).map_err(|e| match e {
        QueueError::Refused(why) => anyhow::anyhow!("{why}"),
        e => anyhow::anyhow!("taking the stream `{}` for this run: {e}", cfg.queue.key),
    })
}

/// The opener of the run's experience queue: one shared in-process queue,
/// or the Redis Stream at `queue.url` under `queue.key` ([`take_queue`]
/// took it for this run).
fn open_queue(cfg: &TrainConfig, dir: &Path) -> Result<Box<QueueOpener>> {
    Ok(match cfg.queue.backend {
        QueueBackend::Memory => {
            let q = MemoryQueue::new();
            Box::new(move || Ok(Box::new(q.clone()) as Box<dyn ExperienceQueue>))
        }
        QueueBackend::Redis => {
            let q = cfg.queue.clone();
            let dir = dir.to_path_buf();
            Box::new(move || Ok(Box::new(open_owned(&q, &dir)?) as Box<dyn ExperienceQueue>))
        }
    })
}

/// A handle on the Redis queue `q` names (`url`, `key`, `tls_ca`), each
/// call bounded by `timeout_s`.
fn open_redis(q: &QueueConfig) -> Result<RedisQueue, QueueError> {
    Ok(RedisQueue::open_tls(&q.url, &q.key, q.tls_ca.as_deref().map(Path::new))?
        .with_timeout(Duration::from_secs_f64(q.timeout_s)))
}

/// [`open_redis`] for the run in `dir`, once it owns the stream: a stream
/// emptied under it is reported, not silently refilled
/// ([`RedisQueue::with_owner`]).
fn open_owned(q: &QueueConfig, dir: &Path) -> Result<RedisQueue, QueueError> {
    Ok(open_redis(q)?.with_owner(absolute(dir).to_string_lossy()))
}

/// The run's Redis queue, its errors blamed on `queue.url`.
fn redis_queue(cfg: &TrainConfig) -> Result<RedisQueue> {
    open_redis(&cfg.queue).map_err(|e| anyhow::anyhow!("queue.url: {e}"))
}

/// `r2vpo llm actor` arguments.
#[derive(clap::Args, Debug)]
pub struct ActorArgs {
    /// The learner's resolved config (`RUN/config.toml` of `llm learn`):
    /// model, data, sampling, reward, queue URL and key.
    #[arg(long)]
    pub config: PathBuf,
    /// Overrides (`--set queue.url='"redis://10.0.0.5:6379/0"'` on another
    /// machine), read as [`crate::args::ConfigArgs`] reads them; `--config`
    /// is required here, so that group is not flattened in.
    #[arg(long = "set", value_name = "KEY=VALUE", allow_hyphen_values = true)]
    pub sets: Vec<String>,
    /// This actor's name in leases and messages (default `actor-<pid>`).
    #[arg(long)]
    pub name: Option<String>,
}

/// The folder an actor process writes the weights it pushes to its rollout
/// servers into: `rollout.weights_dir` when set (a folder those servers
/// read), else `rollout-weights/<name>` beside the learner's config.toml.
fn actor_weights_dir(cfg: &TrainConfig, config: &Path, name: &str) -> PathBuf {
    match &cfg.rollout.weights_dir {
        Some(d) => PathBuf::from(d),
        None => config.parent().unwrap_or(Path::new(".")).join("rollout-weights").join(name),
    }
}

/// How long an actor may take to stop after SIGINT/SIGTERM before it exits
/// wherever it is.
const ACTOR_STOP_GRACE: Duration = Duration::from_secs(1);

/// Makes the actor process exit within [`ACTOR_STOP_GRACE`] of a signal
/// whatever it is blocked on. Its loop polls the stop flag between calls,
/// but one call to a hung Redis may take `queue.timeout_s` and its retries
/// longer still (32 s was seen), and a supervisor that escalates to SIGKILL
/// meanwhile would leave the actor's lease held for `queue.lease_s`. An
/// actor keeps nothing to save (its batch goes to another actor when the
/// lease runs out; a stop that is in time releases nothing more), so
/// exiting with the signal's code and the usual message loses nothing.
fn exit_soon_after_a_signal(stop: &Stop, name: &str, restart: &str) {
    let (stop, name, restart) = (stop.clone(), name.to_string(), restart.to_string());
    std::thread::spawn(move || {
        let signal = loop {
            if let Some(s) = stop.requested() {
                break s;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(ACTOR_STOP_GRACE);
        eprintln!("{name}: still blocked {ACTOR_STOP_GRACE:?} after the signal; exiting without waiting for it");
        eprintln!("{}", Stopped::without_checkpoint(signal, restart));
        std::process::exit(i32::from(signal.exit_code()));
    });
}

/// `r2vpo llm actor`: produces batches for a `llm learn` run until the
/// learner finishes it or SIGINT/SIGTERM.
pub fn actor(a: &ActorArgs) -> Result<()> {
    let mut sets = vec!["actors.async=true".to_string()];
    sets.extend(a.sets.iter().cloned());
    let cfg = load_config(Some(&a.config), None, None, &sets)?;
    if cfg.queue.backend != QueueBackend::Redis || cfg.queue.key.is_empty() {
        bail!(
            "{}: an actor needs the learner's queue: queue.backend = \"redis\" and queue.key (llm learn writes both \
             into RUN/config.toml)",
            a.config.display()
        );
    }
    let name = a.name.clone().unwrap_or_else(|| format!("actor-{}", std::process::id()));
    let stop = Stop::install().context("installing the SIGINT/SIGTERM handlers")?;
    let restart = format!("r2vpo llm actor --config {} (the run goes on without this actor)", a.config.display());
    exit_soon_after_a_signal(&stop, &name, &restart);
    // The run that owns the stream (its learner's folder, as that machine
    // names it), adopted when first seen and checked every second after,
    // so a stream emptied under the run stops this actor with the reason
    // instead of refilling it from batch 0.
    let mut queue = redis_queue(&cfg)?.following_owner();
    // The learner announces where each version lives; this folder is unused.
    let weights = SharedWeights::open(redis_queue(&cfg)?.following_owner(), Path::new("."))?.with_stop(stop.shared());
    eprintln!("{name}: producing for stream `{}` at {}", cfg.queue.key, r2vpo_queue::hide_password(&cfg.queue.url));
    let source: Option<Box<dyn RolloutSource>> = match cfg.rollout.backend {
        RolloutBackend::Http => {
            let wdir = actor_weights_dir(&cfg, &a.config, &name);
            Some(Box::new(r2vpo_serve::HttpRollout::new(&cfg.rollout, &wdir)?))
        }
        RolloutBackend::Local => None,
    };
    run_actor(&cfg, &name, &mut queue, &weights, source, stop.flag()).with_context(|| format!("actor {name}"))?;
    if let Some(signal) = stop.requested() {
        // The run goes on without this actor: its batch, if it held one,
        // goes to another actor when the lease runs out.
        return Err(Stopped::without_checkpoint(signal, restart).into());
    }
    eprintln!("{name}: the learner ended the run");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound `actors.max_staleness` sets is on fresh groups; replayed
    /// samples (older by design) are shown apart, not as a broken bound.
    #[test]
    fn the_progress_line_shows_the_fresh_lag_apart_from_replay() {
        let m = r2vpo_llm::train::IterMetrics {
            version_lag_max: 4,
            queue: Some(r2vpo_llm::train::QueueMetrics { fresh_lag: vec![(0, 1), (1, 3)], ..Default::default() }),
            ..Default::default()
        };
        let line = iteration_line(&m);
        assert!(line.contains("fresh lag ≤1") && line.contains("trained lag ≤4"), "{line}");
    }

    /// Folders that share a name get streams of their own; one folder keeps
    /// its key.
    #[test]
    fn default_queue_keys_tell_same_named_folders_apart() {
        let (a, b) = (default_queue_key(Path::new("/runs/seed0/off")), default_queue_key(Path::new("/runs/seed1/off")));
        assert!(a.starts_with("r2vpo:off-") && b.starts_with("r2vpo:off-"), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a, default_queue_key(Path::new("/runs/seed0/off")));
    }
}
