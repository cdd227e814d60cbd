//! `llm train --async`: actor threads sample batches ahead of the learner
//! and publish them to an [`ExperienceQueue`]; the learner takes the groups
//! in queue order, drops those whose weight-version lag exceeds
//! `actors.max_staleness`, learns from the rest exactly as the synchronous
//! trainer does (`Trainer::learn`) and hands its new weights to the
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
//!
//! Two shapes, one loop each: [`Trainer::run_async`] runs actor threads
//! beside the learner (weights handed over in memory), while
//! [`Trainer::run_learner`] and [`run_actor`] are the learner and actor
//! processes of `llm learn` / `llm actor` on different machines, whose
//! weights travel through a [`WeightChannel`] (a shared folder announced in
//! Redis, `r2vpo_queue::SharedWeights`).
//!
//! In a data-parallel job (docs/distributed.md) rank 0 alone holds the
//! queue, the actors and the weight channel: each iteration it sends the
//! groups it took ([`Lead`]) to the other ranks, which learn from them as
//! it does ([`Trainer::follow_learner`]), so the staleness bound holds per
//! global step and the job trains what one learner trains.
//!
//! Where an actor's samples come from: in-process by default, or from
//! rollout servers (`rollout.backend = "http"`): each actor then owns its
//! servers (actor thread `i` of `actors.count` takes every `count`-th URL
//! of `rollout.urls`; an actor process takes all of its own
//! `rollout.urls`) and pushes every weight version it fetches to them
//! before sampling, so its servers never sample from weights older than
//! the staleness bound allows and two actors never push to one server.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::metrics::QueueMetrics;
use super::{
    load_policy, Actor, BatchShare, DataPosition, Event, Outcome, TrainConfig, TrainError, TrainResult, Trainer,
};
use crate::queue::{
    retry_unavailable, sleep_unless, EntryLimits, ExperienceQueue, GroupEntry, QueueError, QueuePosition,
};
use crate::rollout::RolloutSource;
use crate::weights::{Fetched, WeightChannel, Weights, WeightsError};

/// How many batches beyond the staleness bound an entry's batch number may
/// be before the learner rejects it as foreign (actors re-issue expired
/// leases, so a few batches ahead are legitimate; billions are not).
const MAX_BATCHES_AHEAD: u64 = 1024;

/// Opens one handle on the run's queue (each thread gets its own).
pub type QueueOpener = dyn Fn() -> Result<Box<dyn ExperienceQueue>, QueueError> + Sync;

/// Makes actor thread `i`'s rollout source (its own rollout servers); the
/// HTTP client lives in `r2vpo-serve`, so the caller supplies it.
pub type SourceFactory<'a> = dyn Fn(usize) -> TrainResult<Box<dyn RolloutSource>> + Sync + 'a;

/// The learner's newest weights and progress, shared with actor threads.
struct Board {
    state: Mutex<BoardState>,
    changed: Condvar,
}

struct BoardState {
    consumed: u64,
    weights: Weights,
    closed: bool,
    failure: Option<String>,
    events: Vec<serde_json::Value>,
}

