//! `r2vpo bench packing`: one training step (every micro-batch's forward,
//! R²VPO's loss and backward, then AdamW) over the same samples in each
//! micro-batch layout the candle trainer can take, with response lengths
//! drawn like a reasoning model's (log-normal, clipped) or all equal:
//! padded rows, shared prompts (`share_prompt_prefix`), packed sequences
//! (`pack_sequences`), each by a row count and by a token budget
//! (`max_tokens_per_micro_batch`). Layouts run in turn within each
//! repetition, so a ratio against padded rows is taken between steps
//! measured side by side; the table gives the median of those ratios, the
//! share of computed tokens that are padding, and each layout's peak
//! resident memory during its steps.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use r2vpo::aggregate::GlobalBatch;
use r2vpo::objective::{ObjectiveConfig, PolicyBatch};
use r2vpo::seed::splitmix64;
use r2vpo::stats::median;
use r2vpo_llm::backend::batch::{self, Inputs, MicroBatch};
use r2vpo_llm::backend::open::open_backend;
use r2vpo_llm::backend::{forward_backward, Backend};
use r2vpo_llm::experience::Sample;
use r2vpo_llm::model::{ModelConfig, RandomInit};
use r2vpo_llm::train::config::OptimConfig;
use r2vpo_llm::train::micro_batch::{plan, Item, Layout};

use crate::step::{reset_peak, rss};

/// `r2vpo bench packing` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct PackingBenchArgs {
    /// The model's shape: a Hugging Face `config.json` (weights are random).
    #[arg(long, default_value = "configs/shapes/smollm2-135m.json")]
    pub shape: PathBuf,
    /// The compute backend, its device and dtype, as `bench step` takes
    /// them (`--backend torch --device cuda --dtype bf16` on a GPU machine;
    /// shared prompts over padded rows are candle's alone and are left out
    /// elsewhere).
    #[command(flatten)]
    pub backend: crate::backend_args::BackendArgs,
    /// Gradient checkpointing per decoder layer.
    #[arg(long)]
    pub checkpoint: bool,
    /// Prompts per step.
    #[arg(long, default_value_t = 2)]
    pub prompts: usize,
    /// Samples per prompt.
    #[arg(long, default_value_t = 8)]
    pub group: usize,
    /// Prompt tokens (each prompt's samples share it).
    #[arg(long, default_value_t = 64)]
    pub prompt: usize,
    /// Response lengths: `lognormal` (median `--median`, log-space standard
    /// deviation `--sigma`, clipped to `--min`..`--max`) or `uniform`
    /// (every response `--median` tokens).
    #[arg(long, default_value = "lognormal")]
    pub lengths: String,
    /// Median response tokens.
    #[arg(long, default_value_t = 200)]
    pub median: usize,
    /// Log-space standard deviation of the log-normal lengths.
    #[arg(long, default_value_t = 1.0)]
    pub sigma: f64,
    /// Shortest response.
    #[arg(long, default_value_t = 50)]
    pub min: usize,
    /// Longest response.
    #[arg(long, default_value_t = 1024)]
    pub max: usize,
    /// Rows per micro-batch of the row-count layouts (`micro_batch_size`).
    #[arg(long, default_value_t = 4)]
    pub rows: usize,
    /// Token budget of the budget layouts (`max_tokens_per_micro_batch`).
    #[arg(long, default_value_t = 4096)]
    pub budget: usize,
    /// Which layouts to run, by key: `padded`, `shared`, `packed`,
    /// `padded-budget`, `packed-budget` (comma-separated; default all).
    /// The peak resident set is the process's, which the allocator's kept
    /// pages carry from one layout to the next: compare memory with one
    /// layout a process.
    #[arg(long, value_delimiter = ',')]
    pub layouts: Vec<String>,
    /// Timed repetitions of every layout (after one untimed warm-up step
    /// of each).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Seed of the lengths and tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the JSON result goes.
    #[arg(long, default_value = "runs/bench/packing.json")]
    pub out: PathBuf,
}

