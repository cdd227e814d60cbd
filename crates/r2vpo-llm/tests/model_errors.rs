//! Bad input is an error naming the file and the field or tensor.

use std::path::Path;

use candle_core::{DType, Device};
use r2vpo_llm::backend::candle::load_gguf;
use r2vpo_llm::backend::candle::load_hf_dir;
use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::model::{Architecture, ModelConfig, ModelError, RopeScaling};

fn saved(dir: &Path) {
    let cfg = ModelConfig::tiny(Architecture::Qwen2, 20, 16, 24, 1, 2, 1, false);
    let m = Transformer::new_random(cfg, 1, DType::F32, &Device::Cpu).unwrap();
    r2vpo_llm::backend::Policy::save_hf(&m, dir).unwrap();
}

fn err_text(r: Result<Transformer, ModelError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

#[test]
fn missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let e = err_text(load_hf_dir(dir.path(), DType::F32, &Device::Cpu));
    assert!(e.contains("config.json"), "{e}");
    saved(dir.path());
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let e = err_text(load_hf_dir(dir.path(), DType::F32, &Device::Cpu));
    assert!(e.contains("model.safetensors"), "{e}");
    let e = err_text(load_gguf(&dir.path().join("nope.gguf"), DType::F32, &Device::Cpu));
    assert!(e.contains("nope.gguf"), "{e}");
}

#[test]
fn unknown_architecture_and_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    saved(dir.path());
    let load = || err_text(load_hf_dir(dir.path(), DType::F32, &Device::Cpu));
    edit_config(dir.path(), |v| {
        v["model_type"] = "gpt2".into();
        v["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
    });
    let e = load();
    assert!(e.contains("config.json") && e.contains("model_type") && e.contains("gpt2"), "{e}");
    edit_config(dir.path(), |v| {
        v["model_type"] = "qwen2".into();
        v["num_key_value_heads"] = 3.into();
    });
    let e = load();
    assert!(e.contains("num_key_value_heads"), "{e}");
    edit_config(dir.path(), |v| {
        v["num_key_value_heads"] = 1.into();
        v.as_object_mut().unwrap().remove("hidden_size");
    });
    let e = load();
    assert!(e.contains("hidden_size") && e.contains("config.json"), "{e}");
    edit_config(dir.path(), |v| {
        v["hidden_size"] = 16.into();
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    });
    let e = load();
    assert!(e.contains("rope_scaling.rope_type") && e.contains("yarn"), "{e}");
}

#[test]
fn wrong_shape_missing_tensor_and_corrupt_header() {
    let dir = tempfile::tempdir().unwrap();
    saved(dir.path());
    // Wrong shape: the config claims a wider MLP than the weights have.
    edit_config(dir.path(), |v| v["intermediate_size"] = 32.into());
    let e = err_text(load_hf_dir(dir.path(), DType::F32, &Device::Cpu));
    assert!(e.contains("model.safetensors") && e.contains("mlp.gate_proj.weight") && e.contains("shape"), "{e}");
    // Missing tensor: one more layer than stored.
    edit_config(dir.path(), |v| {
        v["intermediate_size"] = 24.into();
        v["num_hidden_layers"] = 2.into();
    });
    let e = err_text(load_hf_dir(dir.path(), DType::F32, &Device::Cpu));
    assert!(e.contains("model.layers.1.") && e.contains("missing"), "{e}");
    // Corrupt header.
    edit_config(dir.path(), |v| v["num_hidden_layers"] = 1.into());
    let st = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    bytes[8..16].copy_from_slice(b"garbage!");
    std::fs::write(&st, &bytes).unwrap();
    let e = err_text(load_hf_dir(dir.path(), DType::F32, &Device::Cpu));
    assert!(e.contains("model.safetensors") && e.contains("safetensors"), "{e}");
    // A GGUF path that is not GGUF.
    let e = err_text(load_gguf(&st, DType::F32, &Device::Cpu));
    assert!(e.contains("model.safetensors") && e.contains("GGUF"), "{e}");
}

#[test]
fn sharded_index_naming_a_missing_shard() {
    let dir = tempfile::tempdir().unwrap();
    saved(dir.path());
    std::fs::rename(dir.path().join("model.safetensors"), dir.path().join("part-1.safetensors")).unwrap();
    let idx = serde_json::json!({"weight_map": {"model.embed_tokens.weight": "part-1.safetensors", "lm_head.weight": "part-2.safetensors"}});
    std::fs::write(dir.path().join("model.safetensors.index.json"), idx.to_string()).unwrap();
    let e = err_text(load_hf_dir(dir.path(), DType::F32, &Device::Cpu));
    assert!(e.contains("part-2.safetensors"), "{e}");
}

#[test]
fn rope_scaling_forms() {
    let mut c = ModelConfig::tiny(Architecture::Llama, 10, 16, 16, 1, 2, 2, true);
    c.rope_scaling = Some(serde_json::json!({"type": "linear", "factor": 2.0}));
    assert_eq!(c.rope_scaling().unwrap(), Some(RopeScaling::Linear { factor: 2.0 }));
    let base = ModelConfig::tiny(Architecture::Llama, 10, 16, 16, 1, 2, 2, true).inv_freq();
    assert!((c.inv_freq()[1] - base[1] / 2.0).abs() < 1e-15);
    // transformers ≥ 5 form carries rope_theta inside rope_parameters.
    let text = r#"{"model_type":"llama","hidden_size":16,"intermediate_size":16,"num_hidden_layers":1,
        "num_attention_heads":2,"rms_norm_eps":1e-5,"vocab_size":10,
        "rope_parameters":{"rope_type":"default","rope_theta":500000.0}}"#;
    let c = ModelConfig::from_json_str(text, Path::new("config.json")).unwrap();
    assert_eq!(c.rope_theta(), 500000.0);
    assert_eq!(c.rope_scaling().unwrap(), None);
    // Unknown fields survive a round trip.
    let with_extra = text.replace("\"vocab_size\":10", "\"vocab_size\":10,\"bos_token_id\":7");
    let c = ModelConfig::from_json_str(&with_extra, Path::new("config.json")).unwrap();
    let again = ModelConfig::from_json_str(&c.to_json_string(), Path::new("config.json")).unwrap();
    assert_eq!(again.extra.get("bos_token_id"), Some(&serde_json::json!(7)));
}
