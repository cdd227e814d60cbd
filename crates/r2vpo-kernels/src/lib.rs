//! Which CPU kernels run r2vpo's f32 products, and a reference product
//! whose bits do not depend on the CPU.
//!
//! Both domains (the LLM learner in `r2vpo-llm`, the control networks in
//! `r2vpo-control`) pick their product kernels from the CPU at run time:
//! AMX, an AVX2 kernel of our own, OpenBLAS, or the `gemm` crate at its
//! widest SIMD level. Those kernels sum in different orders (and `gemm`'s
//! blocking also follows the cache sizes it reads), so a seeded run's
//! floating-point results legitimately differ from one CPU to the next.
//! Two things here make that testable on every machine:
//!
//! - [`Matmul`], one process-wide choice read from `R2VPO_MATMUL` (or set
//!   with [`set_matmul`]): `auto` (the CPU's fastest), or one kernel
//!   forced regardless of the dispatch policy, so the kernels a CPU can
//!   run can all be run and compared on it.
//! - [`product`], the `reference` choice: every output is one sum in `k`
//!   order of rounded products (`s = s + a·b`, never fused: Rust does not
//!   contract `*` and `+` into an FMA), computed by one thread. IEEE 754
//!   fixes each of those roundings, so the same inputs give the same bits
//!   on any CPU, at any SIMD level, with any number of threads. The
//!   trainers' bit-for-bit pins run on it.

use std::ops::{Add, Mul};
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use rayon::prelude::*;

pub mod amx;
pub mod avx2;
pub mod bf16w;
pub mod dispatch;
pub mod openblas;
pub mod simd;
pub mod small_gemm;

/// A raw pointer that rayon's tasks may share: each writes a disjoint part
/// (rows of a split input, columns of an output, a BLAS call's row or
/// column blocks), joined before the buffer is read.
#[derive(Clone, Copy)]
pub struct Shared<T>(pub *mut T);
// SAFETY: only used for disjoint writes, joined before the buffer is read
// (each user says which parts in its own SAFETY comment).
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// The pointer (a method, so closures capture the `Send` wrapper and
    /// not its raw field).
    pub fn ptr(self) -> *mut T {
        self.0
    }
}

/// Runs `block(w, j0, j1)` over columns `0..widths[w]` of every output
/// `w` of a few-row product: on one thread below `par_min` multiply–adds
/// (`macs`), else as two blocks per thread, each a multiple of `quantum`
/// columns (fewer, longer weight streams than finer splits: measured at
/// batch 1, where decode is bound by reading the weights). Shared by
/// [`small_gemm`] and [`bf16w`], whose outputs are written in place.
pub(crate) fn column_blocks(
    widths: &[usize],
    macs: usize,
    par_min: usize,
    quantum: usize,
    block: &(dyn Fn(usize, usize, usize) + Sync),
) {
    let threads = rayon::current_num_threads();
    if threads == 1 || macs < par_min {
        for (w, &n) in widths.iter().enumerate() {
            block(w, 0, n);
        }
        return;
    }
    let total: usize = widths.iter().sum();
    let per = total.div_ceil(threads * 2).next_multiple_of(quantum).max(quantum);
    let tasks: Vec<(usize, usize, usize)> = widths
        .iter()
        .enumerate()
        .flat_map(|(w, &n)| (0..n).step_by(per).map(move |j0| (w, j0, (j0 + per).min(n))))
        .collect();
    tasks.par_iter().for_each(|&(w, j0, j1)| block(w, j0, j1));
}

/// `0..units` in one contiguous range per thread of rayon's pool (fewer
/// where there are fewer units), in parallel: each thread streams its own
/// row blocks or column panels ([`avx2`], and r2vpo-llm's AMX kernel).
pub fn per_thread(units: usize) -> impl ParallelIterator<Item = (usize, usize)> {
    let per = units.div_ceil(rayon::current_num_threads().max(1)).max(1);
    (0..units.div_ceil(per)).into_par_iter().map(move |t| (t * per, ((t + 1) * per).min(units)))
}

/// The environment variable [`matmul`] reads on first use.
pub const ENV: &str = "R2VPO_MATMUL";