/// One layout's figures.
#[derive(Serialize)]
struct Row {
    layout: String,
    micro_batches: usize,
    /// Tokens the layers compute (a shared prompt once, padding included),
    /// and the share of them that is padding.
    computed_tokens: usize,
    padding_frac: f64,
    /// Step seconds per repetition, and their median.
    step_s: Vec<f64>,
    median_s: f64,
    /// Median over repetitions of this layout's step time over the first
    /// layout's (padded rows, unless `--layouts` left them out) in the same
    /// repetition.
    vs_padded: f64,
    /// Largest resident set of this process during this layout's steps,
    /// GiB (host memory: on a GPU the device's is not in it).
    peak_gib: f64,
}

#[derive(Serialize)]
struct Out {
    shape: String,
    backend: String,
    checkpoint: bool,
    threads: usize,
    samples: usize,
    /// Σ (prompt + response) over the samples.
    samples_tokens: usize,
    response_lengths: Vec<usize>,
    rows: Vec<Row>,
}

/// The response lengths, seeded: log-normal (Box–Muller on SplitMix64
/// uniforms) or all `median`.
fn lengths(a: &PackingBenchArgs) -> Result<Vec<usize>> {
    let n = a.prompts * a.group;
    let u = |i: u64| (splitmix64(a.seed ^ splitmix64(i)) >> 11) as f64 / (1u64 << 53) as f64;
    match a.lengths.as_str() {
        "uniform" => Ok(vec![a.median; n]),
        "lognormal" => Ok((0..n as u64)
            .map(|i| {
                let z = (-2.0 * (1.0 - u(2 * i)).ln()).sqrt() * (std::f64::consts::TAU * u(2 * i + 1)).cos();
                ((a.median as f64).ln() + a.sigma * z).exp().round().clamp(a.min as f64, a.max as f64) as usize
            })
            .collect()),
        other => bail!("--lengths `{other}`: expected lognormal or uniform"),
    }
}

fn samples(a: &PackingBenchArgs, vocab: usize, lens: &[usize]) -> Vec<Sample> {
    let tok = |k: u64| (splitmix64(a.seed.wrapping_add(7) ^ splitmix64(k)) % vocab as u64) as u32;
    lens.iter()
        .enumerate()
        .map(|(i, &r)| {
            let p = i / a.group;
            Sample {
                problem: p,
                prompt_ids: (0..a.prompt).map(|k| tok((p * 1_000_003 + k) as u64)).collect(),
                response_ids: (0..r).map(|k| tok((1 << 40) + (i * 1_000_003 + k) as u64)).collect(),
                reward: 0.0,
                correct: false,
                advantage: if i % 2 == 0 { 1.0 } else { -1.0 },
                behaviour_logp: vec![0.0; r],
                ref_logp: None,
                is_weight: None,
                version: 0,
            }
        })
        .collect()
}

/// The layouts `--layouts` picks: (name, layout, token budget or 0 for
/// `--rows` rows), in table order.
fn layouts(a: &PackingBenchArgs) -> Result<Vec<(String, Layout, usize)>> {
    let (r, b) = (a.rows, a.budget);
    let all = [
        ("padded", format!("padded rows, {r} a micro-batch"), Layout::Padded, 0),
        ("shared", format!("shared prompts, {r} rows"), Layout::Prefixed, 0),
        ("packed", format!("packed, {r} samples"), Layout::Packed, 0),
        ("padded-budget", format!("padded rows, ≤ {b} tokens (longest first)"), Layout::Padded, b),
        ("packed-budget", format!("packed, ≤ {b} tokens"), Layout::Packed, b),
    ];
    for k in &a.layouts {
        if !all.iter().any(|(key, ..)| key == k) {
            let keys: Vec<&str> = all.iter().map(|(key, ..)| *key).collect();
            bail!("--layouts `{k}`: expected some of {}", keys.join(", "));
        }
    }
    Ok(all
        .into_iter()
        .filter(|(key, ..)| a.layouts.is_empty() || a.layouts.iter().any(|k| k == key))
        .map(|(_, name, l, b)| (name, l, b))
        .collect())
}

