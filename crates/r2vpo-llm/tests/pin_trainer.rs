//! Pins short seeded `llm train` runs bit for bit, so refactors of the update
//! path (the learner contract, the update schedule) are proven to change
//! nothing, on every machine that runs `make test`; and checks every
//! product kernel this CPU can run against that pinned arithmetic.
//!
//! Why one pin on the reference kernels rather than one per kernel path:
//! the fast kernels sum in orders that depend on the CPU (AMX tiles,
//! r2vpo's AVX2 kernel, OpenBLAS's kernel family for the CPU, the `gemm`
//! crate's SIMD width and the blocking it derives from the cache sizes it
//! reads), and a training run is chaotic: one ulp in a log-prob flips a
//! sampled token a few iterations later, so two paths' runs share nothing
//! after the first update (the golden files once recorded per path agreed
//! to 1e-6 in iteration 0 and not at all in iteration 3). A golden per
//! path can therefore hold only on the CPUs that recorded it, and a user's
//! CPU whose dispatch lands elsewhere failed `make test`. Under
//! `R2VPO_MATMUL=reference` every product is `r2vpo_kernels::product` (one
//! unfused sum per output in `k` order), the decode attention is its
//! portable loop, and everything else in the trainer was already written
//! without SIMD-width-dependent sums (16 fixed lanes, no FMA contraction),
//! so the run's bits depend on IEEE 754 and libm alone: one golden,
//! `golden/pin/llm-train-reference.json`, for every x86-64 CPU with FMA
//! (glibc ≥ 2.28 takes its FMA variants of `exp`, `log`, `sin`, … on all of
//! them, whatever the SIMD width) and any thread count.
//!
//! The machine's fast paths are then checked where they can be: each
//! kernel choice this CPU runs ([`r2vpo_kernels::dispatch::runnable`])
//! must give the reference's log-probs and gradients on one left-padded
//! micro-batch within a stated tolerance, and run the pinned trainer
//! configuration to the end with finite metrics. So a kernel that breaks
//! on some CPU fails here, on that CPU, and a change of the trainer's own
//! arithmetic fails the pin on every CPU.
//!
//! Re-record with `R2VPO_BLESS=1 cargo test -p r2vpo-llm --test
//! pin_trainer` only when the trainer's arithmetic is meant to change (say
//! why in the commit), never to make a refactor pass.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};
use r2vpo_kernels::dispatch as kernels;
use r2vpo_kernels::Matmul;
use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::model::{Architecture, ModelConfig};
use r2vpo_llm::train::{IterMetrics, Outcome, TrainConfig, Trainer};

mod common;

use common::train::EvenTokens;

/// The tests here switch the process's kernel choice: one at a time.
static KERNEL_CHOICE: Mutex<()> = Mutex::new(());

/// [`r2vpo_report::golden::report`] into this build's test folder.
fn report(line: &str) {
    r2vpo_report::golden::report(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), line);
}

fn config(algo: &str) -> TrainConfig {
    let mut c = TrainConfig {
        checkpoint_every: 0,
        histogram_every: 0,
        eval_at_start: false,
        eval_at_end: false,
        ..common::train::tiny(4)
    };
    c.replay.minibatch_size = 8;
    c.replay.capacity_iters = 2;
    let mut c = common::train::with_algo(c, algo);
    // A λ that moves fast enough to matter within four iterations.
    c.dual.eta = 5.0;
    c
}

/// Every iteration's metrics (timings zeroed) of a seeded run of `algo`.
fn run(algo: &str) -> Vec<IterMetrics> {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Trainer::with_reward(config(algo), dir.path(), Box::new(EvenTokens)).unwrap();
    assert_eq!(t.run(&AtomicBool::new(false), &mut |_| {}).unwrap(), Outcome::Finished);
    let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    text.lines().map(|l| IterMetrics { timing: Default::default(), ..serde_json::from_str(l).unwrap() }).collect()
}

#[test]
fn seeded_runs_are_unchanged_bit_for_bit() {
    let _one = KERNEL_CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    r2vpo_kernels::set_matmul(Matmul::Reference);
    let mut all = serde_json::Map::new();
    for algo in ["grpo", "r2vpo-on", "r2vpo-off", "grpo-off", "grpo-kl"] {
        all.insert(algo.into(), serde_json::to_value(run(algo)).unwrap());
    }
    let got = serde_json::to_string_pretty(&all).unwrap() + "\n";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/pin/llm-train-reference.json");
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let what = "5 seeded runs on the reference kernels";
    r2vpo_report::golden::assert_pinned(tmp, &path, &got, what, r2vpo_kernels::reference_bits_caveat());
}

