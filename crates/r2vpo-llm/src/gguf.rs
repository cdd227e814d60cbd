//! Reading GGUF files' metadata: what a model file says it is before any
//! weight is loaded, so a wrong file fails fast with its name and the field.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use serde::Serialize;

/// Errors from reading a GGUF file; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened.
    #[error("{path}: {source}")]
    Io {
        /// The GGUF file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The header or metadata is not valid GGUF.
    #[error("{path}: not a valid GGUF file: {message}")]
    Format {
        /// The GGUF file.
        path: PathBuf,
        /// What the parser reported.
        message: String,
    },
    /// A metadata key the model needs is missing or has the wrong type.
    #[error("{path}: metadata field `{field}`: {message}")]
    Field {
        /// The GGUF file.
        path: PathBuf,
        /// The metadata key, e.g. `llama.block_count`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// The architecture-level facts of a GGUF model.
#[derive(Clone, Debug, Serialize)]
pub struct GgufSummary {
    /// `general.architecture`, e.g. `llama` or `qwen2`.
    pub architecture: String,
    /// `general.name` when present.
    pub name: Option<String>,
    /// Transformer blocks.
    pub layers: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Key/value heads (GQA), equal to `heads` when absent.
    pub kv_heads: u64,
    /// Context length the model was trained with.
    pub context_length: Option<u64>,
    /// Tokenizer vocabulary size.
    pub vocab: usize,
    /// Whether a chat template is embedded.
    pub has_chat_template: bool,
    /// Number of tensors and of parameters.
    pub tensors: usize,
    /// Total parameter count.
    pub parameters: u64,
    /// Tensor count per quantisation type, e.g. `Q4_1: 211`.
    pub dtypes: BTreeMap<String, usize>,
}

/// Reads the header and metadata of `path` (no weights are loaded).
pub fn read_summary(path: &Path) -> Result<GgufSummary, GgufError> {
    let f = File::open(path).map_err(|source| GgufError::Io { path: path.to_path_buf(), source })?;
    let content = Content::read(&mut BufReader::new(f))
        .map_err(|e| GgufError::Format { path: path.to_path_buf(), message: e.to_string() })?;
    summarize(path, &content)
}

fn summarize(path: &Path, c: &Content) -> Result<GgufSummary, GgufError> {
    let field_err =
        |field: &str, message: String| GgufError::Field { path: path.to_path_buf(), field: field.to_string(), message };
    let get = |key: &str| c.metadata.get(key);
    let string = |key: &str| -> Result<String, GgufError> {
        get(key)
            .ok_or_else(|| field_err(key, "missing".into()))?
            .to_string()
            .cloned()
            .map_err(|e| field_err(key, e.to_string()))
    };
    let int = |key: &str| -> Result<Option<u64>, GgufError> {
        match get(key) {
            None => Ok(None),
            Some(v) => as_u64(v)
                .map(Some)
                .ok_or_else(|| field_err(key, format!("expected an integer, found {:?}", v.value_type()))),
        }
    };
    let arch = string("general.architecture")?;
    let need = |suffix: &str| -> Result<u64, GgufError> {
        let key = format!("{arch}.{suffix}");
        int(&key)?.ok_or_else(|| field_err(&key, "missing".into()))
    };
    let heads = need("attention.head_count")?;
    let vocab = match get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => a.len(),
        Some(v) => {
            return Err(field_err("tokenizer.ggml.tokens", format!("expected an array, found {:?}", v.value_type())))
        }
        None => return Err(field_err("tokenizer.ggml.tokens", "missing".into())),
    };
    let mut dtypes = BTreeMap::new();
    let mut parameters = 0u64;
    for info in c.tensor_infos.values() {
        *dtypes.entry(format!("{:?}", info.ggml_dtype)).or_insert(0) += 1;
        parameters += info.shape.elem_count() as u64;
    }
    Ok(GgufSummary {
        name: get("general.name").and_then(|v| v.to_string().ok().cloned()),
        layers: need("block_count")?,
        hidden: need("embedding_length")?,
        heads,
        kv_heads: int(&format!("{arch}.attention.head_count_kv"))?.unwrap_or(heads),
        context_length: int(&format!("{arch}.context_length"))?,
        vocab,
        has_chat_template: get("tokenizer.chat_template").is_some(),
        tensors: c.tensor_infos.len(),
        parameters,
        dtypes,
        architecture: arch,
    })
}

fn as_u64(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_header_names_the_file() {
        let dir = std::env::temp_dir().join(format!("r2vpo-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("broken.gguf");
        std::fs::write(&p, b"GGUF\x03\x00\x00\x00garbage").unwrap();
        let e = read_summary(&p).unwrap_err().to_string();
        assert!(e.contains("broken.gguf"), "{e}");
        let e = read_summary(&dir.join("missing.gguf")).unwrap_err().to_string();
        assert!(e.contains("missing.gguf"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The embedded default model (fetched by `make deps`) is SmolLM2-135M:
    /// 30 Llama blocks, hidden 576, 9 heads over 3 KV heads, 49152 tokens.
    #[test]
    fn embedded_smollm2_summary() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let s = read_summary(&p).unwrap_or_else(|e| panic!("{e} (run `make deps`)"));
        assert_eq!(s.architecture, "llama");
        assert_eq!((s.layers, s.hidden, s.heads, s.kv_heads, s.vocab), (30, 576, 9, 3, 49152));
        assert!(s.has_chat_template);
        // 134.5M parameters with a tied embedding.
        assert!((130_000_000..140_000_000).contains(&s.parameters), "{}", s.parameters);
    }
}
