//! The libtorch backend, through tch-rs (`[model] backend = "torch"`; a
//! binary built with the `torch` feature: `make build-torch`, or `make
//! build-gpu` for CUDA).
//!
//! Chosen by measurement: a Qwen3-1.7B training step on an H200 ran at
//! 0.97× PyTorch's tokens/s through tch-rs against 0.13× on candle's CUDA
//! backend (`results/gpu/`, `docs/gpu.md`). The decoder is the
//! candle [`Transformer`]'s, op for op, from the same [`ModelConfig`] and
//! the same Hugging Face parameter names: RMSNorm, q/k/v projections (Qwen2's
//! biases, Qwen3's per-head q/k RMSNorm), rotate-half RoPE with the same
//! per-row positions under left padding and tables computed in f32 on the
//! host, attention by libtorch's `scaled_dot_product_attention` (the
//! FlashAttention and memory-efficient kernels on CUDA, grouped-query heads
//! without copies) under the same additive mask, SwiGLU, the final norm,
//! and the LM head only on the scored columns.
//!
//! The optimizer is libtorch's fused AdamW (`at::_fused_adamw_`, what
//! `torch.optim.AdamW(fused=True)` runs; tch-rs does not expose it, so a
//! small C++ shim calls it: `fused_adamw.cpp`), in two parameter groups:
//! weight decay on matrices only, as the candle optimizer. The clipping
//! factor reaches it as the kernel's gradient scale.
//!
//! Memory: the master weights and the AdamW moments are f32; with `bf16`
//! compute each forward casts the weights (the casts are in the graph, so
//! gradients land on the f32 masters) and the logits go back to f32 before
//! the log-softmax. The head's log-probs are computed a chunk of rows at a
//! time without a graph and recomputed chunk by chunk in the backward,
//! weighted by their gradient, so the (rows × vocabulary) logits are never
//! whole: Qwen3's 151,936-token head over 8 k response tokens would be
//! 4.9 GB of f32 logits. With checkpointing, each decoder layer keeps only
//! its input and is recomputed in the backward (as
//! [`Transformer::checkpointed_tail`] does).
//!
//! Sampling: the backend is also a [`crate::decode::Decoder`], so the
//! sampler ([`crate::sample`]) and the serving engine decode on it: a KV
//! cache in preallocated per-layer buffers ([`TorchKv`]), the next-token
//! logits in f32 whatever the compute kind, the weights in the compute kind
//! cast once per change. Behaviour log-probs are those of the weights the
//! learner holds, on the same kernels.
//!
//! Threads: tch's tensors are `Send` but not `Sync`, so the state lives
//! behind a mutex; every libtorch call of a step comes from the caller's
//! thread, on the device's one default stream.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tch::{Device as TDevice, Kind, Tensor as T};

use super::batch::{Inputs, MicroBatch};
use super::OptimConfig;
use super::{Backend, Forward, Policy};
use crate::model::expected_params;
use crate::model::lora::{check_adapter, peft_name, Factor, LoraConfig, LoraTarget};
use crate::model::source::check;
use crate::model::{ModelConfig, ModelError, Result, TensorSource};
use crate::sample::{Generation, GenerationRequest, SamplingConfig};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

mod decode;
mod shard;

pub use decode::TorchKv;

unsafe extern "C" {
    /// `src/parallel/c10d.cpp`: sets a parameter's accumulated gradient.
    fn r2vpo_c10d_set_grad(
        param: *mut std::ffi::c_void,
        grad: *mut std::ffi::c_void,
        err: *mut std::ffi::c_char,
        err_len: std::ffi::c_int,
    ) -> std::ffi::c_int;

    /// `src/backend/fused_adamw.cpp`: `at::_fused_adamw_` over `n`
    /// parameters (tch handles); 0, or 1 with the message in `err`.
    fn r2vpo_fused_adamw(
        params: *mut *mut std::ffi::c_void,
        grads: *mut *mut std::ffi::c_void,
        exp_avgs: *mut *mut std::ffi::c_void,
        exp_avg_sqs: *mut *mut std::ffi::c_void,
        step: *mut std::ffi::c_void,
        n: std::ffi::c_int,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        grad_scale: *mut std::ffi::c_void,
        err: *mut std::ffi::c_char,
        err_len: std::ffi::c_int,
    ) -> std::ffi::c_int;
}

/// Additive mask value for keys a query must not see (the candle model's).
const MASKED: f64 = -1e9;

/// Logit elements per chunk of the head (the candle model's default).
const LOGITS_CHUNK: usize = 16 << 20;

/// Where and how the torch backend computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TorchOptions {
    /// `None` = CPU, `Some(n)` = CUDA device `n`.
    pub cuda: Option<usize>,
    /// Compute in bf16 (f32 master weights and moments) instead of f32.
    pub bf16: bool,
    /// Per-layer gradient checkpointing.
    pub checkpointing: bool,
}

/// The device `name` names (`cpu`, `cuda`, `cuda:N`), refused with what is
/// missing when CUDA is named and libtorch finds no such GPU.
pub fn torch_device(name: &str) -> std::result::Result<Option<usize>, String> {
    let ordinal = crate::model::cuda_ordinal(name)?;
    if let Some(n) = ordinal {
        let have = tch::Cuda::device_count();
        if (n as i64) >= have {
            return Err(format!("`{name}`: libtorch sees {have} CUDA device(s)"));
        }
    }
    Ok(ordinal)
}

/// One decoder layer's parameters, as indices into the parameter list.
struct LayerIdx {
    in_norm: usize,
    q: usize,
    k: usize,
    v: usize,
    q_b: Option<usize>,
    k_b: Option<usize>,
    v_b: Option<usize>,
    o: usize,
    o_b: Option<usize>,
    q_norm: Option<usize>,
    k_norm: Option<usize>,
    post_norm: usize,
    gate: usize,
    up: usize,
    down: usize,
}

impl LayerIdx {
    /// The index of the projection weight `target` adapts.
    fn weight(&self, target: LoraTarget) -> usize {
        match target {
            LoraTarget::QProj => self.q,
            LoraTarget::KProj => self.k,
            LoraTarget::VProj => self.v,
            LoraTarget::OProj => self.o,
            LoraTarget::GateProj => self.gate,
            LoraTarget::UpProj => self.up,
            LoraTarget::DownProj => self.down,
        }
    }
}

/// Where each parameter sits in the list (in [`expected_params`] order).
struct Layout {
    embed: usize,
    layers: Vec<LayerIdx>,
    norm: usize,
    lm_head: Option<usize>,
    /// Per layer, each projection's adapter `(A, B)` by
    /// [`LoraTarget::index`], where the model has them.
    adapters: Vec<[Option<(usize, usize)>; 7]>,
}

