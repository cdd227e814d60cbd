//! Timings run on demand (`--ignored`), not tests.

use candle_core::{Device, Tensor};

/// Not a test: milliseconds per decode step of [`super::attention_no_grad`]
/// over SmolLM2's 30 layers at batch 32 (3 kv heads of 3 queries, D 64,
/// caches of 172 columns, each layer's its own so they come from memory
/// as in a step), at the key counts a 44-token prompt + 128-token decode
/// passes through (`cargo test --release -p r2vpo-llm --lib
/// ops::timing -- --ignored --nocapture`; `HOT=1`: one layer's cache,
/// which stays in L3).
#[test]
#[ignore]
fn smollm2_decode_attention() {
    let (b, hk, g, d, cap) = (32, 3, 3, 64, 172);
    let layers = if std::env::var("HOT").is_ok() { 1 } else { 30 };
    let dev = Device::Cpu;
    let rand = || Tensor::rand(-1f32, 1.0, (b, hk, cap, d), &dev).unwrap();
    let caches: Vec<(Tensor, Tensor)> = (0..layers).map(|_| (rand(), rand())).collect();
    let q = Tensor::rand(-0.1f32, 0.1, (b, hk, g, d), &dev).unwrap();
    for tk in [44, 76, 108, 140, 172] {
        let mask = Tensor::zeros((b, 1, 1, 1, tk), candle_core::DType::F32, &dev).unwrap();
        let reps = 600 / layers;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            for (k, v) in &caches {
                let (k, v) = (k.narrow(2, 0, tk).unwrap(), v.narrow(2, 0, tk).unwrap());
                std::hint::black_box(super::attention_no_grad(&q, &k, &v, &mask, 1, &[]).unwrap());
            }
        }
        let s = t.elapsed().as_secs_f64() / (reps * layers) as f64 * 30.0;
        let bytes = (30 * b * hk * tk * d * 4 * 2) as f64;
        println!("tk {tk:3}: {:.2} ms per step, {:.1} GB/s of keys and values", s * 1e3, bytes / s / 1e9);
    }
}

/// Not a test: GFLOP/s of the learner's products on the CPU kernel that
/// runs them here (gemm, or AMX's where the CPU has it for the forward),
/// at SmolLM2's shapes for 8 × 300 tokens: forward `x · wᵀ`, the
/// input gradient `g · w` and the weight gradient `gᵀ · x`
/// (`cargo test --release -p r2vpo-llm --lib ops::timing::learner_products
/// -- --ignored --nocapture`; `scripts/hf/products.py` times PyTorch's).
#[test]
#[ignore]
fn learner_products() {
    let dev = Device::Cpu;
    let rows = 2400;
    let mut all = (0.0, 0.0);
    for (k, n) in [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)] {
        let m = if n == 49152 { 2048 } else { rows };
        let x = Tensor::rand(-1f32, 1.0, (m, k), &dev).unwrap();
        let w = Tensor::rand(-1f32, 1.0, (n, k), &dev).unwrap();
        let g = Tensor::rand(-1f32, 1.0, (m, n), &dev).unwrap();
        let flop = 2.0 * (m * n * k) as f64;
        let mut line = format!("{m}x{k}x{n}:");
        for (name, f) in [
            ("fwd", &(|| super::linear(&x, &w).map(|_| ())) as &dyn Fn() -> candle_core::Result<()>),
            ("dx", &|| super::matmul(&g, &w).map(|_| ())),
            ("dw", &|| super::matmul(&g.t()?, &x).map(|_| ())),
        ] {
            f().unwrap();
            let reps = 3;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                f().unwrap();
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            all = (all.0 + flop, all.1 + s);
            line += &format!("  {name} {:6.1} GFLOP/s ({:5.1} ms)", flop / s / 1e9, s * 1e3);
        }
        println!("{line}");
    }
    println!("all: {:.1} GFLOP/s", all.0 / all.1 / 1e9);
}
