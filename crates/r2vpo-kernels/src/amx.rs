//! `x · wᵀ` in f32 on Intel AMX, for the learner's and the scoring pass's
//! many-row products ([`linear`]) and the decode steps' 16–32 rows
//! ([`linear_small`]): the C kernels in `amx.c`.
//!
//! Why: AMX multiplies bf16 tiles at ≈ 3.3 TFLOP/s per core on this
//! machine's CPU, ≈ 18 times its f32 FMA rate (the f32 GEMM limit is
//! 350–390 GFLOP/s on 2 cores). Each f32 operand is split into three bf16
//! pieces (`x = x₀ + x₁ + x₂`, exact) and the six piece products down to
//! 2⁻²⁴ of the leading one are summed in f32, so the result is an f32 dot
//! product, not a bf16 one: measured against f64, its error relative to
//! `Σ|xᵢwᵢ|` is 6–8 × 10⁻⁸, where an f32 loop's is 1.1–1.9 × 10⁻⁷
//! (`tests::agrees_with_f64` bounds it at 4 × 10⁻⁷). Even at six products
//! per term it runs ahead of gemm's AVX-512 f32 kernel: SmolLM2's scoring
//! pass in 0.80–0.82× the time (`docs/cpu-speed.md`).
//!
//! Why C: Rust's AMX intrinsics are unstable and no crate multiplies f32 on
//! AMX; gcc's intrinsics are stable, and `build.rs` compiles the file with
//! AMX and AVX-512 enabled per function, so the library still loads on any
//! x86-64 and [`hardware`] asks the CPU and the kernel at run time.
//!
//! Whether it runs is [`crate::dispatch`]' decision (`R2VPO_MATMUL=gemm`,
//! or any choice but `auto` and `amx`, turns it off).

use std::sync::OnceLock;

use crate::{per_thread, Shared};
use rayon::prelude::*;

#[cfg(r2vpo_amx)]
extern "C" {
    fn r2vpo_amx_init() -> i32;
    fn r2vpo_amx_split_rows(
        x: *const f32,
        ldx: usize,
        m: usize,
        k: usize,
        r0: usize,
        r1: usize,
        xp: *mut u16,
        kp: usize,
    );
    #[allow(clippy::too_many_arguments)]
    fn r2vpo_amx_linear_cols(
        xp: *const u16,
        m: usize,
        kp: usize,
        w: *const f32,
        ldw: usize,
        n: usize,
        k: usize,
        c0: usize,
        c1: usize,
        y: *mut f32,
        ldy: usize,
    ) -> i32;
    fn r2vpo_amx_small_split_x(x: *const f32, m: usize, k: usize, xb: *mut u16, kb0: usize, kb1: usize);
    #[allow(clippy::too_many_arguments)]
    fn r2vpo_amx_bf16w_cols(
        xb: *const u16,
        m: usize,
        kp: usize,
        w: *const u16,
        n: usize,
        k: usize,
        c0: usize,
        c1: usize,
        y: *mut f32,
        ldy: usize,
    );
    #[allow(clippy::too_many_arguments)]
    fn r2vpo_amx_small_cols(
        xb: *const u16,
        m: usize,
        kp: usize,
        w: *const f32,
        n: usize,
        k: usize,
        c0: usize,
        c1: usize,
        y: *mut f32,
        ldy: usize,
    );
}

/// Whether this CPU can run AMX here: it has AMX-BF16 (and AVX-512 with
/// AVX512_BF16) and Linux grants the tile state. Asked once.
pub fn hardware() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(r2vpo_amx)]
        {
            // SAFETY: reads CPUID and asks the kernel for the tile state;
            // touches no memory of ours.
            unsafe { r2vpo_amx_init() == 1 }
        }
        #[cfg(not(r2vpo_amx))]
        false
    })
}

