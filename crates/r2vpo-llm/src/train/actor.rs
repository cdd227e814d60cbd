//! The rollout half of an iteration: draw the next problems in the seeded
//! data order → sample G responses each from the rollout source → verify →
//! group-relative advantages → one [`GroupEntry`] per group.
//!
//! [`Trainer`](super::Trainer) runs it in-process before every update
//! (`llm train`); the asynchronous actors (`llm train --async`) run it on
//! their own copy of the policy and publish the entries to an
//! [`ExperienceQueue`](crate::queue::ExperienceQueue). Both go through
//! [`Actor::produce`], so the two modes cannot drift apart.
//!
//! A *batch* is one iteration's worth of problems: batch `b` holds the
//! `prompts_per_iter` problems that follow batch `b − 1` in the data order,
//! and its responses are seeded from `(seed, b)`. In the synchronous trainer
//! batch `b` is iteration `b`.

use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use r2vpo::advantage::group_relative;

use super::config::{BehaviourLogprobs, RolloutBackend, TrainConfig};
use super::{derived_seed, shuffle, DataPosition, RewardFn, TrainError, TrainResult, STREAM_DATA, STREAM_ROLLOUT};
use crate::backend::Policy;
use crate::chat::ChatTemplate;
use crate::data::{Fitted, Problem, PromptFitter};
use crate::queue::{GroupEntry, ENTRY_SCHEMA};
use crate::rollout::{GroupRequest, LocalRollout, RolloutCounters, RolloutSource};
use crate::sample::{request_seed, FinishReason, Generation};
use crate::tokenizer::Tokenizer;

/// A training problem's prompt, built on first use.
#[derive(Clone, Debug)]
enum PromptSlot {
    /// Not built yet.
    Unknown,
    /// The prompt's ids (truncated if `overlong_prompts = "truncate"`).
    Ready(Vec<u32>),
    /// Over-long: never drawn.
    Skipped,
}

/// Which part of a batch one rank of a data-parallel job samples: the
/// in-process sampler's calls over the batch (`rollout_batch` sequences of
/// whole groups each) are dealt round-robin, call `c` to rank `c mod world`,
/// so every call holds the groups, seeds and shapes it holds in one process
/// and decodes the same tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchShare {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
}

impl BatchShare {
    /// The whole batch (one process).
    pub const WHOLE: BatchShare = BatchShare { rank: 0, world: 1 };

    /// How many of `world` ranks get at least one sampler call of an
    /// iteration whose `prompts` groups are decoded `per_call` groups a call.
    pub fn sampling_ranks(prompts: usize, per_call: usize, world: usize) -> usize {
        prompts.div_ceil(per_call.max(1)).min(world)
    }

    /// The largest `rollout_batch` that gives each of `world` ranks at least
    /// one sampler call of `prompts` groups of `group_size` (⌊prompts /
    /// world⌋ groups a call make at least `world` calls); `None` when there
    /// are fewer groups than ranks, since a group is never split.
    pub fn rollout_batch_for_every_rank(prompts: usize, group_size: usize, world: usize) -> Option<usize> {
        (prompts >= world).then(|| (prompts / world.max(1)) * group_size)
    }

    /// Whether sampler call `call` of the batch is this rank's.
    pub fn takes(&self, call: usize) -> bool {
        call % self.world.max(1) == self.rank
    }
}

/// What one call of [`Actor::produce`] made.
#[derive(Clone, Debug)]
pub struct Produced {
    /// One entry per problem of this share, in data order.
    pub entries: Vec<GroupEntry>,
    /// Each entry's position in the batch (`0..prompts_per_iter` for the
    /// whole batch).
    pub positions: Vec<usize>,
    /// Seconds spent drawing problems and sampling (the `rollout_s` timing).
    pub rollout_s: f64,
}

