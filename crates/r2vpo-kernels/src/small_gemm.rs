//! `x · wᵀ` for the few rows of a decode step, reading the weights where
//! they lie.
//!
//! Why hand-written: candle's CPU matmul (the `gemm` crate) copies the
//! weight matrix into a packed layout on every call. That pays off when
//! many rows reuse each packed panel (the learner's 2 400-row passes), but a
//! decode step has 1–32 rows: profiled at batch 32, 33 % of decode time was
//! `pack_lhs` against 26 % in the multiply itself (`docs/cpu-speed.md`).
//! Here each weight row (contiguous along `k`, as checkpoints store it) is
//! streamed once and dotted with every input row while it sits
//! in L1, so nothing is copied. SIMD comes from `pulp` (the portable-SIMD
//! crate under gemm and faer: run-time dispatch to AVX-512, AVX2 or NEON),
//! not hand-written intrinsics.
//! Measured gains are in `docs/cpu-speed.md`'s decode rows.

/// Inputs with more rows than this go to candle's matmul: above it each
/// weight panel is reused enough for packing to pay (measured crossover on
/// SmolLM2 shapes, `docs/cpu-speed.md`).
pub const MAX_ROWS: usize = 32;

/// Work (multiply–adds) below which one thread does it all: rayon's
/// hand-off costs more than the split saves.
const PAR_MIN_MACS: usize = 1 << 18;

/// The AVX-512 tile: input rows × weight rows per register block. 2 × 8
/// keeps 16 accumulators, 8 weight vectors and one input in 25 of the 32
/// registers and loads each input vector once per 8 FMAs; 4 × 4, 4 × 6 and
/// 3 × 8 ran no faster on the LM head (`timing` below).
const MR512: usize = 2;
/// See [`MR512`].
const NR512: usize = 8;

/// Whether `m` input rows go to this kernel now (the one rule
/// `ops::linear` and `ops::linear_many` route by): up to [`MAX_ROWS`] where
/// [`crate::dispatch::few_rows`] says so (x86-64 with AVX2+FMA or AVX-512,
/// and not the reference choice); elsewhere callers use the many-row path.
pub fn takes(m: usize) -> bool {
    m <= MAX_ROWS && crate::dispatch::few_rows()
}

/// `outᵢ (m, nᵢ) = x (m, k) · wᵢ (nᵢ, k)ᵀ` for each weight `(wᵢ, nᵢ)`, all
/// row-major: on AMX from [`AMX_MIN_ROWS`] rows where the CPU has it, else
/// on this file's kernel. Several weights that read the same input (q, k and v; gate
/// and up) share one parallel pass: one hand-off to the threads instead of
/// one per matrix, and the small k/v projections split too. Panics if a
/// slice is shorter than its shape says.
pub fn linear(x: &[f32], m: usize, k: usize, ws: &[(&[f32], usize)]) -> Vec<Vec<f32>> {
    if m >= AMX_MIN_ROWS && crate::dispatch::on_amx() {
        return crate::amx::linear_small(x, m, k, ws);
    }
    linear_f32(x, m, k, ws)
}

/// Rows from which [`linear`] runs on AMX where the CPU has it
/// ([`crate::amx::linear_small`]); fewer stay on the f32 kernel here.
/// Measured on SmolLM2 (2 threads, weights from memory): at 16 and 32
/// rows AMX ran the decode shapes at 1.5–1.7× this kernel's rate; at 8
/// rows the decode was faster here (248 against 229 tokens/s), the weight
/// stream being the bound and AMX's split costing more than it saves.
pub const AMX_MIN_ROWS: usize = 16;

/// [`linear`] on the f32 SIMD kernel of this file.
fn linear_f32(x: &[f32], m: usize, k: usize, ws: &[(&[f32], usize)]) -> Vec<Vec<f32>> {
    assert!(
        x.len() >= m * k && ws.iter().all(|(w, n)| w.len() >= n * k),
        "small_gemm: slices shorter than their shapes"
    );
    let total: usize = ws.iter().map(|w| w.1).sum();
    // Each output is written in place, column block by column block, without
    // being zero-filled first: per-block buffers copied into zeroed outputs
    // were 2.4 % of decode time at batch 32 (memset and memcpy, perf).
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| Vec::with_capacity(m * w.1)).collect();
    let dst: Vec<Out> = outs.iter_mut().map(|o| Out(o.as_mut_ptr())).collect();
    let block = |wi: usize, j0: usize, j1: usize| {
        let out = Out(dst[wi].0);
        pulp::Arch::new().dispatch(Block { x, w: ws[wi].0, k, m, n: ws[wi].1, j0, j1, out });
    };
    let widths: Vec<usize> = ws.iter().map(|w| w.1).collect();
    crate::column_blocks(&widths, m * total * k, PAR_MIN_MACS, NR512, &block);
    for (o, w) in outs.iter_mut().zip(ws) {
        // SAFETY: the blocks above cover columns 0..n of every output once
        // (the tasks split 0..n without overlap), and `Block::tiles` writes
        // every row of each of its columns, so all m·n values are written.
        unsafe { o.set_len(m * w.1) };
    }
    outs
}

