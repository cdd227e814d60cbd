//! `r2vpo bench serve`: decode throughput of a real `r2vpo serve` process
//! under concurrent clients, against the in-process sampler decoding the
//! same total batch in this process, measured alternately in one run.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// `r2vpo bench serve` arguments.
#[derive(clap::Args, Debug)]
pub struct ServeBenchArgs {
    /// Model: a GGUF file or a Hugging Face folder.
    #[arg(long, default_value = r2vpo_llm::train::config::EMBEDDED_MODEL)]
    pub model: PathBuf,
    /// Concurrent clients, each sending one request of `n` samples.
    #[arg(long, default_value = "1,8,32", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Samples per request.
    #[arg(long, default_value_t = 8)]
    pub n: usize,
    /// New tokens per sample (EOS ignored, so every sample runs to the end).
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// The server's --max-batch (rows decoded together); the in-process
    /// sampler decodes the whole batch at once.
    #[arg(long, default_value_t = 256)]
    pub max_batch: usize,
    /// Start the server with `--rescore-logprobs` (exact behaviour log-probs
    /// from one scoring pass per request), to measure what it costs.
    #[arg(long)]
    pub rescore_logprobs: bool,
    /// Where the JSON results go.
    #[arg(long, default_value = "runs/bench/serve.json")]
    pub out: PathBuf,
    /// Compare against this already running OpenAI-compatible server
    /// (vLLM from `scripts/vllm/serve.py`, say) instead of the in-process
    /// sampler: the two servers take turns at every point, with the same
    /// client, prompt and request shape.
    #[arg(long, value_name = "URL")]
    pub peer: Option<String>,
    /// The peer's name in the table.
    #[arg(long, default_value = "vllm")]
    pub peer_name: String,
    /// The model name requests to the peer ask for (vLLM: its
    /// --served-model-name).
    #[arg(long, default_value = "default")]
    pub peer_model: String,
    /// With --peer: samples per request, one or more (`--n` is then unused).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub ns: Vec<usize>,
    /// The backend the server and the in-process sampler decode on
    /// (`r2vpo serve --backend --device --dtype`).
    #[command(flatten)]
    pub engine: crate::backend_args::BackendArgs,
    /// With --peer: turns per point (each server measured this many
    /// times, alternately); the table gives the medians.
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
}

#[derive(Serialize)]
struct PeerRow {
    clients: usize,
    n: usize,
    sequences: usize,
    r2vpo_tokens_per_s: f64,
    peer_tokens_per_s: f64,
    r2vpo_over_peer: f64,
}