impl Layout {
    fn new(cfg: &ModelConfig, names: &[String]) -> Self {
        let at: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        let get = |n: &str| at.get(n).copied();
        let need = |n: String| get(&n).expect("a name of expected_params");
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = |s: &str| format!("model.layers.{i}.{s}");
                LayerIdx {
                    in_norm: need(p("input_layernorm.weight")),
                    q: need(p("self_attn.q_proj.weight")),
                    k: need(p("self_attn.k_proj.weight")),
                    v: need(p("self_attn.v_proj.weight")),
                    q_b: get(&p("self_attn.q_proj.bias")),
                    k_b: get(&p("self_attn.k_proj.bias")),
                    v_b: get(&p("self_attn.v_proj.bias")),
                    o: need(p("self_attn.o_proj.weight")),
                    o_b: get(&p("self_attn.o_proj.bias")),
                    q_norm: get(&p("self_attn.q_norm.weight")),
                    k_norm: get(&p("self_attn.k_norm.weight")),
                    post_norm: need(p("post_attention_layernorm.weight")),
                    gate: need(p("mlp.gate_proj.weight")),
                    up: need(p("mlp.up_proj.weight")),
                    down: need(p("mlp.down_proj.weight")),
                }
            })
            .collect();
        let adapters = (0..cfg.num_hidden_layers)
            .map(|li| {
                let mut a: [Option<(usize, usize)>; 7] = Default::default();
                for t in LoraTarget::ALL {
                    let m = t.module(li);
                    if let (Some(ia), Some(ib)) = (get(&peft_name(&m, Factor::A)), get(&peft_name(&m, Factor::B))) {
                        a[t.index()] = Some((ia, ib));
                    }
                }
                a
            })
            .collect();
        Layout {
            embed: need("model.embed_tokens.weight".into()),
            layers,
            norm: need("model.norm.weight".into()),
            lm_head: get("lm_head.weight"),
            adapters,
        }
    }
}

/// What every layer of one pass shares: the additive mask and the RoPE
/// tables of the batch's rows.
struct Ctx {
    b: i64,
    /// New tokens per row (`W` of a whole pass).
    t: i64,
    /// Which keys each query sees.
    keys: Keys,
    /// `(B, 1, T, D/2)`, in the compute kind.
    cos: T,
    sin: T,
    /// The queries' tables, times `1/√D`: as in the candle model, the
    /// rotated queries come out scaled for the attention.
    cos_q: T,
    sin_q: T,
}

/// Which keys each query of a pass sees.
enum Keys {
    /// An additive mask `(B, 1, T, cached + T)` in the compute kind.
    Mask(T),
    /// One row of sequences laid end to end, each causal within itself
    /// after its prefix ([`crate::backend::batch::PackedSequences`]).
    Packed(Vec<crate::backend::batch::Seq>),
}

/// The rows of the stack's output that the head scores, and where their
/// values go in the micro-batch's `(B, R)` tail.
enum Scored {
    /// The last `r` positions of every row (padded rows).
    Tail(i64),
    /// The packed positions `rows` of `packed`, a micro-batch of `b`
    /// samples whose longest response is `r`.
    Packed { rows: T, packed: crate::backend::batch::PackedSequences, b: usize, r: usize },
}

/// What the last forward left for the backward.
struct Pending {
    /// The head's input rows `(B·R, hidden)`: with the stack's graph, or
    /// without one under checkpointing.
    hs: T,
    /// Checkpointing: each layer's input, then the last layer's output.
    inputs: Vec<T>,
    ctx: Ctx,
    ids: T,
    /// The scored tokens, `(B·R,)` or `(S,)` packed.
    targets: T,
    scored: Scored,
    entropy: bool,
}

/// Everything mutable, behind the backend's mutex.
struct State {
    /// The parameters, requiring gradients where they learn, in
    /// [`expected_params`] order: the f32 master weights, except another
    /// rank's parameters when the masters are sharded (held in the compute
    /// kind, [`Shard::masters`]).
    params: Vec<T>,
    /// The f32 gradients of the parameters held in the compute kind: each
    /// backward pass's gradient of the compute-kind weight is added here,
    /// so they sum in f32 as a master's gradient does.
    grads: Vec<Option<T>>,
    /// Rank 0's copies of other ranks' f32 masters, from
    /// [`Backend::gather_optimizer`] until the weights next change.
    masters: HashMap<usize, T>,
    m: Vec<T>,
    v: Vec<T>,
    /// A checkpoint's optimizer file, mapped by [`Backend::load_optimizer`]
    /// and read by [`TorchBackend::ensure_moments`].
    saved: Option<Saved>,
    /// ZeRO-2's group where the backward reduces each layer's gradients
    /// as it completes them ([`super::Sharding::reduce_in_backward`]).
    reducer: Option<Box<dyn crate::parallel::Group>>,
    steps: u64,
    pending: Option<Pending>,
}

/// A checkpoint's optimizer state, mapped and checked but not yet read.
struct Saved {
    file: candle_core::safetensors::MmapedSafetensors,
    path: std::path::PathBuf,
}

/// The libtorch learner and its policy.
pub struct TorchBackend {
    config: ModelConfig,
    /// Every parameter's name: the model's in [`expected_params`] order,
    /// then the adapters' (PEFT names) where there are any.
    names: Vec<String>,
    /// How many of `names` are the model's own.
    n_base: usize,
    /// The adapters, where the model trains them (then only they learn).
    lora: Option<LoraConfig>,
    decay: Vec<bool>,
    layout: Layout,
    inv_freq: Vec<f32>,
    device: TDevice,
    kind: Kind,
    opts: TorchOptions,
    optim: OptimConfig,
    state: Mutex<State>,
    /// Bumped whenever the weights change: the inference casts below
    /// record the generation they were made from.
    generation: AtomicU64,
    /// The weights in the compute kind for decoding and scoring (bf16:
    /// cast once per change, not once per decode step).
    casts: Mutex<(u64, Vec<T>)>,
    cpu: candle_core::Device,
    /// The optimizer state's split over data-parallel ranks (ZeRO-1), when
    /// sharded.
    shard: Option<Shard>,
}

/// Which rank keeps (and steps) each parameter's optimizer state.
struct Shard {
    rank: usize,
    owner: Vec<usize>,
    /// Whether the f32 masters are sharded too (a compute kind narrower
    /// than f32): then a rank holds other ranks' parameters only in the
    /// compute kind, as Megatron's distributed optimizer does.
    masters: bool,
}

/// Sets the number of libtorch's intra-op CPU threads. Needed in-process:
/// the OpenMP runtime libtorch links reads `OMP_NUM_THREADS` when it is
/// loaded, before `main` runs, so setting the variable there reaches only
/// child processes (measured on 2 cores: one `llm train` iteration with
/// `--threads 1` kept 1.7 cores busy, user plus system time over wall
/// time, without this call, and 1.0 with it).
pub fn set_threads(n: usize) {
    tch::set_num_threads(n.max(1) as i32);
}

/// Copies the consecutive slices of the flat `bucket` into `targets`, in
/// order, each in its tensor's shape and kind: the way back of a bucket
/// of `T::cat`'d tensors after a collective.
fn unflatten_into(bucket: &T, targets: &[T]) {
    let mut off = 0;
    for t in targets {
        let k = t.numel() as i64;
        t.shallow_clone().copy_(&bucket.narrow(0, off, k).view_as(t));
        off += k;
    }
}

/// Sets `param`'s gradient to `grad` (an undefined tensor clears it):
/// tch-rs has no setter, so the distributed shim's does it.
fn set_grad(param: &mut T, grad: &mut T) -> Result<()> {
    shim("setting a gradient", |err, len| {
        // SAFETY: live tch handles for the call; the shim catches every C++
        // exception.
        unsafe { r2vpo_c10d_set_grad(param.as_mut_ptr().cast(), grad.as_mut_ptr().cast(), err, len) }
    })
}

/// Calls a C++ shim function that returns 0, or 1 with a NUL-terminated
/// message in the buffer it is given; the message becomes the error.
fn shim(what: &str, call: impl FnOnce(*mut std::ffi::c_char, std::ffi::c_int) -> std::ffi::c_int) -> Result<()> {
    let mut err = [0 as std::ffi::c_char; 512];
    if call(err.as_mut_ptr(), err.len() as std::ffi::c_int) != 0 {
        // SAFETY: the shim wrote a NUL-terminated message.
        let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
        return Err(ModelError::Torch(format!("{what}: {}", msg.to_string_lossy())));
    }
    Ok(())
}

