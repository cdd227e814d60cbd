//! `r2vpo bench step`: one R²VPO training step of a model of any Hugging
//! Face shape (random weights from its `config.json`, so no weights travel
//! to a GPU machine) on any device, and the check that a device's log-probs
//! and gradients match the CPU's. `scripts/gpu/check.sh` runs it beside
//! PyTorch's step on the same shape and batch (`scripts/gpu/torch_step.py`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use r2vpo::aggregate::{aggregate, GlobalBatch};
use r2vpo::objective::{ObjectiveConfig, PolicyBatch};
use r2vpo::stats::median;
use r2vpo_llm::backend::batch::{Inputs, MicroBatch};
use r2vpo_llm::backend::candle::CandleBackend;
use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::backend::open::{open_backend, BackendSpec, Opened};
use r2vpo_llm::backend::{forward_backward, Backend, BackendKind, Policy};
use r2vpo_llm::model::expected_params;
use r2vpo_llm::model::{ModelConfig, RandomInit};
use r2vpo_llm::train::config::OptimConfig;

/// `r2vpo bench step` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct StepBenchArgs {
    /// The model's shape: a Hugging Face `config.json` (weights are random).
    #[arg(long)]
    pub shape: PathBuf,
    /// `cpu` or `cuda` (`cuda:N` for device N; needs a `make build-gpu` binary).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The compute backend: `candle` (this project's kernels; candle's
    /// CUDA backend on a GPU) or `torch` (libtorch through tch-rs, the
    /// trainer's `[model] backend = "torch"`; a binary built with `make
    /// build-torch` or `make build-gpu`). The torch step runs exactly the
    /// trainer's path: the backend's forward, the core's objective on the
    /// log-probs, the backend's backward, gradient norm and AdamW step.
    #[arg(long, default_value = "candle")]
    pub backend: String,
    /// Compute dtype: `f32`, or `bf16` (mixed precision: f32 master
    /// weights, gradients and AdamW moments, bf16 forward and backward,
    /// f32 logits).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 44)]
    pub prompt: usize,
    /// Response tokens per sequence (the tokens the objective scores).
    #[arg(long, default_value_t = 256)]
    pub response: usize,
    /// Timed steps (after one untimed warm-up step); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Instead of timing: compare this device's log-probs and gradients
    /// with the CPU's (f32) on the same weights and batch, before and after
    /// one AdamW step on each (lr 1e-4), and fail beyond `--tolerance`.
    #[arg(long)]
    pub check: bool,
    /// Gradient checkpointing: keep only each decoder layer's input in the
    /// forward and recompute one layer at a time in the backward.
    #[arg(long)]
    pub checkpoint: bool,
    /// Run this device's side with the fused CPU kernels off: on `cpu`,
    /// the ops a CUDA device runs (their differentiable composites), so
    /// `--check --composite` checks the GPU path's math without a GPU.
    #[arg(long)]
    pub composite: bool,
    /// Largest relative difference `--check` accepts (max |a − b| / max |b|
    /// per tensor).
    #[arg(long, default_value_t = 1e-4)]
    pub tolerance: f64,
    /// Before timing, one step (instead of the warm-up) with this process's
    /// resident memory read per phase (peak and after; Linux /proc), and the
    /// analytic sizes of weights, moments and logits: where a step's memory
    /// goes.
    #[arg(long)]
    pub memory: bool,
    /// Time the scoring pass instead of a training step: no-grad
    /// log-probs of the response tokens (what the learner computes for old
    /// and reference log-probs), one forward on detached weights.
    #[arg(long)]
    pub score: bool,
    /// Left padding, as the trainer's micro-batches have: row i's first
    /// `min(i · pad, prompt − 1)` positions are masked out of attention.
    #[arg(long, default_value_t = 0)]
    pub pad: usize,
    /// Add the trainer's entropy bonus with this coefficient (a second
    /// forward through `Transformer::tail_entropy`, as `entropy_coef`).
    #[arg(long, default_value_t = 0.0)]
    pub entropy: f64,
    /// The sampler instead of the training step: sample `--response`
    /// tokens at T = 1 from the batch's prompts (left-padded by `--pad`)
    /// with the KV-cache decoder, every row to the full length, and report
    /// generated tokens/s (median of `--reps` after a warm-up). With
    /// `--check`: compare the behaviour log-probs it records with the
    /// learner's recomputation of the same sequences, on this device and on
    /// the CPU; fail beyond `--tolerance` (absolute, in nats).
    #[arg(long)]
    pub sampler: bool,
    /// Take turns with another benchmark through two named pipes, `WAIT,DONE`
    /// (`scripts/hf/turns.py` makes them and hands out the turns): after the
    /// warm-up, one byte to DONE (ready); then before each timed step one
    /// byte read from WAIT, and after it one byte to DONE. Run beside a
    /// peer's benchmark this way, each pair of steps is timed seconds apart
    /// on an otherwise idle machine, so a drift in the machine's speed moves
    /// both sides of their ratio alike.
    #[arg(long, value_name = "WAIT,DONE")]
    pub turns: Option<String>,
    /// Train rank-r LoRA adapters (α = 2r, on all seven projections: the
    /// trainer's `[model.lora]`) on the frozen base instead of every
    /// weight; 0 trains every weight.
    #[arg(long, default_value_t = 0)]
    pub lora_rank: usize,
    /// Weight seed.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Where the JSON result goes.
    #[arg(long, default_value = "runs/bench/step.json")]
    pub out: PathBuf,
}