/// Which kernels run the many-row f32 products (and, for `reference`,
/// every product and the decode attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Matmul {
    /// The fastest this CPU has (the domains' dispatch policy).
    Auto,
    /// [`product`] for every product, and each domain's portable code for
    /// everything else that has a SIMD-dependent variant: the same bits on
    /// every CPU.
    Reference,
    /// The `gemm` crate alone, at its widest SIMD level for this CPU.
    Gemm,
    /// The forward on `gemm`, the backward on OpenBLAS (where it loads).
    OpenBlas,
    /// r2vpo's AVX2 kernel for the forward and the layers' backward, also
    /// on CPUs with AVX-512; needs AVX2 and FMA.
    Avx2,
    /// AMX for the forward; needs AMX-BF16 granted by the OS.
    Amx,
}

impl Matmul {
    /// Every choice, in the order errors list them.
    pub const ALL: [Matmul; 6] =
        [Matmul::Auto, Matmul::Reference, Matmul::Gemm, Matmul::OpenBlas, Matmul::Avx2, Matmul::Amx];

    /// The value `R2VPO_MATMUL` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            Matmul::Auto => "auto",
            Matmul::Reference => "reference",
            Matmul::Gemm => "gemm",
            Matmul::OpenBlas => "openblas",
            Matmul::Avx2 => "avx2",
            Matmul::Amx => "amx",
        }
    }

    fn code(self) -> u8 {
        Matmul::ALL.iter().position(|&m| m == self).expect("in ALL") as u8
    }
}

impl std::fmt::Display for Matmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Matmul {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Matmul::ALL.into_iter().find(|m| m.name() == s.trim()).ok_or_else(|| {
            let names: Vec<_> = Matmul::ALL.iter().map(|m| m.name()).collect();
            format!("{ENV}={s:?}: expected one of {}", names.join(", "))
        })
    }
}

/// No choice made yet: [`matmul`] reads the environment.
const UNSET: u8 = u8::MAX;
static CHOICE: AtomicU8 = AtomicU8::new(UNSET);

/// `R2VPO_MATMUL` as a [`Matmul`] (unset or empty: `auto`), or an error
/// naming the variable, the value and the accepted ones. Programs call it
/// at start-up to refuse a typo before any work; [`matmul`] panics with the
/// same message.
pub fn from_env() -> Result<Matmul, String> {
    match std::env::var(ENV) {
        Ok(v) if !v.trim().is_empty() => v.parse(),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(Matmul::Auto),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!("{ENV}={v:?}: not UTF-8")),
    }
}

/// The process's current choice: the last [`set_matmul`], else
/// `R2VPO_MATMUL` (read once). Panics on a value [`from_env`] refuses.
pub fn matmul() -> Matmul {
    let c = CHOICE.load(Ordering::Relaxed);
    if c != UNSET {
        return Matmul::ALL[c as usize];
    }
    let m = from_env().unwrap_or_else(|e| panic!("{e}"));
    // A concurrent set_matmul wins over the environment.
    let _ = CHOICE.compare_exchange(UNSET, m.code(), Ordering::Relaxed, Ordering::Relaxed);
    Matmul::ALL[CHOICE.load(Ordering::Relaxed) as usize]
}

/// Makes `m` the choice for every product started after this call, in
/// every thread. For programs and tests that compare kernels in one
/// process; a product already running finishes on the kernel it started on.
pub fn set_matmul(m: Matmul) {
    CHOICE.store(m.code(), Ordering::Relaxed);
}

/// Whether [`matmul`] is [`Matmul::Reference`].
pub fn reference() -> bool {
    matmul() == Matmul::Reference
}

/// Why [`product`]'s runs may not reproduce here bit for bit what an
/// x86-64 CPU with FMA recorded, or `None` where they do: the product is
/// the same everywhere, but the rest of a run calls libm (glibc takes its
/// FMA variants on every x86-64 CPU with FMA), and on other architectures
/// candle's compiled-in NEON reductions sum in their own order.
pub fn reference_bits_caveat() -> Option<&'static str> {
    if !cfg!(target_arch = "x86_64") {
        Some("reference goldens are x86-64's; this architecture's libm and candle's NEON reductions round in their own ways (record one with R2VPO_BLESS=1 on it)")
    } else if !has_avx2_fma() {
        Some("this x86-64 CPU has no FMA, so glibc's libm runs its non-FMA variants, which may round differently")
    } else {
        None
    }
}

