//! Low-rank adapters (LoRA; Hu et al. 2021, "LoRA: Low-Rank Adaptation of
//! Large Language Models"), described independently of any backend: which
//! projections carry one, their rank and scaling, their parameters' names
//! and shapes, their initialisation, and their files in Hugging Face PEFT's
//! layout (`adapter_config.json` + `adapter_model.safetensors`), which PEFT
//! and vLLM's LoRA support load.
//!
//! An adapted projection computes `W·x + s·B·(A·x)` with `A (r, in)`,
//! `B (out, r)` and `s = α/r` (or rsLoRA's `α/√r`; Kalajdzievski 2023), the
//! base `W` frozen. PEFT names the factors
//! `base_model.model.<module>.lora_A.weight` / `lora_B.weight`, `<module>`
//! being the projection's Hugging Face name without `.weight`
//! (`model.layers.3.self_attn.q_proj`); r2vpo uses those names everywhere
//! (gradients, optimizer state, checkpoints, pushes).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::source::{SafetensorsFiles, TensorSource};
use super::{ModelConfig, ModelError, Result};

/// A projection an adapter can sit on (PEFT's `target_modules` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    /// Attention queries.
    QProj,
    /// Attention keys.
    KProj,
    /// Attention values.
    VProj,
    /// Attention output.
    OProj,
    /// MLP gate.
    GateProj,
    /// MLP up.
    UpProj,
    /// MLP down.
    DownProj,
}

impl LoraTarget {
    /// Every target, in the order a decoder layer uses them.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    /// PEFT's module name (`q_proj`, …).
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }

    /// Its position in [`LoraTarget::ALL`].
    pub fn index(self) -> usize {
        LoraTarget::ALL.iter().position(|&t| t == self).expect("every target is in ALL")
    }

    /// The module's Hugging Face path inside layer `layer`.
    pub fn module(self, layer: usize) -> String {
        let block = match self {
            LoraTarget::QProj | LoraTarget::KProj | LoraTarget::VProj | LoraTarget::OProj => "self_attn",
            _ => "mlp",
        };
        format!("model.layers.{layer}.{block}.{}", self.name())
    }

    /// The projection's `(in, out)` features in `cfg`.
    pub fn features(self, cfg: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, i) = (
            cfg.hidden_size,
            cfg.num_attention_heads * cfg.head_dim(),
            cfg.kv_heads() * cfg.head_dim(),
            cfg.intermediate_size,
        );
        match self {
            LoraTarget::QProj => (h, q),
            LoraTarget::KProj | LoraTarget::VProj => (h, kv),
            LoraTarget::OProj => (q, h),
            LoraTarget::GateProj | LoraTarget::UpProj => (h, i),
            LoraTarget::DownProj => (i, h),
        }
    }
}

impl std::str::FromStr for LoraTarget {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        LoraTarget::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            format!(
                "`{s}` is not a projection r2vpo adapts (expected some of {})",
                LoraTarget::ALL.map(LoraTarget::name).join(", ")
            )
        })
    }
}

/// `[model.lora]`: train low-rank adapters on a frozen base instead of
/// every weight. Absent, the whole model trains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// The adapters' rank r (PEFT's `r`).
    pub rank: usize,
    /// α (PEFT's `lora_alpha`): the update is scaled by α/r, or α/√r with
    /// `rslora`.
    pub alpha: f64,
    /// The projections that carry an adapter. The default is all seven:
    /// "LoRA Without Regret" (Schulman et al., Thinking Machines, 2025)
    /// found attention-only adapters clearly worse than adapting the MLP
    /// too, in supervised and RL fine-tuning alike.
    pub targets: Vec<LoraTarget>,
    /// rsLoRA's scaling α/√r (Kalajdzievski 2023, PEFT's `use_rslora`),
    /// which keeps the update's size stable as the rank grows.
    pub rslora: bool,
    /// Seed of A's initialisation (B starts at zero, so the adapted model
    /// starts as the base whatever the seed).
    pub seed: u64,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig { rank: 8, alpha: 16.0, targets: LoraTarget::ALL.to_vec(), rslora: false, seed: 0 }
    }
}

