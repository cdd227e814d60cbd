//! `llm train --async`: actor threads sample batches ahead of the learner
//! and publish them to an [`ExperienceQueue`]; the learner takes the groups
//! in queue order, drops those whose weight-version lag exceeds
//! `actors.max_staleness`, learns from the rest exactly as the synchronous
//! trainer does ([`Trainer::learn`]) and hands its new weights to the
//! actors. R²VPO-OFF's replay of the last K iterations (Algorithm 2) is the
//! learner's own buffer; the queue keeps the same K iterations of slots.
//!
//! Bounded staleness, as prime-rl's `max_async_level`: an actor that holds
//! batch `b` waits until the learner has consumed at least `b −
//! max_staleness` batches, then samples with the newest weights. Batch `b`
//! is then consumed at most `max_staleness` versions after the weights that
//! made it, so nothing is dropped unless an actor was slow or died; with
//! `max_staleness = 0` every batch is made by the weights of the iteration
//! that consumes it and the run equals the synchronous one.
//!
//! Prompt assignment: batches are leased from the queue
//! ([`ExperienceQueue::claim_batch`]), so two actors never produce the
//! same batch and a dead actor's batch goes to the next one; the data
//! position of batch `b` is a pure function of `b` ([`Actor::produce`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use super::metrics::QueueMetrics;
use super::{load_policy, Actor, DataPosition, Event, Outcome, TrainConfig, TrainError, TrainResult, Trainer};
use crate::queue::{EntryId, EntryLimits, ExperienceQueue, GroupEntry, QueueError};

/// Where an asynchronous learner stands in its queue; part of every
/// checkpoint, so a resumed learner neither re-applies nor skips a group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePosition {
    /// The last entry read (taken, dropped or rejected).
    pub read: Option<EntryId>,
    /// Every batch below this one was consumed (taken or dropped).
    pub done_below: u64,
    /// Consumed batches at or above `done_below`, ascending.
    pub done_above: Vec<u64>,
}

impl QueuePosition {
    /// Records batch `batch` as consumed.
    pub fn mark_done(&mut self, batch: u64) {
        if batch < self.done_below || self.done_above.contains(&batch) {
            return;
        }
        self.done_above.push(batch);
        self.done_above.sort_unstable();
        while self.done_above.first() == Some(&self.done_below) {
            self.done_above.remove(0);
            self.done_below += 1;
        }
    }

    /// Batches consumed so far.
    pub fn consumed(&self) -> u64 {
        self.done_below + self.done_above.len() as u64
    }

    /// The next new batch and the batches below it that were never
    /// consumed (for [`ExperienceQueue::restore_batches`]).
    pub fn restore_plan(&self) -> (u64, Vec<u64>) {
        let next = self.done_above.last().map_or(self.done_below, |&b| b + 1);
        let pending = (self.done_below..next).filter(|b| !self.done_above.contains(b)).collect();
        (next, pending)
    }
}

/// Opens one handle on the run's queue (each thread gets its own).
pub type QueueOpener = dyn Fn() -> Result<Box<dyn ExperienceQueue>, QueueError> + Sync;

/// The learner's newest weights and progress, shared with the actors.
struct Board {
    state: Mutex<BoardState>,
    changed: Condvar,
}

struct BoardState {
    version: u64,
    consumed: u64,
    weights: Arc<HashMap<String, Tensor>>,
    closed: bool,
    failure: Option<String>,
    events: Vec<serde_json::Value>,
}

