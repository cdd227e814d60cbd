//! The compute seam: everything a trainer, a rollout source or an
//! evaluation asks of the arithmetic, so that the algorithm (the objective,
//! λ, the update schedule, replay, aggregation: the core's
//! `r2vpo::learner::Learner` and the trainer's phases) runs once, on the
//! CPU, for every backend.
//!
//! The boundary sits at the per-token log-probs of a micro-batch's
//! responses, `(B, R)`: a backend computes them (and the entropies when the
//! bonus is on) with its own graph, the trainer computes the loss and its
//! gradient with respect to them with the core's objective, and the
//! backend runs the backward from that gradient into its own parameters.
//! The `(B, R)` tensors are a few kilobytes whatever the model's size, so
//! crossing the boundary costs nothing next to a pass. This is exactly
//! the split that gradient checkpointing needs anyway
//! ([`crate::backend::candle::Transformer::checkpointed_tail`]).
//!
//! Two halves:
//! * [`Policy`], inference: scoring, batched sampling with behaviour
//!   log-probs, and weights in and out as [`Weights`] (f32 under the
//!   Hugging Face names, with a version). Rollout sources, evaluation and
//!   the weight channel see only this.
//! * [`Backend`], learning: forward and backward of a micro-batch,
//!   gradient accumulation, the global gradient norm and the clipped AdamW
//!   step. A step takes the gradients of all its micro-batches as one list,
//!   which is where a data-parallel all-reduce would enter.
//!
//! Implementations: [`candle::CandleBackend`] (candle on the CPU kernels
//! of `r2vpo-kernels`, the default; the candle [`candle::Transformer`]
//! alone is the candle [`Policy`]), and `torch::TorchBackend` (libtorch
//! through tch-rs, CPU or CUDA; built with the `torch` feature). Which one
//! runs is a [`open::BackendSpec`], opened by [`open::open`] from a
//! model's description and a source of its weights.

pub mod batch;
pub mod candle;
pub mod open;
pub mod optim;
#[cfg(feature = "torch")]
pub mod torch;

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

pub use batch::MicroBatch;
pub use optim::OptimConfig;

use crate::model::{LoraConfig, ModelConfig, ModelError, Result, TensorSource};
use crate::sample::{Generation, GenerationRequest, SamplingConfig};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

/// Which compute backend (`model.backend`, `r2vpo serve --backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// candle on the CPU kernels of `r2vpo-kernels`.
    #[default]
    Candle,
    /// libtorch through tch-rs.
    Torch,
}

impl BackendKind {
    /// Whether this binary has the backend: the torch backend needs one
    /// built with the `torch` feature, and the refusal says how to get it.
    pub fn check_built(self) -> Result<()> {
        if self == BackendKind::Torch && !cfg!(feature = "torch") {
            return Err(ModelError::Spec {
                field: "backend".into(),
                message: "`torch`: this binary was built without the torch backend; build one with `make \
                          build-torch` (CPU) or `make build-gpu` (CUDA)"
                    .into(),
            });
        }
        Ok(())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "candle" => Ok(BackendKind::Candle),
            "torch" => Ok(BackendKind::Torch),
            other => Err(format!("`{other}`: expected candle or torch")),
        }
    }
}

/// The dtype a backend computes in (`model.compute_dtype`, `r2vpo serve
/// --dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeDtype {
    /// Full precision (the default).
    #[default]
    F32,
    /// bf16 compute with f32 master weights.
    Bf16,
}

impl ComputeDtype {
    /// The candle dtype.
    pub fn dtype(self) -> candle_core::DType {
        match self {
            ComputeDtype::F32 => candle_core::DType::F32,
            ComputeDtype::Bf16 => candle_core::DType::BF16,
        }
    }
}

impl std::str::FromStr for ComputeDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(ComputeDtype::F32),
            "bf16" => Ok(ComputeDtype::Bf16),
            other => Err(format!("`{other}`: expected f32 or bf16")),
        }
    }
}

/// The inference half of a backend.
pub trait Policy: Send + Sync {
    /// The decoder's description (the same for every backend).
    fn config(&self) -> &ModelConfig;

    /// Where micro-batches' tensors are packed and the trainer's objective
    /// runs: the model's device for candle.
    fn device(&self) -> &candle_core::Device;

    /// A short description for logs: backend, device, kernels.
    fn describe(&self) -> String;