impl Board {
    fn new(consumed: u64, weights: Weights) -> Self {
        Board {
            state: Mutex::new(BoardState { consumed, weights, closed: false, failure: None, events: Vec::new() }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BoardState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fail(&self, why: String) {
        let mut s = self.lock();
        s.failure.get_or_insert(why);
        s.closed = true;
        self.changed.notify_all();
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
}

impl WeightChannel for Board {
    fn publish(&self, weights: &Weights, consumed: u64) -> Result<(), WeightsError> {
        let mut s = self.lock();
        s.consumed = consumed;
        s.weights = weights.clone();
        self.changed.notify_all();
        Ok(())
    }

    fn fetch(&self, consumed: u64, have: Option<u64>, wait: Duration) -> Result<Fetched, WeightsError> {
        let s = self.lock();
        let (s, _) = self
            .changed
            .wait_timeout_while(s, wait, |s| !s.closed && s.consumed < consumed)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(if s.closed {
            Fetched::Closed
        } else if s.consumed < consumed {
            Fetched::Pending
        } else if have == Some(s.weights.version) {
            Fetched::Current(s.weights.version)
        } else {
            Fetched::New(s.weights.clone())
        })
    }

    fn close(&self) -> Result<(), WeightsError> {
        self.lock().closed = true;
        self.changed.notify_all();
        Ok(())
    }

    fn closed(&self) -> bool {
        self.lock().closed
    }
}

/// [`retry_unavailable`] from 0.1 s, a refusal as the run's error.
fn retrying<T>(
    what: &str,
    warn: &mut dyn FnMut(String),
    alive: &mut dyn FnMut(Duration) -> bool,
    f: impl FnMut() -> Result<T, QueueError>,
) -> TrainResult<Option<T>> {
    retry_unavailable(what, Duration::from_millis(100), warn, alive, f).map_err(|e| TrainError::Queue(e.to_string()))
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

/// One actor: lease a batch, wait for fresh enough weights, produce it,
/// publish it; until the run ends or `stop` is raised. Events
/// (`events.jsonl` lines: skipped prompts, lost leases) go to `on_events`.
fn actor_loop(
    name: &str,
    mut actor: Actor,
    cfg: &TrainConfig,
    weights: &dyn WeightChannel,
    queue: &mut dyn ExperienceQueue,
    stop: &AtomicBool,
    on_events: &dyn Fn(Vec<serde_json::Value>),
) -> TrainResult<()> {
    let owner = format!("{name}-{}-{}", std::process::id(), derived_owner_nonce());
    let lease = Duration::from_secs_f64(cfg.queue.lease_s);
    let (config, source, _) = load_policy(&cfg.model)?;
    let policy = super::new_actor_policy(cfg, &config, source.as_ref())?;
    let mut have: Option<u64> = None;
    let mut positions = Positions::new();
    let mut warn = |w: String| eprintln!("warning: {w}");
    let running = || !stop.load(Ordering::SeqCst) && !weights.closed();
    let mut alive = |d: Duration| sleep_unless(stop, d) && running();
    // Batches leased but set aside for an older, expired one.
    let mut held: Vec<u64> = Vec::new();
    let poll = Duration::from_secs_f64((cfg.queue.lease_s / 4.0).clamp(0.05, 1.0));
    'batches: while running() {
        let mut b = match held.pop() {
            Some(b) => b,
            None => match retrying(name, &mut warn, &mut alive, || queue.claim_batch(&owner, lease))? {
                Some(b) => b,
                None => break,
            },
        };
        let version = loop {
            match weights.fetch(b.saturating_sub(cfg.actors.max_staleness), have, poll)? {
                Fetched::Current(v) => break v,
                Fetched::New(w) => {
                    policy.apply_weights(&w)?;
                    break w.version;
                }
                Fetched::Closed => break 'batches,
                // A signal ends the wait for weights too (the learner may
                // be far behind, or gone).
                Fetched::Pending if stop.load(Ordering::SeqCst) => break 'batches,
                Fetched::Pending => {
                    // Keep this lease while waiting, and make an older batch
                    // whose actor died first: nothing moves until it exists.
                    let Some(mine) = retrying(name, &mut warn, &mut alive, || queue.renew_lease(b, &owner, lease))?
                    else {
                        break 'batches;
                    };
                    if !mine {
                        continue 'batches;
                    }
                    if let Some(Some(older)) =
                        retrying(name, &mut warn, &mut alive, || queue.claim_expired(&owner, lease))?
                    {
                        held.push(b);
                        b = older;
                    }
                }
            }
        };
        have = Some(version);
        let mut pos = positions.start_of(&mut actor, b, cfg.prompts_per_iter)?;
        let produced = actor.produce(policy.as_ref(), b, &mut pos, version, BatchShare::WHOLE);
        on_events(actor.take_events());
        let produced = produced?;
        let Some(slot) = retrying(name, &mut warn, &mut alive, || queue.publish_batch(b, &owner, &produced.entries))?
        else {
            break;
        };
        if slot.is_none() {
            let why = if weights.closed() {
                "the run ended before this batch was published; the learner needs it no more".to_string()
            } else {
                match queue.lease_owner(b) {
                    Ok(Some(other)) => {
                        format!("the batch's lease ran out and {other} took it; this copy was not published")
                    }
                    Ok(None) => "nobody holds the batch's lease any more (the run's leases were dropped); this copy \
                                 was not published"
                        .to_string(),
                    Err(e) => format!("the batch's lease is no longer this actor's ({e}); this copy was not published"),
                }
            };
            on_events(vec![serde_json::json!({
                "event": "lease_lost",
                "actor": owner,
                "batch": b,
                "why": why,
            })]);
        }
    }
    Ok(())
}

/// How long a learner waits on the queue before it says which batch it
/// waits for and who holds that batch's lease.
const LEASE_NOTE_AFTER: Duration = Duration::from_secs(20);

/// Tells, once per batch and holder, what a learner that has waited
/// [`LEASE_NOTE_AFTER`] for the queue waits on: batch `batch` (the oldest
/// it has not consumed), its lease's holder and when that lease runs out,
/// so a user whose actor died holding a lease (SIGKILL) knows the learner
/// is not stuck and when it goes on.
fn tell_whose_lease(queue: &mut dyn ExperienceQueue, batch: u64, told: &mut Option<(u64, Option<String>)>) {
    let Ok(owner) = queue.lease_owner(batch) else { return };
    if told.as_ref().is_some_and(|(b, o)| *b == batch && *o == owner) {
        return;
    }
    let line = match &owner {
        Some(o) => match queue.lease_left(batch) {
            Ok(Some(left)) => {
                let until = std::time::SystemTime::now() + left;
                let secs = until.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
                format!(
                    "learner: waiting for batch {batch}, leased by {o} until {:02}:{:02}:{:02} UTC ({:.0} s from \
                     now); if {o} has stopped, another actor takes the batch then",
                    secs / 3600,
                    secs / 60 % 60,
                    secs % 60,
                    left.as_secs_f64()
                )
            }
            _ => format!("learner: waiting for batch {batch}, leased by {o}"),
        },
        None => format!("learner: waiting for batch {batch}, which no actor holds yet (is an actor running?)"),
    };
    eprintln!("{line}");
    *told = Some((batch, owner));
}

/// An actor process (`r2vpo llm actor`): produces batches for the run that
/// `cfg` describes (its problems, model and reward) into `queue`, with the
/// weights `weights` announces, until the learner ends the run or `stop` is
/// raised. Samples come from `source` (this actor's rollout servers) when
/// given, else in-process. Warnings and events go to stderr.
pub fn run_actor(
    cfg: &TrainConfig,
    name: &str,
    queue: &mut dyn ExperienceQueue,
    weights: &dyn WeightChannel,
    source: Option<Box<dyn RolloutSource>>,
    stop: &AtomicBool,
) -> TrainResult<()> {
    cfg.validate()?;
    let (config, _, tok) = load_policy(&cfg.model)?;
    let context = config.max_position_embeddings;
    let loaded = crate::data::load_problems_reporting(&cfg.data)?;
    for r in &loaded.skipped {
        eprintln!("warning: {r}");
    }
    let reward = Arc::new(super::VerifierReward(cfg.verify.clone()));
    let mut actor = Actor::new(cfg.clone(), tok, loaded.problems, reward, context)?;
    if let Some(source) = source {
        eprintln!("{name}: sampling from {}", source.describe());
        actor.set_rollout_source(source)?;
    }
    let print = |events: Vec<serde_json::Value>| {
        for e in events {
            eprintln!("event: {e}");
        }
    };
    actor_loop(name, actor, cfg, weights, queue, stop, &print)
}

/// A per-start nonce, so an actor restarted with the same pid and index
/// does not inherit its predecessor's leases.
fn derived_owner_nonce() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// What rank 0 of a data-parallel asynchronous learner sends the other
/// ranks before each iteration.
#[derive(serde::Serialize, serde::Deserialize)]
enum Lead {
    /// The groups taken from the queue for the next iteration, with the
    /// queue's side of it and the queue position after them.
    Batch { taken: Vec<GroupEntry>, queue: QueueMetrics, position: QueuePosition },
    /// Rank 0 ends the run before the next iteration (a stop, or a fault
    /// of its queue or weight channel: `fault`), with a checkpoint into
    /// which every rank gives its share of the optimizer state.
    End { fault: Option<String> },
}

impl Trainer {
    /// A rank other than 0 of a data-parallel asynchronous learner (`llm
    /// train --async` or `llm learn` under a launcher): learns from the
    /// groups rank 0 takes from its queue, iteration by iteration, until
    /// the run ends or rank 0 ends it.
    pub fn follow_learner(&mut self, stop: &AtomicBool, on_event: &mut dyn FnMut(Event)) -> TrainResult<Outcome> {
        self.log_start()?;
        // Rank 0's start-of-run evaluation, shared (`Trainer::evaluate`).
        if self.cfg.eval_at_start && !self.progress.evaluated_start {
            self.evaluate(on_event)?;
            self.progress.evaluated_start = true;
        }
        while self.progress.iteration < self.cfg.iterations {
            if self.dp.is_writer() {
                return Err(TrainError::Config {
                    field: "dist".into(),
                    message: "a follower needs the job's other ranks".into(),
                });
            }
            let lead: Lead = self.dp.receive("queue batch")?;
            match lead {
                Lead::Batch { taken, queue, position } => {
                    let t_start = Instant::now();
                    let m = self.learn(&taken, queue.wait_s, t_start, Some(queue), on_event)?;
                    self.progress.queue = position;
                    if let Some(out) = self.after_iteration(&m, stop, on_event)? {
                        return Ok(out);
                    }
                }
                Lead::End { fault } => {
                    self.checkpoint()?;
                    return match fault {
                        None => Ok(Outcome::Stopped),
                        Some(f) => Err(TrainError::Queue(format!("rank 0 ended the run: {f}"))),
                    };
                }
            }
        }
        Ok(Outcome::Finished)
    }

    /// Rank 0 of a data-parallel asynchronous learner: sends `lead` to the
    /// other ranks (nothing alone).
    fn lead(&mut self, lead: &Lead) -> TrainResult<()> {
        self.dp.send(lead, "a lead")?;
        Ok(())
    }

    /// Ends the run before the next iteration with a checkpoint: the other
    /// ranks (told by [`Trainer::lead`]) give their shares of the optimizer
    /// state first.
    fn end_with_checkpoint(&mut self, fault: Option<String>) -> TrainResult<std::path::PathBuf> {
        self.lead(&Lead::End { fault })?;
        self.checkpoint()?.ok_or_else(|| TrainError::Queue("only rank 0 ends an asynchronous run".into()))
    }

    /// Runs the remaining iterations asynchronously: `actors.count` actor
    /// threads produce batches into the queue `open` gives, while this
    /// thread learns from them (see the module docs). Actor `i` samples
    /// from `sources(i)` when given, else in-process. Evaluations,
    /// checkpoints, metrics and `stop` behave as in [`Trainer::run`]; each
    /// metrics line also carries the queue's side ([`QueueMetrics`]).
    pub fn run_async(
        &mut self,
        open: &QueueOpener,
        sources: Option<&SourceFactory<'_>>,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Outcome> {
        let mut queue = self.open_learner_queue(open, on_event)?;
        // This process's actor threads are the run's only actors: leases
        // left by an earlier (killed) process are dead.
        queue.expire_leases().map_err(|e| TrainError::Queue(e.to_string()))?;
        let first = self.backend.export_for_actors(self.progress.iteration as u64)?;
        let board = Board::new(self.progress.queue.consumed(), first);
        let actors: Vec<Actor> = (0..self.cfg.actors.count)
            .map(|i| {
                let mut a = self.actor.fork()?;
                if let Some(make) = sources {
                    a.set_rollout_source(make(i)?)?;
                }
                Ok(a)
            })
            .collect::<TrainResult<_>>()?;
        let cfg = self.cfg.clone();
        let halt = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let handles: Vec<_> = actors
                .into_iter()
                .enumerate()
                .map(|(i, actor)| {
                    let (cfg, board, halt) = (&cfg, &board, &halt);
                    scope.spawn(move || {
                        let push = |events| board.push_events(events);
                        let r = open().map_err(|e| TrainError::Queue(e.to_string())).and_then(|mut q| {
                            actor_loop(&format!("actor {i}"), actor, cfg, board, q.as_mut(), halt, &push)
                        });
                        if let Err(e) = &r {
                            board.fail(format!("actor {i}: {e}"));
                        }
                        r
                    })
                })
                .collect();
            let out = self.learn_loop(queue.as_mut(), &board, Some(&board), stop, on_event);
            let _ = board.close();
            for h in handles {
                // An actor's error already reached the learner through the
                // board; a panic is re-raised here.
                let _ = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            }
            out
        })
    }

    /// The learner process (`r2vpo llm learn`): [`Trainer::run_async`]
    /// without actor threads; actor processes ([`run_actor`]) elsewhere
    /// produce into the queue and receive the weights through `weights`,
    /// which is closed when the run finishes.
    pub fn run_learner(
        &mut self,
        open: &QueueOpener,
        weights: &dyn WeightChannel,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Outcome> {
        let mut queue = self.open_learner_queue(open, on_event)?;
        let first = self.backend.export_for_actors(self.progress.iteration as u64)?;
        let out = match weights.publish(&first, self.progress.queue.consumed()) {
            Ok(()) => self.learn_loop(queue.as_mut(), weights, None, stop, on_event),
            Err(e) => self.settle(Err(e.into()), stop, on_event),
        };
        if matches!(out, Ok(Outcome::Finished)) {
            weights.close()?;
        }
        out
    }

    /// The `run_started` line and the start-of-run evaluation, then the
    /// learner's queue handle with its batch counter restored from the
    /// checkpoint.
    fn open_learner_queue(
        &mut self,
        open: &QueueOpener,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Box<dyn ExperienceQueue>> {
        self.log_start()?;
        if self.cfg.eval_at_start && !self.progress.evaluated_start {
            self.evaluate(on_event)?;
            self.progress.evaluated_start = true;
        }
        let queue_err = |e: QueueError| TrainError::Queue(e.to_string());
        let mut queue = open().map_err(queue_err)?;
        let (next, pending) = self.progress.queue.restore_plan();
        queue.restore_batches(next, &pending).map_err(queue_err)?;
        Ok(queue)
    }

    /// The learner's side of [`Trainer::run_async`] and
    /// [`Trainer::run_learner`]; `board` carries the actor threads' events
    /// and failures when there are any. A run that stops on a fault of its
    /// queue or weight channel (an emptied stream, a failed actor) writes a
    /// checkpoint first, also before its first one is due, so `--resume`
    /// continues from where it stood; a signal met while waiting on them is
    /// a stop, with its checkpoint.
    fn learn_loop(
        &mut self,
        queue: &mut dyn ExperienceQueue,
        weights: &dyn WeightChannel,
        board: Option<&Board>,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Outcome> {
        let out = self.learn_until(queue, weights, board, stop, on_event);
        self.settle(out, stop, on_event)
    }

    /// How a learner whose loop returned `out` ends: a fault of its queue
    /// or weight channel writes a checkpoint first (see
    /// [`Trainer::learn_loop`]), and is a stop when a signal came meanwhile.
    fn settle(
        &mut self,
        out: TrainResult<Outcome>,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Outcome> {
        let fault = matches!(out, Err(TrainError::Queue(_) | TrainError::Weights(WeightsError::Channel(_))));
        if !fault {
            return out;
        }
        // Every queue and channel call sits between iterations, so the
        // progress here is a whole iteration's (the one before the wait).
        let why = out.as_ref().err().map(ToString::to_string);
        match self.end_with_checkpoint(why) {
            Ok(p) => on_event(Event::Checkpoint(&p)),
            Err(e) => {
                let fault = out.err().map_or_else(String::new, |f| f.to_string());
                return Err(TrainError::Queue(format!("{fault}; writing a checkpoint after it failed too: {e}")));
            }
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(Outcome::Stopped);
        }
        out
    }

    /// [`Trainer::learn_loop`] up to its first fault.
    fn learn_until(
        &mut self,
        queue: &mut dyn ExperienceQueue,
        weights: &dyn WeightChannel,
        board: Option<&Board>,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(Event),
    ) -> TrainResult<Outcome> {
        if self.progress.iteration >= self.cfg.iterations {
            return Ok(Outcome::Finished);
        }
        let failure = || board.and_then(Board::failure);
        let need = self.cfg.prompts_per_iter;
        let g = self.cfg.group_size;
        let limits = EntryLimits {
            max_group: g,
            max_tokens: self.backend.config().max_position_embeddings,
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
            let mut told: Option<(u64, Option<String>)> = None;
            while taken.len() < need {
                if let Some(why) = failure() {
                    // An actor gave up (e.g. none of its rollout servers is
                    // left); `learn_loop` keeps what was learned.
                    return Err(TrainError::Queue(why));
                }
                if stop.load(Ordering::SeqCst) {
                    // Nothing of this iteration was learned: the checkpoint
                    // keeps the position from before it.
                    let p = self.end_with_checkpoint(None)?;
                    on_event(Event::Checkpoint(&p));
                    return Ok(Outcome::Stopped);
                }
                let mut warn = |w: String| eprintln!("warning: {w}");
                let mut alive = |d: Duration| sleep_unless(stop, d) && failure().is_none();
                let after = pos.read;
                let Some(read) = retrying("learner", &mut warn, &mut alive, || {
                    queue.read_after(after, need - taken.len(), &limits)
                })?
                else {
                    continue;
                };
                if read.is_empty() {
                    if t_start.elapsed() >= LEASE_NOTE_AFTER {
                        tell_whose_lease(queue, pos.done_below, &mut told);
                    }
                    std::thread::sleep(poll);
                    continue;
                }
                for (id, entry) in read {
                    pos.read = Some(id);
                    // A batch number far beyond anything leased (the learner
                    // has consumed `consumed`; actors lease at most
                    // max_staleness + a few ahead) is a foreign or corrupt
                    // entry: taking it would make the checkpoint's queue
                    // position span billions of batches.
                    let horizon = pos.consumed() + s + self.cfg.actors.count as u64 + MAX_BATCHES_AHEAD;
                    match entry.and_then(|e| {
                        if e.responses.len() != g {
                            Err(format!("{} responses; this run's group_size is {g}", e.responses.len()))
                        } else if e.iteration > horizon {
                            Err(format!("batch {} is far ahead of the learner (at most {horizon})", e.iteration))
                        } else {
                            Ok(e)
                        }
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
                            if qm.batches.last() != Some(&e.iteration) {
                                qm.batches.push(e.iteration);
                            }
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
            for e in rejected.into_iter().chain(board.map(Board::take_events).unwrap_or_default()) {
                if e["event"] == "entry_rejected" {
                    eprintln!("warning: queue entry {} rejected: {}", e["id"], e["reason"]);
                }
                self.events.write(&e)?;
            }
            // The queue keeps the slots of the last K iterations.
            let newest = pos.read.map_or(0, |id| id.iteration);
            let mut warn = |w: String| eprintln!("warning: {w}");
            let mut alive = |d: Duration| sleep_unless(stop, d);
            if newest + 1 > keep {
                retrying("learner", &mut warn, &mut alive, || queue.trim_before(newest + 1 - keep))?;
            }
            qm.held = retrying("learner", &mut warn, &mut alive, || queue.len())?.unwrap_or(0);
            self.lead(&Lead::Batch { taken: taken.clone(), queue: qm.clone(), position: pos.clone() })?;
            let m = self.learn(&taken, qm.wait_s, t_start, Some(qm), on_event)?;
            self.progress.queue = pos;
            // The actors get the new weights before any evaluation or
            // checkpoint of this iteration, so they sample meanwhile.
            let published = if self.progress.iteration < self.cfg.iterations {
                // After the last iteration the actors are closed, not fed.
                let w = self.backend.export_for_actors(self.progress.iteration as u64)?;
                weights.publish(&w, self.progress.queue.consumed())
            } else {
                Ok(())
            };
            // The other ranks of a data-parallel job are in this
            // iteration's last collectives: a fault of the channel ends the
            // run (`settle`) only once they are through them.
            if let Some(out) = self.after_iteration(&m, stop, on_event)? {
                return Ok(out);
            }
            published?;
        }
        Ok(Outcome::Finished)
    }
}
