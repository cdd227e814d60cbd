//! The trainer's side of data parallelism, in one object: which of a
//! step's micro-batches are this rank's, when ZeRO-2's rounds end, the
//! gradient sum, the global gradient norm, the parameter sync after a
//! step, the optimizer gather before a checkpoint, and the exchanges of
//! rollouts and step statistics. A trainer alone holds the same object
//! over a group of one ([`Solo`]), so the trainer's phases read the same
//! either way and never ask whether a job exists (torchtitan's rule: wrap
//! the model's state, not the loop).
//!
//! The mechanics (which tensors go where, in which buckets) are the
//! backend's [`Sharding`]; the collectives are the [`Group`]'s.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{GroupEntry, Produced, TrainError, TrainResult};
use crate::backend::{Backend, ShardSizes, Sharding};
use crate::parallel::{Group, Solo};

/// This trainer's place among the ranks of its job, and what a step does
/// across them ([`crate::train::Trainer::set_group`]).
pub(crate) struct DataParallel {
    group: Box<dyn Group>,
    /// One rank of a launched job (a job of one rank too, as torchrun's
    /// jobs of one run the data-parallel path): the backend's gradients,
    /// parameters and optimizer state are kept in step with the other
    /// ranks' through its [`Sharding`]. A trainer alone has nothing to keep
    /// in step.
    launched: bool,
    /// ZeRO stage of a launched job (0 alone).
    zero_stage: u8,
    /// ZeRO-2 whose backend reduces each layer's gradients during the
    /// backward ([`Sharding::reduce_in_backward`]): a round's reduce is
    /// then only for a rank that ran no backward in it.
    backward_reduces: bool,
    /// Tokens this rank ran forward and backward in the iteration under
    /// way, for `rank_train_tokens`.
    trained_tokens: u64,
    /// Resident memory (MiB) when the phase under way began
    /// ([`DataParallel::begin_phase`]).
    phase_start_mib: f64,
    /// How many groups each rank sampled for the iteration under way (a
    /// launched job sampling in-process), for `rank_rollout_groups`.
    rollout_groups: Option<Vec<usize>>,
}

/// What each rank keeps of the optimizer state after
/// [`DataParallel::join`] sharded it, in rank order, with this rank's
/// [`ShardSizes`] (whose totals are every rank's together).
pub(crate) struct ShardRecord {
    pub per_rank: Vec<ShardSizes>,
    pub sizes: ShardSizes,
}

/// A rank's part of a spread rollout: each group's position in the batch
/// and the groups, or the message of the error that ended its rollout.
type RolloutShare = Result<(Vec<usize>, Vec<GroupEntry>), String>;

/// What each rank of a launched job holds, reported once per iteration
/// (`rank_*` in metrics.jsonl, in rank order).
pub(crate) struct RankRecord {
    /// Peak resident memory so far, MiB.
    pub peak_rss_mib: Vec<f64>,
    /// Tokens each rank trained on this iteration.
    pub train_tokens: Vec<u64>,
    /// Groups each rank sampled this iteration (in-process sampling only).
    pub rollout_groups: Option<Vec<usize>>,
}

impl DataParallel {
    /// A trainer alone: a group of one, nothing sharded.
    pub fn alone() -> Self {
        Self {
            group: Box::new(Solo),
            launched: false,
            zero_stage: 0,
            backward_reduces: false,
            trained_tokens: 0,
            phase_start_mib: f64::NAN,
            rollout_groups: None,
        }
    }

    /// This trainer as one rank of `group`, with `backend`'s optimizer
    /// state sharded for `zero_stage` ≥ 1: returns the object and, when
    /// sharded, what every rank keeps (in rank order) beside the totals.
    /// A backend without a data-parallel half is refused by name.
    pub fn join(
        group: Box<dyn Group>,
        backend: &mut dyn Backend,
        zero_stage: u8,
    ) -> TrainResult<(Self, Option<ShardRecord>)> {
        let mut dp = Self {
            group,
            launched: true,
            zero_stage,
            backward_reduces: false,
            trained_tokens: 0,
            phase_start_mib: f64::NAN,
            rollout_groups: None,
        };
        let world = dp.world();
        if backend.sharding().is_none() {
            return Err(TrainError::Config {
                field: "model.backend".into(),
                message: format!(
                    "{} does not train data-parallel; a job of {world} rank(s) needs backend = \"torch\"",
                    backend.describe()
                ),
            });
        }
        if zero_stage == 0 {
            return Ok((dp, None));
        }
        let rank = dp.rank();
        let sizes = sharding(backend)?.shard_optimizer(rank, world)?;
        if zero_stage == 2 {
            let shared = crate::parallel::Shared::new(std::mem::replace(&mut dp.group, Box::new(Solo)));
            dp.group = Box::new(shared.clone());
            dp.backward_reduces = sharding(backend)?.reduce_in_backward(Box::new(shared));
        }
        let mine = [sizes.moments as u64, sizes.masters as u64];
        let per_rank = dp
            .gather(mine, "the optimizer shards")?
            .into_iter()
            .map(|[moments, masters]| ShardSizes { moments: moments as usize, masters: masters as usize, ..sizes })
            .collect();
        Ok((dp, Some(ShardRecord { per_rank, sizes })))
    }

