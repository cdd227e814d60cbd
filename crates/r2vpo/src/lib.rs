//! # r2vpo — the R²VPO algorithm core
//!
//! Ratio-Variance Regularized Policy Optimization replaces PPO/GRPO's hard
//! ratio clipping with a quadratic penalty on the policy ratio whose strength
//! is a Lagrange multiplier λ (the paper's Eq. `primal_dual`):
//!
//! ```text
//! max_θ min_{λ≥0}  E_{π_off}[ ρ_t(θ)·Â_t − λ((ρ_t(θ) − 1)² − δ) ]
//! ```
//!
//! One module per idea of the paper's Section 3, so each equation can be read
//! beside the code:
//!
//! | module | what | paper |
//! |---|---|---|
//! | [`objective`] | R²VPO penalty and the baselines (clip, dual-clip, clip-higher, GPPO, TOPR, exact-KL, plain IS-PG, and the 2026 menu: M2PO, log-ratio², SPO, GSPO, CISPO, SAPO, DPPO) with detached ratio statistics | Eq. (primal–dual), Eq. (gradient), Eq. (clip objective) |
//! | [`correction`] | rollout–trainer mismatch weights: token/sequence TIS and MIS | — |
//! | [`aggregate`] | token-mean / seq-mean-token-mean / seq-mean-token-sum / seq-mean-token-sum-norm, normalised over the global batch | — |
//! | [`dual`] | fixed or adaptive λ | Eq. (λ update) |
//! | [`advantage`] | GAE and group-relative advantages | — |
//! | [`algo`] | the one table of named algorithms (GRPO, GRPO-CH, GPPO, R²VPO-ON/OFF, …): objective + update mode | Section 4 baselines |
//! | [`replay`] | FIFO replay over the last K iterations with update-to-data ratio | Algorithm 2 |
//! | [`learner`] | the learner contract: loss at the current λ, statistics pooled per step, λ moved only where it acts | Eq. (λ update) |
//! | [`schedule`] | each optimizer step's items: epochs × minibatches, or replay draws with staleness | Algorithms 1 and 2 |
//! | [`seed`], [`stats`] | seed derivation (SplitMix64 streams); mean/std, quantiles, median | — |
//! | [`divergence`] | f-divergence generators, exact divergences, the ½·f''(1)·Var\[ρ\] approximation, the clipping-error bound | Proposition 3.1, Table 1, Theorem 3.3 |
//!
//! The crate contains no domain code: the LLM and control crates depend on it,
//! never the reverse. Tensors are [`candle_core::Tensor`]s so autograd flows
//! through the objectives unchanged in both domains.

#![warn(missing_docs)]

pub mod adam;
pub mod advantage;
pub mod aggregate;
pub mod algo;
pub mod correction;
pub mod divergence;
pub mod dual;
mod error;
pub mod learner;
pub mod objective;
pub mod replay;
pub mod schedule;
pub mod seed;
pub mod stats;

pub use error::{Error, Result};
