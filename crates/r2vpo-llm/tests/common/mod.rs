//! Shared by the sampling tests (a peaked tiny model and the learner's
//! full-sequence recomputation of sampled tokens' log-probs) and the trainer
//! tests (the tiny seeded run and its reward, in [`train`]; packed against
//! padded micro-batches, in [`packing`]).

#![allow(dead_code)]

pub mod packing;
pub mod train;

use candle_core::{DType, Device, Tensor};
use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::model::{Architecture, ModelConfig};
use r2vpo_llm::sample::{Generation, GenerationRequest};
use r2vpo_llm::tokenizer::PaddedBatch;

pub const VOCAB: usize = 64;

/// A tiny random model whose next-token distributions are far from
/// uniform (the std-0.02 init alone gives logits within ±0.3, where a log-prob
/// misaligned by one position would still pass a 1e-4 check by accident).
pub fn peaked_model(seed: u64) -> Transformer {
    let cfg = ModelConfig::tiny(Architecture::Qwen2, VOCAB, 32, 48, 2, 4, 2, false);
    let m = Transformer::new_random(cfg, seed, DType::F32, &Device::Cpu).unwrap();
    for (name, var) in m.named_vars() {
        let scale = match name.as_str() {
            "lm_head.weight" => 40.0,
            "model.embed_tokens.weight" => 20.0,
            n if n.contains("proj") => 8.0,
            _ => 1.0,
        };
        var.set(&(var.as_tensor() * scale).unwrap()).unwrap();
    }
    m
}

/// Recomputes log π(token) for every generated token with one
/// full-sequence, left-padded `score_logprobs` pass.
pub fn rescored(m: &Transformer, reqs: &[GenerationRequest], gens: &[Generation]) -> Vec<Vec<f32>> {
    let seqs: Vec<Vec<u32>> =
        reqs.iter().zip(gens).map(|(r, g)| [r.prompt_ids.clone(), g.token_ids.clone()].concat()).collect();
    let b = PaddedBatch::left_pad(&seqs, 0);
    let (ids, mask) = b.to_tensors(&Device::Cpu).unwrap();
    // targets[t] = ids[t + 1]; the last column is never read.
    let w = b.width();
    let targets = Tensor::cat(&[ids.narrow(1, 1, w - 1).unwrap(), ids.narrow(1, w - 1, 1).unwrap()], 1).unwrap();
    let lp = m.score_logprobs(&ids, &mask, &targets).unwrap().to_vec2::<f32>().unwrap();
    gens.iter()
        .enumerate()
        .map(|(i, g)| {
            let n = g.token_ids.len();
            // Generated token k sits at column w - n + k; it is predicted at the column before.
            (0..n).map(|k| lp[i][w - n + k - 1]).collect()
        })
        .collect()
}

/// The initial adapters of `lora` on `cfg`'s model (A as PEFT draws it)
/// with B set to a fixed pattern of amplitude `b` instead of zero, so that
/// every factor reaches the output.
pub fn adapters_with_b(
    cfg: &ModelConfig,
    lora: &r2vpo_llm::model::LoraConfig,
    b: f32,
) -> std::collections::HashMap<String, Tensor> {
    use r2vpo_llm::model::TensorSource;
    let init = r2vpo_llm::model::lora::AdapterInit::new(cfg, lora);
    init.names()
        .into_iter()
        .map(|n| {
            let t = init.tensor(&n).unwrap();
            let t = if n.ends_with("lora_B.weight") {
                let v: Vec<f32> =
                    (0..t.elem_count()).map(|i| b * (((i * 31 + n.len()) % 17) as f32 / 17.0 - 0.5)).collect();
                Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap()
            } else {
                t
            };
            (n, t)
        })
        .collect()
}
