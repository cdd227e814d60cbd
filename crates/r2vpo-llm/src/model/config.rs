//! Model configuration in Hugging Face `config.json` form, so a folder saved
//! by r2vpo loads in `transformers` and vice versa.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ModelError, Result};

/// The decoder families this crate implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama (SmolLM2): no biases, interleaved-free rotate-half RoPE.
    Llama,
    /// Qwen2 / Qwen2.5: bias on q/k/v projections.
    Qwen2,
    /// Qwen3: RMSNorm on each query and key head before RoPE.
    Qwen3,
}

impl Architecture {
    /// The Hugging Face `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
        }
    }

    /// The Hugging Face `architectures[0]` class name.
    pub fn hf_class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        match s {
            "llama" | "LlamaForCausalLM" => Some(Architecture::Llama),
            "qwen2" | "Qwen2ForCausalLM" => Some(Architecture::Qwen2),
            "qwen3" | "Qwen3ForCausalLM" => Some(Architecture::Qwen3),
            _ => None,
        }
    }
}

/// RoPE frequency scaling (the `rope_scaling` object of `config.json`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (all frequencies scaled alike).
    Linear {
        /// Scale factor.
        factor: f64,
    },
    /// Llama 3.x frequency-dependent scaling.
    Llama3 {
        /// Scale factor for low frequencies.
        factor: f64,
        /// Wavelength threshold (as a factor of the original context) below which frequencies are kept.
        low_freq_factor: f64,
        /// Wavelength threshold above which frequencies are fully scaled.
        high_freq_factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

fn default_rope_theta() -> f64 {
    10_000.0
}

fn default_max_pos() -> usize {
    2048
}

/// A decoder configuration with Hugging Face field names. Unknown fields are
/// kept in `extra` so that saving a loaded config does not drop them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelConfig {
    /// `architectures`, e.g. `["LlamaForCausalLM"]`.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// `model_type`: `llama`, `qwen2` or `qwen3`.
    #[serde(default)]
    pub model_type: String,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA); equal to the query heads when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; `hidden_size / num_attention_heads` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base frequency (transformers < 5); see [`ModelConfig::rope_theta`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// RoPE scaling object as written by transformers < 5; parsed by [`ModelConfig::rope_scaling`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Value>,
    /// transformers ≥ 5 form: `rope_theta` and the scaling fields in one object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Value>,
    /// Longest context the model supports.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Whether the LM head shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Bias on attention projections (Llama/Qwen3; Qwen2 always has q/k/v bias).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Activation; only `silu` is implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    /// Every other field of the file, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ModelConfig {
    /// Reads and validates a `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let cfg = Self::from_json_str(&text, path)?;
        Ok(cfg)
    }

    /// Parses and validates JSON text; `path` is only used in error messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let cfg: ModelConfig = serde_json::from_str(text).map_err(|e| {
            let msg = e.to_string();
            // serde names the offending field between backticks.
            let field = msg.split('`').nth(1).unwrap_or("<json>").to_string();
            ModelError::Config { path: path.to_path_buf(), field, message: msg }
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Serialises to pretty JSON in Hugging Face layout.
    pub fn to_json_string(&self) -> String {
        // A struct of plain JSON values always serialises.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The decoder family, from `model_type` or else `architectures[0]`.
    pub fn architecture(&self) -> Option<Architecture> {
        Architecture::from_name(&self.model_type)
            .or_else(|| self.architectures.first().and_then(|a| Architecture::from_name(a)))
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Whether q/k/v projections carry a bias.
    pub fn qkv_bias(&self) -> bool {
        match self.architecture() {
            Some(Architecture::Qwen2) => true,
            _ => self.attention_bias.unwrap_or(false),
        }
    }

    /// Whether the output projection carries a bias (Qwen2 never does).
    pub fn o_bias(&self) -> bool {
        match self.architecture() {
            Some(Architecture::Qwen2) => false,
            _ => self.attention_bias.unwrap_or(false),
        }
    }

    /// Whether queries and keys are RMS-normalised per head (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.architecture() == Some(Architecture::Qwen3)
    }

    /// RoPE base: `rope_parameters.rope_theta`, else `rope_theta`, else 10000.
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .or(self.rope_theta)
            .unwrap_or_else(default_rope_theta)
    }

    /// Parsed RoPE scaling from `rope_parameters` (transformers ≥ 5) or
    /// `rope_scaling`; `None` for absent or `default`. Errors name the field.
    pub fn rope_scaling(&self) -> std::result::Result<Option<RopeScaling>, (String, String)> {
        let (v, key) = match (&self.rope_parameters, &self.rope_scaling) {
            (Some(p), _) => (p, "rope_parameters"),
            (None, Some(s)) => (s, "rope_scaling"),
            (None, None) => return Ok(None),
        };
        if v.is_null() {
            return Ok(None);
        }
        let obj = v.as_object().ok_or((key.to_string(), "expected an object".into()))?;
        // Newer transformers write `rope_type`, older ones `type`.
        let ty = match obj.get("rope_type").or_else(|| obj.get("type")).and_then(Value::as_str) {
            Some(t) => t,
            // transformers ≥ 5 may write only `rope_theta` in `rope_parameters`.
            None if key == "rope_parameters" => "default",
            None => return Err((format!("{key}.rope_type"), "missing".into())),
        };
        let num = |k: &str| -> std::result::Result<f64, (String, String)> {
            obj.get(k).and_then(Value::as_f64).ok_or((format!("{key}.{k}"), "missing or not a number".into()))
        };
        match ty {
            "default" => Ok(None),
            "linear" => Ok(Some(RopeScaling::Linear { factor: num("factor")? })),
            "llama3" => Ok(Some(RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: num("original_max_position_embeddings")?,
            })),
            other => Err((
                format!("{key}.rope_type"),
                format!("unsupported type `{other}` (supported: default, linear, llama3)"),
            )),
        }
    }

    /// Where `other` would compute differently from this configuration
    /// (architecture, shapes, heads, norm ε, RoPE, biases, tying), or
    /// `None`: what a weight push into a running model must agree on.
    /// Fields that only describe (`architectures`, `extra`) or that are
    /// written differently for the same model (a default left out) do not
    /// count.
    pub fn differs_from(&self, other: &ModelConfig) -> Option<String> {
        let described = |c: &ModelConfig| {
            (
                c.architecture(),
                (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size),
                (c.num_attention_heads, c.kv_heads(), c.head_dim()),
                (c.qkv_bias(), c.o_bias(), c.qk_norm(), c.tie_word_embeddings),
            )
        };
        if described(self) != described(other) {
            return Some(format!("{:?} against {:?}", described(other), described(self)));
        }
        if self.rms_norm_eps != other.rms_norm_eps {
            return Some(format!("rms_norm_eps {} against {}", other.rms_norm_eps, self.rms_norm_eps));
        }
        if self.inv_freq() != other.inv_freq() {
            return Some("another RoPE (rope_theta or rope_scaling)".into());
        }
        None
    }

    /// Checks that the configuration describes a model this crate can run.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let err = |field: &str, message: String| ModelError::Config {
            path: path.to_path_buf(),
            field: field.to_string(),
            message,
        };
        if self.architecture().is_none() {
            return Err(err(
                "model_type",
                format!(
                    "unknown architecture (model_type `{}`, architectures {:?}); supported: llama, qwen2, qwen3",
                    self.model_type, self.architectures
                ),
            ));
        }
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(err(name, "must be positive".into()));
            }
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.num_attention_heads.is_multiple_of(kv) {
            return Err(err(
                "num_key_value_heads",
                format!("{kv} does not divide num_attention_heads {}", self.num_attention_heads),
            ));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(err(
                "hidden_size",
                format!("{} is not a multiple of num_attention_heads {}", self.hidden_size, self.num_attention_heads),
            ));
        }
        let hd = self.head_dim();
        if hd == 0 || !hd.is_multiple_of(2) {
            return Err(err("head_dim", format!("{hd} must be positive and even for RoPE")));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps.is_finite()) {
            return Err(err("rms_norm_eps", format!("{} must be positive", self.rms_norm_eps)));
        }
        let theta = self.rope_theta();
        if !(theta > 0.0 && theta.is_finite()) {
            return Err(err("rope_theta", format!("{theta} must be positive")));
        }
        if let Some(act) = &self.hidden_act {
            if act != "silu" {
                return Err(err("hidden_act", format!("`{act}` is not supported (only silu)")));
            }
        }
        if self.extra.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            return Err(err("mlp_bias", "MLP biases are not supported".into()));
        }
        if self.extra.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            return Err(err("use_sliding_window", "sliding-window attention is not supported".into()));
        }
        if let Some(types) = self.extra.get("layer_types").and_then(Value::as_array) {
            if types.iter().any(|t| t.as_str() != Some("full_attention")) {
                return Err(err("layer_types", "only full_attention layers are supported".into()));
            }
        }
        self.rope_scaling().map_err(|(f, m)| err(&f, m))?;
        Ok(())
    }

    /// RoPE inverse frequencies (length `head_dim / 2`), with scaling applied,
    /// computed as Hugging Face does (`1 / theta^(2i/d)`).
    pub fn inv_freq(&self) -> Vec<f64> {
        let hd = self.head_dim();
        let mut inv: Vec<f64> = (0..hd / 2).map(|i| 1.0 / self.rope_theta().powf((2 * i) as f64 / hd as f64)).collect();
        match self.rope_scaling().ok().flatten() {
            None => {}
            Some(RopeScaling::Linear { factor }) => inv.iter_mut().for_each(|f| *f /= factor),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_ctx,
            }) => {
                let low_wavelen = old_ctx / low_freq_factor;
                let high_wavelen = old_ctx / high_freq_factor;
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        inv
    }

    /// A config for `arch` with the given sizes and the other fields at
    /// their Hugging Face defaults (useful for tests and toy models).
    #[allow(clippy::too_many_arguments)]
    pub fn tiny(
        arch: Architecture,
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
        tie_word_embeddings: bool,
    ) -> Self {
        ModelConfig {
            architectures: vec![arch.hf_class().to_string()],
            model_type: arch.model_type().to_string(),
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: Some(num_key_value_heads),
            head_dim: None,
            rms_norm_eps: 1e-6,
            rope_theta: Some(10_000.0),
            rope_scaling: None,
            rope_parameters: None,
            max_position_embeddings: 512,
            vocab_size,
            tie_word_embeddings,
            attention_bias: None,
            hidden_act: Some("silu".into()),
            extra: Map::new(),
        }
    }
}

