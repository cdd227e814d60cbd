//! `r2vpo bench core`: cost of each policy objective (forward + backward)
//! on a batch of LLM-like shape, so the claim that R²VPO's penalty costs
//! nothing over GRPO's clip is a measured number.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};
use r2vpo::algo::PRESETS;
use r2vpo::stats::{mean_std, median};
use serde::Serialize;

use r2vpo::aggregate::GlobalBatch;
use r2vpo::objective::{ObjectiveConfig, PolicyBatch};

/// `r2vpo bench core` arguments.
#[derive(clap::Args, Debug)]
pub struct CoreArgs {
    /// Sequences per batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 1024)]
    pub tokens: usize,
    /// Timed repetitions per objective (after one warm-up round).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Where the JSON results go.
    #[arg(long, default_value = "runs/bench/core.json")]
    pub out: PathBuf,
}

#[derive(Serialize)]
struct Row {
    preset: String,
    batch: usize,
    tokens: usize,
    /// Median over repetitions.
    ms_per_step: f64,
    ms_std: f64,
    relative_to_grpo: f64,
}

/// Runs the benchmark and prints a Markdown table.
pub fn core(a: &CoreArgs) -> Result<()> {
    let dev = Device::Cpu;
    let shape = (a.batch, a.tokens);
    // Log-probs of an LLM after a few updates: behaviour ≈ current ± 0.1.
    let old = Tensor::randn(-1.0f32, 0.5, shape, &dev)?;
    let cur = Var::from_tensor(&(&old + Tensor::randn(0.0f32, 0.1, shape, &dev)?)?)?;
    let adv = Tensor::randn(0.0f32, 1.0, (a.batch, 1), &dev)?.broadcast_as(shape)?.contiguous()?;
    let mask = Tensor::ones(shape, DType::F32, &dev)?;
    let global = GlobalBatch::from_mask(&mask)?;
    let presets = PRESETS;
    let cfgs = presets.iter().map(|p| ObjectiveConfig::preset(p)).collect::<Result<Vec<_>, _>>()?;
    let step = |cfg: &ObjectiveConfig| -> Result<f64> {
        let t0 = Instant::now();
        let batch = PolicyBatch { logp: cur.as_tensor(), old_logp: &old, advantages: &adv, mask: &mask, weights: None };
        let out = cfg.loss(&batch, 0.05, &global)?;
        let grads = out.loss.backward()?;
        std::hint::black_box(grads.get(&cur));
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    // One untimed round first (page faults, allocator warm-up), then
    // round-robin so slow drift of the machine hits every objective alike.
    for cfg in &cfgs {
        step(cfg)?;
    }
    let mut times = vec![Vec::with_capacity(a.reps); cfgs.len()];
    for _ in 0..a.reps {
        for (cfg, t) in cfgs.iter().zip(&mut times) {
            t.push(step(cfg)?);
        }
    }
    let mut rows = Vec::new();
    for (name, t) in presets.iter().zip(&mut times) {
        let (_, std) = mean_std(t);
        let ms = median(t);
        rows.push(Row {
            preset: name.to_string(),
            batch: a.batch,
            tokens: a.tokens,
            ms_per_step: ms,
            ms_std: std,
            relative_to_grpo: 0.0,
        });
    }
    let base = rows.iter().find(|r| r.preset == "grpo").map_or(rows[0].ms_per_step, |r| r.ms_per_step);
    for r in &mut rows {
        r.relative_to_grpo = r.ms_per_step / base;
    }
    println!(
        "objective forward+backward, {}×{} tokens, f32, {} threads, {} reps",
        a.batch,
        a.tokens,
        std::env::var("RAYON_NUM_THREADS").unwrap_or_default(),
        a.reps
    );
    println!("| objective | median ms / step | ± std | × GRPO |\n|---|---|---|---|");
    for r in &rows {
        println!("| {} | {:.2} | {:.2} | {:.2} |", r.preset, r.ms_per_step, r.ms_std, r.relative_to_grpo);
    }
    r2vpo_report::atomic_write_json(&a.out, &rows)?;
    println!("written: {}", a.out.display());
    Ok(())
}

/// `r2vpo bench llm` arguments.
#[derive(clap::Args, Debug)]
pub struct LlmArgs {
    /// Model: a GGUF file or a Hugging Face folder.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// Batch sizes to decode.
    #[arg(long, default_value = "1,8,32", value_delimiter = ',')]
    pub batches: Vec<usize>,
    /// New tokens per row (stop tokens are ignored so every row runs to the end).
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Where the JSON results go.
    #[arg(long, default_value = "runs/bench/llm.json")]
    pub out: PathBuf,
    /// The backend that decodes.
    #[command(flatten)]
    pub engine: crate::backend_args::BackendArgs,
    /// Sequences in the training-step comparison (0 skips it).
    #[arg(long, default_value_t = 4)]
    pub train_batch: usize,
    /// Response tokens per sequence in the training-step comparison.
    #[arg(long, default_value_t = 64)]
    pub train_tokens: usize,
    /// Timed repetitions per objective (interleaved; the median is reported).
    #[arg(long, default_value_t = 3)]
    pub train_reps: usize,
}

/// One objective's cost inside an LLM policy-gradient step.
#[derive(Serialize)]
struct StepRow {
    objective: &'static str,
    /// Median seconds of forward + objective + backward through the model.
    step_s: f64,
    /// Median milliseconds of the objective alone (loss + its backward on
    /// the same log-probs, model excluded).
    objective_ms: f64,
}

/// Per-step cost of GRPO's clipped objective and R²VPO's penalty on the same
/// batch through `model`: the paper's claim that the penalty's overhead is
/// negligible, measured.
fn train_step_overhead(
    model: &r2vpo_llm::backend::candle::Transformer,
    prompt: &[u32],
    a: &LlmArgs,
) -> Result<Vec<StepRow>> {
    let (b, r) = (a.train_batch, a.train_tokens);
    // Rows: the prompt, then `r` response ids cycling through the prompt's
    // own ids (real tokens; their values do not change the cost).
    let row: Vec<u32> = prompt.iter().copied().chain((0..r).map(|i| prompt[i % prompt.len()])).collect();
    let w = row.len();
    let dev = model.device();
    let ids = Tensor::from_vec(row.repeat(b), (b, w), dev)?;
    let att = Tensor::ones((b, w), DType::U32, dev)?;
    let mask = Tensor::ones((b, r), DType::F32, dev)?;
    // Behaviour log-probs a little off the current ones, so ratios ≠ 1 and
    // both objectives take their non-trivial branches.
    let base = model.score_tail_logprobs(&ids, &att, r)?;
    let wobble: Vec<f32> = (0..b * r).map(|i| 0.15 * ((i as f32) * 0.7).sin()).collect();
    let old = (base + Tensor::from_vec(wobble, (b, r), dev)?)?;
    let adv: Vec<f32> = (0..b * r).map(|i| if (i / r) % 2 == 0 { 1.0 } else { -1.0 }).collect();
    let adv = Tensor::from_vec(adv, (b, r), dev)?;
    let global = GlobalBatch::from_mask(&mask)?;
    let objectives = [
        ("GRPO (clip 0.2, dual-clip 3)", ObjectiveConfig::preset("grpo")?),
        ("R²VPO", ObjectiveConfig::preset("r2vpo")?),
    ];
    // The same rows with the shared prompt run once (the trainer's
    // `share_prompt_prefix`): a prefix of all but the prompt's last token,
    // continued by that token and each response.
    let n = prompt.len();
    let pre = Tensor::from_vec(prompt[..n - 1].to_vec(), (1, n - 1), dev)?;
    let pre_att = Tensor::ones((1, n - 1), DType::U32, dev)?;
    let suffix = Tensor::from_vec(row[n - 1..].repeat(b), (b, r + 1), dev)?;
    let suffix_att = Tensor::ones((b, r + 1), DType::U32, dev)?;
    let share = vec![0usize; b];
    let mut step = vec![Vec::new(); 3];
    let mut obj = vec![Vec::new(); 2];
    for _ in 0..a.train_reps.max(1) {
        let t0 = Instant::now();
        let logp = model.prefixed_tail_logprobs(&r2vpo_llm::backend::candle::PrefixedRows {
            prefix_ids: &pre,
            prefix_mask: &pre_att,
            rows: &share,
            suffix_ids: &suffix,
            suffix_mask: &suffix_att,
        })?;
        let out = objectives[1].1.loss(
            &PolicyBatch { logp: &logp, old_logp: &old, advantages: &adv, mask: &mask, weights: None },
            0.05,
            &global,
        )?;
        out.loss.backward()?;
        step[2].push(t0.elapsed().as_secs_f64());
        for (k, (_, cfg)) in objectives.iter().enumerate() {
            let t0 = Instant::now();
            let logp = model.tail_logprobs(&ids, &att, r)?;
            let out = cfg.loss(
                &PolicyBatch { logp: &logp, old_logp: &old, advantages: &adv, mask: &mask, weights: None },
                0.05,
                &global,
            )?;
            out.loss.backward()?;
            step[k].push(t0.elapsed().as_secs_f64());
            // The objective alone, on a leaf holding the same log-probs.
            let leaf = Var::from_tensor(&logp.detach())?;
            let t1 = Instant::now();
            for _ in 0..20 {
                let o = cfg.loss(
                    &PolicyBatch {
                        logp: leaf.as_tensor(),
                        old_logp: &old,
                        advantages: &adv,
                        mask: &mask,
                        weights: None,
                    },
                    0.05,
                    &global,
                )?;
                o.loss.backward()?;
            }
            obj[k].push(t1.elapsed().as_secs_f64() * 1000.0 / 20.0);
        }
    }
    let mut rows: Vec<StepRow> = objectives
        .iter()
        .enumerate()
        .map(|(k, (name, _))| StepRow {
            objective: name,
            step_s: median(&mut step[k]),
            objective_ms: median(&mut obj[k]),
        })
        .collect();
    rows.push(StepRow {
        objective: "R²VPO, prompt run once (share_prompt_prefix)",
        step_s: median(&mut step[2]),
        objective_ms: rows[1].objective_ms,
    });
    Ok(rows)
}

/// Generation throughput of the LLM stack: sampled decode with a KV cache at
/// the paper's training temperature, on a chat-formatted prompt.
pub fn llm(a: &LlmArgs) -> Result<()> {
    use r2vpo_llm::{chat::ChatTemplate, sample, tokenizer::Tokenizer};
    let path = if a.model.exists() { a.model.clone() } else { PathBuf::from(".deps").join(&a.model) };
    let model = a.engine.open(&path)?;
    let tok = Tokenizer::load(&path)?;
    let prompt = ChatTemplate::from_tokenizer(&tok)?.prompt("What is 12 + 7? Think step by step.", None)?;
    let ids = tok.encode(&prompt, false)?;
    let rows = sample::bench_generate(&model, &ids, &a.batches, a.new_tokens, &sample::SamplingConfig::default())?;
    println!(
        "decode throughput, {} ({} parameters), {} (candle's prefill products: {}), {} threads, {}-token prompt, \
         {} new tokens, T = 1",
        path.display(),
        r2vpo_llm::plan::parameters(r2vpo_llm::decode::Decoder::config(&model)),
        a.engine.describe(),
        r2vpo_kernels::dispatch::path(),
        std::env::var("RAYON_NUM_THREADS").unwrap_or_default(),
        ids.len(),
        a.new_tokens
    );
    println!("| batch | seconds | new tokens/s |\n|---|---|---|");
    for r in &rows {
        println!("| {} | {:.2} | {:.1} |", r.batch, r.seconds, r.tokens_per_s);
    }
    // The objectives' step overhead is measured on candle's autograd (the
    // learner's objective runs on candle tensors whichever backend computes
    // the model); `bench step --backend torch` times the torch learner.
    let steps = match &model {
        r2vpo_llm::backend::open::Opened::Candle(m) if a.train_batch > 0 && a.train_tokens > 0 => {
            train_step_overhead(m, &ids, a)?
        }
        _ if a.train_batch > 0 && a.train_tokens > 0 => {
            eprintln!(
                "the objectives' step overhead is measured with --backend candle; skipped on {}",
                a.engine.describe()
            );
            vec![]
        }
        _ => vec![],
    };
    if let [grpo, r2, ..] = steps.as_slice() {
        println!(
            "\npolicy-gradient step (forward + objective + backward), {} × ({} prompt + {} response) tokens, median of {}",
            a.train_batch,
            ids.len(),
            a.train_tokens,
            a.train_reps.max(1)
        );
        println!("| objective | step s | objective alone µs | step × GRPO |\n|---|---|---|---|");
        for s in &steps {
            println!(
                "| {} | {:.2} | {:.1} | {:.3} |",
                s.objective,
                s.step_s,
                1000.0 * s.objective_ms,
                s.step_s / grpo.step_s
            );
        }
        println!(
            "R²VPO's objective costs {:+.1} µs per step against GRPO's ({:.4}% of a step)",
            1000.0 * (r2.objective_ms - grpo.objective_ms),
            100.0 * (r2.objective_ms - grpo.objective_ms) / (1000.0 * grpo.step_s)
        );
    }
    #[derive(Serialize)]
    struct Out<'a> {
        decode: &'a [sample::BenchRow],
        train_step: &'a [StepRow],
    }
    r2vpo_report::atomic_write_json(&a.out, &Out { decode: &rows, train_step: &steps })?;
    println!("written: {}", a.out.display());
    Ok(())
}
