//! `r2vpo bench async`: what the asynchronous actor–learner buys on this
//! machine — the mean iteration wall time of `llm train` in turn
//! (sample, then learn) against `llm train --async` with one actor thread,
//! same config and seed, measured in one invocation — and what the
//! experience queue costs: entries/s published and read, and bytes per
//! entry, in memory and on a real Redis.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use r2vpo_llm::queue::{EntryLimits, ExperienceQueue, GroupEntry, MemoryQueue, ENTRY_SCHEMA};
use r2vpo_llm::train::{Event, Trainer};
use r2vpo_queue::RedisQueue;

/// `r2vpo bench async` arguments.
#[derive(clap::Args, Debug)]
pub struct AsyncBenchArgs {
    /// The training config both modes run (R²VPO-OFF preset applied).
    #[arg(long, default_value = "configs/llm/smollm2-arith.toml")]
    pub config: PathBuf,
    /// Iterations per mode; the first is reported apart (model load, first
    /// rollout) and left out of the mean.
    #[arg(long, default_value_t = 4)]
    pub iterations: usize,
    /// Extra config overrides for both modes (as `--set` everywhere:
    /// the other commands' `--config`; here `--config` has a default).
    #[arg(long = "set", value_name = "KEY=VALUE", allow_hyphen_values = true)]
    pub sets: Vec<String>,
    /// Redis for the queue measurement; by default a `redis-server` from
    /// PATH is started on a free loopback port in a temporary folder.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Entries per queue measurement.
    #[arg(long, default_value_t = 2000)]
    pub entries: usize,
    /// Skip the training part (queue only).
    #[arg(long)]
    pub queue_only: bool,
    /// Where the JSON results go.
    #[arg(long, default_value = "runs/bench/async.json")]
    pub out: PathBuf,
}

#[derive(Serialize)]
struct ModeRow {
    mode: &'static str,
    first_iteration_s: f64,
    mean_iteration_s: f64,
    wall_s: f64,
}

#[derive(Serialize)]
struct QueueRow {
    backend: &'static str,
    bytes_per_entry: usize,
    publish_per_s: f64,
    batch_publish_per_s: f64,
    read_per_s: f64,
}

/// A `redis-server` this benchmark started, stopped on drop (its data
/// folder goes with it).
struct OwnRedis {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> Result<(String, OwnRedis)> {
    let dir = tempfile::tempdir()?;
    for _ in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .context("redis-server not found (`make deps` installs it), or pass --redis-url")?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let ready = lines.by_ref().map_while(Result::ok).any(|l| l.contains("Ready to accept connections"));
        std::thread::spawn(move || lines.for_each(drop));
        if ready {
            return Ok((format!("redis://127.0.0.1:{port}/0"), OwnRedis { child, _dir: dir }));
        }
        let _ = child.wait();
    }
    bail!("could not start redis-server on a free port")
}

/// A group of the embedded default's shape: 8 responses of 96 tokens to a
/// 60-token prompt.
fn typical_entry(batch: u64) -> GroupEntry {
    let g: u32 = 8;
    let n = g as usize;
    GroupEntry {
        schema: ENTRY_SCHEMA,
        iteration: batch,
        problem: batch as usize,
        prompt_ids: (0..60).map(|i| 100 + i).collect(),
        responses: (0..g).map(|j| (0..96).map(|i| 1000 + i + j).collect()).collect(),
        behaviour_logp: (0..g).map(|j| (0..96).map(|i| -0.01 * (i + j) as f32 - 0.123_456).collect()).collect(),
        rewards: (0..g).map(|j| if j % 2 == 0 { 1.0 } else { -1.0 }).collect(),
        correct: (0..g).map(|j| j % 2 == 0).collect(),
        advantages: (0..g).map(|j| if j % 2 == 0 { 0.935_414 } else { -0.935_414 }).collect(),
        truncated: vec![false; n],
        entropy_sum: vec![41.234_567; n],
        entropy_tokens: vec![96; n],
        weight_version: batch,
    }
}

