//! The `r2vpo llm train` configuration (`configs/llm/*.toml`).

use serde::{Deserialize, Serialize};

use r2vpo::advantage::GroupNormConfig;
use r2vpo::dual::DualConfig;
use r2vpo::objective::ObjectiveConfig;
use r2vpo::replay::ReplayConfig;

use crate::data::{DataConfig, OverlongPrompts, PromptTemplate};
use crate::eval::EvalConfig;
use crate::sample::SamplingConfig;
use r2vpo_verify::VerifyConfig;

use super::{TrainError, TrainResult};

/// The embedded default model, relative to the repository root.
pub const EMBEDDED_MODEL: &str = ".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The optimizer's settings, defined with the optimizer.
pub use crate::backend::OptimConfig;
pub use r2vpo::algo::Mode;

/// Which log-probabilities become log π_off, the ratio's denominator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BehaviourLogprobs {
    /// The untruncated temperature-1 model log-probs recorded while sampling
    /// (equal to the sampling distribution at the paper's training settings
    /// T = 1, top-p = 1, top-k = −1). No extra pass.
    Model,
    /// The exact sampling distribution (temperature, top-k, top-p
    /// truncation): the true behaviour policy when sampling is truncated.
    Sampled,
    /// Recomputed by a full-sequence scoring pass right after the rollout
    /// (what verl does): costs one forward pass, makes ρ = 1 exactly before
    /// the first update instead of up to incremental-decoding rounding.
    Recompute,
}

/// Which [`crate::rollout::RolloutSource`] samples the rollouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutBackend {
    /// In-process sampling with the learner's model (the default).
    Local,
    /// OpenAI-compatible completion servers (`r2vpo serve`, vLLM, SGLang)
    /// over HTTP, with weight pushes through `update_weights_from_disk`.
    Http,
}

/// Which [`crate::queue::ExperienceQueue`] carries groups from the
/// asynchronous actors to the learner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueBackend {
    /// In-process ([`crate::queue::MemoryQueue`]; the embedded default).
    Memory,
    /// A Redis Stream (`r2vpo_queue::RedisQueue`), for actors on other
    /// machines and a queue that outlives the learner.
    Redis,
}

/// The `[queue]` table: where asynchronous actors put their groups.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// `memory` or `redis`.
    pub backend: QueueBackend,
    /// Redis URL (`redis://[:password@]host:port/db`; `rediss://` for TLS,
    /// with `#insecure` at the end to skip the certificate check).
    pub url: String,
    /// CA certificates (PEM) that sign the server's TLS certificate, for a
    /// `rediss://` Redis whose certificate the system's roots do not know
    /// (a self-signed one); none means the system's roots.
    pub tls_ca: Option<String>,
    /// Stream key; empty means `r2vpo:<run folder name>-<8 hex digits of
    /// its absolute path's hash>`, so runs whose folders share a name get
    /// streams of their own. A fresh run refuses a key that another run
    /// which has not closed owns.
    pub key: String,
    /// Seconds an actor may hold a batch before it is handed to another
    /// actor (a dead actor's batch is produced once, by someone else).
    pub lease_s: f64,
    /// Seconds any one Redis call (and opening a connection) may take
    /// before it counts as an outage: a hung server (stopped, partitioned)
    /// is then retried with back-off and reported, and SIGINT/SIGTERM stop
    /// the run within about this long plus a checkpoint. Larger than the
    /// slowest legitimate call (reading `prompts_per_iter` groups).
    pub timeout_s: f64,
    /// Where `llm learn` writes the weight versions actor processes load
    /// (default `RUN/actor-weights`); every actor must be able to read it.
    pub weights_dir: Option<String>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            backend: QueueBackend::Memory,
            url: "redis://127.0.0.1:6379/0".into(),
            tls_ca: None,
            key: String::new(),
            lease_s: 600.0,
            timeout_s: 10.0,
            weights_dir: None,
        }
    }
}

/// The `[actors]` table: the asynchronous actor–learner (`llm train
/// --async`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ActorsConfig {
    /// Sample with actor threads that run ahead of the learner (`--async`)
    /// instead of in turn with it.
    #[serde(rename = "async")]
    pub asynchronous: bool,
    /// Actor threads.
    pub count: usize,
    /// Largest weight-version lag a fresh group may have when the learner
    /// takes it: actors wait for weights no older than `batch −
    /// max_staleness`, and the learner drops (and counts) older groups.
    /// 0 makes the run equal to the synchronous one (prime-rl's
    /// `max_async_level`, AReaL's `max_head_offpolicyness`).
    pub max_staleness: u64,
}

impl Default for ActorsConfig {
    fn default() -> Self {
        Self { asynchronous: false, count: 1, max_staleness: 1 }
    }
}

/// How new weights reach the rollout servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightPush {
    /// SGLang's `POST /update_weights_from_disk {model_path, weight_version}`
    /// (also `r2vpo serve`'s).
    UpdateWeightsFromDisk,
    /// vLLM's development-mode reload (`VLLM_SERVER_DEV_MODE=1`):
    /// `POST /collective_rpc {"method": "reload_weights", "kwargs":
    /// {"weights_path", "is_checkpoint_format": true}}`, then
    /// `POST /reset_prefix_cache`.
    VllmReload,
    /// No push: the servers keep their initial weights (evaluation, or a
    /// server without a weight-update endpoint such as llama.cpp); the
    /// version lag then grows every iteration and is reported as such.
    None,
}

/// The name under which a vLLM server serves the adapter a LoRA learner
/// pushes (`rollout.push_adapter` with `weight_push = "vllm_reload"`).
pub const VLLM_ADAPTER_NAME: &str = "r2vpo-adapter";

