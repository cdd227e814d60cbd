//! FIFO replay over the last K iterations, for R²VPO-OFF (Algorithm 2).
//!
//! Each training iteration pushes the experience its rollout produced, tagged
//! with the policy version that generated it; the buffer keeps the newest
//! `capacity_iters` iterations (the paper: FIFO, 4 iterations) and the
//! learner draws minibatches uniformly over all stored items (the paper:
//! "we sample mini-batches uniformly from D"). The stored behaviour
//! log-probabilities make the ratio ρ = π_θ/π_off correct for stale items;
//! the staleness reported with each sample is for logging and analysis.
//!
//! The buffer is generic over the payload: the LLM trainer stores
//! ⟨prompt, response, reward, advantage, log π_off⟩ per response, a control
//! trainer would store transitions. The whole buffer, including the sampler's
//! RNG state, is serialisable, so a checkpointed run resumes drawing exactly
//! the samples it would have drawn without the interruption.

use std::collections::VecDeque;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Replay settings (the `[replay]` table of a run config).
///
/// Defaults follow the paper's LLM off-policy settings (Appendix C, Part I):
/// FIFO over 4 iterations, update-to-data ratio 2, uniform sampling.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayConfig {
    /// Number of most recent iterations kept (K).
    pub capacity_iters: usize,
    /// Update-to-data ratio: items drawn for training per new item. Because
    /// an item stays in the buffer for K iterations and each iteration draws
    /// `utd × new_items` samples from a buffer of about `K × new_items`
    /// items, this is also the expected number of times each item is used.
    pub utd: f64,
    /// Items per minibatch (one optimizer step). The default 1024 is the
    /// paper's global batch of 128 prompts × G = 8 responses, with one item
    /// per response.
    pub minibatch_size: usize,
    /// Seed of the sampler's RNG.
    pub seed: u64,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig { capacity_iters: 4, utd: 2.0, minibatch_size: 1024, seed: 0 }
    }
}

impl ReplayConfig {
    /// Checks ranges; errors name the field as `replay.<field>`.
    pub fn validate(&self) -> Result<()> {
        check_capacity(self.capacity_iters)?;
        check_utd(self.utd)?;
        check_minibatch(self.minibatch_size)
    }

    /// [`updates_per_iteration`] with this configuration's UTD and
    /// minibatch size.
    pub fn updates_per_iteration(&self, new_items: usize) -> Result<usize> {
        updates_per_iteration(new_items, self.utd, self.minibatch_size)
    }
}

fn check_capacity(capacity_iters: usize) -> Result<()> {
    if capacity_iters == 0 {
        return Err(Error::InvalidConfig {
            field: "replay.capacity_iters".into(),
            message: "must be >= 1 (1 keeps only the newest iteration)".into(),
        });
    }
    Ok(())
}

fn check_utd(utd: f64) -> Result<()> {
    if !(utd.is_finite() && utd > 0.0) {
        return Err(Error::InvalidConfig {
            field: "replay.utd".into(),
            message: format!("must be finite and > 0, got {utd}"),
        });
    }
    Ok(())
}

fn check_minibatch(minibatch_size: usize) -> Result<()> {
    if minibatch_size == 0 {
        return Err(Error::InvalidConfig { field: "replay.minibatch_size".into(), message: "must be >= 1".into() });
    }
    Ok(())
}

/// Number of minibatches (optimizer steps, the M of Algorithm 2) to draw
/// after `new_items` fresh items were pushed:
/// `⌈utd × new_items / minibatch_size⌉`.
///
/// Rounding up guarantees at least `utd × new_items` items are drawn, so a
/// small iteration still gets a step. A quotient within 10⁻⁹ (relative) of
/// an integer is taken as that integer, so that float noise in `utd` (e.g.
/// 0.1 × 30 = 3.0000000000000004) does not add a spurious extra step.
/// `new_items == 0` gives 0.
pub fn updates_per_iteration(new_items: usize, utd: f64, minibatch_size: usize) -> Result<usize> {
    check_utd(utd)?;
    check_minibatch(minibatch_size)?;
    let exact = utd * new_items as f64 / minibatch_size as f64;
    let nearest = exact.round();
    let steps = if (exact - nearest).abs() <= 1e-9 * nearest.max(1.0) { nearest } else { exact.ceil() };
    Ok(steps as usize)
}