/// `y (m, n) = x (m, k) · w (n, k)ᵀ`, all row-major f32, on AMX. Each
/// output element is summed over `k` in the same order whatever `m` is and
/// wherever its row falls, so a row's values do not depend on the rows
/// beside it (the chunked LM head relies on this). Call only where
/// [`hardware`]; errors if the kernel's scratch cannot be allocated.
pub fn linear(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Result<Vec<f32>, String> {
    assert!(hardware(), "amx::linear called without AMX");
    assert!(x.len() >= m * k && w.len() >= n * k, "amx::linear: operands shorter than ({m}, {k}) and ({n}, {k})");
    if m == 0 || n == 0 {
        return Ok(Vec::new());
    }
    let kp = k.div_ceil(32) * 32;
    let blocks = m.div_ceil(32);
    // x's pieces: 3 planes' worth of tiles, every element written by the
    // split (rows past m and k past k as zeros).
    let xp_len = blocks * 32 * kp * 3;
    let mut xp: Vec<u16> = Vec::with_capacity(xp_len);
    let xs = Shared(xp.as_mut_ptr());
    per_thread(blocks).for_each(|(b0, b1)| {
        // SAFETY: rows [32·b0, 32·b1) write tiles of blocks b0..b1 only, inside
        // the capacity; x holds m × k values.
        #[cfg(r2vpo_amx)]
        unsafe {
            r2vpo_amx_split_rows(x.as_ptr(), k, m, k, b0 * 32, b1 * 32, xs.ptr(), kp)
        };
        #[cfg(not(r2vpo_amx))]
        let _ = (b0, b1, xs);
    });
    // SAFETY: the split wrote all blocks · 32 · kp · 3 elements.
    unsafe { xp.set_len(xp_len) };
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    let ys = Shared(y.as_mut_ptr());
    let failed = per_thread(n.div_ceil(32)).any(|(p0, p1)| {
        let (c0, c1) = (p0 * 32, (p1 * 32).min(n));
        // SAFETY: columns [c0, c1) of every row, inside y's capacity; the
        // split input and w outlive the call.
        #[cfg(r2vpo_amx)]
        return unsafe { r2vpo_amx_linear_cols(xp.as_ptr(), m, kp, w.as_ptr(), k, n, k, c0, c1, ys.ptr(), n) } != 0;
        #[cfg(not(r2vpo_amx))]
        {
            let _ = (c0, c1, ys);
            true
        }
    });
    if failed {
        return Err(format!("AMX linear ({m} × {k}) · ({n} × {k})ᵀ: could not allocate its scratch"));
    }
    // SAFETY: every (row, column) was written by one task.
    unsafe { y.set_len(m * n) };
    Ok(y)
}

/// The most rows [`linear_small`] takes: two 16-row B tiles.
pub const SMALL_MAX_ROWS: usize = 32;

/// `outᵢ (m, nᵢ) = x (m, k) · wᵢ (nᵢ, k)ᵀ` for each weight `(wᵢ, nᵢ)`,
/// all row-major f32, for the few rows of a decode step (`m ≤ 32`), on
/// AMX with the same f32 accuracy as [`linear`].
///
/// Why a second kernel: [`linear`] transposes every weight into B tiles,
/// which pays only when many rows reuse them. Here the product is turned
/// around (`yᵀ = w · xᵀ`): the weight's pieces are A tiles, which take
/// its rows as they lie, so each 16 × 32 block is split in registers as it
/// streams past and meets x's pieces at once, and nothing is packed or
/// kept. The f32 small-row kernel (`small_gemm`) spends about as long
/// multiplying as reading a 32-row step's weights; here the multiply runs
/// beside the read on the tile unit (measured in `docs/cpu-speed.md`'s decode
/// table). Each output sums its k blocks in one order whatever `m` is, so
/// a row's values do not depend on the rows beside it. Several weights
/// that read the same input (q, k and v; gate and up) share one parallel
/// pass. Call only where [`hardware`].
pub fn linear_small(x: &[f32], m: usize, k: usize, ws: &[(&[f32], usize)]) -> Vec<Vec<f32>> {
    assert!(hardware(), "amx::linear_small called without AMX");
    assert!(m <= SMALL_MAX_ROWS, "amx::linear_small: {m} rows (at most {SMALL_MAX_ROWS})");
    turned_around(x, m, k, ws, |xb, kp, w: &[f32], n, c0, c1, y| {
        // SAFETY: columns [c0, c1) of every row of an output of m · n
        // values, written by this task only; xb and w outlive the call.
        #[cfg(r2vpo_amx)]
        unsafe {
            r2vpo_amx_small_cols(xb.as_ptr(), m, kp, w.as_ptr(), n, k, c0, c1, y, n)
        };
        #[cfg(not(r2vpo_amx))]
        let _ = (xb, kp, w, n, c0, c1, y);
    })
}

/// `outᵢ (m, nᵢ) = x (m, k) · wᵢ (nᵢ, k)ᵀ` with f32 `x` and bf16 weights
/// (their bits), any number of rows: [`crate::bf16w`]'s products on AMX.
/// Each weight's 16-row blocks are the A tiles as they lie in memory, so
/// nothing of the weight is split, packed or copied; x is split into three
/// exact bf16 pieces as for [`linear_small`], and each term is the three
/// piece products, an f32 product with the bf16 weight (the same error
/// bound as the f32 kernels, tested). Call only where [`hardware`].
pub fn linear_bf16w(x: &[f32], m: usize, k: usize, ws: &[(&[u16], usize)]) -> Vec<Vec<f32>> {
    assert!(hardware(), "amx::linear_bf16w called without AMX");
    turned_around(x, m, k, ws, |xb, kp, w: &[u16], n, c0, c1, y| {
        // SAFETY: as in `linear_small`.
        #[cfg(r2vpo_amx)]
        unsafe {
            r2vpo_amx_bf16w_cols(xb.as_ptr(), m, kp, w.as_ptr(), n, k, c0, c1, y, n)
        };
        #[cfg(not(r2vpo_amx))]
        let _ = (xb, kp, w, n, c0, c1, y);
    })
}

/// The pass [`linear_small`] and [`linear_bf16w`] share: x split once
/// into its pieces (in the B-tile layout), then each thread's range of
/// 32-column blocks handed to `cols(xb, kp, w, n, c0, c1, y)`.
fn turned_around<W: Sync>(
    x: &[f32],
    m: usize,
    k: usize,
    ws: &[(&[W], usize)],
    cols: impl Fn(&[u16], usize, &[W], usize, usize, usize, *mut f32) + Sync,
) -> Vec<Vec<f32>> {
    assert!(x.len() >= m * k && ws.iter().all(|(w, n)| w.len() >= n * k), "amx: slices shorter than their shapes");
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| Vec::with_capacity(m * w.1)).collect();
    if m == 0 || k == 0 {
        // No k blocks: every output is an empty sum.
        for (o, w) in outs.iter_mut().zip(ws) {
            o.resize(m * w.1, 0.0);
        }
        return outs;
    }
    let kp = k.div_ceil(32) * 32;
    let xb_len = (kp / 32) * 3 * m.div_ceil(16) * 512;
    let mut xb: Vec<u16> = Vec::with_capacity(xb_len);
    let xs = Shared(xb.as_mut_ptr());
    let split = |(kb0, kb1): (usize, usize)| {
        // SAFETY: k blocks [kb0, kb1) write their own tiles only, inside the
        // capacity; x holds m × k values.
        #[cfg(r2vpo_amx)]
        unsafe {
            r2vpo_amx_small_split_x(x.as_ptr(), m, k, xs.ptr(), kb0, kb1)
        };
        #[cfg(not(r2vpo_amx))]
        let _ = (kb0, kb1, xs);
    };
    // In parallel by k blocks where there are several: on one thread it took
    // 5.5 % of these products' time in a batch-32 decode (1.7 ms a step,
    // the other thread waiting), on two 1.35 ms.
    if kp / 32 >= 4 && rayon::current_num_threads() > 1 {
        per_thread(kp / 32).for_each(split);
    } else {
        split((0, kp / 32));
    }
    // SAFETY: the splits wrote every tile of every k block, piece and half.
    unsafe { xb.set_len(xb_len) };
    let dst: Vec<Shared<f32>> = outs.iter_mut().map(|o| Shared(o.as_mut_ptr())).collect();
    // Columns in 32-wide blocks, the blocks of all the weights in a row cut
    // into one equal range per thread (a range may run from one weight into
    // the next). Two ranges per thread per weight, as before, left the
    // threads 7–11 % apart on SmolLM2's q/k/v (18 + 6 + 6 blocks) and o and
    // down (18 blocks: 10 against 8), the faster one waiting; equal ranges
    // took batch-32 decode from 608–665 to 643–667 tok/s (alternating), and
    // one per thread instead of two (each call's start and tile stores paid
    // once) from 612–641 to 611–663.
    let tiles: usize = ws.iter().map(|w| w.1.div_ceil(32)).sum();
    let parts = rayon::current_num_threads().max(1).min(tiles).max(1);
    let tasks: Vec<Vec<(usize, usize, usize)>> = (0..parts)
        .map(|p| {
            let (t0, t1) = (p * tiles / parts, (p + 1) * tiles / parts);
            let mut base = 0;
            let mut segs = Vec::new();
            for (wi, w) in ws.iter().enumerate() {
                let nt = w.1.div_ceil(32);
                let (a, b) = (t0.max(base), t1.min(base + nt));
                if a < b {
                    segs.push((wi, (a - base) * 32, ((b - base) * 32).min(w.1)));
                }
                base += nt;
            }
            segs
        })
        .collect();
    let run = |segs: &Vec<(usize, usize, usize)>| {
        for &(wi, c0, c1) in segs {
            let (w, n) = ws[wi];
            cols(&xb, kp, w, n, c0, c1, dst[wi].ptr());
        }
    };
    // Below this much work rayon's hand-off costs more than the split saves
    // (the f32 kernel's rule).
    if tasks.len() == 1 || rayon::current_num_threads() == 1 || m * tiles * 32 * k < 1 << 18 {
        tasks.iter().for_each(run);
    } else {
        tasks.par_iter().for_each(run);
    }
    for (o, w) in outs.iter_mut().zip(ws) {
        // SAFETY: the tasks cover columns 0..n of every output once, and the
        // kernel writes every row of each of its columns.
        unsafe { o.set_len(m * w.1) };
    }
    outs
}