impl LoraConfig {
    /// Whether adapters made under `other` fit a model made under `self`
    /// and mean the same update: equal rank, α and scaling rule, and the
    /// same targets in any order. The seed is not compared: it only drew
    /// the initial A, and PEFT's files do not record it.
    pub fn same_adapters(&self, other: &LoraConfig) -> bool {
        let sorted = |t: &[LoraTarget]| {
            let mut v = t.to_vec();
            v.sort();
            v
        };
        (self.rank, self.alpha, self.rslora) == (other.rank, other.alpha, other.rslora)
            && sorted(&self.targets) == sorted(&other.targets)
    }
}

/// Which factor of an adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Factor {
    /// `A (r, in)`: the down-projection, initialised at random.
    A,
    /// `B (out, r)`: the up-projection, initialised at zero.
    B,
}

/// PEFT's name of `factor` of the adapter on `module` (a Hugging Face
/// module path, [`LoraTarget::module`]).
pub fn peft_name(module: &str, factor: Factor) -> String {
    let f = match factor {
        Factor::A => "lora_A",
        Factor::B => "lora_B",
    };
    format!("base_model.model.{module}.{f}.weight")
}

impl LoraConfig {
    /// The scale of the low-rank update, α/r (or α/√r with `rslora`).
    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// The first bad field as `(field, message)`.
    pub fn validate(&self) -> std::result::Result<(), (String, String)> {
        let bad = |f: &str, m: String| Err((f.to_string(), m));
        if self.rank == 0 {
            return bad("rank", "must be at least 1".into());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return bad("alpha", format!("{} must be positive and finite", self.alpha));
        }
        if self.targets.is_empty() {
            return bad("targets", "names no projection (drop [model.lora] to train every weight)".into());
        }
        let mut seen = self.targets.clone();
        seen.sort();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return bad("targets", format!("`{}` is named twice", w[0].name()));
        }
        Ok(())
    }

    /// Whether `target` carries an adapter.
    pub fn adapts(&self, target: LoraTarget) -> bool {
        self.targets.contains(&target)
    }

    /// Every adapter tensor of `cfg`'s model as `(PEFT name, shape)`, in
    /// layer order, A before B.
    pub fn tensors(&self, cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        for layer in 0..cfg.num_hidden_layers {
            for t in LoraTarget::ALL.into_iter().filter(|&t| self.adapts(t)) {
                let (i, o) = t.features(cfg);
                let m = t.module(layer);
                out.push((peft_name(&m, Factor::A), vec![self.rank, i]));
                out.push((peft_name(&m, Factor::B), vec![o, self.rank]));
            }
        }
        out
    }

    /// Adapter parameters of `cfg`'s model.
    pub fn num_parameters(&self, cfg: &ModelConfig) -> usize {
        self.tensors(cfg).iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }
}

/// The initialisation of `cfg`'s adapters under `lora`, one tensor at a
/// time: B zero, A uniform on ±1/√in, which is what PEFT's default
/// (`init_lora_weights = True`: `kaiming_uniform_(A, a=√5)`) draws from,
/// here from SplitMix64 numbered across the A tensors in
/// [`LoraConfig::tensors`] order (seed `lora.seed`).
pub struct AdapterInit {
    seed: u64,
    f64: bool,
    /// Name → (shape, index of its first draw, bound); bound 0 for B.
    layout: HashMap<String, (Vec<usize>, u64, f64)>,
}

impl AdapterInit {
    /// The initial adapters of `cfg`'s model.
    pub fn new(cfg: &ModelConfig, lora: &LoraConfig) -> Self {
        let mut layout = HashMap::new();
        let mut first = 0u64;
        for (name, shape) in lora.tensors(cfg) {
            let n = shape.iter().product::<usize>() as u64;
            let bound = if name.ends_with("lora_A.weight") { 1.0 / (shape[1] as f64).sqrt() } else { 0.0 };
            layout.insert(name, (shape, first, bound));
            if bound > 0.0 {
                first += n;
            }
        }
        AdapterInit { seed: lora.seed, f64: false, layout }
    }

    /// The same values in f64 (finite-difference checks).
    pub fn in_f64(mut self) -> Self {
        self.f64 = true;
        self
    }
}

