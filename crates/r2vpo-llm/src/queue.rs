//! The experience-queue seam between rollout actors and a learner
//! (asynchronous R²VPO-OFF, Algorithm 2 across processes).
//!
//! An actor publishes one [`GroupEntry`] per prompt group: the prompt, the
//! G responses with their behaviour log-probs, rewards and advantages, the
//! weight version that generated them and the iteration. Entries are keyed
//! `<iteration>-<seq>` ([`EntryId`]), so the queue is ordered by iteration
//! and "the last K iterations" is one trim below an ID
//! ([`ExperienceQueue::trim_before`], Redis's `XTRIM MINID`), never a count
//! of entries.
//!
//! A queue carries bytes; [`GroupEntry::decode`] is the only way back, and
//! it checks the schema version, every length, finiteness and size, so a
//! malformed or hostile entry is rejected and counted, never applied and
//! never a panic. The learner never executes anything it reads.
//!
//! One implementation per real thing: [`MemoryQueue`] (in-process, the
//! embedded default) here, the Redis Stream in the `r2vpo-queue` crate (so
//! this crate keeps no network dependency).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Version of the [`GroupEntry`] layout; a reader refuses any other.
pub const ENTRY_SCHEMA: u32 = 2;

/// Position of an entry: iteration, then sequence within the iteration.
/// Written `<iteration>-<seq>`, the shape of a Redis Stream ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EntryId {
    /// The actor's iteration (the first part).
    pub iteration: u64,
    /// Order within the iteration (assigned by the queue).
    pub seq: u64,
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.iteration, self.seq)
    }
}

impl FromStr for EntryId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s.split_once('-').ok_or_else(|| format!("entry id `{s}` is not <iteration>-<seq>"))?;
        Ok(EntryId {
            iteration: a.parse().map_err(|_| format!("entry id `{s}`: bad iteration"))?,
            seq: b.parse().map_err(|_| format!("entry id `{s}`: bad sequence"))?,
        })
    }
}

/// Bounds a reader enforces on every entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryLimits {
    /// Largest encoded entry in bytes.
    pub max_bytes: usize,
    /// Most responses in a group.
    pub max_group: usize,
    /// Most tokens in a prompt or a response.
    pub max_tokens: usize,
    /// Vocabulary size: every token id must be below it.
    pub vocab: usize,
}

impl Default for EntryLimits {
    fn default() -> Self {
        EntryLimits { max_bytes: 16 << 20, max_group: 1024, max_tokens: 1 << 17, vocab: u32::MAX as usize }
    }
}

/// One prompt group, as an actor publishes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupEntry {
    /// [`ENTRY_SCHEMA`] of the writer.
    pub schema: u32,
    /// The actor's iteration (the entry id's first part).
    pub iteration: u64,
    /// Index of the problem in the training set.
    pub problem: usize,
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Response token ids, one list per sample.
    pub responses: Vec<Vec<u32>>,
    /// Behaviour log-probs per response token (log π_off).
    pub behaviour_logp: Vec<Vec<f32>>,
    /// Reward per sample.
    pub rewards: Vec<f32>,
    /// Verifier verdict per sample.
    pub correct: Vec<bool>,
    /// Group-relative advantage per sample.
    pub advantages: Vec<f32>,
    /// Whether each response was cut by `max_new_tokens`.
    pub truncated: Vec<bool>,
    /// Sum of each response's per-token entropies (nats; 0 when the
    /// rollout server reports none).
    pub entropy_sum: Vec<f64>,
    /// How many tokens' entropies `entropy_sum` adds (0 when unreported).
    pub entropy_tokens: Vec<u32>,
    /// Weight version that generated the responses.
    pub weight_version: u64,
}