/// Rows up to which [`linear_few`] beats [`linear`]: a short prompt's
/// prefill. `linear` splits and transposes every weight per call, which
/// below a few dozen rows costs more than reading the weights a second
/// time. SmolLM2's layer shapes from memory, 2 threads, ms for the three
/// (`linear` / `linear_few`): 33 rows 3.87 / 3.21, 44 rows 3.94 / 3.46, 64
/// rows 4.16 / 3.13, 96 rows 4.61 / 4.78; the batch-32 benchmark's
/// 44-token prefill (and its first token) 150–180 → 110–130 ms.
pub const FEW_ROWS: usize = 64;

/// `y = x · wᵀ` as [`linear`], for up to [`FEW_ROWS`] rows: [`linear_small`]
/// on each block of [`SMALL_MAX_ROWS`] rows in turn (rows are independent
/// of their neighbours, so the blocks' values are those of one call). Call
/// only where [`hardware`].
pub fn linear_few(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(m * n);
    for r0 in (0..m).step_by(SMALL_MAX_ROWS) {
        let rows = (m - r0).min(SMALL_MAX_ROWS);
        y.extend(linear_small(&x[r0 * k..(r0 + rows) * k], rows, k, &[(w, n)]).concat());
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// True (after saying why) where this machine has no AMX, so there is
    /// nothing to check.
    fn skip_without_amx(why: &str) -> bool {
        if !hardware() {
            eprintln!("{why}");
        }
        !hardware()
    }

    /// xorshift64 draws in [−1, 1), seeded.
    fn uniform(mut s: u64) -> impl FnMut() -> f64 {
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        }
    }

    /// x (m, k) in [−1, 1) and w (n, k) with magnitudes over ±2⁸, so every
    /// piece of the split matters.
    fn operands(rnd: &mut impl FnMut() -> f64, m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
        let x = (0..m * k).map(|_| rnd() as f32).collect();
        let w = (0..n * k).map(|_| (rnd() * (rnd() * 8.0).exp2()) as f32).collect();
        (x, w)
    }

    /// Runs `check(rnd, x, w, (m, n, k))` on [`operands`] of each shape,
    /// drawn from one seeded stream; nothing (after saying `why`) without AMX.
    fn on_shapes(
        why: &str,
        seed: u64,
        shapes: &[(usize, usize, usize)],
        mut check: impl FnMut(&mut dyn FnMut() -> f64, &[f32], &[f32], (usize, usize, usize)),
    ) {
        if skip_without_amx(why) {
            return;
        }
        let mut rnd = uniform(seed);
        for &(m, n, k) in shapes {
            let (x, w) = operands(&mut rnd, m, n, k);
            check(&mut rnd, &x, &w, (m, n, k));
        }
    }

    /// `y (m, n)` within a few f32 roundoffs (6e-8 each) of `x · wᵀ` in
    /// f64, relative to each element's `Σ|xᵢwᵢ|`, whatever k is.
    fn assert_f32_accurate(x: &[f32], w: &[f32], y: &[f32], (m, n, k): (usize, usize, usize)) {
        let worst = worst_error(x, w, y, (m, n, k));
        assert!(worst < 4e-7, "({m}, {n}, {k}): error {worst:.2e} relative to Σ|xw|");
    }

    /// The largest error of `y (m, n)` against `x · wᵀ` in f64, each relative
    /// to its `Σ|xᵢwᵢ|`.
    fn worst_error(x: &[f32], w: &[f32], y: &[f32], (m, n, k): (usize, usize, usize)) -> f64 {
        assert_eq!(y.len(), m * n);
        let mut worst = 0.0f64;
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut mag) = (0.0f64, 0.0f64);
                for q in 0..k {
                    let t = f64::from(x[i * k + q]) * f64::from(w[j * k + q]);
                    exact += t;
                    mag += t.abs();
                }
                worst = worst.max((f64::from(y[i * n + j]) - exact).abs() / mag.max(f64::MIN_POSITIVE));
            }
        }
        worst
    }

    /// `Σ|xᵢwᵢ|`-relative error against f64, for AMX (when this machine
    /// has it) on ragged shapes: edges in every dimension, k below one
    /// block, several row and column blocks.
    #[test]
    fn agrees_with_f64() {
        let shapes = [(33, 17, 1), (40, 33, 31), (100, 70, 100), (333, 1000, 100), (70, 48, 576), (64, 40, 1537)];
        on_shapes(
            "no AMX here: nothing to check (ops::linear runs gemm)",
            0x9E37_79B9_7F4A_7C15,
            &shapes,
            |_, x, w, (m, n, k)| {
                assert_f32_accurate(x, w, &linear(x, m, k, w, n).unwrap(), (m, n, k));
            },
        );
    }

    /// The few-row kernel against f64, as [`agrees_with_f64`]: one and two
    /// 16-row halves, ragged n and k, weights over ±2⁸ so every piece
    /// matters, and two weights in one call (each output written whole).
    #[test]
    fn small_agrees_with_f64() {
        let shapes = [(1, 17, 1), (5, 33, 31), (16, 64, 576), (17, 70, 100), (32, 40, 1537), (32, 1000, 64)];
        let why = "no AMX here: nothing to check (small_gemm runs its f32 kernel)";
        on_shapes(why, 0x2545_F491_4F6C_DD1D, &shapes, |rnd, x, w, (m, n, k)| {
            let n2 = n / 3 + 1;
            let w2: Vec<f32> = (0..n2 * k).map(|_| rnd() as f32).collect();
            let ys = linear_small(x, m, k, &[(w, n), (&w2, n2)]);
            assert_f32_accurate(x, w, &ys[0], (m, n, k));
            assert_f32_accurate(x, &w2, &ys[1], (m, n2, k));
        });
    }

    /// A prefill's 33–64 rows as 32-row blocks of the few-row kernel: f32
    /// accuracy, and the second block's rows the bits of that block alone.
    #[test]
    fn few_is_the_small_kernel_a_block_at_a_time() {
        let shapes = [(33, 40, 100), (44, 70, 576), (64, 33, 31)];
        on_shapes("no AMX here: nothing to check", 0x1234_5678_9ABC_DEF1, &shapes, |_, x, w, (m, n, k)| {
            let y = linear_few(x, m, k, w, n);
            assert_f32_accurate(x, w, &y, (m, n, k));
            let tail = linear_small(&x[32 * k..], m - 32, k, &[(w, n)]).remove(0);
            assert_eq!(y[32 * n..], tail[..], "({m}, {n}, {k})");
        });
    }

    /// Runs `product(x, rows, w)` on all `m` rows of a fixed x and on
    /// row ranges of it: each range's rows are the same bits as in the whole.
    fn assert_rows_independent(
        m: usize,
        n: usize,
        k: usize,
        ranges: &[(usize, usize)],
        product: impl Fn(&[f32], usize, &[f32]) -> Vec<f32>,
    ) {
        if skip_without_amx("no AMX here: nothing to check") {
            return;
        }
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 104_729 % 997) as f32 - 498.0) / 997.0).collect();
        let all = product(&x, m, &w);
        for &(r0, r1) in ranges {
            let part = product(&x[r0 * k..r1 * k], r1 - r0, &w);
            assert_eq!(part, all[r0 * n..r1 * n], "rows {r0}..{r1}");
        }
    }

    /// The few-row kernel's rows are the same bits whichever rows surround
    /// them, in one 16-row half or two.
    #[test]
    fn small_rows_do_not_depend_on_their_neighbours() {
        let (n, k) = (50, 300);
        assert_rows_independent(32, n, k, &[(0, 1), (5, 21), (16, 32), (31, 32)], |x, m, w| {
            linear_small(x, m, k, &[(w, n)]).remove(0)
        });
    }

    /// A row's values are the same bits whichever rows surround it.
    #[test]
    fn rows_do_not_depend_on_their_neighbours() {
        let (n, k) = (50, 300);
        assert_rows_independent(100, n, k, &[(0, 1), (5, 38), (37, 100), (64, 96)], |x, m, w| {
            linear(x, m, k, w, n).unwrap()
        });
    }
}