/// The dtype of pushed weight folders (`rollout.push_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PushDtype {
    /// 4 bytes a weight: exact for an f32 server.
    F32,
    /// 2 bytes a weight: what a bf16 server holds after loading.
    Bf16,
}

/// The `[rollout]` table: where samples come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// `local` or `http`.
    pub backend: RolloutBackend,
    /// Base URLs of the servers (`http://127.0.0.1:8000`); groups are spread
    /// over them and fail over between them.
    pub urls: Vec<String>,
    /// Bearer token sent to every server (`--api-key` of `r2vpo serve`).
    pub api_key: Option<String>,
    /// Model name sent in requests (servers that serve one model accept
    /// any; vLLM wants its `--served-model-name`).
    pub model: String,
    /// What the servers' per-token log-probs mean: `raw` (log softmax of
    /// the untruncated T = 1 logits; vLLM's default `raw_logprobs`) or
    /// `processed` (after temperature and top-k/top-p; vLLM
    /// `--logprobs-mode processed_logprobs`). `r2vpo serve` states its mode
    /// in every answer and the client refuses a mismatch.
    pub logprobs_mode: crate::rollout::LogprobsMode,
    /// Seconds to wait for one completion request.
    pub timeout_s: f64,
    /// Seconds to wait for a connection.
    pub connect_timeout_s: f64,
    /// Tries per request beyond the first, each on the next live server.
    pub retries: usize,
    /// First back-off between tries in seconds (doubled per try).
    pub backoff_s: f64,
    /// Consecutive failures after which a server is left out for the rest
    /// of the rollout.
    pub max_failures: usize,
    /// Requests in flight per server.
    pub max_in_flight: usize,
    /// Learner iterations between weight pushes (1 = every iteration,
    /// on-policy; k > 1 lets rollouts lag up to k − 1 versions). The
    /// in-process sampler is always current.
    pub sync_every: usize,
    /// How weights are pushed: `update_weights_from_disk` (SGLang,
    /// `r2vpo serve`), `vllm_reload` or `none`.
    pub weight_push: WeightPush,
    /// With `[model.lora]`, push the adapter (a PEFT folder: megabytes)
    /// instead of the merged model, onto the base the servers started
    /// with, which must be the learner's base: `r2vpo serve` folds it into
    /// that base (`update_weights_from_disk`); vLLM hot-loads it in place
    /// as the adapter [`VLLM_ADAPTER_NAME`] (`vllm_reload`: `POST
    /// /v1/load_lora_adapter` with `load_inplace`, on a server started with
    /// `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), and
    /// requests name that adapter as their model.
    pub push_adapter: bool,
    /// The dtype of pushed weight folders: `f32` (the default), or `bf16`
    /// for servers that serve bf16 (half the bytes to write and read per
    /// push; the server would round f32 weights to bf16 on load anyway).
    pub push_dtype: PushDtype,
    /// Folder the pushed weights are written to (default `RUN/weights`);
    /// the servers must be able to read it (same machine or a shared file
    /// system).
    pub weights_dir: Option<String>,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            backend: RolloutBackend::Local,
            urls: Vec::new(),
            api_key: None,
            model: "default".into(),
            logprobs_mode: crate::rollout::LogprobsMode::Raw,
            timeout_s: 600.0,
            connect_timeout_s: 5.0,
            retries: 3,
            backoff_s: 0.5,
            max_failures: 3,
            max_in_flight: 4,
            sync_every: 1,
            weight_push: WeightPush::UpdateWeightsFromDisk,
            push_adapter: false,
            push_dtype: PushDtype::F32,
            weights_dir: None,
        }
    }
}

impl RolloutConfig {
    /// Checks the table, naming the first bad field.
    pub fn validate(&self) -> TrainResult<()> {
        positive_seconds(&[
            ("rollout.timeout_s", self.timeout_s),
            ("rollout.connect_timeout_s", self.connect_timeout_s),
        ])?;
        if !(self.backoff_s.is_finite() && self.backoff_s >= 0.0) {
            return Err(bad("rollout.backoff_s", format!("must be >= 0, got {}", self.backoff_s)));
        }
        for (k, v) in [
            ("rollout.sync_every", self.sync_every),
            ("rollout.max_in_flight", self.max_in_flight),
            ("rollout.max_failures", self.max_failures),
        ] {
            if v == 0 {
                return Err(bad(k, "must be at least 1"));
            }
        }
        if self.backend == RolloutBackend::Http {
            if self.urls.is_empty() {
                return Err(bad("rollout.urls", "backend = \"http\" needs at least one server URL"));
            }
            for u in &self.urls {
                if !u.starts_with("http://") {
                    return Err(bad(
                        "rollout.urls",
                        format!("`{u}` must start with http:// (TLS is not built in; put servers behind a tunnel)"),
                    ));
                }
            }
            if self.logprobs_mode == crate::rollout::LogprobsMode::Both {
                return Err(bad("rollout.logprobs_mode", "must be `raw` or `processed` for a server"));
            }
        }
        Ok(())
    }
}

