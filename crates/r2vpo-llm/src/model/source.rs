//! Where a model's weights come from, independent of any backend: a
//! [`TensorSource`] names its tensors and hands them out **one at a time**,
//! on the CPU, in the dtype they are stored in. A backend builds its model
//! from `(ModelConfig, &dyn TensorSource)` by reading, converting and
//! placing one tensor before it reads the next, so a model never exists
//! twice in host memory: an 8B bf16 checkpoint reaches a GPU with one
//! tensor (≤ 1.2 GB for Qwen3-8B's embedding in f32) in host memory at a
//! time, where a whole f32 host copy would be 32 GB per process.
//!
//! Sources: [`SafetensorsFiles`] (a Hugging Face folder, one file or
//! sharded, and r2vpo's own checkpoints), [`GgufFile`] (llama.cpp files,
//! dequantised and renamed per tensor), [`RandomInit`] (the deterministic
//! initialisation of tests and toy runs, generated per tensor), and
//! [`crate::weights::Weights`] and [`NamedTensors`] (tensors already in
//! memory). [`open`] picks the first two by path.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device, Tensor};

use super::config::Architecture;
use super::expected_params;
use super::load_gguf::{config_from_gguf, hf_name, unpermute_qk};
use super::load_hf::weight_files;
use super::{ModelConfig, ModelError, Result};

/// Named tensors, read one at a time (see the module documentation).
pub trait TensorSource: Send + Sync {
    /// What the tensors come from, for errors (a file, a folder, or a
    /// description in angle brackets such as `<random init>`).
    fn origin(&self) -> PathBuf;

    /// Every tensor's name, sorted.
    fn names(&self) -> Vec<String>;

    /// The shape of tensor `name`, without reading it; `None` if absent.
    fn dims(&self, name: &str) -> Option<Vec<usize>>;

    /// Tensor `name` on the CPU in its stored dtype (GGUF's quantised
    /// tensors dequantised to f32); an absent tensor or a read that fails
    /// is an error naming it.
    fn tensor(&self, name: &str) -> Result<Tensor>;
}

