//! A memory plan for a training step before renting GPUs (`r2vpo llm plan`):
//! per-rank bytes of weights, gradients, master weights, AdamW moments,
//! activations and logits for a model shape, a world size and a sharding
//! stage, in the spirit of DeepSpeed's `estimate_zero*_model_states_mem_needs`.
//!
//! **Model state** (bytes per parameter, P parameters, N ranks), with bf16
//! compute: a bf16 compute copy (2; 2/N under ZeRO-3), f32 master weights
//! (4; 4/N from ZeRO-1), f32 gradients (4; 4/N from ZeRO-2), AdamW's two f32
//! moments (8; 8/N from ZeRO-1): Megatron's distributed-optimizer
//! arithmetic. With f32 compute the master weights are the compute weights
//! (4 + 4 + 8). With LoRA the base weights are frozen in the compute dtype
//! and only the adapters (`r·(in + out)` per adapted matrix) carry master
//! weights, gradients and moments.
//!
//! **Activations** of one micro-batch of `T` tokens in sequences of `S`:
//! per token and layer the step keeps about `6H + 3I` values (the norms'
//! and projections' outputs on the residual width, the MLP's gate, up and
//! product), plus `n_heads·S` attention probabilities where attention
//! materialises them (the candle backend; the torch backend's
//! `scaled_dot_product_attention` does not), times the compute dtype's size; with gradient
//! checkpointing it keeps only each layer's input (`H` per token and layer)
//! plus one layer's full set during the recomputation. **Logits:** f32
//! logits and their log-softmax over the response tokens, `2·4·V` bytes per
//! row, or per row of one chunk when the LM head runs in chunks.
//!
//! The activation count is a model of this project's CPU learner, checked
//! against its measured peak resident memory (`bench step --memory`) in
//! `crates/r2vpo-cli/tests/plan.rs`, which states the margin. Allocator
//! caches and a framework's workspace come on top on a GPU.

use serde::Serialize;

use crate::model::{LoraConfig, ModelConfig};

/// What to plan for.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInput {
    /// Data-parallel ranks the model state is sharded over.
    pub world_size: usize,
    /// ZeRO stage: 0 (replicated), 1 (optimizer state sharded), 2 (and
    /// gradients), 3 (and the compute weights).
    pub zero_stage: u8,
    /// Tokens in one micro-batch (all its sequences, prompt and response).
    pub micro_batch_tokens: usize,
    /// Response tokens in one micro-batch (the rows the LM head scores).
    pub response_tokens: usize,
    /// The longest sequence of a micro-batch (attention probabilities).
    pub seq_len: usize,
    /// Gradient checkpointing per decoder layer.
    pub checkpointing: bool,
    /// Rows per LM-head chunk; `None` scores all response rows at once.
    pub lm_head_chunk: Option<usize>,
    /// The adapters trained under LoRA (their rank and targets count);
    /// `None`: full fine-tuning.
    pub lora: Option<LoraConfig>,
    /// bf16 compute (f32 master weights) instead of f32.
    pub bf16: bool,
    /// Attention keeps its `S × S` probabilities per head (the candle
    /// backend) instead of a fused kernel's (the torch backend).
    pub materialised_attention: bool,
}

/// One line of the plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanRow {
    /// What the bytes hold.
    pub what: &'static str,
    /// Bytes per rank.
    pub bytes: u64,
}

/// The plan: per-rank bytes by kind and their sum.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Parameters of the model.
    pub parameters: u64,
    /// Trainable parameters (the adapters under LoRA).
    pub trainable: u64,
    /// Per-rank bytes by kind.
    pub rows: Vec<PlanRow>,
    /// Their sum.
    pub total: u64,
    /// Beside a checkpoint or a resume, on top of the model state (the
    /// step's activations are gone by then).
    pub transients: Transients,
}

