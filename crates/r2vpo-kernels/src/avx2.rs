//! f32 products on AVX2 + FMA: the forward's many-row `x · wᵀ` (the
//! learner's passes, the scoring pass, prefills) and the backward's layer
//! gradients `g · w` and `gᵀ · x`, on CPUs with AVX2 but neither AVX-512
//! nor AMX: the C kernel in `avx2.c`.
//!
//! Why: there the forward ran on gemm's AVX2 kernels at 85–100 GFLOP/s on
//! SmolLM2's learner shapes (2 threads, a 2-core AMD EPYC whose FMA peak is
//! 172–182), and OpenBLAS, which ran the backward at 100–150
//! ([`crate::openblas`]), cannot take the forward: a row's values there
//! depend on the rows beside it, and the chunked LM head and the served
//! log-probs need them not to. This kernel (GotoBLAS's blocking around
//! BLIS's 6 × 16 register tile, the inner loop in assembly) sums each
//! output as one FMA chain over `k` in order, so its rows and columns are
//! independent of their neighbours and of the thread split (tested). It
//! ran level with OpenBLAS at first (137.7–148.3 against 136.3–137.5
//! GFLOP/s over the five forward shapes,
//! `results/bench/kernel-ab/avx2-forward-kernel-vs-openblas-2026-11-26/`);
//! reading y in place and prefetching x only made it faster again, the
//! forward's products taking 0.93–0.96× their time and the scoring pass
//! 0.88–0.99× (`results/bench/kernel-ab/avx2-kernel-y-in-place-2026-11-27/`).
//!
//! The backward's products came here too once each call was timed inside
//! a training step
//! (`results/bench/kernel-ab/avx2-backward-vs-openblas-2026-11-27/`): there,
//! where the operands come from memory rather than a harness's warm caches, OpenBLAS
//! ran the layers' gradients at 102–127 GFLOP/s and this kernel, packing
//! the transposed operands along their rows, at 107–140. The LM head's
//! gradients stay on OpenBLAS ([`WHOLE_A_MAX`]).
//!
//! On AVX-512 CPUs it is unmeasured (gemm's AVX-512 kernels run there) and
//! on AMX ones [`crate::amx`] runs the forward; `R2VPO_MATMUL=avx2` runs it
//! on any CPU with AVX2 and FMA ([`crate::dispatch`]'s table).
//! The control networks (`r2vpo_control::native`) run their products here
//! too where this kernel runs.

use rayon::prelude::*;

use crate::{per_thread, Shared};

#[cfg(r2vpo_avx2_c)]
extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn r2vpo_avx2_pack_a(a: *const f32, lda: usize, at: i32, m: usize, k: usize, r0: usize, r1: usize, ap: *mut f32);
    #[allow(clippy::too_many_arguments)]
    fn r2vpo_avx2_cols(
        ap: *const f32,
        a: *const f32,
        lda: usize,
        m: usize,
        k: usize,
        b: *const f32,
        ldb: usize,
        bt: i32,
        n: usize,
        c0: usize,
        c1: usize,
        y: *mut f32,
        ldy: usize,
        acc: i32,
    ) -> i32;
    #[allow(clippy::too_many_arguments)]
    fn r2vpo_avx2_product_here(
        a: *const f32,
        lda: usize,
        at: i32,
        b: *const f32,
        ldb: usize,
        bt: i32,
        m: usize,
        k: usize,
        n: usize,
        y: *mut f32,
        ldy: usize,
        acc: i32,
    ) -> i32;
}

/// Rows per packed panel of x (the register tile's height in `avx2.c`).
const MR: usize = 6;
/// Columns per register tile; each thread's column range is a multiple.
const NR: usize = 16;

/// Most output columns for which [`product`] reads a row-major `a` in
/// place rather than packing it first: every layer's product, not the LM
/// head's. Packing x was 3.3 % of a scoring pass (perf). Read in place
/// (the same bits), the row-major products at a step's shapes took 0.986×
/// the time in a harness and the scoring pass 0.94–1.03× (median 0.975, 5
/// pairs); training steps stayed level within their noise (0.98–1.02, 4
/// pairs). The LM head's product (49 152 columns, which sweep x once per
/// 288 of them) took 1.04× in place, so it is still packed
/// (`results/bench/kernel-ab/avx2-kernel-x-in-place-2026-11-27/`).
pub const IN_PLACE_MAX_COLS: usize = 4096;

