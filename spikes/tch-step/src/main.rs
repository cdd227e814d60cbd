//! One R²VPO training step (forward + objective + backward + gradient-norm
//! clipping + AdamW) of a random model of a Hugging Face Qwen3/Llama
//! `config.json` shape, on libtorch through tch-rs: what a tch-rs learner
//! would run, for the backend decision of the GPU learner (README "GPU
//! learner"). The batch, the ids, the behaviour log-probs and the objective
//! are `r2vpo bench step`'s and `scripts/gpu/torch_step.py`'s (SplitMix64
//! ids, a 0.15·sin wobble, λ = 0.05, δ = 1e-3, token-mean), and the
//! precision is r2vpo's `--dtype bf16`: f32 master weights, gradients and
//! AdamW moments, each forward casting the weights to bf16 (a
//! differentiable cast), logits back to f32 before the log-softmax.
//!
//! Attention is libtorch's fused SDPA (FlashAttention forward and
//! backward); AdamW is libtorch's C++ `torch::optim::AdamW` (one tensor at
//! a time, several kernels each: tch exposes neither the fused nor the
//! foreach form, so this side is, if anything, slower than PyTorch's
//! `fused=True`).
//!
//! Usage: tch-step --shape configs/shapes/qwen3-1.7b.json [--batch 4]
//!        [--prompt 256] [--response 768] [--reps 3] [--out FILE] [--cpu]

use std::time::Instant;

use anyhow::{bail, Context, Result};
use tch::{nn, nn::OptimizerConfig, Device, Kind, Tensor};

const BF16: Kind = Kind::BFloat16;

struct Shape {
    hidden: i64,
    inter: i64,
    layers: i64,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    vocab: i64,
    eps: f64,
    theta: f64,
    qk_norm: bool,
    tied: bool,
}

impl Shape {
    fn read(path: &str) -> Result<Shape> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?)?;
        let int = |k: &str| v[k].as_i64().with_context(|| format!("{path}: `{k}` missing"));
        let hidden = int("hidden_size")?;
        let heads = int("num_attention_heads")?;
        Ok(Shape {
            hidden,
            inter: int("intermediate_size")?,
            layers: int("num_hidden_layers")?,
            heads,
            kv_heads: v["num_key_value_heads"].as_i64().unwrap_or(heads),
            head_dim: v["head_dim"].as_i64().unwrap_or(hidden / heads),
            vocab: int("vocab_size")?,
            eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6),
            theta: v["rope_theta"].as_f64().unwrap_or(10000.0),
            qk_norm: v["model_type"].as_str() == Some("qwen3"),
            tied: v["tie_word_embeddings"].as_bool().unwrap_or(false),
        })
    }
}

struct Layer {
    ln1: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    qn: Option<Tensor>,
    kn: Option<Tensor>,
    ln2: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

struct Model {
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    head: Option<Tensor>,
    s: Shape,
}

impl Model {
    fn new(p: nn::Path, s: Shape) -> Model {
        let w = |p: &nn::Path, name: &str, dims: &[i64]| p.var(name, dims, nn::Init::Randn { mean: 0.0, stdev: 0.02 });
        let ones = |p: &nn::Path, name: &str, n: i64| p.var(name, &[n], nn::Init::Const(1.0));
        let (h, d) = (s.hidden, s.head_dim);
        let layers = (0..s.layers)
            .map(|i| {
                let l = &p / "layers" / i;
                Layer {
                    ln1: ones(&l, "input_layernorm", h),
                    q: w(&l, "q_proj", &[s.heads * d, h]),
                    k: w(&l, "k_proj", &[s.kv_heads * d, h]),
                    v: w(&l, "v_proj", &[s.kv_heads * d, h]),
                    o: w(&l, "o_proj", &[h, s.heads * d]),
                    qn: s.qk_norm.then(|| ones(&l, "q_norm", d)),
                    kn: s.qk_norm.then(|| ones(&l, "k_norm", d)),
                    ln2: ones(&l, "post_attention_layernorm", h),
                    gate: w(&l, "gate_proj", &[s.inter, h]),
                    up: w(&l, "up_proj", &[s.inter, h]),
                    down: w(&l, "down_proj", &[h, s.inter]),
                }
            })
            .collect();
        Model {
            embed: w(&p, "embed_tokens", &[s.vocab, h]),
            layers,
            norm: ones(&p, "norm", h),
            head: (!s.tied).then(|| w(&p, "lm_head", &[s.vocab, h])),
            s,
        }
    }

