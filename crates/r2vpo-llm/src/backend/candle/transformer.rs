//! The config-driven decoder (Llama / Qwen2 / Qwen3) with trainable weights
//! in a candle `VarMap` under Hugging Face names.
//!
//! Batches are LEFT-padded: `attention_mask` is 1 for real tokens and 0 for
//! padding, positions count real tokens per row (as Hugging Face's
//! `cumsum(mask) - 1`), and padded keys are masked with −1e9 (not −inf, so a
//! fully masked padding query row stays finite instead of NaN).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;

use super::ops;
pub use crate::backend::batch::{PackedSequences, PrefixedRows};
use crate::model::lora::{check_adapter, merged, peft_name, Factor, LoraConfig, LoraTarget};
use crate::model::source::{check, NamedTensors, RandomInit, TensorSource};
use crate::model::{expected_params, ModelConfig, ModelError, Result};

/// Logit elements per chunk of the checkpointed head: 64 MiB of f32, ≈ 340
/// rows of SmolLM2's 49 152-token vocabulary, 110 of Qwen3's 151 936.
const DEFAULT_LOGITS_CHUNK: usize = 16 << 20;

/// Additive mask value for keys a query must not see.
const MASKED: f64 = -1e9;

/// One decoder layer's weights (HF shapes: linear weights are `(out, in)`).
#[derive(Clone)]
struct Layer {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    q_b: Option<Tensor>,
    k_b: Option<Tensor>,
    v_b: Option<Tensor>,
    o_b: Option<Tensor>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    in_norm: Tensor,
    post_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    /// Low-rank adapters `(A, B)` by [`LoraTarget::index`], where the
    /// model has them ([`Transformer::with_adapters`]).
    adapters: [Option<(Tensor, Tensor)>; 7],
}

impl Layer {
    /// Every weight of the layer.
    fn tensors(&self) -> Vec<&Tensor> {
        let opt = [&self.q_b, &self.k_b, &self.v_b, &self.o_b, &self.q_norm, &self.k_norm];
        [&self.q, &self.k, &self.v, &self.o, &self.in_norm, &self.post_norm, &self.gate, &self.up, &self.down]
            .into_iter()
            .chain(opt.into_iter().flatten())
            .collect()
    }

    /// The layer's weights that learn: its adapters where the model has
    /// them, else every weight.
    fn trainable(&self, adapted: bool) -> Vec<&Tensor> {
        if adapted {
            self.adapters.iter().flatten().flat_map(|(a, b)| [a, b]).collect()
        } else {
            self.tensors()
        }
    }
}

/// All weights, either the `Var`s themselves (training) or detached handles
/// sharing their storage (inference: no graph is recorded).
#[derive(Clone)]
struct Params {
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    /// `None` when tied to `embed`.
    lm_head: Option<Tensor>,
}

impl Params {
    /// `f` applied to every weight, `fa` to every adapter factor.
    fn map(
        &self,
        f: &impl Fn(&Tensor) -> candle_core::Result<Tensor>,
        fa: &impl Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Params> {
        let o = |t: &Option<Tensor>| t.as_ref().map(f).transpose();
        let ad = |l: &Layer| -> candle_core::Result<[Option<(Tensor, Tensor)>; 7]> {
            let mut out: [Option<(Tensor, Tensor)>; 7] = Default::default();
            for (slot, a) in out.iter_mut().zip(&l.adapters) {
                *slot = a.as_ref().map(|(a, b)| Ok::<_, candle_core::Error>((fa(a)?, fa(b)?))).transpose()?;
            }
            Ok(out)
        };
        Ok(Params {
            embed: f(&self.embed)?,
            layers: self
                .layers
                .iter()
                .map(|l| {
                    Ok(Layer {
                        q: f(&l.q)?,
                        k: f(&l.k)?,
                        v: f(&l.v)?,
                        o: f(&l.o)?,
                        q_b: o(&l.q_b)?,
                        k_b: o(&l.k_b)?,
                        v_b: o(&l.v_b)?,
                        o_b: o(&l.o_b)?,
                        q_norm: o(&l.q_norm)?,
                        k_norm: o(&l.k_norm)?,
                        in_norm: f(&l.in_norm)?,
                        post_norm: f(&l.post_norm)?,
                        gate: f(&l.gate)?,
                        up: f(&l.up)?,
                        down: f(&l.down)?,
                        adapters: ad(l)?,
                    })
                })
                .collect::<candle_core::Result<_>>()?,
            norm: f(&self.norm)?,
            lm_head: o(&self.lm_head)?,
        })
    }
}

/// Per-layer key/value cache for batched incremental decoding. Each row
/// keeps its own attention mask and next position, so rows of a left-padded
/// batch (or rows that feed padding after finishing) decode together.
///
/// Keys and values live in buffers `(B, kv heads, capacity, head dim)` whose
/// first [`KvCache::len`] columns are filled: a decode step writes its one
/// new column in place and attends to a view, instead of copying the whole
/// cache into a one-longer tensor per layer per step (that copy was 8 % of
/// decode time at batch 32). Capacity doubles when full, unless the cache
/// was made for a known length ([`KvCache::with_capacity`]). A pass whose keys
/// carry a gradient (the learner's shared-prefix path) concatenates
/// instead, since an in-place write would cut the graph.
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Per row: 1 for each cached real token, 0 for padding.
    mask: Vec<Vec<u8>>,
    /// Per row `(s, l)`: its first `l` columns hold what row `s`'s do, in
    /// every layer (`(row, 0)`: nothing shared). Rows replicated from one
    /// prefill (a GRPO group's samples) share their prompt. The buffers
    /// still hold every row's own copy, so the values never depend on this;
    /// the decode attention reads the shared columns from row `s`, where a
    /// batch's samples of one prompt then read them from memory once
    /// instead of once each ([`ops::attention_no_grad`]).
    shared: Vec<(usize, usize)>,
    /// Columns to allocate at once (0: grow by doubling).
    reserve: usize,
}

impl KvCache {
    /// An empty cache for `batch` rows.
    pub fn new(model: &Transformer, batch: usize) -> Self {
        Self::with_capacity(model, batch, 0)
    }

