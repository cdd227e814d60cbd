//! LoRA through the real binary: `llm train` with `[model.lora]` on a
//! Hugging Face base exports a PEFT adapter folder, `llm merge` folds it
//! into the base, and the merged model computes what the base with the
//! adapter computes; bad settings and bad adapters are refused by name.

use std::path::PathBuf;
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use r2vpo_llm::backend::candle::{load_model, Transformer};
use r2vpo_llm::model::lora;

mod common;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(common::root());
    c
}

fn logprobs(m: &Transformer) -> Vec<f32> {
    let ids: Vec<u32> = (0..2 * 9).map(|i| (i * 7919 + 11) % 4000).collect();
    let ids = Tensor::from_vec(ids, (2, 9), &Device::Cpu).unwrap();
    let mask = Tensor::ones((2, 9), DType::U8, &Device::Cpu).unwrap();
    let targets = Tensor::cat(&[ids.narrow(1, 1, 8).unwrap(), ids.narrow(1, 8, 1).unwrap()], 1).unwrap();
    m.score_logprobs(&ids, &mask, &targets).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn lora_train_exports_peft_and_merge_folds_it_into_the_base() {
    let tmp = tempfile::tempdir().unwrap();
    let base = common::tiny_dir(&tmp.path().join("base"), 5);
    let text = format!(
        "iterations = 2\nprompts_per_iter = 2\ngroup_size = 4\nrollout_batch = 8\nminibatch_size = 4\n\
         micro_batch_size = 2\ncheckpoint_every = 1\nentropy_coef = 0.05\n[model]\npath = \"{}\"\n\
         [model.lora]\nrank = 4\nalpha = 8\ntargets = [\"q_proj\", \"v_proj\", \"down_proj\"]\n\
         [optim]\nlr = 0.02\n[data]\ncount = 40\n[sampling]\nmax_new_tokens = 6\n",
        base.display()
    );
    let cfg = tmp.path().join("lora.toml");
    std::fs::write(&cfg, text).unwrap();

    // A bad value is refused naming its key, before anything is written.
    let st = bin()
        .args(["llm", "train", "--quiet", "--config"])
        .arg(&cfg)
        .args(["--set", "model.lora.rank=0", "--out"])
        .arg(tmp.path().join("bad"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && err.contains("model.lora.rank"), "{err}");

    let out = tmp.path().join("run");
    let st = bin().args(["llm", "train", "--quiet", "--config"]).arg(&cfg).arg("--out").arg(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&st.stdout);
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert!(stdout.contains("adapter (PEFT folder"), "{stdout}");
    let adapter = out.join("model");
    for f in [lora::ADAPTER_CONFIG, lora::ADAPTER_WEIGHTS, "tokenizer.json"] {
        assert!(adapter.join(f).is_file(), "{f} missing");
    }

    // The base is named by the adapter's base_model_name_or_path.
    let merged = tmp.path().join("merged");
    let st = bin().args(["llm", "merge", "--adapter"]).arg(&adapter).arg("--out").arg(&merged).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert!(merged.join("tokenizer.json").is_file());
    let m = load_model(&merged, DType::F32, &Device::Cpu).unwrap();
    let (read, files) = lora::open_peft(&adapter).unwrap();
    let adapted = load_model(&base, DType::F32, &Device::Cpu).unwrap().with_adapters(&read, &files).unwrap();
    let plain = load_model(&base, DType::F32, &Device::Cpu).unwrap();
    let (got, want, before) = (logprobs(&m), logprobs(&adapted), logprobs(&plain));
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 2e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    // A random model earns no verifier reward; the entropy bonus alone
    // gives the two steps a gradient.
    assert_ne!(want, before, "two learning steps moved the adapted model");

    // An adapter of another model is refused naming the tensor; nothing
    // is written.
    let other = common::tiny_dir(&tmp.path().join("other"), 6);
    let cfg_path = other.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    c["intermediate_size"] = serde_json::json!(48);
    std::fs::write(&cfg_path, c.to_string()).unwrap();
    let m = Transformer::new_random(
        r2vpo_llm::model::ModelConfig::from_file(&cfg_path).unwrap(),
        1,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    r2vpo_llm::backend::Policy::save_hf(&m, &other).unwrap();
    let bad_out: PathBuf = tmp.path().join("bad-merge");
    let st = bin()
        .args(["llm", "merge", "--base"])
        .arg(&other)
        .arg("--adapter")
        .arg(&adapter)
        .arg("--out")
        .arg(&bad_out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && err.contains("down_proj.lora_A.weight"), "{err}");
    assert!(!bad_out.exists());
}
