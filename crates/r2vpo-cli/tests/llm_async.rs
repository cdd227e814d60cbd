//! `r2vpo llm train --async` end to end on a tiny random model with the
//! embedded tokenizer: two actor threads and the learner, through the
//! in-process queue and through a real `redis-server` started here on a
//! free loopback port (stopped by PID). With `actors.max_staleness = 0`
//! every batch is made by the weights that consume it, so each run below
//! must write exactly the metrics of the synchronous `llm train` — which
//! also shows that no group was applied twice or skipped after a learner
//! SIGKILL, a Redis restart or garbage in the stream.

#[path = "../../r2vpo-queue/tests/support/redis_server.rs"]
mod redis_server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use r2vpo_llm::queue::ExperienceQueue;
use r2vpo_queue::RedisQueue;
use redis_server::Redis;

const ITERATIONS: usize = 8;
/// Replay capacity in iterations (K), and groups per iteration.
const K: u64 = 3;
const PROMPTS: u64 = 2;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write_config(dir: &Path) -> PathBuf {
    let gguf = root().join(".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.exists(), "{} missing (run `make deps`)", gguf.display());
    let text = format!(
        r#"
iterations = {ITERATIONS}
prompts_per_iter = {PROMPTS}
group_size = 4
rollout_batch = 8
minibatch_size = 4
micro_batch_size = 2
checkpoint_every = 1
histogram_every = 2
mode = "off"
[model]
path = "{}"
[model.random]
hidden = 32
intermediate = 64
layers = 2
heads = 4
kv_heads = 2
seed = 3
init_std = 1.0
[data]
count = 40
[sampling]
max_new_tokens = 6
[replay]
minibatch_size = 4
capacity_iters = {K}
[optim]
lr = 1e-3
[actors]
count = 2
max_staleness = 0
"#,
        gguf.display()
    );
    let p = dir.join("tiny.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn train(cfg: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root()).args(["llm", "train", "--config"]).arg(cfg).arg("--out").arg(out);
    c.args(["--no-export", "--quiet"]).args(extra);
    c
}

/// `llm learn` into `out` on the Redis at `url`.
fn learn(cfg: &Path, out: &Path, url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root()).args(["llm", "learn", "--config"]).arg(cfg).arg("--out").arg(out);
    c.args(["--no-export", "--quiet"]).args(on_redis(url));
    c
}

fn resume(out: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root()).args(["llm", "train", "--resume"]).arg(out).args(["--no-export", "--quiet"]);
    c
}

fn lines(dir: &Path, file: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `metrics.jsonl` without the wall-clock `timing` and the async-only
/// `queue` objects (what a synchronous run also writes).
fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    lines(dir, "metrics.jsonl")
        .into_iter()
        .map(|mut v| {
            let o = v.as_object_mut().unwrap();
            o.remove("timing");
            o.remove("queue");
            v
        })
        .collect()
}

/// Sum of one `queue` counter over the run.
fn queue_total(dir: &Path, field: &str) -> u64 {
    lines(dir, "metrics.jsonl").iter().map(|v| v["queue"][field].as_u64().unwrap()).sum()
}

/// A temporary folder with the tiny config, and the metrics of the
/// synchronous `llm train` run every async run must match.
fn setup() -> (tempfile::TempDir, PathBuf, Vec<serde_json::Value>) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let sync = tmp.path().join("sync");
    ok(&mut train(&cfg, &sync, &[]));
    let want = metrics(&sync);
    assert_eq!(want.len(), ITERATIONS);
    (tmp, cfg, want)
}

/// The stream key a run's config.toml names (`queue.key`).
fn queue_key(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    v["queue"]["key"].as_str().unwrap().to_string()
}

/// `--set`s that put the queue on the Redis at `url`.
fn on_redis(url: &str) -> Vec<String> {
    vec!["--set".into(), "queue.backend=\"redis\"".into(), "--set".into(), format!("queue.url=\"{url}\"")]
}