/// Where the policy's weights come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSource {
    /// A GGUF file or a Hugging Face folder (default: the embedded SmolLM2).
    pub path: String,
    /// Tokenizer (and chat template) source; default: `path`.
    pub tokenizer: Option<String>,
    /// Testing only: ignore `path`'s weights and build a random model of
    /// this shape with the tokenizer's vocabulary (Llama layout).
    pub random: Option<RandomModel>,
    /// The compute backend that trains (and scores) the policy: `candle`
    /// (the default, on this project's CPU kernels) or `torch` (libtorch
    /// through tch-rs, on the CPU or a CUDA GPU; a binary built by `make
    /// build-torch` or `make build-gpu`). Both read the same models and
    /// write the same checkpoints ([`crate::backend`]).
    pub backend: BackendKind,
    /// Where the policy (and the reference) lives, samples and trains:
    /// `cpu`, `cuda` or `cuda:N`. With `backend = "candle"`, CUDA needs a
    /// binary built with candle's CUDA backend (the `cuda` feature); the
    /// model's fused CPU kernels give way to their differentiable
    /// composites there (`model::ops`). With `backend = "torch"` the
    /// learner lives and samples there.
    pub device: String,
    /// The dtype forwards and backwards compute in: `f32`, or `bf16` for
    /// mixed precision (weights, gradients and AdamW moments stay f32; each
    /// forward casts the weights, logits are cast back to f32;
    /// [`crate::backend::candle::Transformer::set_compute_dtype`]). Sampling and
    /// scoring compute in it too, so behaviour and learner log-probs agree.
    pub compute_dtype: ComputeDtype,
    /// `[model.lora]`: train low-rank adapters on the frozen base instead
    /// of every weight ([`crate::model::lora`]). Checkpoints then hold the
    /// adapter in PEFT's layout, `export` writes one, `llm merge` folds it
    /// into the base. Both backends train them; the torch backend holds
    /// the frozen base in the compute dtype only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

pub use crate::model::LoraConfig;

pub use crate::backend::{BackendKind, ComputeDtype};

impl Default for ModelSource {
    fn default() -> Self {
        Self {
            path: EMBEDDED_MODEL.into(),
            tokenizer: None,
            random: None,
            backend: BackendKind::Candle,
            device: "cpu".into(),
            compute_dtype: ComputeDtype::F32,
            lora: None,
        }
    }
}

/// Shape of a random test model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomModel {
    /// A Hugging Face `config.json` to take the whole shape from instead
    /// (architecture, sizes, head width, q/k norms, RoPE): e.g.
    /// `configs/shapes/qwen3-1.7b.json`. The vocabulary is the tokenizer's,
    /// so every sampled id decodes. `hidden` … `kv_heads` are then left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
    /// Hidden size (without `shape`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hidden: usize,
    /// MLP size (without `shape`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub intermediate: usize,
    /// Decoder layers (without `shape`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub layers: usize,
    /// Attention heads (without `shape`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub heads: usize,
    /// Key/value heads (without `shape`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv_heads: usize,
    /// Weight seed.
    pub seed: u64,
    /// Std of the uniform weight init (0.02 is Hugging Face's; larger gives
    /// peaked, more "trained-looking" next-token distributions).
    #[serde(default = "default_init_std")]
    pub init_std: f64,
}

/// Sizes left out because `shape` gives them are not written back.
fn is_zero(v: &usize) -> bool {
    *v == 0
}

fn default_init_std() -> f64 {
    0.02
}

impl ModelSource {
    /// A random 2-layer model (hidden 32, MLP 64, 4 heads, 2 KV heads,
    /// weights of std 0.5 from `seed`) on the tokenizer and chat template of
    /// `path`: a whole training loop in seconds, for tests and smoke runs.
    pub fn tiny_random(path: impl Into<String>, seed: u64) -> ModelSource {
        ModelSource {
            path: path.into(),
            tokenizer: None,
            random: Some(RandomModel {
                shape: None,
                hidden: 32,
                intermediate: 64,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                seed,
                init_std: 0.5,
            }),
            backend: BackendKind::Candle,
            device: "cpu".into(),
            compute_dtype: ComputeDtype::F32,
            lora: None,
        }
    }
}

/// Optional KL penalty to a frozen copy of the initial policy (off when
/// `coef = 0`, as in the paper).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RefKlConfig {
    /// Weight of the KL term in the loss.
    pub coef: f64,
    /// Estimator of KL(π_θ‖π_ref) per token: `k1`, `k2` or `k3` (Schulman's).
    pub estimator: r2vpo::objective::KlEstimator,
}

impl Default for RefKlConfig {
    fn default() -> Self {
        Self { coef: 0.0, estimator: r2vpo::objective::KlEstimator::K3 }
    }
}

/// `[dist]`: how a data-parallel job (docs/distributed.md) trains; read
/// only when the run is launched as several ranks.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistConfig {
    /// Seconds any collective may wait (for rank 0 evaluating,
    /// checkpointing or sampling meanwhile, or for a rank that hangs)
    /// before every rank stops with an error.
    pub timeout_s: f64,
    /// 0: every rank keeps all the optimizer state; 1: each rank keeps the
    /// state of its share of the parameters (AdamW's moments, and with
    /// bf16 compute the f32 master weights), steps them, and sends them to
    /// the others (ZeRO stage 1, as Megatron's distributed optimizer; the
    /// arithmetic is the same); 2: the gradients too, summed into their
    /// owners after every round of micro-batches (one per rank) and
    /// dropped elsewhere (ZeRO stage 2).
    pub zero_stage: u8,
}

impl Default for DistConfig {
    fn default() -> Self {
        DistConfig { timeout_s: 1800.0, zero_stage: 1 }
    }
}