fn measure_queue(backend: &'static str, q: &mut dyn ExperienceQueue, n: usize) -> Result<QueueRow> {
    let entry = typical_entry(0);
    let bytes = entry.encode().len();
    let t = Instant::now();
    for i in 0..n {
        let mut e = entry.clone();
        e.iteration = i as u64 / 4 + 1;
        q.publish(&e)?;
    }
    let publish_per_s = n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut after = None;
    let mut read = 0;
    let limits = EntryLimits::default();
    loop {
        let page = q.read_after(after, 64, &limits)?;
        let Some(last) = page.last() else { break };
        after = Some(last.0);
        read += page.iter().filter(|(_, e)| e.is_ok()).count();
    }
    let read_per_s = read as f64 / t.elapsed().as_secs_f64();
    if read != n {
        bail!("{backend}: read {read} of {n} entries");
    }
    // What actors do: claim a batch, publish its 4 groups in one step.
    let group = vec![entry.clone(); 4];
    let t = Instant::now();
    for _ in 0..n / 4 {
        let b = q.claim_batch("bench", Duration::from_secs(60))?;
        if q.publish_batch(b, "bench", &group)?.is_none() {
            bail!("{backend}: a live lease was lost");
        }
    }
    let batch_publish_per_s = (n / 4 * 4) as f64 / t.elapsed().as_secs_f64();
    Ok(QueueRow { backend, bytes_per_entry: bytes, publish_per_s, batch_publish_per_s, read_per_s })
}

fn train_mode(a: &AsyncBenchArgs, asynchronous: bool) -> Result<ModeRow> {
    let mut sets = vec![
        format!("iterations={}", a.iterations),
        "eval_at_start=false".into(),
        "eval_at_end=false".into(),
        "checkpoint_every=0".into(),
        format!("actors.async={asynchronous}"),
        "actors.count=1".into(),
        "actors.max_staleness=1".into(),
    ];
    sets.extend(a.sets.iter().cloned());
    let cfg = r2vpo_llm::train::config::load(Some(&a.config), Some("r2vpo-off"), None, &sets)?;
    let dir = tempfile::tempdir()?;
    let t0 = Instant::now();
    let mut trainer = Trainer::new(cfg, dir.path())?;
    let stop = AtomicBool::new(false);
    let mut times = Vec::new();
    let mut on_event = |e: Event| {
        if let Event::Iteration(m) = e {
            times.push(m.timing.iteration_s);
            eprintln!(
                "  {} iteration {}: {:.1} s",
                if asynchronous { "async" } else { "sync" },
                m.iter,
                m.timing.iteration_s
            );
        }
    };
    if asynchronous {
        let q = MemoryQueue::new();
        let open = move || Ok(Box::new(q.clone()) as Box<dyn ExperienceQueue>);
        trainer.run_async(&open, None, &stop, &mut on_event)?;
    } else {
        trainer.run(&stop, &mut on_event)?;
    }
    let rest = &times[1..];
    Ok(ModeRow {
        mode: if asynchronous { "async (1 actor thread + learner, max_staleness 1)" } else { "sync (llm train)" },
        first_iteration_s: times[0],
        mean_iteration_s: rest.iter().sum::<f64>() / rest.len() as f64,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// Runs the benchmark and prints Markdown tables.
pub fn bench(a: &AsyncBenchArgs) -> Result<()> {
    if a.iterations < 2 {
        bail!("--iterations: needs at least 2 (the first is reported apart)");
    }
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into());
    let mut modes = Vec::new();
    if !a.queue_only {
        eprintln!("training {} iterations per mode ({})…", a.iterations, a.config.display());
        modes.push(train_mode(a, false)?);
        modes.push(train_mode(a, true)?);
        println!(
            "llm train, R²VPO-OFF, {} iterations per mode, {threads} threads, {}",
            a.iterations,
            a.config.display()
        );
        println!("| mode | first iteration s | mean iteration s (2nd on) | wall s | iteration × sync |\n|---|---|---|---|---|");
        let base = modes[0].mean_iteration_s;
        for m in &modes {
            println!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.2} |",
                m.mode,
                m.first_iteration_s,
                m.mean_iteration_s,
                m.wall_s,
                m.mean_iteration_s / base
            );
        }
        println!();
    }
    let mut rows = vec![measure_queue("memory", &mut MemoryQueue::new(), a.entries)?];
    let _own;
    let url = match &a.redis_url {
        Some(u) => u.clone(),
        None => {
            let (u, r) = start_redis()?;
            _own = r;
            u
        }
    };
    let mut redis = RedisQueue::open(&url, "r2vpo:bench-async")?;
    redis.clear()?;
    rows.push(measure_queue("redis", &mut redis, a.entries)?);
    redis.clear()?;
    println!("experience queue, {} entries of one group (G = 8, 60 + 8 × 96 tokens)", a.entries);
    println!("| backend | bytes/entry | publish entries/s | batch publish entries/s | read entries/s |\n|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} |",
            r.backend, r.bytes_per_entry, r.publish_per_s, r.batch_publish_per_s, r.read_per_s
        );
    }
    if let Some(p) = a.out.parent() {
        std::fs::create_dir_all(p)?;
    }
    r2vpo_report::atomic_write_json(&a.out, &serde_json::json!({ "train": modes, "queue": rows }))?;
    println!("\nresults: {}", a.out.display());
    Ok(())
}
