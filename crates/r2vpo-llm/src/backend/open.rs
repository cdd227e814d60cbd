//! The one place a backend is chosen: a [`BackendSpec`] (which backend,
//! where, in what dtype) and a model's description and weight source make
//! a [`Policy`] or a [`Backend`].

use super::candle::{CandleBackend, Transformer};
#[cfg(feature = "torch")]
use super::torch;
use super::{Backend, BackendKind, ComputeDtype, OptimConfig, Policy};
use crate::model::lora::AdapterInit;
use crate::model::{LoraConfig, ModelConfig, ModelError, Result, TensorSource};

/// Everything that decides how a model is computed: the one description
/// the trainer, the server and the benches open a backend from ([`open`]).
#[derive(Clone, Debug, PartialEq)]
pub struct BackendSpec {
    /// Which backend.
    pub kind: BackendKind,
    /// `cpu`, `cuda` or `cuda:N` ([`crate::model::cuda_ordinal`]).
    pub device: String,
    /// The dtype forwards and backwards compute in (weights, gradients and
    /// AdamW moments stay f32).
    pub compute_dtype: ComputeDtype,
    /// Per-layer gradient checkpointing in the learner.
    pub checkpointing: bool,
    /// Low-rank adapters on a frozen base instead of training every
    /// weight (a learner's, and its actors', which receive adapters).
    pub lora: Option<LoraConfig>,
}

impl Default for BackendSpec {
    fn default() -> Self {
        BackendSpec {
            kind: BackendKind::Candle,
            device: "cpu".into(),
            compute_dtype: ComputeDtype::F32,
            checkpointing: false,
            lora: None,
        }
    }
}

/// A model opened on a backend: the concrete types, for callers that need
/// more than the traits (the server's KV-cached decoder,
/// [`crate::engine::DecodeModel`]). One lives per engine or learner, so the
/// variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Opened {
    /// The candle model.
    Candle(Transformer),
    /// The libtorch model.
    #[cfg(feature = "torch")]
    Torch(torch::TorchBackend),
}

impl From<Transformer> for Opened {
    fn from(m: Transformer) -> Self {
        Opened::Candle(m)
    }
}

#[cfg(feature = "torch")]
impl From<torch::TorchBackend> for Opened {
    fn from(m: torch::TorchBackend) -> Self {
        Opened::Torch(m)
    }
}

impl Opened {
    /// The model as a [`Policy`] (sampling and scoring).
    pub fn into_policy(self) -> Box<dyn Policy> {
        match self {
            Opened::Candle(m) => Box::new(m),
            #[cfg(feature = "torch")]
            Opened::Torch(t) => Box::new(t),
        }
    }
}

/// Opens `config`'s model with the weights of `source` as `spec` asks:
/// the one place a backend is chosen. Each tensor is read from `source`,
/// converted and placed before the next ([`crate::model::source`]). The
/// optimizer `optim` is used only if the model learns ([`Backend`]).
pub fn open(spec: &BackendSpec, config: &ModelConfig, source: &dyn TensorSource, optim: OptimConfig) -> Result<Opened> {
    open_as(spec, config, source, optim, false)
}

/// [`open`] for a server's model, which never learns and answers to no
/// learner's numerics: the same, except that a bf16 spec on the candle backend
/// stores the weight matrices in bf16 and computes in f32
/// ([`Transformer::bf16_weights`]): half the memory and half the bytes a
/// decode step reads, products on [`r2vpo_kernels::bf16w`]. A learner's
/// bf16 (f32 master weights, forwards in bf16) is [`open`]'s.
pub fn open_inference(spec: &BackendSpec, config: &ModelConfig, source: &dyn TensorSource) -> Result<Opened> {
    open_as(spec, config, source, OptimConfig::default(), true)
}

fn open_as(
    spec: &BackendSpec,
    config: &ModelConfig,
    source: &dyn TensorSource,
    optim: OptimConfig,
    inference: bool,
) -> Result<Opened> {
    let spec_err = |field: &str, message: String| ModelError::Spec { field: field.into(), message };
    spec.kind.check_built()?;
    match spec.kind {
        BackendKind::Candle => {
            let device = crate::backend::candle::open_device(&spec.device).map_err(|m| spec_err("device", m))?;
            let _ = optim;
            let bf16_weights = inference && spec.compute_dtype == ComputeDtype::Bf16 && device.is_cpu();
            let storage = if bf16_weights { candle_core::DType::BF16 } else { candle_core::DType::F32 };
            let mut model = Transformer::from_source(config.clone(), source, storage, &device)?;
            if let Some(lora) = &spec.lora {
                model = model.with_adapters(lora, &AdapterInit::new(config, lora))?;
            }
            model.set_compute_dtype(if bf16_weights { candle_core::DType::F32 } else { spec.compute_dtype.dtype() });
            Ok(Opened::Candle(model))
        }
        #[cfg(feature = "torch")]
        BackendKind::Torch => {
            let opts = torch::TorchOptions {
                cuda: torch::torch_device(&spec.device).map_err(|m| spec_err("device", m))?,
                bf16: spec.compute_dtype == ComputeDtype::Bf16,
                checkpointing: spec.checkpointing,
            };
            Ok(Opened::Torch(match &spec.lora {
                None => torch::TorchBackend::new(config.clone(), source, optim, opts)?,
                Some(lora) => torch::TorchBackend::with_lora(
                    config.clone(),
                    source,
                    lora,
                    &AdapterInit::new(config, lora),
                    optim,
                    opts,
                )?,
            }))
        }
        #[cfg(not(feature = "torch"))]
        BackendKind::Torch => unreachable!("check_built refused it"),
    }
}

/// [`open`] for inference only (sampling, scoring: an actor's policy, the
/// KL reference).
pub fn open_policy(spec: &BackendSpec, config: &ModelConfig, source: &dyn TensorSource) -> Result<Box<dyn Policy>> {
    // `open`, not `open_inference`: a trainer's actors and KL reference
    // compute exactly as its learner does, so a reference equals the
    // policy at the start and the behaviour log-probs carry no dtype
    // mismatch.
    Ok(open(spec, config, source, OptimConfig::default())?.into_policy())
}

/// [`open`] for learning, with AdamW `optim`.
pub fn open_backend(
    spec: &BackendSpec,
    config: &ModelConfig,
    source: &dyn TensorSource,
    optim: OptimConfig,
) -> Result<Box<dyn Backend>> {
    Ok(match open(spec, config, source, optim)? {
        Opened::Candle(m) => Box::new(CandleBackend::new(m, optim, spec.checkpointing)?),
        #[cfg(feature = "torch")]
        Opened::Torch(t) => Box::new(t),
    })
}