/// Checks, from the shapes alone and before anything is read or applied,
/// that `source` holds every tensor `config` describes with its exact
/// shape, and no layer tensor it does not describe (a `config.json` that
/// disagrees with its weights would otherwise build a different model
/// silently). Extra tensors outside the layers (a tied model's
/// `lm_head.weight`) are ignored.
pub fn check(config: &ModelConfig, source: &dyn TensorSource) -> Result<()> {
    let path = source.origin();
    config.validate(&path)?;
    let expected = expected_params(config);
    for (name, shape) in &expected {
        let tensor_err = |message: String| ModelError::Tensor { path: path.clone(), tensor: name.clone(), message };
        match source.dims(name) {
            None => return Err(tensor_err("missing".into())),
            Some(d) if d != *shape => return Err(tensor_err(format!("shape {d:?}, expected {shape:?}"))),
            Some(_) => {}
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let names = source.names();
    let mut unknown: Vec<&String> = names
        .iter()
        .filter(|n| !known.contains(n.as_str()))
        .filter(|n| n.starts_with("model.layers.") && !n.ends_with("rotary_emb.inv_freq"))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort();
    let layer_of = |n: &str| n.strip_prefix("model.layers.")?.split('.').next()?.parse::<usize>().ok();
    let stored = unknown.iter().filter_map(|n| layer_of(n)).max().map_or(0, |l| l + 1);
    let (field, message) = if stored > config.num_hidden_layers {
        let message = format!(
            "the config declares {} layers, but these weights hold tensors of {stored} (e.g. `{}`): the config \
             does not describe these weights",
            config.num_hidden_layers, unknown[0]
        );
        ("num_hidden_layers", message)
    } else {
        let message = format!(
            "these weights hold {} layer tensor(s) that a `{}` model has no place for (e.g. `{}`): the config does \
             not describe these weights",
            unknown.len(),
            config.model_type,
            unknown[0]
        );
        ("model_type", message)
    };
    Err(ModelError::Config { path, field: field.into(), message })
}

/// Opens the model at `path` (a Hugging Face folder, or a `.gguf` file)
/// without reading its weights: the configuration and a source of them.
/// The configuration is validated; the weights are checked against it by
/// [`check`] (which every backend's constructor calls).
pub fn open(path: &Path) -> Result<(ModelConfig, Box<dyn TensorSource>)> {
    if path.is_dir() {
        let config = ModelConfig::from_file(&path.join("config.json"))?;
        let (files, origin) = weight_files(path)?;
        Ok((config, Box::new(SafetensorsFiles::open(&files, origin)?)))
    } else {
        let gguf = GgufFile::open(path)?;
        Ok((gguf.config.clone(), Box::new(gguf)))
    }
}

/// Tensors already in memory, by name.
pub struct NamedTensors {
    origin: PathBuf,
    tensors: HashMap<String, Tensor>,
}

impl NamedTensors {
    /// `tensors`, named in errors as coming from `origin`.
    pub fn new(origin: impl Into<PathBuf>, tensors: HashMap<String, Tensor>) -> Self {
        NamedTensors { origin: origin.into(), tensors }
    }
}

/// [`TensorSource::names`] of a map.
fn sorted_names<V>(map: &HashMap<String, V>) -> Vec<String> {
    let mut v: Vec<String> = map.keys().cloned().collect();
    v.sort();
    v
}

impl TensorSource for NamedTensors {
    fn origin(&self) -> PathBuf {
        self.origin.clone()
    }

    fn names(&self) -> Vec<String> {
        sorted_names(&self.tensors)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        self.tensors.get(name).cloned().ok_or_else(|| ModelError::Tensor {
            path: self.origin.clone(),
            tensor: name.into(),
            message: "missing".into(),
        })
    }
}

/// Where one tensor lies in a safetensors file.
struct Entry {
    file: usize,
    dtype: DType,
    dims: Vec<usize>,
    start: u64,
    len: usize,
}

/// Safetensors files read one tensor at a time with positioned reads.
///
/// Hand-written over the format's header (an 8-byte length, then JSON of
/// `{name: {dtype, shape, data_offsets}}`) rather than candle's
/// `MmapedSafetensors`: a weight push reads a folder the learner may
/// replace while it is mapped, and a mapped file that changes or shrinks
/// underneath is undefined behaviour (SIGBUS), where a read is an error.
/// Reading whole files instead (candle's `safetensors::load`) would hold
/// the whole model in host memory. The header is checked against the file
/// size, so a truncated file is refused before anything is applied.
pub struct SafetensorsFiles {
    origin: PathBuf,
    files: Vec<PathBuf>,
    entries: HashMap<String, Entry>,
}

impl SafetensorsFiles {
    /// Reads the headers of `files` (a tensor in several is taken from the
    /// last); `origin` names the set in errors about missing tensors.
    pub fn open(files: &[PathBuf], origin: PathBuf) -> Result<Self> {
        let mut entries = HashMap::new();
        for (i, path) in files.iter().enumerate() {
            for (name, mut e) in read_header(path)? {
                e.file = i;
                entries.insert(name, e);
            }
        }
        Ok(SafetensorsFiles { origin, files: files.to_vec(), entries })
    }
}

fn safetensors_dtype(s: &str) -> Option<DType> {
    Some(match s {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "F64" => DType::F64,
        "I64" => DType::I64,
        "U32" => DType::U32,
        "U8" => DType::U8,
        _ => return None,
    })
}

/// The tensors a safetensors file's header describes, checked against the
/// file's length.
fn read_header(path: &Path) -> Result<Vec<(String, Entry)>> {
    let io = |source| ModelError::Io { path: path.to_path_buf(), source };
    let bad = |message: String| ModelError::Format {
        path: path.to_path_buf(),
        message: format!("not a valid safetensors file: {message}"),
    };
    let mut f = File::open(path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| bad("shorter than its 8-byte header length".into()))?;
    let n = u64::from_le_bytes(n);
    if n > 100_000_000 || 8 + n > size {
        return Err(bad(format!("header length {n} does not fit a file of {size} bytes")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io)?;
    let json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
    let data_start = 8 + n;
    let mut out = Vec::with_capacity(json.len());
    for (name, v) in json {
        if name == "__metadata__" {
            continue;
        }
        let terr = |message: String| ModelError::Tensor { path: path.to_path_buf(), tensor: name.clone(), message };
        let dtype_name = v.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| terr("no dtype".into()))?;
        let dtype = safetensors_dtype(dtype_name).ok_or_else(|| terr(format!("unsupported dtype {dtype_name}")))?;
        let dims: Vec<usize> = v
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| terr("no shape".into()))?;
        let offsets: Vec<u64> = v
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect())
            .ok_or_else(|| terr("no data_offsets".into()))?;
        let [a, b] = offsets[..] else { return Err(terr("data_offsets is not a pair".into())) };
        let want = dims.iter().product::<usize>() * dtype.size_in_bytes();
        if b < a || (b - a) as usize != want {
            return Err(terr(format!(
                "{} data bytes for a {dtype_name} tensor of shape {dims:?}",
                b.saturating_sub(a)
            )));
        }
        if data_start + b > size {
            return Err(terr(format!(
                "data ends at byte {}, past the file's {size}: the file is truncated",
                data_start + b
            )));
        }
        out.push((name, Entry { file: 0, dtype, dims, start: data_start + a, len: want }));
    }
    Ok(out)
}

impl TensorSource for SafetensorsFiles {
    fn origin(&self) -> PathBuf {
        self.origin.clone()
    }

    fn names(&self) -> Vec<String> {
        sorted_names(&self.entries)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.entries.get(name).map(|e| e.dims.clone())
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        let e = self.entries.get(name).ok_or_else(|| ModelError::Tensor {
            path: self.origin.clone(),
            tensor: name.into(),
            message: "missing".into(),
        })?;
        let path = &self.files[e.file];
        let io = |source| ModelError::Io { path: path.clone(), source };
        let mut f = File::open(path).map_err(io)?;
        f.seek(SeekFrom::Start(e.start)).map_err(io)?;
        // Read straight into the tensor's own buffer: the tensor is the
        // only copy of its bytes in memory (`from_raw_buffer` would hold a
        // second while it copies).
        fn read_into<T: candle_core::WithDType + Default + Clone>(f: &mut File, e: &Entry) -> std::io::Result<Tensor> {
            let mut v = vec![T::default(); e.len / std::mem::size_of::<T>()];
            // SAFETY: `v` holds `e.len` bytes of plain floating-point
            // values, any bit pattern of which is valid; the view lives
            // for the read alone.
            let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), e.len) };
            f.read_exact(bytes)?;
            Tensor::from_vec(v, e.dims.as_slice(), &Device::Cpu).map_err(std::io::Error::other)
        }
        let read = match e.dtype {
            DType::F32 => read_into::<f32>(&mut f, e),
            DType::BF16 => read_into::<half::bf16>(&mut f, e),
            DType::F16 => read_into::<half::f16>(&mut f, e),
            DType::F64 => read_into::<f64>(&mut f, e),
            _ => {
                let mut bytes = vec![0u8; e.len];
                f.read_exact(&mut bytes).map_err(io)?;
                return Ok(Tensor::from_raw_buffer(&bytes, e.dtype, &e.dims, &Device::Cpu)?);
            }
        };
        read.map_err(io)
    }
}

