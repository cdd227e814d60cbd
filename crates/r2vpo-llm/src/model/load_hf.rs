//! Loading a Hugging Face model folder: `config.json` plus
//! `model.safetensors` or a sharded `model.safetensors.index.json`.
//! bf16/f16 weights are upcast to the requested dtype (f32 for training).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{ModelError, Result};

/// The safetensors files of a folder, and the path to name in errors about
/// missing tensors (the single file, or the index).
pub fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, PathBuf)> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((vec![single.clone()], single));
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(ModelError::Io {
            path: single,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no model.safetensors and no model.safetensors.index.json in the folder",
            ),
        });
    }
    let text = std::fs::read_to_string(&index).map_err(|source| ModelError::Io { path: index.clone(), source })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Format { path: index.clone(), message: e.to_string() })?;
    let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| ModelError::Config {
        path: index.clone(),
        field: "weight_map".into(),
        message: "missing or not an object".into(),
    })?;
    let mut files = BTreeSet::new();
    for (tensor, file) in map {
        let f = file.as_str().ok_or_else(|| ModelError::Config {
            path: index.clone(),
            field: format!("weight_map.{tensor}"),
            message: "expected a file name".into(),
        })?;
        files.insert(dir.join(f));
    }
    Ok((files.into_iter().collect(), index))
}
