//! The linear layer `x · wᵀ`, and the small-row kernel that decode-sized inputs run on without repacking the weights.

use super::*;

/// `x · wᵀ` by the small-row kernel (few rows, f32, CPU), differentiable.
struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "r2vpo-linear"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        let ((m, k), (o, k2)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        if k != k2 {
            return Err(Error::Msg(format!("{n}: x (…, {k}) against w ({o}, {k2})")));
        }
        let (x, w) = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(w)) => (contiguous(x, l1, n)?, contiguous(w, l2, n)?),
            _ => return Err(unsupported(n, s1)),
        };
        let y = linear_fwd(x, m, k, w, o)?;
        Ok((CpuStorage::F32(y), Shape::from((m, o))))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // A frozen weight (a LoRA base) records nothing: its gradient, the
        // backward's largest product, is not computed.
        let dx = if x.track_op() { Some(matmul(g, w)?) } else { None };
        let dw = if w.track_op() { Some(matmul(&g.t()?, x)?) } else { None };
        Ok((dx, dw))
    }
}

/// `x (m, k) · w (o, k)ᵀ` on the kernel [`linear`]'s forward picks for
/// these shapes on this CPU.
fn linear_fwd(x: &[f32], m: usize, k: usize, w: &[f32], o: usize) -> Result<Vec<f32>> {
    Ok(if r2vpo_kernels::dispatch::reference() {
        let mut y = Vec::with_capacity(m * o);
        y.resize(m * o, 0.0);
        // wᵀ as a (k, o) operand: row stride 1, column stride k.
        r2vpo_kernels::product([m, k, o], (x, (k, 1)), (w, (1, k)), &mut y, o, false);
        y
    } else if r2vpo_kernels::small_gemm::takes(m) {
        r2vpo_kernels::small_gemm::linear(x, m, k, &[(w, o)]).into_iter().next().expect("one weight")
    } else if r2vpo_kernels::dispatch::on_amx() && m <= r2vpo_kernels::amx::FEW_ROWS {
        r2vpo_kernels::amx::linear_few(x, m, k, w, o)
    } else if r2vpo_kernels::dispatch::on_amx() {
        r2vpo_kernels::amx::linear(x, m, k, w, o).map_err(Error::Msg)?
    } else if r2vpo_kernels::dispatch::on_avx2() {
        r2vpo_kernels::avx2::linear(x, m, k, w, o).map_err(Error::Msg)?
    } else {
        // wᵀ as gemm's (k, o) right-hand side: row stride 1, column stride k.
        gemm_uninit([m, k, o], (x, [1, k as isize]), (w, [k as isize, 1]))
    })
}

/// A LoRA projection in one op, `x·Wᵀ + s·(x·Aᵀ)·Bᵀ` with `W` frozen
/// (held by the op, never differentiated) and `A`, `B` learning: the
/// graph keeps its output alone, where `linear` + low-rank product + sum
/// as separate ops keep three `(rows, out)` tensors per projection
/// (measured on SmolLM2-135M at 4 × 172 tokens, all seven projections
/// adapted: the forward's peak resident set 2.96 GiB composed, against
/// 2.20 GiB for full fine-tuning's graph).
struct LoraLinear {
    w: Tensor,
    scale: f64,
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "r2vpo-lora-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        let ((m, k), (r, ka), (o, rb)) = (l1.shape().dims2()?, l2.shape().dims2()?, l3.shape().dims2()?);
        let (wo, kw) = self.w.dims2()?;
        if (ka, kw, rb, wo) != (k, k, r, o) {
            return Err(Error::Msg(format!(
                "{n}: x (…, {k}), W ({wo}, {kw}), A ({r}, {ka}), B ({o}, {rb}) do not chain"
            )));
        }
        let (x, a, b) = match (s1, s2, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(a), CpuStorage::F32(b)) => {
                (contiguous(x, l1, n)?, contiguous(a, l2, n)?, contiguous(b, l3, n)?)
            }
            _ => return Err(unsupported(n, s1)),
        };
        let (wg, wl) = self.w.storage_and_layout();
        let w = f32_data(&wg, wl, n)?;
        let mut y = linear_fwd(x, m, k, w, o)?;
        // The scale goes on the (m, r) product, the smallest.
        let mut u = linear_fwd(x, m, k, a, r)?;
        let s = self.scale as f32;
        u.iter_mut().for_each(|v| *v *= s);
        let low = linear_fwd(&u, m, r, b, o)?;
        y.iter_mut().zip(&low).for_each(|(y, l)| *y += l);
        Ok((CpuStorage::F32(y), Shape::from((m, o))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // With u = x·Aᵀ and gB = g·B: dx = g·W + s·gB·A, dA = s·gBᵀ·x,
        // dB = s·gᵀ·u.
        let gb = (matmul(g, b)? * self.scale)?;
        let dx = if x.track_op() { Some((matmul(g, &self.w)? + matmul(&gb, a)?)?) } else { None };
        let da = if a.track_op() { Some(matmul(&gb.t()?, x)?) } else { None };
        let db = if b.track_op() {
            let u = (matmul(x, &a.t()?)? * self.scale)?;
            Some(matmul(&g.t()?, &u)?)
        } else {
            None
        };
        Ok((dx, da, db))
    }
}