    /// An empty cache for `batch` rows that allocates room for `tokens`
    /// columns (prompt width plus new tokens) at its first write, so a
    /// decode of known length never regrows. Each regrowth copied the cache
    /// into fresh pages the kernel zero-fills: at batch 32 (44-token prompts,
    /// 128 new tokens) perf put 1.5 % of decode samples in page zeroing and
    /// 1.5 % in copies, 1.1 % after; tokens/s moved less than run-to-run
    /// noise. It still grows past `tokens` if asked to.
    pub fn with_capacity(model: &Transformer, batch: usize, tokens: usize) -> Self {
        KvCache {
            layers: vec![None; model.config.num_hidden_layers],
            mask: vec![Vec::new(); batch],
            shared: (0..batch).map(|r| (r, 0)).collect(),
            reserve: tokens,
        }
    }

    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        self.mask.len()
    }

    /// Tokens cached so far (padding included), the same for every row.
    pub fn len(&self) -> usize {
        self.mask.first().map_or(0, Vec::len)
    }

    /// Whether nothing has been cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the given rows, in the given order (drop finished
    /// sequences, or repeat a prompt's prefill for several samples).
    pub fn select_rows(&mut self, rows: &[usize]) -> Result<()> {
        if let Some(&bad) = rows.iter().find(|&&r| r >= self.batch()) {
            return Err(candle_core::Error::Msg(format!(
                "row {bad} out of range for a cache of {} rows",
                self.batch()
            ))
            .into());
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        for layer in self.layers.iter_mut().flatten() {
            let dev = layer.0.device().clone();
            let idx = Tensor::new(idx.as_slice(), &dev)?;
            // Whole buffers (the capacity is kept): index_select wants them contiguous.
            *layer = (layer.0.contiguous()?.index_select(&idx, 0)?, layer.1.contiguous()?.index_select(&idx, 0)?);
        }
        self.mask = rows.iter().map(|&r| self.mask[r].clone()).collect();
        self.shared = select_shared(&self.shared, rows, self.len());
        Ok(())
    }

    /// The next position of each row (its count of real tokens so far).
    pub fn positions(&self) -> Vec<usize> {
        self.mask.iter().map(|m| m.iter().filter(|&&x| x != 0).count()).collect()
    }

    /// Appends the rows of `other` below this cache's rows (continuous
    /// batching: sequences prefilled separately join a running batch). The
    /// shorter of the two is padded on the left with masked columns, so
    /// every row keeps its own positions and attends to exactly its own
    /// tokens; masked keys get an additive −1e9 and so an attention weight
    /// of exactly 0 in f32.
    pub fn append_rows(&mut self, other: KvCache) -> Result<()> {
        if self.batch() == 0 {
            *self = other;
            return Ok(());
        }
        if other.batch() == 0 {
            return Ok(());
        }
        if self.layers.len() != other.layers.len() {
            return Err(candle_core::Error::Msg("caches of different models".into()).into());
        }
        let (a, b) = (self.len(), other.len());
        let width = a.max(b);
        let pad_left = |t: &Tensor, by: usize| -> Result<Tensor> {
            if by == 0 {
                return Ok(t.clone());
            }
            let (rows, heads, _, dim) = t.dims4()?;
            let z = Tensor::zeros((rows, heads, by, dim), t.dtype(), t.device())?;
            Ok(Tensor::cat(&[&z, t], 2)?)
        };
        for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
            match (mine.take(), theirs) {
                (Some((k1, v1)), Some((k2, v2))) => {
                    let (k1, v1) = (k1.narrow(2, 0, a)?, v1.narrow(2, 0, a)?);
                    let (k2, v2) = (k2.narrow(2, 0, b)?, v2.narrow(2, 0, b)?);
                    let k = Tensor::cat(&[&pad_left(&k1, width - a)?, &pad_left(&k2, width - b)?], 0)?;
                    let v = Tensor::cat(&[&pad_left(&v1, width - a)?, &pad_left(&v2, width - b)?], 0)?;
                    *mine = Some((k, v));
                }
                _ => return Err(candle_core::Error::Msg("append_rows needs two filled caches".into()).into()),
            }
        }
        // Both sides' rows move right by their padding, whose zeros they
        // share as well.
        let (rows_a, pad_a, pad_b) = (self.batch(), width - a, width - b);
        let shift =
            |(s, l): (usize, usize), at: usize, pad: usize| if l == 0 { (s + at, 0) } else { (s + at, l + pad) };
        self.shared = (self.shared.iter().map(|&x| shift(x, 0, pad_a)))
            .chain(other.shared.iter().map(|&x| shift(x, rows_a, pad_b)))
            .collect();
        for m in &mut self.mask {
            m.splice(0..0, std::iter::repeat_n(0u8, width - a));
        }
        self.mask.extend(other.mask.into_iter().map(|mut m| {
            m.splice(0..0, std::iter::repeat_n(0u8, width - b));
            m
        }));
        Ok(())
    }

    /// Drops the leading columns that are padding in every row (left behind
    /// when the longest sequences finish), so attention stops paying for
    /// them. Changes no row's result.
    pub fn trim_padding(&mut self) -> Result<()> {
        let lead = self.mask.iter().map(|m| m.iter().take_while(|&&x| x == 0).count()).min().unwrap_or(0);
        if lead == 0 {
            return Ok(());
        }
        let keep = self.len() - lead;
        for layer in self.layers.iter_mut().flatten() {
            *layer = (layer.0.narrow(2, lead, keep)?.contiguous()?, layer.1.narrow(2, lead, keep)?.contiguous()?);
        }
        for m in &mut self.mask {
            m.drain(..lead);
        }
        for (r, x) in self.shared.iter_mut().enumerate() {
            *x = if x.1 > lead { (x.0, x.1 - lead) } else { (r, 0) };
        }
        Ok(())
    }

    /// Stores layer `li`'s keys and values `(B, heads, T, D)` for the `T`
    /// new tokens after `past` cached ones, and returns the keys and values
    /// of all `past + T` tokens.
    fn push(&mut self, li: usize, k: Tensor, v: Tensor, past: usize) -> Result<(Tensor, Tensor)> {
        let slot = &mut self.layers[li];
        if k.track_op() || v.track_op() {
            let kv = match slot.take() {
                Some((pk, pv)) => {
                    (Tensor::cat(&[&pk.narrow(2, 0, past)?, &k], 2)?, Tensor::cat(&[&pv.narrow(2, 0, past)?, &v], 2)?)
                }
                None => (k, v),
            };
            *slot = Some(kv.clone());
            return Ok(kv);
        }
        let need = past + k.dim(2)?;
        if slot.as_ref().is_none_or(|(bk, _)| bk.dim(2).is_ok_and(|cap| cap < need)) {
            let (b, h, _, d) = k.dims4()?;
            let cap = if self.reserve >= need { self.reserve } else { (2 * need).max(64) };
            let nk = Tensor::zeros((b, h, cap, d), k.dtype(), k.device())?;
            let nv = Tensor::zeros((b, h, cap, d), v.dtype(), v.device())?;
            if let Some((pk, pv)) = slot.take() {
                if past > 0 {
                    nk.slice_set(&pk.narrow(2, 0, past)?.contiguous()?, 2, 0)?;
                    nv.slice_set(&pv.narrow(2, 0, past)?.contiguous()?, 2, 0)?;
                }
            }
            *slot = Some((nk, nv));
        }
        let (bk, bv) = slot.as_ref().expect("allocated above");
        bk.slice_set(&k.contiguous()?, 2, past)?;
        bv.slice_set(&v.contiguous()?, 2, past)?;
        Ok((bk.narrow(2, 0, need)?, bv.narrow(2, 0, need)?))
    }
}

/// [`KvCache::select_rows`]' sharing: new row `i` is old row `rows[i]`, and
/// `len` columns are filled. Old rows that hold the same columns (a row and
/// those sharing its columns) form a class; the first new row of a class
/// keeps its own columns, and the class's later rows share with it the
/// columns both had in common with the class's source (all `len` for two
/// copies of the source itself).
fn select_shared(old: &[(usize, usize)], rows: &[usize], len: usize) -> Vec<(usize, usize)> {
    // Source row and the columns of it this row holds.
    let class = |r: usize| if old[r].1 > 0 { old[r] } else { (r, len) };
    let mut first: HashMap<usize, (usize, usize)> = HashMap::new();
    rows.iter()
        .enumerate()
        .map(|(i, &r)| {
            let (src, l) = class(r);
            match first.get(&src) {
                Some(&(j, lj)) if l.min(lj) > 0 => (j, l.min(lj)),
                _ => {
                    first.insert(src, (i, l));
                    (i, 0)
                }
            }
        })
        .collect()
}

/// The decoder. Weights are `Var`s in [`Transformer::varmap`] under Hugging
/// Face names, so an optimizer built from `varmap().all_vars()` trains them
/// and inference paths see its in-place updates.
pub struct Transformer {
    config: ModelConfig,
    varmap: VarMap,
    params: Params,
    inv_freq: Vec<f32>,
    dtype: DType,
    /// The dtype forwards compute in ([`Transformer::set_compute_dtype`]).
    compute: DType,
    /// Logit elements per chunk of the checkpointed and scoring heads
    /// ([`Transformer::set_logits_chunk`]).
    logits_chunk: usize,
    device: Device,
    /// The adapters, where the model has them: then only they learn.
    lora: Option<Adapted>,
}

/// A model's low-rank adapters.
struct Adapted {
    config: LoraConfig,
    /// Their `Var`s under PEFT names, sorted by name.
    vars: Vec<(String, Var)>,
}

impl Transformer {
    /// Builds a model from `source`, one tensor at a time: each is read,
    /// converted to `dtype` and placed on `device` before the next is read.
    /// The source is first [`check`]ed against `config` (every expected
    /// tensor with its exact shape, no layer tensor the config does not
    /// describe).
    pub fn from_source(config: ModelConfig, source: &dyn TensorSource, dtype: DType, device: &Device) -> Result<Self> {
        check(&config, source)?;
        let varmap = VarMap::new();
        let mut vars: HashMap<String, Tensor> = HashMap::new();
        {
            let mut data = varmap
                .data()
                .lock()
                .map_err(|_| ModelError::Format { path: source.origin(), message: "var map lock poisoned".into() })?;
            for (name, _) in expected_params(&config) {
                let t = source.tensor(&name)?.to_device(device)?.to_dtype(dtype)?.contiguous()?;
                let var = Var::from_tensor(&t)?;
                vars.insert(name.clone(), var.as_tensor().clone());
                data.insert(name, var);
            }
        }
        let params = Self::params_from(&config, &vars);
        let inv_freq = config.inv_freq().into_iter().map(|f| f as f32).collect();
        Ok(Transformer {
            config,
            varmap,
            params,
            inv_freq,
            dtype,
            compute: dtype,
            logits_chunk: DEFAULT_LOGITS_CHUNK,
            device: device.clone(),
            lora: None,
        })
    }