/// Runs `f`, turning a libtorch exception (tch panics on the C++ error of
/// an infallible call: a shape error, CUDA out of memory) into an error.
fn guarded<R>(what: &str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(ModelError::Torch(format!("{what}: {msg}")))
        }
    }
}

fn torch_err(e: tch::TchError) -> ModelError {
    ModelError::Torch(e.to_string())
}

/// A candle tensor's values as a libtorch f32 tensor on `device`, made by
/// one copy out of the candle tensor's own buffer: libtorch reads it in
/// place (a view, dropped before the buffer can be) and writes the f32
/// parameter on the device, converting bf16 and f16 on the way. So a
/// tensor costs the host nothing beyond its stored bytes while it crosses
/// (on the CPU device the parameter itself lives in host memory). Measured
/// by `a_bf16_folder_reaches_the_torch_backend_without_whole_model_host_copies`.
fn to_torch(t: &candle_core::Tensor, device: TDevice) -> Result<T> {
    to_torch_as(t, device, Kind::Float)
}

/// [`to_torch`] into a tensor of `out` (a LoRA's frozen base in the
/// compute kind).
fn to_torch_as(t: &candle_core::Tensor, device: TDevice, out: Kind) -> Result<T> {
    use candle_core::{CpuStorage, Storage};
    let t = t.contiguous()?;
    let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
    let mut strides = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    let (storage, layout) = t.storage_and_layout();
    let start = layout.start_offset();
    let (ptr, kind) = match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => (v[start..].as_ptr().cast::<u8>(), Kind::Float),
        Storage::Cpu(CpuStorage::BF16(v)) => (v[start..].as_ptr().cast::<u8>(), Kind::BFloat16),
        Storage::Cpu(CpuStorage::F16(v)) => (v[start..].as_ptr().cast::<u8>(), Kind::Half),
        Storage::Cpu(CpuStorage::F64(v)) => (v[start..].as_ptr().cast::<u8>(), Kind::Double),
        _ => {
            drop(storage);
            let v: Vec<f32> =
                t.to_dtype(candle_core::DType::F32)?.to_device(&candle_core::Device::Cpu)?.flatten_all()?.to_vec1()?;
            return T::f_from_slice(&v)
                .and_then(|x| x.f_view(dims.as_slice()))
                .and_then(|x| x.f_to_device_(device, out, false, true))
                .map_err(torch_err);
        }
    };
    // SAFETY: `ptr` points at `t`'s contiguous elements of `kind`, which the
    // read guard `storage` keeps alive and unchanged until the end of this
    // function; the view does not outlive it, because `copy = true` makes
    // the result a new tensor even where device and kind already match.
    let view = unsafe { T::f_from_blob(ptr, &dims, &strides, kind, TDevice::Cpu) }.map_err(torch_err)?;
    let copied = view.f_to_device_(device, out, false, true).map_err(torch_err);
    drop(view);
    drop(storage);
    copied
}

/// A libtorch tensor's values as a candle f32 tensor on the CPU.
fn to_candle(t: &T) -> Result<candle_core::Tensor> {
    let dims: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
    let flat = t.f_to_device(TDevice::Cpu).and_then(|x| x.f_to_kind(Kind::Float)).map_err(torch_err)?;
    let flat = flat.f_contiguous().and_then(|x| x.f_view([-1])).map_err(torch_err)?;
    let v: Vec<f32> = Vec::<f32>::try_from(&flat).map_err(torch_err)?;
    Ok(candle_core::Tensor::from_vec(v, dims, &candle_core::Device::Cpu)?)
}

/// An integer candle tensor (token ids, masks) as libtorch int64.
fn ids_to_torch(t: &candle_core::Tensor, device: TDevice) -> Result<T> {
    let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
    let v: Vec<i64> = t.to_dtype(candle_core::DType::I64)?.flatten_all()?.to_vec1()?;
    T::f_from_slice(&v).and_then(|x| x.f_view(dims.as_slice())).and_then(|x| x.f_to_device(device)).map_err(torch_err)
}

impl TorchBackend {
    /// A torch learner (and decoder) of `config` with the weights of
    /// `source`, with AdamW `optim`. The source is [`check`]ed first; then
    /// each tensor is read, converted to an f32 parameter on the device and
    /// dropped from host memory before the next is read, so no copy of the
    /// whole model is ever made on the host. The optimizer's moments are
    /// allocated at its first step, so a model that only decodes (`r2vpo
    /// serve`) holds the weights alone.
    pub fn new(config: ModelConfig, source: &dyn TensorSource, optim: OptimConfig, opts: TorchOptions) -> Result<Self> {
        Self::build(config, source, None, optim, opts)
    }

    /// [`TorchBackend::new`] training low-rank adapters `lora` (values from
    /// `adapters`, PEFT names: [`crate::model::lora::AdapterInit`] for a
    /// fresh start) on the frozen base: the base is held in the compute
    /// kind only (bf16 with `opts.bf16`: no f32 master copy) and gets no
    /// gradient; the adapters are f32 masters, the only parameters AdamW
    /// updates.
    pub fn with_lora(
        config: ModelConfig,
        source: &dyn TensorSource,
        lora: &LoraConfig,
        adapters: &dyn TensorSource,
        optim: OptimConfig,
        opts: TorchOptions,
    ) -> Result<Self> {
        lora.validate().map_err(|(field, message)| ModelError::Spec { field: format!("lora.{field}"), message })?;
        Self::build(config, source, Some((lora, adapters)), optim, opts)
    }

    fn build(
        config: ModelConfig,
        source: &dyn TensorSource,
        lora: Option<(&LoraConfig, &dyn TensorSource)>,
        optim: OptimConfig,
        opts: TorchOptions,
    ) -> Result<Self> {
        check(&config, source)?;
        if let Some((l, a)) = lora {
            check_adapter(&config, l, a)?;
        }
        let device = match opts.cuda {
            None => TDevice::Cpu,
            Some(n) => TDevice::Cuda(n),
        };
        let kind = if opts.bf16 { Kind::BFloat16 } else { Kind::Float };
        let mut expected = expected_params(&config);
        let n_base = expected.len();
        if let Some((l, _)) = lora {
            expected.extend(l.tensors(&config));
        }
        let names: Vec<String> = expected.iter().map(|(n, _)| n.clone()).collect();
        let layout = Layout::new(&config, &names);
        let decay = expected.iter().map(|(_, s)| s.len() >= 2).collect();
        let mut params = Vec::with_capacity(names.len());
        for (i, n) in names.iter().enumerate() {
            params.push(match lora {
                None => to_torch(&source.tensor(n)?, device)?.set_requires_grad(true),
                Some(_) if i < n_base => to_torch_as(&source.tensor(n)?, device, kind)?,
                Some((_, a)) => to_torch(&a.tensor(n)?, device)?.set_requires_grad(true),
            });
        }
        let inv_freq = config.inv_freq().into_iter().map(|f| f as f32).collect();
        Ok(TorchBackend {
            config,
            names,
            n_base,
            lora: lora.map(|(l, _)| l.clone()),
            decay,
            layout,
            inv_freq,
            device,
            kind,
            opts,
            optim,
            state: Mutex::new(State {
                grads: (0..params.len()).map(|_| None).collect(),
                masters: HashMap::new(),
                saved: None,
                reducer: None,
                params,
                m: Vec::new(),
                v: Vec::new(),
                steps: 0,
                pending: None,
            }),
            generation: AtomicU64::new(1),
            casts: Mutex::new((0, Vec::new())),
            cpu: candle_core::Device::Cpu,
            shard: None,
        })
    }