impl GroupEntry {
    /// The bytes a queue stores (JSON: readable with `redis-cli`, and the
    /// parse is strict).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a GroupEntry always serialises")
    }

    /// Parses and checks an entry; the error says what is wrong.
    pub fn decode(bytes: &[u8], limits: &EntryLimits) -> Result<GroupEntry, String> {
        if bytes.len() > limits.max_bytes {
            return Err(format!("{} bytes, above the limit of {}", bytes.len(), limits.max_bytes));
        }
        // The schema first, so a future layout is named as such rather than
        // as a parse error.
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        match v.get("schema").and_then(serde_json::Value::as_u64) {
            Some(s) if s == u64::from(ENTRY_SCHEMA) => {}
            Some(s) => return Err(format!("schema {s}; this reader reads schema {ENTRY_SCHEMA}")),
            None => return Err("no schema field".into()),
        }
        let e: GroupEntry = serde_json::from_value(v).map_err(|e| format!("bad entry: {e}"))?;
        e.check(limits)?;
        Ok(e)
    }

    /// Lengths agree, values are finite, log-probs are ≤ 0, sizes and token
    /// ids are within `limits`.
    pub fn check(&self, limits: &EntryLimits) -> Result<(), String> {
        let g = self.responses.len();
        if g == 0 || g > limits.max_group {
            return Err(format!("{g} responses (1..={})", limits.max_group));
        }
        for (name, n) in [
            ("behaviour_logp", self.behaviour_logp.len()),
            ("rewards", self.rewards.len()),
            ("correct", self.correct.len()),
            ("advantages", self.advantages.len()),
            ("truncated", self.truncated.len()),
            ("entropy_sum", self.entropy_sum.len()),
            ("entropy_tokens", self.entropy_tokens.len()),
        ] {
            if n != g {
                return Err(format!("{n} {name} for {g} responses"));
            }
        }
        if self.prompt_ids.is_empty() || self.prompt_ids.len() > limits.max_tokens {
            return Err(format!("prompt of {} tokens", self.prompt_ids.len()));
        }
        let ids = self.prompt_ids.iter().chain(self.responses.iter().flatten());
        if let Some(t) = ids.into_iter().find(|&&t| t as usize >= limits.vocab) {
            return Err(format!("token id {t} outside the vocabulary of {}", limits.vocab));
        }
        for (i, (r, lp)) in self.responses.iter().zip(&self.behaviour_logp).enumerate() {
            if r.is_empty() || r.len() > limits.max_tokens {
                return Err(format!("response {i} has {} tokens", r.len()));
            }
            if lp.len() != r.len() {
                return Err(format!("response {i}: {} log-probs for {} tokens", lp.len(), r.len()));
            }
            if let Some(x) = lp.iter().find(|x| !(x.is_finite() && **x <= 1e-6)) {
                return Err(format!("response {i}: log-prob {x} is not a finite number ≤ 0"));
            }
        }
        if let Some(x) = self.rewards.iter().chain(&self.advantages).find(|x| !x.is_finite()) {
            return Err(format!("non-finite reward or advantage {x}"));
        }
        if let Some(x) = self.entropy_sum.iter().find(|x| !(x.is_finite() && **x >= 0.0)) {
            return Err(format!("entropy sum {x} is not a finite number ≥ 0"));
        }
        if let Some(i) = (0..g).find(|&i| self.entropy_tokens[i] as usize > self.responses[i].len()) {
            return Err(format!(
                "response {i}: entropies of {} tokens for {}",
                self.entropy_tokens[i],
                self.responses[i].len()
            ));
        }
        Ok(())
    }
}

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

/// Errors of a queue backend.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The backend cannot be reached (the caller retries with back-off).
    #[error("experience queue unavailable: {0}")]
    Unavailable(String),
    /// The backend refused a call (bad ID order, wrong type at the key…).
    #[error("experience queue: {0}")]
    Refused(String),
}

/// How often a continuing outage of the queue is reported again.
pub const OUTAGE_REPORT_EVERY: Duration = Duration::from_secs(30);

