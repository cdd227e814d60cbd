//! `x · wᵀ` with the weights in bf16 and the inputs, the sums and the
//! outputs in f32: the products of `r2vpo serve --dtype bf16`, which holds
//! a model's weight matrices in bf16 and computes everything else in f32.
//!
//! Why hand-written: a decode step reads every weight once, so its time is
//! bound by the bytes of the weights; bf16 halves them. candle's bf16
//! products convert and repack the whole weight per call and ran a bf16
//! decode at a thirteenth of r2vpo's f32 kernels on an AVX-512 + AMX Xeon
//! (`results/bench/serve-vs-vllm-2026-12-05-intel-xeon-avx512-amx/`).
//! Here a weight row streams past once, as in [`crate::small_gemm`], and is
//! widened to f32 in registers: a bf16 value is the top half of the f32
//! with the same value, so one 32-bit lane holding the pair (w₂ⱼ, w₂ⱼ₊₁)
//! gives w₂ⱼ as an f32 by a left shift of 16 and w₂ⱼ₊₁ by masking the low
//! half off. The input row is laid out once per call as each chunk's even
//! then odd elements, so every weight vector costs one integer operation
//! besides its fused multiply–adds. Each product `x·w` is an f32 product of
//! exactly the weight's value (bf16 → f32 is exact), so the result is the
//! f32 dot product of `x` with the bf16 weights, summed in another order
//! than the f32 kernels.
//!
//! Four kernels, chosen at run time ([`Kernel`], [`kernel`]): AMX from a
//! few rows ([`crate::amx::linear_bf16w`]: a bf16 weight is already the
//! operand AMX multiplies, so its rows load into tiles straight from the
//! matrix), AVX-512F (32 weights per load), AVX2 + FMA (16), and a
//! portable loop that sums each output in `k` order without fusing
//! (`s = s + x·w`, as [`crate::product`] does: the same bits on every CPU,
//! which is what `R2VPO_MATMUL=reference` asks for). Every kernel the CPU
//! can run is tested against an f64 reference on ragged shapes, forced one
//! by one with [`linear_on`].

/// The kernels [`linear`] can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Each output one unfused sum in `k` order: the same bits everywhere.
    Portable,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// x86-64 with AVX-512F.
    Avx512,
    /// Intel AMX ([`crate::amx::linear_bf16w`]): the weights' rows are the
    /// tiles as they lie, x in three exact bf16 pieces.
    Amx,
}

impl Kernel {
    /// Every kernel, in the order [`runnable`] lists them.
    pub const ALL: [Kernel; 4] = [Kernel::Portable, Kernel::Avx2, Kernel::Avx512, Kernel::Amx];

    /// Whether this CPU can run it.
    pub fn runs(self) -> bool {
        match self {
            Kernel::Portable => true,
            Kernel::Avx2 => crate::has_avx2_fma(),
            Kernel::Avx512 => crate::has_avx512f(),
            Kernel::Amx => crate::amx::hardware(),
        }
    }

    /// Its name in logs and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
            Kernel::Amx => "amx",
        }
    }
}

/// The kernels this CPU can run, the portable one first.
pub fn runnable() -> Vec<Kernel> {
    Kernel::ALL.into_iter().filter(|k| k.runs()).collect()
}

/// The kernel [`linear`] runs for `m` rows now: the portable one under
/// `R2VPO_MATMUL=reference` (the same bits on every CPU); AMX from
/// [`AMX_MIN_ROWS`] rows where the f32 products run on it
/// ([`crate::dispatch::on_amx`]: `auto` or `amx` on a CPU with AMX);
/// otherwise the widest SIMD kernel this CPU has. `R2VPO_MATMUL=avx2`
/// runs the AVX2 kernel also on AVX-512 CPUs, so that choice tests it
/// there as it does the f32 kernels.
pub fn kernel(m: usize) -> Kernel {
    match crate::matmul() {
        crate::Matmul::Reference => Kernel::Portable,
        crate::Matmul::Avx2 if Kernel::Avx2.runs() => Kernel::Avx2,
        _ if m >= AMX_MIN_ROWS && crate::dispatch::on_amx() => Kernel::Amx,
        _ if Kernel::Avx512.runs() => Kernel::Avx512,
        _ if Kernel::Avx2.runs() => Kernel::Avx2,
        _ => Kernel::Portable,
    }
}