/// Everything one `r2vpo llm train` run needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Master seed: rollout seeds, data order, minibatch shuffles and the
    /// replay sampler all derive from it.
    pub seed: u64,
    /// The policy.
    pub model: ModelSource,
    /// Training iterations (rollout + update phases).
    pub iterations: usize,
    /// Prompts per iteration (the global batch is `prompts_per_iter ×
    /// group_size` sequences).
    pub prompts_per_iter: usize,
    /// Responses per prompt, G.
    pub group_size: usize,
    /// Training problems.
    pub data: DataConfig,
    /// How a question becomes the user message.
    pub template: PromptTemplate,
    /// Qwen3's thinking switch (`false` = the paper's fast mode).
    pub enable_thinking: Option<bool>,
    /// A training problem whose prompt plus `sampling.max_new_tokens`
    /// exceeds the model's context (`max_position_embeddings`): `"skip"`
    /// (default) never draws it, `"truncate"` cuts the question's tail to
    /// fit (see [`OverlongPrompts`]). Each such problem is named in a
    /// warning and an `events.jsonl` line (`prompt_skipped` /
    /// `prompt_truncated`, with running totals) the first time it is drawn;
    /// the run fails only if every problem is skipped. The held-out
    /// evaluation has its own `eval.overlong_prompts`.
    pub overlong_prompts: OverlongPrompts,
    /// Rollout sampling (the paper: T 1, top-p 1, top-k −1).
    pub sampling: SamplingConfig,
    /// Sequences decoded together during rollouts (memory/speed knob only).
    pub rollout_batch: usize,
    /// Where rollouts come from: in-process (default) or HTTP servers.
    pub rollout: RolloutConfig,
    /// Asynchronous actors (`llm train --async`).
    pub actors: ActorsConfig,
    /// The queue between asynchronous actors and the learner.
    pub queue: QueueConfig,
    /// The verifier that turns responses into rewards.
    pub verify: VerifyConfig,
    /// Where log π_off comes from.
    pub behaviour_logprobs: BehaviourLogprobs,
    /// `on` (Algorithm 1) or `off` (Algorithm 2).
    pub mode: Mode,
    /// On-policy: passes over each fresh batch (K of Algorithm 1).
    pub epochs: usize,
    /// Sequences per optimizer step (on-policy; off-policy uses
    /// `replay.minibatch_size`).
    pub minibatch_size: usize,
    /// Sequences per forward/backward; gradients of a minibatch's
    /// micro-batches are accumulated, with the loss normalised over the
    /// whole minibatch so the sum equals the full-batch gradient.
    pub micro_batch_size: usize,
    /// Run each distinct prompt of a micro-batch once and continue it with
    /// every response of that prompt (keys/values gathered per row), instead
    /// of running prompt + response row by row. The same log-probs and
    /// gradients up to float rounding (tested); faster when prompts are
    /// long next to responses, as with G samples per prompt. Samples of an
    /// optimizer step are ordered by problem before being cut into
    /// micro-batches so that groups stay together; this only changes the
    /// order of a sum. A layout of the candle backend: the torch backend
    /// always packs whole rows.
    pub share_prompt_prefix: bool,
    /// Lay each micro-batch's samples end to end without padding, each
    /// attending only to itself (`crate::backend::batch::PackedSequences`),
    /// instead of left-padded rows: the layers run on real tokens only.
    /// The same log-probs, loss and gradients up to float rounding
    /// (tested for every aggregation mode, on both backends). It takes
    /// precedence over `share_prompt_prefix`, and works with
    /// `activation_checkpointing`.
    pub pack_sequences: bool,
    /// Cut micro-batches by tokens instead of rows (verl's dynamic batch
    /// size): each micro-batch takes samples, longest first, while the
    /// tokens its layout computes (the sum when packed; rows × longest when
    /// padded) stay within this budget; a longer sample goes alone. In a
    /// data-parallel job the micro-batches are dealt so that the ranks'
    /// token totals balance. 0: `micro_batch_size` rows each, in order.
    pub max_tokens_per_micro_batch: usize,
    /// Gradient checkpointing per decoder layer: the forward keeps only each
    /// layer's input, the backward recomputes one layer at a time, and the
    /// LM head runs in chunks of rows
    /// ([`crate::backend::candle::Transformer::checkpointed_tail`]). The same
    /// gradients up to float rounding (tested) for one more forward pass;
    /// on SmolLM2 at 8 × (44 + 256) tokens the step's peak resident memory
    /// falls from 10.1 to 3.4 GiB and its time rises 1.37×
    /// (`docs/cpu-speed.md`, "Memory of a training step"). Needs
    /// `entropy_coef = 0`, and on candle packed micro-batches or
    /// `share_prompt_prefix = false` (a prompt's keys and values gathered
    /// into padded rows cross every layer); refused otherwise.
    pub activation_checkpointing: bool,
    /// The policy objective (R²VPO or a baseline).
    pub objective: ObjectiveConfig,
    /// λ: fixed or adaptive (Appendix C: adaptive, λ₀ 0, η 5e-3, δ 1e-3).
    pub dual: DualConfig,
    /// Replay settings (`mode = "off"`).
    pub replay: ReplayConfig,
    /// Group-relative advantage normalisation.
    pub group_norm: GroupNormConfig,
    /// Drop groups whose rewards are all equal from the update (DAPO's
    /// dynamic-sampling filter). They are counted either way. Alone, the
    /// batch shrinks; with `max_gen_batches > 1` it is refilled.
    pub filter_zero_variance: bool,
    /// DAPO's over-sampling (verl's `filter_groups.max_num_gen_batches`):
    /// with `filter_zero_variance`, draw and sample further batches of
    /// `prompts_per_iter` problems, keeping their groups that carry a signal,
    /// until the iteration holds `prompts_per_iter` such groups or this many
    /// batches were sampled; the surplus is dropped. A batch still short at
    /// the cap trains on what it has and says so in `events.jsonl`.
    /// Default 1: no over-sampling. The DAPO recipe uses 10.
    pub max_gen_batches: usize,
    /// DAPO's overlong reward shaping (Eq. 13): a response within the last
    /// `overlong_buffer` tokens of `sampling.max_new_tokens` loses
    /// `overlong_penalty` × (how far into that buffer it reached) / buffer,
    /// so a truncated one loses the whole penalty. Default 0: off. DAPO uses
    /// 4096 of 20480.
    pub overlong_buffer: usize,
    /// The shaping's full penalty (verl's `overlong_buffer.penalty_factor`). Default 1.0.
    pub overlong_penalty: f64,
    /// Optimizer.
    pub optim: OptimConfig,
    /// KL to the initial policy.
    pub ref_kl: RefKlConfig,
    /// Data-parallel training, when launched as several ranks.
    pub dist: DistConfig,
    /// Entropy bonus weight (loss −= coef · mean token entropy; 0 = off).
    pub entropy_coef: f64,
    /// Checkpoint every this many iterations (0 = only at the end / on
    /// Ctrl-C).
    pub checkpoint_every: usize,
    /// How many of the newest checkpoints to keep (≥ 1; default 1). Each
    /// holds the f32 weights and both Adam moments, 12 bytes a parameter:
    /// ≈ 1.6 GB for SmolLM2-135M.
    pub keep_checkpoints: usize,
    /// Export the final policy as a Hugging Face folder (`RUN/model`) when
    /// the run finishes (`--no-export` sets it false; kept in the run's
    /// `config.toml`, so `--resume` keeps the choice).
    pub export: bool,
    /// Record ratio histograms by staleness every this many iterations
    /// (0 = never).
    pub histogram_every: usize,
    /// Abort after this many consecutive optimizer steps with a non-finite
    /// loss or gradient (each one is skipped and logged).
    pub max_bad_steps: usize,
    /// Lower edge, upper edge and bin count of the ρ histograms.
    pub histogram_range: (f64, f64, usize),
    /// Evaluate on held-out problems before the first iteration (skip it
    /// when the base model's evaluation with the same `eval` settings is
    /// already on file: it is the same computation).
    pub eval_at_start: bool,
    /// Evaluate on held-out problems after the last iteration.
    pub eval_at_end: bool,
    /// Also evaluate every this many iterations (0 = never in between).
    pub eval_every: usize,
    /// The held-out evaluation (the same table as an `r2vpo llm eval`
    /// config; its `template`/`verify` should normally match training's).
    pub eval: EvalConfig,
    /// Experiment trackers (`[log] mlflow = URI`, `wandb = true`), beside
    /// `metrics.jsonl`; rank 0 of a data-parallel job reports.
    pub log: r2vpo_report::track::LogConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            model: ModelSource::default(),
            iterations: 10,
            prompts_per_iter: 8,
            group_size: 8,
            data: DataConfig::default(),
            template: PromptTemplate::Dapo,
            enable_thinking: None,
            overlong_prompts: OverlongPrompts::Skip,
            sampling: SamplingConfig { max_new_tokens: 128, ..SamplingConfig::default() },
            rollout_batch: 64,
            rollout: RolloutConfig::default(),
            actors: ActorsConfig::default(),
            queue: QueueConfig::default(),
            // Built-in arithmetic by default (integer golds; see
            // `VerifyConfig::require_literal_answer`).
            verify: VerifyConfig { require_literal_answer: true, ..VerifyConfig::dapo() },
            behaviour_logprobs: BehaviourLogprobs::Model,
            mode: Mode::On,
            epochs: 1,
            minibatch_size: 32,
            micro_batch_size: 8,
            share_prompt_prefix: true,
            pack_sequences: true,
            max_tokens_per_micro_batch: 0,
            activation_checkpointing: false,
            objective: ObjectiveConfig::default(),
            dual: DualConfig::llm_default(),
            replay: ReplayConfig { minibatch_size: 32, ..ReplayConfig::default() },
            group_norm: GroupNormConfig::default(),
            filter_zero_variance: false,
            max_gen_batches: 1,
            overlong_buffer: 0,
            overlong_penalty: 1.0,
            optim: OptimConfig::default(),
            ref_kl: RefKlConfig::default(),
            dist: DistConfig::default(),
            entropy_coef: 0.0,
            checkpoint_every: 5,
            keep_checkpoints: 1,
            export: true,
            log: r2vpo_report::track::LogConfig::default(),
            histogram_every: 5,
            max_bad_steps: 3,
            histogram_range: (0.5, 1.5, 100),
            eval_at_start: false,
            eval_at_end: false,
            eval_every: 0,
            eval: EvalConfig {
                k: 4,
                sampling: SamplingConfig { max_new_tokens: 128, ..SamplingConfig::test_time() },
                data: DataConfig::builtin_eval(1, 100),
                ..EvalConfig::default()
            },
        }
    }
}