/// What a checkpoint and a resume add to a rank, in bytes (the torch
/// backend's data-parallel learner: each moment sent to rank 0 and written
/// to the file as it arrives, the model file written from the f32 masters
/// tensor by tensor, and on resume each rank reading only the moments it
/// steps from the mapped file).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Transients {
    /// On every rank's device during a checkpoint or a resume: one f32
    /// tensor in flight, the largest (the embedding).
    pub device_in_flight: u64,
    /// In rank 0's host memory during a checkpoint: the tensor being
    /// written, and with sharded f32 masters (bf16 compute) the other
    /// ranks' masters, which the model file is written from.
    pub rank0_host_checkpoint: u64,
    /// Read by each rank from the mapped optimizer file on resume: its own
    /// moments (the pages stay in the page cache, reclaimable).
    pub resume_read: u64,
}

/// The model's parameter count: embeddings, every layer's projections and
/// norms (Qwen3's q/k norms included), the final norm and an untied LM head.
pub fn parameters(cfg: &ModelConfig) -> u64 {
    let (h, v) = (cfg.hidden_size as u64, cfg.vocab_size as u64);
    let head = if cfg.tie_word_embeddings { 0 } else { v * h };
    v * h + cfg.num_hidden_layers as u64 * layer_parameters(cfg) + h + head
}

/// One decoder layer's parameters: its projections, norms and biases.
pub fn layer_parameters(cfg: &ModelConfig) -> u64 {
    let (h, i) = (cfg.hidden_size as u64, cfg.intermediate_size as u64);
    let (q, kv) = ((cfg.num_attention_heads * cfg.head_dim()) as u64, (cfg.kv_heads() * cfg.head_dim()) as u64);
    let mut layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
    if cfg.qkv_bias() {
        layer += q + 2 * kv;
    }
    if cfg.o_bias() {
        layer += h;
    }
    if cfg.qk_norm() {
        layer += 2 * cfg.head_dim() as u64;
    }
    layer
}

/// LoRA parameters of rank `r` on every attention (q, k, v, o) and MLP
/// (gate, up, down) projection, `r·(in + out)` each, in closed form (the
/// plan's tests check [`LoraConfig::num_parameters`], which counts the
/// model's adapter tensors, against it).
pub fn lora_parameters(cfg: &ModelConfig, r: usize) -> u64 {
    let (h, i) = (cfg.hidden_size as u64, cfg.intermediate_size as u64);
    let (q, kv) = ((cfg.num_attention_heads * cfg.head_dim()) as u64, (cfg.kv_heads() * cfg.head_dim()) as u64);
    let per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h);
    r as u64 * per_layer * cfg.num_hidden_layers as u64
}

/// Per-token, per-layer activation values a step keeps (module docs).
pub fn activation_values_per_token_layer(cfg: &ModelConfig, seq_len: usize, materialised_attention: bool) -> u64 {
    let probs = if materialised_attention { (cfg.num_attention_heads * seq_len) as u64 } else { 0 };
    6 * cfg.hidden_size as u64 + 3 * cfg.intermediate_size as u64 + probs
}