/// Rows from which [`kernel`] picks AMX where it runs. Measured with
/// `timing` below on SmolLM2-135M's four decode shapes, weights from
/// memory, 2 threads, on a 2-core Xeon with AMX (GFLOP/s, AMX against the
/// AVX-512 kernel): 1 row 9.5 / 9.8, 2 rows 24.8 / 19.7, 4 rows 46.4 /
/// 30.2, 8 rows 76.0 / 57.4, 32 rows 257 / 98, 256 rows 409 / 115 (the f32
/// kernels at 256 rows: 288).
pub const AMX_MIN_ROWS: usize = 2;

/// `outᵢ (m, nᵢ) = x (m, k) · wᵢ (nᵢ, k)ᵀ` for each weight `(wᵢ, nᵢ)`, all
/// row-major, each weight given as its bf16 bit patterns (the upper 16
/// bits of an f32), on [`kernel`]. Several weights that read the same input
/// share one parallel pass, as in [`crate::small_gemm::linear`]. Any
/// number of rows; above [`BLOCK_ROWS`] the rows go in blocks of that many,
/// each streaming the weights once. Panics if a slice is shorter than its
/// shape says.
pub fn linear(x: &[f32], m: usize, k: usize, ws: &[(&[u16], usize)]) -> Vec<Vec<f32>> {
    linear_on(kernel(m), x, m, k, ws)
}

/// Rows one pass over the weights serves: the input rows stay in L1/L2
/// while each weight row meets all of them.
pub const BLOCK_ROWS: usize = 32;

/// Work (multiply–adds) below which one thread does it all.
const PAR_MIN_MACS: usize = 1 << 18;

/// [`linear`] on a given kernel. Panics if this CPU cannot run it.
pub fn linear_on(kernel: Kernel, x: &[f32], m: usize, k: usize, ws: &[(&[u16], usize)]) -> Vec<Vec<f32>> {
    assert!(kernel.runs(), "bf16w: this CPU cannot run the {} kernel", kernel.name());
    assert!(x.len() >= m * k && ws.iter().all(|(w, n)| w.len() >= n * k), "bf16w: slices shorter than their shapes");
    if kernel == Kernel::Amx {
        return crate::amx::linear_bf16w(x, m, k, ws);
    }
    let xs = Split::new(kernel, x, m, k);
    let total: usize = ws.iter().map(|w| w.1).sum();
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| Vec::with_capacity(m * w.1)).collect();
    let dst: Vec<crate::Shared<f32>> = outs.iter_mut().map(|o| crate::Shared(o.as_mut_ptr())).collect();
    let block = |wi: usize, j0: usize, j1: usize| {
        let (w, n) = ws[wi];
        for r0 in (0..m).step_by(BLOCK_ROWS) {
            let r1 = (r0 + BLOCK_ROWS).min(m);
            // SAFETY: columns j0..j1 of rows r0..r1 of output wi, which no
            // other task writes (the tasks split each output's columns).
            unsafe { columns(kernel, &xs, r0, r1, w, n, j0, j1, dst[wi].ptr()) };
        }
    };
    let widths: Vec<usize> = ws.iter().map(|w| w.1).collect();
    crate::column_blocks(&widths, m * total * k, PAR_MIN_MACS, 8, &block);
    for (o, w) in outs.iter_mut().zip(ws) {
        // SAFETY: the tasks cover columns 0..n of every output once, and
        // `columns` writes every row of each of its columns.
        unsafe { o.set_len(m * w.1) };
    }
    outs
}