/// What one timed step measured.
#[derive(Serialize)]
struct StepResult {
    shape: String,
    parameters: usize,
    device: String,
    dtype: String,
    batch: usize,
    prompt: usize,
    response: usize,
    step_s: f64,
    /// Every timed step's seconds, in order (`step_s` is their median).
    times_s: Vec<f64>,
    tokens_per_s: f64,
    loss: f64,
    /// The kernel behind the CPU's many-row f32 products
    /// (`r2vpo_kernels::dispatch::path`), or `libtorch`.
    matmul: String,
    /// `candle` or `torch`.
    backend: String,
    /// The LoRA rank (0: every weight trains).
    lora_rank: usize,
    /// Parameters the optimizer updates.
    trained_parameters: usize,
}

/// What `--check` measured.
#[derive(Serialize)]
struct CheckResult {
    shape: String,
    device: String,
    composite: bool,
    dtype: String,
    pad: usize,
    entropy: f64,
    logprobs_rel: f64,
    grads_rel_max: f64,
    worst_grad: String,
    /// Global gradient norms on this device and on the CPU, per step.
    grad_norm: Vec<f64>,
    cpu_grad_norm: Vec<f64>,
    tolerance: f64,
    pass: bool,
}

/// Two sides' figures accumulated over a `--check`'s steps: the largest
/// relative differences and each side's gradient norms.
#[derive(Default)]
struct Comparison {
    logprobs_rel: f64,
    grads_rel_max: f64,
    worst_grad: String,
    grad_norm: Vec<f64>,
    cpu_grad_norm: Vec<f64>,
}

impl Comparison {
    fn log_probs(&mut self, lp: &Tensor, reference: &Tensor) -> Result<()> {
        self.logprobs_rel = self.logprobs_rel.max(rel_diff(lp, reference)?);
        Ok(())
    }

    fn gradient(&mut self, name: &str, step: usize, g: &Tensor, reference: &Tensor) -> Result<()> {
        let d = rel_diff(g, reference)?;
        if self.worst_grad.is_empty() || d > self.grads_rel_max {
            (self.grads_rel_max, self.worst_grad) = (d, format!("{name} (step {step})"));
        }
        Ok(())
    }

    fn norms(&mut self, norm: f64, reference: f64) {
        self.grad_norm.push(norm);
        self.cpu_grad_norm.push(reference);
    }

    /// The report of `a`'s check of `shape` on `device`.
    fn result(self, a: &StepBenchArgs, shape: String, device: String, composite: bool) -> CheckResult {
        CheckResult {
            shape,
            device,
            composite,
            dtype: a.dtype.clone(),
            pad: a.pad,
            entropy: a.entropy,
            pass: self.logprobs_rel <= a.tolerance && self.grads_rel_max <= a.tolerance,
            logprobs_rel: self.logprobs_rel,
            grads_rel_max: self.grads_rel_max,
            worst_grad: self.worst_grad,
            grad_norm: self.grad_norm,
            cpu_grad_norm: self.cpu_grad_norm,
            tolerance: a.tolerance,
        }
    }
}

/// The step's inputs: token ids (deterministic, in the vocabulary),
/// behaviour log-probs a little off the current ones (so ρ ≠ 1 and the
/// penalty's branch is taken) and ±1 advantages.
struct Batch {
    ids: Tensor,
    att: Tensor,
    mask: Tensor,
    adv: Tensor,
    wobble: Tensor,
}

/// Token `k` of row `i` (SplitMix64, as `scripts/gpu/torch_step.py`).
fn token(a: &StepBenchArgs, vocab: usize, i: usize, k: usize) -> u32 {
    (r2vpo::seed::splitmix64((i * (a.prompt + a.response) + k) as u64) % vocab as u64) as u32
}

/// Left-padded positions of row `i` (`--pad`).
fn lead(a: &StepBenchArgs, i: usize) -> usize {
    (i * a.pad).min(a.prompt - 1)
}