/// Padding positions of a micro-batch (mask zeros; none packed).
fn padding(mb: &MicroBatch) -> Result<usize> {
    let zeros = |m: &Tensor| -> Result<usize> {
        Ok(m.elem_count() - m.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()? as usize)
    };
    Ok(match &mb.inputs {
        Inputs::Padded { attention, .. } => zeros(attention)?,
        Inputs::Prefixed(p) => zeros(&p.prefix_attention)? + zeros(&p.suffix_attention)?,
        Inputs::Packed(_) => 0,
    })
}

/// The micro-batches of `layout` over `samples`, as the trainer forms them,
/// the tokens their layers compute and how many of those are padding.
fn micro_batches(
    samples: &[Sample],
    (layout, budget, rows): (Layout, usize, usize),
    dev: &Device,
) -> Result<(Vec<MicroBatch>, usize, usize)> {
    let items: Vec<Item> = samples
        .iter()
        .map(|s| Item { prompt_key: s.problem, prompt: s.prompt_ids.len(), response: s.response_ids.len() })
        .collect();
    let mut mbs = Vec::new();
    let (mut tokens, mut pad) = (0, 0);
    for idx in plan(&items, layout, rows, budget, 1) {
        let part: Vec<&Sample> = idx.iter().map(|&i| &samples[i]).collect();
        tokens += layout.cost(idx.iter().map(|&i| &items[i]));
        mbs.push(match layout {
            Layout::Padded => batch::pack(&part, 0, dev)?,
            Layout::Prefixed => batch::pack_prefixed(&part, 0, dev)?,
            Layout::Packed => batch::pack_sequences(&part, 0, dev)?,
        });
        pad += padding(mbs.last().expect("pushed"))?;
    }
    Ok((mbs, tokens, pad))
}

/// One step over `mbs`: each micro-batch's forward, R²VPO (λ 0.05, behaviour
/// log-probs the current ones plus 0.1 so ρ ≠ 1) normalised over the whole
/// step, backward; then the clipped AdamW step.
fn step(be: &mut dyn Backend, mbs: &[MicroBatch], optim: &OptimConfig) -> Result<()> {
    let obj = ObjectiveConfig::preset("r2vpo")?;
    let masks: Vec<&Tensor> = mbs.iter().map(|m| &m.mask).collect();
    let global = GlobalBatch::from_masks(&masks)?;
    for mb in mbs {
        forward_backward(be, mb, false, |logp, _| -> Result<_> {
            let old = (logp.detach() + 0.1)?;
            let pb = PolicyBatch { logp, old_logp: &old, advantages: &mb.advantages, mask: &mb.mask, weights: None };
            Ok((obj.loss(&pb, 0.05, &global)?.loss, ()))
        })?;
    }
    let norm = be.grad_norm()?;
    be.step(optim.clip_scale(norm))?;
    be.synchronize()?;
    Ok(())
}

