//! Batched generation with a KV cache: temperature, top-k, top-p, stop
//! tokens and per-request seeds, returning for every sampled token two
//! log-probabilities.
//!
//! * [`Generation::logprobs`] — log q(token), q being the distribution the
//!   token was actually drawn from: `softmax(logits / T)` restricted to the
//!   top-k, then to the top-p nucleus, and renormalised (a point mass, log
//!   q = 0, when greedy). These are the exact behaviour log-probs
//!   (π_off) of the sampler.
//! * [`Generation::model_logprobs`] — log π(token) under the model's own
//!   untruncated temperature-1 distribution `softmax(logits)`: the quantity
//!   [`crate::backend::candle::Transformer::forward_logprobs`] / [`crate::backend::candle::Transformer::score_logprobs`]
//!   compute (checked to 1e-4 in `tests/sample_*.rs`).
//!
//! **Which one the trainer uses:** the policy ratio π_θ/π_old must compare
//! like with like, and the training forward computes the untruncated T=1
//! log π_θ, so log π_old in the ratio is `model_logprobs` (or a fresh
//! `score_logprobs` pass, which equals it). The two coincide exactly when
//! T = 1, top-p = 1 and top-k is off (the paper's training sampling, the
//! [`SamplingConfig::default`]); with truncation or T ≠ 1 they differ, and
//! `logprobs` is then the true behaviour density, for off-policy
//! importance weights π_θ/π_off if the trainer wants them.
//!
//! Determinism: each request owns a `ChaCha8Rng` seeded from its
//! [`GenerationRequest::seed`] and draws exactly one uniform per sampled
//! token, so a row's sample does not depend on which other rows share its
//! batch (up to floating-point differences in the logits of differently
//! shaped matmuls, far below what moves a draw in practice).
//!
//! Finished rows are dropped from the batch with [`crate::backend::candle::KvCache::select_rows`],
//! so long generations do not pay for rows that already stopped; requests
//! with identical prompts (several samples per prompt) share one prefill.

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{DType, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::chat::{ChatMessage, ChatTemplate};
use crate::decode::{DecodeCache, Decoder};
use crate::tokenizer::{PaddedBatch, Tokenizer};

/// Errors from generation.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// An invalid sampling setting or request.
    #[error("sampling config field `{field}`: {message}")]
    Config {
        /// The field, e.g. `top_p`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The model failed.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// Rendering the chat template failed.
    #[error(transparent)]
    Chat(#[from] crate::chat::ChatError),
    /// Decoding the generated ids failed.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// A request's prompt is empty or holds a token id outside the
    /// vocabulary ([`check_prompt`]); nothing was generated.
    #[error("request {request}: prompt {message}")]
    BadPrompt {
        /// Index of the request in the batch.
        request: usize,
        /// What is wrong.
        message: String,
    },
    /// A request's prompt plus `max_new_tokens` does not fit the model's
    /// context ([`check_prompt_fits`]); nothing was generated.
    #[error("request {request}: {source}")]
    PromptTooLong {
        /// Index of the request in the batch.
        request: usize,
        /// The lengths involved.
        source: ContextOverflow,
    },
}

/// A prompt that, with the tokens to be generated after it, does not fit
/// the model's context window (`max_position_embeddings`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "prompt of {prompt_len} tokens + max_new_tokens {max_new_tokens} exceeds the model's context of {context} \
     tokens (prompts may have at most {} tokens)",
    max_prompt_len(*.max_new_tokens, *.context)
)]
pub struct ContextOverflow {
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Tokens to be generated after the prompt.
    pub max_new_tokens: usize,
    /// The model's context length.
    pub context: usize,
}

/// The longest prompt that leaves room for `max_new_tokens` in a context
/// of `context` tokens: `context − max_new_tokens` (0 when none fits).
pub fn max_prompt_len(max_new_tokens: usize, context: usize) -> usize {
    context.saturating_sub(max_new_tokens)
}

