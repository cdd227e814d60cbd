//! What the trainer writes per iteration (`metrics.jsonl`), per evaluation
//! (`eval.jsonl`) and per histogram (`ratio_hist.jsonl`): the paper's
//! diagnostics.

use serde::{Deserialize, Serialize};

use r2vpo::objective::RatioStats;

use super::config::Mode;

/// Wall-clock fields: everything in a metrics line that may differ between
/// two runs of the same seed (a resumed run is compared without them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Seconds spent sampling (asynchronous runs: waiting for the queue).
    pub rollout_s: f64,
    /// Of `rollout_s`, seconds spent writing the weights pushed to rollout
    /// servers and waiting for them to load (synchronous runs on servers).
    #[serde(default)]
    pub push_s: f64,
    /// Bytes of the weight folder pushed this iteration.
    #[serde(default)]
    pub push_bytes: u64,
    /// Seconds spent in scoring passes (recomputed behaviour / reference).
    pub score_s: f64,
    /// Seconds spent in optimizer steps.
    pub train_s: f64,
    /// Generated tokens per second during the rollout; in asynchronous runs
    /// the tokens of the groups taken per second of the whole iteration
    /// (the actors sample while the learner trains).
    pub rollout_tokens_per_s: f64,
    /// Trained (response) tokens per second, forward + backward + AdamW.
    pub train_tokens_per_s: f64,
    /// Seconds for the whole iteration.
    pub iteration_s: f64,
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IterMetrics {
    /// Iteration (0-based).
    pub iter: usize,
    /// Optimizer steps after this iteration (the policy version).
    pub steps: u64,
    /// Mean reward of this iteration's rollouts.
    pub reward_mean: f64,
    /// Fraction of rollouts the verifier judged correct.
    pub accuracy: f64,
    /// Mean response length (tokens).
    pub response_len_mean: f64,
    /// Longest response (tokens).
    pub response_len_max: usize,
    /// Fraction of responses cut by `max_new_tokens`.
    pub truncated_frac: f64,
    /// Mean per-token entropy (nats) of the T = 1 policy over the rollout
    /// (NaN, written `null`, when the rollout server does not report it).
    #[serde(deserialize_with = "f64_or_nan")]
    pub entropy: f64,
    /// Groups whose rewards are all equal (no learning signal).
    pub zero_variance_groups: usize,
    /// Their fraction of the iteration's groups.
    pub zero_variance_frac: f64,
    /// Groups dropped by `filter_zero_variance`.
    pub filtered_groups: usize,
    /// Batches sampled this iteration (1 without DAPO's over-sampling,
    /// `max_gen_batches`; verl's `num_gen_batches`). `zero_variance_*`
    /// count the first batch's groups.
    #[serde(default = "one")]
    pub gen_batches: usize,
    /// Groups with a signal that the extra batches added.
    #[serde(default)]
    pub refilled_groups: usize,
    /// λ after the iteration.
    pub lambda: f64,
    /// Optimizer steps taken in this iteration.
    pub updates: usize,
    /// Steps skipped for a non-finite loss or gradient.
    pub skipped_steps: usize,
    /// Mean loss per optimizer step.
    pub loss: f64,
    /// Mean policy-gradient part of the loss.
    pub pg_loss: f64,
    /// Mean penalty part (R²VPO's λ·E\[(ρ−1)²\], GRPO-KL's KL term).
    pub penalty: f64,
    /// Mean KL-to-reference term (0 when off).
    pub ref_kl: f64,
    /// Mean global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate of the last step.
    pub lr: f64,
    /// Mean age of the trained samples: epochs (on-policy) or iterations
    /// since collection (replay).
    pub staleness: f64,
    /// Tokens trained on (summed over steps).
    pub trained_tokens: usize,
    /// Ratio statistics pooled over all of the iteration's steps.
    pub ratio_mean: f64,
    /// Var\[ρ\].
    pub ratio_var: f64,
    /// E\[(ρ−1)²\], the quantity R²VPO constrains.
    pub sq_dev: f64,
    /// Smallest ρ.
    pub ratio_min: f64,
    /// Largest ρ.
    pub ratio_max: f64,
    /// `(q, ρ_q)` quantiles (token-weighted average of the steps').
    pub ratio_quantiles: Vec<(f64, f64)>,
    /// Fraction of tokens with ρ < 1 − ε_low (reported for every objective).
    pub clip_frac_low: f64,
    /// Fraction with ρ > 1 + ε_high.
    pub clip_frac_high: f64,
    /// Fraction where the dual clip binds.
    pub clip_frac_dual: f64,
    /// Fraction of tokens the objective's own mask dropped (M2PO, DPPO).
    #[serde(default)]
    pub masked_frac: f64,
    /// k1 estimate of KL(π_off‖π_θ).
    pub approx_kl: f64,
    /// k3 estimate of KL(π_off‖π_θ).
    pub kl_k3: f64,
    /// Weight version the iteration's rollouts came from (the learner's
    /// iteration count when it last pushed weights; the iteration itself
    /// with in-process sampling).
    #[serde(default)]
    pub rollout_version: u64,
    /// Mean weight-version lag of the trained samples: iterations between
    /// the weights that generated a sample and the update that used it
    /// (0 for on-policy in-process data; grows with replay and with
    /// `rollout.sync_every`).
    #[serde(default)]
    pub version_lag_mean: f64,
    /// Largest weight-version lag among the trained samples.
    #[serde(default)]
    pub version_lag_max: u64,
    /// Asynchronous runs only: the queue's side of the iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueMetrics>,
    /// Data-parallel runs only: each rank's peak resident memory (MiB,
    /// Linux's `VmHWM`) since the previous iteration's record, in rank
    /// order: this iteration's, with an evaluation before it; the first
    /// after a start or a resume includes the loading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_peak_rss_mib: Option<Vec<f64>>,
    /// Data-parallel runs that sample in-process only: how many of the
    /// iteration's prompt groups each rank sampled, in rank order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_rollout_groups: Option<Vec<usize>>,
    /// Data-parallel runs only: the response tokens each rank ran forward
    /// and backward this iteration (its share of every step's
    /// micro-batches), in rank order; they add up to `trained_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_train_tokens: Option<Vec<u64>>,
    /// How far the rollout engine's log-probs are from the learner's on
    /// the same tokens before any update (`None` in older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<Mismatch>,
    /// The rollout–trainer mismatch correction's weights on this
    /// iteration's fresh samples (`None` without `objective.rollout_correction`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction: Option<Correction>,
    /// Wall-clock measurements.
    pub timing: Timing,
}