/// `r2vpo bench packing`.
pub fn packing(a: &PackingBenchArgs) -> Result<()> {
    if a.prompts == 0 || a.group == 0 || a.prompt < 2 || a.rows == 0 || a.budget == 0 || a.reps == 0 {
        bail!("--prompts, --group, --rows, --budget and --reps must be at least 1, --prompt at least 2");
    }
    if a.min == 0 || a.min > a.max {
        bail!("--min must be at least 1 and at most --max");
    }
    let cfg = ModelConfig::from_file(&a.shape)?;
    let lens = lengths(a)?;
    let samples = samples(a, cfg.vocab_size, &lens);
    let real: usize = samples.iter().map(|s| s.prompt_ids.len() + s.response_ids.len()).sum();
    let optim = OptimConfig { lr: 1e-6, ..OptimConfig::default() };
    let spec = r2vpo_llm::backend::open::BackendSpec { checkpointing: a.checkpoint, ..a.backend.spec()? };
    spec.kind.check_built()?;
    let mut be = open_backend(&spec, &cfg, &RandomInit::new(cfg.clone(), 1, 0.02), optim)?;
    let dev = be.device().clone();
    let threads = rayon::current_num_threads();
    println!(
        "bench packing: {} on {}{} ({} threads), {} samples ({} prompts × {}), prompt {} tokens, responses {} \
         (sorted: {:?}), {real} tokens of prompt + response over the samples",
        a.shape.display(),
        a.backend.describe(),
        if a.checkpoint { ", checkpointed layers" } else { "" },
        threads,
        samples.len(),
        a.prompts,
        a.group,
        a.prompt,
        a.lengths,
        {
            let mut l = lens.clone();
            l.sort_unstable();
            l
        }
    );
    let mut ls = layouts(a)?;
    if !be.shares_prompt_prefix() {
        ls.retain(|(_, l, _)| *l != Layout::Prefixed);
    }
    if ls.is_empty() {
        bail!("--layouts: none of them runs on {}", a.backend.describe());
    }
    let prepared: Vec<(Vec<MicroBatch>, usize, usize)> =
        ls.iter().map(|(_, l, b)| micro_batches(&samples, (*l, *b, a.rows), &dev)).collect::<Result<_>>()?;
    // Warm-up: the allocator and the kernels' first calls, every shape once.
    for (mbs, ..) in &prepared {
        step(be.as_mut(), mbs, &optim)?;
    }
    let mut times = vec![Vec::new(); ls.len()];
    let mut peaks = vec![0f64; ls.len()];
    for rep in 0..a.reps {
        for (k, (name, _, _)) in ls.iter().enumerate() {
            reset_peak()?;
            let t = Instant::now();
            step(be.as_mut(), &prepared[k].0, &optim)?;
            let s = t.elapsed().as_secs_f64();
            peaks[k] = peaks[k].max(rss()?.1);
            eprintln!("rep {rep}: {name}: {s:.2} s");
            times[k].push(s);
        }
    }
    let rows: Vec<Row> = ls
        .iter()
        .enumerate()
        .map(|(k, (name, _, _))| {
            // Against padded rows where they ran, else the first layout.
            let mut ratios: Vec<f64> = times[k].iter().zip(&times[0]).map(|(t, p)| t / p).collect();
            let (mbs, tokens, pad) = &prepared[k];
            Row {
                layout: name.clone(),
                micro_batches: mbs.len(),
                computed_tokens: *tokens,
                padding_frac: *pad as f64 / *tokens as f64,
                step_s: times[k].clone(),
                median_s: median(&mut times[k].clone()),
                vs_padded: median(&mut ratios),
                peak_gib: peaks[k],
            }
        })
        .collect();
    println!(
        "\n| layout | micro-batches | computed tokens | padding | step (median) | vs padded rows | peak RSS |\n\
         |---|---|---|---|---|---|---|"
    );
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.0} % | {:.2} s | {:.2}× the time ({:.2}× faster) | {:.2} GiB |",
            r.layout,
            r.micro_batches,
            r.computed_tokens,
            100.0 * r.padding_frac,
            r.median_s,
            r.vs_padded,
            1.0 / r.vs_padded,
            r.peak_gib
        );
    }
    let out = Out {
        shape: a.shape.display().to_string(),
        backend: a.backend.describe(),
        checkpoint: a.checkpoint,
        threads,
        samples: samples.len(),
        samples_tokens: real,
        response_lengths: lens,
        rows,
    };
    r2vpo_report::atomic_write_json(&a.out, &out)?;
    println!("\nwrote {}", a.out.display());
    Ok(())
}