/// The words a caller prints about an outage of its queue: the first
/// failure at once ("…; retrying with back-off"), then every
/// [`OUTAGE_REPORT_EVERY`] how long it has lasted, then that it is over, so
/// a log shows a run waiting on Redis rather than a silent hang.
#[derive(Debug, Default)]
pub struct Outage {
    /// When the outage began, and when it was last reported.
    since: Option<(Instant, Instant)>,
}

impl Outage {
    /// A call by `what` failed with `error`: the line to print, if one is due.
    pub fn failed(&mut self, what: &str, error: &dyn fmt::Display) -> Option<String> {
        self.failed_at(Instant::now(), what, error)
    }

    /// [`Outage::failed`] at `now`.
    fn failed_at(&mut self, now: Instant, what: &str, error: &dyn fmt::Display) -> Option<String> {
        match &mut self.since {
            None => {
                self.since = Some((now, now));
                Some(format!("{what}: {error}; retrying with back-off"))
            }
            Some((began, last)) if now.duration_since(*last) >= OUTAGE_REPORT_EVERY => {
                *last = now;
                Some(format!(
                    "{what}: still waiting for the experience queue after {:.0} s ({error})",
                    now.duration_since(*began).as_secs_f64()
                ))
            }
            Some(_) => None,
        }
    }

    /// A call by `what` succeeded: the line to print if it ends an outage.
    pub fn recovered(&mut self, what: &str) -> Option<String> {
        self.since.take().map(|(began, _)| {
            format!("{what}: the experience queue is back after {:.0} s", began.elapsed().as_secs_f64())
        })
    }
}

