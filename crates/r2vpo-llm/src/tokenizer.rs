//! Tokenizers for the models r2vpo trains, built either from a Hugging Face
//! folder (`tokenizer.json` + `tokenizer_config.json`) or from the metadata
//! of a GGUF file (`tokenizer.ggml.*`), both on the `tokenizers` crate.
//!
//! The GGUF recipe (measured in `shared/notes/candle-llm-training.md` §3):
//! a byte-level BPE over `tokenizer.ggml.tokens`/`merges`, the
//! pre-tokenizer llama.cpp names in `tokenizer.ggml.pre` (for SmolLM2,
//! `smollm`: every digit split off, then the GPT-2 regex), a byte-level
//! decoder, and the control tokens (`token_type` 3) registered as special
//! added tokens so chat markup such as `<|im_start|>` encodes as one id.
//!
//! Batches are LEFT-padded, as the model and the sampler expect.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// Errors from building or running a tokenizer; each names the file and,
/// where there is one, the field.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A field is missing, has the wrong type, or holds an unsupported value.
    #[error("{path}: field `{field}`: {message}")]
    Field {
        /// `tokenizer_config.json`, `tokenizer.json` or the GGUF file.
        path: PathBuf,
        /// The field, e.g. `tokenizer.ggml.merges` or `eos_token`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The file is not in the expected format (bad JSON, corrupt GGUF).
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What the parser reported.
        message: String,
    },
    /// Encoding or decoding failed (the source the tokenizer came from is named).
    #[error("tokenizer from {source_name}: {message}")]
    Codec {
        /// Where the tokenizer was built from.
        source_name: String,
        /// What the `tokenizers` crate reported.
        message: String,
    },
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, TokenizerError>;

/// A left-padded batch of token sequences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddedBatch {
    /// `(B, T)` token ids; padding (on the left) is the pad id.
    pub ids: Vec<Vec<u32>>,
    /// `(B, T)` attention mask: 1 for real tokens, 0 for padding.
    pub mask: Vec<Vec<u8>>,
    /// Unpadded length of each row.
    pub lengths: Vec<usize>,
}

impl PaddedBatch {
    /// Left-pads `seqs` with `pad_id` to the longest one.
    pub fn left_pad(seqs: &[Vec<u32>], pad_id: u32) -> Self {
        let t = seqs.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(seqs.len());
        let mut mask = Vec::with_capacity(seqs.len());
        for s in seqs {
            let pad = t - s.len();
            ids.push(std::iter::repeat_n(pad_id, pad).chain(s.iter().copied()).collect());
            mask.push(std::iter::repeat_n(0u8, pad).chain(std::iter::repeat_n(1u8, s.len())).collect());
        }
        PaddedBatch { ids, mask, lengths: seqs.iter().map(Vec::len).collect() }
    }

    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        self.ids.len()
    }

    /// Padded length.
    pub fn width(&self) -> usize {
        self.ids.first().map_or(0, Vec::len)
    }

    /// `(ids, mask)` as `(B, T)` u32 tensors, the layout
    /// [`crate::backend::candle::Transformer`] takes.
    pub fn to_tensors(&self, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
        let (b, t) = (self.batch(), self.width());
        let ids: Vec<u32> = self.ids.iter().flatten().copied().collect();
        let mask: Vec<u32> = self.mask.iter().flatten().map(|&m| u32::from(m)).collect();
        Ok((Tensor::from_vec(ids, (b, t), device)?, Tensor::from_vec(mask, (b, t), device)?))
    }
}