/// The plan for `cfg` under `input` (module docs for every term).
pub fn plan(cfg: &ModelConfig, input: &PlanInput) -> Plan {
    let n = input.world_size.max(1) as u64;
    let p = parameters(cfg);
    let share = |bytes: u64, sharded: bool| if sharded { bytes.div_ceil(n) } else { bytes };
    let z = input.zero_stage;
    let compute = if input.bf16 { 2 } else { 4 };
    let mut rows = Vec::new();
    let trainable = match &input.lora {
        None => {
            rows.push(PlanRow { what: "weights (compute dtype)", bytes: share(compute * p, z >= 3) });
            if input.bf16 {
                rows.push(PlanRow { what: "master weights (f32)", bytes: share(4 * p, z >= 1) });
            }
            rows.push(PlanRow { what: "gradients (f32)", bytes: share(4 * p, z >= 2) });
            if z >= 2 && n > 1 {
                // Whole on every rank until reduced: with checkpointed
                // layers one layer's and the embedding's and head's (done
                // only at the backward's end); else the whole set, reduced
                // after the backward.
                let (v, h) = (cfg.vocab_size as u64, cfg.hidden_size as u64);
                let whole = if input.checkpointing {
                    layer_parameters(cfg) + v * h * if cfg.tie_word_embeddings { 1 } else { 2 }
                } else {
                    p
                };
                rows.push(PlanRow { what: "gradients in flight (f32, until reduced)", bytes: 4 * whole });
            }
            rows.push(PlanRow { what: "AdamW moments (f32 m, v)", bytes: share(8 * p, z >= 1) });
            p
        }
        Some(lora) => {
            let a = lora.num_parameters(cfg) as u64;
            rows.push(PlanRow { what: "base weights, frozen (compute dtype)", bytes: share(compute * p, z >= 3) });
            rows.push(PlanRow { what: "adapters (f32 master, compute copy)", bytes: (4 + compute) * a });
            rows.push(PlanRow { what: "adapter gradients (f32)", bytes: 4 * a });
            rows.push(PlanRow { what: "adapter AdamW moments", bytes: 8 * a });
            a
        }
    };
    let (t, l, h) = (input.micro_batch_tokens as u64, cfg.num_hidden_layers as u64, cfg.hidden_size as u64);
    let per_layer = t * activation_values_per_token_layer(cfg, input.seq_len, input.materialised_attention) * compute;
    let activations = if input.checkpointing { l * t * h * compute + per_layer } else { l * per_layer };
    rows.push(PlanRow {
        what: if input.checkpointing { "activations (layer inputs + one layer)" } else { "activations" },
        bytes: activations,
    });
    let logit_rows = input.lm_head_chunk.map_or(input.response_tokens, |c| c.min(input.response_tokens)) as u64;
    rows.push(PlanRow { what: "logits and log-softmax (f32)", bytes: 2 * 4 * logit_rows * cfg.vocab_size as u64 });
    let total = rows.iter().map(|r| r.bytes).sum();
    // AdamW's two f32 moments of what learns; with bf16 compute under
    // sharding the other ranks' f32 masters come to rank 0 for the model
    // file (under LoRA the checkpoint holds the adapters instead).
    let moments = 8 * trainable;
    let sharded = z >= 1 && n > 1;
    let masters = if sharded && input.bf16 && input.lora.is_none() { 4 * p - (4 * p).div_ceil(n) } else { 0 };
    let largest = 4 * (cfg.vocab_size * cfg.hidden_size).max(cfg.hidden_size * cfg.intermediate_size) as u64;
    // Under LoRA what moves is adapters: r × the widest projection side.
    let in_flight = match &input.lora {
        Some(l) => 4 * (l.rank * cfg.hidden_size.max(cfg.intermediate_size)) as u64,
        None => largest,
    };
    let transients = Transients {
        device_in_flight: in_flight,
        rank0_host_checkpoint: in_flight + masters,
        resume_read: share(moments, sharded),
    };
    Plan { parameters: p, trainable, rows, total, transients }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(name: &str) -> ModelConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/shapes").join(name);
        ModelConfig::from_file(&path).unwrap()
    }

    /// The parameter counts Hugging Face's model cards state.
    #[test]
    fn parameter_counts_match_the_model_cards() {
        // The Qwen3 cards: 8.2B, 4.0B, 1.7B (tied embeddings counted once);
        // SmolLM2-135M: 134,515,008 as `bench step` counts the built model.
        assert_eq!(parameters(&shape("smollm2-135m.json")), 134_515_008);
        for (name, billions) in [("qwen3-8b.json", 8.2), ("qwen3-4b.json", 4.0), ("qwen3-1.7b.json", 1.7)] {
            let got = parameters(&shape(name)) as f64 / 1e9;
            assert!((got - billions).abs() < 0.05, "{name}: {got:.3}B against {billions}B");
        }
    }

    /// A plan of model state alone (no tokens), bf16 with checkpointed
    /// layers, over `world_size` ranks at `zero_stage`.
    fn state_only(world_size: usize, zero_stage: u8) -> PlanInput {
        PlanInput {
            world_size,
            zero_stage,
            micro_batch_tokens: 0,
            response_tokens: 0,
            seq_len: 0,
            checkpointing: true,
            lm_head_chunk: None,
            lora: None,
            bf16: true,
            materialised_attention: false,
        }
    }

    /// Model state per parameter with bf16 compute and f32 gradients: 18
    /// bytes on one rank (147 GB for Qwen3-8B); Megatron's distributed
    /// optimizer (ZeRO-1) 6 + 12/N; ZeRO-2 2 + 16/N (2 + 14/N where the
    /// gradient shards are bf16, which this learner's are not); ZeRO-3 18/N.
    #[test]
    fn zero_stages_shard_as_megatron_says() {
        let cfg = shape("qwen3-8b.json");
        let p = parameters(&cfg) as f64;
        let state = |world_size, zero_stage| plan(&cfg, &state_only(world_size, zero_stage)).total as f64 / p;
        assert!((state(1, 0) - 18.0).abs() < 1e-6);
        assert!((state(8, 1) - (6.0 + 12.0 / 8.0)).abs() < 1e-3);
        // ZeRO-2 and 3 with checkpointed layers: one layer's gradients and
        // the (untied) embedding's and head's whole until reduced.
        let in_flight = 4.0 * (layer_parameters(&cfg) + 2 * 151_936 * 4096) as f64 / p;
        assert!((state(8, 2) - (2.0 + 16.0 / 8.0) - in_flight).abs() < 1e-3);
        assert!((state(8, 3) - 18.0 / 8.0 - in_flight).abs() < 1e-3);
    }

    /// A checkpoint of the 8B recipe on 8 ranks: one embedding in flight
    /// on each device, and on rank 0's host the tensor being written and
    /// the other seven ranks' f32 masters (4 bytes per parameter, 7/8 of
    /// them) for the model file; on resume each rank reads its eighth of
    /// the moments. Unsharded, nothing gathers and each rank reads all.
    #[test]
    fn checkpoint_and_resume_transients_follow_the_shards() {
        let cfg = shape("qwen3-8b.json");
        let p = parameters(&cfg);
        let t = plan(&cfg, &state_only(8, 1)).transients;
        assert_eq!(t.device_in_flight, 4 * 151_936 * 4096);
        assert_eq!(t.rank0_host_checkpoint, t.device_in_flight + 4 * p - (4 * p).div_ceil(8));
        assert_eq!(t.resume_read, (8 * p).div_ceil(8));
        let t = plan(&cfg, &state_only(8, 0)).transients;
        assert_eq!((t.rank0_host_checkpoint, t.resume_read), (t.device_in_flight, 8 * p));
    }

    /// LoRA's trainable count is the adapters' tensors (every projection
    /// in closed form, fewer with fewer targets), and its model state is
    /// the frozen base in bf16 plus 18 bytes per adapter parameter.
    #[test]
    fn lora_counts_its_targets_and_freezes_the_base() {
        use crate::model::LoraTarget;
        let cfg = shape("qwen3-8b.json");
        let all = LoraConfig { rank: 16, ..LoraConfig::default() };
        assert_eq!(all.num_parameters(&cfg) as u64, lora_parameters(&cfg, 16));
        let attn = LoraConfig {
            targets: vec![LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj, LoraTarget::OProj],
            ..all.clone()
        };
        let (h, q, kv) = (4096u64, 32 * 128u64, 8 * 128u64);
        assert_eq!(attn.num_parameters(&cfg) as u64, 16 * 36 * ((h + q) + 2 * (h + kv) + (q + h)));
        let state = |lora: &LoraConfig| {
            let input = PlanInput {
                world_size: 1,
                zero_stage: 0,
                micro_batch_tokens: 0,
                response_tokens: 0,
                seq_len: 0,
                checkpointing: true,
                lm_head_chunk: None,
                lora: Some(lora.clone()),
                bf16: true,
                materialised_attention: false,
            };
            let p = plan(&cfg, &input);
            (p.trainable, p.total)
        };
        for lora in [&all, &attn] {
            let (trainable, total) = state(lora);
            assert_eq!(trainable, lora.num_parameters(&cfg) as u64);
            assert_eq!(total, 2 * parameters(&cfg) + 18 * trainable);
        }
    }
}