    /// Every parameter of decoder layer `li`: its projections, biases and
    /// norms, and its adapters where it has them.
    fn layer_params(&self, li: usize) -> Vec<usize> {
        let l = &self.layout.layers[li];
        let mut ids = vec![l.in_norm, l.q, l.k, l.v, l.o, l.post_norm, l.gate, l.up, l.down];
        ids.extend([l.q_b, l.k_b, l.v_b, l.o_b, l.q_norm, l.k_norm].into_iter().flatten());
        ids.extend(self.layout.adapters[li].iter().flatten().flat_map(|&(a, b)| [a, b]));
        ids
    }

    /// Whether parameter `i` learns.
    fn learns(&self, i: usize) -> bool {
        self.lora.is_none() || i >= self.n_base
    }

    /// Whether this rank keeps parameter `i`'s moments and steps it.
    fn steps_here(&self, i: usize) -> bool {
        self.learns(i) && self.shard.as_ref().is_none_or(|s| s.owner[i] == s.rank)
    }

    /// Whether parameter `i` learns but its f32 master is another rank's
    /// (this rank holds it in the compute kind).
    fn remote(&self, i: usize) -> bool {
        self.learns(i) && self.shard.as_ref().is_some_and(|s| s.masters && s.owner[i] != s.rank)
    }

    /// The parameters `ids` that learn, grouped by the rank that steps
    /// them (`owner[i]`), each group in the order given.
    fn by_owner(
        &self,
        owner: &[usize],
        ids: impl IntoIterator<Item = usize>,
    ) -> std::collections::BTreeMap<usize, Vec<usize>> {
        let mut runs: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for i in ids.into_iter().filter(|&i| self.learns(i)) {
            runs.entry(owner[i]).or_default().push(i);
        }
        runs
    }

    /// Parameter `i`'s accumulated f32 gradient (undefined before any).
    fn grad_of(&self, st: &State, i: usize) -> T {
        if self.remote(i) {
            st.grads[i].as_ref().map_or_else(T::new, T::shallow_clone)
        } else {
            st.params[i].grad()
        }
    }

    /// After a backward pass: each compute-kind parameter's gradient is
    /// added, in f32, to its f32 gradient, and dropped (what autograd does
    /// for a master through its cast, the cast's gradient taken to f32 and
    /// added to the master's).
    fn harvest(&self, st: &mut State) -> Result<()> {
        for i in 0..st.params.len() {
            if !self.remote(i) {
                continue;
            }
            let g = st.params[i].grad();
            if !g.defined() {
                continue;
            }
            let g = g.to_kind(Kind::Float);
            match &mut st.grads[i] {
                Some(acc) => {
                    let _ = acc.f_add_(&g).map_err(torch_err)?;
                }
                None => st.grads[i] = Some(g),
            }
            set_grad(&mut st.params[i], &mut T::new())?;
        }
        Ok(())
    }

    /// The f32 masters where this process has them (its own, and rank 0's
    /// gathered copies of the others'), else the weights it holds: what
    /// exports and checkpoints write.
    fn held_masters(&self, st: &State) -> Vec<T> {
        (0..st.params.len()).map(|i| st.masters.get(&i).unwrap_or(&st.params[i]).shallow_clone()).collect()
    }