/// `x·wᵀ + s·(x·aᵀ)·bᵀ`, a LoRA projection (Hu et al. 2021, eq. 3) whose
/// base `w` is frozen: no gradient reaches `w`. On f32 CPU tensors one op
/// (its graph keeps only the output); elsewhere the composite of
/// [`linear`]s.
pub fn lora_linear(x: &Tensor, w: &Tensor, a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    let f32_2d = |t: &Tensor| t.dtype() == DType::F32 && t.rank() == 2 && t.device().is_cpu();
    if fused_ok(x) && [x, w, a, b].into_iter().all(f32_2d) {
        x.contiguous()?.apply_op3(&a.contiguous()?, &b.contiguous()?, LoraLinear { w: w.detach().contiguous()?, scale })
    } else {
        linear(x, &w.detach())? + linear(&linear(x, a)?.affine(scale, 0.0)?, b)?
    }
}

/// `a · b` for two 2-D tensors, the backward's products: on f32 CPU
/// tensors, the AVX2 kernel where it runs the forward ([`r2vpo_kernels::avx2`];
/// up to [`r2vpo_kernels::avx2::WHOLE_A_MAX`] values of `a`, so every layer's
/// products but not the LM head's), else OpenBLAS where it is in use
/// ([`r2vpo_kernels::openblas`]), else gemm called exactly as candle's matmul calls
/// it (so the same values, bit for bit) into an output that is not
/// zero-filled first; elsewhere candle's matmul.
pub(super) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let cpu_f32 = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32 && t.rank() == 2;
    if !(cpu_f32(a) && cpu_f32(b)) {
        return a.matmul(b);
    }
    let ((m, k), (k2, n)) = (a.dims2()?, b.dims2()?);
    if k != k2 {
        return a.matmul(b); // candle's shape error
    }
    let (ag, al) = a.storage_and_layout();
    let (bg, bl) = b.storage_and_layout();
    let (ad, bd) = (f32_storage(&ag, "r2vpo-matmul")?, f32_storage(&bg, "r2vpo-matmul")?);
    let stride = |l: &Layout| [l.stride()[1] as isize, l.stride()[0] as isize];
    let (lhs, rhs) = ((&ad[al.start_offset()..], stride(al)), (&bd[bl.start_offset()..], stride(bl)));
    if r2vpo_kernels::dispatch::reference() {
        let mut y = vec![0f32; m * n];
        let rc = |s: [isize; 2]| (s[1] as usize, s[0] as usize);
        r2vpo_kernels::product([m, k, n], (lhs.0, rc(lhs.1)), (rhs.0, rc(rhs.1)), &mut y, n, false);
        return Tensor::from_vec(y, (m, n), a.device());
    }
    // OpenBLAS's rows depend on the rows beside them, which gradients may
    // (the forward's log-probs may not: scoring must equal training bit
    // for bit); the AVX2 kernel ran the layers' gradients faster in a step
    // (`avx2.rs`).
    if r2vpo_kernels::dispatch::on_avx2() && m * k <= r2vpo_kernels::avx2::WHOLE_A_MAX {
        if let (Some(la), Some(lb)) =
            (r2vpo_kernels::avx2::Layout::of(lhs.1, m, k), r2vpo_kernels::avx2::Layout::of(rhs.1, k, n))
        {
            let y = r2vpo_kernels::avx2::product([m, k, n], (lhs.0, la), (rhs.0, lb)).map_err(Error::Msg)?;
            return Tensor::from_vec(y, (m, n), a.device());
        }
    }
    let blas = if r2vpo_kernels::dispatch::backward_blas() {
        r2vpo_kernels::openblas::sgemm([m, k, n], lhs, rhs)
    } else {
        None
    };
    let y = blas.unwrap_or_else(|| gemm_uninit([m, k, n], lhs, rhs));
    Tensor::from_vec(y, (m, n), a.device())
}

