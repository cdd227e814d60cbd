//! Timings on the 135M GGUF model (ignored: tens of seconds). Run with
//! `RAYON_NUM_THREADS=2 cargo test -p r2vpo-llm --test model_perf -- --ignored --nocapture`.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use r2vpo_llm::backend::candle::load_gguf;
use r2vpo_llm::backend::candle::KvCache;

fn path() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    p.is_file().then_some(p)
}

#[test]
#[ignore = "timing on the 135M model, ~1 min"]
fn smollm2_timings() {
    let Some(p) = path() else { return };
    let m = load_gguf(&p, DType::F32, &Device::Cpu).unwrap();
    let d = Device::Cpu;
    for b in [1usize, 8] {
        let prompt = 38;
        let ids = Tensor::new(
            (0..b).map(|r| (0..prompt).map(|i| (100 + 7 * i + r) as u32).collect()).collect::<Vec<Vec<u32>>>(),
            &d,
        )
        .unwrap();
        let mut cache = KvCache::new(&m, b);
        let t0 = Instant::now();
        let mut out = m.forward_step(&ids, &Tensor::ones((b, prompt), DType::U32, &d).unwrap(), &mut cache).unwrap();
        let prefill = t0.elapsed().as_secs_f64();
        let steps = 32;
        let t1 = Instant::now();
        for _ in 0..steps {
            let next = out.argmax(1).unwrap().unsqueeze(1).unwrap();
            out = m.forward_step(&next, &Tensor::ones((b, 1), DType::U32, &d).unwrap(), &mut cache).unwrap();
        }
        let dt = t1.elapsed().as_secs_f64();
        eprintln!(
            "decode batch {b}: prefill {prefill:.2}s, {:.1} tok/s ({:.1} ms/step)",
            (b * steps) as f64 / dt,
            1e3 * dt / steps as f64
        );
    }
    let (b, t) = (4usize, 128usize);
    let ids = Tensor::new(
        (0..b).map(|r| (0..t).map(|i| ((31 * i + 7 * r) % 40000) as u32).collect()).collect::<Vec<Vec<u32>>>(),
        &d,
    )
    .unwrap();
    let mask = Tensor::ones((b, t), DType::U32, &d).unwrap();
    for rep in 0..2 {
        let t0 = Instant::now();
        let lp = m.forward_logprobs(&ids, &mask, &ids).unwrap();
        let loss = lp.mean_all().unwrap();
        let fwd = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let g = loss.backward().unwrap();
        let bwd = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let _ = m.score_logprobs(&ids, &mask, &ids).unwrap();
        eprintln!(
            "train B={b} T={t} rep {rep}: fwd {fwd:.2}s bwd {bwd:.2}s ({} grads), score {:.2}s",
            m.named_vars().iter().filter(|(_, v)| g.get(v.as_tensor()).is_some()).count(),
            t2.elapsed().as_secs_f64()
        );
    }
}