/// The input rows as the SIMD kernels read them: each `CHUNK`-wide piece of
/// a row as its even-indexed then its odd-indexed elements (`CHUNK / 2`
/// each), the `k mod CHUNK` tail as it was.
struct Split<'a> {
    x: &'a [f32],
    k: usize,
    /// `m × k` values, or empty for the portable kernel.
    split: Vec<f32>,
    /// Weights per SIMD load: 32 (AVX-512), 16 (AVX2), 0 (portable).
    chunk: usize,
}

impl<'a> Split<'a> {
    fn new(kernel: Kernel, x: &'a [f32], m: usize, k: usize) -> Self {
        let chunk = match kernel {
            Kernel::Portable => return Split { x, k, split: Vec::new(), chunk: 0 },
            Kernel::Avx2 => 16,
            Kernel::Avx512 => 32,
            Kernel::Amx => unreachable!("AMX reads x as it is"),
        };
        let mut split = Vec::with_capacity(m * k);
        for row in x[..m * k].chunks_exact(k) {
            let body = k / chunk * chunk;
            for c in row[..body].chunks_exact(chunk) {
                split.extend(c.iter().step_by(2));
                split.extend(c.iter().skip(1).step_by(2));
            }
            split.extend_from_slice(&row[body..]);
        }
        Split { x, k, split, chunk }
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.split[i * self.k..(i + 1) * self.k]
    }
}

