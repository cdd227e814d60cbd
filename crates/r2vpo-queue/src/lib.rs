//! The experience queue on a Redis Stream ([`RedisQueue`]), the multi-machine
//! backend of [`r2vpo_llm::queue::ExperienceQueue`] (the in-process one is
//! [`r2vpo_llm::queue::MemoryQueue`]).
//!
//! Layout, as ServiceNow's PipelineRL streams rollouts, but keyed by
//! iteration: one stream per run (`key`), one stream entry per prompt group,
//! ID `<iteration>-<seq>` (`XADD key <iteration>-*`: Redis ≥ 7.0 picks the
//! sequence), one field `e` holding the encoded [`GroupEntry`]. The learner
//! reads with `XRANGE key (<last id> + COUNT n` from the position stored in
//! its checkpoint, so an entry is applied at most once across restarts, and
//! keeps exactly the last K iterations with `XTRIM key MINID <it − K + 1>-0`
//! (`MAXLEN` counts entries, not iterations).
//!
//! A lost connection is an [`QueueError::Unavailable`]; the next call
//! reconnects, so callers retry with back-off and continue when the server
//! is back. Passwords go in the URL (`redis://:pass@host:6379/0`); TLS
//! (`rediss://`) is not built in.

use r2vpo_llm::queue::{EntryId, EntryLimits, ExperienceQueue, GroupEntry, QueueError, ReadBatch};
use redis::streams::StreamRangeReply;
use redis::{Commands, Connection, RedisError};

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

    /// Deletes the stream (a fresh run).
    pub fn clear(&mut self) -> Result<(), QueueError> {
        self.call(|c, key| c.del::<_, ()>(key))
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
}
