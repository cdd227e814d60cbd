//! Continuous batching: one decode loop that many callers share.
//!
//! [`Engine`] owns the model on a thread of its own. Callers submit
//! [`Job`]s (a prompt and `n` samples, each with its own seed and sampling
//! settings) from any thread; the loop admits waiting jobs whenever rows are
//! free, prefills their distinct prompts together (the `n` samples of a
//! prompt share one prefill), appends their KV rows to the running batch
//! ([`DecodeCache::append_rows`]) and decodes every active row in one forward
//! step. A row leaves the batch the step it finishes, and its job is
//! answered when its last sample is done — a long generation never holds
//! back a short one, and new requests do not wait for the batch to drain.
//! Admission is first come, first served with backfilling
//! (`Loop::admit`): a job too large for the free rows reserves them, and
//! smaller jobs behind it start meanwhile when they cannot delay it.
//! Prompts longer than [`EngineConfig::prefill_chunk`] are prefilled in
//! chunks, one per loop step, with a decode step of the running rows in
//! between, so a huge prompt slows the others down but does not stall them.
//!
//! Sampling is [`crate::sample::sample_token`], one `ChaCha8Rng` per sample
//! seeded from [`Job::seeds`], so a sample's tokens and log-probs depend on
//! its seed and the weights only: the same as [`crate::sample::generate_ids`]
//! for the same seed, up to float rounding of differently shaped batches
//! (tested).
//!
//! Weights change only between generations: [`Engine::update_weights`]
//! stops admitting jobs, lets the running rows finish, then sets the
//! weights in place, one tensor at a time.
//! Every answer carries the weight version that produced all of its tokens,
//! which is what an RL learner needs to measure staleness exactly.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use candle_core::{DType, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::backend::candle::KvCache;
use crate::decode::{DecodeCache, Decoder};
use crate::model::{ModelConfig, TensorSource};
use crate::sample::{
    check_prompt, distinct_prompts, sample_token, FinishReason, Generation, SampleError, SamplingConfig,
};
use crate::tokenizer::PaddedBatch;

/// Limits of the decode loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most sequences decoded together (rows of the batch). A job's `n`
    /// must not exceed it.
    pub max_batch: usize,
    /// Most jobs waiting for admission; beyond it [`Engine::submit`]
    /// refuses with [`EngineError::Busy`].
    pub max_waiting: usize,
    /// Prompt tokens (columns of the admitted prompts) prefilled per loop
    /// step. Longer prompts are prefilled in chunks with a decode step of
    /// the running rows between chunks, so one huge prompt slows the others
    /// down instead of stalling them.
    pub prefill_chunk: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_batch: 64, max_waiting: 1024, prefill_chunk: 512 }
    }
}

/// A stop condition on the tokens generated so far (stop strings).
pub type StopWhen = Arc<dyn Fn(&[u32]) -> bool + Send + Sync>;

/// The most alternatives [`Job::top_logprobs`] may ask for per token
/// (vLLM's default limit, and what OpenAI's API allows).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One token as it is sampled, for a client that streams
/// ([`Job::on_token`]).
#[derive(Clone, Debug)]
pub struct TokenEvent {
    /// Which sample of the job (index into [`Job::seeds`]).
    pub sample: usize,
    /// The sampled token.
    pub token: u32,
    /// Its log-prob under the sampling distribution (temperature and
    /// truncation applied; [`Generation::logprobs`]).
    pub logprob: f32,
    /// Its log-prob under the model's T = 1 distribution
    /// ([`Generation::model_logprobs`]).
    pub model_logprob: f32,
    /// The [`Job::top_logprobs`] most likely tokens and their T = 1
    /// log-probs, most likely first.
    pub top: Vec<(u32, f32)>,
    /// Set on the sample's last token.
    pub finish: Option<FinishReason>,
    /// The weight version that sampled it.
    pub weight_version: String,
}

/// Receives each token of a job as it is sampled; returning false cancels
/// that sample (a client that went away), which frees its row at the
/// next step and ends it as [`FinishReason::Stop`].
pub type TokenSink = Arc<dyn Fn(TokenEvent) -> bool + Send + Sync>;

/// Per token of a generation: its alternatives and their log-probs.
pub type TopLogprobs = Vec<Vec<(u32, f32)>>;

/// A weight update waiting for the running rows: the weights, their
/// version, and what to call with the outcome once they were applied.
type PendingWeights = (Box<dyn TensorSource>, String, Box<dyn FnOnce(crate::model::Result<()>) + Send>);