/// Turns batches of problems into verified, advantage-weighted groups.
pub struct Actor {
    cfg: TrainConfig,
    tok: Tokenizer,
    chat: ChatTemplate,
    problems: Vec<Problem>,
    prompt_cache: Vec<PromptSlot>,
    /// Fits training prompts into the context (`overlong_prompts`).
    fitter: PromptFitter,
    /// Distinct training problems found over-long and skipped so far.
    prompts_skipped: usize,
    /// Distinct training problems whose prompt was truncated so far.
    prompts_truncated: usize,
    /// Where warnings go (stderr unless [`Actor::set_warning_handler`]).
    warn: Box<dyn FnMut(&str) + Send + Sync>,
    /// `events.jsonl` lines not yet taken by the owner.
    events: Vec<serde_json::Value>,
    reward_fn: Arc<dyn RewardFn>,
    /// The policy's context length.
    context: usize,
    /// Where rollouts come from.
    source: Box<dyn RolloutSource>,
    /// The weight version the source samples from, once synced.
    synced: Option<u64>,
    /// The source's counters at the last `rollout_faults` event.
    counters_seen: RolloutCounters,
}

impl Actor {
    /// An actor over `problems` with the in-process sampler. `context` is
    /// the policy's context length (prompt + response must fit in it).
    pub fn new(
        cfg: TrainConfig,
        tok: Tokenizer,
        problems: Vec<Problem>,
        reward_fn: Arc<dyn RewardFn>,
        context: usize,
    ) -> TrainResult<Self> {
        let chat = ChatTemplate::from_tokenizer(&tok)?;
        let fitter = PromptFitter::new(
            &tok,
            &chat,
            cfg.template,
            cfg.enable_thinking,
            context,
            cfg.sampling.max_new_tokens,
            cfg.overlong_prompts,
        )?;
        let source = Box::new(LocalRollout::new(cfg.rollout_batch));
        Ok(Actor {
            prompt_cache: vec![PromptSlot::Unknown; problems.len()],
            fitter,
            prompts_skipped: 0,
            prompts_truncated: 0,
            warn: Box::new(|w: &str| eprintln!("warning: {w}")),
            events: Vec::new(),
            reward_fn,
            context,
            source,
            synced: None,
            counters_seen: RolloutCounters::default(),
            cfg,
            tok,
            chat,
            problems,
        })
    }

    /// A fresh actor over the same problems, reward and config, with its
    /// own prompt cache, counters and in-process sampler (an actor thread).
    pub fn fork(&self) -> TrainResult<Actor> {
        Actor::new(self.cfg.clone(), self.tok.clone(), self.problems.clone(), self.reward_fn.clone(), self.context)
    }

    /// The training problems.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Distinct training problems skipped so far (over-long prompts).
    pub fn prompts_skipped(&self) -> usize {
        self.prompts_skipped
    }

    /// Distinct training problems whose prompt was truncated so far.
    pub fn prompts_truncated(&self) -> usize {
        self.prompts_truncated
    }

    /// Sends warnings to `f` instead of stderr.
    pub fn set_warning_handler(&mut self, f: impl FnMut(&str) + Send + Sync + 'static) {
        self.warn = Box::new(f);
    }

    /// Says `msg` where this actor's warnings go.
    pub(crate) fn warn(&mut self, msg: &str) {
        (self.warn)(msg)
    }

    /// Samples from `source` instead of in-process; refused when its
    /// log-probs do not mean what `behaviour_logprobs` needs
    /// ([`TrainConfig::check_logprobs`]).
    pub fn set_rollout_source(&mut self, source: Box<dyn RolloutSource>) -> TrainResult<()> {
        self.cfg.check_logprobs(source.logprobs_mode())?;
        self.source = source;
        self.synced = None;
        Ok(())
    }

    /// The rollout source's counters (requests, retries, failures, pushes).
    pub fn rollout_counters(&self) -> RolloutCounters {
        self.source.counters()
    }

    /// The `events.jsonl` lines written since the last call (skipped and
    /// truncated prompts, rollout faults), for the owner to log.
    pub fn take_events(&mut self) -> Vec<serde_json::Value> {
        std::mem::take(&mut self.events)
    }

