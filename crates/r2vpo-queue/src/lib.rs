//! The experience queue on a Redis Stream ([`RedisQueue`]), the multi-machine
//! backend of [`r2vpo_llm::queue::ExperienceQueue`] (the in-process one is
//! [`r2vpo_llm::queue::MemoryQueue`]).
//!
//! Layout, as ServiceNow's PipelineRL streams rollouts, but keyed by
//! iteration: one stream per run (`key`), one stream entry per prompt group,
//! one field `e` holding the encoded [`GroupEntry`]. Asynchronous actors
//! publish a whole batch at once under the next slot (ids `<slot>-1 …
//! <slot>-<n>`, one Lua script that also checks and ends the actor's batch
//! lease); [`ExperienceQueue::publish`] writes `XADD key <iteration>-*`
//! (Redis ≥ 7.0 picks the sequence). The learner reads with `XRANGE key
//! (<last id> + COUNT n` from the position stored in its checkpoint, so an
//! entry is applied at most once across restarts, and keeps exactly the
//! last K slots with `XTRIM key MINID <it − K + 1>-0` (`MAXLEN` counts
//! entries, not iterations).
//!
//! [`SharedWeights`] hands the learner's weights to actor processes: a
//! shared folder of versions, announced under `<key>:weights`.
//!
//! A lost connection, and a call that outlasts its timeout
//! ([`RedisQueue::with_timeout`]: a stopped or partitioned server), is an
//! [`QueueError::Unavailable`]; the next call reconnects, so callers retry
//! with back-off and continue when the server is back. A handle that works
//! for a run ([`RedisQueue::with_owner`]) checks at least once every
//! [`OWNER_CHECK`] that the stream is still that run's, so keys deleted
//! under a live run (`FLUSHALL`, eviction) stop it within that bound.
//! Passwords go in the URL (`redis://:pass@host:6379/0`); TLS
//! (`rediss://`) is not built in.

use r2vpo_llm::queue::{
    retry_unavailable, sleep_unless, EntryId, EntryLimits, ExperienceQueue, GroupEntry, Outage, QueueError, ReadBatch,
};
use redis::streams::StreamRangeReply;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use r2vpo_llm::model::ModelError;
use r2vpo_llm::weights::{Fetched, WeightChannel, Weights, WeightsError};
use redis::{Commands, Connection, RedisError};

/// The keys beside the stream: the next new batch, the next slot, batch
/// leases (sorted set, deadline in server milliseconds), their owners
/// (hash), batches restored for re-issue (sorted set), and the
/// [`SharedWeights`] announcement and end-of-run flag.
const AUX: [&str; 8] = ["batch", "slot", "leases", "owners", "pending", "weights", "closed", "run"];

/// Takes the stream for a fresh run: refused (returning the owner) while
/// another run that has not closed owns it; otherwise every key of the
/// old run is deleted and the stream's owner set. KEYS: run, closed, then
/// everything to delete. ARGV: the new owner.
const TAKE_FRESH: &str = r"
local o = redis.call('GET', KEYS[1])
if o and o ~= ARGV[1] and redis.call('EXISTS', KEYS[2]) == 0 then return o end
redis.call('DEL', unpack(KEYS))
redis.call('SET', KEYS[1], ARGV[1])
return false
";

/// Takes the stream back for a resumed run: refused (returning the owner)
/// when another run owns it now; an absent owner (a server that lost its
/// data) is set again. KEYS: run. ARGV: the owner.
const TAKE_RESUMED: &str = r"
local o = redis.call('GET', KEYS[1])
if o and o ~= ARGV[1] then return o end
redis.call('SET', KEYS[1], ARGV[1])
return false
";

/// Claims a batch (Lua runs atomically on the server, and its clock is
/// the only one used, so actors' clocks need not agree): an expired lease,
/// else a restored batch, else (when ARGV[3] is "new") a new one, else -1.
/// KEYS: batch, leases, owners, pending. ARGV: owner, lease in ms, "new" or
/// "expired".
const CLAIM: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b
local exp = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
if exp[1] then
  b = exp[1]