fn batch(a: &StepBenchArgs, vocab: usize, dev: &Device) -> Result<Batch> {
    let (b, w, r) = (a.batch, a.prompt + a.response, a.response);
    let ids: Vec<u32> = (0..b * w).map(|i| token(a, vocab, i / w, i % w)).collect();
    let wobble: Vec<f32> = (0..b * r).map(|i| 0.15 * ((i as f32) * 0.7).sin()).collect();
    let adv: Vec<f32> = (0..b * r).map(|i| if (i / r) % 2 == 0 { 1.0 } else { -1.0 }).collect();
    Ok(Batch {
        ids: Tensor::from_vec(ids, (b, w), dev)?,
        att: Tensor::from_vec(
            (0..b * w).map(|i| u32::from(i % w >= lead(a, i / w))).collect::<Vec<u32>>(),
            (b, w),
            dev,
        )?,
        mask: Tensor::ones((b, r), DType::F32, dev)?,
        adv: Tensor::from_vec(adv, (b, r), dev)?,
        wobble: Tensor::from_vec(wobble, (b, r), dev)?,
    })
}

/// The bench's loss on a micro-batch's log-probs (and entropies): R²VPO
/// with λ = 0.05, whose behaviour log-probs are the current ones plus
/// `x.wobble` (so ρ ≠ 1 and the penalty's branch is taken), minus the
/// entropy bonus `coef` when the entropies are given, aggregated as the
/// trainer aggregates it.
fn bench_loss(x: &Batch, coef: f64, logp: &Tensor, entropy: Option<&Tensor>) -> Result<Tensor> {
    let obj = ObjectiveConfig::preset("r2vpo")?;
    let global = GlobalBatch::from_mask(&x.mask)?;
    let old = (logp.detach() + &x.wobble)?;
    let pb = PolicyBatch { logp, old_logp: &old, advantages: &x.adv, mask: &x.mask, weights: None };
    let mut loss = obj.loss(&pb, 0.05, &global)?.loss;
    if let Some(e) = entropy {
        let term = aggregate(e, &x.mask, obj.aggregation, &global)?;
        loss = (loss - term.affine(coef, 0.0)?)?;
    }
    Ok(loss)
}

/// One micro-batch's step exactly as the trainer takes it
/// ([`r2vpo_llm::backend::forward_backward`] with the bench's loss, the
/// gradient norm, and with `apply` the clipped AdamW step), on the
/// composites with `composite`. Returns the log-probs, the loss and the
/// gradient norm. `between` runs after the objective, before the backward
/// (`--memory` reads the resident set there).
fn step_once(
    be: &mut dyn Backend,
    run: &BenchBatch,
    apply: bool,
    composite: bool,
    between: &mut dyn FnMut() -> Result<()>,
) -> Result<(Tensor, f64, f64)> {
    let mut go = || -> Result<(Tensor, f64, f64)> {
        let (fwd, loss, ()) = forward_backward(be, &run.mb, run.entropy != 0.0, |logp, ent| -> Result<_> {
            let loss = bench_loss(&run.x, run.entropy, logp, ent)?;
            between()?;
            Ok((loss, ()))
        })?;
        let norm = be.grad_norm()?;
        if apply {
            be.step(run.optim.clip_scale(norm))?;
        }
        be.synchronize()?;
        Ok((fwd.logp, loss.to_dtype(DType::F64)?.to_scalar::<f64>()?, norm))
    };
    if composite {
        r2vpo_llm::backend::candle::ops::with_composites(go)
    } else {
        go()
    }
}

/// A step's batch, packed as the trainer packs a padded micro-batch, with
/// the figures the bench's loss and optimizer need.
struct BenchBatch {
    x: Batch,
    mb: MicroBatch,
    entropy: f64,
    optim: OptimConfig,
}

impl BenchBatch {
    fn new(a: &StepBenchArgs, vocab: usize, dev: &Device, optim: OptimConfig) -> Result<BenchBatch> {
        let x = batch(a, vocab, dev)?;
        let mb = MicroBatch {
            inputs: Inputs::Padded { ids: x.ids.clone(), attention: x.att.clone() },
            tail: a.response,
            mask: x.mask.clone(),
            old_logp: x.mask.zeros_like()?,
            advantages: x.adv.clone(),
            ref_logp: None,
            is_weight: None,
        };
        Ok(BenchBatch { x, mb, entropy: a.entropy, optim })
    }
}

/// The backend `--backend`, `--device`, `--dtype` and `--checkpoint` name.
fn spec(a: &StepBenchArgs) -> Result<BackendSpec> {
    Ok(BackendSpec {
        kind: a.backend.parse().map_err(|m| anyhow::anyhow!("--backend {m}"))?,
        device: a.device.clone(),
        compute_dtype: a.dtype.parse().map_err(|m| anyhow::anyhow!("--dtype {m}"))?,
        checkpointing: a.checkpoint,
        lora: (a.lora_rank > 0).then(|| r2vpo_llm::model::LoraConfig {
            rank: a.lora_rank,
            alpha: 2.0 * a.lora_rank as f64,
            ..Default::default()
        }),
    })
}