impl TensorSource for AdapterInit {
    fn origin(&self) -> PathBuf {
        PathBuf::from("<adapter init>")
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.layout.keys().cloned().collect();
        v.sort();
        v
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.layout.get(name).map(|(s, _, _)| s.clone())
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        let (shape, first, bound) = self.layout.get(name).ok_or_else(|| ModelError::Tensor {
            path: self.origin(),
            tensor: name.into(),
            message: "missing".into(),
        })?;
        super::source::drawn_tensor(shape, *first, self.f64, |g| {
            if *bound == 0.0 {
                0.0
            } else {
                bound * (2.0 * super::source::uniform_draw(self.seed, g) - 1.0)
            }
        })
    }
}

/// Checks that `source` holds exactly `cfg`'s adapters under `lora`: every
/// tensor with its shape, nothing else. The error names the tensor, and
/// says "rank" where only the rank differs and "target" where an adapter
/// sits on a projection `lora` does not adapt.
pub fn check_adapter(cfg: &ModelConfig, lora: &LoraConfig, source: &dyn TensorSource) -> Result<()> {
    let expected = lora.tensors(cfg);
    let err =
        |tensor: &str, message: String| ModelError::Tensor { path: source.origin(), tensor: tensor.into(), message };
    for (name, shape) in &expected {
        match source.dims(name) {
            None => return Err(err(name, "missing from the adapter".into())),
            Some(d) if d != *shape => {
                let rank_only =
                    d.len() == 2 && if name.ends_with("lora_A.weight") { d[1] == shape[1] } else { d[0] == shape[0] };
                let why = if rank_only {
                    format!("shape {d:?}: another rank than the adapter's r = {} ({shape:?})", lora.rank)
                } else {
                    format!("shape {d:?}, {shape:?} in this model")
                };
                return Err(err(name, why));
            }
            Some(_) => {}
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    if let Some(extra) = source.names().into_iter().find(|n| !known.contains(n.as_str())) {
        let target = LoraTarget::ALL.into_iter().find(|t| extra.contains(&format!(".{}.", t.name())));
        let why = match target {
            Some(t) if !lora.adapts(t) => {
                format!("an adapter on `{}`, which the adapter's targets do not name", t.name())
            }
            _ => "not a tensor of this model's adapters".into(),
        };
        return Err(err(&extra, why));
    }
    Ok(())
}

/// `w + s·b·a`: an adapted projection's weight as a plain one (f32; `w`
/// `(out, in)`, `a (r, in)`, `b (out, r)`, on any one device).
pub fn merged(w: &Tensor, a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    let f = |t: &Tensor| t.to_dtype(candle_core::DType::F32);
    Ok((f(w)? + (f(b)?.matmul(&f(a)?)? * scale)?)?)
}

/// A base model with an adapter folded in, as a [`TensorSource`] of the
/// base's Hugging Face names: each adapted projection is [`merged`] when
/// it is read, the rest passes through, so a merged model is written or
/// loaded one tensor at a time (`llm merge`).
pub struct MergedSource {
    base: Box<dyn TensorSource>,
    adapter: Box<dyn TensorSource>,
    scale: f64,
    /// Base weight name → (A, B) PEFT names.
    adapted: HashMap<String, (String, String)>,
}

impl MergedSource {
    /// `base` (of `cfg`'s model) with `adapter` (under `lora`) folded in;
    /// the adapter is first checked to fit ([`check_adapter`]).
    pub fn new(
        cfg: &ModelConfig,
        base: Box<dyn TensorSource>,
        lora: &LoraConfig,
        adapter: Box<dyn TensorSource>,
    ) -> Result<Self> {
        check_adapter(cfg, lora, adapter.as_ref())?;
        let mut adapted = HashMap::new();
        for layer in 0..cfg.num_hidden_layers {
            for t in LoraTarget::ALL.into_iter().filter(|&t| lora.adapts(t)) {
                let m = t.module(layer);
                adapted.insert(format!("{m}.weight"), (peft_name(&m, Factor::A), peft_name(&m, Factor::B)));
            }
        }
        Ok(MergedSource { base, adapter, scale: lora.scale(), adapted })
    }
}

impl TensorSource for MergedSource {
    fn origin(&self) -> PathBuf {
        self.base.origin()
    }

    fn names(&self) -> Vec<String> {
        self.base.names()
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.base.dims(name)
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        let w = self.base.tensor(name)?;
        match self.adapted.get(name) {
            Some((a, b)) => merged(&w, &self.adapter.tensor(a)?, &self.adapter.tensor(b)?, self.scale),
            None => Ok(w),
        }
    }
}

/// Folds the PEFT adapter folder `adapter` into the model at `base` (a
/// Hugging Face folder or a GGUF file) and writes the result to `out` as a
/// Hugging Face folder (f32 `model.safetensors` and `config.json`; the
/// tokenizer is the caller's to copy). Returns the adapter's
/// configuration. The adapter is checked against the base before anything
/// is written.
pub fn merge_to_hf(base: &Path, adapter: &Path, out: &Path) -> Result<LoraConfig> {
    let (cfg, base_src) = super::source::open(base)?;
    let (lora, files) = open_peft(adapter)?;
    let src = MergedSource::new(&cfg, base_src, &lora, Box::new(files))?;
    let mut tensors = HashMap::new();
    for (name, _) in super::expected_params(&cfg) {
        tensors.insert(name.clone(), src.tensor(&name)?.to_dtype(candle_core::DType::F32)?);
    }
    super::save::save_hf_tensors(&cfg, &tensors, out)?;
    Ok(lora)
}

/// The file names of PEFT's adapter layout.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// See [`ADAPTER_CONFIG`].
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// Writes `tensors` (PEFT names) as a PEFT adapter folder `dir`
/// (`adapter_config.json`, `adapter_model.safetensors`), creating it;
/// `base` is recorded as `base_model_name_or_path`. Each file is written
/// to a temporary name and renamed, so a reader never sees half of one.
pub fn save_peft(dir: &Path, lora: &LoraConfig, base: Option<&str>, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut modules: Vec<&str> = lora.targets.iter().map(|t| t.name()).collect();
    modules.sort();
    // PEFT reads `lora_alpha` as a number; an integral α is written as an
    // integer, as PEFT writes it.
    let alpha =
        if lora.alpha.fract() == 0.0 && lora.alpha.abs() < 1e15 { json!(lora.alpha as i64) } else { json!(lora.alpha) };
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": alpha,
        "target_modules": modules,
        "use_rslora": lora.rslora,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": false,
        "inference_mode": true,
    });
    let c = dir.join(ADAPTER_CONFIG);
    let text = serde_json::to_string_pretty(&config).expect("a JSON value serialises") + "\n";
    r2vpo_report::atomic_write_string(&c, &text)
        .map_err(|e| ModelError::Format { path: c.clone(), message: e.to_string() })?;
    let w = dir.join(ADAPTER_WEIGHTS);
    let tmp = dir.join(format!(".{ADAPTER_WEIGHTS}.tmp"));
    candle_core::safetensors::save(tensors, &tmp)
        .map_err(|e| ModelError::Format { path: w.clone(), message: format!("writing safetensors: {e}") })?;
    super::save::readable(&tmp)?;
    std::fs::rename(&tmp, &w).map_err(io(&w))
}