/// Most values of `a` that the backward hands [`product`], which may pack
/// `a` whole (64 MiB): every layer's gradient of a SmolLM2 step (at most
/// 2 400 × 1 536), not the LM head's (2 048 × 49 152), which OpenBLAS packs
/// a block at a time. Its weight gradient would pack 403 MB here; its input
/// gradient, which this kernel could read in place, ran level with
/// OpenBLAS inside a step (0.98–1.02× relative to the head's forward in
/// the same runs, `results/bench/kernel-ab/avx2-kernel-x-in-place-2026-11-27/`).
pub const WHOLE_A_MAX: usize = 16 << 20;

/// Whether this build and CPU can run the kernel at all: x86-64 Linux
/// (where `build.rs` compiles `avx2.c`) with AVX2 and FMA.
pub fn runs() -> bool {
    cfg!(all(r2vpo_avx2_c, target_arch = "x86_64")) && crate::has_avx2_fma()
}

/// `y (m, n) = x (m, k) · w (n, k)ᵀ`, all row-major f32: x packed once
/// (rows split over rayon's threads), then the columns split over them in
/// multiples of 16. A row's values do not depend on `m`, on the rows or
/// columns beside it, or on the split. Call only where [`runs`];
/// errors if a weight block's buffer cannot be allocated.
pub fn linear(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Result<Vec<f32>, String> {
    assert!(x.len() >= m * k && w.len() >= n * k, "avx2::linear: operands shorter than ({m}, {k}) and ({n}, {k})");
    product([m, k, n], (x, Layout::Rows(k)), (w, Layout::Cols(k)))
}

/// How a matrix operand lies in its slice: `Rows(ld)`, element (i, j) at
/// `i · ld + j` (row-major); `Cols(ld)`, at `j · ld + i` (a transposed
/// view of a row-major matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Row-major with this row stride.
    Rows(usize),
    /// Column-major with this column stride.
    Cols(usize),
}

impl Layout {
    /// From `[column stride, row stride]` (as `openblas::Operand` gives
    /// them) of a `(rows, cols)` operand: `None` where neither is 1.
    pub fn of([cs, rs]: [isize; 2], rows: usize, cols: usize) -> Option<Layout> {
        if cs == 1 && rs >= cols.max(1) as isize {
            Some(Layout::Rows(rs as usize))
        } else if rs == 1 && cs >= rows.max(1) as isize {
            Some(Layout::Cols(cs as usize))
        } else {
            None
        }
    }

    /// The leading dimension, and 1 where column-major (`avx2.c`'s `at`, `bt`).
    fn flag(self) -> (usize, i32) {
        match self {
            Layout::Rows(ld) => (ld, 0),
            Layout::Cols(ld) => (ld, 1),
        }
    }

    /// The index one past the last element of a `(rows, cols)` operand.
    fn extent(self, rows: usize, cols: usize) -> usize {
        match self {
            Layout::Rows(ld) => (rows - 1) * ld + cols,
            Layout::Cols(ld) => (cols - 1) * ld + rows,
        }
    }
}

/// `y (m, n) = a (m, k) · b (k, n)` into a new row-major `y`, the operands
/// in any [`Layout`]: the forward's `x · wᵀ` (`b` column-major: the
/// weight's rows), the backward's input gradient `g · w` (both row-major)
/// and weight gradient `gᵀ · x` (`a` column-major). A row-major `a` is
/// read in place up to [`IN_PLACE_MAX_COLS`] columns, else `a` is packed
/// whole (rows split over rayon's threads); then the columns split over
/// the threads in multiples of 16. Each output is one FMA chain over `k` in order, so a
/// row's values do not depend on `m`, the rows or columns beside it, the
/// split or the layouts. Call only where [`runs`]; errors if a `b`
/// block's buffer cannot be allocated.
pub fn product(
    [m, k, n]: [usize; 3],
    (a, la): (&[f32], Layout),
    (b, lb): (&[f32], Layout),
) -> Result<Vec<f32>, String> {
    assert!(runs(), "avx2::product called on a CPU without AVX2 and FMA");
    if m == 0 || n == 0 || k == 0 {
        return Ok(vec![0.0; m * n]);
    }
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: y's capacity holds the m × n outputs, which the call writes
    // (acc off: nothing is read from y) before `set_len`.
    unsafe { product_raw([m, k, n], (a, la), (b, lb), Shared(y.as_mut_ptr()), n, false)? };
    // SAFETY: the column ranges covered 0..n of every row once.
    unsafe { y.set_len(m * n) };
    Ok(y)
}