/// A backend error, naming the flag a refused spec field came from.
fn opened<T>(r: r2vpo_llm::model::Result<T>) -> Result<T> {
    r.map_err(|e| match e {
        r2vpo_llm::model::ModelError::Spec { field, message } => {
            let flag = if field == "compute_dtype" { "dtype".to_string() } else { field };
            anyhow::anyhow!("--{flag} {message}")
        }
        other => other.into(),
    })
}

/// `r2vpo bench step`.
pub fn step(a: &StepBenchArgs) -> Result<()> {
    let cfg = ModelConfig::from_file(&a.shape)?;
    let spec = spec(a)?;
    opened(spec.kind.check_built())?;
    if a.batch == 0 || a.response == 0 || a.prompt == 0 {
        bail!("--batch, --prompt and --response must be at least 1");
    }
    if a.checkpoint && a.entropy != 0.0 {
        bail!("--entropy takes no --checkpoint (the trainer's checkpointed path has no entropy bonus either)");
    }
    if a.score && (a.check || a.checkpoint || a.memory) {
        bail!("--score times the no-grad pass alone: it takes no --check, --checkpoint or --memory");
    }
    if a.lora_rank > 0 && (a.check || a.sampler || a.score) {
        bail!("--lora-rank times a LoRA training step: it takes no --check, --sampler or --score");
    }
    if a.turns.is_some() && a.check {
        bail!("--turns takes turns timing steps: it takes no --check");
    }
    if spec.kind == BackendKind::Torch && (a.composite || a.memory) {
        bail!("--backend torch: --composite and --memory are the candle backend's (its kernels, this process's resident set)");
    }
    let init = RandomInit::new(cfg.clone(), a.seed, 0.02);
    let shape = a.shape.display().to_string();
    if a.sampler {
        return sampler(a, &spec, &cfg, &init, shape);
    }
    let optim = OptimConfig { lr: if a.check { 1e-4 } else { 1e-6 }, ..OptimConfig::default() };
    let mut be = opened(open_backend(&spec, &cfg, &init, optim))?;
    let dev = be.device().clone();
    let run = BenchBatch::new(a, cfg.vocab_size, &dev, optim)?;
    if a.check {
        return check(a, &cfg, &init, be.as_mut(), &run, shape);
    }
    let parameters: usize = expected_params(&cfg).iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let mut turns = a.turns.as_deref().map(Turns::open).transpose()?;
    // Memory first, in a fresh process: an allocator keeps what it freed
    // (RSS never falls back), so only the first step shows what each phase
    // adds. It also serves as the warm-up.
    let memory = if a.memory { Some(memory_phases(a, &cfg, be.as_mut(), &run)?) } else { None };
    let mut times = Vec::new();
    let mut loss = 0.0;
    if let (true, Some(t)) = (a.memory, turns.as_mut()) {
        t.done()?; // ready: the memory step was the warm-up
    }
    for rep in usize::from(a.memory)..=a.reps.max(1) {
        if rep > 0 {
            if let Some(t) = turns.as_mut() {
                t.wait()?;
            }
        }
        be.synchronize()?;
        let t0 = Instant::now();
        let l = if a.score {
            let lp = be.score(&run.mb)?;
            be.synchronize()?;
            f64::from(lp.mean_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()?)
        } else {
            step_once(be.as_mut(), &run, true, a.composite, &mut || Ok(()))?.1
        };
        if rep > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
        // Ready after the warm-up (rep 0); done after each timed step.
        if let Some(t) = turns.as_mut() {
            t.done()?;
        }
        loss = l;
    }
    let n_timed = times.len();
    let step_s = median(&mut times.clone());
    let tokens = a.batch * (a.prompt + a.response);
    let torch = spec.kind == BackendKind::Torch;
    let res = StepResult {
        shape,
        parameters,
        device: a.device.clone(),
        dtype: a.dtype.clone(),
        batch: a.batch,
        prompt: a.prompt,
        response: a.response,
        step_s,
        times_s: times,
        tokens_per_s: tokens as f64 / step_s,
        loss,
        matmul: if torch { "libtorch".into() } else { r2vpo_kernels::dispatch::path() },
        backend: if torch { "torch".into() } else { "candle".into() },
        lora_rank: a.lora_rank,
        trained_parameters: spec.lora.as_ref().map_or(parameters, |l| l.num_parameters(&cfg)),
    };
    let what = if a.score {
        "scoring pass (no-grad log-probs of the response tokens; `loss` is their mean)"
    } else if a.checkpoint {
        "training step, checkpointed (forward + R²VPO objective + backward + AdamW, the trainer's)"
    } else {
        "training step (forward + R²VPO objective + backward + AdamW, the trainer's)"
    };
    println!(
        "r2vpo {what} on the {} backend, {} ({} parameters, {} trained{}), {} {} (many-row products: {}), {} × ({} + {}) tokens, median of {}",
        res.backend,
        res.shape,
        res.parameters,
        res.trained_parameters,
        if a.lora_rank > 0 { format!(": LoRA r = {}", a.lora_rank) } else { String::new() },
        res.device,
        res.dtype,
        res.matmul,
        res.batch,
        res.prompt,
        res.response,
        n_timed
    );
    println!("| step s | tokens/s |\n|---|---|\n| {:.3} | {:.1} |", res.step_s, res.tokens_per_s);
    #[derive(Serialize)]
    struct Out<'a> {
        #[serde(flatten)]
        step: &'a StepResult,
        memory: Option<Memory>,
    }
    r2vpo_report::atomic_write_json(&a.out, &Out { step: &res, memory })?;
    println!("written: {}", a.out.display());
    Ok(())
}

