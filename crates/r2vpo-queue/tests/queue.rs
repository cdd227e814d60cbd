//! The experience queue's contract, run against both backends: the
//! in-process `MemoryQueue` and a real `redis-server` this test starts on a
//! free loopback port with its own data folder and stops by PID.

use std::time::Duration;

use r2vpo_llm::queue::{EntryId, EntryLimits, ExperienceQueue, GroupEntry, MemoryQueue, QueueError, ENTRY_SCHEMA};
use r2vpo_queue::RedisQueue;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::{free_port, Redis};

fn entry(iteration: u64, problem: usize) -> GroupEntry {
    GroupEntry {
        schema: ENTRY_SCHEMA,
        iteration,
        problem,
        prompt_ids: vec![1, 2, 3],
        responses: vec![vec![4, 5], vec![6]],
        behaviour_logp: vec![vec![-0.5, -1.25], vec![-2.0]],
        rewards: vec![1.0, -1.0],
        correct: vec![true, false],
        advantages: vec![0.7, -0.7],
        truncated: vec![false, true],
        entropy_sum: vec![0.9, 0.4],
        entropy_tokens: vec![2, 1],
        weight_version: iteration,
    }
}

/// Everything the learner relies on, for any backend.
fn contract(q: &mut dyn ExperienceQueue) {
    let limits = EntryLimits::default();
    assert!(q.is_empty().unwrap());
    // K = 3 iterations kept; publish K + 2 with three groups each.
    let k = 3u64;
    let mut ids = Vec::new();
    for it in 0..k + 2 {
        for p in 0..3 {
            ids.push(q.publish(&entry(it, p)).unwrap());
        }
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow: {ids:?}");
    assert!(ids.iter().zip(0..).all(|(id, i)| id.iteration == i / 3));
    // Paged reads see every entry once, in order.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = q.read_after(after, 4, &limits).unwrap();
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().0);
        for (id, e) in page {
            let e = e.unwrap();
            assert_eq!((e.iteration, e.problem), (id.iteration, seen.len() % 3));
            seen.push(id);
        }
    }
    assert_eq!(seen, ids);
    // Keep exactly the last K iterations.
    let newest = k + 1;
    let dropped = q.trim_before(newest + 1 - k).unwrap();
    assert_eq!(dropped, 6);
    assert_eq!(q.len().unwrap(), 9);
    let left: Vec<u64> = q.read_after(None, 100, &limits).unwrap().iter().map(|(id, _)| id.iteration).collect();
    assert_eq!(left, vec![2, 2, 2, 3, 3, 3, 4, 4, 4]);
    // Reading on from a position inside the kept window skips what was read.
    let from = q.read_after(Some(EntryId { iteration: 3, seq: 1 }), 100, &limits).unwrap();
    assert_eq!(from.len(), 4);
}

/// Batch leases: two live actors never hold one batch; a dead actor's
/// batch goes to the next claimant and its late publish is refused; slots
/// follow publish order; a restored queue re-issues the pending batches
/// first. `fresh` gives an empty queue of the same backend.
fn lease_contract(fresh: &mut dyn FnMut() -> Box<dyn ExperienceQueue>) {
    let limits = EntryLimits::default();
    let long = Duration::from_secs(600);
    let mut a = fresh();
    let mut b = fresh();
    assert_eq!(a.claim_batch("a", long).unwrap(), 0);
    assert_eq!(b.claim_batch("b", long).unwrap(), 1);
    assert_eq!(b.publish_batch(1, "a", &[entry(1, 0)]).unwrap(), None, "only the owner publishes");
    assert_eq!(b.publish_batch(1, "b", &[entry(1, 0), entry(1, 1)]).unwrap(), Some(0));
    assert_eq!(a.publish_batch(0, "a", &[entry(0, 0), entry(0, 1)]).unwrap(), Some(1));
    let got: Vec<(EntryId, u64)> =
        a.read_after(None, 10, &limits).unwrap().into_iter().map(|(id, e)| (id, e.unwrap().iteration)).collect();
    let id = |iteration, seq| EntryId { iteration, seq };
    assert_eq!(got, vec![(id(0, 1), 1), (id(0, 2), 1), (id(1, 1), 0), (id(1, 2), 0)]);
    // "a" dies holding batch 2: its lease runs out and "b" gets batch 2,
    // also when it asks for expired batches only.
    assert_eq!(b.claim_expired("b", long).unwrap(), None, "no new batch from claim_expired");
    assert_eq!(a.claim_batch("a", Duration::from_millis(1)).unwrap(), 2);
    std::thread::sleep(Duration::from_millis(30));
    assert!(!b.renew_lease(2, "b", long).unwrap(), "only the owner renews");
    assert_eq!(b.claim_expired("b", long).unwrap(), Some(2));
    assert!(b.renew_lease(2, "b", long).unwrap());
    assert_eq!(a.claim_batch("a", long).unwrap(), 3, "a live lease is not handed out twice");
    assert_eq!(a.publish_batch(2, "a", &[entry(2, 0)]).unwrap(), None, "the late publish is refused");
    assert_eq!(a.lease_owner(2).unwrap().as_deref(), Some("b"), "and says who holds the batch now");
    assert_eq!(b.publish_batch(2, "b", &[entry(2, 0)]).unwrap(), Some(2));
    assert_eq!(a.lease_owner(2).unwrap(), None, "a published batch is nobody's");
    assert_eq!(a.len().unwrap(), 5);
    // A restarted single-box run ends the old leases at once.
    assert_eq!(a.claim_batch("a", long).unwrap(), 4);
    b.expire_leases().unwrap();
    assert_eq!(b.claim_batch("b", long).unwrap(), 3);
    assert_eq!(a.claim_batch("a", long).unwrap(), 4);
    // A queue that lost its state, restored from a learner's checkpoint.
    let mut r = fresh();
    r.restore_batches(10, &[3, 5]).unwrap();
    let claims: Vec<u64> = (0..3).map(|_| r.claim_batch("c", long).unwrap()).collect();
    assert_eq!(claims, vec![3, 5, 10]);
    // Its slots sort after every slot the learner read before (each of the
    // 10 batches took at most one): from slot 0 they were never read.
    let slot = r.publish_batch(3, "c", &[entry(3, 0)]).unwrap().unwrap();
    assert!(slot >= 10, "slot {slot}");
}