    /// Transformers' RMSNorm: in f32, then back to the compute dtype.
    fn rms(&self, x: &Tensor, w: &Tensor) -> Tensor {
        let xf = x.to_kind(Kind::Float);
        let var = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        (xf * (var + self.s.eps).rsqrt()).to_kind(BF16) * w.to_kind(BF16)
    }

    /// Log-probs of `ids[:, p..]` under the model (only the positions that
    /// predict them go through the head).
    fn logprobs(&self, ids: &Tensor, p: i64) -> Tensor {
        let (b, t) = ids.size2().unwrap();
        let s = &self.s;
        let d = s.head_dim;
        let dev = ids.device();
        // RoPE tables (half-split layout, as transformers' rotate_half).
        let inv = Tensor::arange_start_step(0, d, 2, (Kind::Float, dev)).to_kind(Kind::Float) / d as f64;
        let inv = (inv * -(s.theta.ln())).exp();
        let pos = Tensor::arange(t, (Kind::Float, dev));
        let f = pos.unsqueeze(1) * inv.unsqueeze(0);
        let emb = Tensor::cat(&[&f, &f], -1);
        let (cos, sin) = (emb.cos().to_kind(BF16), emb.sin().to_kind(BF16));
        let rope = |x: &Tensor| {
            let x1 = x.narrow(-1, 0, d / 2);
            let x2 = x.narrow(-1, d / 2, d / 2);
            x * &cos + Tensor::cat(&[&x2.neg(), &x1], -1) * &sin
        };
        let mut x = self.embed.to_kind(BF16).index_select(0, &ids.view([-1])).view([b, t, s.hidden]);
        for l in &self.layers {
            let h = self.rms(&x, &l.ln1);
            let q = h.linear::<Tensor>(&l.q.to_kind(BF16), None).view([b, t, s.heads, d]);
            let k = h.linear::<Tensor>(&l.k.to_kind(BF16), None).view([b, t, s.kv_heads, d]);
            let v = h.linear::<Tensor>(&l.v.to_kind(BF16), None).view([b, t, s.kv_heads, d]);
            let (q, k) = match (&l.qn, &l.kn) {
                (Some(qn), Some(kn)) => (self.rms(&q, qn), self.rms(&k, kn)),
                _ => (q, k),
            };
            let q = rope(&q.transpose(1, 2));
            let k = rope(&k.transpose(1, 2));
            let v = v.transpose(1, 2);
            let a = Tensor::scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, 0.0, true, None, true);
            let a = a.transpose(1, 2).reshape([b, t, s.heads * d]);
            x = x + a.linear::<Tensor>(&l.o.to_kind(BF16), None);
            let h = self.rms(&x, &l.ln2);
            let g = h.linear::<Tensor>(&l.gate.to_kind(BF16), None);
            let u = h.linear::<Tensor>(&l.up.to_kind(BF16), None);
            x = x + (g.silu() * u).linear::<Tensor>(&l.down.to_kind(BF16), None);
        }
        let r = t - p;
        let h = self.rms(&x.narrow(1, p - 1, r), &self.norm);
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let logits = h.linear::<Tensor>(&head.to_kind(BF16), None).to_kind(Kind::Float);
        logits.log_softmax(-1, Kind::Float).gather(-1, &ids.narrow(1, p, r).unsqueeze(-1), false).squeeze_dim(-1)
    }
}

