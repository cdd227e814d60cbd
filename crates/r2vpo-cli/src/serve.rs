//! `r2vpo serve`: the rollout server (see `r2vpo_serve::server`).

use std::path::PathBuf;

use anyhow::Result;

use r2vpo_llm::rollout::LogprobsMode;
use r2vpo_serve::ServeConfig;

/// `r2vpo serve` arguments.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A GGUF file or a Hugging Face folder (default: the embedded SmolLM2).
    #[arg(long, default_value = r2vpo_llm::train::config::EMBEDDED_MODEL)]
    pub model: PathBuf,
    /// Tokenizer (and chat template) source; default: `--model`.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Interface to listen on (loopback by default; 0.0.0.0 exposes it).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port; 0 picks a free one (the address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route (default:
    /// $R2VPO_API_KEY if set).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Model name in /v1/models and in answers.
    #[arg(long, default_value = "r2vpo")]
    pub served_model_name: String,
    /// Sequences decoded together (a request's `n` may not exceed it).
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// Prompts waiting for a free row before requests get 429.
    #[arg(long, default_value_t = 1024)]
    pub max_waiting: usize,
    /// Prompt tokens prefilled per decode step: a longer prompt is prefilled
    /// in chunks with decode steps of the running requests in between.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Prompts in one request.
    #[arg(long, default_value_t = 256)]
    pub max_prompts: usize,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// What `token_logprobs` mean: raw_logprobs (log softmax of the
    /// untruncated T = 1 logits, vLLM's default) or processed_logprobs (the
    /// distribution sampled from, after temperature and top-k/top-p).
    #[arg(long, default_value = "raw_logprobs", value_parser = ["raw_logprobs", "processed_logprobs"])]
    pub logprobs_mode: String,
    /// Raw log-probs from one full-sequence scoring pass per request (what
    /// the learner computes) instead of those recorded while decoding:
    /// closer to the learner's recomputation at the cost of one
    /// prefill-sized pass.
    #[arg(long)]
    pub rescore_logprobs: bool,
    /// Version reported for the initial weights.
    #[arg(long, default_value = "0")]
    pub weight_version: String,
    /// The backend that decodes (`--backend`, `--device`, `--dtype`).
    #[command(flatten)]
    pub engine: r2vpo_bench::backend_args::BackendArgs,
}

/// `r2vpo serve`.
pub fn serve(a: &ServeArgs) -> Result<()> {
    let cfg = ServeConfig {
        model: a.model.clone(),
        tokenizer: a.tokenizer.clone(),
        host: a.host.clone(),
        port: a.port,
        // From the environment by preference: a key on the command line is
        // visible to every user in `ps`.
        api_key: a.api_key.clone().or_else(|| std::env::var("R2VPO_API_KEY").ok()).filter(|k| !k.is_empty()),
        served_model_name: a.served_model_name.clone(),
        max_batch: a.max_batch,
        max_waiting: a.max_waiting,
        prefill_chunk: a.prefill_chunk,
        max_prompts: a.max_prompts,
        max_body_bytes: a.max_body_bytes,
        logprobs_mode: if a.logprobs_mode == "processed_logprobs" {
            LogprobsMode::Processed
        } else {
            LogprobsMode::Raw
        },
        weight_version: a.weight_version.clone(),
        rescore_logprobs: a.rescore_logprobs,
        backend: a.engine.backend.clone(),
        device: a.engine.device.clone(),
        dtype: a.engine.dtype.clone(),
    };
    r2vpo_serve::serve(cfg)?;
    Ok(())
}