/// The model an [`Engine`] decodes with: a model opened on either compute
/// backend ([`crate::backend::open::open`], chosen when the server starts:
/// `r2vpo serve --backend`).
pub use crate::backend::open::Opened as DecodeModel;

/// The cache of a [`DecodeModel`].
pub enum DecodeModelCache {
    /// The candle decoder's.
    Candle(KvCache),
    /// The libtorch decoder's.
    #[cfg(feature = "torch")]
    Torch(crate::backend::torch::TorchKv),
}

/// `$body` on whichever variant `$x` is, bound to `$m`.
macro_rules! each {
    ($x:expr, $m:ident => $body:expr) => {
        match $x {
            DecodeModel::Candle($m) => $body,
            #[cfg(feature = "torch")]
            DecodeModel::Torch($m) => $body,
        }
    };
}

macro_rules! each_cache {
    ($x:expr, $c:ident => $body:expr) => {
        match $x {
            DecodeModelCache::Candle($c) => $body,
            #[cfg(feature = "torch")]
            DecodeModelCache::Torch($c) => $body,
        }
    };
}

impl DecodeModel {
    /// Sets the weights from `source` in place ([`crate::backend::Policy::load`]:
    /// nothing is applied unless every tensor fits).
    pub fn load(&self, source: &dyn TensorSource) -> crate::model::Result<()> {
        each!(self, m => crate::backend::Policy::load(m, source))
    }
}

impl DecodeCache for DecodeModelCache {
    fn batch(&self) -> usize {
        each_cache!(self, c => c.batch())
    }

    fn len(&self) -> usize {
        each_cache!(self, c => DecodeCache::len(c))
    }

    fn select_rows(&mut self, rows: &[usize]) -> crate::model::Result<()> {
        each_cache!(self, c => DecodeCache::select_rows(c, rows))
    }

    fn append_rows(&mut self, other: Self) -> crate::model::Result<()> {
        match (self, other) {
            (DecodeModelCache::Candle(a), DecodeModelCache::Candle(b)) => a.append_rows(b),
            #[cfg(feature = "torch")]
            (DecodeModelCache::Torch(a), DecodeModelCache::Torch(b)) => a.append_rows(b),
            #[cfg(feature = "torch")]
            _ => Err(crate::model::ModelError::Torch("caches of two backends cannot join".into())),
        }
    }

    fn trim_padding(&mut self) -> crate::model::Result<()> {
        each_cache!(self, c => DecodeCache::trim_padding(c))
    }
}

impl Decoder for DecodeModel {
    type Cache = DecodeModelCache;

    fn config(&self) -> &ModelConfig {
        each!(self, m => Decoder::config(m))
    }

    fn input_device(&self) -> &candle_core::Device {
        each!(self, m => m.input_device())
    }

    fn new_cache(&self, batch: usize, tokens: usize) -> DecodeModelCache {
        match self {
            DecodeModel::Candle(m) => DecodeModelCache::Candle(m.new_cache(batch, tokens)),
            #[cfg(feature = "torch")]
            DecodeModel::Torch(m) => DecodeModelCache::Torch(m.new_cache(batch, tokens)),
        }
    }

    fn forward_step(&self, ids: &Tensor, mask: &Tensor, cache: &mut DecodeModelCache) -> crate::model::Result<Tensor> {
        match (self, cache) {
            (DecodeModel::Candle(m), DecodeModelCache::Candle(c)) => Decoder::forward_step(m, ids, mask, c),
            #[cfg(feature = "torch")]
            (DecodeModel::Torch(m), DecodeModelCache::Torch(c)) => Decoder::forward_step(m, ids, mask, c),
            #[cfg(feature = "torch")]
            _ => Err(crate::model::ModelError::Torch("a cache of the other backend".into())),
        }
    }

    fn score_logprobs(&self, ids: &Tensor, mask: &Tensor, targets: &Tensor) -> crate::model::Result<Tensor> {
        each!(self, m => Decoder::score_logprobs(m, ids, mask, targets))
    }

    fn wants_pool(&self) -> bool {
        each!(self, m => m.wants_pool())
    }
}

