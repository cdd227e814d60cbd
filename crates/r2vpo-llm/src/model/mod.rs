//! What a model is, independent of any compute backend: its description
//! ([`ModelConfig`]: Llama/SmolLM2, Qwen2/Qwen2.5 with qkv bias, Qwen3 with
//! q/k RMSNorm), its parameters' names and shapes ([`expected_params`]),
//! where its weights come from ([`source`]: Hugging Face folders and GGUF
//! files read one tensor at a time) and how they are written back
//! ([`save`]). Backends (`crate::backend::candle`, the torch backend) are
//! built from these; nothing here depends on one.

pub mod config;
pub mod load_gguf;
pub mod load_hf;
pub mod lora;
pub mod save;
pub mod source;

use std::path::PathBuf;

pub use config::{expected_params, Architecture, ModelConfig, RopeScaling};
pub use lora::{LoraConfig, LoraTarget};
pub use source::{RandomInit, TensorSource};

/// The syntax of a device name alone: `cpu` → `None`, `cuda` → device 0,
/// `cuda:N` → device N; anything else is refused with what was expected.
pub fn cuda_ordinal(name: &str) -> std::result::Result<Option<usize>, String> {
    match name.split_once(':') {
        None if name == "cpu" => Ok(None),
        None if name == "cuda" => Ok(Some(0)),
        Some(("cuda", n)) => {
            n.parse::<usize>().map(Some).map_err(|_| format!("`{name}`: `{n}` is not a device number"))
        }
        _ => Err(format!("`{name}`: expected cpu, cuda or cuda:N")),
    }
}

/// Errors from building, loading or saving a model; each names the file and
/// the field or tensor concerned where there is one.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A configuration field is missing, malformed or inconsistent.
    #[error("{path}: config field `{field}`: {message}")]
    Config {
        /// The configuration file (`config.json`, or the GGUF file).
        path: PathBuf,
        /// The field, e.g. `num_key_value_heads`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A weight tensor is missing, has the wrong shape or cannot be decoded.
    #[error("{path}: tensor `{tensor}`: {message}")]
    Tensor {
        /// The weights file.
        path: PathBuf,
        /// The tensor name (Hugging Face or GGUF naming as in the file).
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// A file is not in the expected format (corrupt header, bad JSON).
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What the parser reported.
        message: String,
    },
    /// Weights handed to a model do not fit it (a missing tensor, another
    /// shape).
    #[error("weights: tensor `{tensor}`: {message}")]
    Mismatch {
        /// The tensor name (Hugging Face naming).
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// A backend cannot be opened as its [`crate::backend::open::BackendSpec`]
    /// asks (a malformed device, a backend this binary was built without).
    #[error("backend option `{field}`: {message}")]
    Spec {
        /// The spec's field: `backend`, `device` or `compute_dtype`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// An error from libtorch while computing (the torch backend).
    #[error("libtorch: {0}")]
    Torch(String),
    /// An error from candle while computing.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, ModelError>;