    /// This process's rank (0 alone).
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The number of ranks (1 alone).
    pub fn world(&self) -> usize {
        self.group.world()
    }

    /// Whether this process writes the run's checkpoints, evaluations and
    /// metrics: rank 0, or a trainer alone.
    pub fn is_writer(&self) -> bool {
        self.rank() == 0
    }

    /// The job's group where this trainer is one rank of a launched job
    /// (for functions whose one-process path differs, such as
    /// [`crate::eval::evaluate_ranks`], which records each rank's share).
    pub fn launched_group(&mut self) -> Option<&mut dyn Group> {
        if self.launched {
            Some(self.group.as_mut())
        } else {
            None
        }
    }

    fn zero2(&self) -> bool {
        self.launched && self.zero_stage == 2
    }

    // ---- the step plan ----

    /// Whether micro-batch `k` of a step is this rank's: every world-th,
    /// from the rank's own index (the loss is normalised by the whole
    /// step's counts, so the ranks' gradients add up to the step's).
    pub fn owns(&self, k: usize) -> bool {
        k % self.world() == self.rank()
    }

    /// After micro-batch `k` of `parts` (this rank's or not): under ZeRO-2
    /// each round of `world` micro-batches ends with the gradients summed
    /// into the ranks that step them ([`Sharding::reduce_grads`]), so
    /// between rounds a rank holds only its share; otherwise nothing.
    pub fn after_micro_batch(&mut self, k: usize, parts: usize, backend: &mut dyn Backend) -> TrainResult<()> {
        let world = self.world();
        if self.zero2() && (k % world == world - 1 || k + 1 == parts) {
            // This rank's micro-batch of the round, if it had one, reduced
            // its gradients layer by layer during its backward.
            let reduced = self.backward_reduces && k - k % world + self.rank() < parts;
            if !reduced {
                sharding(backend)?.reduce_grads(self.group.as_mut())?;
            }
        }
        Ok(())
    }

    /// Counts tokens this rank trained on ([`RankRecord::train_tokens`]).
    pub fn trained(&mut self, tokens: usize) {
        self.trained_tokens += tokens as u64;
    }

    /// After this rank's last micro-batch of a step: the gradients summed
    /// over the ranks, so every rank steps with the whole step's gradient
    /// (ZeRO-2 already summed them round by round).
    pub fn sum_gradients(&mut self, backend: &mut dyn Backend) -> TrainResult<()> {
        if self.launched && !self.zero2() {
            sharding(backend)?.sync_grads(self.group.as_mut())?;
        }
        Ok(())
    }

    /// The whole step's gradient norm from this rank's `local` one: under
    /// ZeRO-2 each rank holds its share of the gradients, so the norm is
    /// the root of the summed squares; otherwise every rank holds them all.
    pub fn global_norm(&mut self, local: f64) -> TrainResult<f64> {
        if !self.zero2() {
            return Ok(local);
        }
        let mut sq = [local * local];
        self.group.sum_f64(&mut sq)?;
        Ok(sq[0].sqrt())
    }

    /// After an optimizer step: every rank's parameters become their
    /// owners' (a no-op unsharded).
    pub fn after_step(&mut self, backend: &mut dyn Backend) -> TrainResult<()> {
        if self.launched {
            sharding(backend)?.sync_params(self.group.as_mut())?;
        }
        Ok(())
    }