/// One prompt to continue `seeds.len()` times.
pub struct Job {
    /// Prompt token ids (non-empty, in the vocabulary, fitting the context
    /// with `sampling.max_new_tokens`).
    pub prompt_ids: Vec<u32>,
    /// One seed per sample.
    pub seeds: Vec<u64>,
    /// Temperature, truncation, `max_new_tokens`, stop ids.
    pub sampling: SamplingConfig,
    /// Ends a sample early when it returns true for the tokens so far (stop
    /// strings); the sample then finishes with [`FinishReason::Stop`].
    pub stop_when: Option<StopWhen>,
    /// Keep sampling past the model's EOS (benchmarks).
    pub ignore_eos: bool,
    /// Once every sample is done, replace [`Generation::model_logprobs`]
    /// by one full-sequence scoring pass over prompt + response (what the
    /// learner's `score_logprobs` computes), instead of the values recorded
    /// while decoding token by token. The two differ by f32 rounding of
    /// differently shaped matrix products (≈ 1e-4 on SmolLM2); rescoring
    /// costs one prefill-sized pass per job, run on a scoring thread of its
    /// own so the decode loop is not held up by it.
    pub rescore: bool,
    /// Alternatives to report per sampled token (0 to
    /// [`MAX_TOP_LOGPROBS`]): the most likely tokens under the model's
    /// T = 1 distribution with their log-probs (vLLM's raw mode), in
    /// [`JobOutput::top_logprobs`] and [`TokenEvent::top`].
    pub top_logprobs: usize,
    /// Called with every token as it is sampled (streaming).
    pub on_token: Option<TokenSink>,
}

/// The answer to a job.
#[derive(Clone, Debug)]
pub struct JobOutput {
    /// One generation per seed, in the order of [`Job::seeds`]
    /// ([`Generation::text`] is left empty: the caller owns the tokenizer).
    pub generations: Vec<Generation>,
    /// The weight version that produced every token of every sample.
    pub weight_version: String,
    /// Per generation, per token: [`Job::top_logprobs`] alternatives (empty
    /// lists when none were asked for).
    pub top_logprobs: Vec<TopLogprobs>,
}

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The job is invalid (the message names the field).
    #[error(transparent)]
    Invalid(#[from] SampleError),
    /// Too many jobs are waiting.
    #[error("{0} jobs are already waiting; try again later")]
    Busy(usize),
    /// The engine has stopped (shutdown or a failed model step).
    #[error("the engine has stopped: {0}")]
    Stopped(String),
}

type Reply = Box<dyn FnOnce(Result<JobOutput, EngineError>) + Send>;

enum Msg {
    Submit(Job, Reply),
    Weights(PendingWeights),
    Pause(bool),
    Shutdown,
}

/// Counters a server reports (`/health`, metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Jobs waiting for admission.
    pub waiting: usize,
    /// Rows decoding now.
    pub running: usize,
    /// Whether admission is paused.
    pub paused: bool,
    /// The weight version now loaded.
    pub weight_version: String,
    /// Jobs answered so far.
    pub completed: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
}

/// A handle on the decode loop; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Engine {
    tx: Sender<Msg>,
    stats: Arc<Mutex<EngineStats>>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    limits: Limits,
}

#[derive(Clone)]
struct Limits {
    cfg: EngineConfig,
    vocab: usize,
    context: usize,
    model: ModelConfig,
}

impl Engine {
    /// Starts the loop on its own thread with `model` as weight version
    /// `version`; `eos` ends a sample with [`FinishReason::Eos`], `pad_id`
    /// fills left padding.
    pub fn start(
        model: impl Into<DecodeModel>,
        version: String,
        cfg: EngineConfig,
        eos: Option<u32>,
        pad_id: u32,
    ) -> Engine {
        let model: DecodeModel = model.into();
        let (tx, rx) = mpsc::channel();
        let limits = Limits {
            cfg,
            vocab: model.config().vocab_size,
            context: model.config().max_position_embeddings,
            model: model.config().clone(),
        };
        let stats = Arc::new(Mutex::new(EngineStats { weight_version: version.clone(), ..EngineStats::default() }));
        let st = stats.clone();
        let handle = std::thread::Builder::new()
            .name("r2vpo-engine".into())
            .spawn(move || {
                let mut lp = Loop {
                    model: Arc::new(model),
                    version,
                    cfg,
                    eos,
                    pad_id,
                    stats: st,
                    waiting: VecDeque::new(),
                    jobs: HashMap::new(),
                    next_job: 0,
                    rows: Vec::new(),
                    cache: None,
                    logits: None,
                    prefills: Vec::new(),
                    paused: false,
                    pending: VecDeque::new(),
                    scorer: None,
                };
                lp.run(rx);
            })
            .expect("spawning the engine thread");
        Engine { tx, stats, thread: Arc::new(Mutex::new(Some(handle))), limits }
    }

    /// The model's context length (prompt + new tokens).
    pub fn context(&self) -> usize {
        self.limits.context
    }

