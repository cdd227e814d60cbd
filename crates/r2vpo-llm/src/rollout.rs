//! The rollout seam: where a trainer's samples come from.
//!
//! [`RolloutSource`] has one implementation per real thing: [`LocalRollout`]
//! samples in-process with the policy's own backend ([`Policy::generate`];
//! the embedded default), and the HTTP client of
//! `r2vpo serve` / vLLM / SGLang lives in the `r2vpo-serve` crate, so this
//! crate stays free of network code.
//!
//! A source answers groups (one prompt, `n` samples), each tagged with the
//! weight version that produced it; [`RolloutSource::sync_weights`] makes
//! the source sample from the learner's current policy.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::backend::Policy;
use crate::sample::{Generation, GenerationRequest, SamplingConfig};
use crate::tokenizer::Tokenizer;

/// One prompt to sample once per seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRequest {
    /// Prompt token ids (chat template applied).
    pub prompt_ids: Vec<u32>,
    /// One seed per sample (G of them). The in-process source seeds sample
    /// `i` with `seeds[i]`; an OpenAI-style server takes one seed per
    /// request, so the HTTP source sends `seeds[0]` and the server derives
    /// the samples' streams from it (reproducible per server, not equal to
    /// the in-process tokens).
    pub seeds: Vec<u64>,
}

impl GroupRequest {
    /// Samples wanted.
    pub fn n(&self) -> usize {
        self.seeds.len()
    }
}

/// The samples of one group and the policy version that produced them.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupRollout {
    /// `n` generations, text decoded.
    pub generations: Vec<Generation>,
    /// Weight version (the learner's iteration count when it pushed them).
    pub weight_version: u64,
}

/// What the per-token log-probs a source returns mean (the denominator of
/// the policy ratio must compare like with like, see [`crate::sample`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogprobsMode {
    /// log softmax(logits): the untruncated temperature-1 model log-prob
    /// (vLLM V1's default `raw_logprobs`; [`Generation::model_logprobs`]).
    Raw,
    /// log q(token) under the distribution actually sampled from, after
    /// temperature, top-k and top-p (vLLM's `processed_logprobs`;
    /// [`Generation::logprobs`]).
    Processed,
    /// Both are known exactly (the in-process sampler).
    Both,
}

/// Errors of a rollout source.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// In-process sampling failed.
    #[error(transparent)]
    Sample(#[from] crate::sample::SampleError),
    /// Every server is unreachable or failing; nothing was generated.
    #[error("no rollout server is available: {0}")]
    Unavailable(String),
    /// A server answered something the contract does not allow.
    #[error("rollout server {url}: {message}")]
    Protocol {
        /// The server.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// Writing or pushing weights failed.
    #[error("weight push: {0}")]
    Push(String),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Counters a source reports into the trainer's metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutCounters {
    /// Requests sent (first tries and retries).
    pub requests: u64,
    /// Retries after a failed request.
    pub retries: u64,
    /// Failed requests by kind (`connect`, `timeout`, `http_5xx`, `protocol`…).
    pub failures: std::collections::BTreeMap<String, u64>,
    /// Weight pushes done.
    pub pushes: u64,
    /// Seconds spent writing and pushing weights.
    pub push_s: f64,
    /// The message of the latest failure.
    pub last_failure: Option<String>,
}

/// Where samples come from.
pub trait RolloutSource: Send {
    /// A short description for logs (`local`, `http 127.0.0.1:8000,…`).
    fn describe(&self) -> String;

    /// What the returned log-probs mean.
    fn logprobs_mode(&self) -> LogprobsMode;

    /// Samples every group with `sampling` (its `seed` is ignored: groups
    /// carry theirs) and decodes the texts with `tok`. `policy` is the
    /// learner's current policy (used by in-process sources only).
    fn generate(
        &mut self,
        policy: &dyn Policy,
        tok: &Tokenizer,
        groups: &[GroupRequest],
        sampling: &SamplingConfig,
    ) -> Result<Vec<GroupRollout>, RolloutError>;

    /// Makes later rollouts come from `policy` as weight version `version`
    /// (a source that samples elsewhere takes `policy.export(version)`).
    fn sync_weights(&mut self, policy: &dyn Policy, tok: &Tokenizer, version: u64) -> Result<(), RolloutError>;

    /// The counters so far.
    fn counters(&self) -> RolloutCounters {
        RolloutCounters::default()
    }
}

/// In-process sampling with the learner's own model: always current, so a
/// sync only records the version. Groups are decoded `batch` sequences at a
/// time without splitting a group, so a group's identical prompts share one
/// prefill — exactly the trainer's historical rollout, bit for bit.
pub struct LocalRollout {
    batch: usize,
    version: u64,
}

impl LocalRollout {
    /// A local source decoding up to `batch` sequences together.
    pub fn new(batch: usize) -> Self {
        LocalRollout { batch, version: 0 }
    }
}

impl RolloutSource for LocalRollout {
    fn describe(&self) -> String {
        "local".into()
    }

    fn logprobs_mode(&self) -> LogprobsMode {
        LogprobsMode::Both
    }

    fn generate(
        &mut self,
        policy: &dyn Policy,
        tok: &Tokenizer,
        groups: &[GroupRequest],
        sampling: &SamplingConfig,
    ) -> Result<Vec<GroupRollout>, RolloutError> {
        let reqs: Vec<GenerationRequest> = groups
            .iter()
            .flat_map(|g| g.seeds.iter().map(|&seed| GenerationRequest { prompt_ids: g.prompt_ids.clone(), seed }))
            .collect();
        let per = groups.first().map_or(1, |g| g.n().max(1));
        let chunk = (self.batch / per).max(1) * per;
        let mut gens = Vec::with_capacity(reqs.len());
        for part in reqs.chunks(chunk) {
            gens.extend(policy.generate(tok, part, sampling)?);
        }
        let mut it = gens.into_iter();
        Ok(groups
            .iter()
            .map(|g| GroupRollout { generations: it.by_ref().take(g.n()).collect(), weight_version: self.version })
            .collect())
    }

    fn sync_weights(&mut self, _: &dyn Policy, _: &Tokenizer, version: u64) -> Result<(), RolloutError> {
        self.version = version;
        Ok(())
    }
}