else
  local p = redis.call('ZRANGE', KEYS[4], 0, 0)
  if p[1] then
    b = p[1]
    redis.call('ZREM', KEYS[4], b)
  elseif ARGV[3] == 'new' then
    b = tostring(redis.call('INCR', KEYS[1]) - 1)
  else
    return -1
  end
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), b)
redis.call('HSET', KEYS[3], b, ARGV[1])
return tonumber(b)
";

/// Extends a lease if the caller still owns it: 1, else 0. KEYS: leases,
/// owners. ARGV: batch, owner, lease in ms.
const RENEW: &str = r"
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
";

/// Publishes a batch's groups under the next slot if the caller still
/// owns its lease; -1 if not. KEYS: stream, leases, owners, slot. ARGV:
/// batch, owner, then the encoded entries.
const PUBLISH: &str = r"
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return -1 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
local s = tonumber(redis.call('GET', KEYS[4]) or '0')
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if top[1] then
  local t = tonumber(string.match(top[1][1], '^(%d+)-'))
  if t >= s then s = t + 1 end
end
redis.call('SET', KEYS[4], s + 1)
for i = 3, #ARGV do
  redis.call('XADD', KEYS[1], s .. '-' .. (i - 2), 'e', ARGV[i])
end
return s
";

/// Restores the batch counter and the batches to re-issue, only when the
/// server lost the run's state (no counter); and the slot counter when the
/// stream went with it. Each published batch took one slot, so every slot
/// the learner has read is below the next batch: slots from there on sort
/// after its read position (from slot 0 they sorted before it and were
/// never read). KEYS: batch, pending, leases, slot, stream. ARGV: next
/// batch, then the pending batches.
const RESTORE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[5]) == 0 then
  local s = tonumber(redis.call('GET', KEYS[4]) or '0')
  if s < tonumber(ARGV[1]) then redis.call('SET', KEYS[4], ARGV[1]) end
end
for i = 2, #ARGV do
  if not redis.call('ZSCORE', KEYS[3], ARGV[i]) then redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i]) end
end
return 1
";

/// The error a guarded script ([`RedisQueue::eval`]) returns when the
/// stream is no longer the handle's run's.
const OWNER_GONE: &str = "R2VPO_NOT_THIS_RUNS";

/// The error a script of an actor that has not seen its learner yet
/// returns while no run owns the stream.
const NO_LEARNER: &str = "R2VPO_NO_LEARNER_YET";

/// `s` as a Lua long-bracket string literal (no escapes to get wrong).
fn lua_string(s: &str) -> String {
    let level = (0..).find(|&n| !s.contains(&format!("]{}]", "=".repeat(n)))).unwrap_or(0);
    let eq = "=".repeat(level);
    format!("[{eq}[{s}]{eq}]")
}

/// How often a handle that works for a run ([`RedisQueue::with_owner`])
/// re-reads the stream's owner: one `GET` a second per handle, so an
/// emptied stream is noticed within about a second of any call.
pub const OWNER_CHECK: Duration = Duration::from_secs(1);

/// What a handle checks of the stream's owner before its calls.
#[derive(Clone, Debug)]
enum OwnerCheck {
    /// Nothing (a handle that takes or inspects the stream).
    Off,
    /// The stream must belong to this run; `adopted` when the handle took
    /// the owner it saw first (an actor's), not its own run's (a learner's).
    Expect(String, bool),
    /// The first owner seen is adopted and then expected (an actor that
    /// may start before its learner).
    Adopt,
}

/// A Redis Stream holding one run's groups.
pub struct RedisQueue {
    client: redis::Client,
    conn: Option<Connection>,
    key: String,
    /// The URL without its password, for messages.
    shown: String,
    /// The run this handle works for ([`RedisQueue::with_owner`]).
    owner: OwnerCheck,
    /// When the owner was last found as expected.
    owner_seen: Option<std::time::Instant>,
    /// The longest one call may take ([`RedisQueue::with_timeout`]).
    timeout: Option<Duration>,
}

/// `redis://:secret@host` → `redis://***@host`: a Redis URL fit for logs.
pub fn hide_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// The TLS handshake failure behind `e`, if the connection failed on a
/// certificate or protocol error (which no retry can fix) rather than on
/// the network.
fn tls_refusal(e: &RedisError) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        let tls = c.downcast_ref::<rustls::Error>().or_else(|| {
            c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<rustls::Error>())
        });
        if let Some(t) = tls {
            return Some(t.to_string());
        }
        cause = c.source();
    }
    // The redis crate may keep only the text of the I/O error.
    let text = e.to_string();
    (text.contains("invalid peer certificate") || text.contains("InvalidCertificate")).then_some(text)
}

