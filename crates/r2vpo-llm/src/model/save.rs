//! Saving a model as a Hugging Face folder (`config.json` +
//! `model.safetensors`), loadable by [`super::source::open`] and by
//! `transformers`. Tokenizer files are written by the tokenizer module.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor};
use serde_json::Value;

use super::{ModelConfig, ModelError, Result};

/// Writes `config.json` for `config` and `model.safetensors` of `tensors`
/// (f32, by Hugging Face name) into `dir`, creating it. A tied model saves
/// no `lm_head.weight`, as Hugging Face does.
pub fn save_hf_tensors(config: &ModelConfig, tensors: &HashMap<String, Tensor>, dir: &Path) -> Result<()> {
    save_hf_tensors_as(config, tensors, dir, HfLayout::default())
}

/// How [`save_hf_tensors_as`] lays a model out beyond the tensors'
/// values: what a rollout engine needs to reload a folder exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HfLayout {
    /// The dtype of the floating-point tensors written (`F32`, or `BF16`
    /// for a server that serves bf16: half the bytes per push); the
    /// config's `torch_dtype` says which.
    pub dtype: DType,
    /// Write a tied model untied: an explicit `lm_head.weight` (a copy of
    /// the embedding) and `tie_word_embeddings = false`. vLLM's in-place
    /// reload (`reload_weights`) never refreshes a tied output head, whose
    /// CPU kernel handle is built once from the start weights, so a tied
    /// push leaves it serving the old head; an untied one reloads exactly.
    pub untie: bool,
}

impl Default for HfLayout {
    fn default() -> Self {
        HfLayout { dtype: DType::F32, untie: false }
    }
}

/// [`save_hf_tensors`] with the dtype and head layout of `layout`.
pub fn save_hf_tensors_as(
    config: &ModelConfig,
    tensors: &HashMap<String, Tensor>,
    dir: &Path,
    layout: HfLayout,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io { path: dir.to_path_buf(), source })?;
    let mut cfg = config.clone();
    if let Some(arch) = cfg.architecture() {
        cfg.architectures = vec![arch.hf_class().to_string()];
        cfg.model_type = arch.model_type().to_string();
    }
    // transformers defaults a missing head_dim to hidden/heads for Llama
    // and Qwen2 but to 128 for Qwen3, which is not what this config means.
    cfg.head_dim = Some(config.head_dim());
    let dtype_name = match layout.dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    };
    // transformers < 5 reads `torch_dtype`, ≥ 5 reads `dtype`.
    cfg.extra.insert("torch_dtype".into(), Value::String(dtype_name.into()));
    if cfg.extra.contains_key("dtype") {
        cfg.extra.insert("dtype".into(), Value::String(dtype_name.into()));
    }
    let mut out: HashMap<String, Tensor> = HashMap::with_capacity(tensors.len() + 1);
    for (name, t) in tensors {
        let t = if t.dtype().is_float() && t.dtype() != layout.dtype { t.to_dtype(layout.dtype)? } else { t.clone() };
        out.insert(name.clone(), t);
    }
    if layout.untie && cfg.tie_word_embeddings {
        let embed = out.get("model.embed_tokens.weight").cloned().ok_or_else(|| ModelError::Mismatch {
            tensor: "model.embed_tokens.weight".into(),
            message: "missing: a tied model cannot be written untied without its embedding".into(),
        })?;
        out.insert("lm_head.weight".into(), embed);
        cfg.tie_word_embeddings = false;
    }
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, cfg.to_json_string() + "\n")
        .map_err(|source| ModelError::Io { path: cfg_path.clone(), source })?;

    let st = dir.join("model.safetensors");
    candle_core::safetensors::save(&out, &st)
        .map_err(|e| ModelError::Format { path: st.clone(), message: format!("writing safetensors: {e}") })?;
    readable(&st)
}

/// [`r2vpo_report::permissions_as_created`] for a weights file just
/// written: servers and actors may run as another user.
pub(crate) fn readable(path: &Path) -> Result<()> {
    r2vpo_report::permissions_as_created(path)
        .map_err(|e| ModelError::Format { path: path.to_path_buf(), message: e.to_string() })
}