/// Sends `clients` concurrent completion requests of `n` samples to `url`
/// and returns the generated tokens per second of wall time.
fn load(
    http: &reqwest::blocking::Client,
    url: &str,
    model: &str,
    ids: &[u32],
    clients: usize,
    n: usize,
    new_tokens: usize,
) -> Result<f64> {
    let t0 = Instant::now();
    let tokens: Vec<Result<usize>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|i| {
                s.spawn(move || -> Result<usize> {
                    let body = serde_json::json!({
                        "model": model, "prompt": ids, "n": n, "max_tokens": new_tokens, "temperature": 1.0,
                        "seed": i, "ignore_eos": true, "logprobs": 0,
                    });
                    let v: serde_json::Value =
                        http.post(format!("{url}/v1/completions")).json(&body).send()?.error_for_status()?.json()?;
                    Ok(v["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("client thread")).collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let total: usize = tokens.into_iter().collect::<Result<Vec<_>>>()?.iter().sum();
    if total < clients * n * new_tokens {
        bail!("{url} generated {total} tokens of {} asked for", clients * n * new_tokens);
    }
    Ok(total as f64 / secs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

#[derive(Serialize)]
struct Row {
    clients: usize,
    sequences: usize,
    in_process_tokens_per_s: f64,
    server_tokens_per_s: f64,
    server_over_in_process: f64,
}

/// `r2vpo bench serve`.
pub fn serve(a: &ServeBenchArgs) -> Result<()> {
    use r2vpo_llm::{chat::ChatTemplate, sample, tokenizer::Tokenizer};
    let model = a.engine.open(&a.model)?;
    let tok = Tokenizer::load(&a.model)?;
    let prompt = ChatTemplate::from_tokenizer(&tok)?.prompt("What is 12 + 7? Think step by step.", None)?;
    let ids = tok.encode(&prompt, false)?;
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "1".into());
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--threads", &threads, "serve", "--port", "0", "--max-batch", &a.max_batch.to_string(), "--model"])
        .arg(&a.model)
        .args(["--backend", &a.engine.backend, "--device", &a.engine.device, "--dtype", &a.engine.dtype])
        .args(a.rescore_logprobs.then_some("--rescore-logprobs"))
        .stdout(Stdio::piped())
        .spawn()
        .context("starting r2vpo serve")?;
    let out = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(out).lines();
    let url = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(u) = r2vpo_serve::server::parse_listening_line(&l) {
                    break u;
                }
            }
            _ => {
                let _ = child.kill();
                bail!("r2vpo serve exited before listening");
            }
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(3600)).build()?;
    if let Some(peer) = &a.peer {
        let result = against_peer(a, &http, &url, peer, &ids, &threads);
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
        return result;
    }
    let mut rows = Vec::new();
    let result = (|| -> Result<()> {
        for &c in &a.clients {
            let seqs = c * a.n;
            // In-process: the same total batch in one `generate_ids` call.
            let cfg = sample::SamplingConfig::default();
            let r = sample::bench_generate(&model, &ids, &[seqs], a.new_tokens, &cfg)?;
            let local = r[0].tokens_per_s;
            // Server: `c` clients at once.
            let served = load(&http, &url, "r2vpo", &ids, c, a.n, a.new_tokens)?;
            rows.push(Row {
                clients: c,
                sequences: seqs,
                in_process_tokens_per_s: local,
                server_tokens_per_s: served,
                server_over_in_process: served / local,
            });
        }
        Ok(())
    })();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    result?;
    println!(
        "r2vpo serve{} vs the in-process sampler, both on {}, {} ({} threads), {}-token prompt, n = {}, {} new \
         tokens, T = 1",
        if a.rescore_logprobs { " --rescore-logprobs" } else { "" },
        a.engine.describe(),
        a.model.display(),
        threads,
        ids.len(),
        a.n,
        a.new_tokens
    );
    println!("| clients | sequences | in-process tok/s | server tok/s | server / in-process |\n|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.2} |",
            r.clients, r.sequences, r.in_process_tokens_per_s, r.server_tokens_per_s, r.server_over_in_process
        );
    }
    r2vpo_report::atomic_write_json(&a.out, &rows)?;
    println!("wrote {}", a.out.display());
    Ok(())
}

/// `r2vpo bench serve --peer URL`: `r2vpo serve` at `ours` and the peer
/// take turns at every (clients, n) point.
fn against_peer(
    a: &ServeBenchArgs,
    http: &reqwest::blocking::Client,
    ours: &str,
    peer: &str,
    ids: &[u32],
    threads: &str,
) -> Result<()> {
    let peer = peer.trim_end_matches('/');
    // One warm-up request each: first-request costs (vLLM's lazy kernel
    // set-up, page faults) are not what is compared.
    load(http, ours, "r2vpo", ids, 1, 1, 8)?;
    load(http, peer, &a.peer_model, ids, 1, 1, 8).with_context(|| format!("the peer at {peer}"))?;
    let mut rows = Vec::new();
    for &n in &a.ns {
        for &c in &a.clients {
            let (mut r, mut p) = (Vec::new(), Vec::new());
            for _ in 0..a.repeats.max(1) {
                r.push(load(http, ours, "r2vpo", ids, c, n, a.new_tokens)?);
                p.push(load(http, peer, &a.peer_model, ids, c, n, a.new_tokens)?);
            }
            let (r, p) = (median(r), median(p));
            eprintln!("clients {c} n {n}: r2vpo serve {r:.1} tok/s, {} {p:.1} tok/s", a.peer_name);
            rows.push(PeerRow {
                clients: c,
                n,
                sequences: c * n,
                r2vpo_tokens_per_s: r,
                peer_tokens_per_s: p,
                r2vpo_over_peer: r / p,
            });
        }
    }
    println!(
        "r2vpo serve ({}) vs {} at {peer}, {} ({threads} threads), {}-token prompt, {} new tokens, T = 1, \
         EOS ignored, median of {} turns",
        a.engine.describe(),
        a.peer_name,
        a.model.display(),
        ids.len(),
        a.new_tokens,
        a.repeats.max(1)
    );
    println!(
        "| clients | n | sequences | r2vpo serve tok/s | {} tok/s | r2vpo / {} |\n|---|---|---|---|---|---|",
        a.peer_name, a.peer_name
    );
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} |",
            r.clients, r.n, r.sequences, r.r2vpo_tokens_per_s, r.peer_tokens_per_s, r.r2vpo_over_peer
        );
    }
    r2vpo_report::atomic_write_json(&a.out, &rows)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