/// `lhs (m, k) · rhs (k, n)` into a new row-major `(m, n)`, each operand
/// given as its data and `[column stride, row stride]`.
///
/// Why not candle's matmul: it zero-fills its output before gemm
/// overwrites all of it (`read_dst = false`); those memsets were 6 % of a
/// scoring pass and of a training step (perf, SmolLM2 at 8 × 300 tokens).
/// The gemm call is candle 0.11's own (α 0, β 1, the same parallelism), so
/// results are unchanged bit for bit (the pinned trainer run is).
fn gemm_uninit(
    [m, k, n]: [usize; 3],
    (lhs, [lcs, lrs]): (&[f32], [isize; 2]),
    (rhs, [rcs, rrs]): (&[f32], [isize; 2]),
) -> Vec<f32> {
    let last = |[r, c]: [usize; 2], [cs, rs]: [isize; 2]| (r.max(1) - 1) as isize * rs + (c.max(1) - 1) as isize * cs;
    assert!(
        m * k == 0
            || (last([m, k], [lcs, lrs]) as usize) < lhs.len() && (last([k, n], [rcs, rrs]) as usize) < rhs.len(),
        "gemm_uninit: operands shorter than their shapes"
    );
    if m * n == 0 {
        return Vec::new();
    }
    if k == 0 {
        return vec![0.0; m * n];
    }
    let threads = candle_core::utils::get_num_threads();
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    let mut y = Vec::<f32>::with_capacity(m * n);
    // SAFETY: the operands' extents were checked above; `y` has room for
    // m·n values, gemm writes every one of them without reading any
    // (`read_dst = false`), and only then is the length set.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            lcs,
            lrs,
            rhs.as_ptr(),
            rcs,
            rrs,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
        y.set_len(m * n);
    }
    y
}

/// Rows at or below which [`linear`] may run a few-row kernel (decode
/// steps and short prefills: up to 32 rows on the f32 small-row kernel, up
/// to [`r2vpo_kernels::amx::FEW_ROWS`] on AMX's); above it AMX's or AVX2's
/// many-row kernel or gemm, which sum in another order.
pub const SMALL_ROWS: usize = r2vpo_kernels::amx::FEW_ROWS;

/// `x (M, K) · w (N, K)ᵀ`, differentiable: a linear layer with the weight
/// as checkpoints store it. Up to 32 rows of f32 on a CPU with AVX2 or
/// AVX-512 (every decode step) it runs without repacking `w`, on AMX from
/// 16 rows where the CPU has it; on AMX up to 64 rows (a short prompt's
/// prefill) run as 32-row blocks of that kernel; more rows run on AMX where the CPU has it
/// ([`r2vpo_kernels::amx`]: f32 products from split bf16 pieces), on AVX2 CPUs
/// without AVX-512 on [`r2vpo_kernels::avx2`]'s kernel, else gemm as candle's
/// matmul does, without zero-filling the output first. Every many-row path
/// sums a row independently of the rows beside it. The backward's products run on
/// OpenBLAS where it is in use ([`r2vpo_kernels::openblas`]), else gemm; other dtypes and devices use candle's matmul. The kernels sum in
/// different orders, so they agree to f32 rounding, not bit for bit
/// (tested).
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let f32_2d = |t: &Tensor| t.dtype() == DType::F32 && t.rank() == 2 && t.device().is_cpu();
    if fused_ok(x) && f32_2d(x) && f32_2d(w) {
        x.contiguous()?.apply_op2(&w.contiguous()?, Linear)
    } else if bf16_weight(x, w) {
        Ok(linear_bf16w(&x.contiguous()?, &[&w.contiguous()?])?.remove(0))
    } else if x.dtype() == DType::F32 && w.dtype() == DType::BF16 {
        // A graph through a bf16 weight (never in r2vpo's own paths): the
        // widened weight, differentiable.
        x.matmul(&w.to_dtype(DType::F32)?.t()?)
    } else {
        x.matmul(&w.t()?)
    }
}