    /// Starts this rank's peak resident memory again, at the start of a
    /// phase [`DataParallel::phase_peaks`] reports.
    pub fn begin_phase(&mut self) {
        if self.launched {
            self.phase_start_mib = crate::parallel::rss_mib().unwrap_or(f64::NAN);
            crate::parallel::reset_peak_rss();
        }
    }

    /// Each rank's resident memory at [`DataParallel::begin_phase`] and
    /// its peak since (MiB), in rank order (`None` alone): what a
    /// checkpoint cost each rank. Every rank calls it; the peak starts
    /// again after it.
    pub fn phase_peaks(&mut self, what: &str) -> TrainResult<Option<Vec<(f64, f64)>>> {
        if !self.launched {
            return Ok(None);
        }
        let rss = crate::parallel::peak_rss_mib().unwrap_or(f64::NAN);
        crate::parallel::reset_peak_rss();
        Ok(Some(self.gather((self.phase_start_mib, rss), what)?))
    }

    /// The optimizer file of a checkpoint: rank 0 writes it to `path`
    /// (given there, `None` on the others) as every rank sends its share
    /// ([`Sharding::write_optimizer`]); alone or unsharded, the backend
    /// saves its own. Every rank of a job calls it, after
    /// [`DataParallel::before_checkpoint`].
    pub fn write_optimizer(&mut self, backend: &mut dyn Backend, path: Option<&std::path::Path>) -> TrainResult<()> {
        if self.launched && self.zero_stage > 0 {
            sharding(backend)?.write_optimizer(self.group.as_mut(), path)?;
        } else if let Some(p) = path {
            backend.save_optimizer(p)?;
        }
        Ok(())
    }

    /// Before rank 0 writes a checkpoint: every rank sends its sharded f32
    /// masters, which rank 0's export of the model needs (a no-op
    /// otherwise). Every rank calls it.
    pub fn before_checkpoint(&mut self, backend: &mut dyn Backend) -> TrainResult<()> {
        if self.launched {
            sharding(backend)?.gather_optimizer(self.group.as_mut())?;
        }
        Ok(())
    }

    // ---- exchanges ----

    /// Sums `values` over the ranks, in place (alone: as they are).
    pub fn sum(&mut self, values: &mut [f64]) -> TrainResult<()> {
        if self.world() > 1 {
            self.group.sum_f64(values)?;
        }
        Ok(())
    }

    /// Whether `flag` is raised on any rank (a stop a signal asked of one).
    pub fn any(&mut self, flag: bool) -> TrainResult<bool> {
        let mut v = [f64::from(u8::from(flag))];
        self.sum(&mut v)?;
        Ok(v[0] > 0.0)
    }

    /// Every rank's `mine`, in rank order (alone: `[mine]`, not encoded).
    /// `what` names the exchange in an error.
    pub fn gather<T: Serialize + DeserializeOwned>(&mut self, mine: T, what: &str) -> TrainResult<Vec<T>> {
        if self.world() == 1 {
            return Ok(vec![mine]);
        }
        let bytes = bincode::serialize(&mine).map_err(|e| TrainError::Exchange(format!("encoding {what}: {e}")))?;
        self.group
            .all_gather_bytes(&bytes)?
            .iter()
            .enumerate()
            .map(|(r, b)| {
                bincode::deserialize(b).map_err(|e| TrainError::Exchange(format!("rank {r}'s part of {what}: {e}")))
            })
            .collect()
    }

    /// Rank 0 sends `value` to the other ranks, which take it with
    /// [`DataParallel::receive`] (alone: nothing to send). `what` names the
    /// exchange in an error.
    pub fn send<T: Serialize>(&mut self, value: &T, what: &str) -> TrainResult<()> {
        if self.world() == 1 {
            return Ok(());
        }
        let bytes = bincode::serialize(value).map_err(|e| TrainError::Exchange(format!("encoding {what}: {e}")))?;
        self.group.broadcast_bytes(0, bytes)?;
        Ok(())
    }

    /// What rank 0 [sent](DataParallel::send), on a rank other than 0.
    pub fn receive<T: DeserializeOwned>(&mut self, what: &str) -> TrainResult<T> {
        let bytes = self.group.broadcast_bytes(0, Vec::new())?;
        bincode::deserialize(&bytes).map_err(|e| TrainError::Exchange(format!("rank 0's {what}: {e}")))
    }