/// Checks that a prompt of `prompt_len` tokens followed by up to
/// `max_new_tokens` generated ones fits in `context` positions (the model's
/// `max_position_embeddings`), i.e. `prompt_len + max_new_tokens <=
/// context`. The one place this bound is decided: [`generate_ids`] refuses
/// requests that fail it (a prompt far beyond the context would otherwise
/// try to allocate its attention scores, terabytes for a 10 MB prompt), and
/// evaluation and training skip or truncate such prompts before sampling.
pub fn check_prompt_fits(
    prompt_len: usize,
    max_new_tokens: usize,
    context: usize,
) -> std::result::Result<(), ContextOverflow> {
    if prompt_len.saturating_add(max_new_tokens) > context {
        Err(ContextOverflow { prompt_len, max_new_tokens, context })
    } else {
        Ok(())
    }
}

/// Checks prompt `request` before anything is sampled from it: not empty,
/// every id below `vocab`, and fitting `context` with `max_new_tokens`
/// ([`check_prompt_fits`]). The one check both [`generate_ids`] and the
/// serving engine ([`crate::engine`]) apply.
pub fn check_prompt(
    request: usize,
    prompt_ids: &[u32],
    max_new_tokens: usize,
    vocab: usize,
    context: usize,
) -> Result<()> {
    if prompt_ids.is_empty() {
        return Err(SampleError::BadPrompt { request, message: "is empty".into() });
    }
    if let Some(&t) = prompt_ids.iter().find(|&&t| t as usize >= vocab) {
        let message = format!("token id {t} is out of range for the vocabulary of {vocab}");
        return Err(SampleError::BadPrompt { request, message });
    }
    check_prompt_fits(prompt_ids.len(), max_new_tokens, context)
        .map_err(|source| SampleError::PromptTooLong { request, source })
}

/// The distinct prompts among `prompts` in first-seen order, and for each
/// prompt the index of its distinct copy: identical prompts (a group's
/// samples) are prefilled once and their cache rows replicated.
pub(crate) fn distinct_prompts<'a>(prompts: impl IntoIterator<Item = &'a [u32]>) -> (Vec<Vec<u32>>, Vec<usize>) {
    let mut uniq: Vec<Vec<u32>> = Vec::new();
    let mut seen: HashMap<&[u32], usize> = HashMap::new();
    let of = prompts
        .into_iter()
        .map(|p| {
            *seen.entry(p).or_insert_with(|| {
                uniq.push(p.to_vec());
                uniq.len() - 1
            })
        })
        .collect();
    (uniq, of)
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, SampleError>;

/// How tokens are drawn. The default is the paper's training sampling:
/// temperature 1, top-p 1, top-k off (plain ancestral sampling).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 means greedy (argmax, ties to the lowest id).
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 keeps every token.
    pub top_p: f64,
    /// Keep only the k most likely tokens; 0 or negative turns it off.
    pub top_k: i64,
    /// Generation stops after this many new tokens (finish reason `length`).
    pub max_new_tokens: usize,
    /// Extra ids that end generation (finish reason `stop`), besides EOS.
    pub stop_token_ids: Vec<u32>,
    /// Base seed; [`GenerationRequest::batch`] derives per-request seeds
    /// from it.
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 512,
            stop_token_ids: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingConfig {
    /// The paper's evaluation sampling: T = 0.6, top-p = 0.95, top-k = 20.
    pub fn test_time() -> Self {
        SamplingConfig { temperature: 0.6, top_p: 0.95, top_k: 20, ..Self::default() }
    }

    /// Greedy decoding (temperature 0).
    pub fn greedy() -> Self {
        SamplingConfig { temperature: 0.0, ..Self::default() }
    }

    /// Checks the ranges of the fields.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, message: String| Err(SampleError::Config { field: field.into(), message });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", format!("{} must be finite and >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} must be in (0, 1]", self.top_p));
        }
        Ok(())
    }

    fn top_k(&self) -> Option<usize> {
        usize::try_from(self.top_k).ok().filter(|&k| k > 0)
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The tokenizer's EOS (end-of-turn) token was sampled.
    Eos,
    /// Another stop token was sampled.
    Stop,
    /// `max_new_tokens` were generated.
    Length,
}