/// Log-probs and every gradient of one left-padded micro-batch through a
/// Qwen3-shaped model large enough that every product takes the many-row
/// kernels (144 rows; the head 512 wide, the layers 256 and 512, head size
/// 64), under the current kernel choice.
fn step_values(m: &Transformer) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let (b, w, r) = (6, 24, 10);
    let ids: Vec<u32> = (0..b * w).map(|i| ((i * 193 + 11) % 512) as u32).collect();
    let ids = Tensor::from_vec(ids, (b, w), &Device::Cpu).unwrap();
    let mask: Vec<u32> = (0..b * w).map(|i| u32::from(i % w >= [0, 5, 2, 0, 9, 1][i / w])).collect();
    let att = Tensor::from_vec(mask, (b, w), &Device::Cpu).unwrap();
    let coef = Tensor::from_vec((0..b * r).map(|i| (i as f32 * 0.37).sin()).collect(), (b, r), &Device::Cpu).unwrap();
    let lp = m.tail_logprobs(&ids, &att, r).unwrap();
    let g = (&lp * &coef).unwrap().sum_all().unwrap().backward().unwrap();
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let grads = m.named_vars().into_iter().map(|(n, v)| (n, flat(g.get(v.as_tensor()).unwrap()))).collect();
    (flat(&lp), grads)
}

/// The kernels differ from the reference only in the order (and, on AMX,
/// the split) of each dot product's sums. An f32 sum of `k` products in any
/// order is within `γₖ = k·u/(1 − k·u)` (`u = 2⁻²⁴`) of exact, relative
/// to `Σ|aᵢbᵢ|` (Higham, Accuracy and Stability, §3.1); here `k ≤ 512`, so
/// two orders differ by at most `2γ₅₁₂ ≈ 6e-5` of that per product, and
/// typically by `√k·u ≈ 1e-6`. Two layers and the head compound a few such
/// errors, and the gradients pass through the softmax and RMSNorm
/// backward, which can amplify them by the layers' gains. The bounds
/// below sit at the worst-case single-product figure's order for the
/// log-probs and ten times it for the gradients: far above rounding
/// (measured on an AMD EPYC, Zen 3, on its four paths: log-probs 5.0e-7,
/// gradients ≤ 4.5e-6), far below what a wrong index or stride gives
/// (order 1).
const LOGPROB_BOUND: f64 = 1e-4;
/// See [`LOGPROB_BOUND`].
const GRAD_BOUND: f64 = 1e-3;

#[test]
fn every_kernel_this_cpu_runs_agrees_with_the_reference() {
    let _one = KERNEL_CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = ModelConfig::tiny(Architecture::Qwen3, 512, 256, 512, 2, 4, 2, true);
    let m = Transformer::new_random_with_std(cfg, 11, 0.3, DType::F32, &Device::Cpu).unwrap();
    r2vpo_kernels::set_matmul(Matmul::Reference);
    let (lp_ref, grads_ref) = step_values(&m);
    let runnable = kernels::runnable();
    for choice in Matmul::ALL {
        if choice == Matmul::Reference {
            continue;
        }
        if !runnable.contains(&choice) {
            report(&format!("kernels: {choice:<9} skipped: {}", kernels::unsupported(choice).unwrap_or_default()));
            continue;
        }
        r2vpo_kernels::set_matmul(choice);
        let path = kernels::path();
        let (lp, grads) = step_values(&m);
        let lp_err = r2vpo_kernels::distance(&lp, &lp_ref);
        assert!(lp_err <= LOGPROB_BOUND, "{choice} ({path}): log-probs {lp_err:e} from the reference");
        let mut worst = (0f64, String::new());
        for ((n, g), (_, gr)) in grads.iter().zip(&grads_ref) {
            let e = r2vpo_kernels::distance(g, gr);
            assert!(e <= GRAD_BOUND, "{choice} ({path}): gradient of {n} {e:e} from the reference");
            if e >= worst.0 {
                worst = (e, n.clone());
            }
        }
        // The pinned trainer's configuration on this path, to the end.
        let ms = run("r2vpo-on");
        assert_eq!(ms.len(), 4, "{choice} ({path}): iterations");
        for it in &ms {
            let v = serde_json::to_value(it).unwrap();
            for key in ["loss", "grad_norm", "ratio_var", "lambda", "entropy"] {
                let x = v[key].as_f64().unwrap_or(f64::NAN);
                assert!(x.is_finite(), "{choice} ({path}): iteration {} {key} = {x}", it.iter);
            }
        }
        report(&format!(
            "kernels: {choice:<9} ({path}): log-probs {lp_err:.1e}, gradients ≤ {:.1e} ({}) from the reference \
             (bounds {LOGPROB_BOUND:e}, {GRAD_BOUND:e}); the pinned r2vpo-on run finished, finite",
            worst.0, worst.1
        ));
    }
    r2vpo_kernels::set_matmul(Matmul::Auto);
}