/// [`product`] into `y` with row stride `ldy` (`y = a · b`, or `y += a ·
/// b` with `acc`, each output one FMA chain over `k` from zero or from y's
/// value), on every thread of rayon's pool: the control networks' products
/// (`r2vpo_control::native`), which write into buffers they keep. The
/// same bits as [`product`] and [`product_here`]. Call only where
/// [`runs`]; errors if a `b` block's buffer cannot be allocated.
#[allow(clippy::too_many_arguments)]
pub fn product_into(
    [m, k, n]: [usize; 3],
    (a, la): (&[f32], Layout),
    (b, lb): (&[f32], Layout),
    y: &mut [f32],
    ldy: usize,
    acc: bool,
) -> Result<(), String> {
    assert!(runs(), "avx2::product_into called on a CPU without AVX2 and FMA");
    if m == 0 || n == 0 {
        return Ok(());
    }
    assert!(ldy >= n && (m - 1) * ldy + n <= y.len(), "avx2::product_into: y shorter than ({m}, {n}) at stride {ldy}");
    if k == 0 {
        if !acc {
            y.chunks_mut(ldy).take(m).for_each(|r| r[..n].fill(0.0));
        }
        return Ok(());
    }
    // SAFETY: the assert keeps every write inside `y`, which the `&mut`
    // borrow owns.
    unsafe { product_raw([m, k, n], (a, la), (b, lb), Shared(y.as_mut_ptr()), ldy, acc) }
}

/// The body of [`product`] and [`product_into`]: `a` packed or read in
/// place, then the columns split over the threads in multiples of 16.
///
/// # Safety
/// `y` must be valid for writes (and, with `acc`, reads) of rows
/// `0..m`, columns `0..n` at stride `ldy`, and alias neither operand;
/// `m`, `n` and `k` are nonzero.
unsafe fn product_raw(
    [m, k, n]: [usize; 3],
    (a, la): (&[f32], Layout),
    (b, lb): (&[f32], Layout),
    ys: Shared<f32>,
    ldy: usize,
    acc: bool,
) -> Result<(), String> {
    assert!(
        la.extent(m, k) <= a.len() && lb.extent(k, n) <= b.len(),
        "avx2::product: operands shorter than ({m}, {k}) and ({k}, {n})"
    );
    // The forward's weight (n, k) is B's columns: `bt`.
    let ((lda, at), (ldb, bt)) = (la.flag(), lb.flag());
    let in_place = at == 0 && n <= IN_PLACE_MAX_COLS;
    // Every k block holds all the 6-row panels (`avx2.c`'s layout).
    let packed_len = if in_place { 0 } else { m.div_ceil(MR) * MR * k };
    let mut ap: Vec<f32> = Vec::with_capacity(packed_len);
    if !in_place {
        let aps = Shared(ap.as_mut_ptr());
        per_thread(m.div_ceil(MR)).for_each(|(r0, r1)| {
            // SAFETY: panels [r0, r1) of every k block, inside the capacity
            // and no other task's; the assert keeps every read inside `a`.
            #[cfg(r2vpo_avx2_c)]
            unsafe {
                r2vpo_avx2_pack_a(a.as_ptr(), lda, at, m, k, r0, r1, aps.ptr())
            };
            #[cfg(not(r2vpo_avx2_c))]
            let _ = (r0, r1, aps, at);
        });
        // SAFETY: the panels cover all m.div_ceil(6) · 6 rows (zeros past
        // m) of every k block.
        unsafe { ap.set_len(packed_len) };
    }
    // `avx2.c` reads the packed panels, or a's rows in place where none.
    let packed = if in_place { std::ptr::null() } else { ap.as_ptr() };
    let packed = Shared(packed.cast_mut());
    let acc = i32::from(acc);
    let failed = per_thread(n.div_ceil(NR)).any(|(p0, p1)| {
        let (c0, c1) = (p0 * NR, (p1 * NR).min(n));
        // SAFETY: columns [c0, c1) of every row, inside y (the caller's
        // contract) and no other task's; a, its packed copy and b outlive
        // the call, and the assert keeps every read of a and b inside them.
        #[cfg(r2vpo_avx2_c)]
        return unsafe {
            r2vpo_avx2_cols(packed.ptr(), a.as_ptr(), lda, m, k, b.as_ptr(), ldb, bt, n, c0, c1, ys.ptr(), ldy, acc)
        } != 0;
        #[cfg(not(r2vpo_avx2_c))]
        {
            let _ = (c0, c1, ys, ldb, bt, lda, packed, ldy, acc);
            true
        }
    });
    if failed {
        return Err(format!("AVX2 product ({m} × {k}) · ({k} × {n}): could not allocate a block's buffer"));
    }
    Ok(())
}