/// One prompt to continue, with its own seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerationRequest {
    /// Prompt token ids (non-empty).
    pub prompt_ids: Vec<u32>,
    /// Seed of this request's random stream.
    pub seed: u64,
}

impl GenerationRequest {
    /// Requests for `prompts` with seeds derived from `base_seed` and the
    /// index, so that request `i` of a batch always gets the same stream.
    pub fn batch(prompts: &[Vec<u32>], base_seed: u64) -> Vec<Self> {
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| GenerationRequest { prompt_ids: p.clone(), seed: request_seed(base_seed, i as u64) })
            .collect()
    }
}

/// A well-mixed seed for request `index` under `base`, so neighbouring
/// indices get unrelated ChaCha streams ([`r2vpo::seed::request_seed`]).
pub use r2vpo::seed::request_seed;

/// The output of one request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// Number of prompt tokens.
    pub prompt_len: usize,
    /// Generated ids, including the final EOS/stop token when there is one.
    pub token_ids: Vec<u32>,
    /// The generated text without the final EOS/stop token and with special
    /// tokens skipped (empty from [`generate_ids`], which has no tokenizer).
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Per token: log-prob under the sampling distribution (see the module
    /// docs; 0 for greedy). The behaviour log-probs π_off.
    pub logprobs: Vec<f32>,
    /// Per token: log-prob under the untruncated temperature-1 model
    /// distribution; what the trainer's ratio uses as log π_old.
    pub model_logprobs: Vec<f32>,
    /// Per token: entropy (nats) of the untruncated temperature-1 model
    /// distribution at that step (the paper's entropy diagnostic).
    pub entropy: Vec<f32>,
}

/// Generates continuations of `requests` with `model`, decoding the text
/// with `tok` and stopping on its stop ids (EOS → [`FinishReason::Eos`],
/// the rest and `cfg.stop_token_ids` → [`FinishReason::Stop`]).
/// A request whose prompt plus `cfg.max_new_tokens` exceeds the model's
/// context is refused up front ([`check_prompt_fits`],
/// [`SampleError::PromptTooLong`]).
pub fn generate<M: Decoder + ?Sized>(
    model: &M,
    tok: &Tokenizer,
    requests: &[GenerationRequest],
    cfg: &SamplingConfig,
) -> Result<Vec<Generation>> {
    let mut stops = cfg.stop_token_ids.clone();
    stops.extend(tok.stop_token_ids().iter().filter(|&&s| s != tok.eos_token_id()));
    let eff = SamplingConfig { stop_token_ids: stops, ..cfg.clone() };
    let mut gens = generate_ids(model, requests, &eff, Some(tok.eos_token_id()), tok.pad_token_id())?;
    for g in &mut gens {
        let body = match g.finish_reason {
            FinishReason::Length => &g.token_ids[..],
            _ => &g.token_ids[..g.token_ids.len() - 1],
        };
        g.text = tok.decode(body, true)?;
    }
    Ok(gens)
}

