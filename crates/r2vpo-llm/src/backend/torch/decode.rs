//! The torch backend as a [`crate::decode::Decoder`]: the sampler and the
//! serving engine decode on the learner's own weights and kernels, with
//! keys and values in preallocated per-layer buffers ([`TorchKv`]).

use tch::{Kind, Tensor as T};

use super::{guarded, ids_to_torch, to_candle, torch_err, TorchBackend};
use crate::model::{ModelConfig, ModelError, Result};

/// The torch decoder's per-layer keys and values, in buffers
/// `(B, kv heads, capacity, head dim)` whose first [`DecodeCache::len`]
/// columns are filled: a decode step writes its new columns in place and
/// attends to a view of the filled ones (the candle
/// [`KvCache`](crate::backend::candle::KvCache)'s layout and semantics). Capacity is
/// what the cache was made for, doubling when a write goes past it. Each
/// row keeps its own mask, so rows of different lengths decode together.
pub struct TorchKv {
    layers: Vec<Option<(T, T)>>,
    /// Per row: 1 for each cached real token, 0 for padding.
    mask: Vec<Vec<u8>>,
    /// Columns to allocate at the first write (0: as many as written).
    reserve: usize,
    /// Columns cached before the step being run.
    past: usize,
}

impl TorchKv {
    /// Stores layer `li`'s keys and values `(B, heads, T, D)` for the new
    /// tokens after `past` cached ones; returns those of all of them.
    pub(super) fn push(&mut self, li: usize, k: &T, v: &T) -> (T, T) {
        let (past, t) = (self.past as i64, k.size()[2]);
        let need = past + t;
        let slot = &mut self.layers[li];
        let cap = slot.as_ref().map_or(0, |(kb, _)| kb.size()[2]);
        if cap < need {
            let grown = need.max(self.reserve as i64).max(2 * cap);
            let alloc = |x: &T, old: Option<&T>| {
                let mut sz = x.size();
                sz[2] = grown;
                let buf = T::zeros(sz.as_slice(), (x.kind(), x.device()));
                if let (Some(old), true) = (old, past > 0) {
                    buf.narrow(2, 0, past).copy_(&old.narrow(2, 0, past));
                }
                buf
            };
            let old = slot.take();
            *slot = Some((alloc(k, old.as_ref().map(|o| &o.0)), alloc(v, old.as_ref().map(|o| &o.1))));
        }
        let (kb, vb) = slot.as_ref().expect("allocated");
        kb.narrow(2, past, t).copy_(k);
        vb.narrow(2, past, t).copy_(v);
        (kb.narrow(2, 0, need), vb.narrow(2, 0, need))
    }
}

impl crate::decode::DecodeCache for TorchKv {
    fn batch(&self) -> usize {
        self.mask.len()
    }

    fn len(&self) -> usize {
        self.mask.first().map_or(0, Vec::len)
    }

    fn select_rows(&mut self, rows: &[usize]) -> Result<()> {
        if let Some(&bad) = rows.iter().find(|&&r| r >= self.mask.len()) {
            return Err(ModelError::Torch(format!("row {bad} out of range for a cache of {} rows", self.mask.len())));
        }
        let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        guarded("torch cache rows", || {
            for layer in self.layers.iter_mut().flatten() {
                let i = T::f_from_slice(&idx).and_then(|i| i.f_to_device(layer.0.device())).map_err(torch_err)?;
                *layer = (layer.0.index_select(0, &i), layer.1.index_select(0, &i));
            }
            Ok(())
        })?;
        self.mask = rows.iter().map(|&r| self.mask[r].clone()).collect();
        Ok(())
    }

