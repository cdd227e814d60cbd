//! `r2vpo llm plan`: per-rank memory of a training step before renting
//! GPUs ([`r2vpo_llm::plan`]).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use r2vpo_llm::model::ModelConfig;
use r2vpo_llm::plan::{plan, PlanInput};
use r2vpo_llm::train::{BackendKind, ComputeDtype};

/// `r2vpo llm plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A training config (`llm train --config`): micro-batch size, response
    /// length, checkpointing and compute dtype come from it unless a flag
    /// below says otherwise, and the shape from its model (`model.random.shape`,
    /// or `config.json` in the `model.path` folder) unless `--shape` is given.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A Hugging Face `config.json` (e.g. `configs/shapes/qwen3-8b.json`).
    #[arg(long)]
    pub shape: Option<PathBuf>,
    /// Override a config key (with `--config`), as `llm train --set`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Data-parallel ranks.
    #[arg(long, default_value_t = 1)]
    pub world_size: usize,
    /// ZeRO stage: 0 (replicated), 1 (optimizer state sharded), 2 (and
    /// gradients), 3 (and weights).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: u8,
    /// Sequences per micro-batch (default: the config's `micro_batch_size`, else 1).
    #[arg(long)]
    pub micro_batch: Option<usize>,
    /// A token budget per micro-batch instead of `--micro-batch` rows
    /// (default: the config's `max_tokens_per_micro_batch`; 0: rows).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Micro-batches packed end to end, no padding (default: the config's
    /// `pack_sequences`): with a token budget a micro-batch holds the
    /// budget's tokens whatever the lengths, not whole rows of the longest.
    #[arg(long)]
    pub packed: Option<bool>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 1024)]
    pub prompt: usize,
    /// Response tokens per sequence (default: the config's
    /// `sampling.max_new_tokens`, else 4096).
    #[arg(long)]
    pub response: Option<usize>,
    /// Gradient checkpointing per layer (default: the config's
    /// `activation_checkpointing`).
    #[arg(long)]
    pub checkpoint: Option<bool>,
    /// Rows per LM-head chunk; 0: all response rows at once. Default: what
    /// the backends do, 16 Mi logits per chunk (16 Mi / vocabulary rows) on
    /// the torch backend and in the candle backend's checkpointed step, all
    /// rows in candle's full graph.
    #[arg(long)]
    pub lm_head_chunk: Option<usize>,
    /// LoRA rank (0: full fine-tuning), on the projections the config's
    /// `[model.lora]` targets, else on all seven. Default: the config's
    /// `[model.lora]`, else full fine-tuning.
    #[arg(long)]
    pub lora_rank: Option<usize>,
    /// Compute dtype, `bf16` or `f32` (default: the config's
    /// `model.compute_dtype`, else bf16).
    #[arg(long)]
    pub dtype: Option<String>,
    /// The compute backend, `torch` (fused attention) or `candle`
    /// (attention probabilities kept); default: the config's
    /// `model.backend`, else torch.
    #[arg(long)]
    pub backend: Option<String>,
    /// Device memory in GiB to check the total against.
    #[arg(long, default_value_t = 80.0)]
    pub device_gib: f64,
    /// Also write the plan as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs `llm plan`.