fn one() -> usize {
    1
}

/// The rollout–trainer mismatch of one iteration, as verl's rollout
/// log-prob diagnostics measure it: the learner's log π of each sampled
/// token, at the very weights that sampled it (samples of the current
/// weight version, before the iteration's first update), against the log π
/// the rollout engine returned for it. Nonzero from kernels and precision
/// alone (an f32 vLLM on this CPU: about 1e-5 nats; a bf16 engine: about
/// 1e-2); a stale head or a push the engine did not take shows up here
/// first. ρ below is π_learner / π_engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Tokens compared (those of samples from the current version).
    pub tokens: usize,
    /// Mean |log π_learner − log π_engine| over them.
    pub abs_mean: f64,
    /// The largest |log π_learner − log π_engine|.
    pub abs_max: f64,
    /// E\[(ρ − 1)²\] at step 0: R²VPO's penalty before the policy moved,
    /// all of it mismatch.
    pub sq_dev: f64,
}

/// What `objective.rollout_correction` did to one iteration's samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    /// Tokens weighed.
    pub tokens: usize,
    /// Mean weight applied (1 where learner and engine agree).
    pub weight_mean: f64,
    /// Fraction of tokens whose weight was truncated (TIS) or zeroed (MIS).
    pub capped_frac: f64,
}

impl Correction {
    /// The summary of `sums`, `None` where no token was weighed.
    pub fn from_sums(sums: &r2vpo::correction::CorrectionSums) -> Option<Correction> {
        (sums.tokens > 0.0).then(|| Correction {
            tokens: sums.tokens as usize,
            weight_mean: sums.weight_sum / sums.tokens,
            capped_frac: sums.capped / sums.tokens,
        })
    }
}

/// Sums for [`Mismatch`], added to per micro-batch and summed over ranks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MismatchSums {
    pub(crate) tokens: f64,
    pub(crate) abs: f64,
    pub(crate) sq_dev: f64,
    pub(crate) max: f64,
}

impl MismatchSums {
    /// Adds the masked tokens of rows `(learner, engine, mask)`.
    pub(crate) fn add_row(&mut self, learner: &[f32], engine: &[f32], mask: &[f32]) {
        for ((&a, &b), &m) in learner.iter().zip(engine).zip(mask) {
            if m > 0.0 {
                let d = f64::from(a) - f64::from(b);
                self.tokens += 1.0;
                self.abs += d.abs();
                self.sq_dev += (d.exp() - 1.0).powi(2);
                self.max = self.max.max(d.abs());
            }
        }
    }

