//! Generation with the embedded default model (SmolLM2-135M-Instruct GGUF)
//! through the tokenizer and chat template built from the same file.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device};
use r2vpo_llm::backend::candle::load_model;
use r2vpo_llm::chat::{ChatMessage, ChatTemplate};
use r2vpo_llm::sample::{bench_generate, generate, generate_chat, FinishReason, GenerationRequest, SamplingConfig};
use r2vpo_llm::tokenizer::Tokenizer;

fn gguf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

#[test]
fn greedy_paris_and_chat_answer() {
    let t0 = Instant::now();
    let model = load_model(&gguf(), DType::F32, &Device::Cpu).unwrap_or_else(|e| panic!("{e} (run `make deps`)"));
    let tok = Tokenizer::from_gguf(&gguf()).unwrap();
    let cfg = SamplingConfig { max_new_tokens: 3, ..SamplingConfig::greedy() };
    let ids = tok.encode("The capital of France is", true).unwrap();
    let g = generate(&model, &tok, &GenerationRequest::batch(&[ids], 0), &cfg).unwrap();
    assert!(g[0].text.starts_with(" Paris"), "{:?}", g[0].text);
    assert_eq!(g[0].finish_reason, FinishReason::Length);

    // A chat prompt ends on <|im_end|> (EOS), which is not in the text.
    let chat = ChatTemplate::from_tokenizer(&tok).unwrap();
    let p = tok.encode(&chat.prompt("What is the capital of France?", None).unwrap(), false).unwrap();
    let cfg = SamplingConfig { max_new_tokens: 24, ..SamplingConfig::greedy() };
    let g = generate(&model, &tok, &GenerationRequest::batch(&[p], 0), &cfg).unwrap();
    eprintln!("{:?} {:?} in {:.1} s", g[0].text, g[0].finish_reason, t0.elapsed().as_secs_f64());
    assert!(g[0].text.contains("Paris"), "{:?}", g[0].text);
    assert_eq!(g[0].finish_reason, FinishReason::Eos);
    assert_eq!(*g[0].token_ids.last().unwrap(), tok.eos_token_id());
    assert!(!g[0].text.contains("<|im_end|>"));
}

#[test]
fn generate_chat_batches_conversations() {
    let model = load_model(&gguf(), DType::F32, &Device::Cpu).unwrap_or_else(|e| panic!("{e} (run `make deps`)"));
    let tok = Tokenizer::from_gguf(&gguf()).unwrap();
    let convs = vec![
        vec![ChatMessage::user("What is the capital of France?")],
        vec![ChatMessage::system("Answer in one word."), ChatMessage::user("What color is the sky on a clear day?")],
    ];
    let cfg = SamplingConfig { max_new_tokens: 24, ..SamplingConfig::greedy() };
    let g = generate_chat(&model, &tok, &convs, None, &cfg).unwrap();
    // Same answer as the row decoded alone: padding does not leak.
    let alone = generate_chat(&model, &tok, &convs[..1], None, &cfg).unwrap();
    assert_eq!(g[0].token_ids, alone[0].token_ids);
    assert!(g[0].text.contains("Paris"), "{:?}", g[0].text);
    eprintln!("{:?}", g.iter().map(|g| &g.text).collect::<Vec<_>>());
    assert_ne!(g[0].prompt_len, g[1].prompt_len);
}

/// Throughput of the embedded model at batch 1/8/32 (slow: run with
/// `--ignored --nocapture` and `RAYON_NUM_THREADS` set to the core count).
#[test]
#[ignore]
fn bench_generate_embedded() {
    let model = load_model(&gguf(), DType::F32, &Device::Cpu).unwrap_or_else(|e| panic!("{e} (run `make deps`)"));
    let tok = Tokenizer::from_gguf(&gguf()).unwrap();
    let chat = ChatTemplate::from_tokenizer(&tok).unwrap();
    let p = tok.encode(&chat.prompt("What is 12 + 7? Explain step by step.", None).unwrap(), false).unwrap();
    for r in bench_generate(&model, &p, &[1, 8, 32], 64, &SamplingConfig::default()).unwrap() {
        eprintln!(
            "batch {:>2}: {} prompt + {} new tokens/row, {:.2} s, {:.1} tok/s",
            r.batch, r.prompt_tokens, r.new_tokens, r.seconds, r.tokens_per_s
        );
        assert!(r.tokens_per_s > 0.0);
    }
}