    /// Whether micro-batches may share each prompt's keys and values
    /// across its samples ([`batch::pack_prefixed`]); a backend that cannot
    /// is given padded rows ([`batch::pack`]).
    fn shares_prompt_prefix(&self) -> bool {
        false
    }

    /// Whether micro-batches may lay their samples end to end without
    /// padding ([`batch::pack_sequences`]); a backend that cannot is given
    /// padded rows.
    fn packs_sequences(&self) -> bool {
        false
    }

    /// log π of the response columns of `batch`, `(B, R)`, without a graph
    /// (recomputed behaviour log-probs, the reference policy's).
    fn score(&self, batch: &MicroBatch) -> Result<Tensor>;

    /// Samples each request once (prompt ids and seed), with per-token
    /// behaviour log-probs ([`crate::sample::generate`]'s contract).
    fn generate(
        &self,
        tok: &Tokenizer,
        requests: &[GenerationRequest],
        cfg: &SamplingConfig,
    ) -> crate::sample::Result<Vec<Generation>>;

    /// A snapshot of the weights as version `version` (a copy: later
    /// updates do not reach it).
    fn export(&self, version: u64) -> Result<Weights>;

    /// Writes the weights as f32 safetensors under Hugging Face names to
    /// `path` (a checkpoint's `model.safetensors`): [`Policy::export`]'s
    /// tensors, which a backend may stream to the file one at a time
    /// instead of copying the whole model first.
    fn save_weights(&self, path: &Path, version: u64) -> Result<()> {
        self.export(version)?.save_safetensors(path)
    }

    /// Writes the model as a Hugging Face folder (`config.json` and f32
    /// `model.safetensors`) into `dir`, creating it.
    fn save_hf(&self, dir: &Path) -> Result<()> {
        self.export(0)?.save_hf_dir(self.config(), dir)
    }

    /// Sets every parameter from `weights` (a [`Weights`] snapshot, or a
    /// model read from disk one tensor at a time). Every tensor's presence
    /// and shape is checked before any is applied, so a source that does
    /// not fit leaves the model as it was: the error names the tensor
    /// ([`crate::model::ModelError::Mismatch`]). On a model with adapters
    /// it sets the frozen base.
    fn load(&self, weights: &dyn TensorSource) -> Result<()>;

    /// The low-rank adapters' configuration where the model trains
    /// adapters on a frozen base ([`crate::model::lora`]); `None` when
    /// every weight trains. With adapters, [`Policy::export`] gives the
    /// merged weights (what the adapted model computes, as a plain model).
    fn lora(&self) -> Option<&LoraConfig> {
        None
    }

    /// The adapters' current values, f32 on the CPU under PEFT names;
    /// `None` without adapters.
    fn export_adapter(&self) -> Result<Option<HashMap<String, Tensor>>> {
        Ok(None)
    }

    /// Sets the adapters from `source` (PEFT names), checked first to hold
    /// exactly this model's adapters ([`crate::model::lora::check_adapter`]),
    /// so one that does not fit leaves the model as it was.
    fn load_adapter(&self, source: &dyn TensorSource) -> Result<()> {
        let _ = source;
        Err(ModelError::Spec { field: "lora".into(), message: "this model has no adapters to load into".into() })
    }

    /// What a learner hands its actors at version `version`: its adapters
    /// where it trains adapters ([`Weights::of_adapter`]), else its weights.
    fn export_for_actors(&self, version: u64) -> Result<Weights> {
        match (self.lora(), self.export_adapter()?) {
            (Some(lora), Some(tensors)) => Ok(Weights::of_adapter(version, lora.clone(), tensors)),
            _ => self.export(version),
        }
    }

    /// Makes this policy compute `w`: [`Policy::load_adapter`] for adapters
    /// (this policy must carry adapters of the same configuration), else
    /// [`Policy::load`].
    fn apply_weights(&self, w: &Weights) -> Result<()> {
        match &w.adapter {
            Some(lora) => {
                if !self.lora().is_some_and(|own| own.same_adapters(lora)) {
                    return Err(ModelError::Spec {
                        field: "lora".into(),
                        message: format!(
                            "weight version {} holds adapters of rank {}, alpha {}, targets {:?}; this policy's are {:?}",
                            w.version,
                            lora.rank,
                            lora.alpha,
                            lora.targets,
                            self.lora()
                        ),
                    });
                }
                self.load_adapter(w)
            }
            None => self.load(w),
        }
    }
}

