//! Rollouts as a service.
//!
//! * [`server`] — `r2vpo serve`: OpenAI-compatible `/v1/completions` with
//!   per-token log-probs and token ids, continuous batching
//!   ([`r2vpo_llm::engine`]), SGLang's `update_weights_from_disk`,
//!   `pause_generation` / `continue_generation`, on axum + tokio.
//! * [`client`] — [`client::HttpRollout`], the `[rollout] backend = "http"`
//!   source of `llm train`: groups spread over servers with retries,
//!   fail-over and weight pushes.
//! * [`protocol`] — the wire types both sides share.
//!
//! The contract (which fields a learner relies on, what the log-probs mean,
//! how vLLM and SGLang map onto it) is written down in
//! `docs/rollouts-and-serving.md`.

pub mod client;
pub mod metrics;
pub mod protocol;
pub mod server;
mod stream;

pub use client::HttpRollout;
pub use server::{serve, ServeConfig, ServeError};