fn bad(field: &str, message: impl Into<String>) -> TrainError {
    TrainError::Config { field: field.into(), message: message.into() }
}

/// Each `(field, count)` is at least 1, or the error names the first that
/// is not (with `hint` after the rule).
fn at_least_one(fields: &[(&str, usize)], hint: &str) -> TrainResult<()> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((k, _)) => Err(bad(k, format!("must be at least 1{hint}"))),
        None => Ok(()),
    }
}

/// Each `(field, seconds)` is a finite positive duration, or the error
/// names the first that is not.
fn positive_seconds(fields: &[(&str, f64)]) -> TrainResult<()> {
    match fields.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
        Some((k, v)) => Err(bad(k, format!("must be a positive number of seconds, got {v}"))),
        None => Ok(()),
    }
}

impl TrainConfig {
    /// The backend `[model]` and `activation_checkpointing` describe.
    pub fn backend_spec(&self) -> crate::backend::open::BackendSpec {
        crate::backend::open::BackendSpec {
            kind: self.model.backend,
            device: self.model.device.clone(),
            compute_dtype: self.model.compute_dtype,
            checkpointing: self.activation_checkpointing,
            lora: self.model.lora.clone(),
        }
    }

    /// Checks every field, naming the first bad one, and that this binary
    /// can run the config ([`TrainConfig::validate_values`], then the
    /// compute backend it names).
    pub fn validate(&self) -> TrainResult<()> {
        self.validate_values()?;
        self.log.validate().map_err(|m| bad("log", m))?;
        if !(self.dist.timeout_s.is_finite() && self.dist.timeout_s > 0.0) {
            return Err(bad("dist.timeout_s", format!("must be > 0 seconds, got {}", self.dist.timeout_s)));
        }
        if self.dist.zero_stage > 2 {
            return Err(bad(
                "dist.zero_stage",
                format!("must be 0, 1 or 2 (stage {} is not built)", self.dist.zero_stage),
            ));
        }
        self.model.backend.check_built().map_err(|e| crate::train::spec_error(e, "model."))
    }