impl RedisQueue {
    /// A queue at `key` on the server at `url`. Nothing is contacted until
    /// the first call. `rediss://` connects over TLS and checks the
    /// server's certificate against the system's roots (see
    /// [`RedisQueue::open_tls`] for a CA of your own; `rediss://…/#insecure`
    /// skips the check).
    pub fn open(url: &str, key: &str) -> Result<Self, QueueError> {
        Self::open_tls(url, key, None)
    }

    /// [`RedisQueue::open`], with the server's certificate checked against
    /// the CA certificates (PEM) in `ca_file` instead of the system's roots
    /// (a self-signed Redis); `ca_file` needs a `rediss://` URL.
    pub fn open_tls(url: &str, key: &str, ca_file: Option<&Path>) -> Result<Self, QueueError> {
        let shown = hide_password(url);
        let refused = |m: String| QueueError::Refused(format!("{shown}: {m}"));
        let client = match ca_file {
            None => redis::Client::open(url).map_err(|e| refused(e.to_string()))?,
            Some(ca) => {
                if !url.starts_with("rediss://") {
                    return Err(refused(format!(
                        "a CA file ({}) was given for a URL without TLS; use rediss://",
                        ca.display()
                    )));
                }
                let pem = std::fs::read(ca).map_err(|e| refused(format!("the CA file {}: {e}", ca.display())))?;
                let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(pem) };
                redis::Client::build_with_tls(url, certs)
                    .map_err(|e| refused(format!("the CA file {}: {e}", ca.display())))?
            }
        };
        Ok(RedisQueue {
            client,
            conn: None,
            key: key.to_string(),
            shown,
            owner: OwnerCheck::Off,
            owner_seen: None,
            timeout: None,
        })
    }

    /// This handle, giving up on a connection attempt or a call after
    /// `timeout` ([`QueueError::Unavailable`], and the connection is
    /// dropped). Without it a server that stops answering without closing
    /// the connection (SIGSTOP, a network partition) blocks the caller
    /// until the operating system gives up, which can take many minutes.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// This handle, checking on every new connection and at least every
    /// [`OWNER_CHECK`] that the stream is still `owner`'s
    /// ([`RedisQueue::take_for`]). A server that restarted without
    /// persistence, keys deleted by hand (`FLUSHALL`) or evicted under
    /// `maxmemory` lose the stream and its batch counters: carrying on
    /// would make batches from 0 again, which the learner skips as already
    /// seen (a silent stall), so every call is refused instead, saying so.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = OwnerCheck::Expect(owner.into(), false);
        self
    }

    /// [`RedisQueue::with_owner`] for a process that does not know the
    /// run's owner yet (an actor started before its learner): the first
    /// owner the handle sees is the one it then expects.
    pub fn following_owner(mut self) -> Self {
        self.owner = OwnerCheck::Adopt;
        self
    }

    /// Checks the stream's owner ([`RedisQueue::with_owner`]) on `c`,
    /// adopting the first one seen ([`RedisQueue::following_owner`]).
    fn check_owner(&mut self, c: &mut Connection) -> Result<(), QueueError> {
        let (expected, adopted) = match &self.owner {
            OwnerCheck::Off => return Ok(()),
            OwnerCheck::Expect(o, adopted) => (Some(o.clone()), *adopted),
            OwnerCheck::Adopt => (None, true),
        };
        let now: Option<String> =
            c.get(format!("{}:run", self.key)).map_err(|e| QueueError::Unavailable(format!("{}: {e}", self.shown)))?;
        match (expected, now.as_deref()) {
            (Some(o), Some(n)) if o == n => {}
            (None, Some(n)) => self.owner = OwnerCheck::Expect(n.to_string(), true),
            // No learner has taken the stream yet.
            (None, None) => return Ok(()),
            (Some(owner), _) => {
                let what = match now {
                    None => "was emptied (a Redis restarted without persistence, keys deleted by hand or evicted \
                             under maxmemory): its groups, batch counters and leases are gone"
                        .to_string(),
                    Some(other) => format!("now belongs to the run in {other}"),
                };
                // An actor keeps no state: what continues is the learner's
                // --resume (it restores the batch counters), then the actor
                // started again as before.
                let then = if adopted {
                    format!(
                        "this actor stops here: once the run's learner has resumed (`r2vpo llm learn --resume \
                         {owner}`), start this actor again with the command that started it"
                    )
                } else {
                    format!(
                        "this run ({owner}) stops here and resumes with its command's --resume (the learner \
                         restores its batch counters)"
                    )
                };
                return Err(QueueError::Refused(format!("the queue `{}` on {} {what}; {then}", self.key, self.shown)));
            }
        }
        self.owner_seen = Some(std::time::Instant::now());
        Ok(())
    }

    /// Runs `f` on a live connection, reconnecting first if the last call
    /// lost it and checking the owner when due ([`RedisQueue::with_owner`]);
    /// a connection error or a timeout drops the connection and reports
    /// [`QueueError::Unavailable`].
    fn call<T>(&mut self, f: impl FnOnce(&mut Connection, &str) -> Result<T, RedisError>) -> Result<T, QueueError> {
        if self.conn.is_none() {
            let c = match self.timeout {
                Some(t) => self.client.get_connection_with_timeout(t),
                None => self.client.get_connection(),
            }
            .and_then(|c| {
                c.set_read_timeout(self.timeout)?;
                c.set_write_timeout(self.timeout)?;
                Ok(c)
            })
            .map_err(|e| {
                if let Some(why) = tls_refusal(&e) {
                    // A certificate the client does not trust stays
                    // untrusted: said once, not retried forever.
                    QueueError::Refused(format!("{}: TLS: {why} (queue.tls_ca names a CA file)", self.shown))
                } else {
                    QueueError::Unavailable(format!("{}: {e}", self.shown))
                }
            })?;
            self.conn = Some(c);
            self.owner_seen = None;
        }
        let checking = !matches!(self.owner, OwnerCheck::Off);
        if checking && self.owner_seen.is_none_or(|t| t.elapsed() >= OWNER_CHECK) {
            // A failed check drops the connection with it.
            let mut c = self.conn.take().expect("connected");
            let checked = self.check_owner(&mut c);
            if checked.is_ok() {
                self.conn = Some(c);
            }
            checked?;
        }
        let conn = self.conn.as_mut().expect("connected");
        f(conn, &self.key).map_err(|e| {
            if let Some(why) = tls_refusal(&e) {
                self.conn = None;
                QueueError::Refused(format!("{}: TLS: {why} (queue.tls_ca names a CA file)", self.shown))
            } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
                self.conn = None;
                QueueError::Unavailable(format!("{}: {e}", self.shown))
            } else if matches!(e.retry_method(), redis::RetryMethod::WaitAndRetry) {
                // LOADING (a restarted server still reading its append-only
                // file), TRYAGAIN, MASTERDOWN: the server is up but not
                // ready; the same call succeeds later.
                QueueError::Unavailable(format!("{}: {e}", self.shown))
            } else {
                QueueError::Refused(format!("{} key {}: {e}", self.shown, self.key))
            }
        })
    }

    /// Appends raw bytes under `<iteration>-*` (a foreign writer's view;
    /// tests use it for garbage).
    pub fn publish_raw(&mut self, iteration: u64, bytes: &[u8]) -> Result<EntryId, QueueError> {
        let id: String = self.call(|c, key| c.xadd(key, format!("{iteration}-*"), &[("e", bytes)]))?;
        id.parse().map_err(QueueError::Refused)
    }

    /// Makes `owner` (the learner's run folder, as an absolute path) the
    /// owner of the stream: for a fresh run (`resumed` false) after
    /// deleting the stream and its bookkeeping, which is refused while
    /// another run that has not closed owns it (a live learner, or one
    /// stopped to be resumed: two runs on one key would consume each
    /// other's groups); for a resumed run, refused only when another run
    /// owns it now. The refusal names the key and the owner.
    pub fn take_for(&mut self, owner: &str, resumed: bool) -> Result<(), QueueError> {
        let other: Option<String> = if resumed {
            self.eval_as_is(TAKE_RESUMED, &["run"], &[owner.as_bytes()])?
        } else {
            let keys: Vec<&str> = ["run", "closed", ""].into_iter().chain(AUX).collect();
            self.eval_as_is(TAKE_FRESH, &keys, &[owner.as_bytes()])?
        };
        match other {
            None => Ok(()),
            Some(other) => Err(QueueError::Refused(format!(
                "queue.key `{}` on {} belongs to the run in {other}, which has not closed (its learner is running, or \
                 stopped and resumable); give this run another queue.key, or finish that run first",
                self.key, self.shown
            ))),
        }
    }

    /// Marks the run closed (actors stop, and another run may take the
    /// key) and drops its batch leases, their owners and the batches
    /// waiting to be re-issued: nobody produces for a closed run, so they
    /// would only outlive it in Redis.
    pub fn close(&mut self) -> Result<(), QueueError> {
        self.call(|c, key| {
            redis::pipe()
                .atomic()
                .set(format!("{key}:closed"), 1)
                .ignore()
                .del(["leases", "owners", "pending"].map(|a| format!("{key}:{a}")).to_vec())
                .ignore()
                .query::<()>(c)
        })
    }

    /// The run folder that owns the stream ([`RedisQueue::take_for`]), if any.
    pub fn owner(&mut self) -> Result<Option<String>, QueueError> {
        self.call(|c, key| c.get(format!("{key}:run")))
    }

    /// Deletes the stream and its batch bookkeeping (a fresh run).
    pub fn clear(&mut self) -> Result<(), QueueError> {
        self.call(|c, key| {
            let keys: Vec<String> =
                std::iter::once(key.to_string()).chain(AUX.iter().map(|a| format!("{key}:{a}"))).collect();
            c.del::<_, ()>(keys)
        })
    }

    /// Runs `script` with the run's keys named `keys` (suffixes of the
    /// stream key; "" is the stream) and `args`. A handle that works for a
    /// run ([`RedisQueue::with_owner`]) runs it only while the stream is
    /// still that run's, checked inside the script: between two periodic
    /// owner checks an emptied stream would otherwise get fresh batch
    /// counters (`INCR` from nothing) that a resumed learner cannot tell
    /// from its own.
    fn eval<T: redis::FromRedisValue>(&mut self, script: &str, keys: &[&str], args: &[&[u8]]) -> Result<T, QueueError> {
        let script = match &self.owner {
            OwnerCheck::Expect(o, _) => format!(
                "if redis.call('GET', {}) ~= {} then return redis.error_reply('{OWNER_GONE}') end\n{script}",
                lua_string(&format!("{}:run", self.key)),
                lua_string(o)
            ),
            // An actor started before its learner makes nothing until the
            // learner has taken (and, resuming, restored) the stream.
            OwnerCheck::Adopt => format!(
                "if not redis.call('GET', {}) then return redis.error_reply('{NO_LEARNER}') end\n{script}",
                lua_string(&format!("{}:run", self.key))
            ),
            OwnerCheck::Off => script.to_string(),
        };
        let out = self.eval_as_is(&script, keys, args);
        match out {
            Err(QueueError::Refused(e)) if e.contains(NO_LEARNER) => Err(QueueError::Unavailable(format!(
                "{}: no learner has taken the queue `{}` yet (waiting for `r2vpo llm learn`)",
                self.shown, self.key
            ))),
            Err(QueueError::Refused(e)) if e.contains(OWNER_GONE) => {
                // The owner check says what happened to the stream.
                self.owner_seen = None;
                self.call(|_, _| Ok(()))?;
                Err(QueueError::Refused(format!("{}: the queue `{}` is no longer this run's", self.shown, self.key)))
            }
            out => out,
        }
    }

    /// [`RedisQueue::eval`] without the owner guard.
    fn eval_as_is<T: redis::FromRedisValue>(
        &mut self,
        script: &str,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<T, QueueError> {
        self.call(|c, key| {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(script).arg(keys.len());
            for k in keys {
                if k.is_empty() {
                    cmd.arg(key);
                } else {
                    cmd.arg(format!("{key}:{k}"));
                }
            }
            for a in args {
                cmd.arg(*a);
            }
            cmd.query(c)
        })
    }
}