    /// `x·Wᵀ (+ bias)` of projection `target` of layer `li`, plus its
    /// adapter's `s·(x·Aᵀ)·Bᵀ` where it has one (LoRA, Hu et al. 2021,
    /// eq. 3; the scale on the rank-r product, the smallest).
    fn proj(&self, p: &[T], x: &T, w: usize, bias: Option<usize>, li: usize, target: LoraTarget) -> T {
        let y = x.linear(&p[w], bias.map(|i| &p[i]));
        match (&self.lora, self.layout.adapters[li][target.index()]) {
            (Some(l), Some((a, b))) => y + (x.linear(&p[a], None::<&T>) * l.scale()).linear(&p[b], None::<&T>),
            _ => y,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The parameters in the compute kind: the masters themselves in f32
    /// (the graph reaches them), else their casts.
    fn compute_params(&self, params: &[T]) -> Vec<T> {
        params.iter().map(|p| if self.kind == Kind::Float { p.shallow_clone() } else { p.to_kind(self.kind) }).collect()
    }

    /// [`TorchBackend::ctx_over`] for a whole pass: the rows' attention
    /// masks, nothing cached.
    fn ctx(&self, attention: &candle_core::Tensor) -> Result<Ctx> {
        let rows: Vec<Vec<u8>> = attention
            .to_dtype(candle_core::DType::U32)?
            .to_vec2::<u32>()?
            .into_iter()
            .map(|r| r.into_iter().map(|x| u8::from(x != 0)).collect())
            .collect();
        self.ctx_over(&rows, 0)
    }

    /// Positions under left padding (a row's real tokens count from 0),
    /// the additive mask (causal, padding keys masked) and the RoPE tables
    /// of the new tokens after `past` cached columns, `full[r]` being row
    /// `r`'s mask over all of them: exactly as the candle model's
    /// `stack_ctx` builds them.
    fn ctx_over(&self, full: &[Vec<u8>], past: usize) -> Result<Ctx> {
        let (b, tk) = (full.len(), full.first().map_or(0, Vec::len));
        let t = tk - past;
        let half = self.inv_freq.len();
        let mut add = vec![0f32; b * t * tk];
        let mut cos = Vec::with_capacity(b * t * half);
        let mut sin = Vec::with_capacity(b * t * half);
        let scale = (1.0 / (self.config.head_dim() as f64).sqrt()) as f32;
        for (r, row) in full.iter().enumerate() {
            let mut n = row[..past].iter().filter(|&&x| x != 0).count();
            for i in 0..t {
                let p = n;
                if row[past + i] != 0 {
                    n += 1;
                }
                for (j, &m) in row.iter().enumerate() {
                    if j > past + i || m == 0 {
                        add[(r * t + i) * tk + j] = MASKED as f32;
                    }
                }
                for &f in &self.inv_freq {
                    let a = p as f32 * f;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        let (bi, ti, tki, hi) = (b as i64, t as i64, tk as i64, half as i64);
        let up = |v: &[f32], shape: &[i64]| -> Result<T> {
            T::f_from_slice(v)
                .and_then(|x| x.f_view(shape))
                .and_then(|x| x.f_to_device(self.device))
                .and_then(|x| x.f_to_kind(self.kind))
                .map_err(torch_err)
        };
        let scaled = |v: &[f32]| v.iter().map(|x| x * scale).collect::<Vec<f32>>();
        Ok(Ctx {
            b: bi,
            t: ti,
            keys: Keys::Mask(up(&add, &[bi, 1, ti, tki])?),
            cos_q: up(&scaled(&cos), &[bi, 1, ti, hi])?,
            sin_q: up(&scaled(&sin), &[bi, 1, ti, hi])?,
            cos: up(&cos, &[bi, 1, ti, hi])?,
            sin: up(&sin, &[bi, 1, ti, hi])?,
        })
    }

    /// The context of one packed row ([`crate::backend::batch::PackedSequences`]):
    /// each sequence's positions from 0, and its bounds for the attention.
    fn packed_ctx(&self, batch: &crate::backend::batch::PackedSequences) -> Result<Ctx> {
        let n = batch.positions.len() as i64;
        let half = self.inv_freq.len();
        let scale = (1.0 / (self.config.head_dim() as f64).sqrt()) as f32;
        let (mut cos, mut sin) = (Vec::with_capacity(n as usize * half), Vec::with_capacity(n as usize * half));
        for &p in &batch.positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let up = |v: &[f32]| -> Result<T> {
            T::f_from_slice(v)
                .and_then(|x| x.f_view([1, 1, n, half as i64]))
                .and_then(|x| x.f_to_device(self.device))
                .and_then(|x| x.f_to_kind(self.kind))
                .map_err(torch_err)
        };
        let scaled = |v: &[f32]| v.iter().map(|x| x * scale).collect::<Vec<f32>>();
        Ok(Ctx {
            b: 1,
            t: n,
            keys: Keys::Packed(batch.seqs.clone()),
            cos_q: up(&scaled(&cos))?,
            sin_q: up(&scaled(&sin))?,
            cos: up(&cos)?,
            sin: up(&sin)?,
        })
    }

    fn rms(&self, x: &T, w: &T) -> T {
        let d = *x.size().last().expect("a last dimension");
        x.rms_norm([d], Some(w), self.config.rms_norm_eps)
    }

    /// Rotate-half RoPE on `(B, H, W, D)`.
    fn rope(x: &T, cos: &T, sin: &T) -> T {
        let d = *x.size().last().expect("a last dimension");
        let (x1, x2) = (x.narrow(-1, 0, d / 2), x.narrow(-1, d / 2, d / 2));
        T::cat(&[&x1 * cos - &x2 * sin, &x2 * cos + &x1 * sin], -1)
    }

    fn embed(&self, p: &[T], ids: &T) -> T {
        let (b, w) = (ids.size()[0], ids.size()[1]);
        p[self.layout.embed].index_select(0, &ids.view([-1])).view([b * w, self.config.hidden_size as i64])
    }

    /// Decoder layer `li` on `x (B·T, hidden)`.
    fn layer(&self, p: &[T], li: usize, x: &T, c: &Ctx) -> T {
        self.layer_cached(p, li, x, c, None)
    }

    /// [`TorchBackend::layer`] for tokens after those in `cache`, whose
    /// keys and values it stores (decoding).
    fn layer_cached(&self, p: &[T], li: usize, x: &T, c: &Ctx, cache: Option<&mut TorchKv>) -> T {
        let cfg = &self.config;
        let l = &self.layout.layers[li];
        let (nh, nkv, hd) = (cfg.num_attention_heads as i64, cfg.kv_heads() as i64, cfg.head_dim() as i64);
        let h = self.rms(x, &p[l.in_norm]);
        let proj = |w: usize, bias: Option<usize>, heads: i64, t: LoraTarget| {
            self.proj(p, &h, w, bias, li, t).view([c.b, c.t, heads, hd])
        };
        let (mut q, mut k) = (proj(l.q, l.q_b, nh, LoraTarget::QProj), proj(l.k, l.k_b, nkv, LoraTarget::KProj));
        let v = proj(l.v, l.v_b, nkv, LoraTarget::VProj).transpose(1, 2);
        if let (Some(qn), Some(kn)) = (l.q_norm, l.k_norm) {
            q = self.rms(&q, &p[qn]);
            k = self.rms(&k, &p[kn]);
        }
        let q = Self::rope(&q.transpose(1, 2), &c.cos_q, &c.sin_q);
        let k = Self::rope(&k.transpose(1, 2), &c.cos, &c.sin);
        let (k, v) = match cache {
            Some(cache) => cache.push(li, &k, &v),
            None => (k, v),
        };
        let gqa = nkv != nh;
        let attn = match &c.keys {
            Keys::Mask(mask) => T::scaled_dot_product_attention(&q, &k, &v, Some(mask), 0.0, false, 1.0, gqa),
            // libtorch's attention a sequence at a time: its FlashAttention
            // varlen kernel (`_flash_attention_forward` with cumulative
            // lengths) is CUDA-only, outside tch's API and has no shared
            // prefix, so this is the portable form; the products outside
            // the attention run on the packed row whole. A response runs
            // behind its prompt's queries too, so one causal mask (no mask
            // tensor, the kernels' own) covers both; the prompt's rows are
            // dropped after. That recomputes the prompt's P²/2 scores once
            // per response, where a boolean mask of its L × (P + L) entries
            // (256 MB at 15k + 1k tokens) would stay in each layer's graph.
            Keys::Packed(seqs) => {
                let parts: Vec<T> = seqs
                    .iter()
                    .filter(|sq| sq.len > 0)
                    .map(|sq| {
                        let (c0, l, p0, pl) = (sq.start as i64, sq.len as i64, sq.prefix.0 as i64, sq.prefix.1 as i64);
                        let span = |x: &T| {
                            if pl == 0 {
                                x.narrow(2, c0, l)
                            } else {
                                T::cat(&[x.narrow(2, p0, pl), x.narrow(2, c0, l)], 2)
                            }
                        };
                        let out = T::scaled_dot_product_attention(
                            &span(&q),
                            &span(&k),
                            &span(&v),
                            None::<&T>,
                            0.0,
                            true,
                            1.0,
                            gqa,
                        );
                        out.narrow(2, pl, l)
                    })
                    .collect();
                T::cat(&parts, 2)
            }
        };
        let attn = attn.transpose(1, 2).contiguous().view([c.b * c.t, nh * hd]);
        let x = x + self.proj(p, &attn, l.o, l.o_b, li, LoraTarget::OProj);
        let h2 = self.rms(&x, &p[l.post_norm]);
        let gate = self.proj(p, &h2, l.gate, None, li, LoraTarget::GateProj);
        let up = self.proj(p, &h2, l.up, None, li, LoraTarget::UpProj);
        &x + self.proj(p, &(gate.silu() * up), l.down, None, li, LoraTarget::DownProj)
    }

    /// The final norm's rows that `scored` selects: those that predict the
    /// last `r` tokens `(B·r, hidden)`, or the packed rows `(S, hidden)`.
    fn tail_rows(&self, p: &[T], top: &T, c: &Ctx, scored: &Scored) -> T {
        let hsz = self.config.hidden_size as i64;
        let h = self.rms(top, &p[self.layout.norm]);
        match scored {
            Scored::Tail(r) => h.view([c.b, c.t, hsz]).narrow(1, c.t - r - 1, *r).contiguous().view([c.b * r, hsz]),
            Scored::Packed { rows, .. } => h.view([c.b * c.t, hsz]).index_select(0, rows),
        }
    }

    fn head_weight<'a>(&self, p: &'a [T]) -> &'a T {
        &p[self.layout.lm_head.unwrap_or(self.layout.embed)]
    }

    /// `(first row, rows)` of each chunk of the head over `n` rows.
    fn chunks(&self, n: i64) -> Vec<(i64, i64)> {
        let rows = (LOGITS_CHUNK / self.config.vocab_size).max(1) as i64;
        (0..n).step_by(rows as usize).map(|s| (s, rows.min(n - s))).collect()
    }

    /// Log-probs of `targets` (and entropies) under the head on `hs`, a
    /// chunk at a time, with whatever graph mode is on.
    fn head_values(&self, p: &[T], hs: &T, targets: &T, entropy: bool) -> (T, Option<T>) {
        let w = self.head_weight(p);
        let mut lps = Vec::new();
        let mut ents = Vec::new();
        for (s, n) in self.chunks(hs.size()[0]) {
            let logits = hs.narrow(0, s, n).linear(w, None::<&T>).to_kind(Kind::Float);
            let lsm = logits.log_softmax(-1, Kind::Float);
            lps.push(lsm.gather(-1, &targets.narrow(0, s, n).unsqueeze(-1), false).squeeze_dim(-1));
            if entropy {
                ents.push(-(lsm.exp() * &lsm).sum_dim_intlist(-1, false, Kind::Float));
            }
        }
        let ent = entropy.then(|| T::cat(&ents, 0));
        (T::cat(&lps, 0), ent)
    }

    /// The stack up to the head's rows: with a graph (`keep` = false), or
    /// without one keeping each layer's input (`keep`).
    fn stack(&self, p: &[T], ids: &T, c: &Ctx, scored: &Scored, keep: bool) -> (T, Vec<T>) {
        let mut x = self.embed(p, ids);
        let mut inputs = Vec::new();
        for li in 0..self.layout.layers.len() {
            if keep {
                inputs.push(x.shallow_clone());
            }
            x = self.layer(p, li, &x, c);
        }
        let hs = self.tail_rows(p, &x, c, scored);
        if keep {
            inputs.push(x);
        }
        (hs, inputs)
    }

    /// Token ids, targets, the context and the scored rows of a padded or
    /// packed micro-batch.
    fn inputs(&self, batch: &MicroBatch) -> Result<(T, T, Ctx, Scored)> {
        let (ids, attention) = match &batch.inputs {
            Inputs::Padded { ids, attention } => (ids, attention),
            Inputs::Packed(packed) => {
                let ids = ids_to_torch(&packed.ids, self.device)?;
                let c = self.packed_ctx(packed)?;
                let targets = ids_to_torch(&packed.targets, self.device)?;
                let rows = ids_to_torch(&packed.scored, self.device)?.to_kind(Kind::Int64);
                let (b, r) = (batch.mask.dim(0)?, batch.tail);
                return Ok((ids, targets, c, Scored::Packed { rows, packed: packed.clone(), b, r }));
            }
            Inputs::Prefixed(_) => {
                return Err(ModelError::Torch(
                    "the torch backend takes padded rows or packed sequences, not shared prompts \
                     (share_prompt_prefix = false)"
                        .into(),
                ))
            }
        };
        let r = batch.tail as i64;
        let w = ids.dim(1)? as i64;
        if r == 0 || r >= w {
            return Err(ModelError::Torch(format!("tail length {r} must be in 1..{w} for width {w}")));
        }
        let ids = ids_to_torch(ids, self.device)?;
        let c = self.ctx(attention)?;
        let targets = ids.narrow(1, w - r, r).reshape([-1]);
        Ok((ids, targets, c, Scored::Tail(r)))
    }

    /// A `(B, R)` f32 candle tensor of the backend's values.
    fn values(&self, t: &T, b: i64, r: i64) -> Result<candle_core::Tensor> {
        to_candle(&t.view([b, r]))
    }

    /// The head's values for `scored` rows as a `(B, R)` f32 candle tensor
    /// (0 at a packed micro-batch's padding slots).
    fn scored_values(&self, t: &T, c: &Ctx, scored: &Scored) -> Result<candle_core::Tensor> {
        match scored {
            Scored::Tail(r) => self.values(t, c.b, *r),
            Scored::Packed { packed, b, r, .. } => Ok(packed.to_tail(&to_candle(t)?, *b, *r)?),
        }
    }

    /// A loss's gradient `(B, R)` as the scored rows' `(B·R,)` or `(S,)`.
    fn scored_grad(&self, g: &candle_core::Tensor, scored: &Scored) -> Result<T> {
        match scored {
            Scored::Tail(_) => Ok(to_torch(g, self.device)?.view([-1])),
            Scored::Packed { packed, .. } => to_torch(&packed.from_tail(g)?, self.device),
        }
    }

    /// Marks the weights changed: the inference casts are stale.
    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The weights in the compute kind, without a graph, cast once per
    /// change of the weights.
    fn inference_params(&self, st: &State) -> Vec<T> {
        if self.kind == Kind::Float {
            return st.params.iter().map(T::detach).collect();
        }
        let now = self.generation.load(Ordering::SeqCst);
        let mut casts = self.casts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if casts.0 != now {
            *casts = (now, tch::no_grad(|| st.params.iter().map(|p| p.detach().to_kind(self.kind)).collect()));
        }
        casts.1.iter().map(T::shallow_clone).collect()
    }

    /// AdamW's moments, made at first use for the parameters this rank
    /// steps (the others get empty placeholders): read from a loaded
    /// checkpoint's mapped file ([`Backend::load_optimizer`]), else zeros.
    fn ensure_moments(&self, st: &mut State) -> Result<()> {
        if !st.m.is_empty() {
            return Ok(());
        }
        let saved = st.saved.take();
        let moment = |(i, p): (usize, &T), pre: &str| -> Result<T> {
            if !self.steps_here(i) {
                return T::f_zeros([0], (Kind::Float, self.device)).map_err(torch_err);
            }
            let Some(Saved { file, path }) = &saved else { return p.f_zeros_like().map_err(torch_err) };
            let err = |m: String| ModelError::Format { path: path.clone(), message: m };
            let name = format!("{pre}.{}", self.names[i]);
            let view = file.get(&name).map_err(|e| err(format!("`{name}`: {e}")))?;
            T::f_from_data_size(view.data(), &p.size(), Kind::Float)
                .and_then(|t| t.f_to_device(self.device))
                .map_err(|e| err(format!("`{name}`: {e}")))
        };
        st.m = st.params.iter().enumerate().map(|ip| moment(ip, "m")).collect::<Result<Vec<_>>>()?;
        st.v = st.params.iter().enumerate().map(|ip| moment(ip, "v")).collect::<Result<Vec<_>>>()?;
        Ok(())
    }

    /// The model's weights as f32 under Hugging Face names; with adapters,
    /// merged into the base (`W + s·B·A`, in f32 on the device).
    fn export_from(&self, params: &[T], version: u64) -> Result<Weights> {
        let mut merged: HashMap<usize, (usize, usize)> = HashMap::new();
        for (li, l) in self.layout.layers.iter().enumerate() {
            for t in LoraTarget::ALL {
                if let Some(ab) = self.layout.adapters[li][t.index()] {
                    merged.insert(l.weight(t), ab);
                }
            }
        }
        let scale = self.lora.as_ref().map_or(0.0, LoraConfig::scale);
        let tensors = tch::no_grad(|| {
            self.names[..self.n_base]
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let w = params[i].detach().to_kind(Kind::Float);
                    let w = match merged.get(&i) {
                        // Rank 0's gathered copies of other ranks' adapters
                        // are in host memory; the base is on the device.
                        Some(&(a, b)) => {
                            let on = |t: &T| t.detach().to_device(w.device());
                            &w + on(&params[b]).matmul(&on(&params[a])) * scale
                        }
                        None => w,
                    };
                    Ok((n.clone(), to_candle(&w)?))
                })
                .collect::<Result<HashMap<_, _>>>()
        })?;
        Ok(Weights::new(version, tensors))
    }
}

impl Policy for TorchBackend {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn device(&self) -> &candle_core::Device {
        &self.cpu
    }