/// An output matrix `(m, n)` that [`Block`]s of disjoint columns write at
/// once from several threads.
#[derive(Clone, Copy)]
struct Out(*mut f32);

// SAFETY: `Out` is only written through `Block::tiles`, each block its own
// columns, and read only after every block has finished.
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

/// Output columns `j0..j1` (weight rows) for every input row, into those
/// columns of `out` `(m, n)`, compiled for the widest SIMD the CPU has.
struct Block<'a> {
    x: &'a [f32],
    w: &'a [f32],
    k: usize,
    m: usize,
    n: usize,
    j0: usize,
    j1: usize,
    out: Out,
}

impl pulp::WithSimd for Block<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        // AVX-512 has 32 registers ([`MR512`]); AVX2 has 16, so 2 × 4
        // accumulators + 4 weight vectors + 1 input.
        if S::F32_LANES >= 16 {
            self.tiles::<S, MR512, NR512>(simd)
        } else {
            self.tiles::<S, 2, 4>(simd)
        }
    }
}

impl Block<'_> {
    /// Tiles of `MR × NR` dot products, then the ragged edges with
    /// one-wide tiles.
    #[inline(always)]
    fn tiles<S: pulp::Simd, const MR: usize, const NR: usize>(self, simd: S) {
        let Block { x, w, k, m, n, j0, j1, out } = self;
        assert!(j1 <= n && w.len() >= n * k && x.len() >= m * k, "small_gemm: block outside its matrices");
        let put = |i0: usize, jj: usize, t: &[f32], nr: usize, mr: usize| {
            for i in 0..mr {
                debug_assert!(i0 + i < m && jj + nr <= j1);
                // SAFETY: row i0 + i < m and columns jj..jj + nr inside this
                // block's j0..j1 ⊂ 0..n: inside the (m, n) output, and no
                // other block writes these columns.
                unsafe { std::ptr::copy_nonoverlapping(t[i * nr..].as_ptr(), out.0.add((i0 + i) * n + jj), nr) };
            }
        };
        let mut j = j0;
        while j + NR <= j1 {
            // The next tile's weight rows, spread over this tile's row tiles.
            let next = &w[(j + NR).min(j1) * k..(j + 2 * NR).min(j1) * k];
            let share = next.len().div_ceil(m.div_ceil(MR)).next_multiple_of(16).max(16);
            let mut chunks = next.chunks(share);
            let mut i = 0;
            while i + MR <= m {
                prefetch(chunks.next().unwrap_or(&[]));
                put(i, j, tile::<S, MR, NR>(simd, x, w, k, i, j).as_flattened(), NR, MR);
                i += MR;
            }
            for rest in chunks {
                prefetch(rest);
            }
            while i < m {
                put(i, j, tile::<S, 1, NR>(simd, x, w, k, i, j).as_flattened(), NR, 1);
                i += 1;
            }
            j += NR;
        }
        while j < j1 {
            for i in 0..m {
                put(i, j, tile::<S, 1, 1>(simd, x, w, k, i, j).as_flattened(), 1, 1);
            }
            j += 1;
        }
    }
}

