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

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::Tensor;

use serde::{Deserialize, Serialize};

use crate::backend::Policy;
use crate::sample::{Generation, GenerationRequest, SamplingConfig};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

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
    /// Bytes of the weight folders written for pushes.
    pub push_bytes: u64,
    /// The message of the latest failure.
    pub last_failure: Option<String>,
}

/// The learner's weights at one version, exported on first use: a source
/// that samples elsewhere takes the [`Weights`] (a copy the learner's next
/// step does not touch); the in-process source, which samples from the
/// live policy, takes only the version and costs no copy.
pub struct WeightSnapshot<'a> {
    policy: &'a dyn Policy,
    version: u64,
    exported: std::cell::OnceCell<Weights>,
}

impl<'a> WeightSnapshot<'a> {
    /// `policy`'s weights as version `version`, not exported yet.
    pub fn new(policy: &'a dyn Policy, version: u64) -> Self {
        WeightSnapshot { policy, version, exported: std::cell::OnceCell::new() }
    }

    /// The weight version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The model's description.
    pub fn config(&self) -> &crate::model::ModelConfig {
        self.policy.config()
    }

    /// The adapters' configuration and values (PEFT names) where the
    /// learner trains adapters; `None` otherwise.
    pub fn adapter(&self) -> crate::model::Result<Option<(&crate::model::LoraConfig, HashMap<String, Tensor>)>> {
        match (self.policy.lora(), self.policy.export_adapter()?) {
            (Some(lora), Some(tensors)) => Ok(Some((lora, tensors))),
            _ => Ok(None),
        }
    }

    /// The weights, exported from the policy on the first call.
    pub fn weights(&self) -> crate::model::Result<&Weights> {
        if let Some(w) = self.exported.get() {
            return Ok(w);
        }
        let w = self.policy.export(self.version)?;
        Ok(self.exported.get_or_init(|| w))
    }
}

/// Where samples come from.
pub trait RolloutSource: Send {
    /// A short description for logs (`local`, `http 127.0.0.1:8000,…`).
    fn describe(&self) -> String;

    /// What the returned log-probs mean.
    fn logprobs_mode(&self) -> LogprobsMode;

    /// Samples every group with `sampling` (its `seed` is ignored: groups
    /// carry theirs) and decodes the texts with `tok`. `policy` is the
    /// learner's live policy: the in-process source samples from it without
    /// a copy; a source that samples elsewhere has what it needs from its
    /// last [`RolloutSource::sync_weights`] and does not read it.
    fn generate(
        &mut self,
        policy: &dyn Policy,
        tok: &Tokenizer,
        groups: &[GroupRequest],
        sampling: &SamplingConfig,
    ) -> Result<Vec<GroupRollout>, RolloutError>;

    /// Makes later rollouts come from the learner's weights of `snapshot`
    /// (a source that samples elsewhere takes [`WeightSnapshot::weights`];
    /// the in-process source only its version). `tok` is the tokenizer a
    /// served model folder needs beside its weights.
    fn sync_weights(&mut self, snapshot: &WeightSnapshot<'_>, tok: &Tokenizer) -> Result<(), RolloutError>;

    /// The counters so far.
    fn counters(&self) -> RolloutCounters {
        RolloutCounters::default()
    }
}

/// How many whole groups of `group_size` sequences the in-process sampler
/// decodes in one call of at most `batch` sequences (at least one group).
pub fn local_groups_per_call(batch: usize, group_size: usize) -> usize {
    (batch / group_size.max(1)).max(1)
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
        let chunk = local_groups_per_call(self.batch, per) * per;
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

    fn sync_weights(&mut self, snapshot: &WeightSnapshot<'_>, _: &Tokenizer) -> Result<(), RolloutError> {
        self.version = snapshot.version();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::candle::Transformer;
    use crate::model::{Architecture, ModelConfig};

    /// The in-process source takes the version without exporting; a source
    /// that asks for the weights gets one export, the same on every call.
    #[test]
    fn a_snapshot_exports_once_and_only_when_asked() {
        let cfg = ModelConfig::tiny(Architecture::Llama, 16, 8, 16, 1, 2, 1, true);
        let m = Transformer::new_random(cfg, 1, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let tok = Tokenizer::load(&root.join(crate::train::config::EMBEDDED_MODEL)).unwrap();
        let snapshot = WeightSnapshot::new(&m, 7);
        let mut local = LocalRollout::new(4);
        local.sync_weights(&snapshot, &tok).unwrap();
        assert_eq!(local.version, 7);
        assert!(snapshot.exported.get().is_none(), "the local source exported the weights");
        let first: *const Weights = snapshot.weights().unwrap();
        let again: *const Weights = snapshot.weights().unwrap();
        assert_eq!(first, again);
        assert_eq!(snapshot.weights().unwrap().version, 7);
    }
}