impl ExperienceQueue for RedisQueue {
    fn publish(&mut self, entry: &GroupEntry) -> Result<EntryId, QueueError> {
        self.publish_raw(entry.iteration, &entry.encode())
    }

    fn read_after(
        &mut self,
        after: Option<EntryId>,
        max: usize,
        limits: &EntryLimits,
    ) -> Result<ReadBatch, QueueError> {
        let start = after.map_or_else(|| "-".to_string(), |a| format!("({a}"));
        let reply: StreamRangeReply = self.call(|c, key| c.xrange_count(key, start, "+", max))?;
        Ok(reply
            .ids
            .into_iter()
            .map(|s| {
                let id: Result<EntryId, String> = s.id.parse();
                match id {
                    Ok(id) => {
                        let entry = match s.map.get("e") {
                            Some(redis::Value::BulkString(b)) => GroupEntry::decode(b, limits),
                            Some(_) => Err("field `e` is not a string".to_string()),
                            None => Err("no field `e`".to_string()),
                        };
                        (id, entry)
                    }
                    Err(e) => (EntryId { iteration: 0, seq: 0 }, Err(e)),
                }
            })
            .collect())
    }

    fn trim_before(&mut self, iteration: u64) -> Result<u64, QueueError> {
        self.call(|c, key| redis::cmd("XTRIM").arg(key).arg("MINID").arg(format!("{iteration}-0")).query::<u64>(c))
    }