/// Renders each conversation with the tokenizer's chat template (with the
/// generation prompt and Qwen3's `enable_thinking` switch: `Some(false)` is
/// the paper's fast mode, `Some(true)`/`None` slow), encodes it without
/// extra special tokens (the template writes them) and generates, request
/// `i` seeded with [`request_seed`]`(cfg.seed, i)`.
pub fn generate_chat<M: Decoder + ?Sized>(
    model: &M,
    tok: &Tokenizer,
    conversations: &[Vec<ChatMessage>],
    enable_thinking: Option<bool>,
    cfg: &SamplingConfig,
) -> Result<Vec<Generation>> {
    let template = ChatTemplate::from_tokenizer(tok)?;
    let mut opts = template.default_options(true);
    opts.enable_thinking = enable_thinking;
    let prompts = conversations
        .iter()
        .map(|c| Ok(tok.encode(&template.render(c, &opts)?, false)?))
        .collect::<Result<Vec<_>>>()?;
    generate(model, tok, &GenerationRequest::batch(&prompts, cfg.seed), cfg)
}

/// State of one request while it decodes.
struct Row {
    rng: ChaCha8Rng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    model_logprobs: Vec<f32>,
    entropy: Vec<f32>,
    finish: Option<FinishReason>,
}

/// [`generate`] without a tokenizer: stops on `eos` and
/// `cfg.stop_token_ids`, pads prompts on the left with `pad_id`, leaves
/// [`Generation::text`] empty.
///
/// Every request must satisfy [`check_prompt_fits`] against the model's
/// `max_position_embeddings`; otherwise nothing is generated and the error
/// is [`SampleError::PromptTooLong`] naming the first offending request.
pub fn generate_ids<M: Decoder + ?Sized>(
    model: &M,
    requests: &[GenerationRequest],
    cfg: &SamplingConfig,
    eos: Option<u32>,
    pad_id: u32,
) -> Result<Vec<Generation>> {
    cfg.validate()?;
    let vocab = model.config().vocab_size;
    let context = model.config().max_position_embeddings;
    for (i, r) in requests.iter().enumerate() {
        check_prompt(i, &r.prompt_ids, cfg.max_new_tokens, vocab, context)?;
    }
    let mut rows: Vec<Row> = requests
        .iter()
        .map(|r| Row {
            rng: ChaCha8Rng::seed_from_u64(r.seed),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            model_logprobs: Vec::new(),
            entropy: Vec::new(),
            finish: None,
        })
        .collect();

    if cfg.max_new_tokens > 0 && !requests.is_empty() {
        // On a pool thread for the whole loop, the others kept awake (see
        // `on_pool_awake`).
        if model.wants_pool() {
            crate::pool::on_pool_awake(|| decode(model, requests, cfg, eos, pad_id, &mut rows))?;
        } else {
            decode(model, requests, cfg, eos, pad_id, &mut rows)?;
        }
    }
    Ok(rows
        .into_iter()
        .zip(requests)
        .map(|(r, q)| Generation {
            prompt_len: q.prompt_ids.len(),
            token_ids: r.tokens,
            text: String::new(),
            finish_reason: r.finish.unwrap_or(FinishReason::Length),
            logprobs: r.logprobs,
            model_logprobs: r.model_logprobs,
            entropy: r.entropy,
        })
        .collect())
}

