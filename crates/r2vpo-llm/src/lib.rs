//! # r2vpo-llm — RL fine-tuning of language models on math reasoning
//!
//! The paper's main domain (Section 4.1): models described independently
//! of what computes them (`model`: Llama/Qwen configs, weights read from
//! Hugging Face folders and GGUF files one tensor at a time), compute
//! backends behind one seam (`backend`: candle on this project's CPU
//! kernels, libtorch with the `torch` feature), batched sampling with
//! behaviour log-probs, serving, datasets, training and evaluation. Rewards come from the math verifier, `r2vpo-verify`. It depends on the algorithm core
//! `r2vpo`, never the reverse.

#![warn(missing_docs)]

pub mod backend;
pub mod chat;
pub mod data;
pub mod decode;
pub mod engine;
pub mod eval;
pub mod experience;
pub mod gguf;
pub mod model;
pub mod parallel;
pub mod plan;
pub mod plot;
pub mod pool;
pub mod queue;
pub mod rollout;
pub mod sample;
pub mod tokenizer;
pub mod train;
pub mod weights;