    fn len(&mut self) -> Result<u64, QueueError> {
        self.call(|c, key| c.xlen(key))
    }

    fn claim_batch(&mut self, owner: &str, lease: Duration) -> Result<u64, QueueError> {
        let ms = lease.as_millis().max(1).to_string();
        self.eval(CLAIM, &["batch", "leases", "owners", "pending"], &[owner.as_bytes(), ms.as_bytes(), b"new"])
    }

    fn claim_expired(&mut self, owner: &str, lease: Duration) -> Result<Option<u64>, QueueError> {
        let ms = lease.as_millis().max(1).to_string();
        let b: i64 = self.eval(
            CLAIM,
            &["batch", "leases", "owners", "pending"],
            &[owner.as_bytes(), ms.as_bytes(), b"expired"],
        )?;
        Ok(u64::try_from(b).ok())
    }

    fn renew_lease(&mut self, batch: u64, owner: &str, lease: Duration) -> Result<bool, QueueError> {
        let (b, ms) = (batch.to_string(), lease.as_millis().max(1).to_string());
        let r: i64 = self.eval(RENEW, &["leases", "owners"], &[b.as_bytes(), owner.as_bytes(), ms.as_bytes()])?;
        Ok(r == 1)
    }

    fn publish_batch(&mut self, batch: u64, owner: &str, entries: &[GroupEntry]) -> Result<Option<u64>, QueueError> {
        let b = batch.to_string();
        let encoded: Vec<Vec<u8>> = entries.iter().map(GroupEntry::encode).collect();
        let mut args: Vec<&[u8]> = vec![b.as_bytes(), owner.as_bytes()];
        args.extend(encoded.iter().map(Vec::as_slice));
        let slot: i64 = self.eval(PUBLISH, &["", "leases", "owners", "slot"], &args)?;
        Ok(u64::try_from(slot).ok())
    }