/// [`generate_ids`]' prefill and decode loop, filling `rows`.
fn decode<M: Decoder + ?Sized>(
    model: &M,
    requests: &[GenerationRequest],
    cfg: &SamplingConfig,
    eos: Option<u32>,
    pad_id: u32,
    rows: &mut [Row],
) -> Result<()> {
    // Identical prompts (a GRPO group's samples) are prefilled once and
    // their cache rows and logits replicated.
    let (uniq, of_request) = distinct_prompts(requests.iter().map(|r| r.prompt_ids.as_slice()));
    let (ids, mask) = PaddedBatch::left_pad(&uniq, pad_id).to_tensors(model.input_device())?;
    let mut cache = model.new_cache(uniq.len(), ids.dim(1)? + cfg.max_new_tokens);
    let mut logits = model.forward_step(&ids, &mask, &mut cache)?;
    if uniq.len() < requests.len() {
        cache.select_rows(&of_request)?;
        let idx: Vec<u32> = of_request.iter().map(|&u| u as u32).collect();
        logits = logits.index_select(&Tensor::new(idx.as_slice(), logits.device())?, 0)?;
    }
    // `active[j]` is the request behind cache row j.
    let mut active: Vec<usize> = (0..requests.len()).collect();
    loop {
        // The logits read where they lie on the CPU: copied out row by row
        // (`to_vec2`) they were 0.85 ms of a 48 ms batch-32 step.
        let lf = logits.to_dtype(DType::F32)?.contiguous()?;
        let vocab = lf.dim(1)?;
        let host: Vec<f32>;
        let guard;
        let flat: &[f32] = if lf.device().is_cpu() {
            guard = lf.storage_and_layout();
            match &*guard.0 {
                candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => {
                    &v[guard.1.start_offset()..guard.1.start_offset() + lf.elem_count()]
                }
                _ => return Err(candle_core::Error::Msg("sampler: f32 CPU logits expected".into()).into()),
            }
        } else {
            host = lf.flatten_all()?.to_vec1::<f32>()?;
            &host
        };
        // Rows are independent (own RNG), so sample them in parallel.
        let mut picked: Vec<(usize, &mut Row)> =
            rows.iter_mut().enumerate().filter(|(i, _)| active.contains(i)).collect();
        picked.par_iter_mut().for_each(|(i, row)| {
            let j = active.iter().position(|a| a == i).expect("active row");
            let s = sample_token(&flat[j * vocab..(j + 1) * vocab], cfg, &mut row.rng);
            row.tokens.push(s.token);
            row.logprobs.push(s.logprob as f32);
            row.model_logprobs.push(s.model_logprob as f32);
            row.entropy.push(s.entropy as f32);
            if Some(s.token) == eos {
                row.finish = Some(FinishReason::Eos);
            } else if cfg.stop_token_ids.contains(&s.token) {
                row.finish = Some(FinishReason::Stop);
            } else if row.tokens.len() >= cfg.max_new_tokens {
                row.finish = Some(FinishReason::Length);
            }
        });
        let keep: Vec<usize> = (0..active.len()).filter(|&j| rows[active[j]].finish.is_none()).collect();
        if keep.is_empty() {
            break;
        }
        if keep.len() != active.len() {
            cache.select_rows(&keep)?;
            active = keep.iter().map(|&j| active[j]).collect();
        }
        let next: Vec<u32> = active.iter().map(|&i| *rows[i].tokens.last().expect("sampled")).collect();
        let n = next.len();
        let ids = Tensor::from_vec(next, (n, 1), model.input_device())?;
        let mask = Tensor::ones((n, 1), DType::U32, model.input_device())?;
        logits = model.forward_step(&ids, &mask, &mut cache)?;
    }
    Ok(())
}

/// The first id whose running total of `w` passes `target` (ids of weight 0
/// never chosen), or `None` if rounding leaves the total short. Sums of
/// 256-id blocks first, in 8 independent lanes, then one block id by id: a
/// single chain of 49 152 dependent f64 adds (and a second for the total)
/// was ≈ 1.3 ms of a batch-32 SmolLM2 decode step. The running totals
/// round differently from one chain's, which moves a draw only when
/// `target` lies within rounding of a boundary.
fn inverse_cdf(w: &[f64], target: f64) -> Option<usize> {
    const BLOCK: usize = 256;
    let mut acc = 0.0;
    for (b, blk) in w.chunks(BLOCK).enumerate() {
        let mut lanes = [0f64; 8];
        let ch = blk.chunks_exact(8);
        let rest: f64 = ch.remainder().iter().sum();
        for c in ch {
            for l in 0..8 {
                lanes[l] += c[l];
            }
        }
        let sum = lanes.iter().sum::<f64>() + rest;
        if target < acc + sum {
            for (i, &wt) in blk.iter().enumerate() {
                acc += wt;
                if target < acc && wt > 0.0 {
                    return Some(b * BLOCK + i);
                }
            }
        } else {
            acc += sum;
        }
    }
    None
}