    /// The model with low-rank adapters `lora` on its projections, their
    /// values read from `source` (PEFT names: [`crate::model::lora::AdapterInit`] for a fresh
    /// start, a PEFT folder, a checkpoint), which is first checked to hold
    /// exactly them ([`check_adapter`]). From then on only the adapters
    /// learn: the base weights are frozen (no gradient is computed for
    /// them, and [`Transformer::trainable_vars`] holds the adapters only).
    pub fn with_adapters(mut self, lora: &LoraConfig, source: &dyn TensorSource) -> Result<Self> {
        lora.validate().map_err(|(field, message)| ModelError::Spec { field: format!("lora.{field}"), message })?;
        if self.lora.is_some() {
            return Err(candle_core::Error::Msg("the model already has adapters".into()).into());
        }
        check_adapter(&self.config, lora, source)?;
        let mut vars = Vec::new();
        for layer in 0..self.config.num_hidden_layers {
            for t in LoraTarget::ALL.into_iter().filter(|&t| lora.adapts(t)) {
                let m = t.module(layer);
                let mut pair = Vec::with_capacity(2);
                for f in [Factor::A, Factor::B] {
                    let name = peft_name(&m, f);
                    let v = source.tensor(&name)?.to_device(&self.device)?.to_dtype(self.dtype)?.contiguous()?;
                    let var = Var::from_tensor(&v)?;
                    pair.push(var.as_tensor().clone());
                    vars.push((name, var));
                }
                let b = pair.pop().expect("two factors");
                let a = pair.pop().expect("two factors");
                self.params.layers[layer].adapters[t.index()] = Some((a, b));
            }
        }
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        self.lora = Some(Adapted { config: lora.clone(), vars });
        Ok(self)
    }

