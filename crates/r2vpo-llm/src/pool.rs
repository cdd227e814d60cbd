//! Running passes on rayon's pool, where the CPU kernels (candle's, ours,
//! gemm's) run: [`on_pool`] for the learner's passes, [`on_pool_awake`] for
//! decoding; and the per-thread switch of the candle backend's ops to
//! their composites ([`with_composites`]), which a pass carries to the
//! pool thread it runs on.

thread_local! {
    static COMPOSITES_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the fused CPU kernels off on this thread, so the CPU
/// computes with exactly the composites a CUDA device runs: the GPU path's
/// math checked against the fused path without a GPU (`r2vpo bench step
/// --composite --check`, `tests/model_ops.rs`).
pub fn with_composites<R>(f: impl FnOnce() -> R) -> R {
    let before = COMPOSITES_ONLY.with(|c| c.replace(true));
    let out = f();
    COMPOSITES_ONLY.with(|c| c.set(before));
    out
}

/// Whether [`with_composites`] is in force on this thread (so
/// [`on_pool`] can carry it to the pool thread it runs on).
pub fn composites_only() -> bool {
    COMPOSITES_ONLY.with(|c| c.get())
}

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
    if composites_only() {
        rayon::scope(|_| with_composites(f))
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