/// Asks for `w` in L2 while the current tile computes. A tile's first pass
/// over its weight rows otherwise waits on memory (the rows are new) and
/// only the later input rows find them in L1: at 32 rows the two took about
/// equally long and did not overlap. Measured on the LM head (576 × 49152)
/// at 32 rows, one thread: 73 → 85 GFLOP/s (`timing` below).
#[inline(always)]
fn prefetch(w: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in w.chunks(16) {
        // SAFETY: a prefetch is a hint; it never faults, and the address is
        // inside a live slice.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
}

/// Dot products of input rows `i0..i0+MR` with weight rows `j0..j0+NR`, a
/// SIMD register of lanes at a time; the lanes are summed at the end and
/// the `k mod lanes` tail added in scalar.
#[inline(always)]
fn tile<S: pulp::Simd, const MR: usize, const NR: usize>(
    simd: S,
    x: &[f32],
    w: &[f32],
    k: usize,
    i0: usize,
    j0: usize,
) -> [[f32; NR]; MR] {
    let xr: [&[f32]; MR] = std::array::from_fn(|i| &x[(i0 + i) * k..(i0 + i + 1) * k]);
    let wr: [&[f32]; NR] = std::array::from_fn(|j| &w[(j0 + j) * k..(j0 + j + 1) * k]);
    let xv: [&[S::f32s]; MR] = std::array::from_fn(|i| S::as_simd_f32s(xr[i]).0);
    let wv: [&[S::f32s]; NR] = std::array::from_fn(|j| S::as_simd_f32s(wr[j]).0);
    let steps = k / S::F32_LANES;
    // Plain loops, no closures, where SIMD values are touched: a closure is
    // its own function without the caller's target features, so the
    // intrinsics inside it become calls (measured: half the decode time).
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; NR]; MR];
    let mut wp = [zero; NR];
    for p in 0..steps {
        for j in 0..NR {
            wp[j] = wv[j][p];
        }
        for i in 0..MR {
            let xp = xv[i][p];
            for j in 0..NR {
                acc[i][j] = simd.mul_add_e_f32s(xp, wp[j], acc[i][j]);
            }
        }
    }
    let kv = steps * S::F32_LANES;
    let mut out = [[0f32; NR]; MR];
    for i in 0..MR {
        for j in 0..NR {
            let mut s = simd.reduce_sum_f32s(acc[i][j]);
            for q in kv..k {
                s = xr[i][q].mul_add(wr[j][q], s);
            }
            out[i][j] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a plain f64 dot product, on ragged shapes that exercise every
    /// edge (rows not a multiple of MR, columns not of NR, k not of L), on
    /// sizes that run in parallel, and with a second weight of another
    /// width in the same call (q with k/v; gate with up), so every column
    /// block of every output must be written in place.
    #[test]
    fn matches_f64_reference_on_ragged_shapes() {
        for &(m, k, n) in &[(1, 1, 1), (1, 576, 1536), (3, 37, 9), (5, 64, 13), (32, 576, 49), (7, 130, 2048)] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0).collect();
            let n2 = n / 3 + 5;
            let w2: Vec<f32> = (0..n2 * k).map(|i| ((i * 29 % 89) as f32 - 44.0) / 44.0).collect();
            let mut ys = linear(&x, m, k, &[(&w, n), (&w2, n2)]);
            assert_eq!(ys[1], linear(&x, m, k, &[(&w2, n2)]).remove(0), "({m},{k},{n2}) alongside ({n})");
            let y = ys.remove(0);
            for i in 0..m {
                for j in 0..n {
                    let r: f64 = (0..k).map(|q| x[i * k + q] as f64 * w[j * k + q] as f64).sum();
                    let scale: f64 = (0..k).map(|q| (x[i * k + q] as f64 * w[j * k + q] as f64).abs()).sum();
                    let err = (y[i * n + j] as f64 - r).abs();
                    assert!(err <= 1e-6 * scale.max(1.0), "({m},{k},{n}) [{i},{j}]: {} vs {r}", y[i * n + j]);
                }
            }
        }
    }
}

#[cfg(test)]
mod timing {
    /// Not a test: GFLOP/s of the kernel on SmolLM2's decode shapes, for
    /// tuning (`cargo test --release -p r2vpo-llm --lib small_gemm::timing
    /// -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn smollm2_shapes() {
        let shapes = [(576, 960), (576, 3072), (1536, 576), (576, 49152)];
        let amx = crate::dispatch::on_amx();
        for m in [1usize, 4, 8, 12, 16, 24, 32] {
            for kernel in if amx { &["f32", "amx"][..] } else { &["f32"][..] } {
                let mut line = format!("m={m:2} {kernel}");
                let mut tot = (0.0, 0.0);
                for &(k, n) in &shapes {
                    let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
                    // Copies enough to leave the caches, as a decode step's
                    // 538 MB of weights do.
                    let copies = if std::env::var("HOT").is_ok() { 1 } else { (600usize << 20) / (n * k * 4) };
                    let ws: Vec<Vec<f32>> =
                        (0..copies).map(|c| (0..n * k).map(|i| ((i + c) % 5) as f32 * 0.1).collect()).collect();
                    let reps = copies.max(20);
                    let t = std::time::Instant::now();
                    for r in 0..reps {
                        let w = &ws[r % copies];
                        if *kernel == "amx" {
                            std::hint::black_box(crate::amx::linear_small(&x, m, k, &[(w, n)]));
                        } else {
                            std::hint::black_box(super::linear_f32(&x, m, k, &[(w, n)]));
                        }
                    }
                    let s = t.elapsed().as_secs_f64() / reps as f64;
                    let flop = 2.0 * (m * n * k) as f64;
                    tot = (tot.0 + flop, tot.1 + s);
                    line +=
                        &format!("  {k}x{n}: {:6.1} GFLOP/s {:5.1} GB/s", flop / s / 1e9, (n * k * 4) as f64 / s / 1e9);
                }
                println!("{line}  all: {:.1} GFLOP/s", tot.0 / tot.1 / 1e9);
            }
        }
    }
}