    /// The adapters' configuration, where the model has them.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().map(|a| &a.config)
    }

    /// The parameters that learn, `(name, var)` sorted by name: the
    /// adapters (PEFT names) where the model has them, else every weight
    /// ([`Transformer::named_vars`]).
    pub fn trainable_vars(&self) -> Vec<(String, Var)> {
        match &self.lora {
            Some(a) => a.vars.clone(),
            None => self.named_vars(),
        }
    }

    /// The base weights with the adapters merged in, `W + s·B·A` for every
    /// adapted projection (computed in f32 on the weights' device), f32 on
    /// the CPU under Hugging Face names: what the adapted model computes,
    /// as a plain model.
    pub fn merged_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for (n, v) in self.named_vars() {
            // A copy even where the casts were no-ops: the optimizer
            // writes the live storage in place.
            out.insert(n, v.as_tensor().detach().to_dtype(DType::F32)?.to_device(&Device::Cpu)?.copy()?);
        }
        if let Some(lora) = &self.lora {
            let scale = lora.config.scale();
            for (li, l) in self.params.layers.iter().enumerate() {
                for t in LoraTarget::ALL {
                    if let Some((a, b)) = &l.adapters[t.index()] {
                        let w = out.get_mut(&format!("{}.weight", t.module(li))).expect("an adapted projection");
                        let (a, b) = (a.detach().to_device(&Device::Cpu)?, b.detach().to_device(&Device::Cpu)?);
                        *w = merged(w, &a, &b, scale)?;
                    }
                }
            }
        }
        Ok(out)
    }

    /// The adapters' current values, f32 on the CPU under PEFT names
    /// (empty without adapters).
    pub fn adapter_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for (n, v) in self.lora.iter().flat_map(|a| &a.vars) {
            out.insert(n.clone(), v.as_tensor().detach().to_dtype(DType::F32)?.to_device(&Device::Cpu)?.copy()?);
        }
        Ok(out)
    }

    /// Sets the adapters from `source` (PEFT names), checked first to hold
    /// exactly this model's adapters, so an adapter that does not fit
    /// leaves the model as it was.
    pub fn load_adapters(&self, source: &dyn TensorSource) -> Result<()> {
        let a = self.lora.as_ref().ok_or_else(|| ModelError::Spec {
            field: "lora".into(),
            message: "this model has no adapters to load into".into(),
        })?;
        check_adapter(&self.config, &a.config, source)?;
        for (n, v) in &a.vars {
            let live = v.as_tensor();
            v.set(&source.tensor(n)?.to_dtype(live.dtype())?.to_device(live.device())?)?;
        }
        Ok(())
    }

    /// [`Transformer::from_source`] over tensors in memory; `path` names
    /// them in errors.
    pub fn from_tensors(
        config: ModelConfig,
        tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
        path: &Path,
    ) -> Result<Self> {
        Self::from_source(config, &NamedTensors::new(path, tensors), dtype, device)
    }

    /// A randomly initialised model (uniform weights of std 0.02, norms at
    /// 1, biases small), deterministic in `seed`; for tests and toy runs.
    pub fn new_random(config: ModelConfig, seed: u64, dtype: DType, device: &Device) -> Result<Self> {
        Self::new_random_with_std(config, seed, 0.02, dtype, device)
    }

    /// [`Transformer::new_random`] with weight std `std` instead of 0.02: a
    /// larger one gives peaked next-token distributions, as a trained model
    /// has (useful for RL tests, where a uniform policy over a 49k vocabulary
    /// cannot learn from a handful of samples).
    pub fn new_random_with_std(
        config: ModelConfig,
        seed: u64,
        std: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let init = RandomInit::new(config.clone(), seed, std);
        let init = if dtype == DType::F64 { init.in_f64() } else { init };
        Self::from_source(config, &init, dtype, device)
    }

    fn params_from(cfg: &ModelConfig, vars: &HashMap<String, Tensor>) -> Params {
        // from_tensors inserted every expected name, so lookups cannot fail.
        let get = |n: &str| vars[n].clone();
        let opt = |n: &str| vars.get(n).cloned();
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = |s: &str| format!("model.layers.{i}.{s}");
                Layer {
                    q: get(&p("self_attn.q_proj.weight")),
                    k: get(&p("self_attn.k_proj.weight")),
                    v: get(&p("self_attn.v_proj.weight")),
                    o: get(&p("self_attn.o_proj.weight")),
                    q_b: opt(&p("self_attn.q_proj.bias")),
                    k_b: opt(&p("self_attn.k_proj.bias")),
                    v_b: opt(&p("self_attn.v_proj.bias")),
                    o_b: opt(&p("self_attn.o_proj.bias")),
                    q_norm: opt(&p("self_attn.q_norm.weight")),
                    k_norm: opt(&p("self_attn.k_norm.weight")),
                    in_norm: get(&p("input_layernorm.weight")),
                    post_norm: get(&p("post_attention_layernorm.weight")),
                    gate: get(&p("mlp.gate_proj.weight")),
                    up: get(&p("mlp.up_proj.weight")),
                    down: get(&p("mlp.down_proj.weight")),
                    adapters: Default::default(),
                }
            })
            .collect();
        Params {
            embed: get("model.embed_tokens.weight"),
            layers,
            norm: get("model.norm.weight"),
            lm_head: opt("lm_head.weight"),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The trainable variables under Hugging Face names.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// All parameters as `(name, var)`, sorted by name.
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let data = self.varmap.data().lock().map(|d| d.clone()).unwrap_or_default();
        let mut v: Vec<(String, Var)> = data.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Total number of scalar parameters.
    pub fn num_parameters(&self) -> usize {
        self.named_vars().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// Weight dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Mixed precision: forwards compute in `dtype` (e.g. bf16) while the
    /// weights, their gradients and the optimizer state stay in the storage
    /// dtype (f32 master weights, as PyTorch's autocast). Each forward casts
    /// the weights; the cast is differentiable, so gradients reach the
    /// master weights in their dtype. Logits are cast back to f32 before
    /// the log-softmax. The storage dtype is the default.
    pub fn set_compute_dtype(&mut self, dtype: DType) {
        self.compute = dtype;
    }

    /// How many logit elements (rows × vocabulary) one chunk of the head
    /// holds in the checkpointed backward ([`Transformer::checkpointed_backward`]) and in the scoring
    /// passes ([`Transformer::score_tail_logprobs`],
    /// [`Transformer::score_prefixed_tail_logprobs`]) (default 16 Mi, 64 MiB
    /// in f32; at least one row).
    pub fn set_logits_chunk(&mut self, elements: usize) {
        self.logits_chunk = elements.max(1);
    }

    /// The dtype forwards compute in.
    pub fn compute_dtype(&self) -> DType {
        self.compute
    }

    /// Whether inference reads the weight matrices in bf16 and computes
    /// everything else in f32: a CPU model stored in bf16 and computing in
    /// f32 (what [`crate::backend::open::open_inference`] opens for a bf16
    /// spec on the candle backend). The products then run on
    /// [`r2vpo_kernels::bf16w`], each an f32 dot product of the f32 input
    /// with the bf16 weights; the activations, the KV cache and the
    /// log-probs stay f32. A forward that records a graph casts the weights
    /// to f32 instead.
    pub fn bf16_weights(&self) -> bool {
        self.dtype == DType::BF16 && self.compute == DType::F32 && self.device.is_cpu()
    }

    /// The weights a forward uses: the `Var`s themselves (`train`: a graph
    /// is recorded) or detached handles, cast to the compute dtype. The cast
    /// is redone on every call: the optimizer updates the `Var`s in place,
    /// so a kept copy would go stale after each step.
    fn weights(&self, train: bool) -> Result<Params> {
        let (to, same) = (self.compute, self.compute == self.dtype);
        // With adapters the base is frozen: detached even for training, so
        // no backward computes its gradients.
        let frozen = self.lora.is_some();
        if train && same && !frozen {
            return Ok(self.params.clone());
        }
        let cast = |t: Tensor| if same { Ok(t) } else { t.to_dtype(to) };
        // bf16 weights for inference ([`Transformer::bf16_weights`]): the
        // matrices are read as they are stored, in bf16, by the products
        // (`ops::linear`); only the vectors (norms, biases) are cast.
        let keep = !train && self.bf16_weights();
        let base = |t: &Tensor| {
            let t = if train && !frozen { t.clone() } else { t.detach() };
            if keep && t.rank() == 2 {
                Ok(t)
            } else {
                cast(t)
            }
        };
        let adapter = |t: &Tensor| cast(if train { t.clone() } else { t.detach() });
        Ok(self.params.map(&base, &adapter)?)
    }

    fn detached(&self) -> Result<Params> {
        self.weights(false)
    }

    /// Differentiable per-token log-probabilities of `targets (B, T)` given
    /// `input_ids (B, T)` and a left-padding `attention_mask (B, T)` (any
    /// integer or float dtype, nonzero = real). Typically `targets` is
    /// `input_ids` shifted left by one; values at padded positions are
    /// meaningless and must be masked by the caller. Returns `(B, T)`.
    pub fn forward_logprobs(&self, input_ids: &Tensor, attention_mask: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.logprobs_with(&self.weights(true)?, input_ids, attention_mask, targets)
    }

    /// [`Transformer::forward_logprobs`] on detached weights: the same
    /// kernels (so old/reference log-probs equal the training path's
    /// exactly at step 0) but no graph is kept.
    pub fn score_logprobs(&self, input_ids: &Tensor, attention_mask: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.logprobs_with(&self.detached()?, input_ids, attention_mask, targets)
    }

    fn logprobs_with(&self, p: &Params, ids: &Tensor, mask: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if targets.dims() != [b, t] {
            return Err(candle_core::Error::Msg(format!("targets {:?} must be ({b}, {t})", targets.dims())).into());
        }
        let rows = mask_rows(mask, b, t)?;
        let h = self.hidden(p, ids, &rows, None)?;
        let logits = self.head(p, &h.reshape((b * t, self.config.hidden_size))?)?;
        let tg = targets.to_dtype(DType::U32)?.flatten_all()?;
        Ok(ops::log_prob_gather(&logits, &tg)?.reshape((b, t))?)
    }

    /// Differentiable log-probabilities of the last `r` tokens of each
    /// left-padded row given everything before them, `(B, r)`: column `c`
    /// scores token `W − r + c`. The LM head runs only on those `r`
    /// positions, which is what RL training needs (responses end at the
    /// right edge of a left-padded batch) and saves the vocabulary-sized
    /// matmul over the prompt.
    pub fn tail_logprobs(&self, input_ids: &Tensor, attention_mask: &Tensor, r: usize) -> Result<Tensor> {
        let (logits, targets) = self.tail_logits(&self.weights(true)?, input_ids, attention_mask, r)?;
        Ok(ops::log_prob_gather(&logits, &targets)?.reshape((input_ids.dim(0)?, r))?)
    }

    /// [`Transformer::tail_logprobs`] on detached weights (no graph).
    pub fn score_tail_logprobs(&self, input_ids: &Tensor, attention_mask: &Tensor, r: usize) -> Result<Tensor> {
        let p = self.detached()?;
        let (hs, targets) = self.tail_hidden(&p, input_ids, attention_mask, r)?;
        Ok(self.chunked_logprobs(&p, &hs, &targets)?.reshape((input_ids.dim(0)?, r))?)
    }

    /// Log-probs of `targets (N,)` under the head on `hs (N, hidden)`, a
    /// chunk of rows at a time ([`Transformer::set_logits_chunk`]), without
    /// a graph: the (rows × vocabulary) logits are never whole. On the CPU
    /// each row's logits are the same gemm sums as in one call (tested bit
    /// for bit); on a GPU the BLAS library may pick another kernel for a
    /// chunk's shape, so they agree to rounding.
    /// Scoring 8 × 256 SmolLM2 tokens held 402 MB of logits at once, in
    /// pages the kernel zero-filled on every pass (6 % of the pass, perf):
    /// in chunks, the pass's peak RSS fell from 2.17 to 1.77 GB at the same
    /// time (gemm then repacks the head's weight per chunk).
    fn chunked_logprobs(&self, p: &Params, hs: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let hs = hs.detach();
        let mut parts = Vec::new();
        for (s0, n) in self.head_chunks(hs.dim(0)?) {
            let logits = self.head(p, &hs.narrow(0, s0, n)?)?;
            parts.push(ops::log_prob_gather(&logits, &targets.narrow(0, s0, n)?)?);
        }
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// `(first row, rows)` of each chunk of the head over `n_rows` rows
    /// ([`Transformer::set_logits_chunk`]). Where the rows are more than the
    /// few-row kernels take ([`ops::SMALL_ROWS`]), so is every chunk (a short
    /// remainder joins the chunk before it): those kernels sum in another
    /// order than gemm's or AMX's many-row one, and the chunked log-probs
    /// must equal one whole head's bit for bit.
    fn head_chunks(&self, n_rows: usize) -> Vec<(usize, usize)> {
        let gemm_only = n_rows > ops::SMALL_ROWS;
        let mut chunk = (self.logits_chunk / self.config.vocab_size).max(1);
        // Whole tiles of gemm's AVX-512 f32 kernel (64 rows): 341-row chunks
        // scored 1.5–3 % slower than one whole head (3 alternating pairs),
        // 320-row chunks within 1 % (5 pairs).
        if chunk > 64 {
            chunk = chunk / 64 * 64;
        }
        if gemm_only {
            chunk = chunk.max(ops::SMALL_ROWS + 1);
        }
        let mut out: Vec<(usize, usize)> = (0..n_rows).step_by(chunk).map(|s0| (s0, chunk.min(n_rows - s0))).collect();
        if gemm_only && out.len() > 1 && out[out.len() - 1].1 <= ops::SMALL_ROWS {
            let (_, tail) = out.pop().expect("two chunks");
            out.last_mut().expect("one chunk").1 += tail;
        }
        out
    }

    /// Differentiable entropy (nats) of the next-token distribution at the
    /// positions [`Transformer::tail_logprobs`] scores, `(B, r)`, for an
    /// entropy bonus. It materialises the `(B·r, V)` log-softmax, several
    /// times the memory of the log-prob path; use it only when the bonus is on.
    pub fn tail_entropy(&self, input_ids: &Tensor, attention_mask: &Tensor, r: usize) -> Result<Tensor> {
        let (logits, _) = self.tail_logits(&self.weights(true)?, input_ids, attention_mask, r)?;
        let lsm = candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1)?;
        let ent = lsm.exp()?.mul(&lsm)?.sum(candle_core::D::Minus1)?.neg()?;
        Ok(ent.reshape((input_ids.dim(0)?, r))?)
    }

    /// Logits `(B·r, V)` predicting the last `r` tokens of each row, and
    /// those tokens `(B·r,)`.
    fn tail_logits(&self, p: &Params, ids: &Tensor, mask: &Tensor, r: usize) -> Result<(Tensor, Tensor)> {
        let (hs, targets) = self.tail_hidden(p, ids, mask, r)?;
        Ok((self.head(p, &hs)?, targets))
    }

    /// The final hidden states `(B·r, hidden)` that predict the last `r`
    /// tokens of each row, and those tokens `(B·r,)`.
    fn tail_hidden(&self, p: &Params, ids: &Tensor, mask: &Tensor, r: usize) -> Result<(Tensor, Tensor)> {
        let (b, w) = ids.dims2()?;
        if r == 0 || r >= w {
            return Err(candle_core::Error::Msg(format!("tail length {r} must be in 1..{w} for width {w}")).into());
        }
        let rows = mask_rows(mask, b, w)?;
        let h = self.hidden(p, ids, &rows, None)?;
        let hs = h.narrow(1, w - r - 1, r)?.contiguous()?.reshape((b * r, self.config.hidden_size))?;
        let targets = ids.narrow(1, w - r, r)?.to_dtype(DType::U32)?.flatten_all()?;
        Ok((hs, targets))
    }

    /// [`Transformer::tail_logprobs`] for rows that share prompts, with each
    /// distinct prefix run once (see [`PrefixedRows`]): the log-probabilities
    /// of suffix columns `1..S` given everything before them, `(B, S − 1)`,
    /// the same layout as `tail_logprobs` with `r = S − 1`. The prefix's
    /// keys and values are computed once and gathered per row (a
    /// differentiable `index_select`), so a group of G samples of one prompt
    /// costs one prompt forward/backward instead of G: the RL trainer's
    /// micro-batches are mostly prompt tokens.
    pub fn prefixed_tail_logprobs(&self, batch: &PrefixedRows) -> Result<Tensor> {
        let (logits, targets) = self.prefixed_tail_logits(&self.weights(true)?, batch)?;
        Ok(ops::log_prob_gather(&logits, &targets)?.reshape((batch.rows.len(), batch.suffix_ids.dim(1)? - 1))?)
    }

    /// [`Transformer::prefixed_tail_logprobs`] on detached weights (no graph).
    pub fn score_prefixed_tail_logprobs(&self, batch: &PrefixedRows) -> Result<Tensor> {
        let p = self.detached()?;
        let (hs, targets) = self.prefixed_tail_hidden(&p, batch)?;
        Ok(self.chunked_logprobs(&p, &hs, &targets)?.reshape((batch.rows.len(), batch.suffix_ids.dim(1)? - 1))?)
    }

    /// [`Transformer::tail_entropy`] at the positions
    /// [`Transformer::prefixed_tail_logprobs`] scores, `(B, S − 1)`.
    pub fn prefixed_tail_entropy(&self, batch: &PrefixedRows) -> Result<Tensor> {
        let (logits, _) = self.prefixed_tail_logits(&self.weights(true)?, batch)?;
        let lsm = candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1)?;
        let ent = lsm.exp()?.mul(&lsm)?.sum(candle_core::D::Minus1)?.neg()?;
        Ok(ent.reshape((batch.rows.len(), batch.suffix_ids.dim(1)? - 1))?)
    }

    /// Logits `(B·(S−1), V)` predicting suffix columns `1..S`, and those
    /// tokens, for [`Transformer::prefixed_tail_logprobs`].
    fn prefixed_tail_logits(&self, p: &Params, batch: &PrefixedRows) -> Result<(Tensor, Tensor)> {
        let (hs, targets) = self.prefixed_tail_hidden(p, batch)?;
        Ok((self.head(p, &hs)?, targets))
    }

    /// The final hidden states `(B·(S−1), hidden)` that predict suffix
    /// columns `1..S`, and those tokens, for
    /// [`Transformer::prefixed_tail_logits`].
    fn prefixed_tail_hidden(&self, p: &Params, batch: &PrefixedRows) -> Result<(Tensor, Tensor)> {
        let PrefixedRows { prefix_ids, prefix_mask, rows, suffix_ids, suffix_mask } = *batch;
        let (u, pw) = prefix_ids.dims2()?;
        let (b, s) = suffix_ids.dims2()?;
        if s < 2 {
            return Err(
                candle_core::Error::Msg(format!("suffix width {s} must be at least 2 (context + 1 token)")).into()
            );
        }
        if rows.len() != b {
            return Err(candle_core::Error::Msg(format!("{} row indices for {b} suffix rows", rows.len())).into());
        }
        let mut cache = KvCache::new(self, u);
        if pw > 0 {
            let pm = mask_rows(prefix_mask, u, pw)?;
            // Only the cache is wanted; the final norm over the prefix is a
            // negligible waste next to the layers that fill it.
            self.hidden(p, prefix_ids, &pm, Some(&mut cache))?;
        }
        cache.select_rows(rows)?;
        let sm = mask_rows(suffix_mask, b, s)?;
        let h = self.hidden(p, suffix_ids, &sm, Some(&mut cache))?;
        let r = s - 1;
        let hs = h.narrow(1, 0, r)?.contiguous()?.reshape((b * r, self.config.hidden_size))?;
        let targets = suffix_ids.narrow(1, 1, r)?.to_dtype(DType::U32)?.flatten_all()?;
        Ok((hs, targets))
    }

    /// [`Transformer::tail_logprobs`] for a packed micro-batch (see
    /// [`PackedSequences`]): the log-probabilities of every response token,
    /// in the `(B, r)` tail layout (0 left of a shorter response), with the
    /// layers run on the samples' own tokens only.
    pub fn packed_tail_logprobs(&self, batch: &PackedSequences, b: usize, r: usize) -> Result<Tensor> {
        let p = self.weights(true)?;
        let (hs, targets) = self.packed_hidden(&p, batch)?;
        let flat = ops::log_prob_gather(&self.head(&p, &hs)?, &targets)?;
        Ok(batch.to_tail(&flat, b, r)?)
    }

    /// [`Transformer::packed_tail_logprobs`] on detached weights (no graph).
    pub fn score_packed_tail_logprobs(&self, batch: &PackedSequences, b: usize, r: usize) -> Result<Tensor> {
        let p = self.detached()?;
        let (hs, targets) = self.packed_hidden(&p, batch)?;
        Ok(batch.to_tail(&self.chunked_logprobs(&p, &hs, &targets)?, b, r)?)
    }

    /// [`Transformer::tail_entropy`] at the positions
    /// [`Transformer::packed_tail_logprobs`] scores, `(B, r)`.
    pub fn packed_tail_entropy(&self, batch: &PackedSequences, b: usize, r: usize) -> Result<Tensor> {
        let p = self.weights(true)?;
        let (hs, _) = self.packed_hidden(&p, batch)?;
        let lsm = candle_nn::ops::log_softmax(&self.head(&p, &hs)?, candle_core::D::Minus1)?;
        let ent = lsm.exp()?.mul(&lsm)?.sum(candle_core::D::Minus1)?.neg()?;
        Ok(batch.to_tail(&ent, b, r)?)
    }

    /// The final hidden states `(S, hidden)` that predict the packed
    /// batch's response tokens, and those tokens `(S,)`.
    fn packed_hidden(&self, p: &Params, batch: &PackedSequences) -> Result<(Tensor, Tensor)> {
        let n = batch.ids.dim(1)?;
        let c = self.packed_ctx(batch)?;
        let h = self.stack(p, &batch.ids, &c, None)?.reshape((n, self.config.hidden_size))?;
        Ok((h.index_select(&batch.scored, 0)?, batch.targets.clone()))
    }

    /// Logits `(B, T, V)` for every position, on detached weights.
    pub fn forward_logits(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let rows = mask_rows(attention_mask, b, t)?;
        let p = self.detached()?;
        let h = self.hidden(&p, input_ids, &rows, None)?;
        Ok(self.head(&p, &h.reshape((b * t, self.config.hidden_size))?)?.reshape((b, t, self.config.vocab_size))?)
    }

    /// One incremental step on detached weights: appends `input_ids (B, Tn)`
    /// with their `attention_mask (B, Tn)` to `cache` (a prefill is simply
    /// the first step) and returns the logits of the last new position,
    /// `(B, V)`. Rows that are finished can feed any token with mask 0.
    pub fn forward_step(&self, input_ids: &Tensor, attention_mask: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        if t == 0 {
            return Err(candle_core::Error::Msg("forward_step needs at least one new token".into()).into());
        }
        if cache.batch() != b {
            return Err(candle_core::Error::Msg(format!("cache has {} rows, input has {b}", cache.batch())).into());
        }
        let new_rows = mask_rows(attention_mask, b, t)?;
        let p = self.detached()?;
        let mut c = self.stack_ctx(input_ids, &new_rows, Some(&mut *cache))?;
        // Only here, sampling: every other pass keeps the matmul attention
        // so scoring equals the training path bit for bit.
        c.decode_attention = true;
        let h = self.stack(&p, input_ids, &c, Some(cache))?;
        let last = h.narrow(1, t - 1, 1)?.reshape((b, self.config.hidden_size))?;
        self.head(&p, &last)
    }

    fn head(&self, p: &Params, h: &Tensor) -> Result<Tensor> {
        let w = p.lm_head.as_ref().unwrap_or(&p.embed);
        // Logits in f32 whatever the compute dtype: the log-softmax over a
        // large vocabulary is where bf16 loses most (no-op for f32).
        let logits = ops::linear(h, w)?;
        Ok(if matches!(logits.dtype(), DType::BF16 | DType::F16) { logits.to_dtype(DType::F32)? } else { logits })
    }

    /// RoPE tables `(B, T, D/2)` for per-row positions. Angles and their
    /// cos/sin are computed in f32, as transformers does for every model
    /// dtype (it disables autocast and calls `.float()`): pretrained models
    /// saw exactly these tables, and the parity goldens depend on it.
    fn rope_tables(&self, pos: &[Vec<usize>]) -> Result<(Tensor, Tensor)> {
        let (b, t, half) = (pos.len(), pos.first().map_or(0, Vec::len), self.inv_freq.len());
        let mut c = Vec::with_capacity(b * t * half);
        let mut s = Vec::with_capacity(b * t * half);
        for row in pos {
            for &p in row {
                for &f in &self.inv_freq {
                    let a = p as f32 * f;
                    c.push(a.cos());
                    s.push(a.sin());
                }
            }
        }
        let c = Tensor::from_vec(c, (b, t, half), &self.device)?.to_dtype(self.compute)?;
        let s = Tensor::from_vec(s, (b, t, half), &self.device)?.to_dtype(self.compute)?;
        Ok((c, s))
    }

    /// Runs the decoder stack and final norm: `(B, T, hidden)`. `new_mask`
    /// is the mask of the `T` new tokens; with a cache, the cached rows'
    /// masks extend it on the left.
    fn hidden(
        &self,
        p: &Params,
        ids: &Tensor,
        new_mask: &[Vec<u8>],
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let c = self.stack_ctx(ids, new_mask, cache.as_deref_mut())?;
        self.stack(p, ids, &c, cache)
    }

    /// [`Transformer::hidden`] for a prepared [`StackCtx`].
    fn stack(&self, p: &Params, ids: &Tensor, c: &StackCtx, mut cache: Option<&mut KvCache>) -> Result<Tensor> {
        let mut x = self.embed(p, ids)?;
        for (li, l) in p.layers.iter().enumerate() {
            x = self.layer(l, li, &x, c, cache.as_deref_mut())?;
        }
        self.final_norm(p, &x, c)
    }

    /// Token embeddings, `(B·T, hidden)`.
    fn embed(&self, p: &Params, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let ids = ids.to_dtype(DType::U32)?.flatten_all()?;
        // Exact: bf16 rows of a bf16-weight model widened to f32.
        Ok(p.embed.index_select(&ids, 0)?.to_dtype(self.compute)?.reshape((b * t, self.config.hidden_size))?)
    }

    /// The final RMSNorm, reshaped to `(B, T, hidden)`.
    fn final_norm(&self, p: &Params, x: &Tensor, c: &StackCtx) -> Result<Tensor> {
        Ok(ops::rms_norm(x, &p.norm, self.config.rms_norm_eps)?.reshape((c.b, c.t, self.config.hidden_size))?)
    }

    /// Positions, RoPE tables and the additive mask over all keys for `T`
    /// new tokens of `B` rows; with a cache, its rows' masks extend on the
    /// left and take the new tokens' masks.
    fn stack_ctx(&self, ids: &Tensor, new_mask: &[Vec<u8>], cache: Option<&mut KvCache>) -> Result<StackCtx> {
        let (b, t) = ids.dims2()?;
        let past = cache.as_ref().map_or(0, |c| c.len());
        let tk = past + t;
        let mut pos = vec![vec![0usize; t]; b];
        let mut add = vec![0f64; b * t * tk];
        for r in 0..b {
            let old: &[u8] = cache.as_ref().map_or(&[], |c| c.mask[r].as_slice());
            let full: Vec<u8> = old.iter().chain(&new_mask[r]).copied().collect();
            let mut n = old.iter().filter(|&&x| x != 0).count();
            for i in 0..t {
                pos[r][i] = n;
                if full[past + i] != 0 {
                    n += 1;
                }
                for (j, &m) in full.iter().enumerate() {
                    if j > past + i || m == 0 {
                        add[(r * t + i) * tk + j] = MASKED;
                    }
                }
            }
        }
        let mut shared = Vec::new();
        if let Some(c) = cache {
            for (r, m) in new_mask.iter().enumerate() {
                c.mask[r].extend_from_slice(m);
            }
            shared = c.shared.clone();
        }
        let mask = Tensor::from_vec(add, (b, 1, 1, t, tk), &self.device)?.to_dtype(self.compute)?;
        let (cos, sin) = self.rope_tables(&pos)?;
        let scale = 1.0 / (self.config.head_dim() as f64).sqrt();
        let (cos_q, sin_q) = ((&cos * scale)?, (&sin * scale)?);
        Ok(StackCtx { b, t, tk, keys: Keys::Mask(mask), cos, sin, cos_q, sin_q, decode_attention: false, shared })
    }

    /// The [`StackCtx`] of one packed row ([`PackedSequences`]): each
    /// sequence's positions from 0, and no mask (the attention's bounds).
    fn packed_ctx(&self, batch: &PackedSequences) -> Result<StackCtx> {
        let n = batch.ids.dim(1)?;
        if batch.ids.dims() != [1, n] || batch.positions.len() != n {
            return Err(candle_core::Error::Msg(format!(
                "packed ids {:?} with {} positions",
                batch.ids.dims(),
                batch.positions.len()
            ))
            .into());
        }
        let (cos, sin) = self.rope_tables(std::slice::from_ref(&batch.positions))?;
        let scale = 1.0 / (self.config.head_dim() as f64).sqrt();
        let (cos_q, sin_q) = ((&cos * scale)?, (&sin * scale)?);
        Ok(StackCtx {
            b: 1,
            t: n,
            tk: n,
            keys: Keys::Packed(batch.seqs.clone()),
            cos,
            sin,
            cos_q,
            sin_q,
            decode_attention: false,
            shared: Vec::new(),
        })
    }

    /// Decoder layer `li` on `x (B·T, hidden)`, appending its keys and
    /// values to `cache` when there is one.
    fn layer(&self, l: &Layer, li: usize, x: &Tensor, c: &StackCtx, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, t, tk) = (c.b, c.t, c.tk);
        let (nh, nkv, hd) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
        let g = nh / nkv;
        let h = ops::rms_norm(x, &l.in_norm, cfg.rms_norm_eps)?;
        let qkv = [(&l.q, LoraTarget::QProj), (&l.k, LoraTarget::KProj), (&l.v, LoraTarget::VProj)];
        let mut qkv = self.projections(&h, l, &qkv)?.into_iter();
        let mut proj = |bias: &Option<Tensor>, heads: usize| -> Result<Tensor> {
            let mut y = qkv.next().expect("three projections");
            if let Some(bb) = bias {
                y = y.broadcast_add(bb)?;
            }
            Ok(y.reshape((b, t, heads, hd))?)
        };
        let mut q = proj(&l.q_b, nh)?;
        let mut k = proj(&l.k_b, nkv)?;
        let v = proj(&l.v_b, nkv)?.transpose(1, 2)?.contiguous()?;
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            q = ops::rms_norm(&q, qn, cfg.rms_norm_eps)?;
            k = ops::rms_norm(&k, kn, cfg.rms_norm_eps)?;
        }
        // The queries' tables carry the attention's 1/√D.
        let q = ops::rope(&q.transpose(1, 2)?, &c.cos_q, &c.sin_q)?;
        let k = ops::rope(&k.transpose(1, 2)?, &c.cos, &c.sin)?;
        let (k, v) = match cache {
            Some(cache) => cache.push(li, k, v, tk - t)?,
            None => (k, v),
        };
        // GQA without repeat_kv: the g query heads sharing a kv head are
        // stacked along the sequence axis of one matmul.
        let q = q.reshape((b, nkv, g * t, hd))?;
        let attn = match &c.keys {
            Keys::Packed(seqs) => ops::attention_varlen(&q, &k, &v, seqs)?,
            Keys::Mask(mask) => {
                let fast =
                    if c.decode_attention { ops::attention_no_grad(&q, &k, &v, mask, t, &c.shared)? } else { None };
                match fast {
                    Some(a) => a,
                    None => ops::attention(&q, &k, &v, mask, t)?,
                }
            }
        };
        let attn = attn.reshape((b, nh, t, hd))?.transpose(1, 2)?.contiguous()?.reshape((b * t, nh * hd))?;
        let mut o = self.projections(&attn, l, &[(&l.o, LoraTarget::OProj)])?.remove(0);
        if let Some(ob) = &l.o_b {
            o = o.broadcast_add(ob)?;
        }
        let x = (x + o)?;
        let h2 = ops::rms_norm(&x, &l.post_norm, cfg.rms_norm_eps)?;
        let gu = [(&l.gate, LoraTarget::GateProj), (&l.up, LoraTarget::UpProj)];
        let [gate, up]: [Tensor; 2] = self.projections(&h2, l, &gu)?.try_into().expect("two projections");
        let act = ops::swiglu(&gate, &up)?;
        Ok((x + self.projections(&act, l, &[(&l.down, LoraTarget::DownProj)])?.remove(0))?)
    }

    /// `x·Wᵀ` for each projection of `ws` that reads `x`, plus its
    /// adapter's low-rank update `s·(x·Aᵀ)·Bᵀ` where `l` has one (LoRA's
    /// forward, Hu et al. 2021, eq. 3). The factors are applied one after
    /// the other, never merged, so the rank-r products cost r·(in + out)
    /// per row against the base's in·out. Without a graph (sampling,
    /// scoring) the base products are the unadapted model's, on the same
    /// kernels, and B = 0 adds exact zeros; with one, each adapted
    /// projection is one [`ops::lora_linear`], whose graph keeps only its
    /// output.
    fn projections(&self, x: &Tensor, l: &Layer, ws: &[(&Tensor, LoraTarget)]) -> Result<Vec<Tensor>> {
        let adapter = |t: LoraTarget| l.adapters[t.index()].as_ref();
        let (scale, graph) = match &self.lora {
            None => (0.0, false),
            Some(ad) => (ad.config.scale(), ws.iter().filter_map(|&(_, t)| adapter(t)).any(|(a, _)| a.track_op())),
        };
        if graph {
            return ws
                .iter()
                .map(|&(w, t)| match adapter(t) {
                    Some((a, b)) => Ok(ops::lora_linear(x, w, a, b, scale)?),
                    None => Ok(ops::linear(x, w)?),
                })
                .collect();
        }
        let base: Vec<&Tensor> = ws.iter().map(|&(w, _)| w).collect();
        let ys = ops::linear_many(x, &base)?;
        ys.into_iter()
            .zip(ws)
            .map(|(y, &(_, t))| match adapter(t) {
                Some((a, b)) => Ok((y + ops::linear(&ops::linear(x, a)?.affine(scale, 0.0)?, b)?)?),
                None => Ok(y),
            })
            .collect()
    }

    /// The forward half of gradient checkpointing (Chen et al. 2016,
    /// "Training Deep Nets with Sublinear Memory Cost"; PyTorch's
    /// `torch.utils.checkpoint` per decoder layer): `tail_logprobs(ids,
    /// mask, r)` without a graph, keeping only each layer's input, so that
    /// [`Transformer::checkpointed_backward`] can recompute one layer at a
    /// time and backpropagate the incoming gradient through it. It costs one
    /// more forward of the stack; the activations alive at once fall from
    /// every layer's to one layer's (measured in `docs/gpu.md`). The
    /// LM head runs a chunk of rows at a time, twice (log-probs here, their
    /// gradient in the backward), so the (rows × vocabulary) logits are
    /// never whole ([`Transformer::set_logits_chunk`]).
    pub fn checkpointed_tail(&self, input_ids: &Tensor, attention_mask: &Tensor, r: usize) -> Result<CheckpointedTail> {
        let (b, w) = input_ids.dims2()?;
        if r == 0 || r >= w {
            return Err(candle_core::Error::Msg(format!("tail length {r} must be in 1..{w} for width {w}")).into());
        }
        let rows = mask_rows(attention_mask, b, w)?;
        let c = self.stack_ctx(input_ids, &rows, None)?;
        let targets = input_ids.narrow(1, w - r, r)?.to_dtype(DType::U32)?.flatten_all()?;
        self.checkpointed(input_ids, c, Scored::Tail { r }, targets, (b, r))
    }

    /// [`Transformer::checkpointed_tail`] for a packed micro-batch of `b`
    /// samples whose longest response is `r` (see
    /// [`Transformer::packed_tail_logprobs`]): the log-probs `(b, r)` in the
    /// tail layout, for [`Transformer::checkpointed_backward`].
    pub fn checkpointed_packed(&self, batch: &PackedSequences, b: usize, r: usize) -> Result<CheckpointedTail> {
        let c = self.packed_ctx(batch)?;
        let scored = Scored::Packed { scored: batch.scored.clone(), from_tail: batch.from_tail.clone() };
        let mut pass = self.checkpointed(&batch.ids, c, scored, batch.targets.clone(), (b, r))?;
        pass.logp = batch.to_tail(&pass.logp, b, r)?;
        Ok(pass)
    }

    /// The forward half of gradient checkpointing over `ids` in the stack
    /// context `c`, scoring `targets` at the rows `scored` selects: the
    /// log-probs as the head gives them (`(b, r)` for a tail, `(S,)` packed).
    fn checkpointed(
        &self,
        input_ids: &Tensor,
        c: StackCtx,
        scored: Scored,
        targets: Tensor,
        (b, r): (usize, usize),
    ) -> Result<CheckpointedTail> {
        // The layers' gradients land in buffers allocated before any
        // activation: kept as the backward's own tensors, each would pin
        // the allocator pages around it, and the resident set grew by a
        // whole layer's activations per layer (measured: +280 MB per
        // SmolLM2 layer, ending above the full graph's peak).
        let bufs: Vec<Vec<(Tensor, Tensor)>> = self
            .params
            .layers
            .iter()
            .map(|l| {
                l.trainable(self.lora.is_some())
                    .into_iter()
                    .map(|v| Ok((v.clone(), v.zeros_like()?)))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<_>>()?;
        let det = self.detached()?;
        // Forward without a graph, keeping each layer's input.
        let mut inputs = vec![self.embed(&det, input_ids)?];
        for (li, l) in det.layers.iter().enumerate() {
            let x = self.layer(l, li, &inputs[li], &c, None)?;
            inputs.push(x);
        }
        // The head's input rows; their log-probs without a graph.
        let top = inputs.pop().expect("the embedding at least");
        let hs = self.scored_rows(&det, &top, &c, &scored)?;
        let mut logp = self.chunked_logprobs(&det, &hs, &targets)?;
        if let Scored::Tail { .. } = scored {
            logp = logp.reshape((b, r))?;
        }
        Ok(CheckpointedTail { input_ids: input_ids.clone(), bufs, c, inputs, top, targets, scored, logp })
    }

    /// The final norm's rows `(rows, hidden)` that `scored` selects from the
    /// last layer's output `top`.
    fn scored_rows(&self, p: &Params, top: &Tensor, c: &StackCtx, scored: &Scored) -> Result<Tensor> {
        let h = self.final_norm(p, top, c)?;
        let hsz = self.config.hidden_size;
        Ok(match scored {
            Scored::Tail { r } => h.narrow(1, c.t - r - 1, *r)?.contiguous()?.reshape((c.b * r, hsz))?,
            Scored::Packed { scored, .. } => h.reshape((c.b * c.t, hsz))?.index_select(scored, 0)?,
        })
    }

    /// The backward half of gradient checkpointing: the gradients of every
    /// weight given `dlogp`, the gradient of the loss with respect to
    /// `pass`'s log-probs `(B, r)`, keyed like `loss.backward()`'s.
    pub fn checkpointed_backward(
        &self,
        pass: CheckpointedTail,
        dlogp: &Tensor,
    ) -> Result<candle_core::backprop::GradStore> {
        let CheckpointedTail { input_ids, bufs, c, mut inputs, top, targets, scored, logp } = pass;
        drop(logp);
        let dlogp = match &scored {
            Scored::Tail { .. } => dlogp.flatten_all()?,
            Scored::Packed { from_tail, .. } => dlogp.flatten_all()?.index_select(from_tail, 0)?,
        };
        // `p` computes (cast to the compute dtype); `vars` are the `Var`s the
        // gradients are keyed by (the same tensors when nothing is cast).
        let (p, vars) = (&self.weights(true)?, &self.params);
        // The head, from the last layer's output as a leaf, a chunk of rows
        // at a time, weighted by the log-probs' gradient.
        let top = Var::from_tensor(&top)?;
        let hs = self.scored_rows(p, top.as_tensor(), &c, &scored)?;
        let n_rows = hs.dim(0)?;
        let mut g: Option<Tensor> = None;
        // Only the weights' gradients are kept: candle's store also holds
        // gradients of constant inputs (masks, tables), never read.
        let mut grads = candle_core::backprop::GradStore::default();
        for (s0, n) in self.head_chunks(n_rows) {
            let lp = ops::log_prob_gather(&self.head(p, &hs.narrow(0, s0, n)?)?, &targets.narrow(0, s0, n)?)?;
            let mut gs = (lp * dlogp.narrow(0, s0, n)?)?.sum_all()?.backward()?;
            let gt = gs
                .remove(top.as_tensor())
                .ok_or_else(|| candle_core::Error::Msg("the head has no input gradient".into()))?;
            g = Some(match g.take() {
                Some(prev) => (prev + gt)?,
                None => gt,
            });
            for t in [Some(&vars.norm), vars.lm_head.as_ref(), Some(&vars.embed)].into_iter().flatten() {
                if let Some(gv) = gs.remove(t) {
                    add_grad(&mut grads, t, gv)?;
                }
            }
        }
        let mut g = g.expect("at least one row");
        drop((hs, top));
        // Back through the layers, one recomputed at a time.
        for (li, l) in p.layers.iter().enumerate().rev() {
            let x = Var::from_tensor(&inputs.pop().expect("one input per layer"))?;
            let y = self.layer(l, li, x.as_tensor(), &c, None)?;
            let mut gl = (y * &g)?.sum_all()?.backward()?;
            g = gl
                .remove(x.as_tensor())
                .ok_or_else(|| candle_core::Error::Msg(format!("layer {li}: no input gradient")))?;
            for (v, buf) in &bufs[li] {
                if let Some(gv) = gl.get(v) {
                    buf.slice_set(&gv.contiguous()?, 0, 0)?;
                    grads.insert(v, buf.clone());
                }
            }
        }
        // The embedding (tied: its gradient from the head adds up).
        let x0 = self.embed(p, &input_ids)?;
        let mut ge = (x0 * &g)?.sum_all()?.backward()?;
        if let Some(gt) = ge.remove(&vars.embed) {
            add_grad(&mut grads, &vars.embed, gt)?;
        }
        Ok(grads)
    }
}

/// What [`Transformer::checkpointed_tail`] keeps for
/// [`Transformer::checkpointed_backward`]: each layer's input, the
/// gradient buffers and the stack's shared tables.
pub struct CheckpointedTail {
    input_ids: Tensor,
    bufs: Vec<Vec<(Tensor, Tensor)>>,
    c: StackCtx,
    inputs: Vec<Tensor>,
    top: Tensor,
    targets: Tensor,
    scored: Scored,
    logp: Tensor,
}

/// Which rows of a checkpointed pass the head scores.
enum Scored {
    /// The last `r` positions of every row (padded rows).
    Tail { r: usize },
    /// The packed rows `scored`, whose slots in the `(B, R)` tail are
    /// `from_tail` ([`PackedSequences`]).
    Packed { scored: Tensor, from_tail: Tensor },
}

impl CheckpointedTail {
    /// The log-probs `(B, r)`, without a graph.
    pub fn logprobs(&self) -> &Tensor {
        &self.logp
    }
}

/// Adds `g` to what `store` holds for `t` (a tied weight collects
/// gradients from the head and the embedding; the head's from each chunk).
fn add_grad(store: &mut candle_core::backprop::GradStore, t: &Tensor, g: Tensor) -> Result<()> {
    let sum = match store.remove(t) {
        Some(prev) => (prev + g)?,
        None => g,
    };
    store.insert(t, sum);
    Ok(())
}

/// What every layer of one stack pass shares.
struct StackCtx {
    b: usize,
    t: usize,
    /// Keys: cached + new.
    tk: usize,
    /// Which keys each query sees.
    keys: Keys,
    cos: Tensor,
    sin: Tensor,
    /// The queries' tables, `cos` and `sin` times `1/√head_dim`: RoPE is
    /// linear, so the rotated queries come out scaled for the attention
    /// without a tensor of their own.
    cos_q: Tensor,
    sin_q: Tensor,
    /// Attention by [`ops::attention_no_grad`] where it applies (sampling
    /// steps only).
    decode_attention: bool,
    /// The cache's rows that share columns ([`KvCache`]'s `shared`).
    shared: Vec<(usize, usize)>,
}

/// Which keys each query of a stack pass sees.
enum Keys {
    /// An additive mask `(B, 1, 1, T, TK)` (rows, padding, a cache).
    Mask(Tensor),
    /// One row of sequences laid end to end, each causal within itself
    /// after its prefix ([`ops::attention_varlen`]).
    Packed(Vec<ops::Seq>),
}

/// A `(B, T)` mask tensor as rows of 0/1 bytes.
fn mask_rows(mask: &Tensor, b: usize, t: usize) -> Result<Vec<Vec<u8>>> {
    if mask.dims() != [b, t] {
        return Err(candle_core::Error::Msg(format!("attention_mask {:?} must be ({b}, {t})", mask.dims())).into());
    }
    let m = mask.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    Ok(m.into_iter().map(|r| r.into_iter().map(|x| u8::from(x != 0.0)).collect()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Architecture;

    /// Decoding that reads shared columns from the row they were copied from
    /// gives the logits, bit for bit, of decoding that reads every row's own
    /// copy, through everything that moves rows: a group replicated from one
    /// prefill whose rows then diverge (one feeding padding), the group's
    /// first row dropped, rows of another prefill appended (left padding on
    /// one side), and padding trimmed. Head sizes 64 (the kernel's register
    /// path) and 16 (its general one). A record that claimed one column too
    /// many fails it.
    #[test]
    fn shared_columns_change_no_logit() {
        for hidden in [256, 64] {
            let cfg = ModelConfig::tiny(Architecture::Llama, 96, hidden, 128, 2, 4, 2, true);
            let m = Transformer::new_random_with_std(cfg, 11, 0.5, DType::F32, &Device::Cpu).unwrap();
            let t = |v: Vec<u32>, r: usize| Tensor::from_vec(v.clone(), (r, v.len() / r), &Device::Cpu).unwrap();
            let prefill = |ids: Vec<u32>, mask: Vec<u32>, rows: usize| {
                let mut c = KvCache::new(&m, rows);
                m.forward_step(&t(ids, rows), &t(mask, rows), &mut c).unwrap();
                c
            };
            // The cache that shares, and one told it shares nothing.
            let pair = |ids: Vec<u32>, mask: Vec<u32>, rows: usize| {
                (prefill(ids.clone(), mask.clone(), rows), prefill(ids, mask, rows))
            };
            let own = |c: &mut KvCache| c.shared = (0..c.batch()).map(|r| (r, 0)).collect();
            let mut seed = 5u32;
            let mut step = |a: &mut KvCache, b: &mut KvCache, idle: Option<usize>| {
                let n = a.batch();
                let ids: Vec<u32> = (0..n)
                    .map(|_| {
                        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                        (seed >> 16) % 96
                    })
                    .collect();
                let mask: Vec<u32> = (0..n).map(|r| u32::from(Some(r) != idle)).collect();
                let la = m.forward_step(&t(ids.clone(), n), &t(mask.clone(), n), a).unwrap();
                let lb = m.forward_step(&t(ids, n), &t(mask, n), b).unwrap();
                let moved = (la - lb).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                assert!(moved == 0.0, "head {}: logits moved by {moved}", hidden / 4);
            };
            let (mut a, mut b) = pair(vec![3, 9, 27, 81, 50, 0, 0, 7, 14, 21], vec![1, 1, 1, 1, 1, 0, 0, 1, 1, 1], 2);
            a.select_rows(&[0, 1, 0, 0, 1]).unwrap();
            b.select_rows(&[0, 1, 0, 0, 1]).unwrap();
            own(&mut b);
            assert_eq!(a.shared, [(0, 0), (1, 0), (0, 5), (0, 5), (1, 5)]);
            for s in 0..3 {
                step(&mut a, &mut b, (s == 1).then_some(2));
            }
            // The group's first row goes: the next one keeps its own columns.
            a.select_rows(&[1, 3, 4, 2]).unwrap();
            b.select_rows(&[1, 3, 4, 2]).unwrap();
            own(&mut b);
            assert_eq!(a.shared, [(0, 0), (1, 0), (0, 5), (1, 5)]);
            step(&mut a, &mut b, None);
            let (mut a2, mut b2) = pair(vec![40, 41], vec![1, 1], 1);
            a2.select_rows(&[0, 0]).unwrap();
            b2.select_rows(&[0, 0]).unwrap();
            a.append_rows(a2).unwrap();
            b.append_rows(b2).unwrap();
            own(&mut b);
            assert_eq!(a.shared[4..], [(4, 0), (4, 9)]);
            for _ in 0..2 {
                step(&mut a, &mut b, None);
            }
            // The appended pair alone: its 7 columns of padding go.
            a.select_rows(&[4, 5]).unwrap();
            b.select_rows(&[4, 5]).unwrap();
            a.trim_padding().unwrap();
            b.trim_padding().unwrap();
            own(&mut b);
            assert_eq!(a.shared, [(0, 0), (0, 2)]);
            step(&mut a, &mut b, None);
            // One column too many: the rows differ there, so the logits move.
            a.shared[1].1 += 1;
            let n = a.batch();
            let la = m.forward_step(&t(vec![1; n], n), &t(vec![1; n], n), &mut a).unwrap();
            let lb = m.forward_step(&t(vec![1; n], n), &t(vec![1; n], n), &mut b).unwrap();
            assert_ne!(la.to_vec2::<f32>().unwrap(), lb.to_vec2::<f32>().unwrap());
        }
    }
}
