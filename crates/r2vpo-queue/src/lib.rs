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
//! A lost connection is an [`QueueError::Unavailable`]; the next call
//! reconnects, so callers retry with back-off and continue when the server
//! is back. Passwords go in the URL (`redis://:pass@host:6379/0`); TLS
//! (`rediss://`) is not built in.

use r2vpo_llm::queue::{EntryId, EntryLimits, ExperienceQueue, GroupEntry, QueueError, ReadBatch};
use redis::streams::StreamRangeReply;
use redis::{Commands, Connection, RedisError};
use std::time::Duration;

/// The keys beside the stream: the next new batch, the next slot, batch
/// leases (sorted set, deadline in server milliseconds), their owners
/// (hash) and batches restored for re-issue (sorted set).
const AUX: [&str; 5] = ["batch", "slot", "leases", "owners", "pending"];

/// Claims a batch (Lua runs atomically on the server, and its clock is
/// the only one used, so actors' clocks need not agree). KEYS: batch,
/// leases, owners, pending. ARGV: owner, lease in ms.
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
  else
    b = tostring(redis.call('INCR', KEYS[1]) - 1)
  end
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), b)
redis.call('HSET', KEYS[3], b, ARGV[1])
return tonumber(b)
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
/// server lost the run's state (no counter). KEYS: batch, pending,
/// leases. ARGV: next batch, then the pending batches.
const RESTORE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
for i = 2, #ARGV do
  if not redis.call('ZSCORE', KEYS[3], ARGV[i]) then redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i]) end
end
return 1
";

/// A Redis Stream holding one run's groups.
pub struct RedisQueue {
    client: redis::Client,
    conn: Option<Connection>,
    key: String,
    /// The URL without its password, for messages.
    shown: String,
}

/// `redis://:secret@host` → `redis://:***@host`.
fn hide_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

impl RedisQueue {
    /// A queue at `key` on the server at `url`. Nothing is contacted until
    /// the first call.
    pub fn open(url: &str, key: &str) -> Result<Self, QueueError> {
        let shown = hide_password(url);
        if url.starts_with("rediss://") {
            return Err(QueueError::Refused(format!(
                "{shown}: TLS (rediss://) is not built into r2vpo; reach Redis through a tunnel or a private network"
            )));
        }
        let client = redis::Client::open(url).map_err(|e| QueueError::Refused(format!("{shown}: {e}")))?;
        Ok(RedisQueue { client, conn: None, key: key.to_string(), shown })
    }

    /// Runs `f` on a live connection, reconnecting first if the last call
    /// lost it; a connection error drops the connection and reports
    /// [`QueueError::Unavailable`].
    fn call<T>(&mut self, f: impl FnOnce(&mut Connection, &str) -> Result<T, RedisError>) -> Result<T, QueueError> {
        if self.conn.is_none() {
            let c =
                self.client.get_connection().map_err(|e| QueueError::Unavailable(format!("{}: {e}", self.shown)))?;
            self.conn = Some(c);
        }
        let conn = self.conn.as_mut().expect("connected");
        f(conn, &self.key).map_err(|e| {
            if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
                self.conn = None;
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

    /// Deletes the stream and its batch bookkeeping (a fresh run).
    pub fn clear(&mut self) -> Result<(), QueueError> {
        self.call(|c, key| {
            let keys: Vec<String> =
                std::iter::once(key.to_string()).chain(AUX.iter().map(|a| format!("{key}:{a}"))).collect();
            c.del::<_, ()>(keys)
        })
    }

    /// Runs `script` with the run's keys named `keys` (suffixes of the
    /// stream key; "" is the stream) and `args`.
    fn eval<T: redis::FromRedisValue>(&mut self, script: &str, keys: &[&str], args: &[&[u8]]) -> Result<T, QueueError> {
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
        self.eval(CLAIM, &["batch", "leases", "owners", "pending"], &[owner.as_bytes(), ms.as_bytes()])
    }

    fn publish_batch(&mut self, batch: u64, owner: &str, entries: &[GroupEntry]) -> Result<Option<u64>, QueueError> {
        let b = batch.to_string();
        let encoded: Vec<Vec<u8>> = entries.iter().map(GroupEntry::encode).collect();
        let mut args: Vec<&[u8]> = vec![b.as_bytes(), owner.as_bytes()];
        args.extend(encoded.iter().map(Vec::as_slice));
        let slot: i64 = self.eval(PUBLISH, &["", "leases", "owners", "slot"], &args)?;
        Ok(u64::try_from(slot).ok())
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
        self.eval::<i64>(RESTORE, &["batch", "pending", "leases"], &args).map(|_| ())
    }
}