/// A GGUF file read one tensor at a time: each is dequantised, renamed to
/// its Hugging Face name and, for the `llama` architecture, un-permuted
/// (see [`super::load_gguf`]).
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    config: ModelConfig,
    /// Hugging Face name → GGUF name, for the model's tensors.
    names: HashMap<String, String>,
}

impl GgufFile {
    /// Reads the file's metadata and tensor table; the configuration comes
    /// from the metadata ([`config_from_gguf`]).
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let size = file.metadata().map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?.len();
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            message: format!("not a valid GGUF file: {e}"),
        })?;
        let config = config_from_gguf(&content, path)?;
        let mut names = HashMap::new();
        for (g, info) in &content.tensor_infos {
            let Some(hf) = hf_name(g) else { continue };
            let bytes = info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
            let end = content.tensor_data_offset + info.offset + bytes as u64;
            if end > size {
                return Err(ModelError::Tensor {
                    path: path.to_path_buf(),
                    tensor: g.clone(),
                    message: format!("data ends at byte {end}, past the file's {size}: the file is truncated"),
                });
            }
            names.insert(hf, g.clone());
        }
        Ok(GgufFile { path: path.to_path_buf(), content, config, names })
    }

    /// The configuration the metadata describes.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
}

impl TensorSource for GgufFile {
    fn origin(&self) -> PathBuf {
        self.path.clone()
    }

