//! The candle backend: the [`Transformer`] (one config-driven decoder for
//! every supported architecture) on the CPU kernels of `r2vpo-kernels` (or
//! candle's CUDA backend in a `make build-gpu` binary), with [`AdamW`]
//! updating its `Var`s in place.
//!
//! Two facts about candle 0.11 shape it (see
//! `shared/notes/candle-llm-training.md`):
//! * candle-nn's fused kernels record no backward, so every op on the
//!   training path is either a candle primitive or one of our [`ops`] with a
//!   hand-written `bwd`;
//! * candle has no `no_grad`, so inference runs on detached weight handles
//!   ([`Transformer::forward_step`], [`Transformer::score_logprobs`]), which
//!   share storage with the trainable `Var`s and therefore see optimizer
//!   updates without retaining a graph.

pub mod adamw;
pub mod device;
pub mod ops;
pub mod transformer;

use crate::pool::on_pool;
pub use device::open_device;
pub use transformer::{CheckpointedTail, KvCache, PrefixedRows, Transformer};

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor};

use super::batch::{Inputs, MicroBatch};
use super::OptimConfig;
use super::{Backend, Forward, Policy};
use crate::model::{LoraConfig, ModelConfig, Result, TensorSource};
use crate::sample::{Generation, GenerationRequest, SamplingConfig};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use adamw::{global_norm, AdamW};

impl Policy for Transformer {
    fn config(&self) -> &ModelConfig {
        Transformer::config(self)
    }

    fn device(&self) -> &candle_core::Device {
        Transformer::device(self)
    }

    fn describe(&self) -> String {
        let dev = if self.device().is_cpu() { "cpu".to_string() } else { format!("{:?}", self.device().location()) };
        format!("candle {dev} ({})", r2vpo_kernels::dispatch::path())
    }

    fn shares_prompt_prefix(&self) -> bool {
        true
    }

    fn packs_sequences(&self) -> bool {
        true
    }

    fn score(&self, batch: &MicroBatch) -> Result<Tensor> {
        on_pool(|| match &batch.inputs {
            Inputs::Padded { ids, attention } => self.score_tail_logprobs(ids, attention, batch.tail),
            Inputs::Prefixed(shared) => self.score_prefixed_tail_logprobs(&shared.as_rows()),
            Inputs::Packed(packed) => self.score_packed_tail_logprobs(packed, batch.mask.dim(0)?, batch.tail),
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
        Ok(Weights::new(version, self.merged_tensors()?))
    }

    fn lora(&self) -> Option<&LoraConfig> {
        Transformer::lora(self)
    }

    fn export_adapter(&self) -> Result<Option<HashMap<String, Tensor>>> {
        self.lora().is_some().then(|| self.adapter_tensors()).transpose()
    }

    fn load_adapter(&self, source: &dyn TensorSource) -> Result<()> {
        self.load_adapters(source)
    }

    fn load(&self, weights: &dyn TensorSource) -> Result<()> {
        let vars = self.named_vars();
        let expected: Vec<(String, Vec<usize>)> =
            vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().dims().to_vec())).collect();
        super::check_fits(weights, &expected)?;
        for (n, v) in vars {
            let live = v.as_tensor();
            v.set(&weights.tensor(&n)?.to_dtype(live.dtype())?.to_device(live.device())?)?;
        }
        Ok(())
    }
}

/// What the last forward left for the backward.
enum Pending {
    /// The log-probs (and entropies) with their graph.
    Graph { logp: Tensor, entropy: Option<Tensor> },
    /// Each layer's input, for a checkpointed backward.
    Checkpointed(CheckpointedTail),
}

/// The candle learner: the model, its optimizer and the gradients summed
/// over the current step's micro-batches.
pub struct CandleBackend {
    model: Transformer,
    opt: AdamW,
    grads: Vec<Option<Tensor>>,
    pending: Option<Pending>,
    checkpointing: bool,
}

impl CandleBackend {
    /// A learner of `model` with AdamW `optim`; with `checkpointing`,
    /// padded micro-batches are learned by per-layer gradient
    /// checkpointing ([`Transformer::checkpointed_tail`]; no entropy bonus
    /// then).
    pub fn new(model: Transformer, optim: OptimConfig, checkpointing: bool) -> Result<Self> {
        let opt = AdamW::new(model.trainable_vars(), optim)?;
        let grads = vec![None; opt.vars().len()];
        Ok(CandleBackend { model, opt, grads, pending: None, checkpointing })
    }