    /// The model's vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.limits.vocab
    }

    /// The description of the model being served.
    pub fn model_config(&self) -> &ModelConfig {
        &self.limits.model
    }

    /// The limits the engine was started with.
    pub fn config(&self) -> EngineConfig {
        self.limits.cfg
    }

    /// Checks a job against the model and the limits without submitting it.
    pub fn check(&self, job: &Job) -> Result<(), EngineError> {
        let bad = |field: &str, message: String| Err(SampleError::Config { field: field.into(), message }.into());
        job.sampling.validate()?;
        if job.seeds.is_empty() || job.seeds.len() > self.limits.cfg.max_batch {
            return bad(
                "n",
                format!("{} must be in 1..={} (the server's max batch)", job.seeds.len(), self.limits.cfg.max_batch),
            );
        }
        if job.sampling.max_new_tokens == 0 {
            return bad("max_tokens", "must be at least 1".into());
        }
        check_prompt(0, &job.prompt_ids, job.sampling.max_new_tokens, self.limits.vocab, self.limits.context)?;
        Ok(())
    }

    /// Queues `job`; `reply` is called once, from the engine thread, with
    /// its output or error.
    pub fn submit(&self, job: Job, reply: impl FnOnce(Result<JobOutput, EngineError>) + Send + 'static) {
        if let Err(e) = self.check(&job) {
            return reply(Err(e));
        }
        let waiting = self.stats.lock().expect("stats").waiting;
        if waiting >= self.limits.cfg.max_waiting {
            return reply(Err(EngineError::Busy(waiting)));
        }
        self.stats.lock().expect("stats").waiting += 1;
        let reply: Reply = Box::new(reply);
        if let Err(mpsc::SendError(Msg::Submit(_, reply))) = self.tx.send(Msg::Submit(job, reply)) {
            reply(Err(EngineError::Stopped("shut down".into())));
        }
    }

    /// [`Engine::submit`] that blocks until the answer.
    pub fn run_job(&self, job: Job) -> Result<JobOutput, EngineError> {
        let (tx, rx) = mpsc::channel();
        self.submit(job, move |r| {
            let _ = tx.send(r);
        });
        rx.recv().unwrap_or_else(|_| Err(EngineError::Stopped("no answer".into())))
    }

    /// Sets the weights from `source` in place, tensor by tensor, once the
    /// running rows (and rescoring jobs) have finished; no new job is
    /// admitted meanwhile, so no sample mixes two versions and the model
    /// never exists twice in memory. `done` gets the outcome: a tensor that
    /// is missing or of another shape is refused before anything is
    /// applied (the old weights and version stay); a read that fails after
    /// that check (the files changed underneath) leaves a mix, served as
    /// version `"{version}-incomplete"` until the next update.
    pub fn update_weights(
        &self,
        source: Box<dyn TensorSource>,
        version: String,
        done: impl FnOnce(crate::model::Result<()>) + Send + 'static,
    ) {
        let _ = self.tx.send(Msg::Weights((source, version, Box::new(done))));
    }

    /// Stops (`true`) or resumes (`false`) admitting jobs; running rows
    /// finish either way, and jobs that arrive meanwhile wait.
    pub fn pause(&self, paused: bool) {
        let _ = self.tx.send(Msg::Pause(paused));
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().expect("stats").clone()
    }

    /// Finishes the running rows, answers waiting jobs with
    /// [`EngineError::Stopped`] and joins the thread.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Msg::Shutdown);
        if let Some(h) = self.thread.lock().expect("thread").take() {
            let _ = h.join();
        }
    }
}

/// One sample being decoded.
struct Row {
    job: u64,
    index: usize,
    rng: ChaCha8Rng,
    sampling: Arc<SamplingConfig>,
    stop_when: Option<StopWhen>,
    eos: Option<u32>,
    gen: Generation,
    done: bool,
    /// [`Job::top_logprobs`].
    top_k: usize,
    /// The alternatives of each token so far.
    top: TopLogprobs,
    on_token: Option<TokenSink>,
}

/// A finished job whose log-probs are rescored ([`Job::rescore`]) on the
/// scoring thread, so the decode loop goes on meanwhile. It holds the model
/// that generated it (a clone shares the weights' storage), which keeps the
/// scores right when new weights arrive before it is scored.
struct ScoreJob {
    model: Arc<DecodeModel>,
    prompt: Vec<u32>,
    generations: Vec<Generation>,
    top: Vec<TopLogprobs>,
    version: String,
    reply: Reply,
}

struct JobState {
    outputs: Vec<Option<(Generation, TopLogprobs)>>,
    left: usize,
    reply: Reply,
    /// The prompt, kept for [`Job::rescore`].
    rescore: Option<Vec<u32>>,
}