    /// The next `n` problem indices after `data` in the seeded per-epoch
    /// order, passing over problems whose prompt does not fit the context;
    /// advances `data`. An over-long prompt met here is reported as part of
    /// `batch` unless `quiet` (an actor stepping over another actor's
    /// batches). Fails only when every problem is skipped.
    pub fn next_problems(
        &mut self,
        data: &mut DataPosition,
        n: usize,
        batch: u64,
        quiet: bool,
    ) -> TrainResult<Vec<usize>> {
        let len = self.problems.len();
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if self.prompts_skipped == len {
                return Err(TrainError::Config {
                    field: "data".into(),
                    message: format!(
                        "all {len} training problems were skipped: their prompts exceed the model's context of {} \
                         tokens minus sampling.max_new_tokens {} (see the `prompt_skipped` lines of events.jsonl); \
                         shorten the questions, lower sampling.max_new_tokens or set overlong_prompts = \"truncate\"",
                        self.fitter.context(),
                        self.cfg.sampling.max_new_tokens
                    ),
                });
            }
            let mut order: Vec<usize> = (0..len).collect();
            let mut rng = ChaCha8Rng::seed_from_u64(derived_seed(self.cfg.seed, STREAM_DATA, data.epoch));
            shuffle(&mut order, &mut rng);
            while out.len() < n && data.cursor < len {
                let p = order[data.cursor];
                data.cursor += 1;
                if self.usable(p, batch, quiet)? {
                    out.push(p);
                }
            }
            if data.cursor == len {
                data.epoch += 1;
                data.cursor = 0;
            }
        }
        Ok(out)
    }

    /// Whether `problem`'s prompt fits the context (possibly after
    /// truncation). The first time a problem is seen its prompt is built and
    /// cached; an over-long one is warned about, logged and counted once
    /// (not at all when `quiet`).
    fn usable(&mut self, problem: usize, batch: u64, quiet: bool) -> TrainResult<bool> {
        match self.prompt_cache[problem] {
            PromptSlot::Ready(_) => return Ok(true),
            PromptSlot::Skipped => return Ok(false),
            PromptSlot::Unknown => {}
        }
        let fitted = self.fitter.fit(&self.tok, &self.chat, &self.problems[problem].question)?;
        let id = self.problems[problem].id.clone();
        let (slot, event, prompt_tokens) = match fitted {
            Fitted::Fits(ids) => (PromptSlot::Ready(ids), None, 0),
            Fitted::Truncated { ids, prompt_tokens } => {
                self.prompts_truncated += 1;
                (PromptSlot::Ready(ids), Some(("prompt_truncated", "truncated", self.prompts_truncated)), prompt_tokens)
            }
            Fitted::Skipped { prompt_tokens } => {
                self.prompts_skipped += 1;
                (PromptSlot::Skipped, Some(("prompt_skipped", "skipped", self.prompts_skipped)), prompt_tokens)
            }
        };
        if let (Some((event, verb, total)), false) = (event, quiet) {
            let max = self.fitter.max_prompt_tokens();
            (self.warn)(&format!(
                "{}: problem `{}`: prompt of {prompt_tokens} tokens exceeds {max} (context {} − max_new_tokens {}); \
                 {verb} ({total} so far)",
                self.cfg.data.path,
                id,
                self.fitter.context(),
                self.cfg.sampling.max_new_tokens
            ));
            self.events.push(serde_json::json!({
                "event": event,
                "iteration": batch,
                "data": self.cfg.data.path,
                "problem": id,
                "prompt_tokens": prompt_tokens,
                "max_prompt_tokens": max,
                "context": self.fitter.context(),
                "total": total,
            }));
        }
        let ok = matches!(slot, PromptSlot::Ready(_));
        self.prompt_cache[problem] = slot;
        Ok(ok)
    }

    /// The (fitted) prompt of a problem that [`Actor::usable`] accepted.
    fn prompt_ids(&mut self, problem: usize, batch: u64) -> TrainResult<Vec<u32>> {
        if !self.usable(problem, batch, false)? {
            return Err(TrainError::Config {
                field: "data".into(),
                message: format!("problem `{}` has an over-long prompt", self.problems[problem].id),
            });
        }
        match &self.prompt_cache[problem] {
            PromptSlot::Ready(ids) => Ok(ids.clone()),
            _ => unreachable!("usable() leaves a ready prompt"),
        }
    }

    /// Samples G responses for each of `problems` (position in the batch,
    /// problem) from the rollout source, first pushing `policy` as weight
    /// version `version` when a sync is due (every version in-process;
    /// every `rollout.sync_every` for servers). Sample `j` of the batch is
    /// seeded `request_seed(batch seed, j)`. Returns each response with its
    /// problem and weight version.
    fn rollout(
        &mut self,
        policy: &dyn Policy,
        batch: u64,
        problems: &[(usize, usize)],
        version: u64,
    ) -> TrainResult<Vec<(usize, Generation, u64)>> {
        let every = match self.cfg.rollout.backend {
            RolloutBackend::Local => 1,
            RolloutBackend::Http => self.cfg.rollout.sync_every as u64,
        };
        if self.synced.is_none_or(|v| version.saturating_sub(v) >= every) {
            self.source.sync_weights(&crate::rollout::WeightSnapshot::new(policy, version), &self.tok)?;
            self.synced = Some(version);
        }
        let g = self.cfg.group_size;
        let base = derived_seed(self.cfg.seed, STREAM_ROLLOUT, batch);
        let mut groups = Vec::with_capacity(problems.len());
        for &(k, p) in problems {
            let seeds = (0..g).map(|i| request_seed(base, (k * g + i) as u64)).collect();
            groups.push(GroupRequest { prompt_ids: self.prompt_ids(p, batch)?, seeds });
        }
        let rollouts = self.source.generate(policy, &self.tok, &groups, &self.cfg.sampling)?;
        let mut out = Vec::with_capacity(problems.len() * g);
        for (&(_, p), r) in problems.iter().zip(rollouts) {
            out.extend(r.generations.into_iter().map(|gen| (p, gen, r.weight_version)));
        }
        Ok(out)
    }

    /// Logs a `rollout_faults` event (and a warning) when the rollout
    /// source retried or failed since the last one: this batch's counts and
    /// the totals (requests, retries, failures by kind).
    pub fn log_rollout_faults(&mut self, batch: u64) {
        let now = self.source.counters();
        let before = &self.counters_seen;
        let failures: std::collections::BTreeMap<&String, u64> = now
            .failures
            .iter()
            .map(|(k, v)| (k, v - before.failures.get(k).copied().unwrap_or(0)))
            .filter(|(_, d)| *d > 0)
            .collect();
        if now.retries > before.retries || !failures.is_empty() {
            let kinds: Vec<String> = failures.iter().map(|(k, v)| format!("{k} {v}")).collect();
            (self.warn)(&format!(
                "rollout from {}: {} retries, failures: {} (last: {})",
                self.source.describe(),
                now.retries - before.retries,
                if kinds.is_empty() { "none".to_string() } else { kinds.join(", ") },
                now.last_failure.as_deref().unwrap_or("-")
            ));
            self.events.push(serde_json::json!({
                "event": "rollout_faults",
                "iteration": batch,
                "source": self.source.describe(),
                "retries": now.retries - before.retries,
                "failures": failures,
                "total": now,
            }));
        }
        self.counters_seen = now;
    }

    /// Batch `batch`: its problems (the ones after `data`, which advances),
    /// G responses each from `policy` at weight version `version`, their
    /// rewards and group-relative advantages — for the groups of `share`
    /// only (every rank draws the whole batch's problems, so `data`
    /// advances alike on every rank). A failed rollout leaves `data` where
    /// it was, so the batch can be drawn again.
    pub fn produce(
        &mut self,
        policy: &dyn Policy,
        batch: u64,
        data: &mut DataPosition,
        version: u64,
        share: BatchShare,
    ) -> TrainResult<Produced> {
        let t_start = Instant::now();
        let g = self.cfg.group_size;
        let data_before = *data;
        let per_call = crate::rollout::local_groups_per_call(self.cfg.rollout_batch, g);
        let problems: Vec<(usize, usize)> = self
            .next_problems(data, self.cfg.prompts_per_iter, batch, false)?
            .into_iter()
            .enumerate()
            .filter(|(k, _)| share.takes(k / per_call))
            .collect();
        let gens = match self.rollout(policy, batch, &problems, version) {
            Ok(g) => g,
            Err(e) => {
                *data = data_before;
                return Err(e);
            }
        };
        self.log_rollout_faults(batch);
        let rollout_s = t_start.elapsed().as_secs_f64();

        let mut entries = Vec::with_capacity(problems.len());
        for (k, group) in gens.chunks(g).enumerate() {
            let p = problems[k].1;
            let mut e = GroupEntry {
                schema: ENTRY_SCHEMA,
                iteration: batch,
                problem: p,
                prompt_ids: self.prompt_ids(p, batch)?,
                responses: Vec::with_capacity(g),
                behaviour_logp: Vec::with_capacity(g),
                rewards: Vec::with_capacity(g),
                correct: Vec::with_capacity(g),
                advantages: Vec::new(),
                truncated: Vec::with_capacity(g),
                entropy_sum: Vec::with_capacity(g),
                entropy_tokens: Vec::with_capacity(g),
                weight_version: group.first().map_or(version, |(_, _, v)| *v),
            };
            for (_, gen, _) in group {
                let mut s = self.reward_fn.score(&self.problems[p], gen);
                s.reward += overlong_shaping(
                    gen.token_ids.len(),
                    self.cfg.sampling.max_new_tokens,
                    self.cfg.overlong_buffer,
                    self.cfg.overlong_penalty,
                );
                e.responses.push(gen.token_ids.clone());
                e.behaviour_logp.push(match self.cfg.behaviour_logprobs {
                    BehaviourLogprobs::Sampled => gen.logprobs.clone(),
                    _ => gen.model_logprobs.clone(),
                });
                e.rewards.push(s.reward as f32);
                e.correct.push(s.correct);
                e.truncated.push(gen.finish_reason == FinishReason::Length);
                e.entropy_sum.push(gen.entropy.iter().map(|&x| f64::from(x)).sum());
                e.entropy_tokens.push(gen.entropy.len() as u32);
            }
            e.advantages = group_relative(&e.rewards, g, &self.cfg.group_norm)?;
            entries.push(e);
        }
        Ok(Produced { entries, positions: problems.iter().map(|&(k, _)| k).collect(), rollout_s })
    }
}

/// DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13, as verl's
/// `DAPORewardManager` computes it): 0 up to `max_len − buffer` tokens, then
/// falling linearly to `−penalty` at `max_len` (a response cut at the limit).
/// `buffer = 0` turns it off.
pub fn overlong_shaping(len: usize, max_len: usize, buffer: usize, penalty: f64) -> f64 {
    if buffer == 0 {
        return 0.0;
    }
    let exceed = len as f64 - (max_len - buffer) as f64;
    (-exceed / buffer as f64 * penalty).min(0.0)
}

#[cfg(test)]
mod shaping_tests {
    use super::overlong_shaping;

    #[test]
    fn overlong_shaping_is_dapos_eq_13() {
        // DAPO's setting: L_max 20480, L_cache 4096.
        let f = |len| overlong_shaping(len, 20480, 4096, 1.0);
        assert_eq!(f(100), 0.0);
        assert_eq!(f(16384), 0.0);
        assert_eq!(f(16384 + 1024), -0.25);
        assert_eq!(f(20480), -1.0);
        assert_eq!(overlong_shaping(20480, 20480, 4096, 0.5), -0.5);
        assert_eq!(overlong_shaping(20480, 20480, 0, 1.0), 0.0, "off");
    }
}

#[cfg(test)]
mod share_tests {
    use super::BatchShare;
    use crate::rollout::local_groups_per_call;

    /// The advice the trainer gives when ranks sit out the rollout is
    /// right: the suggested `rollout_batch` gives every rank a call, for
    /// every small shape, and the 8-rank recipe's shape is caught.
    #[test]
    fn the_suggested_rollout_batch_gives_every_rank_a_call() {
        for world in 1..=9 {
            for prompts in 1..=40 {
                for g in [1, 2, 8] {
                    match BatchShare::rollout_batch_for_every_rank(prompts, g, world) {
                        Some(rb) => {
                            let per_call = local_groups_per_call(rb, g);
                            assert_eq!(BatchShare::sampling_ranks(prompts, per_call, world), world);
                            let calls: Vec<usize> = (0..prompts.div_ceil(per_call)).collect();
                            for rank in 0..world {
                                assert!(calls.iter().any(|&c| BatchShare { rank, world }.takes(c)));
                            }
                        }
                        None => assert!(prompts < world),
                    }
                }
            }
        }
        // 32 prompts × G 8 with rollout_batch 64 on 8 ranks: 4 calls.
        assert_eq!(BatchShare::sampling_ranks(32, local_groups_per_call(64, 8), 8), 4);
        assert_eq!(BatchShare::rollout_batch_for_every_rank(32, 8, 8), Some(32));
    }
}