    /// The model being trained.
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// Adds the gradients in `gs` to the step's.
    fn accumulate(&mut self, gs: &candle_core::backprop::GradStore) -> Result<()> {
        for (i, v) in self.opt.vars().iter().enumerate() {
            if let Some(gv) = gs.get(v.as_tensor()) {
                self.grads[i] = Some(match self.grads[i].take() {
                    Some(prev) => prev.add(gv)?,
                    None => gv.clone(),
                });
            }
        }
        Ok(())
    }
}

impl Policy for CandleBackend {
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn device(&self) -> &candle_core::Device {
        self.model.device()
    }

    fn describe(&self) -> String {
        Policy::describe(&self.model)
    }

    fn shares_prompt_prefix(&self) -> bool {
        true
    }

    fn packs_sequences(&self) -> bool {
        true
    }

    fn score(&self, batch: &MicroBatch) -> Result<Tensor> {
        Policy::score(&self.model, batch)
    }

    fn generate(
        &self,
        tok: &Tokenizer,
        requests: &[GenerationRequest],
        cfg: &SamplingConfig,
    ) -> crate::sample::Result<Vec<Generation>> {
        Policy::generate(&self.model, tok, requests, cfg)
    }

    fn export(&self, version: u64) -> Result<Weights> {
        self.model.export(version)
    }

    fn load(&self, weights: &dyn TensorSource) -> Result<()> {
        self.model.load(weights)
    }

    fn lora(&self) -> Option<&LoraConfig> {
        self.model.lora()
    }

    fn export_adapter(&self) -> Result<Option<HashMap<String, Tensor>>> {
        Policy::export_adapter(&self.model)
    }

    fn load_adapter(&self, source: &dyn TensorSource) -> Result<()> {
        self.model.load_adapters(source)
    }
}

impl Backend for CandleBackend {
    fn forward(&mut self, batch: &MicroBatch, entropy: bool) -> Result<Forward> {
        let m = &self.model;
        let (pending, out) = on_pool(|| -> Result<_> {
            Ok(match (&batch.inputs, self.checkpointing) {
                (inputs @ (Inputs::Padded { .. } | Inputs::Packed(_)), true) => {
                    if entropy {
                        return Err(candle_core::Error::Msg(
                            "the entropy bonus is not checkpointed (activation_checkpointing needs entropy_coef = 0)"
                                .into(),
                        )
                        .into());
                    }
                    let pass = match inputs {
                        Inputs::Packed(packed) => m.checkpointed_packed(packed, batch.mask.dim(0)?, batch.tail)?,
                        Inputs::Padded { ids, attention } => m.checkpointed_tail(ids, attention, batch.tail)?,
                        Inputs::Prefixed(_) => unreachable!("matched above"),
                    };
                    let logp = pass.logprobs().clone();
                    (Pending::Checkpointed(pass), Forward { logp, entropy: None })
                }
                (inputs, _) => {
                    let logp = match inputs {
                        Inputs::Padded { ids, attention } => m.tail_logprobs(ids, attention, batch.tail)?,
                        Inputs::Prefixed(shared) => m.prefixed_tail_logprobs(&shared.as_rows())?,
                        Inputs::Packed(packed) => m.packed_tail_logprobs(packed, batch.mask.dim(0)?, batch.tail)?,
                    };
                    let ent = if entropy {
                        Some(match inputs {
                            Inputs::Padded { ids, attention } => m.tail_entropy(ids, attention, batch.tail)?,
                            Inputs::Prefixed(shared) => m.prefixed_tail_entropy(&shared.as_rows())?,
                            Inputs::Packed(packed) => m.packed_tail_entropy(packed, batch.mask.dim(0)?, batch.tail)?,
                        })
                    } else {
                        None
                    };
                    let out = Forward { logp: logp.detach(), entropy: ent.as_ref().map(Tensor::detach) };
                    (Pending::Graph { logp, entropy: ent }, out)
                }
            })
        })?;
        self.pending = Some(pending);
        Ok(out)
    }