/// `y (m, n) = a · b`, or `y += a · b` with `acc`, into `y` with row stride
/// `ldy`, on the calling thread alone: the attention's small per-head
/// products (`ops::attention`, one (row, kv head) per thread). Each
/// output is one FMA chain over `k` in order, from zero or from y's value.
/// Call only where [`runs`]; errors if a buffer cannot be allocated.
#[allow(clippy::too_many_arguments)]
pub fn product_here(
    [m, k, n]: [usize; 3],
    (a, la): (&[f32], Layout),
    (b, lb): (&[f32], Layout),
    y: &mut [f32],
    ldy: usize,
    acc: bool,
) -> Result<(), String> {
    assert!(runs(), "avx2::product_here called on a CPU without AVX2 and FMA");
    if m == 0 || n == 0 {
        return Ok(());
    }
    assert!(
        la.extent(m, k.max(1)) <= a.len() && lb.extent(k.max(1), n) <= b.len() && (m - 1) * ldy + n <= y.len(),
        "avx2::product_here: operands shorter than ({m}, {k}) · ({k}, {n})"
    );
    if k == 0 {
        if !acc {
            y.chunks_mut(ldy).take(m).for_each(|r| r[..n].fill(0.0));
        }
        return Ok(());
    }
    let ((lda, at), (ldb, bt)) = (la.flag(), lb.flag());
    // SAFETY: the assert keeps every read inside `a` and `b` and every
    // write inside `y`, which the `&mut` borrow owns.
    #[cfg(r2vpo_avx2_c)]
    let rc = unsafe {
        r2vpo_avx2_product_here(a.as_ptr(), lda, at, b.as_ptr(), ldb, bt, m, k, n, y.as_mut_ptr(), ldy, i32::from(acc))
    };
    #[cfg(not(r2vpo_avx2_c))]
    let rc = {
        let _ = (lda, at, ldb, bt);
        -1
    };
    if rc != 0 {
        return Err(format!("AVX2 product ({m} × {k}) · ({k} × {n}): could not allocate a buffer"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// True (after saying why) where this CPU does not run the kernel.
    fn skip() -> bool {
        if !runs() {
            eprintln!("skipped: this CPU lacks AVX2 and FMA (or the build has no AVX2 kernel)");
        }
        !runs()
    }

    /// `len` values in [−1, 1] from `i · step mod modulus`: no two
    /// neighbours alike, exact in f32.
    fn values(len: usize, step: usize, modulus: usize) -> Vec<f32> {
        let half = (modulus / 2) as f32;
        (0..len).map(|i| ((i * step % modulus) as f32 - half) / half).collect()
    }

    /// `product` in all four layouts (row- or column-major `a` and `b`,
    /// with leading dimensions past the operands' widths; a row-major `a`
    /// read in place, a column-major one packed) gives the same bits as
    /// `linear` on the same values, so every layout is as exact as
    /// the one checked against f64 below; rows alone come out the same.
    #[test]
    fn every_layout_gives_linears_bits() {
        if skip() {
            return;
        }
        // (7, 40, 4100): past IN_PLACE_MAX_COLS, a row-major `a` is packed.
        let shapes =
            [(1, 1, 1), (7, 300, 33), (13, 257, 17), (40, 576, 100), (33, 1539, 300), (9, 20, 8), (7, 40, 4100)];
        for &(m, k, n) in &shapes {
            let (x, w) = (values(m * k, 37, 101), values(n * k, 53, 97));
            let want = linear(&x, m, k, &w, n).unwrap();
            // A padded copy of a (rows × cols) matrix given by `at`, laid out as `l`.
            let lay = |rows: usize, cols: usize, at: &dyn Fn(usize, usize) -> f32, l: Layout| {
                let len = l.extent(rows, cols) + 3;
                let mut v = vec![f32::NAN; len];
                for i in 0..rows {
                    for j in 0..cols {
                        let o = match l {
                            Layout::Rows(ld) => i * ld + j,
                            Layout::Cols(ld) => j * ld + i,
                        };
                        v[o] = at(i, j);
                    }
                }
                v
            };
            for la in [Layout::Rows(k + 5), Layout::Cols(m + 3)] {
                for lb in [Layout::Rows(n + 2), Layout::Cols(k + 7)] {
                    let a = lay(m, k, &|i, p| x[i * k + p], la);
                    let b = lay(k, n, &|p, j| w[j * k + p], lb);
                    let y = product([m, k, n], (&a, la), (&b, lb)).unwrap();
                    assert_eq!(y, want, "({m},{k},{n}) {la:?} {lb:?}");
                    if m > 1 {
                        // The last row alone, from the same layout.
                        let one = lay(1, k, &|_, p| x[(m - 1) * k + p], la);
                        let y1 = product([1, k, n], (&one, la), (&b, lb)).unwrap();
                        assert_eq!(y1, want[(m - 1) * n..], "({m},{k},{n}) {la:?} {lb:?}: a row alone");
                    }
                }
            }
        }
    }

    /// `product_here` and `product_into` write `product`'s bits into a
    /// strided `y`, leaving the columns past `n` alone, and with `acc` add
    /// to what `y` holds (against f64, each sum one chain from y's value).
    #[test]
    fn product_here_and_into_write_and_add_in_place() {
        if skip() {
            return;
        }
        for &(m, k, n) in &[(1, 1, 1), (48, 64, 300), (300, 48, 64), (13, 257, 17)] {
            let (a, b) = (values(m * k, 37, 101), values(k * n, 53, 97));
            let (la, lb) = (Layout::Rows(k), Layout::Rows(n));
            let want = product([m, k, n], (&a, la), (&b, lb)).unwrap();
            let ldy = n + 5;
            let mut y = vec![7.0f32; m * ldy];
            product_here([m, k, n], (&a, la), (&b, lb), &mut y, ldy, false).unwrap();
            for i in 0..m {
                assert_eq!(y[i * ldy..i * ldy + n], want[i * n..(i + 1) * n], "({m},{k},{n}) row {i}");
                assert!(y[i * ldy + n..(i + 1) * ldy].iter().all(|&v| v == 7.0), "({m},{k},{n}) past n");
            }
            // `product_into` on every thread: the same bits, in place.
            let mut z = vec![7.0f32; m * ldy];
            product_into([m, k, n], (&a, la), (&b, lb), &mut z, ldy, false).unwrap();
            assert_eq!(z, y, "({m},{k},{n}): product_into differs from product_here");
            product_into([m, k, n], (&a, la), (&b, lb), &mut z, ldy, true).unwrap();
            product_here([m, k, n], (&a, la), (&b, lb), &mut y, ldy, true).unwrap();
            assert_eq!(z, y, "({m},{k},{n}): product_into with acc differs from product_here");
            for i in 0..m {
                for j in 0..n {
                    let r: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum();
                    let scale: f64 = (0..k).map(|p| (a[i * k + p] as f64 * b[p * n + j] as f64).abs()).sum();
                    let bound = (k as f64 * 1.2e-7).max(1e-6) * scale.max(1.0);
                    assert!((y[i * ldy + j] as f64 - 2.0 * r).abs() <= 2.0 * bound, "({m},{k},{n}) [{i},{j}] acc");
                }
            }
        }
    }

    /// Against an f64 reference on ragged shapes (the edges of both tile
    /// dimensions and of the k blocks, k beyond one block), and row and
    /// column independence: rows computed in another batch and columns of
    /// another weight slice come out the same bits.
    #[test]
    fn matches_f64_and_rows_are_independent() {
        if skip() {
            return;
        }
        for &(m, k, n) in &[(1, 1, 1), (7, 300, 33), (40, 576, 100), (13, 257, 17), (130, 600, 70), (33, 1539, 300)] {
            let (x, w) = (values(m * k, 37, 101), values(n * k, 53, 97));
            let y = linear(&x, m, k, &w, n).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let r: f64 = (0..k).map(|q| x[i * k + q] as f64 * w[j * k + q] as f64).sum();
                    let scale: f64 = (0..k).map(|q| (x[i * k + q] as f64 * w[j * k + q] as f64).abs()).sum();
                    // A sequential f32 sum's error bound, with room: k · 2⁻²⁴ · Σ|xw|.
                    let bound = (k as f64 * 6e-8).max(1e-6) * scale.max(1.0);
                    assert!((y[i * n + j] as f64 - r).abs() <= bound, "({m},{k},{n}) [{i},{j}]");
                }
            }
            if m > 1 {
                let tail = linear(&x[k..], m - 1, k, &w, n).unwrap();
                assert_eq!(tail, y[n..], "({m},{k},{n}): rows depend on their neighbours");
                let one = linear(&x[(m - 1) * k..], 1, k, &w, n).unwrap();
                assert_eq!(one, y[(m - 1) * n..], "({m},{k},{n}): a row alone differs");
            }
            if n > 1 {
                let cols = linear(&x, m, k, &w[k..], n - 1).unwrap();
                for i in 0..m {
                    assert_eq!(cols[i * (n - 1)..(i + 1) * (n - 1)], y[i * n + 1..(i + 1) * n], "columns");
                }
            }
        }
    }
}