/// The two named pipes of `--turns`: one byte read from `wait` before each
/// timed step, one written to `done` after the warm-up and after each step.
struct Turns {
    wait: std::fs::File,
    done: std::fs::File,
    spec: String,
}

impl Turns {
    fn open(spec: &str) -> Result<Turns> {
        let Some((wait, done)) = spec.split_once(',') else {
            bail!("--turns {spec}: expected two named pipes, WAIT,DONE");
        };
        let open = |path: &str, write: bool| {
            std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(path)
                .with_context(|| format!("--turns: opening {path}"))
        };
        Ok(Turns { wait: open(wait, false)?, done: open(done, true)?, spec: spec.to_string() })
    }

    /// Blocks until the coordinator hands this side its turn.
    fn wait(&mut self) -> Result<()> {
        use std::io::Read;
        let mut b = [0u8; 1];
        match self.wait.read(&mut b) {
            Ok(1) => Ok(()),
            Ok(_) => bail!("--turns {}: the coordinator closed the pipe", self.spec),
            Err(e) => Err(e).with_context(|| format!("--turns {}: waiting for a turn", self.spec)),
        }
    }

    fn done(&mut self) -> Result<()> {
        use std::io::Write;
        self.done.write_all(b".").with_context(|| format!("--turns {}: handing the turn back", self.spec))
    }
}

/// This process's resident set now and its peak since the last
/// [`reset_peak`], in GiB (`VmRSS`, `VmHWM` of /proc/self/status).
pub(crate) fn rss() -> Result<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let kib = |key: &str| -> Result<f64> {
        let line =
            status.lines().find(|l| l.starts_with(key)).with_context(|| format!("no {key} in /proc/self/status"))?;
        let v: f64 =
            line.split_whitespace().nth(1).unwrap_or("").parse().with_context(|| format!("parsing `{line}`"))?;
        Ok(v / (1024.0 * 1024.0))
    };
    Ok((kib("VmRSS:")?, kib("VmHWM:")?))
}

/// Resets `VmHWM` to the current resident set (Linux ≥ 4.0).
pub(crate) fn reset_peak() -> Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting the peak (/proc/self/clear_refs)")
}

/// Where one step's memory goes, phase by phase.
#[derive(Serialize)]
struct Memory {
    /// Analytic sizes (GiB): parameters, the two AdamW moments, and one
    /// copy of the response positions' logits (batch × response × vocab).
    weights_gib: f64,
    moments_gib: f64,
    logits_gib: f64,
    /// Resident set before the step (weights, moments, batch, allocator).
    before_gib: f64,
    /// (phase, peak during it, resident after it), GiB.
    phases: Vec<(String, f64, f64)>,
}

fn memory_phases(a: &StepBenchArgs, cfg: &ModelConfig, be: &mut dyn Backend, run: &BenchBatch) -> Result<Memory> {
    let gib = |bytes: usize| bytes as f64 / (1u64 << 30) as f64;
    // f32 master weights and moments, whatever the compute dtype.
    let el = 4;
    let params: usize = expected_params(cfg).iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let phases = std::cell::RefCell::new(Vec::new());
    let (before, _) = rss()?;
    let phase = |name: &str| -> Result<()> {
        let (now, peak) = rss()?;
        phases.borrow_mut().push((name.to_string(), peak, now));
        reset_peak()
    };
    reset_peak()?;
    let first = if a.checkpoint {
        "forward (layer inputs kept) + objective"
    } else {
        "forward + objective (graph kept for backward)"
    };
    let (_, _, norm) = step_once(be, run, false, a.composite, &mut || phase(first))?;
    phase(if a.checkpoint {
        "backward, one layer recomputed at a time (gradients kept)"
    } else {
        "backward, graph dropped (gradients kept)"
    })?;
    be.step(run.optim.clip_scale(norm))?;
    phase("AdamW step, gradients dropped")?;
    let mem = Memory {
        weights_gib: gib(params * el),
        moments_gib: gib(2 * params * el),
        logits_gib: gib(a.batch * a.response * cfg.vocab_size * el),
        before_gib: before,
        phases: phases.into_inner(),
    };
    println!(
        "\nmemory (resident set, GiB): weights {:.2}, AdamW moments {:.2}, one copy of the response logits {:.2}; before the step {:.2}",
        mem.weights_gib, mem.moments_gib, mem.logits_gib, mem.before_gib
    );
    println!("| phase | peak | after |\n|---|---|---|");
    for (name, peak, after) in &mem.phases {
        println!("| {name} | {peak:.2} | {after:.2} |");
    }
    Ok(mem)
}

