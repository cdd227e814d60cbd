//! Pins short seeded `control train` runs bit for bit, so refactors of the
//! update path (the learner contract, the update schedule, the split of the
//! trainer) are proven to change nothing, on every machine that runs
//! `make test`; and checks the networks' fast products against that pinned
//! arithmetic.
//!
//! Why the pin runs on the reference product (`R2VPO_MATMUL=reference`,
//! `r2vpo_kernels::product`): the networks' products otherwise run on the
//! `gemm` crate, whose sums follow its SIMD width (AVX-512, AVX2, …) and
//! the blocking it derives from the cache sizes it reads, so a golden file
//! per SIMD level held only on the CPUs that recorded it. The reference
//! product sums each output in `k` order, unfused, on one thread; the rest
//! of the trainer (MuJoCo, the Gaussian head, the core's objective) has no
//! CPU-dependent sums, so one golden,
//! `golden/pin/control-train-reference.json`, holds on every x86-64 CPU
//! with FMA (glibc's libm takes its FMA variants on all of them) and any
//! thread count. The fast path is checked against it within a stated
//! tolerance (`the_fast_products_agree_with_the_reference`). Re-record with
//! `R2VPO_BLESS=1` only when the trainer's arithmetic is meant to change.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use r2vpo_control::native::{kernel_path, NativeNet};
use r2vpo_control::policy::{Activation, ActorCritic, PolicyConfig};
use r2vpo_control::trainer::{algo_overrides, TrainConfig, Trainer};
use r2vpo_kernels::Matmul;

/// The tests here switch the process's kernel choice: one at a time.
static KERNEL_CHOICE: Mutex<()> = Mutex::new(());

/// [`r2vpo_report::golden::report`] into this build's test folder.
fn report(line: &str) {
    r2vpo_report::golden::report(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), line);
}

fn config(algo: &str) -> TrainConfig {
    let mut cfg = TrainConfig {
        task: "cartpole-swingup".into(),
        total_env_steps: 4 * 16 * 4,
        num_envs: 4,
        unroll: 16,
        batch_size: 4,
        minibatches: 3,
        epochs: 2,
        eval_every: 0,
        eval_episodes: 0,
        ..TrainConfig::default()
    };
    algo_overrides(algo).unwrap(); // refuses replay algorithms
    r2vpo::algo::find(algo).unwrap().objective.apply(&mut cfg.objective);
    cfg
}

/// Every update's metrics (timings removed) of the three pinned runs.
fn runs() -> serde_json::Map<String, serde_json::Value> {
    let mut all = serde_json::Map::new();
    for (name, algo, adaptive) in [("ppo", "ppo", false), ("r2vpo", "r2vpo", false), ("r2vpo-adaptive", "r2vpo", true)]
    {
        let mut cfg = config(algo);
        if adaptive {
            cfg.dual.mode = r2vpo::dual::DualMode::Adaptive;
            cfg.dual.eta = 5.0;
        }
        let mut t = Trainer::new(cfg).unwrap();
        let ms: Vec<_> =
            t.run(None, None, &AtomicBool::new(false), |_| {}).unwrap().iter().map(|m| m.without_timing()).collect();
        all.insert(name.into(), serde_json::to_value(&ms).unwrap());
    }
    all
}

#[test]
fn seeded_runs_are_unchanged_bit_for_bit() {
    let _one = KERNEL_CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    r2vpo_kernels::set_matmul(Matmul::Reference);
    let got = serde_json::to_string_pretty(&runs()).unwrap() + "\n";
    r2vpo_kernels::set_matmul(Matmul::Auto);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/pin/control-train-reference.json");
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let what = "3 seeded runs on the reference product";
    r2vpo_report::golden::assert_pinned(tmp, &path, &got, what, r2vpo_kernels::reference_bits_caveat());
}