    fn describe(&self) -> String {
        let dev = match self.opts.cuda {
            None => format!("cpu ({} threads)", tch::get_num_threads()),
            Some(n) => format!("cuda:{n}"),
        };
        let kind = if self.opts.bf16 { "bf16" } else { "f32" };
        format!("torch {dev} {kind}")
    }

    fn packs_sequences(&self) -> bool {
        true
    }

    fn score(&self, batch: &MicroBatch) -> Result<candle_core::Tensor> {
        guarded("torch score", || {
            let (ids, targets, c, scored) = self.inputs(batch)?;
            let st = self.lock();
            // The casts decoding uses: made once per change of the weights,
            // not once per scored micro-batch.
            let p = self.inference_params(&st);
            let lp = tch::no_grad(|| {
                let (hs, _) = self.stack(&p, &ids, &c, &scored, false);
                self.head_values(&p, &hs, &targets, false).0
            });
            self.scored_values(&lp, &c, &scored)
        })
    }

    fn generate(
        &self,
        tok: &Tokenizer,
        requests: &[GenerationRequest],
        cfg: &SamplingConfig,
    ) -> crate::sample::Result<Vec<Generation>> {
        crate::sample::generate(self, tok, requests, cfg)
    }

    fn export(&self, version: u64) -> Result<Weights> {
        let st = self.lock();
        guarded("torch export", || self.export_from(&self.held_masters(&st), version))
    }