/// Admitted jobs whose distinct prompts are being prefilled.
struct Prefill {
    /// The samples, joining the batch once the prefill is done.
    rows: Vec<Row>,
    /// Left-padded distinct prompts `(U, W)` and their mask.
    ids: Tensor,
    mask: Tensor,
    /// Row → distinct prompt.
    of_row: Vec<u32>,
    cache: DecodeModelCache,
    /// Columns prefilled so far.
    done: usize,
}

struct Loop {
    model: Arc<DecodeModel>,
    version: String,
    cfg: EngineConfig,
    eos: Option<u32>,
    pad_id: u32,
    stats: Arc<Mutex<EngineStats>>,
    waiting: VecDeque<(Job, Reply)>,
    jobs: HashMap<u64, JobState>,
    next_job: u64,
    rows: Vec<Row>,
    cache: Option<DecodeModelCache>,
    /// Logits `(rows, V)` of the next token of every active row.
    logits: Option<Tensor>,
    /// Admitted jobs still being prefilled, chunk by chunk (each group of
    /// jobs admitted together is one entry).
    prefills: Vec<Prefill>,
    paused: bool,
    pending: VecDeque<PendingWeights>,
    /// The scoring thread, started by the first [`Job::rescore`] job.
    scorer: Option<(Sender<ScoreJob>, JoinHandle<()>)>,
}

impl Loop {
    fn handle(&mut self, m: Msg) -> bool {
        match m {
            Msg::Submit(job, reply) => self.waiting.push_back((job, reply)),
            Msg::Weights(w) => self.pending.push_back(w),
            Msg::Pause(p) => self.paused = p,
            Msg::Shutdown => return false,
        }
        true
    }