/// Means, values and every gradient of one minibatch under the current
/// kernel choice.
fn pass(net: &NativeNet, obs: &[f32], actions: &[f32], rows: usize) -> Vec<(String, Vec<f32>)> {
    let f = net.forward(obs, rows);
    let dlogp: Vec<f32> = (0..rows).map(|i| (i as f32 * 0.61).sin()).collect();
    let dvalue: Vec<f32> = (0..rows).map(|i| (i as f32 * 0.29).cos()).collect();
    let mut grads = net.zero_grads();
    net.backward(&f, actions, &dlogp, &dvalue, 0.01, &mut grads);
    let mut out = vec![("mean".to_string(), f.mean.clone()), ("value".to_string(), f.value.clone())];
    out.extend(grads.into_iter().enumerate().map(|(i, g)| (format!("gradient {i}"), g)));
    out
}

/// The fast path's sums differ from the reference's only in order: an f32
/// sum of `k` products in any order is within `γₖ ≈ k·2⁻²⁴` of exact
/// relative to `Σ|aᵢbᵢ|` (Higham, §3.1), so two orders differ by at most
/// `2γ₂₅₆ ≈ 3e-5` of that per product (typically `√k·2⁻²⁴ ≈ 1e-6`). Five
/// layers and their backward compound a few such errors; the bound is ten
/// times the single-product worst case (measured: ≤ 5.2e-6 on an AMD EPYC),
/// where a wrong index or stride gives order 1.
const BOUND: f64 = 3e-4;

#[test]
fn the_fast_products_agree_with_the_reference() {
    let _one = KERNEL_CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    // The paper's networks (256 × 5, SiLU) and CleanRL's (2 × 64, tanh).
    for (hidden, activation) in [(vec![256; 5], Activation::Silu), (vec![64, 64], Activation::Tanh)] {
        let cfg = PolicyConfig {
            actor_hidden: hidden.clone(),
            critic_hidden: hidden.clone(),
            activation,
            ..PolicyConfig::default()
        };
        let (d, a, rows) = (17, 6, 128);
        let net = NativeNet::from_net(&ActorCritic::new(&cfg, d, a, 3).unwrap()).unwrap();
        let obs: Vec<f32> = (0..rows * d).map(|i| (i as f32 * 0.173).sin() * 2.0).collect();
        let actions: Vec<f32> = (0..rows * a).map(|i| (i as f32 * 0.311).cos() * 0.8).collect();
        r2vpo_kernels::set_matmul(Matmul::Reference);
        let want = pass(&net, &obs, &actions, rows);
        // Every kernel `native::kernel` can choose on this CPU, not only
        // the one `auto` picks here.
        let mut choices = vec![Matmul::Gemm];
        if r2vpo_kernels::avx2::runs() {
            choices.push(Matmul::Avx2);
        } else {
            report("kernels: avx2 skipped (this CPU lacks AVX2 and FMA, or the build has no AVX2 kernel)");
        }
        for choice in choices {
            r2vpo_kernels::set_matmul(choice);
            let got = pass(&net, &obs, &actions, rows);
            let path = kernel_path();
            let mut worst = (0f64, String::new());
            for ((n, g), (_, w)) in got.iter().zip(&want) {
                let e = r2vpo_kernels::distance(g, w);
                assert!(e <= BOUND, "{path}, {} × {:?}: {n} {e:e} from the reference", hidden.len(), hidden[0]);
                if e >= worst.0 {
                    worst = (e, n.clone());
                }
            }
            report(&format!(
                "kernels: {path} against the reference on {} × {} {activation:?}: ≤ {:.1e} ({}), bound {BOUND:e}",
                hidden.len(),
                hidden[0],
                worst.0,
                worst.1
            ));
        }
        r2vpo_kernels::set_matmul(Matmul::Auto);
    }
    // The pinned runs on the fast path, to the end and finite.
    for (name, ms) in runs() {
        for m in ms.as_array().unwrap() {
            for key in ["approx_kl", "ratio_var"] {
                let x = m.get(key).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
                assert!(x.is_finite(), "{}: {name} {key} = {x}", kernel_path());
            }
        }
    }
}