pub fn run(a: &PlanArgs) -> Result<()> {
    let cfg = match &a.config {
        Some(path) => Some(crate::llm_train::load_config_values(Some(path), None, None, &a.sets)?),
        None if !a.sets.is_empty() => bail!("--set needs --config"),
        None => None,
    };
    let shape = match (&a.shape, &cfg) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => match c.model.random.as_ref().and_then(|r| r.shape.clone()) {
            Some(s) => PathBuf::from(s),
            None => PathBuf::from(&c.model.path).join("config.json"),
        },
        (None, None) => bail!("give --shape (a config.json) or --config (a training config)"),
    };
    if !shape.is_file() {
        bail!("{}: no such model config; give --shape configs/shapes/<model>.json", shape.display());
    }
    let model = ModelConfig::from_file(&shape).with_context(|| format!("reading {}", shape.display()))?;
    let micro = a.micro_batch.or(cfg.as_ref().map(|c| c.micro_batch_size)).unwrap_or(1);
    let response = a.response.or(cfg.as_ref().map(|c| c.sampling.max_new_tokens)).unwrap_or(4096);
    let checkpointing = a.checkpoint.or(cfg.as_ref().map(|c| c.activation_checkpointing)).unwrap_or(true);
    let bf16 = match a.dtype.as_deref() {
        Some("bf16") => true,
        Some("f32") => false,
        Some(other) => bail!("--dtype must be bf16 or f32, got {other:?}"),
        None => cfg.as_ref().is_none_or(|c| c.model.compute_dtype == ComputeDtype::Bf16),
    };
    let materialised_attention = match a.backend.as_deref() {
        Some("torch") => false,
        Some("candle") => true,
        Some(other) => bail!("--backend must be torch or candle, got {other:?}"),
        None => cfg.as_ref().is_some_and(|c| c.model.backend == BackendKind::Candle),
    };
    if micro == 0 || a.world_size == 0 {
        bail!("--micro-batch and --world-size must be at least 1");
    }
    let seq_len = a.prompt + response;
    let budget = a.max_tokens.or(cfg.as_ref().map(|c| c.max_tokens_per_micro_batch)).unwrap_or(0);
    let packed = a.packed.or(cfg.as_ref().map(|c| c.pack_sequences)).unwrap_or(false);
    // The largest micro-batch the trainer can form (micro_batch::plan):
    // rows of the longest sequence; under a budget, as many such rows as fit
    // (one at least), or packed, the budget's tokens (one longer sequence
    // alone), every token after one prompt a response token at worst.
    let (tokens, response_tokens, shape_note) = match (budget, packed) {
        (0, _) => (micro * seq_len, micro * response, format!("{micro} × ({} + {response}) tokens", a.prompt)),
        (b, false) => {
            let rows = (b / seq_len).max(1);
            (rows * seq_len, rows * response, format!("≤ {b} tokens: {rows} × ({} + {response})", a.prompt))
        }
        (b, true) => {
            let t = b.max(seq_len);
            (t, t - a.prompt, format!("≤ {b} tokens packed ({t}, sequences of ≤ {} + {response})", a.prompt))
        }
    };
    let configured = cfg.as_ref().and_then(|c| c.model.lora.clone());
    let lora = match a.lora_rank {
        Some(0) => None,
        Some(rank) => Some(r2vpo_llm::model::LoraConfig { rank, ..configured.unwrap_or_default() }),
        None => configured,
    };
    let input = PlanInput {
        world_size: a.world_size,
        zero_stage: a.zero,
        micro_batch_tokens: tokens,
        response_tokens,
        seq_len,
        checkpointing,
        lm_head_chunk: match a.lm_head_chunk {
            Some(0) => None,
            Some(rows) => Some(rows),
            None if checkpointing || !materialised_attention => Some(((16usize << 20) / model.vocab_size).max(1)),
            None => None,
        },
        lora: lora.clone(),
        bf16,
        materialised_attention,
    };
    let p = plan(&model, &input);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "{}: {:.3}B parameters ({:.3}B trainable); {} rank(s), ZeRO-{}, {} per micro-batch, {}, {}{}",
        shape.display(),
        p.parameters as f64 / 1e9,
        p.trainable as f64 / 1e9,
        a.world_size,
        a.zero,
        shape_note,
        if bf16 { "bf16 compute" } else { "f32" },
        match (checkpointing, materialised_attention) {
            (true, false) => "checkpointed layers, fused attention",
            (true, true) => "checkpointed layers, attention probabilities kept",
            (false, false) => "full graph, fused attention",
            (false, true) => "full graph, attention probabilities kept",
        },
        match &lora {
            Some(l) => format!(", LoRA r = {} on {} of 7 projections", l.rank, l.targets.len()),
            None => String::new(),
        },
    );
    println!("| per rank | GiB |\n|---|---|");
    for r in &p.rows {
        println!("| {} | {:.2} |", r.what, gib(r.bytes));
    }
    let total = gib(p.total);
    println!("| **total** | **{total:.2}** |");
    let verdict = if total <= a.device_gib { "fits" } else { "does not fit" };
    println!(
        "{verdict} a {:.0} GiB device ({:.0} % of it, before allocator caches and workspace)",
        a.device_gib,
        100.0 * total / a.device_gib
    );
    let t = &p.transients;
    println!(
        "checkpoint: + {:.2} GiB on each rank's device (one tensor in flight); on rank 0's host: {:.2} GiB (the \
         tensor being written, and with sharded bf16 masters the other ranks' f32 masters for the model file)",
        gib(t.device_in_flight),
        gib(t.rank0_host_checkpoint)
    );
    println!(
        "resume: each rank reads {:.2} GiB of the optimizer file (the moments it steps, mapped) + {:.2} GiB in flight",
        gib(t.resume_read),
        gib(t.device_in_flight)
    );
    if let Some(path) = &a.json {
        let out = serde_json::json!({ "shape": shape, "input": format!("{input:?}"), "plan": p, "device_gib": a.device_gib, "fits": total <= a.device_gib });
        r2vpo_report::atomic_write_json(path, &out)?;
    }
    Ok(())
}