/// Whether `x · wᵀ` is an inference product of an f32 input with a bf16
/// weight on the CPU ([`r2vpo_kernels::bf16w`]): nothing records a
/// gradient through it.
fn bf16_weight(x: &Tensor, w: &Tensor) -> bool {
    x.dtype() == DType::F32
        && w.dtype() == DType::BF16
        && x.rank() == 2
        && w.rank() == 2
        && x.device().is_cpu()
        && w.device().is_cpu()
        && !x.track_op()
        && !w.track_op()
        && !composites_only()
}

/// `[x · w₁ᵀ, …]` for an f32 `x` and bf16 weights, in one parallel pass of
/// [`r2vpo_kernels::bf16w::linear`] (contiguous operands).
fn linear_bf16w(x: &Tensor, ws: &[&Tensor]) -> Result<Vec<Tensor>> {
    let name = "r2vpo-linear-bf16w";
    let (m, k) = x.dims2()?;
    let (xs, xl) = x.storage_and_layout();
    let xv = f32_data(&xs, xl, name)?;
    let guards: Vec<_> = ws.iter().map(|w| w.storage_and_layout()).collect();
    let mut wv = Vec::with_capacity(ws.len());
    for ((g, l), w) in guards.iter().zip(ws) {
        let (n, k2) = w.dims2()?;
        if k2 != k {
            return Err(Error::Msg(format!("{name}: x (…, {k}) against w {:?}", w.dims())));
        }
        let data = match &**g {
            candle_core::Storage::Cpu(CpuStorage::BF16(d)) => contiguous(d, l, name)?,
            _ => return Err(Error::Msg(format!("{name}: bf16 CPU weights only"))),
        };
        // SAFETY: `half::bf16` is `#[repr(transparent)]` over its `u16`
        // bits, so the slice reinterprets in place with the same length.
        let bits = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u16>(), data.len()) };
        wv.push((bits, n));
    }
    let outs = r2vpo_kernels::bf16w::linear(xv, m, k, &wv);
    outs.into_iter().zip(&wv).map(|(o, &(_, n))| Tensor::from_vec(o, (m, n), x.device())).collect()
}

/// Whether `x · wᵀ` for these weights goes to the small-row kernel.
fn small_ok(x: &Tensor, ws: &[&Tensor]) -> Result<bool> {
    Ok(x.rank() == 2
        && r2vpo_kernels::small_gemm::takes(x.dim(0)?)
        && fused_ok(x)
        && x.dtype() == DType::F32
        && ws.iter().all(|w| w.dtype() == DType::F32 && w.rank() == 2))
}

/// [`linear`] of one input by several weights, `[x · w₁ᵀ, x · w₂ᵀ, …]`
/// (q, k and v; gate and up). Where nothing records a gradient (every
/// decode step) the small-row kernel runs them in one parallel pass;
/// otherwise each is a [`linear`], with the same values to f32 rounding.
pub fn linear_many(x: &Tensor, ws: &[&Tensor]) -> Result<Vec<Tensor>> {
    if ws.iter().all(|w| bf16_weight(x, w)) && !ws.is_empty() {
        let ws: Vec<Tensor> = ws.iter().map(|w| w.contiguous()).collect::<Result<_>>()?;
        return linear_bf16w(&x.contiguous()?, &ws.iter().collect::<Vec<_>>());
    }
    if !small_ok(x, ws)? || x.track_op() || ws.iter().any(|w| w.track_op()) {
        return ws.iter().map(|w| linear(x, w)).collect();
    }
    let x = x.contiguous()?;
    let ws: Vec<Tensor> = ws.iter().map(|w| w.contiguous()).collect::<Result<_>>()?;
    let (m, k) = x.dims2()?;
    let (xs, xl) = x.storage_and_layout();
    let guards: Vec<_> = ws.iter().map(|w| w.storage_and_layout()).collect();
    let name = "r2vpo-linear-many";
    let xv = f32_data(&xs, xl, name)?;
    let mut wv = Vec::with_capacity(ws.len());
    for ((g, l), w) in guards.iter().zip(&ws) {
        if w.dim(1)? != k {
            return Err(Error::Msg(format!("{name}: x (…, {k}) against w {:?}", w.dims())));
        }
        wv.push((f32_data(g, l, name)?, w.dim(0)?));
    }
    let outs = r2vpo_kernels::small_gemm::linear(xv, m, k, &wv);
    outs.into_iter().zip(&wv).map(|(o, &(_, n))| Tensor::from_vec(o, (m, n), x.device())).collect()
}
