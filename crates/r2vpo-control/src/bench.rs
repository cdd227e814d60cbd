//! Throughput measurements of the control stack (`r2vpo bench control`):
//! the raw physics rate, the learner's products on one minibatch, and the
//! fastest f32 product this build has, to read the learner's share of it
//! from one run.

use std::time::Instant;

use r2vpo_kernels::Matmul;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{TrainError, TrainResult};
use crate::native::NativeNet;
use crate::{VecEnv, VecEnvConfig};

fn pool(threads: usize) -> TrainResult<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| TrainError::Config {
        field: "threads".into(),
        message: format!("cannot start {threads} threads: {e}"),
    })
}

/// The kernels the control networks can run on this CPU other than the
/// reference (whose sums are sequential and single-threaded): gemm, and
/// the AVX2 kernel where it runs. The bench measures each in the same run.
pub fn fast_kernels() -> Vec<Matmul> {
    let mut ks = vec![Matmul::Gemm];
    if r2vpo_kernels::avx2::runs() {
        ks.push(Matmul::Avx2);
    }
    ks
}

/// Env steps per second of `envs` environments under uniform random
/// actions, on a pool of `threads` threads.
pub fn raw_rate(task: &str, envs: usize, threads: usize, seconds: f64) -> TrainResult<f64> {
    pool(threads)?.install(|| -> TrainResult<f64> {
        let mut env = VecEnv::new(VecEnvConfig::new(task, envs, 0))?;
        env.reset()?;
        let a = env.action_dim();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        // Pre-drawn actions, so the timing is the environments alone.
        let actions: Vec<Vec<f64>> =
            (0..64).map(|_| (0..envs * a).map(|_| rng.random_range(-1.0..=1.0)).collect()).collect();
        for act in actions.iter().take(8) {
            env.step(act)?;
        }
        let t0 = Instant::now();
        let mut steps = 0u64;
        while t0.elapsed().as_secs_f64() < seconds {
            for act in &actions {
                env.step(act)?;
            }
            steps += (actions.len() * envs) as u64;
        }
        Ok(steps as f64 / t0.elapsed().as_secs_f64())
    })
}

/// The learner's products on one minibatch: the fastest of `reps` timed
/// forward + backward passes after a warm-up, as GFLOP/s.
pub fn learner_rate(
    net: &NativeNet,
    (d, a): (usize, usize),
    rows: usize,
    reps: usize,
    threads: usize,
) -> TrainResult<f64> {
    let pool = pool(threads)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let obs: Vec<f32> = (0..rows * d).map(|_| rng.random_range(-1.0..1.0)).collect();
    let actions: Vec<f32> = (0..rows * a).map(|_| rng.random_range(-1.0..1.0)).collect();
    let ones = vec![1f32 / rows as f32; rows];
    pool.install(|| {
        let pass = || {
            let t0 = Instant::now();
            let f = net.forward(&obs, rows);
            let mut grads = net.zero_grads();
            net.backward(&f, &actions, &ones, &ones, 0.0, &mut grads);
            std::hint::black_box(&grads);
            t0.elapsed().as_secs_f64()
        };
        // Small networks' passes take microseconds: time at least 0.3 s of
        // them so the best is not one lucky or unlucky pass.
        let warm = pass();
        let reps = reps.max((0.3 / warm.max(1e-9)) as usize).min(10_000);
        let best = (0..reps).map(|_| pass()).fold(f64::INFINITY, f64::min);
        Ok(net.learn_flops(rows) / best / 1e9)
    })
}

/// The fastest f32 product this binary has, on all threads: the best of
/// gemm (`Parallelism::Rayon`) and, where it runs, the AVX2 kernel of the
/// LLM learner, on a 2048³ product (best of 3). The share of it that the
/// control learner reaches says how far its products are from this
/// project's best kernel; the machine's own peak (PyTorch's GEMM,
/// `make bench-hf`) is higher.
pub fn best_product_rate() -> (f64, &'static str) {
    let n = 2048;
    let flops = 2.0 * (n * n * n) as f64;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let x: Vec<f32> = (0..n * n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let w: Vec<f32> = (0..n * n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let time = |f: &dyn Fn()| {
        (0..3)
            .map(|_| {
                let t0 = Instant::now();
                f();
                t0.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let gemm_s = time(&|| {
        let mut out = vec![0f32; n * n];
        // SAFETY: all three buffers are n×n row-major and distinct.
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                out.as_mut_ptr(),
                1,
                n as isize,
                false,
                x.as_ptr(),
                1,
                n as isize,
                w.as_ptr(),
                1,
                n as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(rayon::current_num_threads()),
            );
        }
        std::hint::black_box(&out);
    });
    let mut best = (flops / gemm_s / 1e9, "gemm");
    if r2vpo_kernels::avx2::runs() {
        let avx2_s = time(&|| {
            std::hint::black_box(r2vpo_kernels::avx2::linear(&x, n, n, &w, n).ok());
        });
        if flops / avx2_s / 1e9 > best.0 {
            best = (flops / avx2_s / 1e9, "avx2");
        }
    }
    best
}
