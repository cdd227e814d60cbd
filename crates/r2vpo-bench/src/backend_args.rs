//! The backend flags `bench llm` and `bench serve` share with `r2vpo serve`
//! and `llm eval`: which compute backend decodes, where, in what dtype,
//! opened through the one factory ([`r2vpo_llm::backend::open`]).

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use r2vpo_llm::backend::open::{open_inference, BackendSpec, Opened};
use r2vpo_llm::backend::{BackendKind, ComputeDtype};

/// `--backend`, `--device`, `--dtype`.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArgs {
    /// The compute backend that decodes: candle (this project's CPU
    /// kernels) or torch (libtorch; a binary built by `make build-torch` or
    /// `make build-gpu`).
    #[arg(long, default_value = "candle", value_parser = ["candle", "torch"])]
    pub backend: String,
    /// Where it decodes: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The dtype decoding computes in: f32, or bf16 (bf16 weights; logits
    /// and log-probs stay f32).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub dtype: String,
}

impl BackendArgs {
    /// The backend these flags describe; the error names the flag.
    pub fn spec(&self) -> Result<BackendSpec> {
        let kind: BackendKind = self.backend.parse().map_err(|m: String| anyhow!("--backend {m}"))?;
        let compute_dtype: ComputeDtype = self.dtype.parse().map_err(|m: String| anyhow!("--dtype {m}"))?;
        Ok(BackendSpec { kind, device: self.device.clone(), compute_dtype, checkpointing: false, lora: None })
    }

    /// The model at `path` (a GGUF file or a Hugging Face folder) opened
    /// for decoding as these flags ask, as `r2vpo serve` opens it.
    pub fn open(&self, path: &Path) -> Result<Opened> {
        let (config, source) =
            r2vpo_llm::model::source::open(path).with_context(|| format!("loading {}", path.display()))?;
        open_inference(&self.spec()?, &config, source.as_ref())
            .with_context(|| format!("opening {} on {} {} {}", path.display(), self.backend, self.device, self.dtype))
    }

    /// As the tables' headers say it.
    pub fn describe(&self) -> String {
        format!("{} {} {}", self.backend, self.device, self.dtype)
    }
}