    fn append_rows(&mut self, other: Self) -> Result<()> {
        if self.mask.is_empty() {
            *self = other;
            return Ok(());
        }
        if other.mask.is_empty() {
            return Ok(());
        }
        let (a, b) = (self.len() as i64, other.len() as i64);
        let width = a.max(b);
        guarded("torch cache append", || {
            let pad_left = |t: &T, len: i64| {
                let t = t.narrow(2, 0, len);
                if len == width {
                    return t;
                }
                let mut sz = t.size();
                sz[2] = width - len;
                T::cat(&[&T::zeros(sz.as_slice(), (t.kind(), t.device())), &t], 2)
            };
            for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
                match (mine.take(), theirs) {
                    (Some((k1, v1)), Some((k2, v2))) => {
                        let k = T::cat(&[pad_left(&k1, a), pad_left(&k2, b)], 0);
                        let v = T::cat(&[pad_left(&v1, a), pad_left(&v2, b)], 0);
                        *mine = Some((k, v));
                    }
                    _ => return Err(ModelError::Torch("append_rows needs two filled caches".into())),
                }
            }
            Ok(())
        })?;
        for m in &mut self.mask {
            m.splice(0..0, std::iter::repeat_n(0u8, (width - a) as usize));
        }
        self.mask.extend(other.mask.into_iter().map(|mut m| {
            m.splice(0..0, std::iter::repeat_n(0u8, (width - b) as usize));
            m
        }));
        Ok(())
    }

    fn trim_padding(&mut self) -> Result<()> {
        let lead = self.mask.iter().map(|m| m.iter().take_while(|&&x| x == 0).count()).min().unwrap_or(0);
        if lead == 0 {
            return Ok(());
        }
        let keep = (self.len() - lead) as i64;
        guarded("torch cache trim", || {
            for layer in self.layers.iter_mut().flatten() {
                *layer = (
                    layer.0.narrow(2, lead as i64, keep).contiguous(),
                    layer.1.narrow(2, lead as i64, keep).contiguous(),
                );
            }
            Ok(())
        })?;
        for m in &mut self.mask {
            m.drain(..lead);
        }
        Ok(())
    }
}

impl crate::decode::Decoder for TorchBackend {
    type Cache = TorchKv;

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn input_device(&self) -> &candle_core::Device {
        &self.cpu
    }

    fn new_cache(&self, batch: usize, tokens: usize) -> TorchKv {
        TorchKv {
            layers: (0..self.layout.layers.len()).map(|_| None).collect(),
            mask: vec![Vec::new(); batch],
            reserve: tokens,
            past: 0,
        }
    }

    fn forward_step(
        &self,
        ids: &candle_core::Tensor,
        mask: &candle_core::Tensor,
        cache: &mut TorchKv,
    ) -> Result<candle_core::Tensor> {
        let (b, t) = ids.dims2()?;
        if t == 0 {
            return Err(ModelError::Torch("forward_step needs at least one new token".into()));
        }
        if cache.mask.len() != b {
            return Err(ModelError::Torch(format!("cache has {} rows, input has {b}", cache.mask.len())));
        }
        let new: Vec<Vec<u32>> = mask.to_dtype(candle_core::DType::U32)?.to_vec2()?;
        let full: Vec<Vec<u8>> = cache
            .mask
            .iter()
            .zip(&new)
            .map(|(old, n)| old.iter().copied().chain(n.iter().map(|&x| u8::from(x != 0))).collect())
            .collect();
        let past = crate::decode::DecodeCache::len(cache);
        let st = self.lock();
        let p = self.inference_params(&st);
        let logits = guarded("torch decode", || {
            let c = self.ctx_over(&full, past)?;
            let ids = ids_to_torch(ids, self.device)?;
            cache.past = past;
            let logits = tch::no_grad(|| {
                let mut x = self.embed(&p, &ids);
                for li in 0..self.layout.layers.len() {
                    x = self.layer_cached(&p, li, &x, &c, Some(&mut *cache));
                }
                let hsz = self.config.hidden_size as i64;
                let last = x.view([c.b, c.t, hsz]).narrow(1, c.t - 1, 1).contiguous().view([c.b, hsz]);
                let h = self.rms(&last, &p[self.layout.norm]);
                h.linear(self.head_weight(&p), None::<&T>).to_kind(Kind::Float)
            });
            to_candle(&logits)
        })?;
        cache.mask = full;
        Ok(logits)
    }

    fn wants_pool(&self) -> bool {
        false
    }

    fn score_logprobs(
        &self,
        ids: &candle_core::Tensor,
        mask: &candle_core::Tensor,
        targets: &candle_core::Tensor,
    ) -> Result<candle_core::Tensor> {
        let (b, t) = ids.dims2()?;
        let st = self.lock();
        let p = self.inference_params(&st);
        guarded("torch scoring", || {
            let c = self.ctx(mask)?;
            let ids = ids_to_torch(ids, self.device)?;
            let tg = ids_to_torch(targets, self.device)?.view([-1]);
            let lp = tch::no_grad(|| {
                let mut x = self.embed(&p, &ids);
                for li in 0..self.layout.layers.len() {
                    x = self.layer(&p, li, &x, &c);
                }
                let hs = self.rms(&x, &p[self.layout.norm]);
                self.head_values(&p, &hs, &tg, false).0
            });
            self.values(&lp, b as i64, t as i64)
        })
    }
}
