//! Token-id parity of the GGUF-built SmolLM2 tokenizer with Hugging Face
//! transformers' own GGUF tokenizer converter, on tricky strings (golden
//! file from `scripts/tokenizer_golden.py`; no Python needed here).

use std::path::PathBuf;

use r2vpo_llm::tokenizer::Tokenizer;
use serde_json::Value;

#[test]
fn smollm2_ids_match_transformers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tok = Tokenizer::from_gguf(&root.join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        .unwrap_or_else(|e| panic!("{e} (run `make deps`)"));
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("golden/tokenizer_smollm2.json")).unwrap()).unwrap();
    assert_eq!(g["eos_token_id"].as_u64(), Some(u64::from(tok.eos_token_id())));
    assert_eq!(g["pad_token_id"].as_u64(), Some(u64::from(tok.pad_token_id())));
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 15);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = c["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got, want, "ids of {text:?}");
        assert_eq!(tok.decode(&got, false).unwrap(), c["decoded"].as_str().unwrap(), "decoding {text:?}");
    }
}