    fn lease_owner(&mut self, batch: u64) -> Result<Option<String>, QueueError> {
        self.call(|c, key| c.hget(format!("{key}:owners"), batch))
    }

    fn lease_left(&mut self, batch: u64) -> Result<Option<Duration>, QueueError> {
        self.call(|c, key| {
            // Deadlines are in the server's milliseconds (its clock, not
            // this machine's), so the time left is read against its TIME.
            let deadline: Option<f64> = c.zscore(format!("{key}:leases"), batch)?;
            let Some(deadline) = deadline else { return Ok(None) };
            let (s, us): (u64, u64) = redis::cmd("TIME").query(c)?;
            let now_ms = s as f64 * 1e3 + us as f64 / 1e3;
            Ok(Some(Duration::from_millis((deadline - now_ms).max(0.0) as u64)))
        })
    }

    fn expire_leases(&mut self) -> Result<(), QueueError> {
        self.call(|c, key| {
            let leases = format!("{key}:leases");
            redis::cmd("ZUNIONSTORE").arg(&leases).arg(1).arg(&leases).arg("WEIGHTS").arg(0).query::<()>(c)
        })
    }

    fn restore_batches(&mut self, next: u64, pending: &[u64]) -> Result<(), QueueError> {
        let strings: Vec<String> =
            std::iter::once(next).chain(pending.iter().copied()).map(|b| b.to_string()).collect();
        let args: Vec<&[u8]> = strings.iter().map(String::as_bytes).collect();
        self.eval::<i64>(RESTORE, &["batch", "pending", "leases", "slot", ""], &args).map(|_| ())
    }
}