/// One draw and its two log-probabilities.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// log q(token) under the (truncated, renormalised) sampling distribution.
    pub logprob: f64,
    /// log softmax(logits)(token): the untruncated T = 1 model log-prob.
    pub model_logprob: f64,
    /// Entropy (nats) of the untruncated T = 1 model distribution.
    pub entropy: f64,
}

/// Draws one token from `logits` (one row, length V) under `cfg`, using
/// exactly one uniform from `rng` unless greedy. Top-k is applied before
/// top-p, as in transformers and vLLM; the nucleus keeps every token whose
/// strictly-more-likely predecessors hold less than `top_p` of the mass
/// (so the token that crosses `top_p` is kept, and always at least one).
pub fn sample_token(logits: &[f32], cfg: &SamplingConfig, rng: &mut impl Rng) -> Sampled {
    let (max_i, max_l) = r2vpo_kernels::simd::argmax(logits);
    // One pass gives both the log-normaliser and the entropy:
    // H = ln Σe − Σ e·(l − max) / Σe with e = exp(l − max), in f32 SIMD
    // with f64 sums (`exp_moments`: within 3e-7 relative of f64 throughout,
    // far inside the 1e-5 the behaviour log-probs are held to).
    // At T = 1 (RL's default) the exponentials are kept: they are the
    // sampling weights below (z = d · 1.0 = d), and exp over the vocabulary
    // was 6 % of decode time at batch 32, half of it repeated.
    let keep = cfg.temperature == 1.0;
    let mut e = Vec::with_capacity(if keep { logits.len() } else { 0 });
    let (s0, s1) = r2vpo_kernels::simd::exp_moments(logits, max_l, keep.then_some(&mut e));
    let lse = f64::from(max_l) + s0.ln();
    let entropy = s0.ln() - s1 / s0;
    let model_lp = |t: usize| f64::from(logits[t]) - lse;
    if cfg.temperature == 0.0 {
        return Sampled { token: max_i as u32, logprob: 0.0, model_logprob: model_lp(max_i), entropy };
    }
    let inv_t = 1.0 / cfg.temperature;
    let z = |t: usize| (f64::from(logits[t]) - f64::from(max_l)) * inv_t;
    let weights = || -> Vec<f64> {
        if keep {
            e
        } else {
            (0..logits.len()).map(|t| z(t).exp()).collect()
        }
    };
    let u: f64 = rng.random();
    let top_k = cfg.top_k().filter(|&k| k < logits.len());
    if top_k.is_none() && cfg.top_p >= 1.0 {
        // Untruncated: inverse-CDF over the vocabulary in id order. At T = 1
        // the weights are the normaliser's exponentials, so their total is
        // its sum (the same values, summed in lanes).
        let w = weights();
        let total: f64 = if keep { s0 } else { w.iter().sum() };
        let tok = inverse_cdf(&w, u * total).unwrap_or(max_i);
        return Sampled { token: tok as u32, logprob: z(tok) - total.ln(), model_logprob: model_lp(tok), entropy };
    }
    // Candidates in descending order (ties to the lower id). Only the head
    // of the order is needed, so select before sorting.
    let v = logits.len();
    let w = weights();
    let desc = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let head = |m: usize| -> Vec<usize> {
        let mut idx: Vec<usize> = (0..v).collect();
        if m < v {
            idx.select_nth_unstable_by(m - 1, desc);
            idx.truncate(m);
        }
        idx.sort_unstable_by(desc);
        idx
    };
    // `mass`: the total the nucleus is measured against — the top-k set's
    // (top-p acts on the renormalised top-k distribution) or the whole
    // vocabulary's.
    let (cand, mass) = match top_k {
        Some(k) => {
            let c = head(k);
            let m: f64 = c.iter().map(|&t| w[t]).sum();
            (c, m)
        }
        None => {
            let all: f64 = w.iter().sum();
            // Widen the sorted head until it holds the nucleus.
            let mut m = 256.min(v);
            loop {
                let c = head(m);
                let hm: f64 = c.iter().map(|&t| w[t]).sum();
                if m == v || hm >= cfg.top_p * all {
                    break (c, all);
                }
                m = (m * 4).min(v);
            }
        }
    };
    let mut keep = 0;
    let mut acc = 0.0;
    for &t in &cand {
        if keep > 0 && acc >= cfg.top_p * mass {
            break;
        }
        acc += w[t];
        keep += 1;
    }
    let cand = &cand[..keep];
    let weights: Vec<f64> = cand.iter().map(|&t| w[t]).collect();
    let total: f64 = weights.iter().sum();
    let target = u * total;
    let mut acc = 0.0;
    let mut pick = 0;
    for (j, &wt) in weights.iter().enumerate() {
        acc += wt;
        pick = j;
        if target < acc {
            break;
        }
    }
    let tok = cand[pick];
    Sampled { token: tok as u32, logprob: (weights[pick] / total).ln(), model_logprob: model_lp(tok), entropy }
}

