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
//! ([`crate::model::Transformer::checkpointed_tail`]).
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
//! Implementations: [`CandleBackend`] (candle on the CPU kernels of
//! `r2vpo-kernels`, the default; the candle [`Transformer`] alone is the
//! candle [`Policy`]), and `torch::TorchBackend` (libtorch through tch-rs,
//! CPU or CUDA; built with the `torch` feature).

pub mod adamw;
pub mod batch;
pub mod candle;
#[cfg(feature = "torch")]
pub mod torch;

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

pub use adamw::OptimConfig;
pub use batch::MicroBatch;
pub use candle::CandleBackend;

use crate::model::{ModelConfig, Result};
use crate::sample::{Generation, GenerationRequest, SamplingConfig};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

#[cfg(doc)]
use crate::model::Transformer;

/// The inference half of a backend.
pub trait Policy: Send + Sync {
    /// The decoder's description (the same for every backend).
    fn config(&self) -> &ModelConfig;

    /// Where micro-batches' tensors are packed and the trainer's objective
    /// runs: the model's device for candle.
    fn device(&self) -> &candle_core::Device;

    /// A short description for logs: backend, device, kernels.
    fn describe(&self) -> String;

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

    /// Sets every parameter from `weights`; a missing or mis-shaped tensor
    /// is an error naming it ([`crate::model::ModelError::Mismatch`]).
    fn load(&self, weights: &Weights) -> Result<()>;
}

/// The values of one micro-batch's forward, without a graph, on
/// [`Policy::device`].
pub struct Forward {
    /// log π_θ of the response columns, `(B, R)`.
    pub logp: Tensor,
    /// The policy's entropy at the same columns, `(B, R)`, when asked for.
    pub entropy: Option<Tensor>,
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