/// Who reports an outage met while reading the weights announcement.
const WEIGHTS_READ: &str = "reading the weights announcement";

/// What the learner announces at `<key>:weights`.
#[derive(serde::Serialize, serde::Deserialize)]
struct Announcement {
    version: u64,
    consumed: u64,
    path: String,
    /// Set when the file holds adapters of this configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    adapter: Option<r2vpo_llm::model::LoraConfig>,
}

/// The weight channel of actor processes (`llm learn` / `llm actor`): the
/// learner writes each version's tensors (its adapters, when it trains
/// them: the announcement then carries their configuration) to
/// `<dir>/v<version>/weights.safetensors` (a temporary folder renamed into
/// place, so a reader never sees half a file) and then announces `{version,
/// consumed, path}` at `<key>:weights`; actors poll the announcement and
/// load the file. `dir` must be readable by every actor: the same machine
/// or a shared file system, as prime-rl's shared checkpoint folder. The
/// newest three versions are kept. `<key>:closed` ends the run.
pub struct SharedWeights {
    /// The run's queue handle, for its connection handling
    /// ([`RedisQueue::call`]); a mutex because actors share the channel.
    redis: Mutex<RedisQueue>,
    key: String,
    dir: PathBuf,
    poll: Duration,
    /// An outage seen by [`WeightChannel::fetch`], for its reports.
    outage: Mutex<Outage>,
    /// Raised by SIGINT/SIGTERM: [`WeightChannel::publish`] and
    /// [`WeightChannel::close`] stop waiting for Redis.
    stop: Arc<AtomicBool>,
}

impl SharedWeights {
    /// The channel of the run whose queue is `queue` (its server, TLS
    /// settings and stream key), with weight files under `dir`.
    pub fn open(queue: RedisQueue, dir: &Path) -> Result<Self, QueueError> {
        Ok(SharedWeights {
            key: queue.key.clone(),
            redis: Mutex::new(queue),
            dir: dir.to_path_buf(),
            poll: Duration::from_millis(100),
            outage: Mutex::new(Outage::default()),
            stop: Arc::new(AtomicBool::new(false)),
        })
    }

    /// This channel, giving up waiting for an unavailable Redis once
    /// `stop` is raised (the process's SIGINT/SIGTERM flag), so a learner
    /// whose Redis hangs still stops with a checkpoint.
    pub fn with_stop(mut self, stop: Arc<AtomicBool>) -> Self {
        self.stop = stop;
        self
    }

    fn call<T>(&self, f: impl FnOnce(&mut Connection, &str) -> Result<T, RedisError>) -> Result<T, QueueError> {
        self.redis.lock().unwrap_or_else(PoisonError::into_inner).call(f)
    }

    /// Calls `f` until Redis answers ([`retry_unavailable`]); a refused
    /// call is an error, and so is a stop raised meanwhile.
    fn patiently<T>(&self, what: &str, f: impl FnMut() -> Result<T, QueueError>) -> Result<T, WeightsError> {
        let mut warn = |line: String| eprintln!("warning: {line}");
        let mut alive = |d: Duration| sleep_unless(&self.stop, d);
        match retry_unavailable(what, self.poll, &mut warn, &mut alive, f) {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(WeightsError::Channel(format!("{what}: stopped while Redis was unavailable"))),
            Err(e) => Err(WeightsError::Channel(e.to_string())),
        }
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WeightsError + '_ {
        move |source| WeightsError::Model(ModelError::Io { path: path.to_path_buf(), source })
    }
}