    /// Whether this rank samples the iteration's rollouts: every rank
    /// when they sample in-process (`spread`, each its
    /// [`crate::train::BatchShare`]), else rank 0 alone, which asks the
    /// rollout servers for the whole batch.
    pub fn samples(&self, spread: bool) -> bool {
        spread || self.is_writer()
    }

    /// The iteration's rollouts on every rank, from each rank's `produced`
    /// share (`spread`: the shares are put back in batch order) or from
    /// rank 0's whole batch (the others pass `None`: they did not sample).
    /// A rank whose rollout failed sends its error in place of its groups:
    /// every rank then stops after the same exchange with the failing
    /// rank's own message ([`TrainError::RolloutOnRank`]), so no rank is
    /// left waiting in a collective that will not come. `elapsed` is the
    /// time since the iteration began, which a spread batch's `rollout_s`
    /// becomes (it is whole when the slowest rank's share arrived). Alone:
    /// `produced` as it is.
    pub fn exchange_rollouts(
        &mut self,
        produced: Option<TrainResult<Produced>>,
        spread: bool,
        elapsed: impl Fn() -> f64,
    ) -> TrainResult<Produced> {
        let missing = || TrainError::Exchange("this rank sampled nothing to send".into());
        if !self.launched {
            return produced.ok_or_else(missing)?;
        }
        if !spread {
            if self.rank() != 0 {
                let sent: Result<(Vec<GroupEntry>, f64), String> = self.receive("rollouts")?;
                let (entries, rollout_s) = sent.map_err(|message| TrainError::RolloutOnRank { rank: 0, message })?;
                return Ok(Produced { positions: (0..entries.len()).collect(), entries, rollout_s });
            }
            let produced = produced.ok_or_else(missing)?;
            let sent: Result<(&Vec<GroupEntry>, f64), String> =
                produced.as_ref().map(|p| (&p.entries, p.rollout_s)).map_err(|e| e.to_string());
            self.send(&sent, "the rollouts")?;
            return produced;
        }
        let (mine, own_error) = match produced.ok_or_else(missing)? {
            Ok(p) => (Ok((p.positions, p.entries)), None),
            Err(e) => (Err(e.to_string()), Some(e)),
        };
        let mut all: Vec<(usize, GroupEntry)> = Vec::new();
        let mut counts = Vec::with_capacity(self.world());
        let mut failed = None;
        let shares: Vec<RolloutShare> = self.gather(mine, "the rollouts")?;
        for (r, theirs) in shares.into_iter().enumerate() {
            match theirs {
                Ok((at, entries)) => {
                    counts.push(entries.len());
                    all.extend(at.into_iter().zip(entries));
                }
                Err(message) => {
                    failed.get_or_insert((r, message));
                }
            }
        }
        if let Some(e) = own_error {
            return Err(e);
        }
        if let Some((rank, message)) = failed {
            return Err(TrainError::RolloutOnRank { rank, message });
        }
        all.sort_by_key(|(k, _)| *k);
        self.rollout_groups = Some(counts);
        Ok(Produced {
            positions: all.iter().map(|(k, _)| *k).collect(),
            entries: all.into_iter().map(|(_, e)| e).collect(),
            rollout_s: elapsed(),
        })
    }

    /// What each rank holds at the end of an iteration (`None` alone); the
    /// per-iteration counts start again.
    pub fn rank_record(&mut self) -> TrainResult<Option<RankRecord>> {
        let tokens = std::mem::take(&mut self.trained_tokens);
        let rollout_groups = self.rollout_groups.take();
        if !self.launched {
            return Ok(None);
        }
        let rss = crate::parallel::peak_rss_mib().unwrap_or(f64::NAN);
        // The next record's peak is its own iteration's (and what ran
        // between: an evaluation), not the largest since the start.
        crate::parallel::reset_peak_rss();
        let all = self.gather((rss, tokens), "the ranks' records")?;
        Ok(Some(RankRecord {
            peak_rss_mib: all.iter().map(|r| r.0).collect(),
            train_tokens: all.iter().map(|r| r.1).collect(),
            rollout_groups,
        }))
    }
}

/// `backend`'s data-parallel half; [`DataParallel::join`] refused a
/// backend without one, so this fails only on a backend that lost it.
fn sharding(backend: &mut dyn Backend) -> TrainResult<&mut dyn Sharding> {
    let name = backend.describe();
    backend.sharding().ok_or_else(|| TrainError::Config {
        field: "model.backend".into(),
        message: format!("{name} does not train data-parallel"),
    })
}