/// Largest |a − b| over largest |b|, in f64.
fn rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let diff = (a - &b)?.abs()?.max_all()?.to_scalar::<f64>()?;
    let scale = b.abs()?.max_all()?.to_scalar::<f64>()?;
    Ok(if scale > 0.0 { diff / scale } else { diff })
}

/// `--check`: the step on the backend `a` names against the candle
/// backend in f32 on the CPU, through the fused kernels and the whole
/// graph, on the same weights and batch, over two steps (forward and
/// backward, the AdamW update on each side, forward and backward again),
/// so the optimizer's path is compared too.
fn check(
    a: &StepBenchArgs,
    cfg: &ModelConfig,
    init: &RandomInit,
    be: &mut dyn Backend,
    run: &BenchBatch,
    shape: String,
) -> Result<()> {
    let reference = Transformer::from_source(cfg.clone(), init, DType::F32, &Device::Cpu)?;
    let mut cpu = CandleBackend::new(reference, run.optim, false)?;
    let cpu_run = BenchBatch::new(a, cfg.vocab_size, &Device::Cpu, run.optim)?;
    let mut cmp = Comparison::default();
    for step in 1..=2 {
        let (lp, _, n) = step_once(be, run, false, a.composite, &mut || Ok(()))?;
        let (cpu_lp, _, cn) = step_once(&mut cpu, &cpu_run, false, false, &mut || Ok(()))?;
        cmp.log_probs(&lp, &cpu_lp)?;
        let (g, cg) = (be.gradients()?, cpu.gradients()?);
        if let Some(only) = g.keys().find(|k| !cg.contains_key(*k)) {
            bail!("`{only}` has a gradient on one side only");
        }
        for (name, cgr) in &cg {
            let gr = g.get(name).with_context(|| format!("`{name}` has a gradient on the CPU only"))?;
            cmp.gradient(name, step, gr, cgr)?;
        }
        cmp.norms(n, cn);
        if step == 1 {
            be.step(run.optim.clip_scale(n))?;
            cpu.step(run.optim.clip_scale(cn))?;
        } else {
            be.zero_grad();
            cpu.zero_grad();
        }
    }
    let (device, reference) = match a.backend.as_str() {
        "torch" => (format!("torch {}", a.device), "candle CPU"),
        _ => (a.device.clone(), "CPU"),
    };
    report_check(a, &cmp.result(a, shape, device, a.composite), reference)
}

/// Prints and writes a `--check` of a step against `reference` (what ran
/// the f32 CPU side) and fails beyond `--tolerance`.
fn report_check(a: &StepBenchArgs, res: &CheckResult, reference: &str) -> Result<()> {
    println!(
        "{}{} {} vs {reference} f32, {}{}{}, two steps: log-probs {:.2e}, gradients {:.2e} (worst: {}; norms {:.4?} \
         / {:.4?}), tolerance {:.0e}: {}",
        res.device,
        if res.composite { " (composites)" } else { "" },
        res.dtype,
        res.shape,
        if a.pad > 0 { format!(", left padding {}·row", a.pad) } else { String::new() },
        if a.entropy != 0.0 { format!(", entropy bonus {}", a.entropy) } else { String::new() },
        res.logprobs_rel,
        res.grads_rel_max,
        res.worst_grad,
        res.grad_norm,
        res.cpu_grad_norm,
        res.tolerance,
        if res.pass { "pass" } else { "FAIL" }
    );
    r2vpo_report::atomic_write_json(&a.out, res)?;
    if !res.pass {
        bail!("{} differs from the {reference} beyond {:.0e} (written: {})", res.device, a.tolerance, a.out.display());
    }
    Ok(())
}

/// What `--check --sampler` measured.
#[derive(Serialize)]
struct SamplerCheck {
    shape: String,
    device: String,
    dtype: String,
    tokens: usize,
    /// Largest |behaviour − recomputed| log-prob on this device and on the CPU.
    max_abs: f64,
    cpu_max_abs: f64,
    /// Positions where this device sampled the CPU's token (the streams are
    /// seeded alike; rounding may make them part).
    same_tokens_frac: f64,
    tolerance: f64,
    pass: bool,
}

