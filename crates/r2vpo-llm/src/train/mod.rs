//! The LLM RL trainer: Algorithms 1 (R²VPO-ON) and 2 (R²VPO-OFF) of the
//! paper, and the baselines (GRPO, GRPO-CH, GPPO, TOPR, GRPO-KL) through the
//! same loop, differing only in the core crate's objective and in
//! [`Mode`].
//!
//! One iteration: `prompts_per_iter` problems × G samples from the current
//! policy with behaviour log-probs recorded → rewards from the verifier →
//! group-relative advantages → optimizer steps (K epochs of minibatches over
//! the fresh batch, or uniform draws from a FIFO replay buffer with an
//! update-to-data ratio) → λ moves once per optimizer step from the detached
//! E\[(ρ−1)²\] (the paper's dual update).
//!
//! Determinism: every random choice (data order, rollout seeds, minibatch
//! shuffles) is derived from `(seed, iteration)` except the replay sampler,
//! whose RNG is checkpointed. A run resumed from a checkpoint therefore
//! reproduces the uninterrupted run's metrics for the same thread count.

pub mod actor;
pub mod asynchronous;
pub mod checkpoint;
pub mod config;
mod data_parallel;
pub mod metrics;
pub mod micro_batch;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use candle_core::{DType, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use r2vpo::advantage::count_zero_variance_groups;
use r2vpo::aggregate::{aggregate, GlobalBatch};
use r2vpo::correction::{self, RolloutCorrection};
use r2vpo::learner::Learner;
use r2vpo::objective::{kl_estimate, PolicyBatch, RatioStats};
use r2vpo::replay::ReplayBuffer;
use r2vpo::schedule::{EpochSchedule, Remainder, Reshuffle, UpdateSchedule};
use r2vpo_report::{JsonlWriter, TensorBoardWriter};

use crate::backend::{batch, Backend, Policy};
use crate::data::{load_problems_reporting, Problem, PromptError, SkippedRecord};
use crate::model::{ModelConfig, RandomInit, TensorSource};
use crate::queue::GroupEntry;
use crate::rollout::{RolloutError, RolloutSource};
use crate::sample::Generation;
use crate::tokenizer::Tokenizer;
use r2vpo_verify::{verify, VerifyConfig};

pub use crate::experience::Sample;
pub use actor::{Actor, BatchShare, Produced};
pub use config::{
    ActorsConfig, BackendKind, BehaviourLogprobs, ComputeDtype, DistConfig, Mode, ModelSource, OptimConfig, PushDtype,
    QueueBackend, QueueConfig, RandomModel, RefKlConfig, RolloutBackend, RolloutConfig, TrainConfig, WeightPush,
    VLLM_ADAPTER_NAME,
};
pub use metrics::{IterMetrics, QueueMetrics, RatioHistogram, Timing};

/// Errors of training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A config field is invalid.
    #[error("train config: `{field}`: {message}")]
    Config {
        /// Dotted field name.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Tensor code failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The core crate rejected an input.
    #[error(transparent)]
    Core(#[from] r2vpo::Error),
    /// Loading the model failed.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// Tokenizer failure.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// Chat template failure.
    #[error(transparent)]
    Chat(#[from] crate::chat::ChatError),
    /// Sampling failure.
    #[error(transparent)]
    Sample(#[from] crate::sample::SampleError),
    /// Dataset failure.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// The rollout source failed (for servers: after retries and
    /// fail-over).
    #[error(transparent)]
    Rollout(#[from] RolloutError),
    /// Another rank's rollout failed (a data-parallel job stops on every
    /// rank together, with that rank's message).
    #[error("rank {rank}'s rollout failed: {message}")]
    RolloutOnRank {
        /// The rank whose rollout failed (the first, when several did).
        rank: usize,
        /// Its error.
        message: String,
    },
    /// Publishing or fetching weights failed.
    #[error(transparent)]
    Weights(#[from] crate::weights::WeightsError),
    /// The experience queue refused a call, or an actor thread failed.
    #[error("asynchronous training: {0}")]
    Queue(String),
    /// A collective of a data-parallel job failed (a rank died or hung).
    #[error("data-parallel job: {0}")]
    Dist(#[from] crate::parallel::DistError),
    /// Data-parallel state that could not be exchanged.
    #[error("data-parallel job: {0}")]
    Exchange(String),
    /// Held-out evaluation failure.
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalError),
    /// Writing logs or plots failed.
    #[error(transparent)]
    Report(#[from] r2vpo_report::ReportError),
    /// A checkpoint is missing, corrupt or does not fit the model.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The offending file or folder.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Too many consecutive optimizer steps had a non-finite loss or
    /// gradient; the last good checkpoint is left as it was.
    #[error("{count} consecutive optimizer steps had a non-finite loss or gradient (last: {detail}); stopping")]
    NonFinite {
        /// How many in a row.
        count: usize,
        /// The statistics of the last bad step.
        detail: String,
    },
    /// File I/O.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Result alias of this module.
pub type TrainResult<T> = std::result::Result<T, TrainError>;

/// What a reward function returns for one response.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    /// The scalar reward.
    pub reward: f64,
    /// Whether the answer is correct (accuracy metric).
    pub correct: bool,
}

/// Turns a response to a problem into a reward. The default is the math
/// verifier ([`VerifierReward`]); tests and new tasks plug in their own.
pub trait RewardFn: Send + Sync {
    /// Scores one generation.
    fn score(&self, problem: &Problem, generation: &Generation) -> Scored;
}

/// Reward from the math verifier (`r2vpo_verify`): `correct_reward` if the
/// extracted answer is equivalent to the gold one, else `incorrect_reward`.
pub struct VerifierReward(pub VerifyConfig);

impl RewardFn for VerifierReward {
    fn score(&self, problem: &Problem, generation: &Generation) -> Scored {
        let v = verify(&generation.text, &problem.answer, &self.0);
        Scored { reward: v.reward(&self.0), correct: v.correct }
    }
}

/// Progress notifications for a front end (progress bars, logs).
pub enum Event<'a> {
    /// A phase of iteration `iter` started (`rollout`, `score`, `update`, `eval`).
    Phase {
        /// Iteration.
        iter: usize,
        /// Phase name.
        name: &'static str,
    },
    /// An iteration finished.
    Iteration(&'a IterMetrics),
    /// A held-out evaluation finished.
    Eval(&'a metrics::EvalRecord),
    /// A checkpoint was written.
    Checkpoint(&'a Path),
    /// An optimizer step was skipped for a non-finite loss or gradient.
    BadStep(&'a str),
}

/// Position in the stream of seeded data-order permutations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Pass over the training set.
    pub epoch: u64,
    /// Next index into that pass's permutation.
    pub cursor: usize,
}

/// Counters and line counts saved with a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Next iteration to run.
    pub iteration: usize,
    /// Optimizer steps taken (the policy version).
    pub steps: u64,
    /// Data position.
    pub data: DataPosition,
    /// Consecutive non-finite steps.
    pub bad_steps: usize,
    /// Lines of `metrics.jsonl` that belong to this state.
    pub metrics_lines: usize,
    /// Lines of `eval.jsonl`.
    pub eval_lines: usize,
    /// Lines of `ratio_hist.jsonl`.
    pub hist_lines: usize,
    /// Whether the start-of-run evaluation has been done.
    pub evaluated_start: bool,
    /// Where an asynchronous learner stands in its queue (unused by the
    /// synchronous trainer).
    #[serde(default)]
    pub queue: crate::queue::QueuePosition,
}

/// How a call to [`Trainer::run`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// All iterations ran.
    Finished,
    /// The stop flag was raised (Ctrl-C); a checkpoint was written.
    Stopped,
}

/// The seed of stream `stream` at index `index` (data order, rollout,
/// shuffle, replay) under master seed `seed` ([`r2vpo::seed::derived_seed`]).
pub use r2vpo::seed::derived_seed;

// The trainer's random streams, fixed because committed runs depend on them.
const STREAM_DATA: u64 = 1;
const STREAM_ROLLOUT: u64 = 2;
const STREAM_SHUFFLE: u64 = 3;
const STREAM_REPLAY: u64 = 4;

/// The policy `src` describes, not yet on any backend: its configuration,
/// a source of its weights (read when a backend is opened from it, one
/// tensor at a time) and the tokenizer it uses.
pub fn load_policy(src: &ModelSource) -> TrainResult<(ModelConfig, Box<dyn TensorSource>, Tokenizer)> {
    let tok_path = src.tokenizer.as_deref().unwrap_or(&src.path);
    let tok = Tokenizer::load(Path::new(tok_path))?;
    let (config, weights): (ModelConfig, Box<dyn TensorSource>) = match &src.random {
        Some(r) => {
            let cfg = match &r.shape {
                Some(shape) => {
                    let mut cfg = ModelConfig::from_file(Path::new(shape))?;
                    cfg.vocab_size = tok.vocab_size();
                    cfg
                }
                None => ModelConfig::tiny(
                    crate::model::config::Architecture::Llama,
                    tok.vocab_size(),
                    r.hidden,
                    r.intermediate,
                    r.layers,
                    r.heads,
                    r.kv_heads,
                    true,
                ),
            };
            (cfg.clone(), Box::new(RandomInit::new(cfg, r.seed, r.init_std)))
        }
        None => crate::model::source::open(Path::new(&src.path))?,
    };
    Ok((config, weights, tok))
}

/// The base model on the backend `cfg` names, for scoring only (the KL
/// reference: with `[model.lora]`, the base without adapters).
fn new_policy(cfg: &TrainConfig, config: &ModelConfig, weights: &dyn TensorSource) -> TrainResult<Box<dyn Policy>> {
    let spec = crate::backend::open::BackendSpec { lora: None, ..cfg.backend_spec() };
    crate::backend::open::open_policy(&spec, config, weights).map_err(|e| spec_error(e, "model."))
}

/// An actor's policy on the backend `cfg` names: with `[model.lora]` it
/// carries adapters (at B = 0, the base, until the learner's first
/// arrive), so the learner sends adapters, not the model
/// ([`crate::backend::Policy::export_for_actors`]).
pub(crate) fn new_actor_policy(
    cfg: &TrainConfig,
    config: &ModelConfig,
    weights: &dyn TensorSource,
) -> TrainResult<Box<dyn Policy>> {
    crate::backend::open::open_policy(&cfg.backend_spec(), config, weights).map_err(|e| spec_error(e, "model."))
}

/// The learner `cfg` names.
fn new_backend(cfg: &TrainConfig, config: &ModelConfig, weights: &dyn TensorSource) -> TrainResult<Box<dyn Backend>> {
    crate::backend::open::open_backend(&cfg.backend_spec(), config, weights, cfg.optim)
        .map_err(|e| spec_error(e, "model."))
}

/// A backend option the spec refused, as the config key that set it
/// (`prefix` + the spec's field); other errors as they are.
pub(crate) fn spec_error(e: crate::model::ModelError, prefix: &str) -> TrainError {
    match e {
        crate::model::ModelError::Spec { field, message } => {
            TrainError::Config { field: format!("{prefix}{field}"), message }
        }
        other => other.into(),
    }
}

/// One training run: the policy, its optimizer, λ, the replay buffer and
/// the run folder's logs.
pub struct Trainer {
    cfg: TrainConfig,
    /// The policy being trained, on its compute backend.
    backend: Box<dyn Backend>,
    /// The frozen initial policy of a reference-KL term (scoring only).
    reference: Option<Box<dyn Policy>>,
    tok: Tokenizer,
    /// The rollout half of every iteration (problems → groups).
    actor: Actor,
    eval_problems: Vec<Problem>,
    /// The objective and λ (the core's learner contract).
    learner: Learner,
    replay: ReplayBuffer<Sample>,
    progress: Progress,
    run_dir: PathBuf,
    metrics: JsonlWriter,
    evals: JsonlWriter,
    hists: JsonlWriter,
    events: JsonlWriter,
    tb: Option<TensorBoardWriter>,
    /// This trainer's place among the ranks of its job and what a step
    /// does across them ([`Trainer::set_group`]); alone, a group of one.
    dp: data_parallel::DataParallel,
    /// Seconds and bytes of this iteration's weight push, for its metrics.
    push: (f64, u64),
    /// DAPO's over-sampling this iteration: batches sampled and groups
    /// they added ([`Trainer::oversample`]), for its metrics.
    refill: (usize, usize),
}

impl Trainer {
    /// Starts a run in `run_dir` (created; its logs start empty) with the
    /// default verifier reward.
    pub fn new(cfg: TrainConfig, run_dir: &Path) -> TrainResult<Self> {
        let reward = Box::new(VerifierReward(cfg.verify.clone()));
        Self::with_reward(cfg, run_dir, reward)
    }

    /// [`Trainer::new`] with a custom reward function.
    pub fn with_reward(cfg: TrainConfig, run_dir: &Path, reward_fn: Box<dyn RewardFn>) -> TrainResult<Self> {
        cfg.validate()?;
        std::fs::create_dir_all(run_dir).map_err(|source| TrainError::Io { path: run_dir.to_path_buf(), source })?;
        for f in ["metrics.jsonl", "eval.jsonl", "ratio_hist.jsonl", "events.jsonl"] {
            let p = run_dir.join(f);
            if p.exists() {
                std::fs::remove_file(&p).map_err(|source| TrainError::Io { path: p.clone(), source })?;
            }
        }
        Self::build(cfg, run_dir, reward_fn, Progress::default())
    }

    fn build(cfg: TrainConfig, run_dir: &Path, reward_fn: Box<dyn RewardFn>, progress: Progress) -> TrainResult<Self> {
        let (config, weights, tok) = load_policy(&cfg.model)?;
        let reference = if cfg.ref_kl.coef > 0.0 { Some(new_policy(&cfg, &config, weights.as_ref())?) } else { None };
        let evaluating = cfg.eval_at_start || cfg.eval_at_end || cfg.eval_every > 0;
        // Prompt + response must fit the model's context; a generation
        // budget that leaves no room for any prompt is a config error.
        let context = config.max_position_embeddings;
        for (field, n, used) in [
            ("sampling.max_new_tokens", cfg.sampling.max_new_tokens, true),
            ("eval.sampling.max_new_tokens", cfg.eval.sampling.max_new_tokens, evaluating),
        ] {
            if used && n >= context {
                return Err(TrainError::Config {
                    field: field.into(),
                    message: format!("{n} leaves no room for a prompt in the model's context of {context} tokens"),
                });
            }
        }
        let mut skipped_records: Vec<SkippedRecord> = Vec::new();
        let loaded = load_problems_reporting(&cfg.data)?;
        skipped_records.extend(loaded.skipped);
        let problems = loaded.problems;
        let eval_problems = if evaluating {
            let loaded = crate::eval::load_eval_problems(&cfg.eval)?;
            skipped_records.extend(loaded.skipped);
            loaded.problems
        } else {
            Vec::new()
        };
        let actor = Actor::new(cfg.clone(), tok.clone(), problems, std::sync::Arc::from(reward_fn), context)?;
        let backend = new_backend(&cfg, &config, weights.as_ref())?;
        let learner = Learner::new(cfg.objective.clone(), &cfg.dual)?;
        let replay =
            ReplayBuffer::new(cfg.replay.capacity_iters, derived_seed(cfg.seed, STREAM_REPLAY, cfg.replay.seed))?;
        let open = |name: &str| JsonlWriter::append(run_dir.join(name));
        let mut events = open("events.jsonl")?;
        for r in &skipped_records {
            eprintln!("warning: {r}");
            events.write(&serde_json::json!({
                "event": "record_skipped",
                "path": r.path.display().to_string(),
                "line": r.line,
                "reason": r.reason,
            }))?;
        }
        Ok(Self {
            actor,
            metrics: open("metrics.jsonl")?,
            evals: open("eval.jsonl")?,
            hists: open("ratio_hist.jsonl")?,
            events,
            tb: TensorBoardWriter::create(run_dir).ok(),
            cfg,
            backend,
            reference,
            tok,
            eval_problems,
            learner,
            replay,
            progress,
            run_dir: run_dir.to_path_buf(),
            dp: data_parallel::DataParallel::alone(),
            push: (0.0, 0),
            refill: (1, 0),
        })
    }

    /// Makes this trainer one rank of a data-parallel job (docs/distributed.md).
    /// Each rank samples its [`BatchShare`] of every iteration's rollouts
    /// and the ranks exchange them (with rollout servers, rank 0 asks for
    /// the whole batch and sends it); every rank then runs the same update
    /// plan (shuffles, replay draws) on the same batch, the forward and backward of its share of
    /// each step's micro-batches, and steps with the gradients summed over
    /// the ranks. The loss is normalised by the whole step's counts
    /// (`GlobalBatch` over every micro-batch) and the ratio statistics that
    /// move λ are gathered from every rank in micro-batch order, so λ is the
    /// same on every rank and a step equals the one-process step on the
    /// same batch up to the order of floating-point sums. Every rank
    /// evaluates its share of each evaluation; only rank 0 writes the
    /// evaluations and checkpoints, and the others' run folder receives
    /// only their own logs. Every rank must start from the same weights
    /// (the same model files, or the same checkpoint).
    pub fn set_group(&mut self, group: Box<dyn crate::parallel::Group>) -> TrainResult<()> {
        let (dp, sharded) = data_parallel::DataParallel::join(group, self.backend.as_mut(), self.cfg.dist.zero_stage)?;
        self.dp = dp;
        if let (Some(data_parallel::ShardRecord { per_rank: held, sizes }), true) = (sharded, self.dp.is_writer()) {
            // What each rank keeps, on the record (rank 0's events).
            self.events.write(&serde_json::json!({
                "event": "optimizer_sharded",
                "zero_stage": self.cfg.dist.zero_stage,
                "moment_values_per_rank": held.iter().map(|h| h.moments).collect::<Vec<_>>(),
                "moment_values_total": sizes.moments_total,
                "master_values_per_rank": held.iter().map(|h| h.masters).collect::<Vec<_>>(),
                "master_values_total": sizes.masters_total,
            }))?;
        }
        // Sampler calls are dealt to ranks whole (a call's groups share one
        // decode batch), so a batch of fewer calls than ranks leaves ranks
        // idle while the others sample: said once, with the setting that
        // spreads it.
        let (world, g) = (self.dp.world(), self.cfg.group_size);
        let per_call = crate::rollout::local_groups_per_call(self.cfg.rollout_batch, g);
        let sampling = BatchShare::sampling_ranks(self.cfg.prompts_per_iter, per_call, world);
        if self.dp.is_writer() && self.cfg.rollout.backend == RolloutBackend::Local && sampling < world {
            let p = self.cfg.prompts_per_iter;
            let most = BatchShare::rollout_batch_for_every_rank(p, g, world);
            let remedy = match most {
                Some(most) => format!("rollout_batch = {most} or less gives every rank a call"),
                None => format!(
                    "a group is never split, so at most {p} ranks can sample; raise prompts_per_iter to {world}"
                ),
            };
            self.actor.warn(&format!(
                "only {sampling} of {world} ranks sample: rollout_batch = {} decodes {per_call} groups of {g} a \
                 call, so an iteration's prompts_per_iter = {p} groups make {sampling} sampler calls, and calls are \
                 dealt to ranks whole; {remedy}",
                self.cfg.rollout_batch
            ));
            self.events.write(&serde_json::json!({
                "event": "ranks_idle_in_rollout",
                "sampling_ranks": sampling,
                "world": world,
                "rollout_batch": self.cfg.rollout_batch,
                "rollout_batch_for_every_rank": most,
            }))?;
        }
        if !self.dp.is_writer() {
            // Every rank meets the same over-long prompts; rank 0 says so.
            self.actor.set_warning_handler(|_| {});
        }
        Ok(())
    }

    /// The `run_started` line of events.jsonl: where the run starts (or
    /// resumes) and on what learner, with how many ranks.
    fn log_start(&mut self) -> TrainResult<()> {
        self.events.write(&serde_json::json!({
            "event": "run_started",
            "iteration": self.progress.iteration,
            "learner": self.backend.describe(),
            "ranks": self.dp.world(),
        }))?;
        Ok(())
    }

    /// Whether this process writes the run's checkpoints and evaluations:
    /// rank 0 of a data-parallel job, or a trainer alone.
    pub fn is_writer(&self) -> bool {
        self.dp.is_writer()
    }

    /// The resolved config.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The policy being trained.
    pub fn policy(&self) -> &dyn Policy {
        self.backend.as_ref()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// Counters (iteration, steps, data position, log line counts).
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Current λ.
    pub fn lambda(&self) -> f64 {
        self.learner.lambda()
    }

    /// The run folder.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Distinct training problems skipped so far because their prompt plus
    /// `sampling.max_new_tokens` exceeds the model's context (each is also
    /// a `prompt_skipped` line of `events.jsonl` and a warning).
    pub fn prompts_skipped(&self) -> usize {
        self.actor.prompts_skipped()
    }

    /// Distinct training problems whose prompt was truncated so far
    /// (`overlong_prompts = "truncate"`; `prompt_truncated` events).
    pub fn prompts_truncated(&self) -> usize {
        self.actor.prompts_truncated()
    }

    /// Sends the trainer's warnings (skipped dataset lines, skipped or
    /// truncated prompts) to `f` instead of stderr, e.g. to print them above
    /// a progress bar. Warnings found while the trainer was built have
    /// already gone to stderr (and `events.jsonl`).
    pub fn set_warning_handler(&mut self, f: impl FnMut(&str) + Send + Sync + 'static) {
        self.actor.set_warning_handler(f);
    }

    /// Samples rollouts from `source` instead of in-process (an HTTP
    /// client of rollout servers). Refused when the source's log-probs do
    /// not mean what `behaviour_logprobs` needs ([`TrainConfig::check_logprobs`]).
    /// The source is synced with the current weights before its first
    /// rollout.
    pub fn set_rollout_source(&mut self, source: Box<dyn RolloutSource>) -> TrainResult<()> {
        self.actor.set_rollout_source(source)
    }

    /// The rollout source's counters (requests, retries, failures, pushes).
    pub fn rollout_counters(&self) -> crate::rollout::RolloutCounters {
        self.actor.rollout_counters()
    }

    /// Runs iterations until `cfg.iterations` or until `stop` is raised,
    /// checkpointing every `checkpoint_every` iterations and at the end.
    pub fn run(&mut self, stop: &AtomicBool, on_event: &mut dyn FnMut(Event)) -> TrainResult<Outcome> {
        self.log_start()?;
        if self.cfg.eval_at_start && !self.progress.evaluated_start {
            self.evaluate(on_event)?;
            self.progress.evaluated_start = true;
        }
        while self.progress.iteration < self.cfg.iterations {
            let m = match self.iteration(on_event) {
                Ok(m) => m,
                Err(e @ (TrainError::Rollout(_) | TrainError::RolloutOnRank { .. })) => {
                    // No server left: keep what was learned, so `--resume`
                    // continues once a server is back. In a data-parallel
                    // job every rank is here after the same exchange
                    // (`iteration`), so the optimizer state is gathered and
                    // rank 0 writes the checkpoint as after any iteration.
                    self.actor.log_rollout_faults(self.progress.iteration as u64);
                    self.write_actor_events()?;
                    if let Some(p) = self.checkpoint()? {
                        on_event(Event::Checkpoint(&p));
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            if let Some(out) = self.after_iteration(&m, stop, on_event)? {
                return Ok(out);
            }
        }
        Ok(Outcome::Finished)
    }

    /// Reports an iteration, then evaluates and checkpoints when due (and
    /// when `stop` is raised). `Some(Stopped)` ends the run early.
    fn after_iteration(
        &mut self,
        m: &IterMetrics,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Option<Outcome>> {
        on_event(Event::Iteration(m));
        let it = self.progress.iteration;
        let last = it == self.cfg.iterations;
        // Every rank evaluates (its share of the batches): see `evaluate`.
        if self.cfg.eval_every > 0 && it.is_multiple_of(self.cfg.eval_every) && !last {
            self.evaluate(on_event)?;
        }
        if last && self.cfg.eval_at_end {
            self.evaluate(on_event)?;
        }
        let due = self.cfg.checkpoint_every > 0 && it.is_multiple_of(self.cfg.checkpoint_every);
        // A signal reaches the ranks at different moments: they stop
        // together, after the same iteration, if any rank was asked to.
        let stopping = self.dp.any(stop.load(Ordering::SeqCst))?;
        if due || last || stopping {
            if let Some(p) = self.checkpoint()? {
                on_event(Event::Checkpoint(&p));
            }
        }
        Ok((stopping && !last).then_some(Outcome::Stopped))
    }

    /// A checkpoint: every rank gives its share of the optimizer state and
    /// rank 0 writes it (its folder returned there, `None` on the others).
    /// In a data-parallel job every rank calls it, and each rank's peak
    /// resident memory when it began and its peak during it go on rank 0's
    /// events (`checkpoint_memory`): the transient a checkpoint costs a rank.
    fn checkpoint(&mut self) -> TrainResult<Option<PathBuf>> {
        self.dp.begin_phase();
        self.dp.before_checkpoint(self.backend.as_mut())?;
        let path = if self.is_writer() {
            Some(self.save_checkpoint()?)
        } else {
            self.dp.write_optimizer(self.backend.as_mut(), None)?;
            None
        };
        if let Some(mem) = self.dp.phase_peaks("the ranks' checkpoint memory")? {
            if self.is_writer() {
                self.events.write(&serde_json::json!({
                    "event": "checkpoint_memory",
                    "iteration": self.progress.iteration,
                    "rank_start_rss_mib": mem.iter().map(|m| m.0).collect::<Vec<_>>(),
                    "rank_peak_rss_mib": mem.iter().map(|m| m.1).collect::<Vec<_>>(),
                }))?;
            }
        }
        Ok(path)
    }

    /// The micro-batch layout: packed where asked and the backend packs,
    /// else shared prompts where asked and the backend shares them, else
    /// padded rows.
    fn layout(&self) -> micro_batch::Layout {
        if self.cfg.pack_sequences && self.backend.packs_sequences() {
            micro_batch::Layout::Packed
        } else if self.cfg.share_prompt_prefix && self.backend.shares_prompt_prefix() {
            micro_batch::Layout::Prefixed
        } else {
            micro_batch::Layout::Padded
        }
    }

    /// Tensors for one micro-batch, in [`Trainer::layout`].
    fn pack(&self, samples: &[&Sample], dev: &candle_core::Device) -> candle_core::Result<batch::MicroBatch> {
        let pad = self.tok.pad_token_id();
        match self.layout() {
            micro_batch::Layout::Packed => batch::pack_sequences(samples, pad, dev),
            micro_batch::Layout::Prefixed => batch::pack_prefixed(samples, pad, dev),
            micro_batch::Layout::Padded => batch::pack(samples, pad, dev),
        }
    }

    /// The micro-batches of `samples` as index lists
    /// ([`micro_batch::plan`]), dealt over `world` ranks.
    fn micro_batches(&self, samples: &[&Sample], world: usize) -> Vec<Vec<usize>> {
        let items: Vec<micro_batch::Item> = samples
            .iter()
            .map(|s| micro_batch::Item {
                prompt_key: s.problem,
                prompt: s.prompt_ids.len(),
                response: s.response_ids.len(),
            })
            .collect();
        let (rows, budget) = (self.cfg.micro_batch_size, self.cfg.max_tokens_per_micro_batch);
        micro_batch::plan(&items, self.layout(), rows, budget, world)
    }

    /// Per-response log-probs of `samples` under `policy` (no graph).
    fn score(&self, policy: &dyn Policy, samples: &[&Sample]) -> TrainResult<Vec<Vec<f32>>> {
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); samples.len()];
        for idx in self.micro_batches(samples, 1) {
            let part: Vec<&Sample> = idx.iter().map(|&i| samples[i]).collect();
            let t = self.pack(&part, policy.device())?;
            let lp = policy.score(&t)?;
            for (i, row) in idx.into_iter().zip(batch::unpack_responses(&lp, &part)?) {
                out[i] = row;
            }
        }
        Ok(out)
    }

    /// One synchronous iteration: batch `iteration` drawn and sampled from
    /// the current policy ([`Actor::produce`]), then learned from
    /// ([`Trainer::learn`]). In a data-parallel job that samples
    /// in-process, each rank samples its [`BatchShare`] and the ranks
    /// exchange their groups; with rollout servers, rank 0 asks them for the
    /// whole batch (the servers are where sampling scales out) and sends it
    /// to the other ranks.
    fn iteration(&mut self, on_event: &mut dyn FnMut(Event)) -> TrainResult<IterMetrics> {
        let iter = self.progress.iteration;
        let t_start = Instant::now();
        on_event(Event::Phase { iter, name: "rollout" });
        // In a data-parallel job that samples in-process each rank samples
        // its share; with rollout servers rank 0 asks for the whole batch.
        let spread = self.cfg.rollout.backend == RolloutBackend::Local;
        let share =
            if spread { BatchShare { rank: self.dp.rank(), world: self.dp.world() } } else { BatchShare::WHOLE };
        let pushed_before = self.actor.rollout_counters();
        let produced = self.dp.samples(spread).then(|| {
            self.actor.produce(self.backend.as_ref(), iter as u64, &mut self.progress.data, iter as u64, share)
        });
        self.write_actor_events()?;
        let mut produced = self.dp.exchange_rollouts(produced, spread, || t_start.elapsed().as_secs_f64())?;
        let pushed = self.actor.rollout_counters();
        self.push = (pushed.push_s - pushed_before.push_s, pushed.push_bytes - pushed_before.push_bytes);
        let mut entries = std::mem::take(&mut produced.entries);
        let mut rollout_s = produced.rollout_s;
        if self.cfg.max_gen_batches > 1 {
            rollout_s += self.oversample(&mut entries, share, spread)?;
        }
        self.learn(&entries, rollout_s, t_start, None, on_event)
    }

    /// DAPO's dynamic sampling (verl's `filter_groups`): while fewer than
    /// `prompts_per_iter` of `entries` carry a learning signal (rewards not
    /// all equal) and fewer than `max_gen_batches` batches were sampled,
    /// draw the next `prompts_per_iter` problems, sample them as the first
    /// batch was, and keep their groups with a signal, up to the number
    /// missing. Batch k of iteration i is seeded as batch `i + k·2⁴⁰`, so
    /// its samples are new draws. The zero-variance groups of the first
    /// batch stay in `entries` for [`Trainer::learn`] to count and filter.
    /// Returns the extra rollout seconds; the batch count and the groups
    /// added go to the iteration's metrics, and a batch still short at the
    /// cap is reported in `events.jsonl`.
    fn oversample(&mut self, entries: &mut Vec<GroupEntry>, share: BatchShare, spread: bool) -> TrainResult<f64> {
        let iter = self.progress.iteration;
        let want = self.cfg.prompts_per_iter;
        let signal = |e: &GroupEntry| e.rewards.iter().any(|&r| r != e.rewards[0]);
        let mut kept = entries.iter().filter(|e| signal(e)).count();
        let (mut batches, mut added, mut extra_s) = (1usize, 0usize, 0.0f64);
        while kept < want && batches < self.cfg.max_gen_batches {
            let t = Instant::now();
            let id = iter as u64 + ((batches as u64) << 40);
            let more = self
                .dp
                .samples(spread)
                .then(|| self.actor.produce(self.backend.as_ref(), id, &mut self.progress.data, iter as u64, share));
            self.write_actor_events()?;
            let more = self.dp.exchange_rollouts(more, spread, || t.elapsed().as_secs_f64())?;
            extra_s += more.rollout_s;
            batches += 1;
            for e in more.entries {
                if kept < want && signal(&e) {
                    entries.push(e);
                    kept += 1;
                    added += 1;
                }
            }
        }
        self.refill = (batches, added);
        if kept < want && self.is_writer() {
            self.events.write(&serde_json::json!({
                "event": "dynamic_sampling_short",
                "iteration": iter,
                "gen_batches": batches,
                "groups_with_signal": kept,
                "wanted": want,
                "message": format!(
                    "{kept} of {want} groups carry a signal after {batches} batches (max_gen_batches); \
                     training on those"
                ),
            }))?;
        }
        Ok(extra_s)
    }

    /// Writes the actor's pending `events.jsonl` lines.
    fn write_actor_events(&mut self) -> TrainResult<()> {
        for e in self.actor.take_events() {
            self.events.write(&e)?;
        }
        Ok(())
    }

    /// The learning half of iteration `progress.iteration`, on `entries`
    /// (one per prompt group, in order): rollout metrics → zero-variance
    /// filter → scoring passes → optimizer steps (epochs over the batch, or
    /// replay draws) → metrics, histograms and TensorBoard lines.
    /// `rollout_s` is how long the rollout (or the wait for it) took and
    /// `t_start` when the iteration began. An asynchronous learner passes
    /// its `queue` metrics: then a replayed sample's age (histograms,
    /// `trained_lag`) is its weight-version lag rather than its buffer slot,
    /// the two being equal in a synchronous run.
    fn learn(
        &mut self,
        entries: &[GroupEntry],
        rollout_s: f64,
        t_start: Instant,
        mut queue: Option<metrics::QueueMetrics>,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<IterMetrics> {
        let iter = self.progress.iteration;
        let g = self.cfg.group_size;
        let rollout_version = entries.first().map_or(iter as u64, |e| e.weight_version);
        let mut samples: Vec<Sample> = entries.iter().flat_map(Sample::from_group).collect();
        let mut entropy_sum = 0.0f64;
        let mut entropy_tokens = 0usize;
        let mut truncated = 0usize;
        for e in entries {
            for i in 0..e.responses.len() {
                entropy_sum += e.entropy_sum[i];
                entropy_tokens += e.entropy_tokens[i] as usize;
                truncated += usize::from(e.truncated[i]);
            }
        }
        let gen_tokens: usize = samples.iter().map(|s| s.response_ids.len()).sum();
        let rewards: Vec<f32> = samples.iter().map(|s| s.reward).collect();
        let zero_var = count_zero_variance_groups(&rewards, g)?;
        let n = samples.len() as f64;
        let lens: Vec<usize> = samples.iter().map(|s| s.response_ids.len()).collect();
        let (gen_batches, refilled) = std::mem::replace(&mut self.refill, (1, 0));
        let mut m = IterMetrics {
            iter,
            reward_mean: rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / n,
            accuracy: samples.iter().filter(|s| s.correct).count() as f64 / n,
            response_len_mean: lens.iter().sum::<usize>() as f64 / n,
            response_len_max: lens.iter().copied().max().unwrap_or(0),
            truncated_frac: truncated as f64 / n,
            // Servers that do not report entropies leave it unknown.
            entropy: if entropy_tokens == 0 && gen_tokens > 0 {
                f64::NAN
            } else {
                entropy_sum / entropy_tokens.max(1) as f64
            },
            rollout_version,
            zero_variance_groups: zero_var,
            // Over the first batch: the refill kept only groups with a signal.
            zero_variance_frac: zero_var as f64 / (entries.len() - refilled) as f64,
            gen_batches,
            refilled_groups: refilled,
            ..IterMetrics::default()
        };

        if self.cfg.filter_zero_variance {
            let keep: Vec<bool> = rewards
                .chunks(g)
                .map(|grp| grp.iter().any(|&r| r != grp[0]))
                .flat_map(|k| std::iter::repeat_n(k, g))
                .collect();
            let mut it = keep.iter();
            samples.retain(|_| *it.next().expect("one flag per sample"));
            m.filtered_groups = zero_var;
        }

        // Scoring passes: recomputed behaviour log-probs and the reference.
        // The rollout–trainer mismatch is measured here when behaviour
        // log-probs are recomputed, else in the first optimizer step,
        // whose forward runs at the weights that sampled.
        let mut mismatch: Option<metrics::MismatchSums> = None;
        let mut correction_sums = correction::CorrectionSums::default();
        let t_score = Instant::now();
        if !samples.is_empty()
            && (self.cfg.behaviour_logprobs == BehaviourLogprobs::Recompute || self.reference.is_some())
        {
            on_event(Event::Phase { iter, name: "score" });
            let refs: Vec<&Sample> = samples.iter().collect();
            let recomputed = if self.cfg.behaviour_logprobs == BehaviourLogprobs::Recompute {
                Some(self.score(self.backend.as_ref(), &refs)?)
            } else {
                None
            };
            let reference = match &self.reference {
                Some(r) => Some(self.score(r.as_ref(), &refs)?),
                None => None,
            };
            let correction = self.cfg.objective.rollout_correction;
            let cap = self.cfg.objective.rollout_correction_cap;
            for (i, s) in samples.iter_mut().enumerate() {
                if let Some(r) = &recomputed {
                    // Before the engine's log-probs are replaced: how far
                    // they were from the learner's (every rank scores every
                    // sample, so the sums need no reduction).
                    if s.version == iter as u64 {
                        let mm = mismatch.get_or_insert_with(metrics::MismatchSums::default);
                        mm.add_row(&r[i], &s.behaviour_logp, &vec![1.0; r[i].len()]);
                    }
                    // The mismatch correction's weights π_old/μ, fixed
                    // from here on (replayed samples keep theirs).
                    if correction != RolloutCorrection::None {
                        let (w, sums) = correction::weights(correction, cap, &r[i], &s.behaviour_logp);
                        s.is_weight = Some(w);
                        correction_sums.add(&sums);
                    }
                    s.behaviour_logp = r[i].clone();
                }
                if let Some(r) = &reference {
                    s.ref_logp = Some(r[i].clone());
                }
            }
        }
        let score_s = t_score.elapsed().as_secs_f64();
        m.correction = metrics::Correction::from_sums(&correction_sums);

        // Update phase.
        on_event(Event::Phase { iter, name: "update" });
        let t_train = Instant::now();
        let hist_on = self.cfg.histogram_every > 0 && iter.is_multiple_of(self.cfg.histogram_every);
        let mut hist = metrics::HistogramSet::new(hist_on, self.cfg.histogram_range, self.cfg.mode);
        if queue.is_some() && self.cfg.mode == Mode::Off {
            hist.set_unit("weight_version");
        }
        let mut trained_lag = std::collections::BTreeMap::<u64, usize>::new();
        let mut acc = metrics::StepAccumulator::default();
        let mut shuffle_rng = ChaCha8Rng::seed_from_u64(derived_seed(self.cfg.seed, STREAM_SHUFFLE, iter as u64));
        let epochs = EpochSchedule {
            epochs: self.cfg.epochs,
            minibatch_size: self.cfg.minibatch_size,
            remainder: Remainder::Keep,
            reshuffle: Reshuffle::FromIdentity,
        };
        let phase = UpdateSchedule::new(self.cfg.mode, epochs, &self.cfg.replay).plan(
            iter as u64,
            samples,
            &mut self.replay,
            &mut shuffle_rng,
        )?;
        let (mut lag_sum, mut lag_n) = (0.0f64, 0usize);
        for k in 0..phase.len() {
            // An item's age is its epoch on-policy (the histograms compare
            // epochs) and its staleness in the replay buffer.
            let drawn: Vec<(Sample, u64)> = phase
                .items(k, &self.replay)
                .into_iter()
                .map(|s| {
                    let age = match (self.cfg.mode, queue.is_some()) {
                        (Mode::On, _) => s.epoch as u64,
                        (Mode::Off, false) => s.staleness,
                        (Mode::Off, true) => (iter as u64).saturating_sub(s.item.version),
                    };
                    (s.item.clone(), age)
                })
                .collect();
            for (s, _) in &drawn {
                let lag = (iter as u64).saturating_sub(s.version);
                lag_sum += lag as f64;
                lag_n += 1;
                *trained_lag.entry(lag).or_default() += 1;
                m.version_lag_max = m.version_lag_max.max(lag);
            }
            let items: Vec<(&Sample, u64)> = drawn.iter().map(|(s, a)| (s, *a)).collect();
            let first = (k == 0 && mismatch.is_none()).then(metrics::MismatchSums::default);
            let measured = self.optimizer_step(&items, &mut hist, &mut acc, first, on_event)?;
            if k == 0 && mismatch.is_none() {
                mismatch = measured;
            }
        }
        m.mismatch = mismatch.and_then(|mm| mm.finish());
        let train_s = t_train.elapsed().as_secs_f64();
        m.version_lag_mean = lag_sum / lag_n.max(1) as f64;
        if let Some(q) = queue.as_mut() {
            q.trained_lag = trained_lag.into_iter().collect();
        }
        m.queue = queue;
        acc.finish_into(&mut m);
        m.steps = self.progress.steps;
        m.lambda = self.learner.lambda();
        let iteration_s = t_start.elapsed().as_secs_f64();
        // With a queue, `rollout_s` is the learner's wait for groups that
        // actors sampled meanwhile: their tokens over that wait is no rate.
        let rollout_clock = if m.queue.is_some() { iteration_s } else { rollout_s };
        let (push_s, push_bytes) = std::mem::take(&mut self.push);
        m.timing = Timing {
            rollout_s,
            push_s,
            push_bytes,
            score_s,
            train_s,
            rollout_tokens_per_s: gen_tokens as f64 / rollout_clock.max(1e-9),
            train_tokens_per_s: acc.tokens as f64 / train_s.max(1e-9),
            iteration_s,
        };
        if let Some(r) = self.dp.rank_record()? {
            m.rank_peak_rss_mib = Some(r.peak_rss_mib);
            m.rank_train_tokens = Some(r.train_tokens);
            m.rank_rollout_groups = r.rollout_groups;
        }
        for h in hist.finish(iter) {
            self.hists.write(&h)?;
            self.progress.hist_lines += 1;
        }
        self.metrics.write(&m)?;
        self.progress.metrics_lines += 1;
        if let Some(tb) = self.tb.as_mut() {
            tb.scalars(iter as i64, &m.scalars())?;
        }
        self.progress.iteration += 1;
        Ok(m)
    }

    /// One optimizer step over `items` (sample, age): micro-batched
    /// forward/backward with the loss normalised over the whole minibatch,
    /// gradient accumulation, a finiteness check, clipping, AdamW, then the
    /// λ update. The backend computes each micro-batch's log-probs; the
    /// loss and its gradient with respect to them are the core's, here;
    /// the backend takes that gradient back through the model
    /// ([`crate::backend`]).
    fn optimizer_step(
        &mut self,
        items: &[(&Sample, u64)],
        hist: &mut metrics::HistogramSet,
        acc: &mut metrics::StepAccumulator,
        mut mismatch: Option<metrics::MismatchSums>,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Option<metrics::MismatchSums>> {
        if items.is_empty() {
            return Ok(None);
        }
        let iteration = self.progress.iteration as u64;
        let dev = self.backend.device().clone();
        let mut items = items.to_vec();
        if self.layout() != micro_batch::Layout::Padded {
            // Keep each prompt's samples in as few micro-batches as possible.
            items.sort_by_key(|(s, _)| s.problem);
        }
        let samples: Vec<&Sample> = items.iter().map(|(s, _)| *s).collect();
        let parts: Vec<Vec<(&Sample, u64)>> = self
            .micro_batches(&samples, self.dp.world())
            .into_iter()
            .map(|idx| idx.into_iter().map(|i| items[i]).collect())
            .collect();
        let packed: Vec<batch::MicroBatch> = parts
            .iter()
            .map(|p| self.pack(&p.iter().map(|(s, _)| *s).collect::<Vec<_>>(), &dev))
            .collect::<candle_core::Result<_>>()?;
        let masks: Vec<&Tensor> = packed.iter().map(|t| &t.mask).collect();
        let global = GlobalBatch::from_masks(&masks)?.with_horizon(self.cfg.sampling.max_new_tokens as f64);
        let agg = self.cfg.objective.aggregation;
        let mut loss_total = 0.0f64;
        let mut ref_kl = 0.0f64;
        let mut tokens = 0usize;
        let entropy_coef = self.cfg.entropy_coef;
        // In a data-parallel job each rank takes its share of the
        // micro-batches (the normaliser `global` above covers them all);
        // what the step reports and what moves λ is gathered below.
        let mut shares: Vec<Share> = Vec::new();
        for (k, (part, t)) in parts.iter().zip(&packed).enumerate() {
            if !self.dp.owns(k) {
                self.dp.after_micro_batch(k, parts.len(), self.backend.as_mut())?;
                continue;
            }
            // Forward on the backend, then the loss on the log-probs as
            // leaves: the objective, the KL to the reference and the
            // entropy bonus when on.
            let (fwd, loss, (out_stats, kl)) = crate::backend::forward_backward(
                self.backend.as_mut(),
                t,
                entropy_coef != 0.0,
                |logp, entropy| -> TrainResult<_> {
                    let out = self.learner.loss(
                        &PolicyBatch {
                            logp,
                            old_logp: &t.old_logp,
                            advantages: &t.advantages,
                            mask: &t.mask,
                            weights: t.is_weight.as_ref(),
                        },
                        &global,
                    )?;
                    let mut loss = out.loss;
                    let mut kl_term = 0.0;
                    let ref_cfg = self.cfg.ref_kl;
                    if let (Some(rf), true) = (&t.ref_logp, ref_cfg.coef > 0.0) {
                        // KL(π_θ‖π_ref) with x = log π_ref − log π_θ (verl's kl_penalty).
                        let x = rf.sub(logp)?;
                        let kl = kl_estimate(ref_cfg.estimator, &x)?;
                        let term = aggregate(&kl, &t.mask, agg, &global)?;
                        kl_term = term.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                        loss = loss.add(&term.affine(ref_cfg.coef, 0.0)?)?;
                    }
                    if let Some(ent) = entropy {
                        let term = aggregate(ent, &t.mask, agg, &global)?;
                        loss = loss.sub(&term.affine(entropy_coef, 0.0)?)?;
                    }
                    Ok((loss, (out.stats, kl_term)))
                },
            )?;
            ref_kl += kl;
            loss_total += loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            let mut rows = Vec::new();
            if hist.enabled() {
                let ratio = (&fwd.logp - &t.old_logp)?.exp()?;
                let r: Vec<Vec<f32>> = ratio.to_vec2()?;
                let mk: Vec<Vec<f32>> = t.mask.to_vec2()?;
                for ((row, mrow), (_, age)) in r.iter().zip(&mk).zip(part.iter()) {
                    rows.push((
                        *age,
                        row.iter().zip(mrow).filter(|(_, &mm)| mm > 0.0).map(|(&x, _)| f64::from(x)).collect(),
                    ));
                }
            }
            if let Some(mm) = mismatch.as_mut() {
                // Before any update: the learner's log-probs against the
                // engine's (`old_logp`), on samples of the current version.
                let lp: Vec<Vec<f32>> = fwd.logp.to_vec2()?;
                let old: Vec<Vec<f32>> = t.old_logp.to_vec2()?;
                let mk: Vec<Vec<f32>> = t.mask.to_vec2()?;
                for (i, (s, _)) in part.iter().enumerate() {
                    if s.version == iteration {
                        mm.add_row(&lp[i], &old[i], &mk[i]);
                    }
                }
            }
            let mine = t.mask.sum_all()?.to_scalar::<f32>()? as usize;
            tokens += mine;
            self.dp.trained(mine);
            shares.push(Share { part: k, stats: out_stats, rows });
            self.dp.after_micro_batch(k, parts.len(), self.backend.as_mut())?;
        }
        self.dp.sum_gradients(self.backend.as_mut())?;
        // The step's figures over every rank's micro-batches.
        let StepFigures { loss: loss_total, ref_kl, tokens, mismatch, stats } = self.step_figures(
            StepFigures { loss: loss_total, ref_kl, tokens, mismatch, stats: Vec::new() },
            shares,
            hist,
        )?;
        let norm = self.dp.global_norm(self.backend.grad_norm()?)?;
        if !loss_total.is_finite() || !norm.is_finite() {
            // The step is not taken, so λ does not learn from it either.
            let merged = RatioStats::merge(&stats);
            self.progress.bad_steps += 1;
            let detail = format!(
                "step {} loss {loss_total} grad_norm {norm} ratio_mean {} ratio_max {} sq_dev {} log_ratio_clamped {}",
                self.progress.steps,
                merged.ratio_mean,
                merged.ratio_max,
                merged.sq_dev_mean,
                merged.log_ratio_clamped_frac
            );
            self.events.write(&serde_json::json!({
                "event": "non_finite_step",
                "iteration": self.progress.iteration,
                "step": self.progress.steps,
                "loss": loss_total.to_string(),
                "grad_norm": norm.to_string(),
                "stats": merged,
            }))?;
            on_event(Event::BadStep(&detail));
            self.backend.zero_grad();
            acc.skipped += 1;
            if self.progress.bad_steps >= self.cfg.max_bad_steps {
                return Err(TrainError::NonFinite { count: self.progress.bad_steps, detail });
            }
            return Ok(mismatch);
        }
        self.progress.bad_steps = 0;
        let lr = self.backend.step(self.cfg.optim.clip_scale(norm))?;
        self.dp.after_step(self.backend.as_mut())?;
        self.progress.steps += 1;
        let merged = self.learner.after_step(&stats)?;
        let mean_age = items.iter().map(|(_, a)| *a as f64).sum::<f64>() / items.len() as f64;
        acc.add(&merged, loss_total, norm, lr, ref_kl, mean_age, tokens);
        Ok(mismatch)
    }

    /// Writes the current policy as a Hugging Face folder (weights,
    /// `config.json`, tokenizer files with the chat template), loadable by
    /// [`crate::backend::candle::load_model`] and by `transformers`; a run
    /// that trains adapters writes them as a PEFT adapter folder
    /// (`adapter_config.json`, `adapter_model.safetensors`, the tokenizer
    /// files), which PEFT and vLLM load on the base and `llm merge` folds
    /// into it.
    pub fn export(&self, dir: &Path) -> TrainResult<()> {
        match (self.backend.lora(), self.backend.export_adapter()?) {
            (Some(lora), Some(adapter)) => {
                crate::model::lora::save_peft(dir, lora, Some(&self.cfg.model.path), &adapter)?;
            }
            _ => {
                let weights = self.backend.export(self.progress.iteration as u64)?;
                weights.save_hf_dir(self.backend.config(), dir)?;
            }
        }
        self.tok.save_hf_files(dir)?;
        Ok(())
    }

    /// Held-out avg@k of the current policy, appended to `eval.jsonl`. In
    /// a data-parallel job every rank calls it at the same point: each
    /// decodes its share of the evaluation's batches and one exchange gives
    /// rank 0 the whole report, which it writes
    /// ([`crate::eval::evaluate_ranks`]). Why shared: ranks wait in a
    /// collective only for the difference between their shares, where a
    /// rank 0 evaluating alone would hold the others in their next
    /// collective for the whole evaluation, which the paper's (hours of
    /// 15k-token answers) outlasts `dist.timeout_s`.
    fn evaluate(&mut self, on_event: &mut dyn FnMut(Event)) -> TrainResult<()> {
        let writer = self.is_writer();
        if writer {
            on_event(Event::Phase { iter: self.progress.iteration, name: "eval" });
        }
        let report = crate::eval::evaluate_ranks(
            self.backend.as_ref(),
            &self.tok,
            &self.eval_problems,
            &self.cfg.eval,
            &mut |_, _| {},
            self.dp.launched_group(),
        )?;
        if !writer {
            return Ok(());
        }
        let dir = self.run_dir.join("eval");
        std::fs::create_dir_all(&dir).map_err(|source| TrainError::Io { path: dir.clone(), source })?;
        r2vpo_report::atomic_write_json(&dir.join(format!("iter-{:06}.json", self.progress.iteration)), &report)?;
        let k = self.cfg.eval.k;
        let rec = metrics::EvalRecord {
            iter: self.progress.iteration,
            steps: self.progress.steps,
            problems: report.overall.problems,
            k,
            avg_at_k: report.overall.avg_at_k,
            pass_at_k: report.overall.pass_at.get(&k).copied().unwrap_or(f64::NAN),
            maj_at_k: report.overall.maj_at_k,
            response_len_mean: report.overall.mean_response_tokens,
            seconds: report.wall_seconds,
        };
        self.evals.write(&rec)?;
        self.progress.eval_lines += 1;
        if let Some(tb) = self.tb.as_mut() {
            tb.scalars(self.progress.iteration as i64, &[("eval/avg_at_k", rec.avg_at_k)])?;
        }
        on_event(Event::Eval(&rec));
        Ok(())
    }
}

impl From<PromptError> for TrainError {
    fn from(e: PromptError) -> Self {
        match e {
            PromptError::Chat(e) => TrainError::Chat(e),
            PromptError::Tokenizer(e) => TrainError::Tokenizer(e),
        }
    }
}

/// What an optimizer step reports: its loss, KL to the reference, trained
/// tokens, rollout–trainer mismatch and per-micro-batch ratio statistics.
struct StepFigures {
    loss: f64,
    ref_kl: f64,
    tokens: usize,
    mismatch: Option<metrics::MismatchSums>,
    stats: Vec<RatioStats>,
}

/// One micro-batch's part of a step, as a data-parallel rank sends it to
/// the others: its ratio statistics and (when histograms are on) each
/// row's age and unmasked ratios.
#[derive(Serialize, Deserialize)]
struct Share {
    /// The micro-batch's index in the step.
    part: usize,
    stats: RatioStats,
    rows: Vec<(u64, Vec<f64>)>,
}

impl Trainer {
    /// A step's figures over every rank's micro-batches, from this rank's
    /// (`mine`, without statistics) and its `shares`: the loss, the KL to
    /// the reference and the tokens summed, the rollout–trainer mismatch
    /// summed (its maximum the ranks'), and the ratio statistics in
    /// micro-batch order (as one process sees them), whose histogram rows
    /// go into `hist`. Alone, this rank's.
    fn step_figures(
        &mut self,
        mine: StepFigures,
        shares: Vec<Share>,
        hist: &mut metrics::HistogramSet,
    ) -> TrainResult<StepFigures> {
        let StepFigures { loss, ref_kl, tokens, mut mismatch, .. } = mine;
        let mm = mismatch.unwrap_or_default();
        let mut sums = [loss, ref_kl, tokens as f64, mm.tokens, mm.abs, mm.sq_dev];
        self.dp.sum(&mut sums)?;
        if let Some(mm) = mismatch.as_mut() {
            (mm.tokens, mm.abs, mm.sq_dev) = (sums[3], sums[4], sums[5]);
            mm.max = self.dp.gather(mm.max, "the mismatch maximum")?.into_iter().fold(mm.max, f64::max);
        }
        let mut all: Vec<Share> = self.dp.gather(shares, "the step's statistics")?.into_iter().flatten().collect();
        all.sort_by_key(|s| s.part);
        let mut stats = Vec::with_capacity(all.len());
        for s in all {
            for (age, row) in s.rows {
                hist.add(age, row.into_iter());
            }
            stats.push(s.stats);
        }
        Ok(StepFigures { loss: sums[0], ref_kl: sums[1], tokens: sums[2] as usize, mismatch, stats })
    }
}

/// Fisher–Yates shuffle of the whole slice.
fn shuffle<T>(v: &mut [T], rng: &mut ChaCha8Rng) {
    for i in 0..v.len() {
        let j = rng.random_range(i..v.len());
        v.swap(i, j);
    }
}