    fn run(&mut self, rx: Receiver<Msg>) {
        let mut open = true;
        while open || !self.rows.is_empty() || !self.prefills.is_empty() {
            // Block only when there is nothing to decode.
            let idle = self.rows.is_empty()
                && self.prefills.is_empty()
                && (self.waiting.is_empty() || self.paused)
                && self.pending.is_empty();
            if open && idle {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(m) => open = self.handle(m),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            }
            while open {
                match rx.try_recv() {
                    Ok(m) => open = self.handle(m),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => open = false,
                }
            }
            if self.rows.is_empty() && self.prefills.is_empty() && !self.pending.is_empty() {
                // Rescoring jobs hold the model too: the weights change
                // only when they have finished with the old ones.
                if Arc::strong_count(&self.model) > 1 {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                if let Some((source, version, done)) = self.pending.pop_front() {
                    let expected = crate::model::expected_params(self.model.config());
                    let applied = crate::backend::check_fits(source.as_ref(), &expected).and_then(|()| {
                        self.model.load(source.as_ref()).inspect_err(|_| {
                            // Every tensor fitted, so a read failed part-way
                            // (the files changed underneath): the weights are
                            // a mix, and the version says so.
                            self.version = format!("{version}-incomplete");
                            self.stats.lock().expect("stats").weight_version = self.version.clone();
                        })
                    });
                    if applied.is_ok() {
                        self.version = version;
                        self.stats.lock().expect("stats").weight_version = self.version.clone();
                    }
                    done(applied);
                    continue;
                }
            }
            // On a pool thread, the others kept awake (see `on_pool_awake`),
            // per step so that no pool thread is held (or spins) while the
            // loop waits for requests.
            let stepped =
                if self.model.wants_pool() { crate::pool::on_pool_awake(|| self.step(open)) } else { self.step(open) };
            if let Err(e) = stepped {
                self.fail_all(&format!("model step failed: {e}"));
            }
            self.publish();
        }
        // Shut down: whatever still waits is refused; jobs being rescored
        // are answered first.
        for (_, reply) in self.waiting.drain(..) {
            reply(Err(EngineError::Stopped("the server is shutting down".into())));
        }
        if let Some((tx, handle)) = self.scorer.take() {
            drop(tx);
            let _ = handle.join();
        }
        self.publish();
    }

    /// Hands a finished job to the scoring thread, starting it if needed.
    fn score(&mut self, job: ScoreJob) {
        let (tx, _) = self.scorer.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<ScoreJob>();
            let stats = self.stats.clone();
            let pad_id = self.pad_id;
            let handle = std::thread::Builder::new()
                .name("r2vpo-scorer".into())
                .spawn(move || {
                    for mut j in rx {
                        match rescore(&j.model, &j.prompt, &mut j.generations, pad_id) {
                            Ok(()) => {
                                (j.reply)(Ok(JobOutput {
                                    generations: j.generations,
                                    weight_version: j.version,
                                    top_logprobs: j.top,
                                }));
                                stats.lock().expect("stats").completed += 1;
                            }
                            Err(e) => (j.reply)(Err(EngineError::Invalid(e))),
                        }
                    }
                })
                .expect("spawning the scoring thread");
            (tx, handle)
        });
        if let Err(mpsc::SendError(j)) = tx.send(job) {
            (j.reply)(Err(EngineError::Stopped("the scoring thread has stopped".into())));
        }
    }

    fn publish(&self) {
        let mut s = self.stats.lock().expect("stats");
        s.waiting = self.waiting.len();
        s.running = self.rows.len();
        s.paused = self.paused;
    }

    fn fail_all(&mut self, why: &str) {
        self.rows.clear();
        self.prefills.clear();
        self.cache = None;
        self.logits = None;
        for (_, st) in self.jobs.drain() {
            (st.reply)(Err(EngineError::Stopped(why.to_string())));
        }
    }

    /// Admits what fits, samples one token for every row, retires finished
    /// rows, and runs the next forward step.
    fn step(&mut self, open: bool) -> Result<(), EngineError> {
        if open && !self.paused && self.pending.is_empty() {
            self.admit()?;
        }
        // Every prompt being prefilled advances one chunk per step, so a
        // short prompt admitted behind a huge one is not held up by it.
        for p in std::mem::take(&mut self.prefills) {
            self.prefill_chunk(p)?;
        }
        let Some(logits) = self.logits.take() else { return Ok(()) };
        let l = logits.to_dtype(DType::F32).map_err(SampleError::from)?.to_vec2::<f32>().map_err(SampleError::from)?;
        let version = self.version.as_str();
        self.rows.par_iter_mut().zip(l.par_iter()).for_each(|(row, l)| {
            let s = sample_token(l, &row.sampling, &mut row.rng);
            if row.top_k > 0 {
                // log-softmax's normaliser, from the sampled token's T = 1 log-prob.
                let lse = f64::from(l[s.token as usize]) - s.model_logprob;
                row.top.push(top_logprobs(l, row.top_k, lse));
            }
            let g = &mut row.gen;
            g.token_ids.push(s.token);
            g.logprobs.push(s.logprob as f32);
            g.model_logprobs.push(s.model_logprob as f32);
            g.entropy.push(s.entropy as f32);
            let finish = if Some(s.token) == row.eos {
                Some(FinishReason::Eos)
            } else if row.sampling.stop_token_ids.contains(&s.token)
                || row.stop_when.as_ref().is_some_and(|f| f(&g.token_ids))
            {
                Some(FinishReason::Stop)
            } else if g.token_ids.len() >= row.sampling.max_new_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(f) = finish {
                g.finish_reason = f;
                row.done = true;
            }
            if let Some(sink) = &row.on_token {
                let event = TokenEvent {
                    sample: row.index,
                    token: s.token,
                    logprob: s.logprob as f32,
                    model_logprob: s.model_logprob as f32,
                    top: row.top.last().cloned().unwrap_or_default(),
                    finish: row.done.then_some(g.finish_reason),
                    weight_version: version.to_string(),
                };
                if !sink(event) && !row.done {
                    // Nobody reads this sample any more: free its row.
                    g.finish_reason = FinishReason::Stop;
                    row.done = true;
                }
            }
        });
        let tokens = self.rows.len() as u64;
        self.stats.lock().expect("stats").generated_tokens += tokens;
        let keep: Vec<usize> = (0..self.rows.len()).filter(|&j| !self.rows[j].done).collect();
        if keep.len() != self.rows.len() {
            let rows = std::mem::take(&mut self.rows);
            let mut kept = Vec::with_capacity(keep.len());
            for row in rows {
                if row.done {
                    self.finish(row);
                } else {
                    kept.push(row);
                }
            }
            self.rows = kept;
            match self.cache.as_mut() {
                Some(c) if !keep.is_empty() => {
                    c.select_rows(&keep).map_err(SampleError::from)?;
                    c.trim_padding().map_err(SampleError::from)?;
                }
                _ => self.cache = None,
            }
        }
        if self.rows.is_empty() {
            self.cache = None;
            return Ok(());
        }
        let next: Vec<u32> = self.rows.iter().map(|r| *r.gen.token_ids.last().expect("sampled")).collect();
        let n = next.len();
        let dev = self.model.input_device().clone();
        let ids = Tensor::from_vec(next, (n, 1), &dev).map_err(SampleError::from)?;
        let mask = Tensor::ones((n, 1), DType::U32, &dev).map_err(SampleError::from)?;
        let cache = self.cache.as_mut().expect("a cache while rows are active");
        self.logits = Some(self.model.forward_step(&ids, &mask, cache).map_err(SampleError::from)?);
        Ok(())
    }

    fn finish(&mut self, row: Row) {
        let Some(st) = self.jobs.get_mut(&row.job) else { return };
        st.outputs[row.index] = Some((row.gen, row.top));
        st.left -= 1;
        if st.left == 0 {
            let st = self.jobs.remove(&row.job).expect("job");
            let (generations, top): (Vec<Generation>, Vec<_>) =
                st.outputs.into_iter().map(|g| g.expect("every sample finished")).unzip();
            if let Some(prompt) = st.rescore {
                let model = self.model.clone();
                let version = self.version.clone();
                self.score(ScoreJob { model, prompt, generations, top, version, reply: st.reply });
                return;
            }
            (st.reply)(Ok(JobOutput { generations, weight_version: self.version.clone(), top_logprobs: top }));
            self.stats.lock().expect("stats").completed += 1;
        }
    }

    /// Moves waiting jobs into the prefill queue while rows are free.
    ///
    /// First come, first served, with backfilling (EASY backfilling, as
    /// batch schedulers of clusters do it): the first job that does not fit
    /// holds a reservation — the step by which enough running rows are sure
    /// to have finished, from their `max_new_tokens` budgets — and a later
    /// job may start before it only if it fits now and cannot delay that
    /// reservation: it is sure to finish by then, or it uses rows the
    /// reserved job will not need. So one job with a large `n` neither
    /// blocks the small ones behind it nor is starved by them.
    fn admit(&mut self) -> Result<(), EngineError> {
        let chunk = self.cfg.prefill_chunk.max(1);
        let mut admitted: Vec<(u64, Job)> = Vec::new();
        // Upper bounds on the steps until each busy row is free.
        let mut busy: Vec<usize> =
            self.rows.iter().map(|r| r.sampling.max_new_tokens.saturating_sub(r.gen.token_ids.len())).collect();
        for p in &self.prefills {
            let width = p.ids.dim(1).map_err(SampleError::from)?;
            let chunks = (width - p.done).div_ceil(chunk);
            busy.extend(p.rows.iter().map(|r| chunks + r.sampling.max_new_tokens));
        }
        let mut free = self.cfg.max_batch.saturating_sub(busy.len());
        // (steps until the reserved job can start, rows to spare then)
        let mut reservation: Option<(usize, usize)> = None;
        let mut i = 0;
        while i < self.waiting.len() {
            let job = &self.waiting[i].0;
            let n = job.seeds.len();
            let steps = job.prompt_ids.len().div_ceil(chunk) + job.sampling.max_new_tokens;
            let start = n <= free
                && match reservation {
                    None => true,
                    Some((shadow, spare)) => steps <= shadow || n <= spare,
                };
            if !start {
                if reservation.is_none() {
                    busy.sort_unstable();
                    let (mut avail, mut shadow) = (free, 0);
                    for &b in &busy {
                        if avail >= n {
                            break;
                        }
                        avail += 1;
                        shadow = b;
                    }
                    reservation = Some((shadow, avail.saturating_sub(n)));
                }
                i += 1;
                continue;
            }
            if let Some((shadow, spare)) = reservation.as_mut() {
                if steps > *shadow {
                    *spare -= n;
                }
            }
            let (job, reply) = self.waiting.remove(i).expect("index in range");
            free -= n;
            busy.extend(std::iter::repeat_n(steps, n));
            let id = self.next_job;
            self.next_job += 1;
            let rescore = job.rescore.then(|| job.prompt_ids.clone());
            self.jobs.insert(id, JobState { outputs: vec![None; n], left: n, reply, rescore });
            admitted.push((id, job));
        }
        // Prompts that fit one chunk are prefilled together; each longer
        // one on its own, so a short prompt never waits for a long one's
        // chunks.
        let (short, long): (Vec<_>, Vec<_>) = admitted.into_iter().partition(|(_, j)| j.prompt_ids.len() <= chunk);
        if !short.is_empty() {
            self.start_prefill(short)?;
        }
        for job in long {
            self.start_prefill(vec![job])?;
        }
        Ok(())
    }

    /// Queues the prefill of `jobs`: their distinct prompts left-padded
    /// into one batch, one row per sample.
    fn start_prefill(&mut self, jobs: Vec<(u64, Job)>) -> Result<(), EngineError> {
        let (uniq, of_job) = distinct_prompts(jobs.iter().map(|(_, j)| j.prompt_ids.as_slice()));
        let mut of_row: Vec<u32> = Vec::new();
        let mut new_rows: Vec<Row> = Vec::new();
        for ((id, job), u) in jobs.into_iter().zip(of_job) {
            let sampling = Arc::new(job.sampling);
            for (index, &seed) in job.seeds.iter().enumerate() {
                of_row.push(u as u32);
                new_rows.push(Row {
                    job: id,
                    index,
                    rng: ChaCha8Rng::seed_from_u64(seed),
                    sampling: sampling.clone(),
                    stop_when: job.stop_when.clone(),
                    eos: if job.ignore_eos { None } else { self.eos },
                    gen: Generation {
                        prompt_len: job.prompt_ids.len(),
                        token_ids: Vec::new(),
                        text: String::new(),
                        finish_reason: FinishReason::Length,
                        logprobs: Vec::new(),
                        model_logprobs: Vec::new(),
                        entropy: Vec::new(),
                    },
                    done: false,
                    top_k: job.top_logprobs.min(MAX_TOP_LOGPROBS),
                    top: Vec::new(),
                    on_token: job.on_token.clone(),
                });
            }
        }
        let (ids, mask) = PaddedBatch::left_pad(&uniq, self.pad_id)
            .to_tensors(self.model.input_device())
            .map_err(SampleError::from)?;
        let cache = self.model.new_cache(uniq.len(), 0);
        self.prefills.push(Prefill { rows: new_rows, ids, mask, of_row, cache, done: 0 });
        Ok(())
    }

    /// Prefills the next `prefill_chunk` columns of the admitted prompts;
    /// after the last one their rows (with the first token's logits) join
    /// the running batch.
    fn prefill_chunk(&mut self, mut p: Prefill) -> Result<(), EngineError> {
        let width = p.ids.dim(1).map_err(SampleError::from)?;
        let n = self.cfg.prefill_chunk.max(1).min(width - p.done);
        let ids = p.ids.narrow(1, p.done, n).map_err(SampleError::from)?;
        let mask = p.mask.narrow(1, p.done, n).map_err(SampleError::from)?;
        let logits = self.model.forward_step(&ids, &mask, &mut p.cache).map_err(SampleError::from)?;
        p.done += n;
        if p.done < width {
            self.prefills.push(p);
            return Ok(());
        }
        let dev = logits.device().clone();
        if p.cache.batch() < p.of_row.len() {
            let rows: Vec<usize> = p.of_row.iter().map(|&u| u as usize).collect();
            p.cache.select_rows(&rows).map_err(SampleError::from)?;
        }
        let idx = Tensor::new(p.of_row.as_slice(), &dev).map_err(SampleError::from)?;
        let new_logits = logits.index_select(&idx, 0).map_err(SampleError::from)?;
        let logits = match self.logits.take() {
            Some(old) => Tensor::cat(&[&old, &new_logits], 0).map_err(SampleError::from)?,
            None => new_logits,
        };
        match self.cache.as_mut() {
            Some(c) => c.append_rows(p.cache).map_err(SampleError::from)?,
            None => self.cache = Some(p.cache),
        }
        self.logits = Some(logits);
        self.rows.extend(p.rows);
        Ok(())
    }
}