#[test]
fn memory_queue_keeps_the_contract() {
    contract(&mut MemoryQueue::new());
    let mut shared = MemoryQueue::new();
    let mut n = 0;
    lease_contract(&mut || {
        // Two handles on one queue, then a separate one for the restore.
        n += 1;
        if n == 3 {
            shared = MemoryQueue::new();
        }
        Box::new(shared.clone())
    });
}

#[test]
fn redis_stream_keeps_the_contract() {
    let tmp = tempfile::tempdir().unwrap();
    let r = Redis::start_anywhere(tmp.path());
    let mut q = RedisQueue::open(&r.url(), "r2vpo:test").unwrap();
    contract(&mut q);
    let url = r.url();
    let mut n = 0;
    lease_contract(&mut || {
        n += 1;
        let key = if n < 3 { "r2vpo:leases" } else { "r2vpo:restored" };
        Box::new(RedisQueue::open(&url, key).unwrap())
    });
    // A server that kept its state ignores a restore.
    let mut kept = RedisQueue::open(&url, "r2vpo:leases").unwrap();
    kept.restore_batches(100, &[0]).unwrap();
    assert_eq!(kept.claim_batch("d", Duration::from_secs(60)).unwrap(), 5);
}

/// One run owns a stream at a time (two learners on one key consumed each
/// other's groups): a fresh run is refused while the owner has not closed,
/// and deletes nothing; the owner resumes; a closed run leaves no leases,
/// lease owners or batches to re-issue, and its key may then be taken
/// afresh; a server that lost its data lets the owner resume.
#[test]
fn a_stream_is_owned_by_one_run_until_it_closes() {
    use r2vpo_llm::weights::WeightChannel;
    let tmp = tempfile::tempdir().unwrap();
    let r = Redis::start_anywhere(tmp.path());
    let url = r.url();
    let mut a = RedisQueue::open(&url, "r2vpo:owned").unwrap();
    a.take_for("/runs/a", false).unwrap();
    a.publish(&entry(0, 0)).unwrap();
    assert_eq!(a.claim_batch("actor-1", Duration::from_secs(60)).unwrap(), 0);

    let mut b = RedisQueue::open(&url, "r2vpo:owned").unwrap();
    for resumed in [false, true] {
        let e = b.take_for("/runs/b", resumed).unwrap_err().to_string();
        assert!(e.contains("r2vpo:owned") && e.contains("/runs/a") && e.contains("has not closed"), "{e}");
    }
    assert!(!a.is_empty().unwrap(), "a refused run deleted the owner's groups");
    a.take_for("/runs/a", true).unwrap();
    assert_eq!(a.owner().unwrap().as_deref(), Some("/runs/a"));

    let channel = r2vpo_queue::SharedWeights::open(RedisQueue::open(&url, "r2vpo:owned").unwrap(), tmp.path()).unwrap();
    channel.close().unwrap();
    let mut raw = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    for aux in ["leases", "owners", "pending"] {
        let n: u64 = redis::cmd("EXISTS").arg(format!("r2vpo:owned:{aux}")).query(&mut raw).unwrap();
        assert_eq!(n, 0, "r2vpo:owned:{aux} outlived the closed run");
    }

    b.take_for("/runs/b", false).unwrap();
    assert!(b.is_empty().unwrap(), "the fresh run kept the closed run's groups");
    assert_eq!(b.owner().unwrap().as_deref(), Some("/runs/b"));
    let closed: u64 = redis::cmd("EXISTS").arg("r2vpo:owned:closed").query(&mut raw).unwrap();
    assert_eq!(closed, 0, "the fresh run inherited the closed flag");

    redis::cmd("FLUSHALL").query::<()>(&mut raw).unwrap();
    b.take_for("/runs/b", true).unwrap();
    assert_eq!(b.owner().unwrap().as_deref(), Some("/runs/b"));
}