/// The behaviour log-probs the sampler records against the learner's
/// recomputation of the sequences it sampled (the trainer's ratio is their
/// difference), per device.
/// The batch's prompts, row `i` left-padded by `--pad` (its first
/// `lead(i)` tokens dropped), for the sampler.
fn sampler_prompts(a: &StepBenchArgs, vocab: usize) -> Vec<Vec<u32>> {
    (0..a.batch).map(|i| (lead(a, i)..a.prompt).map(|k| token(a, vocab, i, k)).collect()).collect()
}

/// `--response` tokens per prompt at T = 1 on `m`, every row to the full
/// length (no EOS).
fn sample_all<M: r2vpo_llm::decode::Decoder + ?Sized>(
    m: &M,
    a: &StepBenchArgs,
    prompts: &[Vec<u32>],
) -> Result<Vec<r2vpo_llm::sample::Generation>> {
    use r2vpo_llm::sample::{generate_ids, GenerationRequest, SamplingConfig};
    let sampling = SamplingConfig { max_new_tokens: a.response, ..SamplingConfig::default() };
    let gens = generate_ids(m, &GenerationRequest::batch(prompts, a.seed), &sampling, None, 0)?;
    if let Some((i, g)) = gens.iter().enumerate().find(|(_, g)| g.token_ids.len() != a.response) {
        bail!("row {i} sampled {} tokens, expected {}", g.token_ids.len(), a.response);
    }
    Ok(gens)
}

/// Prompt + sampled response of each row, left-padded to one width:
/// token ids and attention mask `(B, W)` on `dev`.
fn sampled_rows(
    prompts: &[Vec<u32>],
    gens: &[r2vpo_llm::sample::Generation],
    w: usize,
    dev: &Device,
) -> Result<(Tensor, Tensor)> {
    let b = prompts.len();
    let (mut ids, mut att) = (vec![0u32; b * w], vec![0u32; b * w]);
    for (i, (g, pr)) in gens.iter().zip(prompts).enumerate() {
        let row: Vec<u32> = pr.iter().chain(&g.token_ids).copied().collect();
        let off = w - row.len();
        ids[i * w + off..(i + 1) * w].copy_from_slice(&row);
        att[i * w + off..(i + 1) * w].fill(1);
    }
    Ok((Tensor::from_vec(ids, (b, w), dev)?, Tensor::from_vec(att, (b, w), dev)?))
}

/// Largest |behaviour − learner| log-prob over the sampled tokens.
fn worst_gap(gens: &[r2vpo_llm::sample::Generation], learner: &[Vec<f32>]) -> f64 {
    let mut worst = 0.0f64;
    for (g, row) in gens.iter().zip(learner) {
        for (x, y) in g.model_logprobs.iter().zip(row) {
            worst = worst.max((f64::from(*x) - f64::from(*y)).abs());
        }
    }
    worst
}

/// What `--sampler` (without `--check`) measured.
#[derive(Serialize)]
struct SamplerBench {
    stack: String,
    backend: String,
    shape: String,
    parameters: usize,
    device: String,
    dtype: String,
    batch: usize,
    prompt: usize,
    response: usize,
    seconds: f64,
    times_s: Vec<f64>,
    tokens_per_s: f64,
}

