//! The backward's f32 products on OpenBLAS, on CPUs without AMX: the
//! input and weight gradients of linear layers (`sgemm`, which the
//! backward of `ops::linear` calls). Where [`crate::avx2`]'s kernel runs (AVX2
//! without AVX-512), it takes every product whose left operand it can pack
//! whole (`avx2::WHOLE_A_MAX`), which leaves OpenBLAS the LM head's.
//!
//! Why: on a 2-core AMD EPYC (Zen 3, AVX2) the `gemm` crate ran SmolLM2's
//! learner shapes (8 × 300 tokens: 2 400 × 576 × 960 … 2 048 × 576 × 49 152,
//! forward, input and weight gradients) at 85–100 GFLOP/s and PyTorch's
//! MKL at 89–111, where OpenBLAS's kernels ran them at 141–150
//! (`ops::timing::learner_products` against `scripts/hf/products.py` and
//! numpy's OpenBLAS, alternating; that 2-core AMD EPYC's FMA peak on 2
//! threads is 172–182 GFLOP/s;
//! `results/bench/kernel-ab/openblas-backward-vs-gemm-2026-11-26/`). The
//! backward is two thirds of a training step's products.
//!
//! Why only the backward: OpenBLAS's f32 kernels sum a row's products in
//! an order that depends on the rows beside it (the row count and the
//! row's place among them: 1–7 × 10⁻⁵ apart on SmolLM2's shapes), where
//! gemm's and AMX's do not. The forward's log-probs must not: a scoring
//! pass runs the LM head a chunk of rows at a time and must equal the
//! training pass bit for bit, and `r2vpo serve --rescore-logprobs` must
//! equal the learner's recomputation of another batch (with OpenBLAS in
//! the forward, 1.9 × 10⁻⁵ apart). Gradients carry no such contract. On
//! AMX CPUs everything stays as measured there (AMX forward, gemm backward).
//!
//! The library is SciPy's build of OpenBLAS (PyPI `scipy-openblas32`,
//! pinned in `deps.toml`, unpacked by `make deps` into
//! `.deps/openblas/lib`): `DYNAMIC_ARCH`, so it picks its kernels for the
//! CPU when it loads. It is loaded at run time rather than linked, so a
//! binary without it (a GPU build carried elsewhere, a checkout without
//! `make deps`) still runs, on gemm; [`crate::dispatch::path`] says which, and `r2vpo
//! bench` and `llm train` print it. Where it is looked for, first found
//! wins: `R2VPO_OPENBLAS` (a path to the `.so`; then only there),
//! `libscipy_openblas.so` beside the executable, this checkout's
//! `.deps/openblas/lib`. Which products it runs is [`crate::dispatch`]' table
//! (`R2VPO_MATMUL`).
//!
//! OpenBLAS's own threads are set to one and the product is split over
//! rayon's pool instead: every pass runs on that pool (`r2vpo-llm`'s `model::on_pool`),
//! and OpenBLAS's workers spin for a while after each call, on the same
//! two cores as rayon's.

use std::ffi::{c_char, c_int, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

use rayon::prelude::*;

/// `cblas_sgemm`'s signature (order, transa, transb, m, n, k, α, a, lda, b,
/// ldb, β, c, ldc).
type Sgemm = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    f32,
    *mut f32,
    c_int,
);

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

/// The loaded library: its `sgemm` and the kernel family it picked.
struct Blas {
    sgemm: Sgemm,
    core: String,
    /// Keeps the library mapped for `sgemm`'s lifetime (the process's).
    _lib: libloading::Library,
}

/// Where the library is looked for, in order (module doc).
fn candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("R2VPO_OPENBLAS") {
        return vec![PathBuf::from(p)];
    }
    let mut c = Vec::new();
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(PathBuf::from)) {
        c.push(dir.join("libscipy_openblas.so"));
    }
    c.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/openblas/lib/libscipy_openblas.so"));
    c
}

/// Loads the library from `path` and sets it to one thread.
fn load(path: &std::path::Path) -> Result<Blas, String> {
    // SAFETY: loading runs the library's initialisers; SciPy's OpenBLAS
    // only detects the CPU and sets up its buffers there. The symbols are
    // looked up with the types of its `cblas.h` / `openblas_config.h`.
    unsafe {
        let lib = libloading::Library::new(path).map_err(|e| e.to_string())?;
        let sgemm = *lib.get::<Sgemm>(b"scipy_cblas_sgemm\0").map_err(|e| e.to_string())?;
        let threads =
            *lib.get::<unsafe extern "C" fn(c_int)>(b"scipy_openblas_set_num_threads\0").map_err(|e| e.to_string())?;
        let corename = *lib
            .get::<unsafe extern "C" fn() -> *const c_char>(b"scipy_openblas_get_corename\0")
            .map_err(|e| e.to_string())?;
        threads(1);
        let name = corename();
        let core = if name.is_null() { "?".into() } else { CStr::from_ptr(name).to_string_lossy().into_owned() };
        Ok(Blas { sgemm, core, _lib: lib })
    }
}

