//! Parity with Hugging Face `transformers`: tiny random Llama / Qwen2 / Qwen3
//! folders and their reference logits (float64, each row run alone, so the
//! left-padded batch here also checks padding), from `scripts/llm_golden.py`.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use r2vpo_llm::backend::candle::load_hf_dir;
use serde_json::Value;

fn golden_dir(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden").join(arch)
}

fn matrix_u32(v: &Value) -> Vec<Vec<u32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .collect()
}

fn check(arch: &str) {
    check_dtype(arch, DType::F32, 1e-4);
    check_dtype(arch, DType::F64, 2e-6);
}

fn check_dtype(arch: &str, dtype: DType, tol: f64) {
    let dir = golden_dir(arch);
    let g: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let ids = matrix_u32(&g["input_ids"]);
    let mask = matrix_u32(&g["attention_mask"]);
    let (b, t) = (ids.len(), ids[0].len());
    let model = load_hf_dir(&dir, dtype, &Device::Cpu).unwrap();
    let ids_t = Tensor::new(ids.clone(), &Device::Cpu).unwrap();
    let mask_t = Tensor::new(mask.clone(), &Device::Cpu).unwrap();
    let logits: Vec<Vec<Vec<f64>>> =
        model.forward_logits(&ids_t, &mask_t).unwrap().to_dtype(DType::F64).unwrap().to_vec3().unwrap();
    let mut worst = 0f64;
    let mut compared = 0;
    for bi in 0..b {
        for ti in 0..t {
            // Padding query positions are arbitrary in both implementations.
            if mask[bi][ti] == 0 {
                continue;
            }
            let refs = g["logits"][bi][ti].as_array().unwrap();
            for (x, r) in logits[bi][ti].iter().zip(refs) {
                worst = worst.max((x - r.as_f64().unwrap()).abs());
                compared += 1;
            }
        }
    }
    eprintln!("{arch} {dtype:?}: max |Δlogit| = {worst:.2e} over {compared} logits");
    assert!(compared > 0);
    assert!(worst < tol, "{arch} {dtype:?}: logits differ from transformers by {worst}");
}

#[test]
fn llama_matches_transformers() {
    check("llama");
}

#[test]
fn qwen2_matches_transformers() {
    check("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check("qwen3");
}