impl WeightChannel for SharedWeights {
    fn publish(&self, weights: &Weights, consumed: u64) -> Result<(), WeightsError> {
        let version = weights.version;
        let folder = self.dir.join(format!("v{version:06}"));
        let tmp = self.dir.join(format!(".tmp-v{version:06}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(Self::io(&tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(Self::io(&tmp))?;
        let file = tmp.join("weights.safetensors");
        weights.save_safetensors(&file)?;
        std::fs::File::open(&file).and_then(|f| f.sync_all()).map_err(Self::io(&file))?;
        if folder.exists() {
            std::fs::remove_dir_all(&folder).map_err(Self::io(&folder))?;
        }
        std::fs::rename(&tmp, &folder).map_err(Self::io(&folder))?;
        let path = folder.join("weights.safetensors").display().to_string();
        let adapter = weights.adapter.clone();
        let text = serde_json::to_string(&Announcement { version, consumed, path, adapter }).expect("serialises");
        self.patiently("announcing weights", || {
            self.call(|c, key| c.set::<_, _, ()>(format!("{key}:weights"), &text))
        })?;
        // Keep the newest three versions: an actor may still be reading
        // the one before the last.
        for entry in std::fs::read_dir(&self.dir).map_err(Self::io(&self.dir))?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(v) = name.strip_prefix('v').and_then(|v| v.parse::<u64>().ok()) {
                if v + 3 <= version {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(())
    }

    fn fetch(&self, consumed: u64, have: Option<u64>, wait: Duration) -> Result<Fetched, WeightsError> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            if self.closed() {
                return Ok(Fetched::Closed);
            }
            // An outage is not waited out here: the fetch reports it once and
            // answers Pending at its deadline, so the actor's own loop (which
            // backs off and watches its stop flag) decides what happens next.
            let text: Option<String> = match self.call(|c, key| c.get(format!("{key}:weights"))) {
                Ok(t) => {
                    let back = self.outage.lock().unwrap_or_else(PoisonError::into_inner).recovered(WEIGHTS_READ);
                    if let Some(line) = back {
                        eprintln!("warning: {line}");
                    }
                    t
                }
                Err(QueueError::Unavailable(e)) => {
                    let line = self.outage.lock().unwrap_or_else(PoisonError::into_inner).failed(WEIGHTS_READ, &e);
                    if let Some(line) = line {
                        eprintln!("warning: {line}");
                    }
                    None
                }
                Err(e) => return Err(WeightsError::Channel(e.to_string())),
            };
            if let Some(text) = text {
                let a: Announcement = serde_json::from_str(&text).map_err(|e| {
                    WeightsError::Channel(format!("{}:weights is not an announcement ({e}): {text}", self.key))
                })?;
                if a.consumed >= consumed {
                    if have == Some(a.version) {
                        return Ok(Fetched::Current(a.version));
                    }
                    // The file can be pruned between the read and the load
                    // when the learner moves on; the next poll sees a newer one.
                    if let Ok(mut w) = Weights::load_safetensors(Path::new(&a.path), a.version) {
                        w.adapter = a.adapter;
                        return Ok(Fetched::New(w));
                    }
                }
            }
            if std::time::Instant::now() >= deadline {
                return Ok(Fetched::Pending);
            }
            std::thread::sleep(self.poll);
        }
    }

    fn close(&self) -> Result<(), WeightsError> {
        self.patiently("ending the run", || self.redis.lock().unwrap_or_else(PoisonError::into_inner).close())
    }

    fn closed(&self) -> bool {
        self.call(|c, key| c.exists::<_, bool>(format!("{key}:closed"))).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::{hide_password, lua_string};

    #[test]
    fn lua_strings_hold_any_path() {
        assert_eq!(lua_string("/runs/a"), "[[/runs/a]]");
        assert_eq!(lua_string("/x]]y"), "[=[/x]]y]=]");
    }

    #[test]
    fn passwords_never_reach_the_logs() {
        assert_eq!(hide_password("redis://:s3cret@10.0.0.5:6379/0"), "redis://***@10.0.0.5:6379/0");
        assert_eq!(hide_password("redis://user:s3cret@host/1"), "redis://***@host/1");
        assert_eq!(hide_password("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
    }
}