/// Calls `f` until the queue answers: while it is unavailable, backs off
/// from `first` to 5 s and reports the outage through `warn` ([`Outage`]:
/// at once, then every half minute, then its end). `Ok(None)` once
/// `alive(backoff)` (which sleeps) turns false; a refused call is the error.
/// The one retry loop of the learner, the actors and the weight channel.
pub fn retry_unavailable<T>(
    what: &str,
    first: Duration,
    warn: &mut dyn FnMut(String),
    alive: &mut dyn FnMut(Duration) -> bool,
    mut f: impl FnMut() -> Result<T, QueueError>,
) -> Result<Option<T>, QueueError> {
    let mut backoff = first;
    let mut outage = Outage::default();
    loop {
        match f() {
            Ok(v) => {
                if let Some(line) = outage.recovered(what) {
                    warn(line);
                }
                return Ok(Some(v));
            }
            Err(QueueError::Unavailable(e)) => {
                if let Some(line) = outage.failed(what, &e) {
                    warn(line);
                }
                if !alive(backoff) {
                    return Ok(None);
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sleeps `d` in short slices, returning early (false) once `stop` is
/// raised, so a signal is honoured within a fraction of a second of any
/// back-off.
pub fn sleep_unless(stop: &std::sync::atomic::AtomicBool, d: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// What one read returns: each entry's id and either the checked entry or
/// why it was rejected.
pub type ReadBatch = Vec<(EntryId, Result<GroupEntry, String>)>;

/// Where actors put groups and the learner takes them.
pub trait ExperienceQueue: Send {
    /// Appends `entry` under `<entry.iteration>-<next seq>`; returns its id.
    fn publish(&mut self, entry: &GroupEntry) -> Result<EntryId, QueueError>;

    /// Up to `max` entries strictly after `after` (from the start when
    /// `None`), in id order, each decoded and checked against `limits`.
    fn read_after(&mut self, after: Option<EntryId>, max: usize, limits: &EntryLimits)
        -> Result<ReadBatch, QueueError>;

    /// Drops every entry of an iteration below `iteration` (`XTRIM MINID
    /// <iteration>-0`); returns how many were dropped.
    fn trim_before(&mut self, iteration: u64) -> Result<u64, QueueError>;

    /// Entries held.
    fn len(&mut self) -> Result<u64, QueueError>;

    /// Hands `owner` a batch to produce for `lease`: the oldest batch
    /// whose lease ran out (its actor died), else the next new one. Two
    /// live actors never hold the same batch, and no batch is left behind.
    fn claim_batch(&mut self, owner: &str, lease: Duration) -> Result<u64, QueueError>;

    /// Hands `owner` the oldest batch whose lease ran out, or a restored
    /// one, but never a new batch: what an actor waiting on a batch it
    /// cannot start yet does, so a dead actor's earlier batch cannot block
    /// everyone (with `max_staleness = 0` nothing moves until it is made).
    fn claim_expired(&mut self, owner: &str, lease: Duration) -> Result<Option<u64>, QueueError>;

    /// Extends `owner`'s lease on `batch` to `lease` from now; false when
    /// the lease is no longer `owner`'s (it ran out and was taken).
    fn renew_lease(&mut self, batch: u64, owner: &str, lease: Duration) -> Result<bool, QueueError>;

    /// Publishes the groups of `batch` in one step, if `owner` still holds
    /// its lease: they get the next slot `s` and ids `s-1 … s-n` (Redis has
    /// no id `0-0`), and
    /// the lease ends. Returns the slot, or `None` when the lease was lost
    /// (it ran out and another actor took the batch; nothing is written).
    fn publish_batch(&mut self, batch: u64, owner: &str, entries: &[GroupEntry]) -> Result<Option<u64>, QueueError>;

    /// Who holds the lease of `batch` now; `None` when nobody does (the
    /// run closed and dropped its leases, or they were deleted). Says why
    /// [`ExperienceQueue::publish_batch`] refused a batch.
    fn lease_owner(&mut self, batch: u64) -> Result<Option<String>, QueueError>;

    /// How long the lease of `batch` has left (zero once it ran out and no
    /// one took the batch yet); `None` when nobody holds it. What a learner
    /// that waits on the batch tells its user.
    fn lease_left(&mut self, batch: u64) -> Result<Option<Duration>, QueueError>;

    /// Makes the next new batch at least `next` and hands out `pending`
    /// (batches below it that were never consumed) first, as if their
    /// leases had run out: how a learner resumed from a checkpoint restores
    /// the data position of a queue that lost its state. Batches already
    /// leased or published are left alone.
    fn restore_batches(&mut self, next: u64, pending: &[u64]) -> Result<(), QueueError>;

    /// Ends every lease now, so the batches they hold go to the next
    /// claimants: a single-box run restarting with its own actor threads
    /// knows the old ones are gone.
    fn expire_leases(&mut self) -> Result<(), QueueError>;

    /// Whether the queue holds nothing.
    fn is_empty(&mut self) -> Result<bool, QueueError> {
        Ok(self.len()? == 0)
    }
}

/// The in-process queue: a map from id to encoded entry, with exactly the
/// Redis Stream semantics the learner relies on (ordered ids, exclusive
/// range reads, trim below an id) and the same batch leases, so the two
/// backends pass one contract test. Clones share one queue (the actor
/// threads and the learner of `llm train --async`).
#[derive(Clone, Debug, Default)]
pub struct MemoryQueue {
    inner: Arc<Mutex<MemoryInner>>,
}

#[derive(Debug, Default)]
struct MemoryInner {
    entries: BTreeMap<EntryId, Vec<u8>>,
    /// The next new batch.
    next_batch: u64,
    /// The next slot.
    next_slot: u64,
    /// Batch → (owner, deadline).
    leases: BTreeMap<u64, (String, Instant)>,
    /// Batches handed out before any new one (restored, never consumed).
    pending: Vec<u64>,
}

impl MemoryQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        // A panicking actor thread cannot leave the map half-written: every
        // method finishes its mutation before it could panic.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores raw bytes under the next id of `iteration` (what a foreign
    /// writer can do to a Redis Stream; tests use it for garbage).
    pub fn publish_raw(&mut self, iteration: u64, bytes: Vec<u8>) -> Result<EntryId, QueueError> {
        let mut q = self.lock();
        let last = q.entries.keys().next_back().copied();
        let seq = match last {
            Some(l) if l.iteration == iteration => l.seq + 1,
            Some(l) if l.iteration > iteration => {
                return Err(QueueError::Refused(format!(
                    "iteration {iteration} is below the newest entry {l} (ids only grow)"
                )))
            }
            _ => 0,
        };
        let id = EntryId { iteration, seq };
        q.entries.insert(id, bytes);
        q.next_slot = q.next_slot.max(iteration + 1);
        Ok(id)
    }
}

impl ExperienceQueue for MemoryQueue {
    fn publish(&mut self, entry: &GroupEntry) -> Result<EntryId, QueueError> {
        self.publish_raw(entry.iteration, entry.encode())
    }

    fn read_after(
        &mut self,
        after: Option<EntryId>,
        max: usize,
        limits: &EntryLimits,
    ) -> Result<ReadBatch, QueueError> {
        let q = self.lock();
        let range = match after {
            Some(a) => q.entries.range((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            None => q.entries.range(..),
        };
        Ok(range.take(max).map(|(id, b)| (*id, GroupEntry::decode(b, limits))).collect())
    }

    fn trim_before(&mut self, iteration: u64) -> Result<u64, QueueError> {
        let mut q = self.lock();
        let keep = q.entries.split_off(&EntryId { iteration, seq: 0 });
        let dropped = q.entries.len() as u64;
        q.entries = keep;
        Ok(dropped)
    }

    fn len(&mut self) -> Result<u64, QueueError> {
        Ok(self.lock().entries.len() as u64)
    }

    fn claim_batch(&mut self, owner: &str, lease: Duration) -> Result<u64, QueueError> {
        if let Some(b) = self.claim_expired(owner, lease)? {
            return Ok(b);
        }
        let mut q = self.lock();
        q.next_batch += 1;
        let b = q.next_batch - 1;
        q.leases.insert(b, (owner.to_string(), Instant::now() + lease));
        Ok(b)
    }

    fn claim_expired(&mut self, owner: &str, lease: Duration) -> Result<Option<u64>, QueueError> {
        let mut q = self.lock();
        let now = Instant::now();
        let expired = q.leases.iter().find(|(_, (_, deadline))| *deadline <= now).map(|(b, _)| *b);
        let b = match (expired, q.pending.is_empty()) {
            (Some(b), _) => b,
            (None, false) => q.pending.remove(0),
            (None, true) => return Ok(None),
        };
        q.leases.insert(b, (owner.to_string(), now + lease));
        Ok(Some(b))
    }

    fn renew_lease(&mut self, batch: u64, owner: &str, lease: Duration) -> Result<bool, QueueError> {
        let mut q = self.lock();
        match q.leases.get_mut(&batch) {
            Some((o, deadline)) if o == owner => {
                *deadline = Instant::now() + lease;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn publish_batch(&mut self, batch: u64, owner: &str, entries: &[GroupEntry]) -> Result<Option<u64>, QueueError> {
        let mut q = self.lock();
        match q.leases.get(&batch) {
            Some((o, _)) if o == owner => {}
            _ => return Ok(None),
        }
        q.leases.remove(&batch);
        let top = q.entries.keys().next_back().map_or(0, |l| l.iteration + 1);
        let slot = q.next_slot.max(top);
        q.next_slot = slot + 1;
        for (seq, e) in entries.iter().enumerate() {
            q.entries.insert(EntryId { iteration: slot, seq: seq as u64 + 1 }, e.encode());
        }
        Ok(Some(slot))
    }

    fn lease_owner(&mut self, batch: u64) -> Result<Option<String>, QueueError> {
        Ok(self.lock().leases.get(&batch).map(|(o, _)| o.clone()))
    }

    fn lease_left(&mut self, batch: u64) -> Result<Option<Duration>, QueueError> {
        Ok(self.lock().leases.get(&batch).map(|(_, deadline)| deadline.saturating_duration_since(Instant::now())))
    }

    fn expire_leases(&mut self) -> Result<(), QueueError> {
        let now = Instant::now();
        for (_, deadline) in self.lock().leases.values_mut() {
            *deadline = now;
        }
        Ok(())
    }

    fn restore_batches(&mut self, next: u64, pending: &[u64]) -> Result<(), QueueError> {
        let mut q = self.lock();
        q.next_batch = q.next_batch.max(next);
        if q.entries.is_empty() {
            // A queue that lost its entries (a new process): each published
            // batch took one slot, so every slot the learner has read is
            // below `next`; slots from there on sort after its read
            // position (from slot 0 they sorted before it and were never
            // read), as the Redis queue's restore does.
            q.next_slot = q.next_slot.max(next);
        }
        for &b in pending {
            if !q.leases.contains_key(&b) && !q.pending.contains(&b) {
                q.pending.push(b);
            }
        }
        q.pending.sort_unstable();
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A group entry for the tests here and in [`crate::experience`].
    pub(crate) fn an_entry() -> GroupEntry {
        GroupEntry {
            schema: ENTRY_SCHEMA,
            iteration: 4,
            problem: 3,
            prompt_ids: vec![1, 2],
            responses: vec![vec![5, 6, 7], vec![8]],
            behaviour_logp: vec![vec![-0.25; 3], vec![-0.5]],
            rewards: vec![1.0, 0.0],
            correct: vec![true, false],
            advantages: vec![0.7, -0.7],
            truncated: vec![false, true],
            entropy_sum: vec![1.5, 0.0],
            entropy_tokens: vec![3, 0],
            weight_version: 9,
        }
    }

    /// An outage is reported when it starts, then every
    /// `OUTAGE_REPORT_EVERY` with how long it has lasted, then when it ends.
    #[test]
    fn an_outage_is_reported_at_once_then_every_half_minute_then_its_end() {
        let mut o = Outage::default();
        let t0 = Instant::now();
        let e = "redis://127.0.0.1:6379/0: timed out";
        let first = o.failed_at(t0, "learner", &e).unwrap();
        assert!(first.contains("retrying with back-off") && first.contains("timed out"), "{first}");
        assert_eq!(o.failed_at(t0 + Duration::from_secs(10), "learner", &e), None);
        let later = o.failed_at(t0 + Duration::from_secs(40), "learner", &e).unwrap();
        assert!(later.contains("still waiting for the experience queue after 40 s"), "{later}");
        assert_eq!(o.failed_at(t0 + Duration::from_secs(50), "learner", &e), None);
        assert!(o.failed_at(t0 + Duration::from_secs(71), "learner", &e).unwrap().contains("after 71 s"));
        assert!(o.recovered("learner").unwrap().contains("is back after"));
        assert_eq!(o.recovered("learner"), None, "reported once");
    }

    #[test]
    fn an_entry_round_trips_through_its_bytes() {
        let e = an_entry();
        let back = GroupEntry::decode(&e.encode(), &EntryLimits::default()).unwrap();
        assert_eq!(back, e);
        let mut bad = e.clone();
        bad.entropy_tokens[1] = 2;
        assert!(bad.check(&EntryLimits::default()).unwrap_err().contains("entropies of 2 tokens"));
        let mut bad = e;
        bad.truncated.pop();
        assert!(bad.check(&EntryLimits::default()).unwrap_err().contains("truncated"));
    }

    #[test]
    fn ids_print_and_parse_as_redis_stream_ids() {
        let id = EntryId { iteration: 12, seq: 3 };
        assert_eq!(id.to_string(), "12-3");
        assert_eq!("12-3".parse::<EntryId>().unwrap(), id);
        assert!("12".parse::<EntryId>().is_err());
        assert!("a-3".parse::<EntryId>().is_err());
        assert!(EntryId { iteration: 2, seq: 9 } < EntryId { iteration: 3, seq: 0 });
    }

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
