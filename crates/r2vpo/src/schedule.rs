//! Which items each optimizer step of an iteration's update phase trains on:
//! Algorithm 1's epochs × shuffled minibatches over the fresh batch, or
//! Algorithm 2's replay draws with an update-to-data ratio. Every trainer
//! gets its steps from here, so the two schedules (and the staleness
//! bookkeeping) exist once.

use rand::Rng;

use crate::algo::Mode;
use crate::replay::{ReplayBuffer, ReplayConfig, SampleRef};
use crate::Result;

/// What happens to the last, short minibatch of an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remainder {
    /// Train on it (the LLM and toy trainers).
    Keep,
    /// Skip it, so every step has exactly `minibatch_size` items (control's
    /// flat buffers; CleanRL's batch sizes divide evenly anyway).
    Drop,
}

/// Where each epoch's shuffle starts. Both give a uniform random permutation
/// per epoch; they differ only in which one a given seed produces, and
/// committed results depend on that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reshuffle {
    /// Shuffle `0..n` afresh each epoch (the LLM and toy trainers).
    FromIdentity,
    /// Shuffle the previous epoch's order again (the control trainer).
    Continue,
}

/// Algorithm 1's update phase: `epochs` passes over the fresh batch, each a
/// Fisher–Yates shuffle cut into minibatches of `minibatch_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochSchedule {
    /// Passes over the batch (K of Algorithm 1).
    pub epochs: usize,
    /// Items per optimizer step.
    pub minibatch_size: usize,
    /// What to do with a short last minibatch.
    pub remainder: Remainder,
    /// Where each epoch's shuffle starts.
    pub reshuffle: Reshuffle,
}

/// One on-policy optimizer step: its epoch and the batch indices it uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochStep {
    /// 0-based epoch.
    pub epoch: usize,
    /// Indices into the fresh batch.
    pub indices: Vec<usize>,
}

impl EpochSchedule {
    /// Every step of the update phase over a batch of `n` items, shuffled
    /// with `rng`.
    pub fn steps<R: Rng + ?Sized>(&self, n: usize, rng: &mut R) -> Vec<EpochStep> {
        let mb = self.minibatch_size.max(1);
        let mut order: Vec<usize> = (0..n).collect();
        let mut out = Vec::new();
        for epoch in 0..self.epochs {
            if self.reshuffle == Reshuffle::FromIdentity {
                order.iter_mut().enumerate().for_each(|(i, o)| *o = i);
            }
            for i in 0..n {
                let j = rng.random_range(i..n);
                order.swap(i, j);
            }
            for chunk in order.chunks(mb) {
                if chunk.len() < mb && self.remainder == Remainder::Drop {
                    continue;
                }
                out.push(EpochStep { epoch, indices: chunk.to_vec() });
            }
        }
        out
    }
}

/// Algorithm 2's update phase after `new_items` fresh items were pushed into
/// `replay` at version `current`: `cfg.updates_per_iteration(new_items)`
/// draws of `min(minibatch_size, len)` items each (none when nothing new
/// arrived). The draws depend only on the buffer's own RNG and contents, so
/// planning them before training gives the same steps as drawing lazily.
pub fn replay_steps<T>(
    cfg: &ReplayConfig,
    replay: &mut ReplayBuffer<T>,
    new_items: usize,
    current: u64,
) -> Result<Vec<Vec<SampleRef>>> {
    let updates = if new_items > 0 { cfg.updates_per_iteration(new_items)? } else { 0 };
    (0..updates).map(|_| replay.sample_refs(cfg.minibatch_size.min(replay.len()), current)).collect()
}

/// An iteration's update phase, on- or off-policy.
#[derive(Clone, Debug, PartialEq)]
pub enum UpdateSchedule {
    /// Algorithm 1.
    OnPolicy(EpochSchedule),
    /// Algorithm 2.
    Replay(ReplayConfig),
}

/// One optimizer step's item.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepItem<'a, T> {
    /// The experience.
    pub item: &'a T,
    /// The epoch (on-policy; 0 for replay).
    pub epoch: usize,
    /// Policy versions between the behaviour policy and now (0 on-policy).
    pub staleness: u64,
}

/// The planned steps of one update phase, holding the fresh batch when
/// on-policy (off-policy items live in the replay buffer).
#[derive(Clone, Debug)]
pub struct UpdatePhase<T> {
    fresh: Vec<T>,
    steps: PhaseSteps,
}

#[derive(Clone, Debug)]
enum PhaseSteps {
    On(Vec<EpochStep>),
    Off(Vec<Vec<SampleRef>>),
}

impl UpdateSchedule {
    /// The schedule of `mode`.
    pub fn new(mode: Mode, on: EpochSchedule, replay: &ReplayConfig) -> Self {
        match mode {
            Mode::On => UpdateSchedule::OnPolicy(on),
            Mode::Off => UpdateSchedule::Replay(*replay),
        }
    }