fn ok(c: &mut Command) {
    let out = c.output().unwrap();
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Waits until `dir` has a checkpoint after at least `n` iterations.
fn wait_for_checkpoint(child: &mut Child, dir: &Path, n: usize) {
    let t0 = Instant::now();
    while metrics(dir).len() < n || !dir.join("checkpoints/latest").exists() {
        assert!(t0.elapsed() < Duration::from_secs(300), "the run never got going");
        assert!(child.try_wait().unwrap().is_none(), "the run ended before the fault could be injected");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn async_with_max_staleness_zero_equals_the_synchronous_run_on_both_queues() {
    let (tmp, cfg, want) = setup();

    let mem = tmp.path().join("memory");
    ok(&mut train(&cfg, &mem, &["--async"]));
    assert_eq!(metrics(&mem), want, "async (memory queue) differs from llm train");

    let redis = Redis::start_anywhere(tmp.path());
    let red = tmp.path().join("redis");
    let url = redis.url();
    ok(train(&cfg, &red, &["--async"]).args(on_redis(&url)));
    assert_eq!(metrics(&red), want, "async (Redis queue) differs from llm train");
    // The stream keeps exactly the last K iterations' slots.
    let mut q = RedisQueue::open(&url, &queue_key(&red)).unwrap();
    let slots: Vec<u64> =
        q.read_after(None, 100, &Default::default()).unwrap().iter().map(|(id, _)| id.iteration).collect();
    assert_eq!(slots.len() as u64, K * PROMPTS, "{slots:?}");
    assert_eq!(*slots.first().unwrap(), ITERATIONS as u64 - K);
    for dir in [&mem, &red] {
        let m = lines(dir, "metrics.jsonl");
        // The rollout rate is the groups' tokens over the iteration's wall
        // clock, not over the learner's wait for them.
        for v in &m {
            let t = &v["timing"];
            let tokens = v["response_len_mean"].as_f64().unwrap() * (PROMPTS * 4) as f64;
            let rate = t["rollout_tokens_per_s"].as_f64().unwrap() * t["iteration_s"].as_f64().unwrap();
            assert!((rate - tokens).abs() <= 1e-6 * tokens, "{dir:?}: {t} for {tokens} tokens");
        }
        assert!(m.iter().all(|v| v["queue"]["fresh_lag"] == serde_json::json!([[0, PROMPTS]])), "{dir:?}");
        assert_eq!(queue_total(dir, "stale_dropped") + queue_total(dir, "rejected"), 0);
    }

    // With one version of slack the actors run ahead: fresh groups lag by
    // one version and none is dropped.
    let ahead = tmp.path().join("ahead");
    ok(&mut train(&cfg, &ahead, &["--async", "--set", "actors.max_staleness=1"]));
    let m = lines(&ahead, "metrics.jsonl");
    assert_eq!(m.len(), ITERATIONS);
    assert!(m.iter().all(|v| v["queue"]["fresh_lag"].as_array().unwrap().iter().all(|l| l[0].as_u64() <= Some(1))));
    assert_eq!(queue_total(&ahead, "stale_dropped"), 0);
    let hist = lines(&ahead, "ratio_hist.jsonl");
    assert!(hist.iter().all(|h| h["age_unit"] == "weight_version"), "{hist:?}");
}

#[test]
fn a_killed_async_learner_resumes_exactly_and_garbage_in_the_stream_is_skipped() {
    let (tmp, cfg, want) = setup();

    let redis = Redis::start_anywhere(tmp.path());
    let url = redis.url();
    let run = tmp.path().join("killed");
    let mut child = train(&cfg, &run, &["--async"]).args(on_redis(&url)).stderr(Stdio::null()).spawn().unwrap();
    wait_for_checkpoint(&mut child, &run, 3);
    child.kill().unwrap(); // SIGKILL: learner and actor threads
    child.wait().unwrap();
    assert!(metrics(&run).len() < ITERATIONS, "killed after the run had finished");

    // A run in another folder of the same name gets a stream of its own
    // (it once shared `r2vpo:killed` and wiped the killed run's groups),
    // and runs to the end without touching the killed run's.
    let key = queue_key(&run);
    let twin = tmp.path().join("other").join("killed");
    ok(train(&cfg, &twin, &["--async"]).args(on_redis(&url)));
    assert_ne!(queue_key(&twin), key, "two folders named `killed` share a stream");
    assert_eq!(metrics(&twin), want);
    // Naming the killed run's key outright is refused, naming the key and
    // its owner, and leaves no folder behind: that run has not closed.
    let thief = tmp.path().join("thief");
    let out = train(&cfg, &thief, &["--async", "--set", &format!("queue.key=\"{key}\"")])
        .args(on_redis(&url))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a fresh run took the stream of a run that has not closed");
    assert!(err.contains(&key) && err.contains("killed") && err.contains("has not closed"), "{err}");
    assert!(!thief.exists(), "the refused run left its folder");

    // The stream outlived the learner; a foreign writer appends garbage.
    let mut q = RedisQueue::open(&url, &key).unwrap();
    let held = q.read_after(None, 100, &Default::default()).unwrap();
    assert!(!held.is_empty() && held.len() as u64 <= (K + 3) * PROMPTS, "{} entries", held.len());
    let next = held.last().unwrap().0.iteration + 1;
    q.publish_raw(next, b"not json").unwrap();
    q.publish_raw(next, br#"{"schema": 999}"#).unwrap();
    // ...and a well-formed group claiming a batch number no actor leased.
    let mut far = held.iter().find_map(|(_, e)| e.as_ref().ok()).expect("a valid entry").clone();
    far.iteration = 1 << 40;
    q.publish_raw(next, &far.encode()).unwrap();

    ok(&mut resume(&run));
    assert_eq!(metrics(&run), want, "the resumed async run differs from llm train");
    // After the kill and the resume the stream holds exactly the last K
    // slots (the garbage's slot is one of the slots, so slots are counted
    // and checked consecutive, not named).
    let held = q.read_after(None, 100, &Default::default()).unwrap();
    let mut slots: Vec<u64> = held.iter().map(|(id, _)| id.iteration).collect();
    slots.dedup();
    assert_eq!(slots.len() as u64, K, "{slots:?}");
    assert!(slots.windows(2).all(|w| w[1] == w[0] + 1), "{slots:?}");
    assert_eq!(queue_total(&run, "rejected"), 3);
    let rejected: Vec<_> = lines(&run, "events.jsonl").into_iter().filter(|e| e["event"] == "entry_rejected").collect();
    assert_eq!(rejected.len(), 3);
    assert!(rejected.iter().any(|e| e["reason"].as_str().unwrap().contains("far ahead")), "{rejected:?}");
    // Once it has closed, its key may be taken by a fresh run.
    ok(train(&cfg, &thief, &["--async", "--set", &format!("queue.key=\"{key}\"")]).args(on_redis(&url)));
}

/// A Redis with its data in `data`, and an `llm train --async` run into
/// `run` on it that has written its checkpoint after iteration 2. A batch
/// leased while Redis is down can be lost with it; it is leased again when
/// its lease runs out (600 s by default: once, on a slow machine, a test
/// took 606 s), so a short one.
fn running_on_redis(cfg: &Path, data: &Path, run: &Path) -> (Redis, PathBuf, Child) {
    std::fs::create_dir_all(data).unwrap();
    let redis = Redis::start_anywhere(data);
    let mut child = train(cfg, run, &["--async"])
        .args(on_redis(&redis.url()))
        .args(["--set", "queue.lease_s=5"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_checkpoint(&mut child, run, 2);
    (redis, run.to_path_buf(), child)
}

#[test]
fn a_redis_restart_mid_run_is_retried_and_changes_nothing() {
    let (tmp, cfg, want) = setup();

    let data = tmp.path().join("redis-data");
    let (redis, run, child) = running_on_redis(&cfg, &data, &tmp.path().join("restart"));
    let port = redis.port;
    redis.stop(); // SIGTERM: Redis writes its append-only file and exits
    std::thread::sleep(Duration::from_millis(1500));
    let _back = Redis::start(&data, port);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("retrying with back-off"), "the outage was not reported: {stderr}");
    // Reported once by each part that met it (learner, actor 0, actor 1),
    // not once per retry.
    for who in ["learner:", "actor 0:", "actor 1:"] {
        let n = stderr.lines().filter(|l| l.contains(who) && l.contains("retrying with back-off")).count();
        assert!(n <= 1, "{who} reported the outage {n} times: {stderr}");
    }
    assert_eq!(metrics(&run), want, "a Redis restart changed what was learned");
}

/// A Redis that comes back empty (no persistence) has lost the stream and
/// the batch counters: actors would make batches from 0 again and the
/// learner skip them as seen, a silent stall. The run stops instead, says
/// what happened and how to go on, and `--resume` (which restores the
/// counters) finishes it with what the synchronous run learns.
#[test]
fn a_redis_that_comes_back_empty_stops_the_run_with_the_reason_and_resume_finishes_it() {
    let (tmp, cfg, want) = setup();
    let lost = tmp.path().join("redis-empty");
    std::fs::create_dir(&lost).unwrap();
    let (redis, run, child) = running_on_redis(&cfg, &tmp.path().join("redis-kept"), &tmp.path().join("wiped"));
    let port = redis.port;
    redis.stop();
    std::thread::sleep(Duration::from_millis(500));
    // The same port, a data folder of nothing: as a restart without
    // persistence leaves it.
    let empty = Redis::start(&lost, port);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run went on over an emptied queue: {stderr}");
    assert!(stderr.contains("was emptied") && stderr.contains("--resume"), "{stderr}");
    assert!(metrics(&run).len() < ITERATIONS, "the run finished");
    let _back = empty; // on the run's port: resume reads its URL from config.toml
    ok(&mut resume(&run));
    assert_eq!(metrics(&run), want, "the resumed run differs from llm train");
}

/// SIGTERM of `llm learn` names `llm learn --resume`: `llm train
/// --resume` would start actor threads of its own beside the actor
/// processes.
#[test]
fn a_stopped_learner_names_its_own_resume_command() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let redis = Redis::start_anywhere(tmp.path());
    let run = tmp.path().join("learner");
    let learner = learn(&cfg, &run, &redis.url()).stderr(Stdio::piped()).spawn().unwrap();
    // With no actor, the learner waits for groups once it has started.
    let t0 = Instant::now();
    while !run.join("metrics.jsonl").exists() && !run.join("config.toml").exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "the learner never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: signals the child this test started.
    unsafe { libc::kill(learner.id() as i32, libc::SIGTERM) };
    let out = learner.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert!(err.contains(&format!("Continue with: r2vpo llm learn --resume {}", run.display())), "{err}");
}

/// Kills the processes it names when dropped, so a failing test leaves no
/// learner or actor behind.
struct Reaper(Vec<u32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: signals a child this test started; a finished one's
            // pid was reaped by wait() and the call fails harmlessly.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// `llm actor --name NAME` on the run whose resolved config is `resolved`,
/// its stderr in `log`.
fn actor(resolved: &Path, name: &str, log: std::fs::File) -> Child {
    Command::new(env!("CARGO_BIN_EXE_r2vpo"))
        .current_dir(root())
        .args(["llm", "actor", "--config"])
        .arg(resolved)
        .args(["--name", name])
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Waits until `path` exists (the learner has written its config.toml).
fn wait_for_file(path: &Path) {
    let t0 = Instant::now();
    while !path.exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The exit status of `child`, which must come within `limit`.
fn exits_within(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(t0.elapsed() < limit, "{what} did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `llm learn` into `run` on the Redis at `url` with `sets`, and one `llm
/// actor` (`a0`) on it once the learner has written its config; their
/// stderr in `tmp/learner.log` and `tmp/a0.log`.
fn learner_and_actor(tmp: &Path, cfg: &Path, run: &Path, url: &str, sets: &[&str]) -> (Child, Child, Reaper) {
    let log = |name: &str| std::fs::File::create(tmp.join(name)).unwrap();
    let learner = learn(cfg, run, url).args(sets).stdout(Stdio::null()).stderr(log("learner.log")).spawn().unwrap();
    let mut reaper = Reaper(vec![learner.id()]);
    wait_for_file(&run.join("config.toml"));
    let a0 = actor(&run.join("config.toml"), "a0", log("a0.log"));
    reaper.0.push(a0.id());
    (learner, a0, reaper)
}

/// `FLUSHALL` under a live `llm learn` + `llm actor` (an operator, or
/// eviction under `maxmemory`): no reconnection happens, so only the
/// periodic ownership check sees it. Both processes stop within seconds
/// with the reason; the learner, which had no checkpoint yet, writes one
/// and names `llm learn --resume`, which then finishes the run to the
/// synchronous run's metrics.
#[test]
fn keys_deleted_under_a_live_run_stop_learner_and_actor_with_a_checkpoint() {
    let (tmp, cfg, want) = setup();
    let redis = Redis::start_anywhere(tmp.path());
    let url = redis.url();
    let run = tmp.path().join("flushed");
    let log = |name: &str| std::fs::File::create(tmp.path().join(name)).unwrap();
    // No checkpoint falls due before the wipe: the one it causes is the first.
    let sets = ["--set", "checkpoint_every=100", "--set", "queue.lease_s=2"];
    let (mut learner, mut a0, mut reaper) = learner_and_actor(tmp.path(), &cfg, &run, &url, &sets);
    let resolved = run.join("config.toml");
    let t0 = Instant::now();
    while metrics(&run).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(300), "the run never got going");
        assert!(learner.try_wait().unwrap().is_none(), "{}", read(&tmp.path().join("learner.log")));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!run.join("checkpoints/latest").exists(), "a checkpoint was due before the wipe");
    redis.flush_all();
    let status = exits_within(&mut learner, Duration::from_secs(60), "the learner");
    let err = read(&tmp.path().join("learner.log"));
    assert!(!status.success(), "the learner went on over an emptied queue: {err}");
    assert!(err.contains("was emptied"), "{err}");
    assert!(err.contains(&format!("continue with: r2vpo llm learn --resume {}", run.display())), "{err}");
    assert!(run.join("checkpoints/latest").exists(), "the learner stopped without a checkpoint: {err}");
    let status = exits_within(&mut a0, Duration::from_secs(60), "the actor");
    let err = read(&tmp.path().join("a0.log"));
    assert!(!status.success() && err.contains("was emptied"), "{err}");
    // `llm actor` has no --resume: the hint is the learner's, then the
    // actor's own command again.
    assert!(err.contains(&format!("llm learn --resume {}", run.display())), "{err}");
    assert!(err.contains("start this actor again") && !err.contains("its command's --resume"), "{err}");
    assert!(metrics(&run).len() < ITERATIONS, "the run finished before the wipe");

    let mut learner = Command::new(env!("CARGO_BIN_EXE_r2vpo"))
        .current_dir(root())
        .args(["llm", "learn", "--resume"])
        .arg(&run)
        .args(["--no-export", "--quiet"])
        .stderr(log("learner-2.log"))
        .spawn()
        .unwrap();
    reaper.0.push(learner.id());
    let mut a1 = actor(&resolved, "a1", log("a1.log"));
    reaper.0.push(a1.id());
    let status = exits_within(&mut learner, Duration::from_secs(300), "the resumed learner");
    assert!(status.success(), "{}", read(&tmp.path().join("learner-2.log")));
    assert!(exits_within(&mut a1, Duration::from_secs(30), "the second actor").success());
    assert_eq!(metrics(&run), want, "the run resumed after the wipe differs from llm train");
}

/// Redis hangs (SIGSTOP: connections stay open, nothing answers): the
/// learner and the actor say they are waiting instead of blocking in
/// silence, and SIGTERM still ends each at once, the learner with a
/// checkpoint and its resume command.
#[test]
fn a_hung_redis_is_reported_and_signals_still_stop_learner_and_actor() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let redis = Redis::start_anywhere(tmp.path());
    let run = tmp.path().join("hung");
    let (mut learner, mut a0, _reaper) =
        learner_and_actor(tmp.path(), &cfg, &run, &redis.url(), &["--set", "queue.timeout_s=1"]);
    wait_for_checkpoint(&mut learner, &run, 2);
    redis.freeze(true);
    let t0 = Instant::now();
    while !read(&tmp.path().join("learner.log")).contains("retrying with back-off") {
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", read(&tmp.path().join("learner.log")));
        std::thread::sleep(Duration::from_millis(50));
    }
    for (child, name) in [(&mut learner, "learner"), (&mut a0, "a0")] {
        // SAFETY: signals a child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = exits_within(child, Duration::from_secs(30), name);
        let err = read(&tmp.path().join(format!("{name}.log")));
        assert_eq!(status.code(), Some(143), "{name}: {err}");
        assert!(err.contains("stopped by SIGTERM"), "{name}: {err}");
    }
    let err = read(&tmp.path().join("learner.log"));
    assert!(err.contains(&format!("Continue with: r2vpo llm learn --resume {}", run.display())), "{err}");
    assert!(!err.contains("the run has ended"), "{err}");
    redis.freeze(false);
}

/// An actor blocked in a call to a hung Redis (each may wait
/// `queue.timeout_s`, here 60 s) stops within about a second of SIGINT, as
/// the docs say signals stop every process at once; and the learner, left
/// waiting on the batch whose lease that actor held, says whose lease it is
/// and until when instead of waiting in silence.
#[test]
fn an_actor_blocked_on_a_hung_redis_stops_at_once_and_the_learner_names_the_lease_it_waits_on() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let redis = Redis::start_anywhere(tmp.path());
    let run = tmp.path().join("hung-actor");
    let sets = ["--set", "queue.timeout_s=60", "--set", "queue.lease_s=45"];
    let (mut learner, mut a0, _reaper) = learner_and_actor(tmp.path(), &cfg, &run, &redis.url(), &sets);
    wait_for_checkpoint(&mut learner, &run, 2);
    redis.freeze(true);
    // The actor is now inside a Redis call that waits up to 60 s.
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: signals a child this test started.
    unsafe { libc::kill(a0.id() as i32, libc::SIGINT) };
    let status = exits_within(&mut a0, Duration::from_secs(3), "the actor blocked on a hung Redis, after SIGINT");
    let err = read(&tmp.path().join("a0.log"));
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("stopped by SIGINT") && err.contains("Restart with: r2vpo llm actor"), "{err}");
    redis.freeze(false);
    let t0 = Instant::now();
    // A lease's holder is the actor's name, pid and a nonce.
    while !read(&tmp.path().join("learner.log")).contains("leased by a0-") {
        assert!(t0.elapsed() < Duration::from_secs(90), "{}", read(&tmp.path().join("learner.log")));
        assert!(learner.try_wait().unwrap().is_none(), "{}", read(&tmp.path().join("learner.log")));
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = read(&tmp.path().join("learner.log"));
    assert!(log.contains(" UTC (") && log.contains("has stopped, another actor takes the batch then"), "{log}");
    // SAFETY: signals a child this test started.
    unsafe { libc::kill(learner.id() as i32, libc::SIGTERM) };
    assert_eq!(exits_within(&mut learner, Duration::from_secs(30), "the learner").code(), Some(143));
}

/// An actor waiting for weights that never come (no learner yet, or one
/// far behind) stops on the first SIGINT and says it was stopped, not that
/// the run has ended.
#[test]
fn an_actor_waiting_for_weights_stops_on_the_first_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let redis = Redis::start_anywhere(tmp.path());
    let resolved = tmp.path().join("actor.toml");
    let text =
        read(&cfg) + &format!("[queue]\nbackend = \"redis\"\nurl = \"{}\"\nkey = \"r2vpo:no-learner\"\n", redis.url());
    std::fs::write(&resolved, text).unwrap();
    // A learner has taken the stream (and then never publishes weights).
    RedisQueue::open(&redis.url(), "r2vpo:no-learner").unwrap().take_for("/runs/gone", false).unwrap();
    let log = tmp.path().join("actor.log");
    let mut a = actor(&resolved, "lonely", std::fs::File::create(&log).unwrap());
    let _reaper = Reaper(vec![a.id()]);
    // It has leased batch 0 and waits for weights.
    let t0 = Instant::now();
    while !read(&log).contains("producing for stream") {
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", read(&log));
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: signals the child this test started, once.
    unsafe { libc::kill(a.id() as i32, libc::SIGINT) };
    let status = exits_within(&mut a, Duration::from_secs(15), "the actor after one SIGINT");
    let err = read(&log);
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("stopped by SIGINT") && !err.contains("the run has ended"), "{err}");
}

/// One process per run folder: while a run is going, `--overwrite` and a
/// second `--resume` of its folder are refused naming the running process,
/// and the running one finishes with its metrics in order.
#[test]
fn a_second_process_on_a_live_run_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let redis = Redis::start_anywhere(tmp.path());
    let run = tmp.path().join("busy");
    let log = tmp.path().join("first.log");
    let mut first = train(&cfg, &run, &["--async"])
        .args(on_redis(&redis.url()))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _reaper = Reaper(vec![first.id()]);
    wait_for_checkpoint(&mut first, &run, 1);
    let key = queue_key(&run);
    for extra in [&["--overwrite"][..], &[]] {
        let out = train(&cfg, &run, &["--async"]).args(on_redis(&redis.url())).args(extra).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} went ahead on a live run's folder");
        if extra.is_empty() {
            assert!(err.contains("already holds files") || err.contains("is in use by"), "{err}");
        } else {
            assert!(err.contains(&format!("is in use by pid {}", first.id())), "{err}");
        }
    }
    let out = resume(&run).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&format!("is in use by pid {}", first.id())), "{err}");
    assert!(exits_within(&mut first, Duration::from_secs(300), "the first run").success(), "{}", read(&log));
    let iters: Vec<u64> = lines(&run, "metrics.jsonl").iter().map(|v| v["iter"].as_u64().unwrap()).collect();
    assert_eq!(iters, (0..ITERATIONS as u64).collect::<Vec<_>>());
    assert_eq!(queue_key(&run), key);
    // Once it has ended, the folder is free again.
    ok(&mut resume(&run));
}

