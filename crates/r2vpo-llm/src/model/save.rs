//! Saving a model as a Hugging Face folder (`config.json` +
//! `model.safetensors`), loadable by [`super::source::open`] and by
//! `transformers`. Tokenizer files are written by the tokenizer module.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use serde_json::Value;

use super::{ModelConfig, ModelError, Result};

/// Writes `config.json` for `config` and `model.safetensors` of `tensors`
/// (f32, by Hugging Face name) into `dir`, creating it. A tied model saves
/// no `lm_head.weight`, as Hugging Face does.
pub fn save_hf_tensors(config: &ModelConfig, tensors: &HashMap<String, Tensor>, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io { path: dir.to_path_buf(), source })?;
    let mut cfg = config.clone();
    if let Some(arch) = cfg.architecture() {
        cfg.architectures = vec![arch.hf_class().to_string()];
        cfg.model_type = arch.model_type().to_string();
    }
    // transformers defaults a missing head_dim to hidden/heads for Llama
    // and Qwen2 but to 128 for Qwen3, which is not what this config means.
    cfg.head_dim = Some(config.head_dim());
    // transformers < 5 reads `torch_dtype`, ≥ 5 reads `dtype`.
    cfg.extra.insert("torch_dtype".into(), Value::String("float32".into()));
    if cfg.extra.contains_key("dtype") {
        cfg.extra.insert("dtype".into(), Value::String("float32".into()));
    }
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, cfg.to_json_string() + "\n")
        .map_err(|source| ModelError::Io { path: cfg_path.clone(), source })?;

    let st = dir.join("model.safetensors");
    candle_core::safetensors::save(tensors, &st)
        .map_err(|e| ModelError::Format { path: st.clone(), message: format!("writing safetensors: {e}") })?;
    readable(&st)
}

/// [`r2vpo_report::permissions_as_created`] for a weights file just
/// written: servers and actors may run as another user.
pub(crate) fn readable(path: &Path) -> Result<()> {
    r2vpo_report::permissions_as_created(path)
        .map_err(|e| ModelError::Format { path: path.to_path_buf(), message: e.to_string() })
}