/// The library, loaded on first use (only where [`crate::dispatch`] asks
/// for it); `None` where no candidate loads.
fn blas() -> Option<&'static Blas> {
    static B: OnceLock<Option<Blas>> = OnceLock::new();
    B.get_or_init(|| {
        let explicit = std::env::var_os("R2VPO_OPENBLAS").is_some();
        for path in candidates() {
            if !explicit && !path.exists() {
                continue;
            }
            match load(&path) {
                Ok(b) => return Some(b),
                // A path the user named that does not load is worth a line;
                // the defaults' absence is the normal case of a bare binary.
                Err(e) => eprintln!("r2vpo: OpenBLAS at {} did not load ({e}); products run on gemm", path.display()),
            }
        }
        None
    })
    .as_ref()
}

/// Whether the library loads here (loading it on first call).
pub fn loads() -> bool {
    blas().is_some()
}

/// OpenBLAS's name for the kernel family it picked for this CPU
/// (`Haswell`, `SkylakeX`, …), or `None` where it does not load.
pub fn core() -> Option<&'static str> {
    blas().map(|b| b.core.as_str())
}

/// An operand for [`sgemm`]: its data and `[column stride, row stride]`.
pub type Operand<'a> = (&'a [f32], [isize; 2]);

/// CBLAS's transpose flag and leading dimension for a `(rows, cols)`
/// operand with these strides ([`crate::avx2::Layout::of`]'s reading), or
/// `None` when neither stride is 1 (or the other is too small for CBLAS).
fn layout(s: [isize; 2], rows: usize, cols: usize) -> Option<(c_int, usize)> {
    Some(match crate::avx2::Layout::of(s, rows, cols)? {
        crate::avx2::Layout::Rows(ld) => (NO_TRANS, ld),
        crate::avx2::Layout::Cols(ld) => (TRANS, ld),
    })
}

/// `lhs (m, k) · rhs (k, n)` into a new row-major `(m, n)` on OpenBLAS,
/// split over rayon's threads (along whichever of `m` and `n` is larger);
/// `None` where OpenBLAS is not in use, a dimension does not fit a C
/// `int`, or an operand has no unit stride. Splitting narrows `m` or `n`
/// only, so each element is summed over `k` in the kernel's order
/// whichever block it falls in.
pub fn sgemm([m, k, n]: [usize; 3], (a, sa): Operand, (b, sb): Operand) -> Option<Vec<f32>> {
    let blas = blas()?;
    let fits = |v: usize| v <= c_int::MAX as usize;
    if m == 0 || n == 0 || k == 0 || ![m, k, n].into_iter().all(fits) {
        return None;
    }
    let (ta, lda) = layout(sa, m, k)?;
    let (tb, ldb) = layout(sb, k, n)?;
    if !fits(lda) || !fits(ldb) || !fits(n) {
        return None;
    }
    // Where (row, col) of each operand lies in its slice.
    let at = |s: [isize; 2], r: usize, c: usize| r as isize * s[1] + c as isize * s[0];
    let last = |s: [isize; 2], r: usize, c: usize| at(s, r - 1, c - 1) as usize;
    assert!(
        last(sa, m, k) < a.len() && last(sb, k, n) < b.len(),
        "openblas::sgemm: operands shorter than their shapes"
    );
    let mut y = Vec::<f32>::with_capacity(m * n);
    let out = crate::Shared(y.as_mut_ptr());
    // Blocks of 64 rows or columns (a multiple of every OpenBLAS f32
    // kernel's unroll), as even as that allows.
    // At most 32 blocks: OpenBLAS keeps a fixed table of per-call buffers
    // (2 × its MAX_THREADS, 64 in SciPy's build) and aborts the process when
    // more calls than that run at once.
    let threads = rayon::current_num_threads().clamp(1, 32);
    let along_n = n >= m;
    let len = if along_n { n } else { m };
    let per = len.div_ceil(threads).next_multiple_of(64);
    let blocks: Vec<(usize, usize)> = (0..len).step_by(per).map(|s| (s, (s + per).min(len))).collect();
    let run = |&(s, e): &(usize, usize)| {
        let (mm, nn) = if along_n { (m, e - s) } else { (e - s, n) };
        let (pa, pb, pc) = if along_n {
            (a.as_ptr(), b[at(sb, 0, s) as usize..].as_ptr(), out.ptr().wrapping_add(s))
        } else {
            (a[at(sa, s, 0) as usize..].as_ptr(), b.as_ptr(), out.ptr().wrapping_add(s * n))
        };
        // SAFETY: the assert above keeps every element OpenBLAS reads
        // inside `a` and `b` (a block only narrows one dimension of one
        // operand); the block of `y` it writes, rows or columns `s..e` with
        // row stride n, is inside y's m·n capacity and no other block's.
        // With β = 0 OpenBLAS writes every element without reading it.
        unsafe {
            (blas.sgemm)(
                ROW_MAJOR,
                ta,
                tb,
                mm as c_int,
                nn as c_int,
                k as c_int,
                1.0,
                pa,
                lda as c_int,
                pb,
                ldb as c_int,
                0.0,
                pc,
                n as c_int,
            )
        };
    };
    if blocks.len() == 1 {
        run(&blocks[0]);
    } else {
        blocks.par_iter().for_each(run);
    }
    // SAFETY: the blocks cover rows (or columns) 0..len once, so all m·n
    // values are written.
    unsafe { y.set_len(m * n) };
    Some(y)
}