    /// The summary, `None` where no token was compared.
    pub(crate) fn finish(&self) -> Option<Mismatch> {
        (self.tokens > 0.0).then(|| Mismatch {
            tokens: self.tokens as usize,
            abs_mean: self.abs / self.tokens,
            abs_max: self.max,
            sq_dev: self.sq_dev / self.tokens,
        })
    }
}

/// What an asynchronous learner saw in its queue during one iteration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueMetrics {
    /// Fresh groups taken.
    pub groups: usize,
    /// The batches of the groups read (taken or dropped), in queue order:
    /// over a run, no batch is missing or repeated.
    pub batches: Vec<u64>,
    /// Groups dropped for a weight-version lag above `actors.max_staleness`.
    pub stale_dropped: usize,
    /// Entries rejected as malformed (each also an `events.jsonl` line).
    pub rejected: usize,
    /// `(lag, groups)`: the weight-version lag of the fresh groups taken.
    pub fresh_lag: Vec<(u64, usize)>,
    /// `(lag, samples)`: the lag of every sample the updates trained on
    /// (fresh and replayed), counted once per optimizer step that drew it.
    pub trained_lag: Vec<(u64, usize)>,
    /// Seconds the learner waited for groups.
    pub wait_s: f64,
    /// Entries held by the queue after trimming.
    pub held: u64,
}

/// Reads a float written as a number or as `null` (serde_json's spelling
/// of NaN).
fn f64_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl IterMetrics {
    /// The scalars written to TensorBoard.
    pub fn scalars(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("reward", self.reward_mean),
            ("accuracy", self.accuracy),
            ("response_len", self.response_len_mean),
            ("entropy", self.entropy),
            ("lambda", self.lambda),
            ("ratio/mean", self.ratio_mean),
            ("ratio/var", self.ratio_var),
            ("ratio/sq_dev", self.sq_dev),
            ("ratio/clip_frac_low", self.clip_frac_low),
            ("ratio/clip_frac_high", self.clip_frac_high),
            ("approx_kl", self.approx_kl),
            ("grad_norm", self.grad_norm),
            ("zero_variance_frac", self.zero_variance_frac),
            ("gen_batches", self.gen_batches as f64),
            ("staleness", self.staleness),
            ("version_lag", self.version_lag_mean),
            ("mismatch/abs_mean", self.mismatch.map_or(f64::NAN, |m| m.abs_mean)),
            ("mismatch/abs_max", self.mismatch.map_or(f64::NAN, |m| m.abs_max)),
            ("mismatch/sq_dev", self.mismatch.map_or(f64::NAN, |m| m.sq_dev)),
            ("correction/weight_mean", self.correction.map_or(f64::NAN, |c| c.weight_mean)),
            ("correction/capped_frac", self.correction.map_or(f64::NAN, |c| c.capped_frac)),
            ("ratio/masked_frac", self.masked_frac),
            ("time/rollout_tokens_per_s", self.timing.rollout_tokens_per_s),
            ("time/train_tokens_per_s", self.timing.train_tokens_per_s),
        ]
    }
}

/// Sums over one iteration's optimizer steps.
#[derive(Default)]
pub(crate) struct StepAccumulator {
    stats: Vec<RatioStats>,
    loss: f64,
    grad_norm: f64,
    lr: f64,
    ref_kl: f64,
    age: f64,
    pub(crate) tokens: usize,
    pub(crate) skipped: usize,
}

impl StepAccumulator {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &mut self,
        s: &RatioStats,
        loss: f64,
        grad_norm: f64,
        lr: f64,
        ref_kl: f64,
        age: f64,
        tokens: usize,
    ) {
        self.stats.push(s.clone());
        self.loss += loss;
        self.grad_norm += grad_norm;
        self.lr = lr;
        self.ref_kl += ref_kl;
        self.age += age;
        self.tokens += tokens;
    }

    pub(crate) fn finish_into(&self, m: &mut IterMetrics) {
        let n = self.stats.len();
        m.updates = n;
        m.skipped_steps = self.skipped;
        m.trained_tokens = self.tokens;
        if n == 0 {
            return;
        }
        let k = n as f64;
        let s = RatioStats::merge(&self.stats);
        m.loss = self.loss / k;
        m.pg_loss = s.pg_loss / k;
        m.penalty = s.penalty / k;
        m.ref_kl = self.ref_kl / k;
        m.grad_norm = self.grad_norm / k;
        m.lr = self.lr;
        m.staleness = self.age / k;
        m.ratio_mean = s.ratio_mean;
        m.ratio_var = s.ratio_var;
        m.sq_dev = s.sq_dev_mean;
        m.ratio_min = s.ratio_min;
        m.ratio_max = s.ratio_max;
        m.ratio_quantiles = s.quantiles.clone();
        m.clip_frac_low = s.clip_frac_low;
        m.clip_frac_high = s.clip_frac_high;
        m.clip_frac_dual = s.clip_frac_dual;
        m.masked_frac = s.masked_frac;
        m.approx_kl = s.approx_kl;
        m.kl_k3 = s.kl_k3;
    }
}