/// Expected parameters of a configuration: HF name and shape, in a fixed order.
pub fn expected_params(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim());
    let (nq, nkv) = (cfg.num_attention_heads * hd, cfg.kv_heads() * hd);
    let mut v = vec![("model.embed_tokens.weight".to_string(), vec![cfg.vocab_size, h])];
    for i in 0..cfg.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        v.push((p("input_layernorm.weight"), vec![h]));
        v.push((p("self_attn.q_proj.weight"), vec![nq, h]));
        v.push((p("self_attn.k_proj.weight"), vec![nkv, h]));
        v.push((p("self_attn.v_proj.weight"), vec![nkv, h]));
        if cfg.qkv_bias() {
            v.push((p("self_attn.q_proj.bias"), vec![nq]));
            v.push((p("self_attn.k_proj.bias"), vec![nkv]));
            v.push((p("self_attn.v_proj.bias"), vec![nkv]));
        }
        v.push((p("self_attn.o_proj.weight"), vec![h, nq]));
        if cfg.o_bias() {
            v.push((p("self_attn.o_proj.bias"), vec![h]));
        }
        if cfg.qk_norm() {
            v.push((p("self_attn.q_norm.weight"), vec![hd]));
            v.push((p("self_attn.k_norm.weight"), vec![hd]));
        }
        v.push((p("post_attention_layernorm.weight"), vec![h]));
        v.push((p("mlp.gate_proj.weight"), vec![cfg.intermediate_size, h]));
        v.push((p("mlp.up_proj.weight"), vec![cfg.intermediate_size, h]));
        v.push((p("mlp.down_proj.weight"), vec![h, cfg.intermediate_size]));
    }
    v.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        v.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    v
}