impl Board {
    fn new(version: u64, consumed: u64, weights: HashMap<String, Tensor>) -> Self {
        Board {
            state: Mutex::new(BoardState {
                version,
                consumed,
                weights: Arc::new(weights),
                closed: false,
                failure: None,
                events: Vec::new(),
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BoardState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn publish(&self, version: u64, consumed: u64, weights: HashMap<String, Tensor>) {
        let mut s = self.lock();
        s.version = version;
        s.consumed = consumed;
        s.weights = Arc::new(weights);
        self.changed.notify_all();
    }

    fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    fn fail(&self, why: String) {
        let mut s = self.lock();
        s.failure.get_or_insert(why);
        s.closed = true;
        self.changed.notify_all();
    }

    fn closed(&self) -> bool {
        self.lock().closed
    }

    fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    fn push_events(&self, events: Vec<serde_json::Value>) {
        self.lock().events.extend(events);
    }

    fn take_events(&self) -> Vec<serde_json::Value> {
        std::mem::take(&mut self.lock().events)
    }

    /// Waits until the learner has consumed `consumed` batches; returns
    /// the newest weights and their version, or `None` once closed.
    fn wait(&self, consumed: u64) -> Option<(u64, Arc<HashMap<String, Tensor>>)> {
        let mut s = self.lock();
        while !s.closed && s.consumed < consumed {
            s = self.changed.wait(s).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        (!s.closed).then(|| (s.version, s.weights.clone()))
    }

    /// Sleeps `d` unless the board closes first; false once closed.
    fn sleep(&self, d: Duration) -> bool {
        let s = self.lock();
        let (s, _) =
            self.changed.wait_timeout_while(s, d, |s| !s.closed).unwrap_or_else(std::sync::PoisonError::into_inner);
        !s.closed
    }
}

/// A deep copy of the policy's weights (the optimizer writes the live ones
/// in place).
fn snapshot(model: &crate::model::Transformer) -> TrainResult<HashMap<String, Tensor>> {
    model.named_vars().into_iter().map(|(n, v)| Ok((n, v.as_tensor().copy()?))).collect()
}

/// Calls `f` until the queue answers, backing off 0.1 s → 5 s while it is
/// unavailable and reporting the outage once through `warn`; gives up only
/// when `alive` turns false (`Ok(None)`) or the queue refuses the call.
fn retrying<T>(
    what: &str,
    warn: &mut dyn FnMut(String),
    alive: &mut dyn FnMut(Duration) -> bool,
    mut f: impl FnMut() -> Result<T, QueueError>,
) -> TrainResult<Option<T>> {
    let mut backoff = Duration::from_millis(100);
    let mut reported = false;
    loop {
        match f() {
            Ok(v) => {
                if reported {
                    warn(format!("{what}: the experience queue is back"));
                }
                return Ok(Some(v));
            }
            Err(QueueError::Unavailable(e)) => {
                if !reported {
                    warn(format!("{what}: {e}; retrying with back-off"));
                    reported = true;
                }
                if !alive(backoff) {
                    return Ok(None);
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(TrainError::Queue(e.to_string())),
        }
    }
}

/// Where the batches an actor steps through start in the data order.
struct Positions {
    /// The first batch whose start is not known yet, and that start.
    frontier: (u64, DataPosition),
    starts: BTreeMap<u64, DataPosition>,
}

impl Positions {
    fn new() -> Self {
        Positions { frontier: (0, DataPosition::default()), starts: BTreeMap::new() }
    }

    /// The start of batch `b`, stepping (quietly) over the batches before
    /// it that this actor has not met.
    fn start_of(&mut self, actor: &mut Actor, b: u64, per_batch: usize) -> TrainResult<DataPosition> {
        if let Some(p) = self.starts.get(&b) {
            return Ok(*p);
        }
        while self.frontier.0 <= b {
            let (k, mut pos) = self.frontier;
            self.starts.insert(k, pos);
            actor.next_problems(&mut pos, per_batch, k, true)?;
            self.frontier = (k + 1, pos);
        }
        Ok(self.starts[&b])
    }
}

/// One actor thread: lease a batch, wait for fresh enough weights, produce
/// it, publish it; until the board closes.
fn actor_loop(index: usize, mut actor: Actor, cfg: &TrainConfig, board: &Board, open: &QueueOpener) -> TrainResult<()> {
    let owner = format!("{}-{}-{index}", std::process::id(), derived_owner_nonce());
    let lease = Duration::from_secs_f64(cfg.queue.lease_s);
    let (policy, _) = load_policy(&cfg.model)?;
    let mut have: Option<u64> = None;
    let mut queue = open().map_err(|e| TrainError::Queue(e.to_string()))?;
    let mut positions = Positions::new();
    let name = format!("actor {index}");
    let mut warn = |w: String| eprintln!("warning: {w}");
    let mut alive = |d: Duration| board.sleep(d);
    while !board.closed() {
        let Some(b) = retrying(&name, &mut warn, &mut alive, || queue.claim_batch(&owner, lease))? else {
            break;
        };
        let Some((version, weights)) = board.wait(b.saturating_sub(cfg.actors.max_staleness)) else {
            break;
        };
        if have != Some(version) {
            for (n, v) in policy.named_vars() {
                let w = weights.get(&n).ok_or_else(|| TrainError::Queue(format!("weights lack `{n}`")))?;
                v.set(&w.to_dtype(DType::F32)?)?;
            }
            have = Some(version);
        }
        let mut pos = positions.start_of(&mut actor, b, cfg.prompts_per_iter)?;
        let produced = actor.produce(&policy, b, &mut pos, version);
        board.push_events(actor.take_events());
        let produced = produced?;
        let Some(slot) = retrying(&name, &mut warn, &mut alive, || queue.publish_batch(b, &owner, &produced.entries))?
        else {
            break;
        };
        if slot.is_none() {
            board.push_events(vec![serde_json::json!({
                "event": "lease_lost",
                "actor": owner,
                "batch": b,
                "why": "the batch's lease ran out and another actor took it; this copy was not published",
            })]);
        }
    }
    Ok(())
}

/// A per-start nonce, so an actor restarted with the same pid and index
/// does not inherit its predecessor's leases.
fn derived_owner_nonce() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

impl Trainer {
    /// Runs the remaining iterations asynchronously: `actors.count` actor
    /// threads produce batches into the queue `open` gives, while this
    /// thread learns from them (see the module docs). Evaluations,
    /// checkpoints, metrics and `stop` behave as in [`Trainer::run`]; each
    /// metrics line also carries the queue's side ([`QueueMetrics`]).
    pub fn run_async(
        &mut self,
        open: &QueueOpener,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Outcome> {
        if self.cfg.eval_at_start && !self.progress.evaluated_start {
            self.evaluate(on_event)?;
            self.progress.evaluated_start = true;
        }
        if self.progress.iteration >= self.cfg.iterations {
            return Ok(Outcome::Finished);
        }
        let queue_err = |e: QueueError| TrainError::Queue(e.to_string());
        let mut queue = open().map_err(queue_err)?;
        let (next, pending) = self.progress.queue.restore_plan();
        queue.restore_batches(next, &pending).map_err(queue_err)?;
        // This process's actor threads are the run's only actors: leases
        // left by an earlier (killed) process are dead.
        queue.expire_leases().map_err(queue_err)?;
        let board = Board::new(self.progress.iteration as u64, self.progress.queue.consumed(), snapshot(&self.model)?);
        let actors: Vec<Actor> = (0..self.cfg.actors.count).map(|_| self.actor.fork()).collect::<TrainResult<_>>()?;
        let cfg = self.cfg.clone();
        std::thread::scope(|scope| {
            let handles: Vec<_> = actors
                .into_iter()
                .enumerate()
                .map(|(i, actor)| {
                    let (cfg, board) = (&cfg, &board);
                    scope.spawn(move || {
                        let r = actor_loop(i, actor, cfg, board, open);
                        if let Err(e) = &r {
                            board.fail(format!("actor {i}: {e}"));
                        }
                        r
                    })
                })
                .collect();
            let out = self.learn_loop(queue.as_mut(), &board, stop, on_event);
            board.close();
            for h in handles {
                // An actor's error already reached the learner through the
                // board; a panic is re-raised here.
                let _ = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            }
            out
        })
    }

    /// The learner's side of [`Trainer::run_async`].
    fn learn_loop(
        &mut self,
        queue: &mut dyn ExperienceQueue,
        board: &Board,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Outcome> {
        let need = self.cfg.prompts_per_iter;
        let g = self.cfg.group_size;
        let limits = EntryLimits {
            max_group: g,
            max_tokens: self.model.config().max_position_embeddings,
            vocab: self.tok.vocab_size(),
            ..EntryLimits::default()
        };
        let s = self.cfg.actors.max_staleness;
        let keep = self.cfg.replay.capacity_iters.max(1) as u64;
        let poll = Duration::from_millis(20);
        while self.progress.iteration < self.cfg.iterations {
            let iter = self.progress.iteration;
            let t_start = Instant::now();
            on_event(Event::Phase { iter, name: "wait" });
            let mut pos = self.progress.queue.clone();
            let mut taken: Vec<GroupEntry> = Vec::with_capacity(need);
            let mut qm = QueueMetrics::default();
            let mut fresh_lag = BTreeMap::<u64, usize>::new();
            let mut rejected = Vec::new();
            while taken.len() < need {
                if let Some(why) = board.failure() {
                    return Err(TrainError::Queue(why));
                }
                if stop.load(Ordering::SeqCst) {
                    // Nothing of this iteration was learned: the checkpoint
                    // keeps the position from before it.
                    let p = self.save_checkpoint()?;
                    on_event(Event::Checkpoint(&p));
                    return Ok(Outcome::Stopped);
                }
                let mut warn = |w: String| eprintln!("warning: {w}");
                let mut alive = |d: Duration| {
                    std::thread::sleep(d);
                    !stop.load(Ordering::SeqCst) && board.failure().is_none()
                };
                let after = pos.read;
                let Some(read) = retrying("learner", &mut warn, &mut alive, || {
                    queue.read_after(after, need - taken.len(), &limits)
                })?
                else {
                    continue;
                };
                if read.is_empty() {
                    std::thread::sleep(poll);
                    continue;
                }
                for (id, entry) in read {
                    pos.read = Some(id);
                    match entry.and_then(|e| match e.responses.len() == g {
                        true => Ok(e),
                        false => Err(format!("{} responses; this run's group_size is {g}", e.responses.len())),
                    }) {
                        Err(why) => {
                            qm.rejected += 1;
                            rejected.push(serde_json::json!({
                                "event": "entry_rejected",
                                "iteration": iter,
                                "id": id.to_string(),
                                "reason": why,
                            }));
                        }
                        Ok(e) => {
                            pos.mark_done(e.iteration);
                            let lag = (iter as u64).saturating_sub(e.weight_version);
                            if lag > s {
                                qm.stale_dropped += 1;
                            } else {
                                *fresh_lag.entry(lag).or_default() += 1;
                                taken.push(e);
                            }
                        }
                    }
                }
            }
            qm.wait_s = t_start.elapsed().as_secs_f64();
            qm.groups = taken.len();
            qm.fresh_lag = fresh_lag.into_iter().collect();
            for e in rejected.into_iter().chain(board.take_events()) {
                if e["event"] == "entry_rejected" {
                    eprintln!("warning: queue entry {} rejected: {}", e["id"], e["reason"]);
                }
                self.events.write(&e)?;
            }
            // The queue keeps the slots of the last K iterations.
            let newest = pos.read.map_or(0, |id| id.iteration);
            let mut warn = |w: String| eprintln!("warning: {w}");
            let mut alive = |d: Duration| {
                std::thread::sleep(d);
                !stop.load(Ordering::SeqCst)
            };
            if newest + 1 > keep {
                retrying("learner", &mut warn, &mut alive, || queue.trim_before(newest + 1 - keep))?;
            }
            qm.held = retrying("learner", &mut warn, &mut alive, || queue.len())?.unwrap_or(0);
            let m = self.learn(&taken, qm.wait_s, t_start, Some(qm), on_event)?;
            self.progress.queue = pos;
            if self.progress.iteration < self.cfg.iterations {
                // After the last iteration the actors are closed, not fed.
                board.publish(self.progress.iteration as u64, self.progress.queue.consumed(), snapshot(&self.model)?);
            }
            if let Some(out) = self.after_iteration(&m, stop, on_event)? {
                return Ok(out);
            }
        }
        Ok(Outcome::Finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_track_consumed_batches_and_what_to_reissue() {
        let mut p = QueuePosition::default();
        for b in [1, 0, 4, 2] {
            p.mark_done(b);
        }
        assert_eq!((p.done_below, p.done_above.clone(), p.consumed()), (3, vec![4], 4));
        assert_eq!(p.restore_plan(), (5, vec![3]));
        p.mark_done(4);
        assert_eq!(p.consumed(), 4);
        assert_eq!(QueuePosition::default().restore_plan(), (0, vec![]));
    }
}
