//! Versioned weights, the one form in which a policy leaves its backend:
//! what rollout sources push to servers, what the weight channel hands to
//! actors and what checkpoints and exports write. Tensors are f32 on the
//! CPU under their Hugging Face names, whichever backend made them, so a
//! checkpoint written by one backend loads in another.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use candle_core::Tensor;

use crate::model::{LoraConfig, ModelConfig, ModelError};

/// A policy's weights at one version: an immutable snapshot (the learner
/// goes on updating its own copy), cheap to clone.
#[derive(Clone, Debug)]
pub struct Weights {
    /// The weight version: the learner's iteration count when it exported
    /// them (what samples are tagged with and staleness is measured in).
    pub version: u64,
    /// f32 CPU tensors by Hugging Face parameter name.
    pub tensors: Arc<HashMap<String, Tensor>>,
    /// Set when the tensors are low-rank adapters of this configuration
    /// (PEFT names), to apply on the base the receiver started from: what
    /// a learner that trains adapters hands its actors, megabytes instead
    /// of the model ([`crate::backend::Policy::apply_weights`]).
    pub adapter: Option<LoraConfig>,
}

impl Weights {
    /// Weights of version `version`.
    pub fn new(version: u64, tensors: HashMap<String, Tensor>) -> Self {
        Weights { version, tensors: Arc::new(tensors), adapter: None }
    }

    /// Adapters of configuration `lora` (PEFT names) as version `version`.
    pub fn of_adapter(version: u64, lora: LoraConfig, tensors: HashMap<String, Tensor>) -> Self {
        Weights { version, tensors: Arc::new(tensors), adapter: Some(lora) }
    }

    /// Writes the tensors as one safetensors file.
    pub fn save_safetensors(&self, path: &Path) -> crate::model::Result<()> {
        candle_core::safetensors::save(self.tensors.as_ref(), path).map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            message: format!("writing safetensors: {e}"),
        })?;
        crate::model::save::readable(path)
    }

    /// Reads a safetensors file written by [`Weights::save_safetensors`]
    /// (or any Hugging Face weights file) as version `version`.
    pub fn load_safetensors(path: &Path, version: u64) -> crate::model::Result<Self> {
        let tensors = candle_core::safetensors::load(path, &candle_core::Device::Cpu).map_err(|e| {
            ModelError::Format { path: path.to_path_buf(), message: format!("reading safetensors: {e}") }
        })?;
        Ok(Weights::new(version, tensors))
    }

    /// Writes a Hugging Face folder (`config.json` for `config`,
    /// `model.safetensors`), loadable by [`crate::backend::candle::load_model`] and
    /// by `transformers`; tokenizer files are the tokenizer's to write.
    pub fn save_hf_dir(&self, config: &ModelConfig, dir: &Path) -> crate::model::Result<()> {
        crate::model::save::save_hf_tensors(config, &self.tensors, dir)
    }

    /// [`Weights::save_hf_dir`] in the dtype and head layout a rollout
    /// engine needs ([`crate::model::save::HfLayout`]).
    pub fn save_hf_dir_as(
        &self,
        config: &ModelConfig,
        dir: &Path,
        layout: crate::model::save::HfLayout,
    ) -> crate::model::Result<()> {
        crate::model::save::save_hf_tensors_as(config, &self.tensors, dir, layout)
    }
}

impl crate::model::TensorSource for Weights {
    fn origin(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("<weight version {}>", self.version))
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.keys().cloned().collect();
        v.sort();
        v
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }

    fn tensor(&self, name: &str) -> crate::model::Result<Tensor> {
        self.tensors.get(name).cloned().ok_or_else(|| ModelError::Mismatch {
            tensor: name.to_string(),
            message: format!("missing from weight version {}", self.version),
        })
    }
}

/// Errors of a weight channel.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// Writing, reading or applying the weights failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The channel's store refused a call or holds something malformed.
    #[error("weight channel: {0}")]
    Channel(String),
}

impl From<candle_core::Error> for WeightsError {
    fn from(e: candle_core::Error) -> Self {
        WeightsError::Model(ModelError::Candle(e))
    }
}

/// What [`WeightChannel::fetch`] found.
#[derive(Clone, Debug)]
pub enum Fetched {
    /// The newest weights are the version the caller already holds.
    Current(u64),
    /// Newer weights than the caller holds.
    New(Weights),
    /// The learner has not consumed enough batches yet.
    Pending,
    /// The run has ended.
    Closed,
}

/// How the learner's weights reach the actors, with its progress (batches
/// consumed) for the staleness bound. One implementation per real thing:
/// in memory for actor threads (`train::asynchronous`), a shared folder
/// announced in Redis for actor processes (`r2vpo_queue::SharedWeights`).
pub trait WeightChannel: Send + Sync {
    /// Makes `weights` the newest, the learner having consumed `consumed`
    /// batches.
    fn publish(&self, weights: &Weights, consumed: u64) -> Result<(), WeightsError>;

    /// Waits up to `wait` until the learner has consumed `consumed`
    /// batches, then answers the newest weights unless their version is
    /// `have`.
    fn fetch(&self, consumed: u64, have: Option<u64>, wait: Duration) -> Result<Fetched, WeightsError>;

    /// Tells the actors the run has ended.
    fn close(&self) -> Result<(), WeightsError>;

    /// Whether the run has ended.
    fn closed(&self) -> bool;
}
