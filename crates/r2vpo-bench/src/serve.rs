//! `r2vpo bench serve`: decode throughput of a real `r2vpo serve` process
//! under concurrent clients, against the in-process sampler decoding the
//! same total batch in this process, measured alternately in one run.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
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
    use r2vpo_llm::{backend::candle::load_model, chat::ChatTemplate, sample, tokenizer::Tokenizer};
    let model = load_model(&a.model, DType::F32, &Device::Cpu)?;
    let tok = Tokenizer::load(&a.model)?;
    let prompt = ChatTemplate::from_tokenizer(&tok)?.prompt("What is 12 + 7? Think step by step.", None)?;
    let ids = tok.encode(&prompt, false)?;
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "1".into());
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--threads", &threads, "serve", "--port", "0", "--max-batch", &a.max_batch.to_string(), "--model"])
        .arg(&a.model)
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
    let mut rows = Vec::new();
    let result = (|| -> Result<()> {
        for &c in &a.clients {
            let seqs = c * a.n;
            // In-process: the same total batch in one `generate_ids` call.
            let cfg = sample::SamplingConfig::default();
            let r = sample::bench_generate(&model, &ids, &[seqs], a.new_tokens, &cfg)?;
            let local = r[0].tokens_per_s;
            // Server: `c` clients at once.
            let t0 = Instant::now();
            let tokens: Vec<Result<usize>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..c)
                    .map(|i| {
                        let (http, url, ids) = (&http, &url, &ids);
                        s.spawn(move || -> Result<usize> {
                            let body = serde_json::json!({
                                "prompt": ids, "n": a.n, "max_tokens": a.new_tokens, "temperature": 1.0,
                                "seed": i, "ignore_eos": true, "logprobs": 0,
                            });
                            let v: serde_json::Value = http
                                .post(format!("{url}/v1/completions"))
                                .json(&body)
                                .send()?
                                .error_for_status()?
                                .json()?;
                            Ok(v["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("client thread")).collect()
            });
            let secs = t0.elapsed().as_secs_f64();
            let total: usize = tokens.into_iter().collect::<Result<Vec<_>>>()?.iter().sum();
            let served = total as f64 / secs;
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
        "r2vpo serve{} vs the in-process sampler, {} ({} threads), {}-token prompt, n = {}, {} new tokens, T = 1",
        if a.rescore_logprobs { " --rescore-logprobs" } else { "" },
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
