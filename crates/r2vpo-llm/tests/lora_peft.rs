//! LoRA against Hugging Face PEFT (pinned, in `.deps/venv-peft`; `make
//! test-peft` sets it up and runs this): an adapter r2vpo writes is loaded
//! by PEFT on the same base and gives the same log-probs, and an adapter
//! PEFT made (rsLoRA, a subset of projections, both factors random) is
//! loaded by r2vpo and gives PEFT's log-probs. Ignored in `make test`:
//! the venv is ~5.6 GB of torch with its CUDA libraries.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use r2vpo_llm::backend::candle::{load_model, Transformer};
use r2vpo_llm::backend::Policy;
use r2vpo_llm::model::lora::{self, LoraConfig, LoraTarget};
use r2vpo_llm::model::source::NamedTensors;
use r2vpo_llm::model::{Architecture, ModelConfig};

mod common;

const IDS: [[u32; 8]; 2] = [[3, 17, 42, 9, 61, 5, 28, 33], [50, 2, 2, 19, 44, 7, 63, 12]];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn peft(args: &[&str]) -> Vec<Vec<f32>> {
    let py = root().join(".deps/venv-peft/bin/python");
    assert!(py.exists(), "{} missing: run `make test-peft`", py.display());
    let out = tempfile::NamedTempFile::new().unwrap();
    let ids =
        IDS.iter().map(|r| r.iter().map(u32::to_string).collect::<Vec<_>>().join(",")).collect::<Vec<_>>().join(";");
    let mut full: Vec<String> = args[..3].iter().map(|s| s.to_string()).collect();
    full.push(ids);
    full.push(out.path().display().to_string());
    full.extend(args[3..].iter().map(|s| s.to_string()));
    let st = Command::new(py).arg(root().join("scripts/peft/peft_logits.py")).args(&full).output().unwrap();
    assert!(st.status.success(), "peft: {}", String::from_utf8_lossy(&st.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.path()).unwrap()).unwrap();
    serde_json::from_value(v["logprobs"].clone()).unwrap()
}

/// r2vpo's log-probs of each row's next tokens, as the peer writes them.
fn ours(m: &Transformer) -> Vec<Vec<f32>> {
    let ids = Tensor::new(&IDS, &Device::Cpu).unwrap();
    let mask = Tensor::ones((2, 8), DType::U8, &Device::Cpu).unwrap();
    let targets = Tensor::cat(&[ids.narrow(1, 1, 7).unwrap(), ids.narrow(1, 7, 1).unwrap()], 1).unwrap();
    let lp = m.score_logprobs(&ids, &mask, &targets).unwrap().to_vec2::<f32>().unwrap();
    lp.into_iter().map(|r| r[..7].to_vec()).collect()
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    let mut worst = 0f32;
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        worst = worst.max((g - w).abs());
    }
    // f32 on both sides, different summation orders.
    assert!(worst <= 2e-4, "{what}: max |Δ log p| {worst}\n ours {got:?}\n peft {want:?}");
}

fn base(dir: &Path, arch: Architecture, tied: bool) -> PathBuf {
    let cfg = ModelConfig::tiny(arch, 64, 32, 48, 2, 4, 2, tied);
    let m = Transformer::new_random_with_std(cfg, 21, 0.3, DType::F32, &Device::Cpu).unwrap();
    m.save_hf(dir).unwrap();
    dir.to_path_buf()
}

#[test]
#[ignore = "needs .deps/venv-peft (make test-peft)"]
fn r2vpo_adapters_load_in_peft_with_the_same_log_probs() {
    for (arch, tied, rslora) in [(Architecture::Llama, true, false), (Architecture::Qwen2, false, true)] {
        let tmp = tempfile::tempdir().unwrap();
        let b = base(&tmp.path().join("base"), arch, tied);
        let lora = LoraConfig { rank: 4, alpha: 16.0, targets: LoraTarget::ALL.to_vec(), rslora, seed: 3 };
        let cfg = load_model(&b, DType::F32, &Device::Cpu).unwrap().config().clone();
        // B random too, so every factor reaches the output.
        let tensors = common::adapters_with_b(&cfg, &lora, 0.3);
        let m = load_model(&b, DType::F32, &Device::Cpu)
            .unwrap()
            .with_adapters(&lora, &NamedTensors::new("adapter", tensors.clone()))
            .unwrap();
        let adapter = tmp.path().join("adapter");
        lora::save_peft(&adapter, &lora, Some(&b.display().to_string()), &tensors).unwrap();
        let want = peft(&["apply", &b.display().to_string(), &adapter.display().to_string()]);
        let plain = ours(&load_model(&b, DType::F32, &Device::Cpu).unwrap());
        let got = ours(&m);
        assert!(got != plain, "the adapter changes the model");
        assert_close(&got, &want, &format!("{arch:?}: r2vpo's adapter in PEFT"));
    }
}

#[test]
#[ignore = "needs .deps/venv-peft (make test-peft)"]
fn peft_adapters_load_in_r2vpo_with_the_same_log_probs() {
    for (arch, tied, targets, rslora) in [
        (Architecture::Llama, true, "q_proj,v_proj,down_proj", "1"),
        (Architecture::Qwen3, false, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "0"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let b = base(&tmp.path().join("base"), arch, tied);
        let adapter = tmp.path().join("adapter");
        let want = peft(&[
            "create",
            &b.display().to_string(),
            &adapter.display().to_string(),
            "8",
            "12",
            targets,
            rslora,
            "5",
        ]);
        let (read, files) = lora::open_peft(&adapter).unwrap();
        assert_eq!((read.rank, read.alpha, read.rslora), (8, 12.0, rslora == "1"));
        let m = load_model(&b, DType::F32, &Device::Cpu).unwrap().with_adapters(&read, &files).unwrap();
        assert_close(&ours(&m), &want, &format!("{arch:?}: PEFT's adapter in r2vpo"));
        // Merged by `llm merge`'s path, the same model.
        let merged = tmp.path().join("merged");
        lora::merge_to_hf(&b, &adapter, &merged).unwrap();
        assert_close(&ours(&load_model(&merged, DType::F32, &Device::Cpu).unwrap()), &want, "merged");
    }
}