/// A tokenizer with the special-token facts generation and chat rendering
/// need: EOS/pad/BOS ids, the stop set, and the chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    source: String,
    eos_token_id: u32,
    pad_token_id: u32,
    bos_token_id: Option<u32>,
    /// Whether `encode(.., true)` prepends BOS itself (GGUF
    /// `add_bos_token`); Hugging Face tokenizers do it in their
    /// post-processor instead, so this is false for them.
    prepend_bos: bool,
    stop_token_ids: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size())
            .field("eos_token_id", &self.eos_token_id)
            .field("pad_token_id", &self.pad_token_id)
            .field("bos_token_id", &self.bos_token_id)
            .field("stop_token_ids", &self.stop_token_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// Pre-tokenizer split regexes of llama.cpp's `tokenizer.ggml.pre` values,
/// as Hugging Face's `tokenizer.json` of those models writes them.
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl Tokenizer {
    /// Loads from a Hugging Face folder or a `.gguf` file.
    pub fn load(path: &Path) -> Result<Self> {
        if path.is_dir() {
            Self::from_hf_dir(path)
        } else {
            Self::from_gguf(path)
        }
    }

    /// Builds from the `tokenizer.ggml.*` metadata of a GGUF file.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        let f = File::open(path).map_err(|source| TokenizerError::Io { path: path.to_path_buf(), source })?;
        let content = Content::read(&mut BufReader::new(f)).map_err(|e| TokenizerError::Format {
            path: path.to_path_buf(),
            message: format!("not a valid GGUF file: {e}"),
        })?;
        Self::from_gguf_content(&content, path)
    }

    /// Builds from already-read GGUF metadata; `path` names the file in errors.
    pub fn from_gguf_content(c: &Content, path: &Path) -> Result<Self> {
        let ferr = |field: &str, message: String| TokenizerError::Field {
            path: path.to_path_buf(),
            field: field.to_string(),
            message,
        };
        let get = |k: &str| c.metadata.get(k);
        let string = |k: &str| -> Result<Option<String>> {
            match get(k) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(ferr(k, format!("expected a string, found {:?}", v.value_type()))),
            }
        };
        let id = |k: &str| -> Result<Option<u32>> {
            match get(k) {
                None => Ok(None),
                Some(v) => v.to_u32().map(Some).or_else(|_| {
                    v.to_i32()
                        .ok()
                        .and_then(|x| u32::try_from(x).ok())
                        .or_else(|| v.to_u64().ok().and_then(|x| u32::try_from(x).ok()))
                        .map(Some)
                        .ok_or_else(|| ferr(k, format!("expected a token id, found {:?}", v.value_type())))
                }),
            }
        };
        let string_array = |k: &str| -> Result<Vec<String>> {
            match get(k) {
                None => Err(ferr(k, "missing".into())),
                Some(Value::Array(a)) => a
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::String(s) => Ok(s.clone()),
                        other => {
                            Err(ferr(k, format!("element {i}: expected a string, found {:?}", other.value_type())))
                        }
                    })
                    .collect(),
                Some(v) => Err(ferr(k, format!("expected an array, found {:?}", v.value_type()))),
            }
        };

        let model = string("tokenizer.ggml.model")?.ok_or_else(|| ferr("tokenizer.ggml.model", "missing".into()))?;
        if model != "gpt2" {
            return Err(ferr(
                "tokenizer.ggml.model",
                format!("`{model}` tokenizers are not supported (only byte-level BPE, `gpt2`)"),
            ));
        }
        let tokens = string_array("tokenizer.ggml.tokens")?;
        let merges_raw = string_array("tokenizer.ggml.merges")?;
        let types: Vec<i32> = match get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.to_i32().map_err(|_| {
                        ferr(
                            "tokenizer.ggml.token_type",
                            format!("element {i}: expected i32, found {:?}", v.value_type()),
                        )
                    })
                })
                .collect::<Result<_>>()?,
            Some(v) => {
                return Err(ferr("tokenizer.ggml.token_type", format!("expected an array, found {:?}", v.value_type())))
            }
        };
        if types.len() != tokens.len() {
            return Err(ferr(
                "tokenizer.ggml.token_type",
                format!("{} entries for {} tokens", types.len(), tokens.len()),
            ));
        }

        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let merges = merges_raw
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| ferr("tokenizer.ggml.merges", format!("entry {i} `{m}` is not `a b`")))
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| ferr("tokenizer.ggml.merges", format!("building the BPE model: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);

        let pre = string("tokenizer.ggml.pre")?.unwrap_or_else(|| "default".into());
        let split = |re: &str| -> Result<PreTokenizerWrapper> {
            Split::new(SplitPattern::Regex(re.into()), SplitDelimiterBehavior::Isolated, false)
                .map(Into::into)
                .map_err(|e| ferr("tokenizer.ggml.pre", format!("regex: {e}")))
        };
        // With a Split in front, ByteLevel must not split again (use_regex false).
        let pre_tok: PreTokenizerWrapper = match pre.as_str() {
            "smollm" => Sequence::new(vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()]).into(),
            "default" | "gpt-2" | "gpt2" => ByteLevel::new(false, true, true).into(),
            "qwen2" => Sequence::new(vec![split(QWEN2_REGEX)?, ByteLevel::new(false, true, false).into()]).into(),
            "llama-bpe" | "llama3" | "smaug-bpe" => {
                Sequence::new(vec![split(LLAMA3_REGEX)?, ByteLevel::new(false, true, false).into()]).into()
            }
            other => {
                return Err(ferr(
                    "tokenizer.ggml.pre",
                    format!("pre-tokenizer `{other}` is not supported (smollm, gpt2, qwen2, llama-bpe)"),
                ))
            }
        };
        inner.with_pre_tokenizer(Some(pre_tok));
        if pre == "qwen2" {
            // Qwen2's tokenizer.json normalises to NFC before splitting.
            inner
                .with_normalizer(Some(tokenizers::normalizers::NFC))
                .map_err(|e| ferr("tokenizer.ggml.pre", format!("normalizer: {e}")))?;
        }
        inner.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
        inner.with_post_processor(Some(ByteLevel::default()));

        // llama.cpp token types: 3 = control (special: chat markup, EOS),
        // 4 = user-defined (e.g. Qwen's `<think>`; matched in text, decoded
        // as text).
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (t, &ty) in tokens.iter().zip(&types) {
            match ty {
                3 => special.push(AddedToken::from(t.clone(), true)),
                4 => user.push(AddedToken::from(t.clone(), false)),
                _ => {}
            }
        }
        inner
            .add_special_tokens(special)
            .map_err(|e| ferr("tokenizer.ggml.token_type", format!("adding control tokens: {e}")))?;
        inner
            .add_tokens(user)
            .map_err(|e| ferr("tokenizer.ggml.token_type", format!("adding user-defined tokens: {e}")))?;

        let n = tokens.len() as u32;
        let check = |k: &str, v: Option<u32>| -> Result<Option<u32>> {
            match v {
                Some(x) if x >= n => Err(ferr(k, format!("id {x} out of range for {n} tokens"))),
                other => Ok(other),
            }
        };
        let eos = check("tokenizer.ggml.eos_token_id", id("tokenizer.ggml.eos_token_id")?)?
            .ok_or_else(|| ferr("tokenizer.ggml.eos_token_id", "missing".into()))?;
        let bos = check("tokenizer.ggml.bos_token_id", id("tokenizer.ggml.bos_token_id")?)?;
        let pad = check("tokenizer.ggml.padding_token_id", id("tokenizer.ggml.padding_token_id")?)?.unwrap_or(eos);
        let eot = check("tokenizer.ggml.eot_token_id", id("tokenizer.ggml.eot_token_id")?)?;
        let add_bos = match get("tokenizer.ggml.add_bos_token") {
            None => false,
            Some(v) => v.to_bool().map_err(|e| ferr("tokenizer.ggml.add_bos_token", e.to_string()))?,
        };
        if add_bos && bos.is_none() {
            return Err(ferr("tokenizer.ggml.add_bos_token", "true but no tokenizer.ggml.bos_token_id".into()));
        }
        let stops: BTreeSet<u32> = std::iter::once(eos).chain(eot).collect();
        Ok(Tokenizer {
            inner,
            source: path.display().to_string(),
            eos_token_id: eos,
            pad_token_id: pad,
            bos_token_id: bos,
            prepend_bos: add_bos,
            stop_token_ids: stops.into_iter().collect(),
            chat_template: string("tokenizer.chat_template")?,
        })
    }

    /// Builds from a Hugging Face folder: `tokenizer.json`, plus
    /// `tokenizer_config.json` (special tokens, chat template), an optional
    /// `chat_template.jinja` (newer transformers store the template there)
    /// and an optional `generation_config.json` (its `eos_token_id`, a
    /// number or a list, joins the stop set).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let tj = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&tj).map_err(|e| {
            if tj.exists() {
                TokenizerError::Format { path: tj.clone(), message: e.to_string() }
            } else {
                TokenizerError::Io {
                    path: tj.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
                }
            }
        })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = read_json(&cfg_path)?;
        let ferr = |field: &str, message: String| TokenizerError::Field {
            path: cfg_path.clone(),
            field: field.to_string(),
            message,
        };
        // Special tokens are a string or an AddedToken object `{content: ..}`.
        let token_str = |k: &str| -> Result<Option<String>> {
            match cfg.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(serde_json::Value::Object(o)) => match o.get("content") {
                    Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                    _ => Err(ferr(k, "object without a string `content`".into())),
                },
                Some(v) => Err(ferr(k, format!("expected a string or object, found {v}"))),
            }
        };
        let to_id = |k: &str, s: &str| -> Result<u32> {
            inner.token_to_id(s).ok_or_else(|| ferr(k, format!("token `{s}` is not in tokenizer.json's vocabulary")))
        };
        let eos_tok = token_str("eos_token")?.ok_or_else(|| ferr("eos_token", "missing".into()))?;
        let eos = to_id("eos_token", &eos_tok)?;
        let bos = token_str("bos_token")?.map(|s| to_id("bos_token", &s)).transpose()?;
        let pad = token_str("pad_token")?.map(|s| to_id("pad_token", &s)).transpose()?.unwrap_or(eos);

        let mut chat_template = match cfg.get("chat_template") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // A list of named templates: take `default`, else the first.
            Some(serde_json::Value::Array(a)) => {
                let named = |n: &str| a.iter().find(|t| t.get("name").and_then(|x| x.as_str()) == Some(n));
                let t = named("default").or_else(|| a.first());
                Some(
                    t.and_then(|t| t.get("template"))
                        .and_then(|x| x.as_str())
                        .map(str::to_string)
                        .ok_or_else(|| ferr("chat_template", "list without a `template` string".into()))?,
                )
            }
            Some(v) => return Err(ferr("chat_template", format!("expected a string or list, found {v}"))),
        };
        let jinja = dir.join("chat_template.jinja");
        if chat_template.is_none() && jinja.is_file() {
            chat_template =
                Some(std::fs::read_to_string(&jinja).map_err(|source| TokenizerError::Io { path: jinja, source })?);
        }

        let mut stops: BTreeSet<u32> = [eos].into_iter().collect();
        let gen_path = dir.join("generation_config.json");
        if gen_path.is_file() {
            let g = read_json(&gen_path)?;
            let bad = |v: &serde_json::Value| TokenizerError::Field {
                path: gen_path.clone(),
                field: "eos_token_id".into(),
                message: format!("expected a token id or a list of them, found {v}"),
            };
            match g.get("eos_token_id") {
                None | Some(serde_json::Value::Null) => {}
                Some(serde_json::Value::Array(a)) => {
                    for v in a {
                        stops.insert(v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| bad(v))?);
                    }
                }
                Some(v) => {
                    stops.insert(v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| bad(v))?);
                }
            }
        }
        Ok(Tokenizer {
            inner,
            source: dir.display().to_string(),
            eos_token_id: eos,
            pad_token_id: pad,
            bos_token_id: bos,
            prepend_bos: false,
            stop_token_ids: stops.into_iter().collect(),
            chat_template,
        })
    }

    fn codec_err(&self, e: impl std::fmt::Display) -> TokenizerError {
        TokenizerError::Codec { source_name: self.source.clone(), message: e.to_string() }
    }

    /// Token ids of `text`. Special-token markup in the text (e.g.
    /// `<|im_start|>`) always becomes its single id; `add_special` adds the
    /// tokenizer's own framing (BOS where the model wants one). Encode a
    /// rendered chat template with `add_special = false`: the template
    /// writes the BOS itself.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, add_special).map_err(|e| self.codec_err(e))?;
        let mut ids = enc.get_ids().to_vec();
        if add_special && self.prepend_bos {
            if let Some(b) = self.bos_token_id {
                if ids.first() != Some(&b) {
                    ids.insert(0, b);
                }
            }
        }
        Ok(ids)
    }

    /// Text of `ids`; `skip_special` drops special tokens (EOS, chat markup).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(|e| self.codec_err(e))
    }

    /// Encodes every text and left-pads them with the pad id.
    pub fn encode_batch(&self, texts: &[&str], add_special: bool) -> Result<PaddedBatch> {
        let seqs = texts.iter().map(|t| self.encode(t, add_special)).collect::<Result<Vec<_>>>()?;
        Ok(PaddedBatch::left_pad(&seqs, self.pad_token_id))
    }

    /// The end-of-sequence id (for chat models, the end-of-turn token,
    /// e.g. `<|im_end|>`).
    pub fn eos_token_id(&self) -> u32 {
        self.eos_token_id
    }

    /// The id used for left padding (EOS when the source names none).
    pub fn pad_token_id(&self) -> u32 {
        self.pad_token_id
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// Ids that end generation: EOS plus any end-of-turn ids the source
    /// lists (GGUF `eot_token_id`, `generation_config.json` `eos_token_id`).
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_token_ids
    }

    /// The EOS token's text, for chat templates' `eos_token` variable.
    pub fn eos_token(&self) -> String {
        self.id_to_token(self.eos_token_id).unwrap_or_default()
    }

    /// The BOS token's text, for chat templates' `bos_token` variable.
    pub fn bos_token(&self) -> Option<String> {
        self.bos_token_id.and_then(|b| self.id_to_token(b))
    }

    /// The Jinja chat template, if the source has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token string (vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id (byte-level form, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The file or folder this tokenizer was built from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Writes `tokenizer.json`, `tokenizer_config.json` (special tokens,
    /// BOS policy, chat template) and `generation_config.json` (the stop
    /// ids) into `dir`, so the folder loads back with [`Tokenizer::load`]
    /// and in Hugging Face tools (e.g. after a GGUF-built tokenizer).
    pub fn save_hf_files(&self, dir: &Path) -> Result<()> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TokenizerError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let tj = dir.join("tokenizer.json");
        self.inner
            .save(&tj, false)
            .map_err(|e| TokenizerError::Format { path: tj.clone(), message: format!("writing: {e}") })?;
        let mut cfg = serde_json::json!({
            "eos_token": self.eos_token(),
            "pad_token": self.id_to_token(self.pad_token_id).unwrap_or_default(),
            "add_bos_token": self.prepend_bos,
            "tokenizer_class": "PreTrainedTokenizerFast",
        });
        if let Some(b) = self.bos_token() {
            cfg["bos_token"] = serde_json::Value::String(b);
        }
        if let Some(t) = &self.chat_template {
            cfg["chat_template"] = serde_json::Value::String(t.clone());
        }
        let tc = dir.join("tokenizer_config.json");
        std::fs::write(&tc, serde_json::to_string_pretty(&cfg).expect("json") + "\n").map_err(io(&tc))?;
        let mut gen = serde_json::json!({ "eos_token_id": self.stop_token_ids, "pad_token_id": self.pad_token_id });
        if let Some(b) = self.bos_token_id {
            gen["bos_token_id"] = b.into();
        }
        let gc = dir.join("generation_config.json");
        std::fs::write(&gc, serde_json::to_string_pretty(&gen).expect("json") + "\n").map_err(io(&gc))?;
        Ok(())
    }

    /// The underlying `tokenizers` tokenizer (e.g. to save `tokenizer.json`).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let s = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&s).map_err(|e| TokenizerError::Format { path: path.to_path_buf(), message: e.to_string() })
}