    /// Checks every field's value, naming the first bad one, whatever this
    /// binary can run (what `config show` and `llm plan` check: a GPU
    /// recipe resolves on a machine that only plans it).
    pub fn validate_values(&self) -> TrainResult<()> {
        let positive = [
            ("iterations", self.iterations),
            ("prompts_per_iter", self.prompts_per_iter),
            ("group_size", self.group_size),
            ("rollout_batch", self.rollout_batch),
            ("epochs", self.epochs),
            ("minibatch_size", self.minibatch_size),
            ("micro_batch_size", self.micro_batch_size),
            ("max_bad_steps", self.max_bad_steps),
            ("keep_checkpoints", self.keep_checkpoints),
        ];
        at_least_one(&positive, "")?;
        if self.group_size < 2 {
            return Err(bad("group_size", "group-relative advantages need at least 2 samples per prompt"));
        }
        at_least_one(&[("sampling.max_new_tokens", self.sampling.max_new_tokens)], "")?;
        if self.sampling.temperature <= 0.0 {
            return Err(bad("sampling.temperature", "training rollouts must sample (temperature > 0)"));
        }
        self.sampling.validate().map_err(|e| bad("sampling", e.to_string()))?;
        crate::model::cuda_ordinal(&self.model.device).map_err(|m| bad("model.device", m))?;
        if self.rollout.push_adapter {
            if self.model.lora.is_none() {
                return Err(bad("rollout.push_adapter", "pushes adapters, and [model.lora] trains none"));
            }
            if self.rollout.weight_push == WeightPush::None {
                return Err(bad(
                    "rollout.push_adapter",
                    "adapter folders go to `r2vpo serve` (weight_push = \"update_weights_from_disk\") or vLLM \
                     (weight_push = \"vllm_reload\"); weight_push = \"none\" pushes nothing",
                ));
            }
        }
        if let Some(lora) = &self.model.lora {
            lora.validate().map_err(|(f, m)| bad(&format!("model.lora.{f}"), m))?;
        }
        if let Some(r) = &self.model.random {
            if r.shape.is_some() {
                if r.hidden + r.intermediate + r.layers + r.heads + r.kv_heads != 0 {
                    return Err(bad(
                        "model.random",
                        "give either `shape` or hidden/intermediate/layers/heads/kv_heads, not both",
                    ));
                }
            } else {
                let sizes = [
                    ("model.random.hidden", r.hidden),
                    ("model.random.intermediate", r.intermediate),
                    ("model.random.layers", r.layers),
                    ("model.random.heads", r.heads),
                    ("model.random.kv_heads", r.kv_heads),
                ];
                at_least_one(&sizes, " (or give model.random.shape, a config.json)")?;
            }
        }
        self.rollout.validate()?;
        if self.rollout.backend == RolloutBackend::Http {
            self.check_logprobs(self.rollout.logprobs_mode)?;
        }
        self.optim.validate().map_err(|(k, m)| bad(&format!("optim.{k}"), m))?;
        if self.ref_kl.coef.is_nan() || self.ref_kl.coef < 0.0 {
            return Err(bad("ref_kl.coef", "must be non-negative"));
        }
        if self.activation_checkpointing
            && self.share_prompt_prefix
            && !self.pack_sequences
            && self.model.backend == BackendKind::Candle
        {
            return Err(bad(
                "activation_checkpointing",
                "needs pack_sequences = true or share_prompt_prefix = false: a shared prompt's keys and values \
                 gathered into every padded row feed every layer, which per-layer recomputation cannot split",
            ));
        }
        if self.activation_checkpointing && self.entropy_coef != 0.0 {
            return Err(bad(
                "activation_checkpointing",
                "needs entropy_coef = 0 (the entropy bonus is not checkpointed)",
            ));
        }
        if !self.entropy_coef.is_finite() {
            return Err(bad("entropy_coef", "must be finite"));
        }
        let (lo, hi, bins) = self.histogram_range;
        if !(lo < hi && lo.is_finite() && hi.is_finite()) || bins == 0 {
            return Err(bad("histogram_range", "needs lo < hi (finite) and at least one bin"));
        }
        if self.eval_at_start || self.eval_at_end || self.eval_every > 0 {
            self.eval.validate().map_err(|e| bad("eval", e.to_string()))?;
        }
        self.objective.validate().map_err(|e| bad("objective", e.to_string()))?;
        self.dual.validate().map_err(|e| bad("dual", e.to_string()))?;
        self.replay.validate().map_err(|e| bad("replay", e.to_string()))?;
        self.group_norm.validate().map_err(|e| bad("group_norm", e.to_string()))?;
        at_least_one(&[("actors.count", self.actors.count)], "")?;
        positive_seconds(&[("queue.lease_s", self.queue.lease_s), ("queue.timeout_s", self.queue.timeout_s)])?;
        if self.queue.backend == QueueBackend::Redis
            && !(self.queue.url.starts_with("redis://") || self.queue.url.starts_with("rediss://"))
        {
            return Err(bad("queue.url", "must be a redis:// URL"));
        }
        if self.queue.tls_ca.is_some() && !self.queue.url.starts_with("rediss://") {
            return Err(bad("queue.tls_ca", "a CA file needs a TLS URL: queue.url = \"rediss://…\""));
        }
        at_least_one(&[("max_gen_batches", self.max_gen_batches)], "")?;
        if self.max_gen_batches > 1 && !self.filter_zero_variance {
            return Err(bad(
                "max_gen_batches",
                "over-sampling refills the groups filter_zero_variance drops: set filter_zero_variance = true",
            ));
        }
        if self.max_gen_batches > 1 && self.actors.asynchronous {
            return Err(bad(
                "max_gen_batches",
                "asynchronous actors fill the queue at their own pace; over-sampling is for synchronous runs",
            ));
        }
        if self.overlong_buffer > self.sampling.max_new_tokens {
            return Err(bad(
                "overlong_buffer",
                format!("must be at most sampling.max_new_tokens ({})", self.sampling.max_new_tokens),
            ));
        }
        if !(self.overlong_penalty.is_finite() && self.overlong_penalty >= 0.0) {
            return Err(bad("overlong_penalty", format!("must be finite and >= 0, got {}", self.overlong_penalty)));
        }
        if self.objective.rollout_correction != r2vpo::correction::RolloutCorrection::None
            && self.behaviour_logprobs != BehaviourLogprobs::Recompute
        {
            return Err(bad(
                "objective.rollout_correction",
                format!(
                    "`{}` weighs the learner's log-probs against the engine's, which only differ when the learner \
                     recomputes them: set behaviour_logprobs = \"recompute\" (or rollout_correction = \"none\")",
                    self.objective.rollout_correction.as_str()
                ),
            ));
        }
        if self.actors.asynchronous {
            if self.behaviour_logprobs == BehaviourLogprobs::Recompute {
                return Err(bad(
                    "behaviour_logprobs",
                    "`recompute` scores with the learner's current weights, which are not the actors' behaviour \
                     policy in an asynchronous run; use `model` or `sampled`",
                ));
            }
            if self.rollout.backend == RolloutBackend::Http && self.rollout.sync_every != 1 {
                // An actor samples batch b with the newest weights it fetched
                // (at most max_staleness versions old); a server that skipped
                // pushes would sample older ones and break that bound.
                return Err(bad(
                    "rollout.sync_every",
                    format!(
                        "asynchronous actors push every weight version they fetch to their servers, which \
                         keeps the actors.max_staleness bound; set it to 1 (got {})",
                        self.rollout.sync_every
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses a rollout source whose log-probs would make the ratio's
    /// denominator differ from what `behaviour_logprobs` asks for: `model`
    /// needs raw (T = 1, untruncated) log-probs, `sampled` the processed
    /// ones, unless sampling is plain T = 1 without truncation, where the
    /// two coincide; `recompute` scores the tokens itself and takes any.
    pub fn check_logprobs(&self, got: crate::rollout::LogprobsMode) -> TrainResult<()> {
        use crate::rollout::LogprobsMode;
        let s = &self.sampling;
        let plain = s.temperature == 1.0 && s.top_p >= 1.0 && s.top_k <= 0;
        let want = match self.behaviour_logprobs {
            BehaviourLogprobs::Recompute => return Ok(()),
            BehaviourLogprobs::Model => LogprobsMode::Raw,
            BehaviourLogprobs::Sampled => LogprobsMode::Processed,
        };
        if plain || got == LogprobsMode::Both || got == want {
            return Ok(());
        }
        let name = |m: LogprobsMode| match m {
            LogprobsMode::Raw => "raw",
            LogprobsMode::Processed => "processed",
            LogprobsMode::Both => "both",
        };
        let behaviour = match self.behaviour_logprobs {
            BehaviourLogprobs::Model => "model",
            _ => "sampled",
        };
        Err(bad(
            "rollout.logprobs_mode",
            format!(
                "the servers' log-probs are `{}` but behaviour_logprobs = \"{behaviour}\" with sampling temperature \
                 {}, top_p {}, top_k {} needs `{}` ones (the two differ unless T = 1 without truncation), so ρ would \
                 be wrong. Set behaviour_logprobs = \"recompute\", serve `{}` log-probs (r2vpo serve \
                 --logprobs-mode, vLLM --logprobs-mode), or sample at T = 1 without top-p/top-k",
                name(got),
                s.temperature,
                s.top_p,
                s.top_k,
                name(want),
                name(want)
            ),
        ))
    }

    /// Named algorithm presets (the paper's comparisons), as `--set`
    /// overrides applied before the user's own ([`r2vpo::algo::algo_overrides`]).
    pub fn algo_overrides(name: &str) -> TrainResult<Vec<String>> {
        Ok(r2vpo::algo::algo_overrides(name)?)
    }
}

#[cfg(test)]
mod device_tests {
    use super::*;

    fn field_of(e: &TrainError) -> &str {
        match e {
            TrainError::Config { field, .. } => field,
            _ => "",
        }
    }

    #[test]
    fn model_device_is_checked_and_cuda_needs_a_cuda_build() {
        // Opening the backend is where the device is opened: its refusal
        // names the config key.
        let open = |m: &ModelSource| {
            let cfg = TrainConfig { model: m.clone(), ..TrainConfig::default() };
            let c = crate::model::ModelConfig::tiny(crate::model::Architecture::Llama, 16, 8, 16, 1, 2, 1, true);
            let init = crate::model::RandomInit::new(c.clone(), 0, 0.02);
            crate::backend::open::open_policy(&cfg.backend_spec(), &c, &init)
                .map(|_| ())
                .map_err(|e| crate::train::spec_error(e, "model."))
        };
        let mut m = ModelSource::default();
        open(&m).unwrap();
        for d in ["gpu", "cuda:x", "cuda:", "CPU"] {
            m.device = d.into();
            let e = open(&m).unwrap_err();
            assert_eq!(field_of(&e), "model.device", "{e}");
            assert!(e.to_string().contains(d), "{e}");
            let cfg = TrainConfig { model: m.clone(), ..TrainConfig::default() };
            assert_eq!(field_of(&cfg.validate().unwrap_err()), "model.device");
        }
        m.device = "cuda".into();
        let e = open(&m).unwrap_err();
        assert_eq!(field_of(&e), "model.device", "{e}");
        if !cfg!(feature = "cuda") {
            assert!(e.to_string().contains("make build-gpu"), "{e}");
        }
    }

    /// Each bad optimizer value is refused naming its own key; counts of
    /// zero name theirs.
    #[test]
    fn bad_optimizer_values_and_zero_counts_name_their_key() {
        type Break = fn(&mut TrainConfig);
        let cases: [(&str, Break); 8] = [
            ("optim.lr", |c| c.optim.lr = 0.0),
            ("optim.beta1", |c| c.optim.beta1 = 1.0),
            ("optim.beta2", |c| c.optim.beta2 = -0.1),
            ("optim.eps", |c| c.optim.eps = f64::NAN),
            ("optim.weight_decay", |c| c.optim.weight_decay = -1.0),
            ("optim.grad_clip", |c| c.optim.grad_clip = f64::INFINITY),
            ("sampling.max_new_tokens", |c| c.sampling.max_new_tokens = 0),
            ("actors.count", |c| c.actors.count = 0),
        ];
        for (key, break_it) in cases {
            let mut cfg = TrainConfig::default();
            break_it(&mut cfg);
            let e = cfg.validate_values().unwrap_err();
            assert_eq!(field_of(&e), key, "{e}");
        }
    }

    #[test]
    fn a_random_model_takes_either_a_shape_or_its_sizes() {
        let with = |f: &dyn Fn(&mut RandomModel)| {
            let mut model = ModelSource::tiny_random("x.gguf", 0);
            f(model.random.as_mut().unwrap());
            TrainConfig { model, ..TrainConfig::default() }.validate()
        };
        assert!(with(&|_| ()).is_ok());
        let e = with(&|r| r.layers = 0).unwrap_err();
        assert_eq!(field_of(&e), "model.random.layers", "{e}");
        let e = with(&|r| r.shape = Some("configs/shapes/qwen3-tiny.json".into())).unwrap_err();
        assert_eq!(field_of(&e), "model.random", "{e}");
        let shape_only = |r: &mut RandomModel| {
            r.shape = Some("configs/shapes/qwen3-tiny.json".into());
            (r.hidden, r.intermediate, r.layers, r.heads, r.kv_heads) = (0, 0, 0, 0, 0);
        };
        assert!(with(&shape_only).is_ok());
        // A config file gives just the shape and the seed.
        let r: RandomModel = serde_json::from_str(r#"{"shape": "configs/shapes/qwen3-1.7b.json", "seed": 3}"#).unwrap();
        assert_eq!((r.hidden, r.layers, r.init_std), (0, 0, 0.02));
    }
}

/// Why [`load`] could not build a config.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file, a `--set` or a key did not layer ([`r2vpo_report::config`]).
    #[error(transparent)]
    Layers(#[from] r2vpo_report::config::ConfigError),
    /// The algorithm preset is not in the table.
    #[error(transparent)]
    Algo(Box<TrainError>),
    /// The layered config is not valid; `origin` says where it came from
    /// (the file and the `--set`s), `error` names the field.
    #[error("{origin}")]
    Invalid {
        /// The file and overrides ([`r2vpo_report::config::source`]).
        origin: String,
        /// The field at fault.
        #[source]
        error: Box<TrainError>,
    },
}

/// A train config layered as the command line layers it: defaults, then
/// `file`, then the `algo` preset's overrides, then `seed`, then `sets`
/// (`key=value` TOML overrides). Checks every value, not whether this
/// binary can run it ([`TrainConfig::validate_values`]: what `config show`
/// and `llm plan` need, a GPU recipe resolving on a machine that only
/// plans it).
pub fn load_values(
    file: Option<&std::path::Path>,
    algo: Option<&str>,
    seed: Option<u64>,
    sets: &[String],
) -> Result<TrainConfig, LoadError> {
    let mut all = match algo {
        Some(a) => TrainConfig::algo_overrides(a).map_err(|e| LoadError::Algo(Box::new(e)))?,
        None => Vec::new(),
    };
    if let Some(s) = seed {
        all.push(format!("seed={s}"));
    }
    all.extend(sets.iter().cloned());
    let cfg: TrainConfig = r2vpo_report::config::load(file, &all)?;
    cfg.validate_values()
        .map_err(|e| LoadError::Invalid { origin: r2vpo_report::config::source(file, sets), error: Box::new(e) })?;
    Ok(cfg)
}

/// [`load_values`], then whether this binary can run the config
/// ([`TrainConfig::validate`]).
pub fn load(
    file: Option<&std::path::Path>,
    algo: Option<&str>,
    seed: Option<u64>,
    sets: &[String],
) -> Result<TrainConfig, LoadError> {
    let cfg = load_values(file, algo, seed, sets)?;
    cfg.validate()
        .map_err(|e| LoadError::Invalid { origin: r2vpo_report::config::source(file, sets), error: Box::new(e) })?;
    Ok(cfg)
}