/// Keys deleted under a live run (`FLUSHALL`, eviction: no restart, so no
/// reconnection) are noticed by a run's handles within `OWNER_CHECK` on
/// any call, and at once by the scripts that would make something: no
/// batch counter is made from nothing for a resumed learner to mistake for
/// its own. An actor's handle adopts the first owner it meets, and makes
/// nothing before a learner has taken the stream.
#[test]
fn keys_deleted_under_a_run_are_noticed_without_a_reconnection() {
    let tmp = tempfile::tempdir().unwrap();
    let r = Redis::start_anywhere(tmp.path());
    let url = r.url();
    let long = Duration::from_secs(60);
    let mut early = RedisQueue::open(&url, "r2vpo:wiped").unwrap().following_owner();
    match early.claim_batch("early", long) {
        Err(QueueError::Unavailable(e)) => assert!(e.contains("no learner has taken"), "{e}"),
        other => panic!("an actor made a batch before its learner: {other:?}"),
    }
    RedisQueue::open(&url, "r2vpo:wiped").unwrap().take_for("/runs/w", false).unwrap();
    let mut learner = RedisQueue::open(&url, "r2vpo:wiped").unwrap().with_owner("/runs/w");
    let mut actor = RedisQueue::open(&url, "r2vpo:wiped").unwrap().following_owner();
    assert_eq!(actor.claim_batch("a", long).unwrap(), 0);
    assert_eq!(early.claim_batch("early", long).unwrap(), 1, "the early actor goes on once a learner is there");
    assert!(learner.is_empty().unwrap());

    r.flush_all();
    let e = actor.claim_batch("a", long).unwrap_err().to_string();
    assert!(e.contains("was emptied") && e.contains("/runs/w"), "{e}");
    // An actor has no --resume: what continues is the learner's, then the
    // actor started again.
    assert!(e.contains("llm learn --resume /runs/w") && e.contains("start this actor again"), "{e}");
    assert!(!e.contains("resumes with its command's --resume"), "{e}");
    let mut raw = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let made: u64 = redis::cmd("EXISTS").arg("r2vpo:wiped:batch").query(&mut raw).unwrap();
    assert_eq!(made, 0, "a batch counter was made in the emptied stream");
    let t0 = std::time::Instant::now();
    loop {
        match learner.read_after(None, 10, &EntryLimits::default()) {
            Ok(_) => {
                assert!(t0.elapsed() < r2vpo_queue::OWNER_CHECK * 3, "the learner read on from an emptied stream");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                assert!(e.to_string().contains("was emptied"), "{e}");
                assert!(e.to_string().contains("resumes with its command's --resume"), "{e}");
                break;
            }
        }
    }
}

/// A server that stops answering (SIGSTOP) makes each call of a handle
/// with a timeout an outage after that long, not a hang; the handle works
/// again once the server does.
#[test]
fn a_hung_server_times_calls_out() {
    let tmp = tempfile::tempdir().unwrap();
    let r = Redis::start_anywhere(tmp.path());
    let mut q = RedisQueue::open(&r.url(), "r2vpo:hung").unwrap().with_timeout(Duration::from_millis(300));
    q.publish(&entry(0, 0)).unwrap();
    r.freeze(true);
    for _ in 0..2 {
        let t0 = std::time::Instant::now();
        let e = q.len().unwrap_err();
        assert!(matches!(e, QueueError::Unavailable(_)), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5), "a call waited {:?}", t0.elapsed());
    }
    r.freeze(false);
    assert_eq!(q.len().unwrap(), 1);
}