/// The check [`Policy::load`] makes before applying anything: `source`
/// holds each of `expected` (name, shape).
pub fn check_fits(source: &dyn TensorSource, expected: &[(String, Vec<usize>)]) -> Result<()> {
    for (name, shape) in expected {
        let mismatch = |message: String| ModelError::Mismatch { tensor: name.clone(), message };
        match source.dims(name) {
            None => return Err(mismatch(format!("missing from {}", source.origin().display()))),
            Some(d) if d != *shape => {
                return Err(mismatch(format!("shape {d:?} in {}, {shape:?} in this model", source.origin().display())))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The values of one micro-batch's forward, without a graph, on
/// [`Policy::device`].
pub struct Forward {
    /// log π_θ of the response columns, `(B, R)`.
    pub logp: Tensor,
    /// The policy's entropy at the same columns, `(B, R)`, when asked for.
    pub entropy: Option<Tensor>,
}

/// One micro-batch's forward and backward through `loss`: the step every
/// learner takes (the trainer's, and `bench step`'s, which therefore times
/// exactly it). The backend's log-probs (and entropies, with `entropy`)
/// become leaves of a small graph on [`Policy::device`]; `loss` builds the
/// scalar loss on them (the objective, a KL to a reference, an entropy
/// bonus) and may return anything else it computed; its gradient with
/// respect to the leaves goes into the backend's backward, which adds the
/// parameters' gradients to the step's. Returns the forward's values, the
/// loss and what `loss` returned.
pub fn forward_backward<R, E>(
    be: &mut dyn Backend,
    batch: &MicroBatch,
    entropy: bool,
    loss: impl FnOnce(&Tensor, Option<&Tensor>) -> std::result::Result<(Tensor, R), E>,
) -> std::result::Result<(Forward, Tensor, R), E>
where
    E: From<ModelError> + From<candle_core::Error>,
{
    let fwd = be.forward(batch, entropy)?;
    let logp = candle_core::Var::from_tensor(&fwd.logp)?;
    let ent = fwd.entropy.as_ref().map(candle_core::Var::from_tensor).transpose()?;
    let (value, extra) = loss(logp.as_tensor(), ent.as_ref().map(|e| e.as_tensor()))?;
    let gs = value.backward()?;
    let dlogp = gs
        .get(logp.as_tensor())
        .ok_or_else(|| candle_core::Error::Msg("the loss does not depend on the log-probs it was given".into()))?;
    be.backward(dlogp, ent.as_ref().and_then(|e| gs.get(e.as_tensor())))?;
    Ok((fwd, value, extra))
}
/// What one rank of a data-parallel job keeps of the optimizer state after
/// [`Sharding::shard_optimizer`], in values (elements), with what all ranks
/// keep together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardSizes {
    /// AdamW moment values this rank keeps.
    pub moments: usize,
    /// AdamW moment values all ranks keep together.
    pub moments_total: usize,
    /// f32 master values this rank keeps (every trained value when the
    /// compute kind is f32, the masters then being the compute weights).
    pub masters: usize,
    /// f32 master values all ranks keep together.
    pub masters_total: usize,
}

/// The learning half of a backend: one micro-batch in flight at a time
/// ([`Backend::forward`], then [`Backend::backward`]), gradients summed
/// over a step's micro-batches until [`Backend::step`] or
/// [`Backend::zero_grad`].
pub trait Backend: Policy {
    /// The forward of `batch`, keeping what the backward needs; with
    /// `entropy`, the entropies too.
    fn forward(&mut self, batch: &MicroBatch, entropy: bool) -> Result<Forward>;

    /// The backward of the last forward given the loss's gradients with
    /// respect to its log-probs and (when asked for) its entropies, added
    /// to the accumulated gradients.
    fn backward(&mut self, dlogp: &Tensor, dentropy: Option<&Tensor>) -> Result<()>;

    /// The backend's data-parallel half, where it trains as one rank of a
    /// job (`None`: it trains in one process only, and a launched job on it
    /// is refused by name).
    fn sharding(&mut self) -> Option<&mut dyn Sharding> {
        None
    }

    /// The L2 norm of the accumulated gradients, in f64 (`NaN`/`inf`
    /// propagate, so the caller can refuse the step).
    fn grad_norm(&self) -> Result<f64>;

    /// One AdamW step with the accumulated gradients scaled by
    /// `grad_scale` (the clipping factor), then the gradients are cleared.
    /// Returns the learning rate used.
    fn step(&mut self, grad_scale: f64) -> Result<f64>;

    /// Drops the accumulated gradients (a refused step).
    fn zero_grad(&mut self);

    /// The accumulated gradients by Hugging Face parameter name, f32 on
    /// the CPU (for parity tests and diagnostics).
    fn gradients(&self) -> Result<HashMap<String, Tensor>>;

    /// Optimizer steps taken.
    fn optimizer_steps(&self) -> u64;

    /// Writes the optimizer's state (its moments) to `path`.
    fn save_optimizer(&self, path: &Path) -> Result<()>;

    /// Restores the state [`Backend::save_optimizer`] wrote, with the step
    /// count `steps`.
    fn load_optimizer(&mut self, path: &Path, steps: u64) -> Result<()>;

    /// Waits until the work queued on the device has finished (for timing;
    /// a no-op where every call is synchronous).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

/// The data-parallel half of a backend (ZeRO's mechanics): what one rank
/// of a job does with its gradients, parameters and optimizer state so
/// that every rank steps as one process would. The trainer's side (which
/// micro-batches are a rank's, when each of these is called) is
/// `train::data_parallel`; the collectives are the [`crate::parallel::Group`]'s.
pub trait Sharding {
    /// Sums the accumulated gradients over the ranks, so every rank steps
    /// with the whole batch's gradient (each rank accumulated its share of
    /// the micro-batches, with the loss already normalised by the whole
    /// batch's counts).
    fn sync_grads(&mut self, group: &mut dyn crate::parallel::Group) -> Result<()>;

    /// ZeRO stage 2, at the end of each round of micro-batches (one per
    /// rank): sums every rank's gradients into the rank that steps each
    /// parameter and drops them on the others, so between rounds a rank
    /// holds only its share of the gradients. Takes the place of
    /// [`Sharding::sync_grads`]; needs [`Sharding::shard_optimizer`] first.
    fn reduce_grads(&mut self, group: &mut dyn crate::parallel::Group) -> Result<()>;

    /// ZeRO stage 2 without a whole gradient set: from now on each
    /// [`Backend::backward`] sums every layer's gradients into their owners
    /// over `group` as soon as that layer's backward is done, and drops
    /// them on the others, in the order [`Sharding::reduce_grads`] uses (so
    /// a rank without a micro-batch in a round joins with zeros through
    /// it). False where this backend's backward is one graph (no gradient
    /// checkpointing): the round's [`Sharding::reduce_grads`] does it then.
    fn reduce_in_backward(&mut self, group: Box<dyn crate::parallel::Group>) -> bool;

    /// Keeps the optimizer state only for this rank's share of the
    /// parameters (ZeRO stage 1 over `world` ranks): AdamW's moments and,
    /// where the model computes in a narrower kind than its f32 masters
    /// (bf16), the masters themselves, the other ranks' parameters being
    /// held in the compute kind only. [`Backend::step`] then steps only
    /// this rank's parameters, and [`Sharding::sync_params`] sends them to
    /// the others. State already held for other ranks' parameters is
    /// dropped.
    fn shard_optimizer(&mut self, rank: usize, world: usize) -> Result<ShardSizes>;

    /// After a sharded step, every rank's parameters become their owners'
    /// (a no-op unsharded).
    fn sync_params(&mut self, group: &mut dyn crate::parallel::Group) -> Result<()>;

    /// Before rank 0 writes a checkpoint of a sharded optimizer whose f32
    /// masters are sharded (bf16 compute): every rank sends its masters,
    /// so rank 0's exports (until the weights next change) carry every
    /// master (a no-op otherwise).
    fn gather_optimizer(&mut self, group: &mut dyn crate::parallel::Group) -> Result<()>;

    /// A checkpoint's optimizer file of a sharded optimizer, in
    /// [`Backend::save_optimizer`]'s layout: every rank calls it, each
    /// moment goes from its owner to rank 0 one tensor at a time, and rank
    /// 0 (`path` given there, `None` on the others) writes it to `path`
    /// as it arrives, so no rank holds more than its own state and one
    /// tensor. Unsharded, rank 0 saves its own state.
    fn write_optimizer(&mut self, group: &mut dyn crate::parallel::Group, path: Option<&Path>) -> Result<()>;
}