/// The `k` largest logits' tokens (ties to the lower id) with their
/// log-probs `l − lse`, most likely first.
fn top_logprobs(logits: &[f32], k: usize, lse: f64) -> Vec<(u32, f32)> {
    let desc = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, desc);
        idx.truncate(k);
    }
    idx.sort_unstable_by(desc);
    idx.into_iter().map(|t| (t as u32, (f64::from(logits[t]) - lse) as f32)).collect()
}

/// Replaces each generation's `model_logprobs` with one full-sequence,
/// left-padded `score_logprobs` pass over prompt + response.
fn rescore(model: &DecodeModel, prompt: &[u32], gens: &mut [Generation], pad_id: u32) -> Result<(), SampleError> {
    let seqs: Vec<Vec<u32>> = gens.iter().map(|g| [prompt, &g.token_ids[..]].concat()).collect();
    let b = PaddedBatch::left_pad(&seqs, pad_id);
    let (ids, mask) = b.to_tensors(model.input_device())?;
    let w = b.width();
    if w < 2 {
        return Ok(());
    }
    // targets[t] = ids[t + 1]; the last column is never read.
    let targets = Tensor::cat(&[ids.narrow(1, 1, w - 1)?, ids.narrow(1, w - 1, 1)?], 1)?;
    let lp = model.score_logprobs(&ids, &mask, &targets)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    for (g, row) in gens.iter_mut().zip(&lp) {
        let n = g.token_ids.len();
        // Response token k sits at column w − n + k and is predicted at the column before it.
        g.model_logprobs = (0..n).map(|k| row[w - n + k - 1]).collect();
    }
    Ok(())
}