#[test]
fn garbage_entries_are_rejected_with_a_reason_and_the_rest_read() {
    let tmp = tempfile::tempdir().unwrap();
    let r = Redis::start_anywhere(tmp.path());
    let mut q = RedisQueue::open(&r.url(), "r2vpo:garbage").unwrap();
    let mut mem = MemoryQueue::new();
    let limits = EntryLimits { max_bytes: 4096, vocab: 100, ..EntryLimits::default() };
    let mut bad_lengths = entry(0, 0);
    bad_lengths.rewards.pop();
    let mut bad_logp = entry(0, 0);
    bad_logp.behaviour_logp[0] = vec![-0.5];
    let mut bad_token = entry(0, 0);
    bad_token.responses[1] = vec![1000];
    let mut newer = serde_json::to_value(entry(0, 0)).unwrap();
    newer["schema"] = serde_json::json!(ENTRY_SCHEMA + 1);
    let nan = String::from_utf8(entry(0, 0).encode()).unwrap().replace("-2.0", "NaN");
    let garbage: Vec<(Vec<u8>, &str)> = vec![
        (b"not json at all".to_vec(), "not JSON"),
        (serde_json::to_vec(&newer).unwrap(), "schema"),
        (bad_lengths.encode(), "rewards"),
        (bad_logp.encode(), "log-probs for"),
        (bad_token.encode(), "outside the vocabulary"),
        (nan.into_bytes(), "not JSON"),
        (vec![b' '; 5000], "bytes"),
        (format!(r#"{{"schema": {ENTRY_SCHEMA}, "iteration": 0, "rm": "-rf"}}"#).into_bytes(), "bad entry"),
    ];
    for (bytes, _) in &garbage {
        q.publish_raw(0, bytes).unwrap();
        mem.publish_raw(0, bytes.clone()).unwrap();
    }
    q.publish(&entry(0, 7)).unwrap();
    mem.publish(&entry(0, 7)).unwrap();
    for got in [q.read_after(None, 100, &limits).unwrap(), mem.read_after(None, 100, &limits).unwrap()] {
        assert_eq!(got.len(), garbage.len() + 1);
        for ((_, e), (_, why)) in got.iter().zip(&garbage) {
            let err = e.as_ref().expect_err("garbage is rejected");
            assert!(err.contains(why), "{err} should mention {why}");
        }
        assert_eq!(got.last().unwrap().1.as_ref().unwrap().problem, 7);
    }
}

#[test]
fn a_redis_restart_is_reported_and_reading_continues_where_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let r = Redis::start_anywhere(tmp.path());
    let port = r.port;
    let mut q = RedisQueue::open(&r.url(), "r2vpo:restart").unwrap();
    let limits = EntryLimits::default();
    for p in 0..3 {
        q.publish(&entry(5, p)).unwrap();
    }
    let first = q.read_after(None, 2, &limits).unwrap();
    let last = first.last().unwrap().0;
    r.stop();
    assert!(matches!(q.publish(&entry(6, 0)), Err(QueueError::Unavailable(_))));
    assert!(matches!(q.read_after(Some(last), 10, &limits), Err(QueueError::Unavailable(_))));
    let _r = Redis::start(tmp.path(), port);
    // The append-only file kept the stream; the reader goes on after what it
    // had read, so nothing is read twice.
    let rest = q.read_after(Some(last), 10, &limits).unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].1.as_ref().unwrap().problem, 2);
    let id = q.publish(&entry(6, 0)).unwrap();
    assert_eq!(id.iteration, 6);
}

#[test]
fn urls_keep_passwords_out_of_messages() {
    let port = free_port(); // nothing listens there
    let mut q = RedisQueue::open(&format!("redis://:hunter2@127.0.0.1:{port}/0"), "k").unwrap();
    let e = q.len().unwrap_err().to_string();
    assert!(e.contains("unavailable") && !e.contains("hunter2"), "{e}");
}

/// `rediss://` against a real TLS-only `redis-server` with a certificate
/// signed by a CA of the test's own: trusted through the CA file, or with
/// `#insecure`; refused (not retried) when nothing vouches for it.
#[test]
fn rediss_urls_connect_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (r, ca) = Redis::start_tls(dir.path());
    let url = format!("rediss://127.0.0.1:{}/0", r.port);
    let mut q = RedisQueue::open_tls(&url, "r2vpo:tls", Some(&ca)).unwrap();
    q.clear().unwrap();
    q.publish(&entry(0, 1)).unwrap();
    assert_eq!(q.len().unwrap(), 1);
    let mut q = RedisQueue::open(&format!("{url}#insecure"), "r2vpo:tls").unwrap();
    assert_eq!(q.len().unwrap(), 1);
    // The system's roots do not know the test CA: a clear refusal, since
    // retrying cannot fix a certificate.
    let mut q = RedisQueue::open(&url, "r2vpo:tls").unwrap();
    match q.len() {
        Err(QueueError::Refused(e)) => assert!(e.to_lowercase().contains("certificate"), "{e}"),
        other => panic!("an untrusted certificate must be refused, got {other:?}"),
    }
    // A CA file for a plain URL is a mistake, said at once.
    let e = RedisQueue::open_tls(&r.url(), "k", Some(&ca)).err().unwrap().to_string();
    assert!(e.contains("rediss://"), "{e}");
}