    fn names(&self) -> Vec<String> {
        sorted_names(&self.names)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        let g = self.names.get(name)?;
        self.content.tensor_infos.get(g).map(|i| i.shape.dims().to_vec())
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        let terr = |message: String| ModelError::Tensor { path: self.path.clone(), tensor: name.into(), message };
        let g = self.names.get(name).ok_or_else(|| terr("missing".into()))?;
        let file = File::open(&self.path).map_err(|source| ModelError::Io { path: self.path.clone(), source })?;
        let mut reader = BufReader::new(file);
        let q = self.content.tensor(&mut reader, g, &Device::Cpu).map_err(|e| terr(format!("reading: {e}")))?;
        let t = q.dequantize(&Device::Cpu).map_err(|e| terr(format!("dequantising: {e}")))?;
        let cfg = &self.config;
        if cfg.architecture() == Some(Architecture::Llama)
            && (name.contains("self_attn.q_proj.") || name.contains("self_attn.k_proj."))
        {
            let heads = if name.contains("q_proj") { cfg.num_attention_heads } else { cfg.kv_heads() };
            if t.dims()[0] != heads * cfg.head_dim() {
                return Err(terr(format!("{} rows, expected {heads} heads × {}", t.dims()[0], cfg.head_dim())));
            }
            return unpermute_qk(&t, heads).map_err(|e| terr(e.to_string()));
        }
        Ok(t)
    }
}

/// The deterministic initialisation of tests and toy runs, generated per
/// tensor: weights uniform with standard deviation `std`, norm weights
/// uniform in 1 ± 0.05, in f32 (or f64 for gradient checks,
/// [`RandomInit::in_f64`]).
///
/// The values are SplitMix64 draws numbered across the tensors in
/// [`expected_params`] order; draw `g` is `splitmix64(seed + g·φ)` (φ the
/// golden-ratio increment), so any tensor is generated without the ones
/// before it, and the values are those of one sequential stream.
pub struct RandomInit {
    config: ModelConfig,
    seed: u64,
    std: f64,
    f64: bool,
    /// Name → (shape, index of its first draw).
    layout: HashMap<String, (Vec<usize>, u64)>,
}

impl RandomInit {
    /// The initialisation of `config`'s parameters from `seed`.
    pub fn new(config: ModelConfig, seed: u64, std: f64) -> Self {
        let mut layout = HashMap::new();
        let mut first = 0u64;
        for (name, shape) in expected_params(&config) {
            let n = shape.iter().product::<usize>() as u64;
            layout.insert(name, (shape, first));
            first += n;
        }
        RandomInit { config, seed, std, f64: false, layout }
    }

    /// The same values in f64, unrounded (finite-difference checks).
    pub fn in_f64(mut self) -> Self {
        self.f64 = true;
        self
    }

    /// The configuration it initialises.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
}

