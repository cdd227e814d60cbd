//! The GGUF-built tokenizer of the embedded default model (SmolLM2-135M):
//! exact round trips on tricky strings, special tokens as single ids, and
//! the id sequences the measured prototype recorded.

use std::path::PathBuf;

use r2vpo_llm::tokenizer::{PaddedBatch, Tokenizer};

fn gguf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn tok() -> Tokenizer {
    Tokenizer::from_gguf(&gguf()).unwrap_or_else(|e| panic!("{e} (run `make deps`)"))
}

const TRICKY: &[&str] = &[
    "",
    "The capital of France is Paris.",
    "12345 + 678 = 13023; 3.14159, -0.5e-10, 1,000,000",
    "  leading spaces,\ttabs\t\tand\n\n\nnewline runs   \n  ",
    "naïve café — Ünïcödé, 中文字符, 日本語, emoji 🤖🎉👍🏽, Ω≈ç√∫",
    "fn main() { println!(\"{}\", x[0] >> 2); } // code\r\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "\\boxed{\\frac{1}{2}} and $x^2 + y^2 = z^2$",
    "<think>\nreasoning\n</think>\n\nAnswer: 4",
];

#[test]
fn round_trips_exactly() {
    let t = tok();
    for s in TRICKY {
        let ids = t.encode(s, true).unwrap();
        let back = t.decode(&ids, false).unwrap();
        assert_eq!(&back, s, "ids {ids:?}");
    }
}

#[test]
fn special_tokens_are_single_ids() {
    let t = tok();
    assert_eq!(t.encode("<|im_start|>", false).unwrap(), vec![1]);
    assert_eq!(t.encode("<|im_end|>", false).unwrap(), vec![2]);
    assert_eq!(t.encode("<|endoftext|>", false).unwrap(), vec![0]);
    // Measured in the prototype (shared/notes/candle-llm-training.md §3).
    assert_eq!(t.encode("<|im_start|>assistant\n", false).unwrap(), vec![1, 520, 9531, 198]);
    // Skipping special tokens drops the markup only.
    let ids = t.encode("<|im_start|>assistant\nhi<|im_end|>", false).unwrap();
    assert_eq!(t.decode(&ids, true).unwrap(), "assistant\nhi");
}

#[test]
fn digits_split_one_per_token() {
    let t = tok();
    let ids = t.encode(" 12", false).unwrap();
    let toks: Vec<String> = ids.iter().map(|&i| t.id_to_token(i).unwrap()).collect();
    assert_eq!(toks, ["Ġ", "1", "2"]);
}

#[test]
fn special_ids_and_template_from_metadata() {
    let t = tok();
    assert_eq!(t.eos_token_id(), 2);
    assert_eq!(t.pad_token_id(), 2);
    assert_eq!(t.bos_token_id(), Some(1));
    assert_eq!(t.eos_token(), "<|im_end|>");
    assert_eq!(t.stop_token_ids(), &[2]);
    assert_eq!(t.vocab_size(), 49152);
    assert!(t.chat_template().unwrap().contains("<|im_start|>"));
    // add_bos_token is false for SmolLM2: no BOS is prepended.
    assert_eq!(t.encode("hi", true).unwrap(), t.encode("hi", false).unwrap());
}

#[test]
fn batch_is_left_padded() {
    let t = tok();
    let b = t.encode_batch(&["Hello world, how are you?", "Hi"], false).unwrap();
    assert_eq!(b.batch(), 2);
    let w = b.width();
    assert_eq!(b.lengths[0], w);
    let short = b.lengths[1];
    assert!(short < w);
    assert_eq!(&b.ids[1][..w - short], vec![2; w - short].as_slice());
    assert_eq!(b.mask[1], [vec![0u8; w - short], vec![1u8; short]].concat());
    assert_eq!(&b.ids[1][w - short..], t.encode("Hi", false).unwrap().as_slice());
    let (ids, mask) = b.to_tensors(&candle_core::Device::Cpu).unwrap();
    assert_eq!(ids.dims(), [2, w]);
    assert_eq!(mask.dims(), [2, w]);
    assert_eq!(PaddedBatch::left_pad(&[], 0).width(), 0);
}

#[test]
fn errors_name_the_file() {
    let e = Tokenizer::from_gguf(std::path::Path::new("/nonexistent/x.gguf")).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/x.gguf"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let e = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
}

#[test]
fn hugging_face_folder_loads_special_tokens_template_and_stops() {
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    t.inner().save(dir.path().join("tokenizer.json"), false).unwrap();
    // Special tokens in both spellings transformers writes (string and
    // AddedToken object); the template as a named list.
    let cfg = serde_json::json!({
        "eos_token": {"content": "<|im_end|>", "special": true},
        "bos_token": "<|im_start|>",
        "pad_token": null,
        "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ messages[0].content }}"}]
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    std::fs::write(dir.path().join("generation_config.json"), r#"{"eos_token_id": [2, 0]}"#).unwrap();
    let h = Tokenizer::load(dir.path()).unwrap();
    assert_eq!((h.eos_token_id(), h.pad_token_id(), h.bos_token_id()), (2, 2, Some(1)));
    assert_eq!(h.stop_token_ids(), &[0, 2]);
    assert_eq!(h.chat_template(), Some("{{ messages[0].content }}"));
    for s in TRICKY {
        assert_eq!(h.encode(s, false).unwrap(), t.encode(s, false).unwrap(), "{s:?}");
    }
    // A token the vocabulary lacks is reported with the file and field.
    std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"eos_token": "<nope>"}"#).unwrap();
    let e = Tokenizer::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer_config.json") && e.contains("eos_token") && e.contains("<nope>"), "{e}");
    std::fs::write(dir.path().join("tokenizer_config.json"), "{not json").unwrap();
    let e = Tokenizer::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer_config.json"), "{e}");
}