    fn save_weights(&self, path: &Path, version: u64) -> Result<()> {
        if self.lora.is_some() {
            // Merged weights are new tensors: export makes them.
            return self.export(version)?.save_safetensors(path);
        }
        // The f32 masters themselves (and rank 0's host copies of the
        // others'), each copied to host as the file is written: no whole
        // f32 copy of the model forms (≈ 32 GB for an 8B model).
        let st = self.lock();
        let held = self.held_masters(&st);
        let named: Vec<(String, T)> = (0..self.n_base)
            .map(|i| {
                let t = held[i].detach();
                (self.names[i].clone(), if t.kind() == Kind::Float { t } else { t.to_kind(Kind::Float) })
            })
            .collect();
        guarded("torch weights", || {
            T::write_safetensors(&named, path)
                .map_err(|e| ModelError::Format { path: path.to_path_buf(), message: e.to_string() })
        })?;
        crate::model::save::readable(path)
    }

    fn load(&self, weights: &dyn TensorSource) -> Result<()> {
        let mut st = self.lock();
        guarded("torch load", || {
            let expected: Vec<(String, Vec<usize>)> = (self.names[..self.n_base].iter().zip(&st.params))
                .map(|(n, p)| (n.clone(), p.size().iter().map(|&d| d as usize).collect()))
                .collect();
            super::check_fits(weights, &expected)?;
            for (i, n) in self.names[..self.n_base].iter().enumerate() {
                let src = to_torch(&weights.tensor(n)?, self.device)?;
                tch::no_grad(|| st.params[i].f_copy_(&src)).map_err(torch_err)?;
            }
            Ok(())
        })?;
        st.masters.clear();
        self.changed();
        Ok(())
    }

    fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    fn export_adapter(&self) -> Result<Option<HashMap<String, candle_core::Tensor>>> {
        if self.lora.is_none() {
            return Ok(None);
        }
        let st = self.lock();
        let held = self.held_masters(&st);
        guarded("torch export adapter", || {
            (self.n_base..self.names.len())
                .map(|i| Ok((self.names[i].clone(), to_candle(&held[i].detach().to_kind(Kind::Float))?)))
                .collect::<Result<HashMap<_, _>>>()
                .map(Some)
        })
    }

    fn load_adapter(&self, source: &dyn TensorSource) -> Result<()> {
        let lora = self.lora.as_ref().ok_or_else(|| ModelError::Spec {
            field: "lora".into(),
            message: "this model has no adapters to load into".into(),
        })?;
        check_adapter(&self.config, lora, source)?;
        let mut st = self.lock();
        guarded("torch load adapter", || {
            for i in self.n_base..self.names.len() {
                let src = to_torch(&source.tensor(&self.names[i])?, self.device)?;
                tch::no_grad(|| st.params[i].f_copy_(&src)).map_err(torch_err)?;
            }
            Ok(())
        })?;
        st.masters.clear();
        self.changed();
        Ok(())
    }
}

impl Backend for TorchBackend {
    fn forward(&mut self, batch: &MicroBatch, entropy: bool) -> Result<Forward> {
        if entropy && self.opts.checkpointing {
            return Err(ModelError::Torch(
                "the entropy bonus is not checkpointed (activation_checkpointing needs entropy_coef = 0)".into(),
            ));
        }
        guarded("torch forward", || {
            let (ids, targets, c, scored) = self.inputs(batch)?;
            let mut st = self.lock();
            let p = if self.opts.checkpointing {
                tch::no_grad(|| self.compute_params(&st.params))
            } else {
                self.compute_params(&st.params)
            };
            let (hs, inputs) = if self.opts.checkpointing {
                tch::no_grad(|| self.stack(&p, &ids, &c, &scored, true))
            } else {
                self.stack(&p, &ids, &c, &scored, false)
            };
            let (lp, ent) = tch::no_grad(|| self.head_values(&p, &hs.detach(), &targets, entropy));
            let out = Forward {
                logp: self.scored_values(&lp, &c, &scored)?,
                entropy: ent.as_ref().map(|e| self.scored_values(e, &c, &scored)).transpose()?,
            };
            st.pending = Some(Pending { hs, inputs, ctx: c, ids, targets, scored, entropy });
            Ok(out)
        })
    }

    fn backward(&mut self, dlogp: &candle_core::Tensor, dentropy: Option<&candle_core::Tensor>) -> Result<()> {
        guarded("torch backward", || {
            let mut st = self.lock();
            let pend = st.pending.take().ok_or_else(|| ModelError::Torch("backward without a forward".into()))?;
            let g_lp = self.scored_grad(dlogp, &pend.scored)?;
            let g_ent = match (pend.entropy, dentropy) {
                (true, Some(d)) => Some(self.scored_grad(d, &pend.scored)?),
                _ => None,
            };
            let p = self.compute_params(&st.params);
            // The head, chunk by chunk, from its input rows as a leaf.
            let hs_leaf = pend.hs.detach().set_requires_grad(true);
            let w = self.head_weight(&p);
            for (s, n) in self.chunks(hs_leaf.size()[0]) {
                let logits = hs_leaf.narrow(0, s, n).linear(w, None::<&T>).to_kind(Kind::Float);
                let lsm = logits.log_softmax(-1, Kind::Float);
                let lp = lsm.gather(-1, &pend.targets.narrow(0, s, n).unsqueeze(-1), false).squeeze_dim(-1);
                let mut seed = (lp * g_lp.narrow(0, s, n)).sum(Kind::Float);
                if let Some(ge) = &g_ent {
                    let ent = -(lsm.exp() * &lsm).sum_dim_intlist(-1, false, Kind::Float);
                    seed += (ent * ge.narrow(0, s, n)).sum(Kind::Float);
                }
                seed.backward();
                self.harvest(&mut st)?;
            }
            let g_hs = hs_leaf.grad();
            if pend.inputs.is_empty() {
                // Back through the stack's own graph.
                (&pend.hs * &g_hs).sum(Kind::Float).backward();
                self.harvest(&mut st)?;
            } else {
                // Checkpointed: the final norm, then one layer at a time.
                let mut inputs = pend.inputs;
                let top = inputs.pop().expect("the last layer's output").set_requires_grad(true);
                let hs = self.tail_rows(&p, &top, &pend.ctx, &pend.scored);
                (hs * &g_hs).sum(Kind::Float).backward();
                self.harvest(&mut st)?;
                let mut g = top.grad();
                drop(top);
                let units = if st.reducer.is_some() { self.backward_units() } else { Vec::new() };
                // Each layer's saved input is dropped once its backward is
                // done, and under ZeRO-2 its gradients go to their owners
                // at once: no whole gradient set forms.
                let mut li = inputs.len();
                while let Some(saved) = inputs.pop() {
                    li -= 1;
                    let x = saved.detach().set_requires_grad(true);
                    drop(saved);
                    let y = self.layer(&p, li, &x, &pend.ctx);
                    (y * &g).sum(Kind::Float).backward();
                    self.harvest(&mut st)?;
                    g = x.grad();
                    if let Some(unit) = units.get(self.layout.layers.len() - 1 - li) {
                        self.reduce_now(&mut st, unit)?;
                    }
                }
                // A frozen embedding (a LoRA base) has nothing to learn.
                if self.learns(self.layout.embed) {
                    let x0 = self.embed(&p, &pend.ids);
                    (x0 * &g).sum(Kind::Float).backward();
                    self.harvest(&mut st)?;
                }
                if let Some(rest) = units.last() {
                    self.reduce_now(&mut st, rest)?;
                }
            }
            Ok(())
        })
    }