/// `--sampler`: generated tokens/s of `m`, every row to `--response` tokens.
fn sampler_bench<M: r2vpo_llm::decode::Decoder + ?Sized>(
    a: &StepBenchArgs,
    m: &M,
    shape: String,
    backend: &str,
) -> Result<()> {
    let prompts = sampler_prompts(a, m.config().vocab_size);
    sample_all(m, a, &prompts)?; // warm-up
    let mut times = Vec::new();
    for _ in 0..a.reps.max(1) {
        let t0 = Instant::now();
        sample_all(m, a, &prompts)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let seconds = median(&mut times.clone());
    let parameters =
        r2vpo_llm::model::expected_params(m.config()).iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let res = SamplerBench {
        stack: "r2vpo sampler".into(),
        backend: backend.into(),
        shape,
        parameters,
        device: a.device.clone(),
        dtype: a.dtype.clone(),
        batch: a.batch,
        prompt: a.prompt,
        response: a.response,
        seconds,
        tokens_per_s: (a.batch * a.response) as f64 / seconds,
        times_s: times,
    };
    println!(
        "r2vpo sampler on {} ({} parameters), {} {} {}, {} × ({} + {}) tokens at T = 1, median of {}",
        res.shape,
        res.parameters,
        res.backend,
        res.device,
        res.dtype,
        res.batch,
        res.prompt,
        res.response,
        res.times_s.len()
    );
    println!("| seconds | tokens/s |\n|---|---|\n| {:.3} | {:.1} |", res.seconds, res.tokens_per_s);
    r2vpo_report::atomic_write_json(&a.out, &res)?;
    println!("written: {}", a.out.display());
    Ok(())
}

/// A sampler's tokens and the largest gap between the behaviour
/// log-probs it recorded and `m`'s learner recomputing the same sequences
/// ([`Policy::score`], the trainer's ratio's denominator and numerator).
fn sampled_gap<M: r2vpo_llm::decode::Decoder + Policy>(
    a: &StepBenchArgs,
    prompts: &[Vec<u32>],
    m: &M,
) -> Result<(Vec<Vec<u32>>, f64)> {
    let (b, r) = (prompts.len(), a.response);
    let gens = sample_all(m, a, prompts)?;
    let (ids, att) = sampled_rows(prompts, &gens, a.prompt + r, Policy::device(m))?;
    let ones = Tensor::ones((b, r), DType::F32, Policy::device(m))?;
    let mb = MicroBatch {
        inputs: Inputs::Padded { ids, attention: att },
        tail: r,
        old_logp: ones.zeros_like()?,
        advantages: ones.zeros_like()?,
        mask: ones,
        ref_logp: None,
        is_weight: None,
    };
    let lp: Vec<Vec<f32>> = Policy::score(m, &mb)?.to_dtype(DType::F32)?.to_vec2()?;
    let worst = worst_gap(&gens, &lp);
    Ok((gens.into_iter().map(|g| g.token_ids).collect(), worst))
}

/// `--check --sampler`: `m`'s sampler against its own learner (on the
/// composites with `--composite`), and the candle backend's on the CPU in
/// f32 beside it, on the same prompts and seeds.
fn sampler_check<M: r2vpo_llm::decode::Decoder + Policy>(
    a: &StepBenchArgs,
    cfg: &ModelConfig,
    init: &RandomInit,
    m: &M,
    shape: String,
) -> Result<()> {
    let (b, r) = (a.batch, a.response);
    let prompts = sampler_prompts(a, cfg.vocab_size);
    let (toks, max_abs) = if a.composite {
        r2vpo_llm::backend::candle::ops::with_composites(|| sampled_gap(a, &prompts, m))?
    } else {
        sampled_gap(a, &prompts, m)?
    };
    let cpu = Transformer::from_source(cfg.clone(), init, DType::F32, &Device::Cpu)?;
    let (cpu_toks, cpu_max_abs) = sampled_gap(a, &prompts, &cpu)?;
    let same = toks.iter().flatten().zip(cpu_toks.iter().flatten()).filter(|(x, y)| x == y).count();
    let pass = max_abs <= a.tolerance && max_abs.is_finite();
    let torch = a.backend == "torch";
    let res = SamplerCheck {
        shape,
        device: if torch { format!("torch {}", a.device) } else { a.device.clone() },
        dtype: a.dtype.clone(),
        tokens: b * r,
        max_abs,
        cpu_max_abs,
        same_tokens_frac: same as f64 / (b * r) as f64,
        tolerance: a.tolerance,
        pass,
    };
    report_sampler_check(a, &res, if torch { "candle cpu" } else { "cpu" })
}

/// Prints and writes a sampler check (`reference` names what the CPU side
/// ran) and fails beyond `--tolerance`.
fn report_sampler_check(a: &StepBenchArgs, res: &SamplerCheck, reference: &str) -> Result<()> {
    println!(
        "{} {} sampler vs learner, {}, {} tokens: max |Δ log-prob| {:.2e} ({reference} f32: {:.2e}), same tokens as \
         {reference} {:.0} %, tolerance {:.0e}: {}",
        res.device,
        res.dtype,
        res.shape,
        res.tokens,
        res.max_abs,
        res.cpu_max_abs,
        100.0 * res.same_tokens_frac,
        res.tolerance,
        if res.pass { "pass" } else { "FAIL" }
    );
    r2vpo_report::atomic_write_json(&a.out, res)?;
    if !res.pass {
        bail!(
            "{}'s sampler log-probs differ from its learner's beyond {:.0e} (written: {})",
            res.device,
            a.tolerance,
            a.out.display()
        );
    }
    Ok(())
}

/// `--sampler`: the sampler of the backend `spec` names, timed, or
/// (`--check`) its behaviour log-probs against the learner's
/// recomputation of the sequences it sampled.
fn sampler(a: &StepBenchArgs, spec: &BackendSpec, cfg: &ModelConfig, init: &RandomInit, shape: String) -> Result<()> {
    match opened(r2vpo_llm::backend::open::open(spec, cfg, init, OptimConfig::default()))? {
        Opened::Candle(m) if a.check => sampler_check(a, cfg, init, &m, shape),
        Opened::Candle(m) => sampler_bench(a, &m, shape, "candle"),
        #[cfg(feature = "torch")]
        Opened::Torch(t) if a.check => sampler_check(a, cfg, init, &t, shape),
        #[cfg(feature = "torch")]
        Opened::Torch(t) => sampler_bench(a, &t, shape, "torch"),
    }
}
