//! Where the candle backend computes: rayon's pool for its CPU kernels
//! ([`on_pool`], [`on_pool_awake`]) and its devices ([`open_device`]).

use super::ops;
use crate::model::cuda_ordinal;

/// Runs `f` on a thread of rayon's pool (from outside the pool,
/// `rayon::scope` moves it there; inside, it runs in place). A forward or
/// backward pass issues hundreds of small parallel kernels (our ops, candle's
/// and gemm's, all on rayon); called from outside the pool, each one parks
/// the calling thread on a lock and wakes it again. Inside, the caller works
/// on its share instead. Measured on 2 threads: decode at batch 1 33 → 38.5
/// tok/s, the SmolLM2 training step 15.2 → 13.0 s, its scoring pass 3.6 →
/// 3.1 s. Wrap a whole pass (or a decode step), not each kernel.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    // `with_composites` is per thread: carry it to the pool thread.
    if ops::composites_only() {
        rayon::scope(|_| ops::with_composites(f))
    } else {
        rayon::scope(|_| f())
    }
}

/// [`on_pool`] for decoding, with the pool's other threads kept awake
/// while `f` runs: they spin, taking work as it appears
/// (`rayon::yield_now`), instead of falling asleep between kernels.
/// Between two of a decode step's ≈ 150 small parallel kernels the caller
/// works alone for longer than rayon spins before sleeping, so each kernel
/// paid a futex wake-up and a reschedule (≈ 8 % of decode time at batch
/// 32, perf). Measured on 2 threads, alternating: decode at batch 1 / 8 /
/// 32 35.3–42.1 → 41.2–44.3, 223–243 → 251–261, 549–582 → 585–626
/// tokens/s, on a 2-core Intel Xeon with AMX
/// (`results/bench/kernel-ab/decode-amx-few-row-awake-threads-2026-11-26/`).
/// The learner's passes keep [`on_pool`]: their kernels are long, and the
/// training step took 7.5–8.9 s with the spinning against 7.5–8.1 without.
/// It costs a core's spinning while the caller is alone, so it assumes one
/// thread per core (rayon's default); `R2VPO_POOL_SPIN=0` turns it off
/// ([`keep_awake`]). Called from inside the pool it is [`on_pool`].
pub fn on_pool_awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() || !keep_awake() {
        return on_pool(f);
    }
    on_pool(|| {
        let done = std::sync::atomic::AtomicBool::new(false);
        rayon::scope(|s| {
            // Spawned before `f` pushes any job, so a thief takes these
            // first (rayon steals the oldest): the caller never finds one
            // of them in its own queue while it waits, which would spin it
            // forever.
            for _ in 1..rayon::current_num_threads() {
                s.spawn(|_| {
                    while !done.load(std::sync::atomic::Ordering::Acquire) {
                        if rayon::yield_now() != Some(rayon::Yield::Executed) {
                            std::hint::spin_loop();
                        }
                    }
                });
            }
            // Set however `f` ends (a panic included), or the scope would
            // wait on the spinning threads forever.
            struct Done<'a>(&'a std::sync::atomic::AtomicBool);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(true, std::sync::atomic::Ordering::Release);
                }
            }
            let _done = Done(&done);
            f()
        })
    })
}

/// Whether [`on_pool_awake`] keeps the pool's other threads spinning:
/// unless `R2VPO_POOL_SPIN=0`. Asked once.
pub fn keep_awake() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !std::env::var("R2VPO_POOL_SPIN").is_ok_and(|v| v == "0"))
}

/// Opens the device `name` names ([`cuda_ordinal`]). CUDA needs a binary
/// built with the `cuda` feature (`make build-gpu`) and a GPU; the error
/// says which is missing.
///
/// A GPU is opened once per process, on one CUDA stream that every thread
/// shares; opening it again returns the same device. (candle's own
/// `Device::new_cuda` gives each host thread its own stream, and nothing
/// orders one thread's kernels after another's: the trainer's gradients on
/// a GPU were read before they were written.)
pub fn open_device(name: &str) -> std::result::Result<candle_core::Device, String> {
    let Some(ordinal) = cuda_ordinal(name)? else { return Ok(candle_core::Device::Cpu) };
    if !cfg!(feature = "cuda") {
        return Err(format!("`{name}`: this binary was built without CUDA; build one with `make build-gpu`"));
    }
    static OPEN: std::sync::Mutex<Vec<(usize, candle_core::Device)>> = std::sync::Mutex::new(Vec::new());
    let mut open = OPEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, d)) = open.iter().find(|(o, _)| *o == ordinal) {
        return Ok(d.clone());
    }
    let dev = open_cuda(ordinal).map_err(|e| format!("`{name}`: {e}"))?;
    open.push((ordinal, dev.clone()));
    Ok(dev)
}

/// GPU `ordinal` on one explicit CUDA stream.
///
/// candle's `Device::new_cuda` launches on the *per-thread* default stream,
/// a different stream for every host thread, with nothing ordering one
/// thread's kernels after another's. Our passes run on rayon's pool
/// ([`on_pool`]) while the caller packs inputs, reads losses and adds
/// gradients on its own thread, and the engine's decode steps land on
/// whichever pool thread is free: on a GPU that read gradients before they
/// were written and reused memory another stream was still using. The
/// trainer's gradient norms on an H200 came out 1e2–1e13 times the CPU's
/// (`results/gpu/2026-11-26-nvidia-h200-run2/grad-norms.txt`) while `bench step --check`, which
/// ran on one thread, matched. One stream orders every launch by the host
/// order of the calls, whichever thread makes them.
#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> candle_core::Result<candle_core::Device> {
    let dev = candle_core::Device::new_cuda_with_stream(ordinal)?;
    // SAFETY: cudarc records an event on every buffer's every use once a
    // context has a stream of its own, to order uses across streams. This
    // device's work all goes to its one stream (kernels, copies, cuBLAS and
    // cuRAND are bound to it), and `open_device` opens each GPU once, so
    // stream order already orders every use and the events are pure cost.
    unsafe { dev.as_cuda_device()?.cuda_stream().context().disable_event_tracking() };
    Ok(dev)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> candle_core::Result<candle_core::Device> {
    unreachable!("open_device refuses CUDA in a binary built without it")
}