/// The items one iteration's rollout produced, with the policy version that
/// generated them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterationBatch<T> {
    /// Version (e.g. the optimizer-step count) of the behaviour policy.
    pub version: u64,
    /// The experience, one entry per sampleable item.
    pub items: Vec<T>,
}

/// Where a sampled item lives, and how old it is.
///
/// `iteration` is a position in the buffer (0 = oldest stored iteration), so
/// a `SampleRef` is valid only until the next [`ReplayBuffer::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SampleRef {
    /// Position of the iteration in the buffer, oldest first.
    pub iteration: usize,
    /// Index of the item within that iteration.
    pub index: usize,
    /// Policy version that generated the item.
    pub version: u64,
    /// `current_version − version`: how many policy updates old the item is.
    pub staleness: u64,
}

/// A sampled item borrowed from the buffer, with its provenance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled<'a, T> {
    /// The stored experience.
    pub item: &'a T,
    /// Location and age of the item.
    pub at: SampleRef,
}

/// FIFO buffer of the last `capacity_iters` iterations with a seeded uniform
/// sampler (Algorithm 2's 𝒟).
///
/// Sampling is uniform over **items**, not over iterations, so an iteration
/// with more items is drawn proportionally more often. Within one minibatch
/// items are drawn **without replacement** (a duplicate would only double
/// one item's weight and shrink the effective batch); successive minibatches
/// are independent, so an item can recur across minibatches.
///
/// Serialise the whole buffer (contents and RNG state) into a checkpoint to
/// resume sampling bit-exactly. The RNG state includes a 128-bit counter, so
/// use a format with `u128` support (JSON, bincode); TOML has none.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "ReplayBufferRepr<T>", bound(serialize = "T: Serialize", deserialize = "T: Deserialize<'de>"))]
pub struct ReplayBuffer<T> {
    capacity_iters: usize,
    iterations: VecDeque<IterationBatch<T>>,
    rng: ChaCha8Rng,
}

/// The serialised form, checked before it becomes a [`ReplayBuffer`] so a
/// corrupted or hand-edited checkpoint cannot break the FIFO invariant.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, bound = "T: Deserialize<'de>")]
struct ReplayBufferRepr<T> {
    capacity_iters: usize,
    iterations: VecDeque<IterationBatch<T>>,
    rng: ChaCha8Rng,
}

impl<T> TryFrom<ReplayBufferRepr<T>> for ReplayBuffer<T> {
    type Error = String;

    fn try_from(r: ReplayBufferRepr<T>) -> std::result::Result<Self, String> {
        if r.capacity_iters == 0 {
            return Err("replay buffer checkpoint: capacity_iters is 0".into());
        }
        if r.iterations.len() > r.capacity_iters {
            return Err(format!(
                "replay buffer checkpoint: {} iterations exceed capacity {}",
                r.iterations.len(),
                r.capacity_iters
            ));
        }
        Ok(ReplayBuffer { capacity_iters: r.capacity_iters, iterations: r.iterations, rng: r.rng })
    }
}