/// Whether the CPU has AVX2 and FMA (x86-64 only).
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX-512F (x86-64 only).
pub fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The widest SIMD level the `gemm` crate picks on this CPU (`"avx512"`,
/// `"avx2"` or `"other"`), for naming the kernel path in logs.
pub fn gemm_simd() -> &'static str {
    if has_avx512f() {
        "avx512"
    } else if has_avx2_fma() {
        "avx2"
    } else {
        "other"
    }
}

/// The element types [`product`] takes.
pub trait Real: Copy + Send + Sync + Default + Add<Output = Self> + Mul<Output = Self> {}
impl Real for f32 {}
impl Real for f64 {}

/// An operand of [`product`]: its values and `(row stride, column stride)`.
pub type Operand<'a, T> = (&'a [T], (usize, usize));

/// Output columns one pass keeps in flight: independent sums the compiler
/// holds in vector registers, each still one chain in `k` order.
const LANES: usize = 16;

/// Products of at least this many multiply–adds split their rows over
/// rayon's threads; each output is summed by one thread either way.
const PAR_MIN_MACS: usize = 1 << 16;

/// `c (m, n) = a (m, k) · b (k, n)`, or `c += a · b` when `accumulate`,
/// with row `i` of `c` at `c[i·ldc..]`: the reference product. Output
/// `(i, j)` is `s = 0; s = s + a[i,p]·b[p,j]` for `p = 0, 1, …, k−1`, each
/// product and sum rounded (never fused), then `c[i,j] + s` when
/// accumulating. Nothing about the order depends on the CPU, the shapes
/// beside it or the thread count, so the bits are the same everywhere.
/// About 2–4 GFLOP/s: for pinned tests and checks, not for training.
/// Panics if an operand is shorter than its shape and strides say.
pub fn product<T: Real>(
    [m, k, n]: [usize; 3],
    (a, (ars, acs)): Operand<T>,
    (b, (brs, bcs)): Operand<T>,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    let span = |r: usize, cols: usize, rs: usize, cs: usize| (r - 1) * rs + (cols - 1) * cs + 1;
    assert!(ldc >= n && span(m, n, ldc, 1) <= c.len(), "reference product: c shorter than ({m}, {n}) at ldc {ldc}");
    if k == 0 {
        if !accumulate {
            c.chunks_mut(ldc).take(m).for_each(|r| r[..n].fill(T::default()));
        }
        return;
    }
    assert!(
        span(m, k, ars, acs) <= a.len() && span(k, n, brs, bcs) <= b.len(),
        "reference product: operands shorter than ({m}, {k}) · ({k}, {n})"
    );
    // b as a row-major (k, n) panel, so a pass over a row of it reads
    // LANES neighbouring columns. Copying changes no value.
    let packed: Vec<T>;
    let bp: &[T] = if bcs == 1 && brs == n {
        &b[..k * n]
    } else {
        packed = (0..k).flat_map(|p| (0..n).map(move |j| b[p * brs + j * bcs])).collect();
        &packed
    };
    let row = |i: usize, out: &mut [T]| {
        let ai = |p: usize| a[i * ars + p * acs];
        let mut j0 = 0;
        while j0 < n {
            let w = LANES.min(n - j0);
            let mut s = [T::default(); LANES];
            if w == LANES {
                for p in 0..k {
                    let (av, br) = (ai(p), &bp[p * n + j0..p * n + j0 + LANES]);
                    for l in 0..LANES {
                        s[l] = s[l] + av * br[l];
                    }
                }
            } else {
                for p in 0..k {
                    let (av, br) = (ai(p), &bp[p * n + j0..p * n + j0 + w]);
                    for l in 0..w {
                        s[l] = s[l] + av * br[l];
                    }
                }
            }
            for (o, &v) in out[j0..j0 + w].iter_mut().zip(&s) {
                *o = if accumulate { *o + v } else { v };
            }
            j0 += w;
        }
    };
    let rows = c[..span(m, n, ldc, 1)].chunks_mut(ldc);
    if m * n * k >= PAR_MIN_MACS {
        rows.collect::<Vec<_>>().into_par_iter().enumerate().for_each(|(i, r)| row(i, r));
    } else {
        rows.enumerate().for_each(|(i, r)| row(i, r));
    }
}