/// Draw `g` of the stream seeded `seed`, uniform on [0, 1) with 53 bits:
/// `splitmix64(seed + g·φ)` (φ SplitMix64's golden-ratio increment), so
/// any draw is made without the ones before it.
pub(crate) fn uniform_draw(seed: u64, g: u64) -> f64 {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    let z = r2vpo::seed::splitmix64(seed.wrapping_add(g.wrapping_mul(GOLDEN)));
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The tensor of `shape` whose elements are `value(g)` for the draws
/// `first..`, computed in f64 and, unless `f64`, rounded once to f32 (as
/// casting the f64 tensor would), so an f32 model never holds an f64 copy.
pub(crate) fn drawn_tensor(shape: &[usize], first: u64, f64: bool, value: impl Fn(u64) -> f64) -> Result<Tensor> {
    let n = shape.iter().product::<usize>() as u64;
    Ok(if f64 {
        Tensor::from_vec((first..first + n).map(value).collect::<Vec<f64>>(), shape, &Device::Cpu)?
    } else {
        Tensor::from_vec((first..first + n).map(|g| value(g) as f32).collect::<Vec<f32>>(), shape, &Device::Cpu)?
    })
}

impl TensorSource for RandomInit {
    fn origin(&self) -> PathBuf {
        PathBuf::from("<random init>")
    }

    fn names(&self) -> Vec<String> {
        sorted_names(&self.layout)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.layout.get(name).map(|(s, _)| s.clone())
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        let &(ref shape, first) = self.layout.get(name).ok_or_else(|| ModelError::Tensor {
            path: self.origin(),
            tensor: name.into(),
            message: "missing".into(),
        })?;
        let norm = name.ends_with("norm.weight");
        let a = self.std * 3f64.sqrt();
        drawn_tensor(shape, first, self.f64, |g| {
            let u = uniform_draw(self.seed, g);
            if norm {
                1.0 + 0.1 * (u - 0.5)
            } else {
                a * (2.0 * u - 1.0)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors of each stored dtype read one at a time equal candle's
    /// whole-file reader bit for bit; a truncated file is refused when it
    /// is opened, naming the tensor that runs past its end.
    #[test]
    fn safetensors_files_read_what_candle_reads_and_refuse_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let x = Tensor::arange(0f32, 24.0, &Device::Cpu).unwrap().affine(0.37, -1.5).unwrap();
        let mut map = HashMap::new();
        map.insert("a.f32".to_string(), x.reshape((4, 6)).unwrap());
        map.insert("b.bf16".to_string(), x.to_dtype(DType::BF16).unwrap().reshape((2, 3, 4)).unwrap());
        map.insert("c.f16".to_string(), x.to_dtype(DType::F16).unwrap());
        let path = dir.path().join("m.safetensors");
        candle_core::safetensors::save(&map, &path).unwrap();
        let src = SafetensorsFiles::open(std::slice::from_ref(&path), path.clone()).unwrap();
        let whole = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
        assert_eq!(src.names(), vec!["a.f32", "b.bf16", "c.f16"]);
        for (name, want) in &whole {
            let got = src.tensor(name).unwrap();
            assert_eq!((got.dtype(), got.dims()), (want.dtype(), want.dims()), "{name}");
            assert_eq!(src.dims(name).unwrap(), want.dims(), "{name}");
            let (g, w) = (got.to_dtype(DType::F64).unwrap(), want.to_dtype(DType::F64).unwrap());
            assert_eq!(
                g.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
                w.flatten_all().unwrap().to_vec1::<f64>().unwrap()
            );
        }
        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.path().join("cut.safetensors");
        std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
        let e = SafetensorsFiles::open(std::slice::from_ref(&cut), cut.clone()).err().unwrap().to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    /// A random initialisation generated per tensor is the one sequential
    /// SplitMix64 stream over the tensors in order.
    #[test]
    fn random_init_per_tensor_is_one_sequential_stream() {
        let cfg = ModelConfig::tiny(Architecture::Llama, 10, 4, 6, 1, 2, 1, true);
        let init = RandomInit::new(cfg.clone(), 9, 0.5).in_f64();
        let mut state = 9u64;
        for (name, shape) in expected_params(&cfg) {
            let got = init.tensor(&name).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
            assert_eq!(got.len(), shape.iter().product::<usize>());
            for v in got {
                let u = (r2vpo::seed::splitmix64(state) >> 11) as f64 / (1u64 << 53) as f64;
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let want = if name.ends_with("norm.weight") {
                    1.0 + 0.1 * (u - 0.5)
                } else {
                    0.5 * 3f64.sqrt() * (2.0 * u - 1.0)
                };
                assert_eq!(v, want, "{name}");
            }
        }
    }
}