fn splitmix64(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut shape, mut b, mut p, mut r, mut reps, mut out, mut cuda) =
        (String::new(), 4i64, 256i64, 768i64, 3usize, "runs/bench/tch-step.json".to_string(), true);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--shape" => shape = val()?,
            "--batch" => b = val()?.parse()?,
            "--prompt" => p = val()?.parse()?,
            "--response" => r = val()?.parse()?,
            "--reps" => reps = val()?.parse()?,
            "--out" => out = val()?,
            // The CPU runs the same code on a small shape: a dry run where there is no GPU.
            "--cpu" => cuda = false,
            _ => bail!("unknown argument {a} (see the doc comment of spikes/tch-step/src/main.rs)"),
        }
    }
    if shape.is_empty() {
        bail!("--shape CONFIG.json is required");
    }
    // tch links libtorch_cuda only if a symbol of it is used; load it so
    // that libtorch registers its CUDA backend.
    // SAFETY: dlopen of a library by name; the handle is never closed.
    let dev = if cuda {
        let h = unsafe { libc::dlopen(c"libtorch_cuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() || !tch::Cuda::is_available() {
            bail!("no CUDA: libtorch_cuda.so not found on LD_LIBRARY_PATH, or no GPU (--cpu runs on the CPU)");
        }
        Device::Cuda(0)
    } else {
        Device::Cpu
    };
    let sync = || {
        if cuda {
            tch::Cuda::synchronize(0)
        }
    };
    let s = Shape::read(&shape)?;
    let vocab = s.vocab;
    tch::manual_seed(7);
    let vs = nn::VarStore::new(dev);
    let model = Model::new(vs.root(), s);
    let params: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
    let mut opt = nn::AdamW { beta1: 0.9, beta2: 0.999, wd: 0.01, eps: 1e-8, amsgrad: false }.build(&vs, 1e-6)?;

    let w = p + r;
    let ids: Vec<i64> = (0..(b * w) as u64).map(|i| (splitmix64(i) % vocab as u64) as i64).collect();
    let ids = Tensor::from_slice(&ids).view([b, w]).to(dev);
    let wobble: Vec<f32> = (0..b * r).map(|i| (0.15 * (i as f64 * 0.7).sin()) as f32).collect();
    let wobble = Tensor::from_slice(&wobble).view([b, r]).to(dev);
    let adv: Vec<f32> = (0..b * r).map(|i| if (i / r) % 2 == 0 { 1.0 } else { -1.0 }).collect();
    let adv = Tensor::from_slice(&adv).view([b, r]).to(dev);
    let (lam, delta) = (0.05, 1e-3);

    let mut step = || -> f64 {
        let logp = model.logprobs(&ids, p);
        let old = logp.detach() + &wobble;
        let rho = (&logp - old).clamp(-20.0, 20.0).exp();
        // Eq. (primal–dual objective), per token, token-mean.
        let per_token = -(&rho * &adv - ((&rho - 1.0).pow_tensor_scalar(2) - delta) * lam);
        let loss = per_token.mean(Kind::Float);
        opt.zero_grad();
        loss.backward();
        opt.clip_grad_norm(1.0);
        opt.step();
        loss.double_value(&[])
    };
    step(); // warm-up: kernels, allocator, optimizer state
    sync();
    let mut times = vec![];
    let mut loss = 0.0;
    for _ in 0..reps.max(1) {
        sync();
        let t0 = Instant::now();
        loss = step();
        sync();
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let step_s = times[times.len() / 2];
    let res = serde_json::json!({
        "shape": shape, "parameters": params, "device": if cuda { "cuda" } else { "cpu" }, "dtype": "bf16", "checkpoint": false,
        "batch": b, "prompt": p, "response": r, "step_s": step_s, "tokens_per_s": (b * w) as f64 / step_s,
        "loss": loss, "stack": "tch-rs 0.24 on libtorch 2.11",
    });
    println!("tch-rs step, {shape} ({params} parameters), {} bf16 (f32 master weights), {b} × ({p} + {r}) tokens, median of {}", if cuda { "cuda" } else { "cpu" }, times.len());
    println!("| step s | tokens/s |\n|---|---|\n| {step_s:.3} | {:.1} |", (b * w) as f64 / step_s);
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = format!("{out}.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&res)?)?;
    std::fs::rename(&tmp, &out)?;
    println!("written: {out}");
    Ok(())
}