/// How far `a` lies from `b`: `‖a − b‖ / ‖b‖` (Euclidean norms, summed in
/// f64). What the kernel checks compare to their bounds: a fast kernel's
/// output against the reference product's.
pub fn distance(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "distance: different lengths");
    let (mut d, mut n) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        d += (f64::from(x) - f64::from(y)).powi(2);
        n += f64::from(y).powi(2);
    }
    (d / n.max(f64::MIN_POSITIVE)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, one output at a time.
    fn naive(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f32;
                for p in 0..k {
                    s += a[i * k + p] * b[p * n + j];
                }
                y[i * n + j] = s;
            }
        }
        y
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn equals_the_definition_bit_for_bit_in_every_layout() {
        for &(m, k, n) in &[(1, 1, 1), (3, 7, 5), (17, 33, 40), (64, 96, 130)] {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let want = naive(m, k, n, &a, &b);
            // Row-major operands.
            let mut y = vec![0f32; m * n];
            product([m, k, n], (&a, (k, 1)), (&b, (n, 1)), &mut y, n, false);
            assert_eq!(y, want, "row-major ({m}, {k}, {n})");
            // Transposed storage of both, and an output with a wider stride.
            let at: Vec<f32> = (0..k * m).map(|q| a[(q % m) * k + q / m]).collect();
            let bt: Vec<f32> = (0..n * k).map(|q| b[(q % k) * n + q / k]).collect();
            let ld = n + 3;
            let mut y2 = vec![7f32; m * ld];
            product([m, k, n], (&at, (1, m)), (&bt, (1, k)), &mut y2, ld, false);
            for i in 0..m {
                assert_eq!(&y2[i * ld..i * ld + n], &want[i * n..(i + 1) * n], "transposed ({m}, {k}, {n})");
                assert!(y2[i * ld + n..(i + 1) * ld].iter().all(|&v| v == 7.0), "wrote past n");
            }
            // Accumulation adds the finished sum once.
            let c0 = values(m * n, 3);
            let mut y3 = c0.clone();
            product([m, k, n], (&a, (k, 1)), (&b, (n, 1)), &mut y3, n, true);
            let acc: Vec<f32> = c0.iter().zip(&want).map(|(c, s)| c + s).collect();
            assert_eq!(y3, acc, "accumulate ({m}, {k}, {n})");
        }
    }

    #[test]
    fn the_thread_count_changes_nothing() {
        let (m, k, n) = (70, 200, 90);
        let (a, b) = (values(m * k, 4), values(k * n, 5));
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut y = vec![0f32; m * n];
            pool.install(|| product([m, k, n], (&a, (k, 1)), (&b, (n, 1)), &mut y, n, false));
            y
        };
        assert_eq!(run(1), run(3));
        assert_eq!(run(1), naive(m, k, n, &a, &b));
    }

    #[test]
    fn empty_products_zero_or_keep_the_output() {
        let mut y = vec![5f32; 6];
        product::<f32>([2, 0, 3], (&[], (0, 1)), (&[], (3, 1)), &mut y, 3, true);
        assert_eq!(y, vec![5.0; 6]);
        product::<f32>([2, 0, 3], (&[], (0, 1)), (&[], (3, 1)), &mut y, 3, false);
        assert_eq!(y, vec![0.0; 6]);
    }

    #[test]
    fn choices_parse_and_typos_name_the_variable() {
        for m in Matmul::ALL {
            assert_eq!(m.name().parse::<Matmul>().unwrap(), m);
        }
        let e = "avx3".parse::<Matmul>().unwrap_err();
        assert!(e.contains("R2VPO_MATMUL") && e.contains("avx3") && e.contains("reference"), "{e}");
    }
}