    fn backward(&mut self, dlogp: &Tensor, dentropy: Option<&Tensor>) -> Result<()> {
        let pending =
            self.pending.take().ok_or_else(|| candle_core::Error::Msg("backward without a forward".into()))?;
        let m = &self.model;
        let gs = on_pool(|| -> Result<_> {
            Ok(match pending {
                Pending::Graph { logp, entropy } => {
                    // Weighting by the incoming gradient and summing makes
                    // the backward's seed at `logp` exactly `dlogp`
                    // (1 × x), so the gradients are the bits of one
                    // backward through loss and model together.
                    let mut seed = (logp * dlogp)?.sum_all()?;
                    if let (Some(e), Some(de)) = (entropy, dentropy) {
                        seed = (seed + (e * de)?.sum_all()?)?;
                    }
                    seed.backward()?
                }
                Pending::Checkpointed(pass) => m.checkpointed_backward(pass, dlogp)?,
            })
        })?;
        self.accumulate(&gs)
    }

    fn grad_norm(&self) -> Result<f64> {
        global_norm(&self.grads)
    }

    fn step(&mut self, grad_scale: f64) -> Result<f64> {
        let lr = self.opt.step(&self.grads, grad_scale)?;
        self.zero_grad();
        Ok(lr)
    }

    fn zero_grad(&mut self) {
        self.grads.iter_mut().for_each(|g| *g = None);
        self.pending = None;
    }

    fn gradients(&self) -> Result<HashMap<String, Tensor>> {
        let cpu = candle_core::Device::Cpu;
        let mut out = HashMap::new();
        for (n, g) in self.opt.names().iter().zip(&self.grads) {
            if let Some(g) = g {
                out.insert(n.clone(), g.to_dtype(DType::F32)?.to_device(&cpu)?);
            }
        }
        Ok(out)
    }

    fn optimizer_steps(&self) -> u64 {
        self.opt.steps()
    }

    fn save_optimizer(&self, path: &Path) -> Result<()> {
        self.opt.save(path)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(self.model.device().synchronize()?)
    }

    fn load_optimizer(&mut self, path: &Path, steps: u64) -> Result<()> {
        self.opt.load(path, steps)
    }
}

/// Loads a model from a Hugging Face folder or a `.gguf` file, as weights
/// of `dtype` (f32 for training) on `device`.
pub fn load_model(
    path: &std::path::Path,
    dtype: candle_core::DType,
    device: &candle_core::Device,
) -> Result<Transformer> {
    let (config, source) = crate::model::source::open(path)?;
    Transformer::from_source(config, source.as_ref(), dtype, device)
}

/// Loads a Hugging Face folder into a candle model of `dtype` on `device`
/// (one tensor at a time, [`crate::model::source`]).
pub fn load_hf_dir(dir: &Path, dtype: DType, device: &candle_core::Device) -> Result<Transformer> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let (files, name_for_errors) = crate::model::load_hf::weight_files(dir)?;
    let source = crate::model::source::SafetensorsFiles::open(&files, name_for_errors)?;
    Transformer::from_source(config, &source, dtype, device)
}

/// Loads a GGUF file into a candle model of `dtype` on `device` (one
/// tensor at a time, [`crate::model::source::GgufFile`]).
pub fn load_gguf(path: &Path, dtype: DType, device: &candle_core::Device) -> Result<Transformer> {
    let gguf = crate::model::source::GgufFile::open(path)?;
    Transformer::from_source(gguf.config().clone(), &gguf, dtype, device)
}

impl crate::decode::DecodeCache for KvCache {
    fn batch(&self) -> usize {
        KvCache::batch(self)
    }

    fn len(&self) -> usize {
        KvCache::len(self)
    }

    fn select_rows(&mut self, rows: &[usize]) -> Result<()> {
        KvCache::select_rows(self, rows)
    }

    fn append_rows(&mut self, other: Self) -> Result<()> {
        KvCache::append_rows(self, other)
    }

    fn trim_padding(&mut self) -> Result<()> {
        KvCache::trim_padding(self)
    }
}

impl crate::decode::Decoder for Transformer {
    type Cache = KvCache;

    fn config(&self) -> &ModelConfig {
        Transformer::config(self)
    }

    fn input_device(&self) -> &candle_core::Device {
        self.device()
    }

    fn new_cache(&self, batch: usize, tokens: usize) -> Self::Cache {
        KvCache::with_capacity(self, batch, tokens)
    }

    fn forward_step(&self, ids: &Tensor, mask: &Tensor, cache: &mut Self::Cache) -> Result<Tensor> {
        Transformer::forward_step(self, ids, mask, cache)
    }

    fn score_logprobs(&self, ids: &Tensor, mask: &Tensor, targets: &Tensor) -> Result<Tensor> {
        Transformer::score_logprobs(self, ids, mask, targets)
    }
}