/// Reads a PEFT adapter folder: its configuration (refusing what r2vpo
/// cannot apply exactly, with the field named) and its tensors, read one
/// at a time when applied.
pub fn open_peft(dir: &Path) -> Result<(LoraConfig, SafetensorsFiles)> {
    let c = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&c).map_err(|source| ModelError::Io { path: c.clone(), source })?;
    let lora = parse_peft_config(&c, &text)?;
    let w = dir.join(ADAPTER_WEIGHTS);
    if !w.exists() {
        return Err(ModelError::Io {
            path: w,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "the adapter's weights are missing"),
        });
    }
    let files = SafetensorsFiles::open(std::slice::from_ref(&w), w.clone())?;
    Ok((lora, files))
}

/// [`open_peft`]'s reading of `adapter_config.json` (`path` names it in
/// errors).
pub fn parse_peft_config(path: &Path, text: &str) -> Result<LoraConfig> {
    let bad =
        |field: &str, message: String| ModelError::Config { path: path.to_path_buf(), field: field.into(), message };
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ModelError::Format { path: path.to_path_buf(), message: e.to_string() })?;
    let get = |k: &str| v.get(k).filter(|x| !x.is_null());
    match get("peft_type").and_then(Value::as_str) {
        Some("LORA") => {}
        other => return Err(bad("peft_type", format!("{other:?}: only LORA adapters are read"))),
    }
    let rank = get("r")
        .and_then(Value::as_u64)
        .filter(|&r| r > 0)
        .ok_or_else(|| bad("r", "missing or not a positive integer".into()))? as usize;
    let alpha = match get("lora_alpha") {
        None => 8.0, // PEFT's default
        Some(a) => a.as_f64().ok_or_else(|| bad("lora_alpha", format!("{a}: not a number")))?,
    };
    let targets = match get("target_modules") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| {
                let s = t.as_str().ok_or_else(|| bad("target_modules", format!("{t}: not a module name")))?;
                s.parse::<LoraTarget>().map_err(|m| bad("target_modules", m))
            })
            .collect::<Result<Vec<_>>>()?,
        Some(Value::String(s)) => vec![s.parse::<LoraTarget>().map_err(|_| {
            bad("target_modules", format!("`{s}`: a regular expression of modules is not read; list the modules"))
        })?],
        other => return Err(bad("target_modules", format!("{other:?}: expected a list of module names"))),
    };
    let flag = |k: &str| get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("use_dora") {
        return Err(bad("use_dora", "DoRA adapters are not read".into()));
    }
    if flag("fan_in_fan_out") {
        return Err(bad("fan_in_fan_out", "true is for GPT-2's Conv1D layers, which these models do not have".into()));
    }
    match get("bias").and_then(Value::as_str) {
        None | Some("none") => {}
        Some(b) => return Err(bad("bias", format!("`{b}`: only adapters without trained biases are read"))),
    }
    for k in ["rank_pattern", "alpha_pattern"] {
        if get(k).and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
            return Err(bad(k, "per-module ranks or alphas are not read".into()));
        }
    }
    for k in ["modules_to_save", "layers_to_transform"] {
        if get(k).is_some_and(|x| x.as_array().is_none_or(|a| !a.is_empty())) {
            return Err(bad(k, "adapters on a subset of layers, or fully trained modules, are not read".into()));
        }
    }
    let lora = LoraConfig { rank, alpha, targets, rslora: flag("use_rslora"), seed: 0 };
    lora.validate().map_err(|(f, m)| bad(&f, m))?;
    Ok(lora)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Architecture;
    use candle_core::Device;

    fn cfg() -> ModelConfig {
        ModelConfig::tiny(Architecture::Llama, 40, 16, 24, 2, 4, 2, true)
    }

    /// Written and read back, a PEFT folder gives the same configuration
    /// and tensors; its config carries PEFT's fields.
    #[test]
    fn peft_folder_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let lora = LoraConfig {
            rank: 4,
            alpha: 8.0,
            targets: vec![LoraTarget::QProj, LoraTarget::DownProj],
            ..Default::default()
        };
        let init = AdapterInit::new(&cfg(), &lora);
        let tensors: HashMap<String, Tensor> =
            init.names().into_iter().map(|n| (n.clone(), init.tensor(&n).unwrap())).collect();
        save_peft(dir.path(), &lora, Some("base"), &tensors).unwrap();
        let (back, files) = open_peft(dir.path()).unwrap();
        assert_eq!(back, LoraConfig { targets: vec![LoraTarget::DownProj, LoraTarget::QProj], ..lora.clone() });
        check_adapter(&cfg(), &back, &files).unwrap();
        for (n, t) in &tensors {
            let got = files.tensor(n).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(got, t.flatten_all().unwrap().to_vec1::<f32>().unwrap(), "{n}");
        }
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(ADAPTER_CONFIG)).unwrap()).unwrap();
        assert_eq!(v["lora_alpha"], json!(8));
        assert_eq!(v["target_modules"], json!(["down_proj", "q_proj"]));
        // Readable as any file this process creates (safetensors' own
        // writer leaves 0o600): a server running as another user reads it.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let probe = dir.path().join("probe");
            std::fs::write(&probe, b"").unwrap();
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&dir.path().join(ADAPTER_WEIGHTS)), mode(&probe));
        }
    }

    /// Adapters match across target order and seed, and differ on rank,
    /// α, scaling rule or target set.
    #[test]
    fn same_adapters_compares_what_the_update_means() {
        let a = LoraConfig { targets: vec![LoraTarget::QProj, LoraTarget::DownProj], ..Default::default() };
        let reordered = LoraConfig { targets: vec![LoraTarget::DownProj, LoraTarget::QProj], seed: 9, ..a.clone() };
        assert!(a.same_adapters(&reordered));
        for other in [
            LoraConfig { rank: 4, ..a.clone() },
            LoraConfig { alpha: 8.0, ..a.clone() },
            LoraConfig { rslora: true, ..a.clone() },
            LoraConfig { targets: vec![LoraTarget::QProj], ..a.clone() },
        ] {
            assert!(!a.same_adapters(&other), "{other:?}");
        }
    }

    /// A starts uniform on ±1/√in (PEFT's default), B at zero.
    #[test]
    fn initialisation_is_peft_default_distribution() {
        let lora = LoraConfig::default();
        let init = AdapterInit::new(&cfg(), &lora);
        let a = init.tensor("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight").unwrap();
        assert_eq!(a.dims(), &[8, 24]);
        let v = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let bound = 1.0 / 24f32.sqrt();
        assert!(v.iter().all(|x| x.abs() <= bound));
        let var = v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32;
        assert!((var / (bound * bound / 3.0) - 1.0).abs() < 0.25, "variance {var}");
        let b = init.tensor("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight").unwrap();
        assert_eq!(b.dims(), &[16, 8]);
        assert!(b.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|&x| x == 0.0));
    }

    /// Bad adapters are refused naming what is wrong: another rank, an
    /// adapter on a module the config does not target, a missing tensor,
    /// and configurations r2vpo cannot apply.
    #[test]
    fn malformed_adapters_are_named() {
        let lora = LoraConfig { rank: 4, targets: vec![LoraTarget::QProj], ..Default::default() };
        let init = AdapterInit::new(&cfg(), &lora);
        let mut t: HashMap<String, Tensor> =
            init.names().into_iter().map(|n| (n.clone(), init.tensor(&n).unwrap())).collect();
        let a0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".to_string();
        let src = |t: &HashMap<String, Tensor>| crate::model::source::NamedTensors::new("adapter", t.clone());
        let mut wrong_rank = t.clone();
        wrong_rank.insert(a0.clone(), Tensor::zeros((2, 16), candle_core::DType::F32, &Device::Cpu).unwrap());
        let e = check_adapter(&cfg(), &lora, &src(&wrong_rank)).unwrap_err().to_string();
        assert!(e.contains(&a0) && e.contains("another rank"), "{e}");
        t.insert(
            "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight".into(),
            Tensor::zeros((4, 16), candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
        let e = check_adapter(&cfg(), &lora, &src(&t)).unwrap_err().to_string();
        assert!(e.contains("v_proj") && e.contains("do not name"), "{e}");
        t.remove(&a0);
        let e = check_adapter(&cfg(), &lora, &src(&t)).unwrap_err().to_string();
        assert!(e.contains(&a0) && e.contains("missing"), "{e}");

        let p = Path::new("adapter_config.json");
        let base = r#"{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]"#;
        for (extra, field) in [
            (r#", "use_dora": true"#, "use_dora"),
            (r#", "bias": "all""#, "bias"),
            (r#", "rank_pattern": {"q_proj": 4}"#, "rank_pattern"),
            (r#", "layers_to_transform": [0]"#, "layers_to_transform"),
        ] {
            let e = parse_peft_config(p, &format!("{base}{extra}}}")).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let e = parse_peft_config(p, r#"{"peft_type": "LORA", "r": 8, "target_modules": ["c_attn"]}"#).unwrap_err();
        assert!(e.to_string().contains("c_attn"), "{e}");
        let e = parse_peft_config(p, r#"{"peft_type": "IA3", "r": 8}"#).unwrap_err();
        assert!(e.to_string().contains("peft_type"), "{e}");
        let ok = parse_peft_config(p, &format!("{base}, \"use_rslora\": true}}")).unwrap();
        assert!((ok.scale() - 16.0 / 8f64.sqrt()).abs() < 1e-12);
    }
}