    fn sharding(&mut self) -> Option<&mut dyn super::Sharding> {
        Some(self)
    }

    fn grad_norm(&self) -> Result<f64> {
        let st = self.lock();
        guarded("torch grad_norm", || {
            let mut sq = 0.0f64;
            for i in 0..st.params.len() {
                let g = self.grad_of(&st, i);
                if g.defined() {
                    sq += g.pow_tensor_scalar(2).sum(Kind::Float).to_kind(Kind::Double).double_value(&[]);
                }
            }
            Ok(sq.sqrt())
        })
    }

    fn step(&mut self, grad_scale: f64) -> Result<f64> {
        let lr = {
            let mut st = self.lock();
            let st = &mut *st;
            self.ensure_moments(st)?;
            let o = self.optim;
            let lr = o.lr_at(st.steps);
            st.steps += 1;
            let steps = st.steps;
            guarded("torch AdamW", || {
                tch::no_grad(|| -> Result<()> {
                    let dev = self.device;
                    let up = |x: f32| T::f_from_slice(&[x]).and_then(|t| t.f_to_device(dev)).map_err(torch_err);
                    // The step count after this step, as the fused kernel's
                    // bias corrections read it (PyTorch's `state["step"]`).
                    let mut step_t = up(steps as f32)?;
                    // The clipping factor as the kernel takes it: gradients
                    // are divided by `grad_scale` (AMP's unscaling).
                    let mut inv = if grad_scale == 1.0 { None } else { Some(up((1.0 / grad_scale) as f32)?) };
                    // Two parameter groups: matrices decay, vectors do not.
                    for decay in [true, false] {
                        let idx: Vec<usize> = (0..st.params.len())
                            .filter(|&i| self.decay[i] == decay && self.steps_here(i) && st.params[i].grad().defined())
                            .collect();
                        if idx.is_empty() {
                            continue;
                        }
                        let wd = if decay { o.weight_decay } else { 0.0 };
                        let mut grads: Vec<T> = idx.iter().map(|&i| st.params[i].grad()).collect();
                        let ptr = |t: &mut T| t.as_mut_ptr().cast::<std::ffi::c_void>();
                        let mut p: Vec<_> = Vec::with_capacity(idx.len());
                        let (mut m, mut v) = (Vec::with_capacity(idx.len()), Vec::with_capacity(idx.len()));
                        for &i in &idx {
                            p.push(st.params[i].as_mut_ptr().cast::<std::ffi::c_void>());
                            m.push(st.m[i].as_mut_ptr().cast::<std::ffi::c_void>());
                            v.push(st.v[i].as_mut_ptr().cast::<std::ffi::c_void>());
                        }
                        let mut g: Vec<_> = grads.iter_mut().map(ptr).collect();
                        shim("fused AdamW", |err, len| {
                            // SAFETY: every pointer is a live tch tensor
                            // handle (`torch::Tensor *`) held for the call's
                            // length; the shim copies the handles and catches
                            // every C++ exception.
                            unsafe {
                                r2vpo_fused_adamw(
                                    p.as_mut_ptr(),
                                    g.as_mut_ptr(),
                                    m.as_mut_ptr(),
                                    v.as_mut_ptr(),
                                    ptr(&mut step_t),
                                    idx.len() as std::ffi::c_int,
                                    lr,
                                    o.beta1,
                                    o.beta2,
                                    wd,
                                    o.eps,
                                    inv.as_mut().map_or(std::ptr::null_mut(), ptr),
                                    err,
                                    len,
                                )
                            }
                        })?;
                    }
                    Ok(())
                })
            })?;
            st.masters.clear();
            lr
        };
        self.zero_grad();
        self.changed();
        Ok(lr)
    }

    fn zero_grad(&mut self) {
        let mut st = self.lock();
        for p in st.params.iter_mut() {
            p.zero_grad();
        }
        st.grads.iter_mut().for_each(|g| *g = None);
        st.pending = None;
    }

    fn gradients(&self) -> Result<HashMap<String, candle_core::Tensor>> {
        let st = self.lock();
        guarded("torch gradients", || {
            let mut out = HashMap::new();
            for (i, n) in self.names.iter().enumerate() {
                let g = self.grad_of(&st, i);
                if g.defined() {
                    out.insert(n.clone(), to_candle(&g)?);
                }
            }
            Ok(out)
        })
    }

    fn optimizer_steps(&self) -> u64 {
        self.lock().steps
    }

    fn save_optimizer(&self, path: &Path) -> Result<()> {
        if self.shard.is_some() {
            return Err(ModelError::Spec {
                field: "dist.zero_stage".into(),
                message: "the optimizer state is sharded over the ranks: every rank writes its share through \
                          Sharding::write_optimizer"
                    .into(),
            });
        }
        let mut st = self.lock();
        self.ensure_moments(&mut st)?;
        // libtorch's safetensors writer copies one tensor at a time to host
        // while the file is written: no second copy of the state forms.
        let mut named: Vec<(String, T)> = Vec::new();
        for (i, n) in self.names.iter().enumerate().filter(|&(i, _)| self.learns(i)) {
            named.push((format!("m.{n}"), st.m[i].shallow_clone()));
            named.push((format!("v.{n}"), st.v[i].shallow_clone()));
        }
        guarded("torch optimizer state", || {
            T::write_safetensors(&named, path)
                .map_err(|e| ModelError::Format { path: path.to_path_buf(), message: e.to_string() })
        })
    }

    fn synchronize(&self) -> Result<()> {
        if let Some(n) = self.opts.cuda {
            tch::Cuda::synchronize(n as i64);
        }
        Ok(())
    }

    fn load_optimizer(&mut self, path: &Path, steps: u64) -> Result<()> {
        let err = |m: String| ModelError::Format { path: path.to_path_buf(), message: m };
        // Mapped, not read: every name and shape is checked here from the
        // header, and each tensor is read when its owner first needs it
        // (`ensure_moments`, after a data-parallel job has dealt the
        // shards), so a rank reads only the moments it steps.
        let file = unsafe { candle_core::safetensors::MmapedSafetensors::new(path) }.map_err(|e| err(e.to_string()))?;
        let mut st = self.lock();
        for (i, n) in self.names.iter().enumerate().filter(|&(i, _)| self.learns(i)) {
            let want: Vec<usize> = st.params[i].size().iter().map(|&d| d as usize).collect();
            for pre in ["m", "v"] {
                let name = format!("{pre}.{n}");
                let t = file.get(&name).map_err(|_| err(format!("missing `{name}`")))?;
                if t.shape() != want.as_slice() {
                    return Err(err(format!("`{name}` has shape {:?}, model has {want:?}", t.shape())));
                }
                if t.dtype() != safetensors::Dtype::F32 {
                    return Err(err(format!("`{name}` is {:?}; optimizer moments are F32", t.dtype())));
                }
            }
        }
        st.m.clear();
        st.v.clear();
        st.saved = Some(Saved { file, path: path.to_path_buf() });
        st.steps = steps;
        Ok(())
    }
}