/// Columns `j0..j1` of rows `r0..r1` of `y (m, n)` at `y`.
///
/// # Safety
/// `y` points to an output of at least `r1 × n` values, and no other thread
/// writes those columns of those rows meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn columns(
    kernel: Kernel,
    x: &Split,
    r0: usize,
    r1: usize,
    w: &[u16],
    n: usize,
    j0: usize,
    j1: usize,
    y: *mut f32,
) {
    match kernel {
        Kernel::Portable => portable(x, r0, r1, w, n, j0, j1, y),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `linear_on` checked that the CPU has AVX-512F.
        Kernel::Avx512 => unsafe { x86::avx512(x, r0, r1, w, n, j0, j1, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `linear_on` checked that the CPU has AVX2 and FMA.
        Kernel::Avx2 => unsafe { x86::avx2(x, r0, r1, w, n, j0, j1, y) },
        Kernel::Amx => unreachable!("linear_on hands AMX its whole product"),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("runs() is false off x86-64"),
    }
}

/// The f32 value of a bf16 bit pattern (exact).
#[inline(always)]
fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The portable kernel: each output one unfused sum in `k` order.
///
/// # Safety
/// As [`columns`].
#[allow(clippy::too_many_arguments)]
unsafe fn portable(x: &Split, r0: usize, r1: usize, w: &[u16], n: usize, j0: usize, j1: usize, y: *mut f32) {
    let k = x.k;
    for i in r0..r1 {
        let xr = &x.x[i * k..(i + 1) * k];
        for j in j0..j1 {
            let wr = &w[j * k..(j + 1) * k];
            let mut s = 0f32;
            for q in 0..k {
                // Not `mul_add`: the reference sums rounded products.
                s += xr[q] * widen(wr[q]);
            }
            // SAFETY: i < r1 and j < j1 ≤ n, inside the caller's output.
            unsafe { *y.add(i * n + j) = s };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{widen, Split};
    use std::arch::x86_64::*;

    /// The AVX-512 kernel over tiles of 4 input rows × 4 weight rows (16
    /// accumulators, 4 widened weight vectors, 1 input vector: 21 of 32
    /// registers), then the ragged rows and columns one at a time.
    ///
    /// # Safety
    /// The CPU has AVX-512F; otherwise as [`super::columns`].
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn avx512(
        x: &Split,
        r0: usize,
        r1: usize,
        w: &[u16],
        n: usize,
        j0: usize,
        j1: usize,
        y: *mut f32,
    ) {
        unsafe { tiles::<4, 4, true>(x, r0, r1, w, n, j0, j1, y) }
    }

    /// The AVX2 kernel over tiles of 2 input rows × 4 weight rows (8
    /// accumulators, 4 weight vectors, 1 input: 13 of 16 registers).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; otherwise as [`super::columns`].
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn avx2(x: &Split, r0: usize, r1: usize, w: &[u16], n: usize, j0: usize, j1: usize, y: *mut f32) {
        unsafe { tiles::<2, 4, false>(x, r0, r1, w, n, j0, j1, y) }
    }

    /// Walks `MR × NR` tiles (AVX-512's where `W512`, else AVX2's), the
    /// ragged rows in `1 × NR` tiles and the ragged columns in `MR × 1` and
    /// `1 × 1` tiles, all on SIMD over `k`. No closures around intrinsics:
    /// a closure is compiled without its caller's target features, so the
    /// intrinsics inside become calls (measured at 32 rows: half the speed).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tiles<const MR: usize, const NR: usize, const W512: bool>(
        x: &Split,
        r0: usize,
        r1: usize,
        w: &[u16],
        n: usize,
        j0: usize,
        j1: usize,
        y: *mut f32,
    ) {
        let mut j = j0;
        while j + NR <= j1 {
            let mut i = r0;
            while i + MR <= r1 {
                unsafe { store::<MR, NR, W512>(x, w, n, i, j, y) };
                i += MR;
            }
            while i < r1 {
                unsafe { store::<1, NR, W512>(x, w, n, i, j, y) };
                i += 1;
            }
            j += NR;
        }
        while j < j1 {
            let mut i = r0;
            while i + MR <= r1 {
                unsafe { store::<MR, 1, W512>(x, w, n, i, j, y) };
                i += MR;
            }
            while i < r1 {
                unsafe { store::<1, 1, W512>(x, w, n, i, j, y) };
                i += 1;
            }
            j += 1;
        }
    }

    /// One tile's dot products, written to `y (…, n)` at rows `i0..i0+MR`,
    /// columns `j0..j0+NR`.
    ///
    /// # Safety
    /// Those rows and columns are the caller's to write (see
    /// [`super::columns`]); the CPU has the tile's features.
    #[inline(always)]
    unsafe fn store<const MR: usize, const NR: usize, const W512: bool>(
        x: &Split,
        w: &[u16],
        n: usize,
        i0: usize,
        j0: usize,
        y: *mut f32,
    ) {
        let t = if W512 { tile512::<MR, NR>(x, w, x.k, i0, j0) } else { tile256::<MR, NR>(x, w, x.k, i0, j0) };
        for (a, row) in t.iter().enumerate() {
            for (b, &v) in row.iter().enumerate() {
                // SAFETY: the caller's rows and columns.
                unsafe { *y.add((i0 + a) * n + j0 + b) = v };
            }
        }
    }

    /// The tail `k mod chunk` of dot product (i, j), added to `s`.
    #[inline(always)]
    fn tail(x: &Split, i: usize, wr: &[u16], mut s: f32) -> f32 {
        let body = x.k / x.chunk * x.chunk;
        let xr = x.row(i);
        for q in body..x.k {
            s = xr[q].mul_add(widen(wr[q]), s);
        }
        s
    }

    #[inline(always)]
    fn tile512<const MR: usize, const NR: usize>(
        x: &Split,
        w: &[u16],
        k: usize,
        i0: usize,
        j0: usize,
    ) -> [[f32; NR]; MR] {
        debug_assert_eq!(x.chunk, 32);
        let steps = k / 32;
        let mut xr: [&[f32]; MR] = [&[]; MR];
        for (a, r) in xr.iter_mut().enumerate() {
            *r = x.row(i0 + a);
        }
        let mut wr: [&[u16]; NR] = [&[]; NR];
        for (b, r) in wr.iter_mut().enumerate() {
            *r = &w[(j0 + b) * k..(j0 + b + 1) * k];
        }
        let mut out = [[0f32; NR]; MR];
        // SAFETY: every load below reads 16 f32 or 32 u16 inside a row of
        // `k ≥ 32·steps` values; the caller has AVX-512F (this is inlined
        // into `avx512`).
        unsafe {
            let hi = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
            let mut acc = [[_mm512_setzero_ps(); NR]; MR];
            let mut raw = [_mm512_setzero_si512(); NR];
            let mut wv = [_mm512_setzero_ps(); NR];
            for p in 0..steps {
                for b in 0..NR {
                    raw[b] = _mm512_loadu_si512(wr[b].as_ptr().add(p * 32).cast());
                    wv[b] = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(raw[b]));
                }
                for a in 0..MR {
                    let xe = _mm512_loadu_ps(xr[a].as_ptr().add(p * 32));
                    for b in 0..NR {
                        acc[a][b] = _mm512_fmadd_ps(xe, wv[b], acc[a][b]);
                    }
                }
                for b in 0..NR {
                    wv[b] = _mm512_castsi512_ps(_mm512_and_si512(raw[b], hi));
                }
                for a in 0..MR {
                    let xo = _mm512_loadu_ps(xr[a].as_ptr().add(p * 32 + 16));
                    for b in 0..NR {
                        acc[a][b] = _mm512_fmadd_ps(xo, wv[b], acc[a][b]);
                    }
                }
            }
            for a in 0..MR {
                for b in 0..NR {
                    out[a][b] = tail(x, i0 + a, wr[b], _mm512_reduce_add_ps(acc[a][b]));
                }
            }
        }
        out
    }

    #[inline(always)]
    fn tile256<const MR: usize, const NR: usize>(
        x: &Split,
        w: &[u16],
        k: usize,
        i0: usize,
        j0: usize,
    ) -> [[f32; NR]; MR] {
        debug_assert_eq!(x.chunk, 16);
        let steps = k / 16;
        let mut xr: [&[f32]; MR] = [&[]; MR];
        for (a, r) in xr.iter_mut().enumerate() {
            *r = x.row(i0 + a);
        }
        let mut wr: [&[u16]; NR] = [&[]; NR];
        for (b, r) in wr.iter_mut().enumerate() {
            *r = &w[(j0 + b) * k..(j0 + b + 1) * k];
        }
        let mut out = [[0f32; NR]; MR];
        // SAFETY: every load reads 8 f32 or 16 u16 inside a row of
        // `k ≥ 16·steps` values; the caller has AVX2 and FMA.
        unsafe {
            let hi = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
            let mut acc = [[_mm256_setzero_ps(); NR]; MR];
            let mut raw = [_mm256_setzero_si256(); NR];
            let mut wv = [_mm256_setzero_ps(); NR];
            for p in 0..steps {
                for b in 0..NR {
                    raw[b] = _mm256_loadu_si256(wr[b].as_ptr().add(p * 16).cast());
                    wv[b] = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(raw[b]));
                }
                for a in 0..MR {
                    let xe = _mm256_loadu_ps(xr[a].as_ptr().add(p * 16));
                    for b in 0..NR {
                        acc[a][b] = _mm256_fmadd_ps(xe, wv[b], acc[a][b]);
                    }
                }
                for b in 0..NR {
                    wv[b] = _mm256_castsi256_ps(_mm256_and_si256(raw[b], hi));
                }
                for a in 0..MR {
                    let xo = _mm256_loadu_ps(xr[a].as_ptr().add(p * 16 + 8));
                    for b in 0..NR {
                        acc[a][b] = _mm256_fmadd_ps(xo, wv[b], acc[a][b]);
                    }
                }
            }
            for a in 0..MR {
                for b in 0..NR {
                    out[a][b] = tail(x, i0 + a, wr[b], hsum256(acc[a][b]));
                }
            }
        }
        out
    }

    /// The sum of a register's 8 lanes.
    #[inline(always)]
    unsafe fn hsum256(v: __m256) -> f32 {
        // SAFETY: AVX is implied by the caller's AVX2.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 bits of `v` rounded to nearest even (the conversion a bf16
    /// checkpoint or `half` makes).
    fn bf16_bits(v: f32) -> u16 {
        let b = v.to_bits();
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }

    /// Every kernel this CPU runs against an f64 dot product of the same
    /// (exactly widened) weights, on ragged shapes that hit every edge:
    /// rows not a multiple of any tile, columns not of NR, k not of either
    /// chunk, more rows than a block, and two weights of different widths in
    /// one call. The portable kernel gives exactly `crate::product`'s bits
    /// on the widened weights.
    #[test]
    fn every_kernel_matches_f64_on_ragged_shapes() {
        let kernels = runnable();
        assert!(kernels.contains(&Kernel::Portable));
        // What this CPU covers, in the test output (CI runs one CPU kind).
        let skipped: Vec<_> = Kernel::ALL.into_iter().filter(|k| !k.runs()).map(Kernel::name).collect();
        let ran: Vec<_> = kernels.iter().map(|k| k.name()).collect();
        eprintln!("bf16w kernels tested here: {ran:?}; not runnable on this CPU, skipped: {skipped:?}");
        for &(m, k, n) in
            &[(1, 1, 1), (1, 576, 1536), (3, 37, 9), (5, 64, 13), (33, 48, 17), (7, 130, 203), (70, 96, 40)]
        {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let w: Vec<u16> = (0..n * k).map(|i| bf16_bits(((i * 53 % 97) as f32 - 48.0) / 47.0)).collect();
            let n2 = n / 3 + 5;
            let w2: Vec<u16> = (0..n2 * k).map(|i| bf16_bits(((i * 29 % 89) as f32 - 44.0) / 43.0)).collect();
            let wf: Vec<f32> = w.iter().map(|&b| widen(b)).collect();
            for &kern in &kernels {
                let mut ys = linear_on(kern, &x, m, k, &[(&w, n), (&w2, n2)]);
                assert_eq!(ys[1], linear_on(kern, &x, m, k, &[(&w2, n2)]).remove(0), "{kern:?} ({m},{k},{n2})");
                let y = ys.remove(0);
                for i in 0..m {
                    for j in 0..n {
                        let r: f64 = (0..k).map(|q| x[i * k + q] as f64 * wf[j * k + q] as f64).sum();
                        let scale: f64 = (0..k).map(|q| (x[i * k + q] as f64 * wf[j * k + q] as f64).abs()).sum();
                        let err = (y[i * n + j] as f64 - r).abs();
                        assert!(
                            err <= 1e-6 * scale.max(1.0),
                            "{kern:?} ({m},{k},{n}) [{i},{j}]: {} vs {r}",
                            y[i * n + j]
                        );
                    }
                }
                if kern == Kernel::Portable {
                    let mut p = vec![0f32; m * n];
                    crate::product([m, k, n], (&x, (k, 1)), (&wf, (1, k)), &mut p, n, false);
                    assert_eq!(y, p, "portable = crate::product bit for bit ({m},{k},{n})");
                }
            }
        }
    }

    /// A row's outputs are the same bits whatever rows share the call, on
    /// each kernel: a sequence's logits do not depend on the sequences
    /// decoded beside it while the kernel stays the same.
    #[test]
    fn rows_do_not_depend_on_their_neighbours() {
        let (k, n) = (200, 70);
        let x: Vec<f32> = (0..40 * k).map(|i| ((i * 31 % 103) as f32 - 51.0) / 50.0).collect();
        let w: Vec<u16> = (0..n * k).map(|i| bf16_bits(((i * 17 % 91) as f32 - 45.0) / 44.0)).collect();
        for kern in runnable() {
            let all = linear_on(kern, &x, 40, k, &[(&w, n)]).remove(0);
            for (r0, m) in [(0, 1), (5, 3), (8, 32), (3, 17)] {
                let part = linear_on(kern, &x[r0 * k..], m, k, &[(&w, n)]).remove(0);
                assert_eq!(part[..], all[r0 * n..(r0 + m) * n], "{kern:?}: rows {r0}..{}", r0 + m);
            }
        }
    }

    /// `kernel()` follows `R2VPO_MATMUL`: the portable kernel under
    /// `reference`, and never one this CPU cannot run.
    #[test]
    fn the_dispatch_picks_a_kernel_this_cpu_runs() {
        for m in [1, AMX_MIN_ROWS - 1, AMX_MIN_ROWS, 256] {
            let k = kernel(m);
            assert!(k.runs(), "{k:?} at {m} rows");
            match crate::matmul() {
                crate::Matmul::Reference => assert_eq!(k, Kernel::Portable),
                crate::Matmul::Auto if m >= AMX_MIN_ROWS && Kernel::Amx.runs() => assert_eq!(k, Kernel::Amx),
                crate::Matmul::Auto => {
                    let simd = runnable().into_iter().rfind(|&k| k != Kernel::Amx).unwrap();
                    assert_eq!(k, simd, "{m} rows");
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod timing {
    /// Not a test: GFLOP/s of each kernel on SmolLM2's decode shapes beside
    /// the f32 kernels' ([`crate::small_gemm::linear`], AMX included where
    /// it runs), for tuning (`cargo test --release -p r2vpo-kernels
    /// bf16w::timing -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn smollm2_shapes() {
        let shapes = [(576, 960), (576, 3072), (1536, 576), (576, 49152)];
        for m in [1usize, 2, 4, 8, 16, 32, 64, 256] {
            let mut kernels: Vec<String> = super::runnable().iter().map(|k| k.name().to_string()).collect();
            kernels.push("f32".into());
            for kernel in kernels.iter().filter(|k| m == 1 || *k != "portable") {
                let mut line = format!("m={m:3} {kernel:8}");
                let mut tot = (0.0, 0.0);
                for &(k, n) in &shapes {
                    let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
                    let bytes = if kernel == "f32" { 4 } else { 2 };
                    let copies = ((600usize << 20) / (n * k * bytes)).max(1);
                    let wf: Vec<Vec<f32>> =
                        (0..copies).map(|c| (0..n * k).map(|i| ((i + c) % 5) as f32 * 0.1).collect()).collect();
                    let wb: Vec<Vec<u16>> =
                        wf.iter().map(|w| w.iter().map(|v| (v.to_bits() >> 16) as u16).collect()).collect();
                    let reps = copies.max(20);
                    let t = std::time::Instant::now();
                    for r in 0..reps {
                        match kernel.as_str() {
                            "f32" if m <= crate::small_gemm::MAX_ROWS => {
                                std::hint::black_box(crate::small_gemm::linear(&x, m, k, &[(&wf[r % copies], n)]));
                            }
                            "f32" => {
                                std::hint::black_box(crate::amx::linear(&x, m, k, &wf[r % copies], n).ok());
                            }
                            name => {
                                let kern = super::Kernel::ALL.into_iter().find(|k| k.name() == name).unwrap();
                                std::hint::black_box(super::linear_on(kern, &x, m, k, &[(&wb[r % copies], n)]));
                            }
                        }
                    }
                    let s = t.elapsed().as_secs_f64() / reps as f64;
                    let flop = 2.0 * (m * n * k) as f64;
                    tot = (tot.0 + flop, tot.1 + s);
                    line += &format!("  {k}x{n}: {:6.1}", flop / s / 1e9);
                }
                println!("{line}  all: {:.1} GFLOP/s", tot.0 / tot.1 / 1e9);
            }
        }
    }
}