#[test]
fn learn_with_actor_processes_survives_a_killed_actor_and_equals_the_synchronous_run() {
    let (tmp, cfg, want) = setup();

    let redis = Redis::start_anywhere(tmp.path());
    let url = redis.url();
    let run = tmp.path().join("multi");
    let log = |name: &str| std::fs::File::create(tmp.path().join(name)).unwrap();
    let mut learner = learn(&cfg, &run, &url)
        // A killed actor's batch goes to the other actor after 2 s.
        .args(["--set", "queue.lease_s=2"])
        .stdout(Stdio::null())
        .stderr(log("learner.log"))
        .spawn()
        .unwrap();
    let mut reaper = Reaper(vec![learner.id()]);
    let resolved = run.join("config.toml");
    wait_for_file(&resolved);
    let actor = |name: &str| actor(&resolved, name, log(&format!("{name}.log")));
    let mut a0 = actor("a0");
    let mut a1 = actor("a1");
    reaper.0.extend([a0.id(), a1.id()]);
    wait_for_checkpoint(&mut learner, &run, 3);
    a1.kill().unwrap(); // SIGKILL, possibly holding a batch
    a1.wait().unwrap();
    wait_for_checkpoint(&mut learner, &run, 5);
    let mut a1 = actor("a1-restarted");
    reaper.0.push(a1.id());
    assert!(learner.wait().unwrap().success(), "{}", std::fs::read_to_string(tmp.path().join("learner.log")).unwrap());
    for (a, name) in [(&mut a0, "a0"), (&mut a1, "a1-restarted")] {
        let t0 = Instant::now();
        while a.try_wait().unwrap().is_none() {
            assert!(t0.elapsed() < Duration::from_secs(30), "{name} did not stop when the run ended");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            a.wait().unwrap().success(),
            "{}",
            std::fs::read_to_string(tmp.path().join(format!("{name}.log"))).unwrap()
        );
    }
    assert_eq!(metrics(&run), want, "learn + actor processes differ from llm train");
    // Every batch was consumed once, none skipped.
    let batches: Vec<u64> = lines(&run, "metrics.jsonl")
        .iter()
        .flat_map(|v| v["queue"]["batches"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect::<Vec<_>>())
        .collect();
    assert_eq!(batches, (0..ITERATIONS as u64).collect::<Vec<_>>());
}

/// With `[model.lora]` the learner hands its actors adapters, not the
/// model: actor threads (the in-process board) and an `llm actor` process
/// (the shared folder announced in Redis, whose announcement carries the
/// adapters' configuration) apply them to their own base. With
/// `max_staleness = 0` both runs write exactly the synchronous LoRA run's
/// metrics, so every actor sampled from exactly the learner's policy.
#[test]
fn lora_actors_receive_adapters_and_match_the_synchronous_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{text}[model.lora]\nrank = 4\nalpha = 8\n")).unwrap();
    // The entropy bonus moves the adapters whatever the reward.
    let sets = ["--set", "entropy_coef=0.05", "--set", "optim.lr=0.02"];
    let sync = tmp.path().join("sync");
    ok(&mut train(&cfg, &sync, &sets));
    let want = metrics(&sync);
    assert_eq!(want.len(), ITERATIONS);
    assert!(want.iter().all(|m| m["grad_norm"].as_f64().unwrap() > 0.0), "{want:?}");

    let mem = tmp.path().join("memory");
    ok(train(&cfg, &mem, &sets).arg("--async"));
    assert_eq!(metrics(&mem), want, "LoRA async (actor threads) differs from llm train");

    let redis = Redis::start_anywhere(tmp.path());
    let run = tmp.path().join("processes");
    let (mut learner, mut a0, _reaper) = learner_and_actor(tmp.path(), &cfg, &run, &redis.url(), &sets);
    let status = exits_within(&mut learner, Duration::from_secs(300), "the learner");
    assert!(status.success(), "{}", read(&tmp.path().join("learner.log")));
    exits_within(&mut a0, Duration::from_secs(60), "the actor");
    assert_eq!(metrics(&run), want, "LoRA llm learn + llm actor differs from llm train");
    // The weight folder holds adapters: kilobytes, not the model.
    let weights = run.join("actor-weights");
    let newest = std::fs::read_dir(&weights).unwrap().flatten().map(|e| e.path()).max().unwrap();
    let st = safetensors_names(&newest.join("weights.safetensors"));
    assert!(!st.is_empty() && st.iter().all(|n| n.contains(".lora_")), "{st:?}");
}

/// The tensor names in a safetensors file's header.
fn safetensors_names(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect()
}