impl<T> ReplayBuffer<T> {
    /// An empty buffer keeping `capacity_iters` iterations, sampling with a
    /// `ChaCha8Rng` seeded from `seed`.
    pub fn new(capacity_iters: usize, seed: u64) -> Result<Self> {
        check_capacity(capacity_iters)?;
        Ok(ReplayBuffer {
            capacity_iters,
            iterations: VecDeque::with_capacity(capacity_iters + 1),
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// An empty buffer from a full configuration (validating all of it, so a
    /// bad `utd` is reported at start-up rather than at the first update).
    pub fn from_config(cfg: &ReplayConfig) -> Result<Self> {
        cfg.validate()?;
        Self::new(cfg.capacity_iters, cfg.seed)
    }

    /// Stores one iteration's items generated by policy `version`. Once the
    /// buffer holds `capacity_iters` iterations the oldest is evicted and
    /// returned (FIFO). An empty `items` still occupies a slot: the buffer
    /// holds the last K *iterations*, whatever they produced.
    pub fn push(&mut self, version: u64, items: Vec<T>) -> Option<IterationBatch<T>> {
        self.iterations.push_back(IterationBatch { version, items });
        if self.iterations.len() > self.capacity_iters {
            self.iterations.pop_front()
        } else {
            None
        }
    }

    /// Draws up to `n` distinct items uniformly over all stored items, in
    /// random order; `current_version` is the learner's policy version, used
    /// for staleness. Returns `min(n, len())` refs: fewer than `n` only
    /// while the buffer holds fewer items than a minibatch (e.g. the first
    /// iteration after zero-variance groups were filtered out), so the
    /// caller should normalise by what it got.
    ///
    /// Errors (and leaves the RNG untouched) if `current_version` is older
    /// than a stored item's version.
    pub fn sample_refs(&mut self, n: usize, current_version: u64) -> Result<Vec<SampleRef>> {
        if let Some(newest) = self.iterations.iter().map(|b| b.version).max() {
            if current_version < newest {
                return Err(Error::InvalidConfig {
                    field: "current_version".into(),
                    message: format!("{current_version} is older than stored policy version {newest}"),
                });
            }
        }
        let len = self.len();
        let amount = n.min(len);
        if amount == 0 {
            return Ok(Vec::new());
        }
        // starts[i] = flat index of the first item of iteration i.
        let mut starts = Vec::with_capacity(self.iterations.len());
        let mut acc = 0usize;
        for b in &self.iterations {
            starts.push(acc);
            acc += b.items.len();
        }
        let picks = rand::seq::index::sample(&mut self.rng, len, amount);
        Ok(picks
            .into_iter()
            .map(|flat| {
                // The last start ≤ flat; empty iterations share their start
                // with the next one, and partition_point skips past them.
                let iteration = starts.partition_point(|&s| s <= flat) - 1;
                let version = self.iterations[iteration].version;
                SampleRef { iteration, index: flat - starts[iteration], version, staleness: current_version - version }
            })
            .collect())
    }

    /// [`ReplayBuffer::sample_refs`], resolved to the items themselves.
    pub fn sample(&mut self, n: usize, current_version: u64) -> Result<Vec<Sampled<'_, T>>> {
        let refs = self.sample_refs(n, current_version)?;
        Ok(refs.into_iter().map(|at| Sampled { item: &self.iterations[at.iteration].items[at.index], at }).collect())
    }

    /// The item a [`SampleRef`] points to, if it is still in the buffer.
    pub fn get(&self, at: SampleRef) -> Option<&T> {
        self.iterations.get(at.iteration)?.items.get(at.index)
    }

    /// Total number of stored items.
    pub fn len(&self) -> usize {
        self.iterations.iter().map(|b| b.items.len()).sum()
    }

    /// Whether no items are stored (iterations with no items may be).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of stored iterations (at most `capacity_iters`).
    pub fn num_iterations(&self) -> usize {
        self.iterations.len()
    }

    /// The K of the FIFO.
    pub fn capacity_iters(&self) -> usize {
        self.capacity_iters
    }

    /// Stored iterations, oldest first.
    pub fn iterations(&self) -> impl ExactSizeIterator<Item = &IterationBatch<T>> + '_ {
        self.iterations.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer whose item `v * 100 + j` is the j-th item of version v, so
    /// every sample can be checked against its reported provenance.
    fn filled(sizes: &[usize], seed: u64) -> ReplayBuffer<u64> {
        let mut b = ReplayBuffer::new(4, seed).unwrap();
        for (v, &n) in sizes.iter().enumerate() {
            b.push(v as u64, (0..n as u64).map(|j| v as u64 * 100 + j).collect());
        }
        b
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = ReplayConfig::default();
        assert_eq!((c.capacity_iters, c.utd, c.minibatch_size), (4, 2.0, 1024));
        c.validate().unwrap();
        let field = |c: ReplayConfig| match c.validate().unwrap_err() {
            Error::InvalidConfig { field, .. } => field,
            e => panic!("{e:?}"),
        };
        assert_eq!(field(ReplayConfig { capacity_iters: 0, ..c }), "replay.capacity_iters");
        assert_eq!(field(ReplayConfig { utd: 0.0, ..c }), "replay.utd");
        assert_eq!(field(ReplayConfig { utd: -1.0, ..c }), "replay.utd");
        assert_eq!(field(ReplayConfig { utd: f64::NAN, ..c }), "replay.utd");
        assert_eq!(field(ReplayConfig { minibatch_size: 0, ..c }), "replay.minibatch_size");
        assert!(ReplayBuffer::<u8>::new(0, 1).is_err());
        assert!(ReplayBuffer::<u8>::from_config(&ReplayConfig { utd: 0.0, ..c }).is_err());
        let t: ReplayConfig = toml::from_str("utd = 1.5\nminibatch_size = 32\nseed = 7\n").unwrap();
        assert_eq!(t, ReplayConfig { utd: 1.5, minibatch_size: 32, seed: 7, capacity_iters: 4 });
        assert!(toml::from_str::<ReplayConfig>("capacity = 4").is_err());
    }

    #[test]
    fn utd_counts() {
        assert_eq!(updates_per_iteration(64, 2.0, 32).unwrap(), 4);
        assert_eq!(updates_per_iteration(1024, 2.0, 1024).unwrap(), 2);
        // 2·100/32 = 6.25 → 7; 1·33/32 → 2; 0.5·64/32 = 1.
        assert_eq!(updates_per_iteration(100, 2.0, 32).unwrap(), 7);
        assert_eq!(updates_per_iteration(33, 1.0, 32).unwrap(), 2);
        assert_eq!(updates_per_iteration(64, 0.5, 32).unwrap(), 1);
        assert_eq!(updates_per_iteration(10, 0.1, 32).unwrap(), 1);
        // Float noise: 0.1·30 = 3.0000000000000004, still exactly 1 step of 3.
        assert_eq!(updates_per_iteration(30, 0.1, 3).unwrap(), 1);
        assert_eq!(updates_per_iteration(0, 2.0, 32).unwrap(), 0);
        assert_eq!(ReplayConfig { minibatch_size: 32, ..Default::default() }.updates_per_iteration(64).unwrap(), 4);
        assert!(updates_per_iteration(64, 0.0, 32).is_err());
        assert!(updates_per_iteration(64, -2.0, 32).is_err());
        assert!(updates_per_iteration(64, f64::INFINITY, 32).is_err());
        assert!(updates_per_iteration(64, 2.0, 0).is_err());
    }

    #[test]
    fn fifo_eviction_keeps_last_four() {
        let mut b = ReplayBuffer::new(4, 0).unwrap();
        let mut evicted = Vec::new();
        for v in 0..6u64 {
            if let Some(old) = b.push(v, vec![v * 100, v * 100 + 1]) {
                evicted.push(old);
            }
            assert_eq!(b.num_iterations(), (v as usize + 1).min(4));
        }
        assert_eq!(
            evicted,
            vec![
                IterationBatch { version: 0, items: vec![0, 1] },
                IterationBatch { version: 1, items: vec![100, 101] }
            ]
        );
        assert_eq!(b.iterations().map(|it| it.version).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        assert_eq!(b.len(), 8);
        assert_eq!(b.capacity_iters(), 4);
    }

    #[test]
    fn samples_report_version_and_staleness() {
        let mut b = filled(&[2, 3, 0, 4, 5], 3); // version 0 evicted
        assert_eq!(b.len(), 12);
        let all = b.sample(100, 9).unwrap();
        assert_eq!(all.len(), 12); // clamped to what is stored
        let mut seen: Vec<u64> = all.iter().map(|s| *s.item).collect();
        for s in &all {
            assert_eq!(*s.item / 100, s.at.version);
            assert_eq!(s.at.staleness, 9 - s.at.version);
            assert_eq!(*s.item % 100, s.at.index as u64);
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![100, 101, 102, 300, 301, 302, 303, 400, 401, 402, 403, 404]);
        let refs = b.sample_refs(5, 4).unwrap();
        for r in refs {
            assert_eq!(*b.get(r).unwrap() / 100, r.version);
            assert_eq!(r.staleness, 4 - r.version);
        }
        // The learner cannot be older than its data.
        assert!(b.sample_refs(5, 3).is_err());
        assert!(b.sample(0, 9).unwrap().is_empty());
        assert!(ReplayBuffer::<u8>::new(2, 0).unwrap().sample(4, 0).unwrap().is_empty());
    }

    #[test]
    fn no_duplicates_within_a_minibatch() {
        let mut b = filled(&[10, 10, 10], 11);
        for _ in 0..200 {
            let mut items: Vec<u64> = b.sample(16, 2).unwrap().iter().map(|s| *s.item).collect();
            items.sort_unstable();
            items.dedup();
            assert_eq!(items.len(), 16);
        }
    }

    /// Chi-square over items of unequal iterations: uniform over items, not
    /// over iterations. 19 degrees of freedom; the without-replacement
    /// correction makes the expected statistic ≈ 19·(1 − 5/20) ≈ 14, so a
    /// bound of 60 only catches real bias (iteration-uniform sampling gives
    /// thousands).
    #[test]
    fn sampling_is_uniform_over_items() {
        let mut b = filled(&[3, 10, 7], 2024);
        let (draws, per) = (20_000usize, 5usize);
        let mut counts = std::collections::HashMap::<u64, usize>::new();
        for _ in 0..draws {
            for s in b.sample(per, 2).unwrap() {
                *counts.entry(*s.item).or_default() += 1;
            }
        }
        assert_eq!(counts.len(), 20);
        let expected = (draws * per) as f64 / 20.0;
        let chi2: f64 = counts.values().map(|&o| (o as f64 - expected).powi(2) / expected).sum();
        assert!(chi2 < 60.0, "chi2 = {chi2}");
    }

    #[test]
    fn same_seed_same_samples() {
        let draw = |seed| {
            let mut b = filled(&[8, 8, 8], seed);
            (0..10).map(|_| b.sample_refs(6, 2).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
    }

    #[test]
    fn resume_from_checkpoint_is_bit_exact() {
        let mut live = ReplayBuffer::new(4, 42).unwrap();
        let mut version = 0u64;
        let step = |b: &mut ReplayBuffer<(u64, f32)>, v: u64| {
            b.push(v, (0..7).map(|j| (v * 100 + j, j as f32 * 0.5)).collect());
            (0..3).map(|_| b.sample_refs(4, v + 1).unwrap()).collect::<Vec<_>>()
        };
        for _ in 0..5 {
            step(&mut live, version);
            version += 1;
        }
        live.sample_refs(3, version).unwrap(); // stop mid-iteration too
        let json = serde_json::to_string(&live).unwrap();
        let mut resumed: ReplayBuffer<(u64, f32)> = serde_json::from_str(&json).unwrap();
        assert_eq!(resumed.iterations().collect::<Vec<_>>(), live.iterations().collect::<Vec<_>>());
        for _ in 0..4 {
            let a = step(&mut live, version);
            let b = step(&mut resumed, version);
            assert_eq!(a, b);
            version += 1;
        }
    }

    #[test]
    fn corrupt_checkpoints_are_rejected() {
        let mut b = ReplayBuffer::new(2, 0).unwrap();
        b.push(0, vec![1u8]);
        b.push(1, vec![2u8]);
        let mut v: serde_json::Value = serde_json::to_value(&b).unwrap();
        v["capacity_iters"] = 1.into();
        assert!(serde_json::from_value::<ReplayBuffer<u8>>(v.clone()).is_err());
        v["capacity_iters"] = 0.into();
        v["iterations"] = serde_json::json!([]);
        assert!(serde_json::from_value::<ReplayBuffer<u8>>(v.clone()).is_err());
        v["capacity_iters"] = 3.into();
        v["extra"] = 1.into();
        assert!(serde_json::from_value::<ReplayBuffer<u8>>(v).is_err());
    }
}
