//! Which CPU kernel runs each kind of the LLM learner's and sampler's f32
//! products: the one table, read by every product in `r2vpo-llm`'s
//! `model::ops`, by [`crate::small_gemm`], [`crate::amx`],
//! [`crate::avx2`] and [`crate::openblas`]. (The control networks' smaller
//! table is [`control`].)
//!
//! The table asks the kernels' modules what this CPU can run (never the
//! reverse, so the decision lives here alone). The choice is
//! `crate::matmul()` (`R2VPO_MATMUL`, or
//! `crate::set_matmul`); what each choice means on this crate's
//! products:
//!
//! | choice      | many-row forward | backward (gradients)                 | few rows (≤ 32, decode) | decode attention |
//! |-------------|------------------|--------------------------------------|-------------------------|------------------|
//! | `auto`      | AMX, else AVX2 kernel on AVX2 CPUs without AVX-512, else gemm | AVX2 kernel where it runs the forward (the layers'), OpenBLAS where it loads and AMX is off, else gemm | AMX from 16 rows where it runs, else the small-row SIMD kernel on AVX2/AVX-512 | SIMD |
//! | `reference` | `crate::product` | `crate::product`   | `crate::product` | portable loop |
//! | `gemm`      | gemm             | gemm                                 | small-row kernel        | SIMD |
//! | `openblas`  | gemm             | OpenBLAS (must load)                 | small-row kernel        | SIMD |
//! | `avx2`      | AVX2 kernel (needs AVX2 + FMA; also on AVX-512 CPUs) | AVX2 kernel for the layers, OpenBLAS (where it loads) or gemm for the LM head | small-row kernel | SIMD |
//! | `amx`       | AMX (must be granted) | gemm                            | AMX from 16 rows        | SIMD |
//!
//! `auto` is the dispatch every measurement in `docs/cpu-speed.md` was made on;
//! `reference` gives the same bits on every CPU (the pinned trainer runs
//! on it); the others exist so that each kernel a CPU can run is tested
//! and timed there, whatever `auto` picks.

use crate::Matmul;

/// The kernel of the learner's and the scoring pass's many-row products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// `crate::product`.
    Reference,
    /// [`crate::amx`].
    Amx,
    /// [`crate::avx2`].
    Avx2,
    /// The `gemm` crate, called as candle's matmul calls it.
    Gemm,
}

/// Why `m` cannot run here, or `None` if it can: `amx` without AMX, `avx2`
/// without AVX2 and FMA, `openblas` where the library does not load.
pub fn unsupported(m: Matmul) -> Option<String> {
    let why = match m {
        Matmul::Amx if !crate::amx::hardware() => "this CPU or kernel grants no AMX tiles",
        Matmul::Avx2 if !crate::avx2::runs() => "this CPU lacks AVX2 and FMA (or the build has no AVX2 kernel)",
        Matmul::OpenBlas if !crate::openblas::loads() => {
            "OpenBLAS did not load (run `make deps`, or set R2VPO_OPENBLAS)"
        }
        _ => return None,
    };
    Some(format!("{}={m}: {why}", crate::ENV))
}

/// The current choice, refusing one this machine cannot run (a panic with
/// [`unsupported`]'s message; programs check [`check`] first).
fn choice() -> Matmul {
    let m = crate::matmul();
    if let Some(e) = unsupported(m) {
        panic!("{e}");
    }
    m
}

/// `R2VPO_MATMUL` read and checked against this machine: the error names
/// the variable, the value and why it cannot run. For programs to call
/// before any work.
pub fn check() -> Result<(), String> {
    let m = crate::from_env()?;
    unsupported(m).map_or(Ok(()), Err)
}

/// Every choice this machine can run, `auto` first: what the pinned
/// trainer's kernel check runs here.
pub fn runnable() -> Vec<Matmul> {
    Matmul::ALL.into_iter().filter(|&m| unsupported(m).is_none()).collect()
}

/// The many-row forward's kernel now.
pub fn forward() -> Forward {
    match choice() {
        Matmul::Reference => Forward::Reference,
        Matmul::Gemm | Matmul::OpenBlas => Forward::Gemm,
        Matmul::Avx2 => Forward::Avx2,
        Matmul::Amx => Forward::Amx,
        Matmul::Auto if crate::amx::hardware() => Forward::Amx,
        Matmul::Auto if crate::avx2::runs() && !crate::has_avx512f() => Forward::Avx2,
        Matmul::Auto => Forward::Gemm,
    }
}

/// Whether the many-row forward runs on AMX now.
pub fn on_amx() -> bool {
    forward() == Forward::Amx
}

/// Whether the many-row forward (and the layers' backward) runs on the
/// AVX2 kernel now.
pub fn on_avx2() -> bool {
    forward() == Forward::Avx2
}