/// One line of `ratio_hist.jsonl`: the distribution of token ratios ρ seen
/// by the optimizer at one iteration, for samples of one age.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RatioHistogram {
    /// Iteration.
    pub iter: usize,
    /// Age of the samples (see `age_unit`).
    pub age: u64,
    /// `epoch` (on-policy: which pass over the fresh batch) or `iteration`
    /// (replay: iterations since the samples were collected).
    pub age_unit: String,
    /// Lower edge of the first bin.
    pub lo: f64,
    /// Upper edge of the last bin.
    pub hi: f64,
    /// Counts in equal-width bins over `[lo, hi)`.
    pub counts: Vec<u64>,
    /// Ratios below `lo`.
    pub underflow: u64,
    /// Ratios at or above `hi`.
    pub overflow: u64,
    /// All ratios counted.
    pub n: u64,
    /// Their mean.
    pub mean: f64,
    /// Their population variance.
    pub var: f64,
}

/// Counts, underflow, overflow, n, Σρ, Σρ² of one age.
type AgeBins = (Vec<u64>, u64, u64, u64, f64, f64);

/// Histograms under construction, one per age.
pub(crate) struct HistogramSet {
    enabled: bool,
    lo: f64,
    hi: f64,
    bins: usize,
    unit: &'static str,
    by_age: std::collections::BTreeMap<u64, AgeBins>,
}

impl HistogramSet {
    pub(crate) fn new(enabled: bool, range: (f64, f64, usize), mode: Mode) -> Self {
        let unit = match mode {
            Mode::On => "epoch",
            Mode::Off => "iteration",
        };
        Self { enabled, lo: range.0, hi: range.1, bins: range.2, unit, by_age: Default::default() }
    }

    /// Names the age axis (`weight_version` in an asynchronous run).
    pub(crate) fn set_unit(&mut self, unit: &'static str) {
        self.unit = unit;
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn add(&mut self, age: u64, values: impl Iterator<Item = f64>) {
        let bins = self.bins;
        let e = self.by_age.entry(age).or_insert_with(|| (vec![0; bins], 0, 0, 0, 0.0, 0.0));
        let w = (self.hi - self.lo) / bins as f64;
        for v in values {
            e.3 += 1;
            e.4 += v;
            e.5 += v * v;
            if v < self.lo {
                e.1 += 1;
            } else if v >= self.hi {
                e.2 += 1;
            } else {
                e.0[(((v - self.lo) / w) as usize).min(bins - 1)] += 1;
            }
        }
    }

    pub(crate) fn finish(self, iter: usize) -> Vec<RatioHistogram> {
        self.by_age
            .into_iter()
            .map(|(age, (counts, under, over, n, s, s2))| {
                let mean = if n > 0 { s / n as f64 } else { 0.0 };
                let var = if n > 0 { (s2 / n as f64 - mean * mean).max(0.0) } else { 0.0 };
                RatioHistogram {
                    iter,
                    age,
                    age_unit: self.unit.to_string(),
                    lo: self.lo,
                    hi: self.hi,
                    counts,
                    underflow: under,
                    overflow: over,
                    n,
                    mean,
                    var,
                }
            })
            .collect()
    }
}

/// One line of `eval.jsonl`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Iterations completed when evaluated.
    pub iter: usize,
    /// Optimizer steps at that point.
    pub steps: u64,
    /// Problems evaluated.
    pub problems: usize,
    /// Samples per problem.
    pub k: usize,
    /// Mean accuracy over all samples.
    pub avg_at_k: f64,
    /// Unbiased pass@k.
    pub pass_at_k: f64,
    /// Majority-vote accuracy.
    pub maj_at_k: f64,
    /// Mean response length (tokens).
    pub response_len_mean: f64,
    /// Seconds taken.
    pub seconds: f64,
}