    /// Plans iteration `iter`'s update phase over `fresh`: shuffled epochs
    /// (with `rng`), or — after pushing `fresh` into `replay` at version
    /// `iter` — the replay draws.
    pub fn plan<T, R: Rng + ?Sized>(
        &self,
        iter: u64,
        fresh: Vec<T>,
        replay: &mut ReplayBuffer<T>,
        rng: &mut R,
    ) -> Result<UpdatePhase<T>> {
        Ok(match self {
            UpdateSchedule::OnPolicy(e) => {
                let steps = e.steps(fresh.len(), rng);
                UpdatePhase { fresh, steps: PhaseSteps::On(steps) }
            }
            UpdateSchedule::Replay(cfg) => {
                let new_items = fresh.len();
                if new_items > 0 {
                    replay.push(iter, fresh);
                }
                UpdatePhase { fresh: Vec::new(), steps: PhaseSteps::Off(replay_steps(cfg, replay, new_items, iter)?) }
            }
        })
    }
}

impl<T> UpdatePhase<T> {
    /// Number of optimizer steps.
    pub fn len(&self) -> usize {
        match &self.steps {
            PhaseSteps::On(s) => s.len(),
            PhaseSteps::Off(s) => s.len(),
        }
    }

    /// Whether there is no step at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The items of step `k` (from the fresh batch or from `replay`).
    pub fn items<'a>(&'a self, k: usize, replay: &'a ReplayBuffer<T>) -> Vec<StepItem<'a, T>> {
        match &self.steps {
            PhaseSteps::On(s) => s[k]
                .indices
                .iter()
                .map(|&i| StepItem { item: &self.fresh[i], epoch: s[k].epoch, staleness: 0 })
                .collect(),
            PhaseSteps::Off(s) => s[k]
                .iter()
                .map(|at| StepItem {
                    item: replay.get(*at).expect("a ref planned after the last push"),
                    epoch: 0,
                    staleness: at.staleness,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    fn schedule(remainder: Remainder, reshuffle: Reshuffle) -> EpochSchedule {
        EpochSchedule { epochs: 2, minibatch_size: 4, remainder, reshuffle }
    }

    #[test]
    fn every_epoch_is_a_permutation_cut_into_minibatches() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let steps = schedule(Remainder::Keep, Reshuffle::FromIdentity).steps(10, &mut rng);
        assert_eq!(steps.iter().map(|s| s.indices.len()).collect::<Vec<_>>(), [4, 4, 2, 4, 4, 2]);
        for e in 0..2 {
            let mut all: Vec<usize> = steps.iter().filter(|s| s.epoch == e).flat_map(|s| s.indices.clone()).collect();
            all.sort();
            assert_eq!(all, (0..10).collect::<Vec<_>>());
        }
        let dropped = schedule(Remainder::Drop, Reshuffle::Continue).steps(10, &mut rng);
        assert_eq!(dropped.len(), 4);
        assert!(dropped.iter().all(|s| s.indices.len() == 4));
    }

    #[test]
    fn reshuffle_modes_match_the_loops_they_replace() {
        // FromIdentity: a fresh `(0..n)` shuffled each epoch; Continue: one
        // order shuffled again each epoch. Same RNG calls, different orders.
        let fisher_yates = |v: &mut Vec<usize>, rng: &mut ChaCha8Rng| {
            for i in 0..v.len() {
                let j = rng.random_range(i..v.len());
                v.swap(i, j);
            }
        };
        for reshuffle in [Reshuffle::FromIdentity, Reshuffle::Continue] {
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            let got = schedule(Remainder::Keep, reshuffle).steps(8, &mut rng);
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            let mut order: Vec<usize> = (0..8).collect();
            let mut want = Vec::new();
            for _ in 0..2 {
                if reshuffle == Reshuffle::FromIdentity {
                    order = (0..8).collect();
                }
                fisher_yates(&mut order, &mut rng);
                want.extend(order.chunks(4).map(<[usize]>::to_vec));
            }
            assert_eq!(got.into_iter().map(|s| s.indices).collect::<Vec<_>>(), want, "{reshuffle:?}");
        }
    }

    #[test]
    fn replay_phase_pushes_then_draws_with_staleness() {
        let cfg = ReplayConfig { capacity_iters: 2, utd: 1.0, minibatch_size: 3, seed: 0 };
        let mut replay = ReplayBuffer::new(2, 0).unwrap();
        let sched = UpdateSchedule::Replay(cfg);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let p0 = sched.plan(0, vec![10, 11, 12, 13, 14, 15], &mut replay, &mut rng).unwrap();
        assert_eq!(p0.len(), 2); // utd 1 × 6 items / minibatch 3
        let p1 = sched.plan(1, vec![20, 21, 22], &mut replay, &mut rng).unwrap();
        assert_eq!(p1.len(), 1);
        let items = p1.items(0, &replay);
        assert_eq!(items.len(), 3);
        for it in items {
            assert_eq!(it.staleness, u64::from(*it.item < 20));
        }
        let empty = sched.plan(2, Vec::<i32>::new(), &mut replay, &mut rng).unwrap();
        assert!(empty.is_empty());
    }
}