/// Whether the backward's products that the AVX2 kernel does not take run
/// on OpenBLAS now.
pub fn backward_blas() -> bool {
    match choice() {
        Matmul::Reference | Matmul::Gemm | Matmul::Amx => false,
        Matmul::OpenBlas | Matmul::Avx2 => crate::openblas::loads(),
        Matmul::Auto => forward() != Forward::Amx && crate::openblas::loads(),
    }
}

/// Whether products of up to `small_gemm`'s 32 rows run on its
/// SIMD kernel (and on AMX's from 16 rows where the forward is on AMX).
pub fn few_rows() -> bool {
    choice() != Matmul::Reference && crate::has_avx2_fma()
}

/// Whether every product and the decode attention run on the reference
/// arithmetic.
pub fn reference() -> bool {
    choice() == Matmul::Reference
}

/// The kernels behind the many-row f32 products now, for logs and result
/// files: `"reference"`; `"amx"` (forward on AMX, backward on gemm);
/// otherwise the forward's, `"avx2"` or `"gemm-<simd>"` (`avx512`, `avx2`
/// or `other`: the widest kernels gemm picks here), followed by
/// `"+openblas-<core>"` where the backward runs on OpenBLAS's kernel family
/// for this CPU (lower case: `haswell`, `skylakex`, …).
pub fn path() -> String {
    let forward = match forward() {
        Forward::Reference => return "reference".into(),
        Forward::Amx => return "amx".into(),
        Forward::Avx2 => "avx2".into(),
        Forward::Gemm => format!("gemm-{}", crate::gemm_simd()),
    };
    match if backward_blas() { crate::openblas::core() } else { None } {
        Some(core) => format!("{forward}+openblas-{}", core.to_lowercase()),
        None => forward,
    }
}

/// The control networks' table (`r2vpo-control`'s policy and value
/// networks): the same `R2VPO_MATMUL` choice, read here beside the LLM
/// table so that one module decides every product's kernel.
pub mod control {
    /// The kernel that runs the networks' products.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kernel {
        /// [`crate::product`]: the same bits on every CPU.
        Reference,
        /// [`crate::avx2`], the LLM learner's AVX2 + FMA kernel.
        Avx2,
        /// The `gemm` crate at its widest SIMD level for this CPU.
        Gemm,
    }

    /// The kernel for `R2VPO_MATMUL`'s current choice: the one table of the
    /// control networks' products.
    ///
    /// | choice | products |
    /// |---|---|
    /// | `auto` | gemm |
    /// | `reference` | [`crate::product`] |
    /// | `avx2` | the AVX2 kernel (needs AVX2 + FMA) |
    /// | `gemm`, `openblas`, `amx` | gemm (OpenBLAS and AMX run only the LLM learner's products) |
    ///
    /// Why gemm under `auto`: `r2vpo bench control` measures the learner on
    /// both kernels in one run, and on a 2-core AMD EPYC (Zen 3) the AVX2
    /// kernel ran the paper's 256 × 5 networks level with gemm (0.98–1.01× at
    /// 960-row minibatches, 2 threads) and `cpu.toml`'s 2 × 64 ones at 0.91×
    /// (128 rows), where the products are too small for its blocking
    /// (`results/bench/control-learner/` in the repository). On AVX-512 and AMX CPUs gemm's
    /// AVX-512 kernels run. Both kernels' outputs keep each row's sums apart
    /// from the rows beside it, so a rollout's action log-probs are the
    /// learner's first recomputation of them whatever the batch. Panics under
    /// `R2VPO_MATMUL=avx2` on a CPU that cannot run it (the CLI refuses that
    /// value first).
    pub fn kernel() -> Kernel {
        use crate::Matmul;
        match crate::matmul() {
            Matmul::Reference => Kernel::Reference,
            Matmul::Avx2 if !crate::avx2::runs() => {
                panic!("{}=avx2: this CPU lacks AVX2 and FMA (or the build has no AVX2 kernel)", crate::ENV)
            }
            Matmul::Avx2 => Kernel::Avx2,
            Matmul::Auto | Matmul::Gemm | Matmul::OpenBlas | Matmul::Amx => Kernel::Gemm,
        }
    }

    /// The kernels behind the networks' products now, for logs and result
    /// files: `"reference"`, `"avx2"`, or `"gemm-<simd>"` (the widest kernels
    /// the `gemm` crate picks here).
    pub fn kernel_path() -> String {
        match kernel() {
            Kernel::Reference => "reference".into(),
            Kernel::Avx2 => "avx2".into(),
            Kernel::Gemm => format!("gemm-{}", crate::gemm_simd()),
        }
    }
}