/// Generation throughput at one batch size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// Rows decoded together.
    pub batch: usize,
    /// Prompt tokens per row.
    pub prompt_tokens: usize,
    /// New tokens per row (generation ignores EOS so every row runs to the end).
    pub new_tokens: usize,
    /// Wall-clock seconds for prefill + decode.
    pub seconds: f64,
    /// Generated tokens per second over the whole batch.
    pub tokens_per_s: f64,
}

/// Measures generation throughput of `model` at each batch size: the same
/// prompt in every row, `new_tokens` sampled per row with `cfg` but no stop
/// tokens (so all rows run the full length), timed from prefill to the last
/// token. Use for `r2vpo bench llm` (batch 1/8/32).
pub fn bench_generate<M: Decoder + ?Sized>(
    model: &M,
    prompt_ids: &[u32],
    batch_sizes: &[usize],
    new_tokens: usize,
    cfg: &SamplingConfig,
) -> Result<Vec<BenchRow>> {
    let cfg = SamplingConfig { max_new_tokens: new_tokens, stop_token_ids: Vec::new(), ..cfg.clone() };
    batch_sizes
        .iter()
        .map(|&b| {
            let reqs = GenerationRequest::batch(&vec![prompt_ids.to_vec(); b], cfg.seed);
            let t0 = Instant::now();
            let gens = generate_ids(model, &reqs, &cfg, None, 0)?;
            let seconds = t0.elapsed().as_secs_f64();
            let n: usize = gens.iter().map(|g| g.token_ids.len()).sum();
            Ok(BenchRow {
                batch: b,
                prompt_tokens: prompt_ids.len(),
                new_tokens,
                seconds,
                tokens_per_s: n as f64 / seconds,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked inverse CDF picks the id one running total picks, on a
    /// vocabulary-sized row with zero weights (never chosen) and ragged
    /// blocks, for targets spread over the whole mass; past the total it
    /// finds none.
    #[test]
    fn inverse_cdf_matches_one_running_total() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let w: Vec<f64> = (0..49_157).map(|i| if i % 97 == 0 { 0.0 } else { rng.random::<f64>().powi(8) }).collect();
        let total: f64 = w.iter().sum();
        for q in 0..2_000 {
            let target = total * (q as f64 + rng.random::<f64>()) / 2_000.0;
            let mut acc = 0.0;
            let want = w.iter().position(|&wt| {
                acc += wt;
                target < acc && wt > 0.0
            });
            assert_eq!(inverse_cdf(&w, target), want, "target {target}");
        }
        assert_eq!(inverse_cdf(&w, total * 1.000_001), None);
        assert_eq!(inverse_cdf(&[0.0, 0.0, 1.0], 0.0), Some(2));
    }
}
