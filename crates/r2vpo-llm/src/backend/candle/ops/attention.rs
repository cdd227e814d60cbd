//! Training attention that keeps no score matrix, with its backward.

use super::*;

/// Query rows per block of [`attention`]: keys after the last one any row
/// of the block sees are skipped, so a causal pass of `T` rows computes
/// about `(T + ROWS) / 2T` of the full scores (SmolLM2's step, T = 300:
/// 0.61 at 64 rows, 0.58 at 48). Smaller blocks skip more but give the
/// products thinner shapes. Timed inside a SmolLM2 step
/// (`results/bench/kernel-ab/avx2-backward-vs-openblas-2026-11-27/`), the
/// attention's forward + backward: on gemm 32, 64, 128 and 300 rows 0.49 + 1.08, 0.47 + 1.05, 0.52 + 1.15
/// and 0.65 + 1.57 s; on the AVX2 kernel 48, 60, 64 and 96 rows 0.40 +
/// 0.91, 0.44 + 0.92, 0.43 + 1.01 and 0.46 + 0.98 s (48: a multiple of its
/// 6-row tile). The block changes a score's bits (the products' shapes), so
/// the gemm and AMX paths keep the 64 their pinned runs were recorded with.
fn attention_rows() -> usize {
    if r2vpo_kernels::dispatch::on_avx2() {
        48
    } else {
        64
    }
}

/// An additive mask entry at or below this hides its key. The model's mask
/// uses −1e9; any score plus −1e4 is far past where `exp` reaches zero, so
/// skipping such keys (rather than adding the mask and exponentiating)
/// leaves every softmax unchanged.
const HIDDEN: f64 = -1e4;

/// Scaled-dot-product attention, differentiable, that keeps no `(T × TK)`
/// tensor: `q (B, Hkv, G·T, D)` already scaled (the G query heads sharing a
/// kv head stacked as `G·T` rows of `T` queries each), `k, v (B, Hkv, TK,
/// D)`, additive `mask (B, 1, 1, T, TK)` (0 or ≤ −1e4). Returns `(B, Hkv,
/// G·T, D)`, `softmax(q·kᵀ + mask)·v`.
///
/// On the CPU in f32/f64 it is one op whose backward recomputes the scores
/// a block of query rows at a time (FlashAttention's recomputation, Dao et
/// al. 2022, without its tiling of the keys: a block's `64 × TK` scores fit
/// in L2), so the graph keeps only `q`, `k`, `v` and the output. The
/// composite it replaces kept three `(B, H, T, TK)` tensors per layer
/// (scores, masked scores, probabilities): 78 MB a layer, 2.3 GB for
/// SmolLM2's step at 8 × 300 tokens. Blocks also skip the keys that the
/// causal mask hides from all their rows. Elsewhere (another device or
/// dtype, [`with_composites`]) it is [`attention_composite`].
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, t: usize) -> Result<Tensor> {
    let same = [k, v, mask].iter().all(|x| x.dtype() == q.dtype() && x.device().is_cpu());
    if !(fused_ok(q) && same) {
        return attention_composite(q, k, v, mask, t);
    }
    attention_dims(q, k, v, mask, t)?;
    // Views with a unit last stride (the KV cache's) are read in place.
    let rows = |x: &Tensor| if x.stride()[3] == 1 { Ok(x.clone()) } else { x.contiguous() };
    q.contiguous()?.apply_op3(&rows(k)?, &rows(v)?, Attention { mask: mask.contiguous()?, t })
}

/// Reference attention from candle ops: scores, mask, softmax, weighted sum.
pub fn attention_composite(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, t: usize) -> Result<Tensor> {
    let (b, hk, g, _, tk, _) = attention_dims(q, k, v, mask, t)?;
    let scores = q.matmul(&k.t()?)?.reshape((b, hk, g, t, tk))?.broadcast_add(mask)?;
    softmax_last_dim(&scores)?.reshape((b, hk, g * t, tk))?.matmul(v)
}

/// `(B, Hkv, G, T, TK, D)` of an attention's operands, or an error naming
/// their shapes.
fn attention_dims(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    t: usize,
) -> Result<(usize, usize, usize, usize, usize, usize)> {
    let (b, hk, gt, d) = q.dims4()?;
    let tk = k.dim(2)?;
    if t == 0
        || gt % t != 0
        || k.dims4()? != (b, hk, tk, d)
        || v.dims4()? != (b, hk, tk, d)
        || mask.dims() != [b, 1, 1, t, tk]
    {
        return Err(Error::Msg(format!(
            "attention: q {:?}, k {:?}, v {:?}, mask {:?} for {t} queries a row",
            q.dims(),
            k.dims(),
            v.dims(),
            mask.dims()
        )));
    }
    Ok((b, hk, gt / t, t, tk, d))
}

/// The fused op: `q`, `k`, `v` are its arguments, the mask a constant.
struct Attention {
    mask: Tensor,
    t: usize,
}

/// A `(B, Hkv, N, D)` operand on the CPU: its elements from the start
/// offset on, and its first three strides (the last is 1).
struct Heads<'a, T> {
    data: &'a [T],
    stride: [usize; 3],
}

impl<'a, T> Heads<'a, T> {
    fn new(s: &'a [T], l: &Layout, op: &str) -> Result<Self> {
        let st = l.stride();
        if st.len() != 4 || st[3] != 1 {
            return Err(Error::Msg(format!("{op}: operands need a unit last stride, got {st:?}")));
        }
        Ok(Heads { data: &s[l.start_offset()..], stride: [st[0], st[1], st[2]] })
    }

    /// Row `r`, kv head `h`: its rows from the first on, `stride[2]` apart.
    fn at(&self, r: usize, h: usize) -> &'a [T] {
        &self.data[r * self.stride[0] + h * self.stride[1]..]
    }
}

/// One past the last key each `(row, query)` of `mask (B·T, TK)` sees, or
/// all `TK` for a query that sees none (the composite spreads its softmax
/// evenly over every key, and so must this).
fn key_bounds<T: Float>(mask: &[T], tk: usize) -> Vec<usize> {
    let hidden = T::from_f64(HIDDEN);
    mask.chunks_exact(tk).map(|m| m.iter().rposition(|&x| x > hidden).map_or(tk, |j| j + 1)).collect()
}

/// `c = a · b` (or `c += a · b` with `acc`), row-major `c (m × n)` with row
/// stride `ldc`, `a (m × k)` and `b (k × n)` with (row, column) strides, on
/// one thread (the callers run heads in parallel): in f32 on the AVX2
/// kernel where it runs ([`Float::mm_avx2`]: inside a SmolLM2 step the
/// attention's forward and backward took 0.43 + 1.01 s on it against gemm's
/// 0.47 + 1.05 s at 64-row blocks,
/// `results/bench/kernel-ab/avx2-backward-vs-openblas-2026-11-27/`), else on
/// gemm's microkernels.
#[allow(clippy::too_many_arguments)]
fn mm<T: Float>(
    (m, n, k): (usize, usize, usize),
    c: &mut [T],
    ldc: usize,
    acc: bool,
    a: &[T],
    (ars, acs): (usize, usize),
    b: &[T],
    (brs, bcs): (usize, usize),
) {
    let span = |r: usize, c: usize, rs: usize, cs: usize| (r - 1) * rs + (c - 1) * cs + 1;
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(span(m, k, ars, acs) <= a.len() && span(k, n, brs, bcs) <= b.len() && span(m, n, ldc, 1) <= c.len());
    if r2vpo_kernels::dispatch::reference() {
        r2vpo_kernels::product([m, k, n], (a, (ars, acs)), (b, (brs, bcs)), c, ldc, acc);
        return;
    }
    if T::mm_avx2((m, n, k), c, ldc, acc, a, (ars, acs), b, (brs, bcs)) {
        return;
    }
    // SAFETY: the assert keeps every index gemm forms from these strides
    // inside the three slices, and `c` does not alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            acc,
            a.as_ptr(),
            acs as isize,
            ars as isize,
            b.as_ptr(),
            bcs as isize,
            brs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Shapes of one (row, kv head) of [`attention`].
#[derive(Clone, Copy)]
struct Unit {
    g: usize,
    t: usize,
    tk: usize,
    d: usize,
}

impl Unit {
    /// Each block of query rows: its first row in the `G·T` stack, its row
    /// count, its first query position in `0..T`, and the keys it sees.
    fn blocks<'a>(&self, hi: &'a [usize]) -> impl Iterator<Item = (usize, usize, usize, usize)> + 'a {
        let (Unit { g, t, .. }, rows) = (*self, attention_rows());
        (0..g).flat_map(move |gi| {
            (0..t).step_by(rows).map(move |i0| {
                let i1 = (i0 + rows).min(t);
                (gi * t + i0, i1 - i0, i0, hi[i0..i1].iter().copied().max().unwrap_or(1))
            })
        })
    }

    /// `s (n × kn) = softmax(q_rows · k[..kn]ᵀ + mask)`, the block's
    /// probabilities, for query positions `i0..i0 + n`.
    #[allow(clippy::too_many_arguments)]
    fn probs<T: Float>(
        &self,
        s: &mut [T],
        q: &[T],
        k: &[T],
        ks: usize,
        mask: &[T],
        (n, i0, kn): (usize, usize, usize),
    ) {
        let (tk, d) = (self.tk, self.d);
        mm((n, kn, d), s, kn, false, q, (d, 1), k, (1, ks));
        for (i, row) in s.chunks_exact_mut(kn).enumerate() {
            let m = &mask[(i0 + i) * tk..(i0 + i) * tk + kn];
            for (x, &a) in row.iter_mut().zip(m) {
                *x = *x + a;
            }
            let mx = T::row_max(row);
            let inv = T::ONE / T::exp_shifted(row, mx);
            row.iter_mut().for_each(|x| *x = *x * inv);
        }
    }
}

fn attention_fwd<T: Float>(q: &[T], k: Heads<T>, v: Heads<T>, mask: &[T], dims: (usize, usize, Unit)) -> Vec<T> {
    let (b, hk, u) = dims;
    let (gt, tk, d) = (u.g * u.t, u.tk, u.d);
    let hi = key_bounds(mask, tk);
    let mut out = vec![T::ZERO; b * hk * gt * d];
    out.par_chunks_mut(gt * d).enumerate().for_each(|(rh, o)| {
        let (r, h) = (rh / hk, rh % hk);
        let (kr, vr, qr) = (k.at(r, h), v.at(r, h), &q[rh * gt * d..(rh + 1) * gt * d]);
        let (mr, hr) = (&mask[r * u.t * tk..(r + 1) * u.t * tk], &hi[r * u.t..(r + 1) * u.t]);
        let mut s = vec![T::ZERO; attention_rows().min(u.t) * tk];
        for (row, n, i0, kn) in u.blocks(hr) {
            let s = &mut s[..n * kn];
            u.probs(s, &qr[row * d..], kr, k.stride[2], mr, (n, i0, kn));
            mm((n, d, kn), &mut o[row * d..], d, false, s, (kn, 1), vr, (v.stride[2], 1));
        }
    });
    out
}

/// The gradients `(dq, dk, dv)` for the upstream `dout (B, Hkv, G·T, D)`:
/// per block, P again, then `dv += Pᵀ·dout`, `dP = dout·vᵀ`,
/// `dS = P ⊙ (dP − rowsum(P ⊙ dP))`, `dq = dS·k`, `dk += dSᵀ·q`.
fn attention_bwd<T: Float>(
    q: &[T],
    k: Heads<T>,
    v: Heads<T>,
    mask: &[T],
    dout: &[T],
    dims: (usize, usize, Unit),
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (b, hk, u) = dims;
    let (gt, tk, d) = (u.g * u.t, u.tk, u.d);
    let hi = key_bounds(mask, tk);
    let mut dq = vec![T::ZERO; b * hk * gt * d];
    let mut dk = vec![T::ZERO; b * hk * tk * d];
    let mut dv = vec![T::ZERO; b * hk * tk * d];
    let units = dq.par_chunks_mut(gt * d).zip(dk.par_chunks_mut(tk * d)).zip(dv.par_chunks_mut(tk * d));
    units.enumerate().for_each(|(rh, ((dq, dk), dv))| {
        let (r, h) = (rh / hk, rh % hk);
        let (kr, vr) = (k.at(r, h), v.at(r, h));
        let (qr, gr) = (&q[rh * gt * d..(rh + 1) * gt * d], &dout[rh * gt * d..(rh + 1) * gt * d]);
        let (mr, hr) = (&mask[r * u.t * tk..(r + 1) * u.t * tk], &hi[r * u.t..(r + 1) * u.t]);
        let cap = attention_rows().min(u.t) * tk;
        let (mut s, mut dp) = (vec![T::ZERO; cap], vec![T::ZERO; cap]);
        for (row, n, i0, kn) in u.blocks(hr) {
            let (s, dp) = (&mut s[..n * kn], &mut dp[..n * kn]);
            u.probs(s, &qr[row * d..], kr, k.stride[2], mr, (n, i0, kn));
            mm((kn, d, n), dv, d, true, s, (1, kn), &gr[row * d..], (d, 1));
            mm((n, kn, d), dp, kn, false, &gr[row * d..], (d, 1), vr, (1, v.stride[2]));
            for (pr, dr) in s.chunks_exact(kn).zip(dp.chunks_exact_mut(kn)) {
                let dot: T = pr.iter().zip(dr.iter()).map(|(&p, &x)| p * x).sum();
                dr.iter_mut().zip(pr).for_each(|(x, &p)| *x = p * (*x - dot));
            }
            mm((n, d, kn), &mut dq[row * d..], d, false, dp, (kn, 1), kr, (k.stride[2], 1));
            mm((kn, d, n), dk, d, true, dp, (1, kn), &qr[row * d..], (d, 1));
        }
    });
    (dq, dk, dv)
}

impl Attention {
    fn dims(&self, q: &Layout, k: &Layout) -> Result<(usize, usize, Unit)> {
        let (b, hk, gt, d) = q.shape().dims4()?;
        Ok((b, hk, Unit { g: gt / self.t, t: self.t, tk: k.dims()[2], d }))
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "r2vpo-attention"
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
        let dims = self.dims(l1, l2)?;
        let (ms, ml) = self.mask.storage_and_layout();
        let out = match (s1, s2, s3, &*ms) {
            (
                CpuStorage::F32(q),
                CpuStorage::F32(k),
                CpuStorage::F32(v),
                candle_core::Storage::Cpu(CpuStorage::F32(m)),
            ) => {
                let (k, v) = (Heads::new(k, l2, n)?, Heads::new(v, l3, n)?);
                CpuStorage::F32(attention_fwd(contiguous(q, l1, n)?, k, v, contiguous(m, ml, n)?, dims))
            }
            (
                CpuStorage::F64(q),
                CpuStorage::F64(k),
                CpuStorage::F64(v),
                candle_core::Storage::Cpu(CpuStorage::F64(m)),
            ) => {
                let (k, v) = (Heads::new(k, l2, n)?, Heads::new(v, l3, n)?);
                CpuStorage::F64(attention_fwd(contiguous(q, l1, n)?, k, v, contiguous(m, ml, n)?, dims))
            }
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let n = self.name();
        let grad = grad.contiguous()?;
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (ms, ml) = self.mask.storage_and_layout();
        let dims = self.dims(ql, kl)?;
        use candle_core::Storage::Cpu;
        let (dq, dk, dv) = match (&*qs, &*ks, &*vs, &*gs, &*ms) {
            (
                Cpu(CpuStorage::F32(q)),
                Cpu(CpuStorage::F32(k)),
                Cpu(CpuStorage::F32(v)),
                Cpu(CpuStorage::F32(g)),
                Cpu(CpuStorage::F32(m)),
            ) => {
                let (k, v) = (Heads::new(k, kl, n)?, Heads::new(v, vl, n)?);
                let (q, g, m) = (contiguous(q, ql, n)?, contiguous(g, gl, n)?, contiguous(m, ml, n)?);
                let (a, b, c) = attention_bwd(q, k, v, m, g, dims);
                (CpuStorage::F32(a), CpuStorage::F32(b), CpuStorage::F32(c))
            }
            (
                Cpu(CpuStorage::F64(q)),
                Cpu(CpuStorage::F64(k)),
                Cpu(CpuStorage::F64(v)),
                Cpu(CpuStorage::F64(g)),
                Cpu(CpuStorage::F64(m)),
            ) => {
                let (k, v) = (Heads::new(k, kl, n)?, Heads::new(v, vl, n)?);
                let (q, g, m) = (contiguous(q, ql, n)?, contiguous(g, gl, n)?, contiguous(m, ml, n)?);
                let (a, b, c) = attention_bwd(q, k, v, m, g, dims);
                (CpuStorage::F64(a), CpuStorage::F64(b), CpuStorage::F64(c))
            }
            _ => return Err(Error::Msg(format!("{n}: backward needs f32 or f64 CPU tensors of one dtype"))),
        };
        let dev = q.device();
        let wrap = |s: CpuStorage, shape: &[usize]| -> Result<Tensor> {
            match s {
                CpuStorage::F32(x) => Tensor::from_vec(x, shape, dev),
                CpuStorage::F64(x) => Tensor::from_vec(x, shape, dev),
                _ => unreachable!("built above as f32 or f64"),
            }
        };
        Ok((Some(wrap(dq, q.dims())?), Some(wrap(dk, k.dims())?), Some(wrap(dv, v.dims())?)))
    }
}

pub use crate::backend::batch::Seq;

/// Causal attention over packed sequences (FlashAttention's "varlen" form,
/// `flash_attn_varlen_func`, plus a shared prefix per sequence): `q (1,
/// Hkv, G·N, D)` already scaled, `k, v (1, Hkv, N, D)`, where the `N`
/// positions are `seqs` laid end to end in order. A query of a sequence
/// sees its sequence's prefix span whole and its own sequence up to
/// itself, nothing else, so no mask is stored: a packed micro-batch costs
/// `Σ L·(P + L/2)` scores where a dense mask would cost `N²` entries and
/// padded rows `B·W²`. Returns `(1, Hkv, G·N, D)`.
///
/// On the CPU in f32/f64 it is one op whose work units are (kv head,
/// sequence) pairs, each [`attention`]'s blocks of query rows over only
/// the keys its rows see; elsewhere it is [`attention_varlen_composite`].
pub fn attention_varlen(q: &Tensor, k: &Tensor, v: &Tensor, seqs: &[Seq]) -> Result<Tensor> {
    varlen_dims(q, k, v, seqs)?;
    let same = [k, v].iter().all(|x| x.dtype() == q.dtype() && x.device().is_cpu());
    if !(fused_ok(q) && same) {
        return attention_varlen_composite(q, k, v, seqs);
    }
    q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, VarlenAttention { seqs: seqs.to_vec() })
}

/// [`attention_varlen`] from candle ops: each sequence's queries, and its
/// prefix's keys and values then its own, given to [`attention_composite`]
/// with the mask that shows the prefix whole and the sequence causally.
pub fn attention_varlen_composite(q: &Tensor, k: &Tensor, v: &Tensor, seqs: &[Seq]) -> Result<Tensor> {
    let (hk, g, n, d) = varlen_dims(q, k, v, seqs)?;
    let q5 = q.reshape((1, hk, g, n, d))?;
    let mut outs = Vec::with_capacity(seqs.len());
    for sq in seqs.iter().filter(|sq| sq.len > 0) {
        let (c0, l, (p0, pl)) = (sq.start, sq.len, sq.prefix);
        let qs = q5.narrow(3, c0, l)?.contiguous()?.reshape((1, hk, g * l, d))?;
        let keys = |x: &Tensor| -> Result<Tensor> { Tensor::cat(&[x.narrow(2, p0, pl)?, x.narrow(2, c0, l)?], 2) };
        let tk = pl + l;
        let hidden: Vec<f32> = (0..l * tk).map(|x| if x % tk > pl + x / tk { -1e9 } else { 0.0 }).collect();
        let mask = Tensor::from_vec(hidden, (1, 1, 1, l, tk), q.device())?.to_dtype(q.dtype())?;
        outs.push(attention_composite(&qs, &keys(k)?, &keys(v)?, &mask, l)?.reshape((1, hk, g, l, d))?);
    }
    Tensor::cat(&outs, 3)?.reshape((1, hk, g * n, d))
}

/// `(Hkv, G, N, D)` of a packed attention's operands, or an error naming
/// their shapes and the sequences.
fn varlen_dims(q: &Tensor, k: &Tensor, v: &Tensor, seqs: &[Seq]) -> Result<(usize, usize, usize, usize)> {
    let (one, hk, gn, d) = q.dims4()?;
    let n = k.dim(2)?;
    // The sequences tile 0..N in order; a prefix ends before its sequence.
    let mut at = 0;
    let mut tiled = true;
    for sq in seqs {
        tiled &= sq.start == at && sq.prefix.0 + sq.prefix.1 <= sq.start;
        at += sq.len;
    }
    tiled &= at == n;
    if one != 1 || n == 0 || gn % n != 0 || k.dims4()? != (1, hk, n, d) || v.dims4()? != (1, hk, n, d) || !tiled {
        return Err(Error::Msg(format!(
            "attention_varlen: q {:?}, k {:?}, v {:?} with sequences {seqs:?} (which must tile the key \
             positions in order, each prefix ending before its sequence)",
            q.dims(),
            k.dims(),
            v.dims()
        )));
    }
    Ok((hk, gn / n, n, d))
}

/// The packed op: `q`, `k`, `v` are its arguments, the sequences a constant.
struct VarlenAttention {
    seqs: Vec<Seq>,
}

/// Shapes of a packed attention: kv heads, query heads per kv head, packed
/// positions, head width.
#[derive(Clone, Copy)]
struct Packed {
    hk: usize,
    g: usize,
    n: usize,
    d: usize,
}

impl Packed {
    /// The (kv head, sequence) work units with a non-empty sequence.
    fn units(&self, seqs: &[Seq]) -> Vec<(usize, Seq)> {
        (0..self.hk).flat_map(|h| seqs.iter().filter(|s| s.len > 0).map(move |&s| (h, s))).collect()
    }
}

/// One unit's operands: the rows of kv head `h`'s keys (or values) from
/// the prefix's first and from the sequence's first.
fn spans<T>(x: &[T], (h, sq): (usize, Seq), p: Packed) -> (&[T], &[T]) {
    let head = &x[h * p.n * p.d..];
    (&head[sq.prefix.0 * p.d..], &head[sq.start * p.d..])
}

/// `s (n × (pl + kn))`, row stride `pl + kn`: softmax of the block's
/// queries (positions `i0..i0 + n` of their sequence) against the prefix's
/// `pl` keys, all seen, then the sequence's first `kn` keys, of which
/// query `i0 + i` sees `0..=i0 + i`; the others get probability 0, as an
/// additive mask would give them.
#[allow(clippy::too_many_arguments)]
fn span_probs<T: Float>(
    s: &mut [T],
    q: &[T],
    (kp, ks): (&[T], &[T]),
    d: usize,
    pl: usize,
    (n, i0, kn): (usize, usize, usize),
) {
    let w = pl + kn;
    mm((n, pl, d), s, w, false, q, (d, 1), kp, (1, d));
    mm((n, kn, d), &mut s[pl..], w, false, q, (d, 1), ks, (1, d));
    for (i, row) in s.chunks_exact_mut(w).enumerate() {
        let (seen, hidden) = row.split_at_mut(pl + i0 + i + 1);
        let mx = T::row_max(seen);
        let inv = T::ONE / T::exp_shifted(seen, mx);
        seen.iter_mut().for_each(|x| *x = *x * inv);
        hidden.fill(T::ZERO);
    }
}

fn varlen_fwd<T: Float>(q: &[T], k: &[T], v: &[T], seqs: &[Seq], p: Packed) -> Vec<T> {
    let Packed { hk, g, n, d } = p;
    let units = p.units(seqs);
    let rows = attention_rows();
    let parts: Vec<Vec<T>> = units
        .par_iter()
        .map(|&(h, sq)| {
            let (l, pl) = (sq.len, sq.prefix.1);
            let (kk, vv) = (spans(k, (h, sq), p), spans(v, (h, sq), p));
            let mut o = vec![T::ZERO; g * l * d];
            let mut s = vec![T::ZERO; rows.min(l) * (pl + l)];
            for gi in 0..g {
                let qr = &q[((h * g + gi) * n + sq.start) * d..];
                for i0 in (0..l).step_by(rows) {
                    let (nr, kn) = (rows.min(l - i0), (i0 + rows).min(l));
                    let w = pl + kn;
                    let s = &mut s[..nr * w];
                    span_probs(s, &qr[i0 * d..], kk, d, pl, (nr, i0, kn));
                    let out = &mut o[(gi * l + i0) * d..];
                    mm((nr, d, pl), out, d, false, s, (w, 1), vv.0, (d, 1));
                    mm((nr, d, kn), out, d, pl > 0, &s[pl..], (w, 1), vv.1, (d, 1));
                }
            }
            o
        })
        .collect();
    let mut out = vec![T::ZERO; hk * g * n * d];
    for (&(h, sq), o) in units.iter().zip(parts) {
        let l = sq.len;
        for gi in 0..g {
            out[((h * g + gi) * n + sq.start) * d..][..l * d].copy_from_slice(&o[gi * l * d..(gi + 1) * l * d]);
        }
    }
    out
}

/// The gradients `(dq, dk, dv)` of [`varlen_fwd`] for the upstream `dout`,
/// per (kv head, sequence) as [`attention_bwd`] computes them per row; a
/// prefix's keys and values collect the gradients of every sequence that
/// reads them.
fn varlen_bwd<T: Float>(q: &[T], k: &[T], v: &[T], dout: &[T], seqs: &[Seq], p: Packed) -> (Vec<T>, Vec<T>, Vec<T>) {
    let Packed { hk, g, n, d } = p;
    let units = p.units(seqs);
    let rows = attention_rows();
    // Per unit: dq of its queries, then dk and dv of its prefix's rows
    // followed by its own rows.
    let parts: Vec<(Vec<T>, Vec<T>, Vec<T>)> = units
        .par_iter()
        .map(|&(h, sq)| {
            let (l, pl) = (sq.len, sq.prefix.1);
            let (kk, vv) = (spans(k, (h, sq), p), spans(v, (h, sq), p));
            let mut dq = vec![T::ZERO; g * l * d];
            let (mut dk, mut dv) = (vec![T::ZERO; (pl + l) * d], vec![T::ZERO; (pl + l) * d]);
            let cap = rows.min(l) * (pl + l);
            let (mut s, mut dp) = (vec![T::ZERO; cap], vec![T::ZERO; cap]);
            for gi in 0..g {
                let at = ((h * g + gi) * n + sq.start) * d;
                let (qr, gr) = (&q[at..], &dout[at..]);
                for i0 in (0..l).step_by(rows) {
                    let (nr, kn) = (rows.min(l - i0), (i0 + rows).min(l));
                    let w = pl + kn;
                    let (s, dp) = (&mut s[..nr * w], &mut dp[..nr * w]);
                    let (qb, gb) = (&qr[i0 * d..], &gr[i0 * d..]);
                    span_probs(s, qb, kk, d, pl, (nr, i0, kn));
                    // dv += Pᵀ·dout, prefix rows then the sequence's.
                    mm((pl, d, nr), &mut dv, d, true, s, (1, w), gb, (d, 1));
                    mm((kn, d, nr), &mut dv[pl * d..], d, true, &s[pl..], (1, w), gb, (d, 1));
                    // dP = dout·vᵀ over both spans.
                    mm((nr, pl, d), dp, w, false, gb, (d, 1), vv.0, (1, d));
                    mm((nr, kn, d), &mut dp[pl..], w, false, gb, (d, 1), vv.1, (1, d));
                    for (pr, dr) in s.chunks_exact(w).zip(dp.chunks_exact_mut(w)) {
                        let dot: T = pr.iter().zip(dr.iter()).map(|(&p, &x)| p * x).sum();
                        dr.iter_mut().zip(pr).for_each(|(x, &p)| *x = p * (*x - dot));
                    }
                    let dqb = &mut dq[(gi * l + i0) * d..];
                    mm((nr, d, pl), dqb, d, false, dp, (w, 1), kk.0, (d, 1));
                    mm((nr, d, kn), dqb, d, pl > 0, &dp[pl..], (w, 1), kk.1, (d, 1));
                    mm((pl, d, nr), &mut dk, d, true, dp, (1, w), qb, (d, 1));
                    mm((kn, d, nr), &mut dk[pl * d..], d, true, &dp[pl..], (1, w), qb, (d, 1));
                }
            }
            (dq, dk, dv)
        })
        .collect();
    let mut dq = vec![T::ZERO; hk * g * n * d];
    let mut dk = vec![T::ZERO; hk * n * d];
    let mut dv = vec![T::ZERO; hk * n * d];
    // In unit order: a prefix's sums are the same bits on any thread count.
    for (&(h, sq), (q1, k1, v1)) in units.iter().zip(parts) {
        let (l, (p0, pl)) = (sq.len, sq.prefix);
        for gi in 0..g {
            dq[((h * g + gi) * n + sq.start) * d..][..l * d].copy_from_slice(&q1[gi * l * d..(gi + 1) * l * d]);
        }
        for (dst, src) in [(&mut dk, &k1), (&mut dv, &v1)] {
            let head = &mut dst[h * n * d..(h + 1) * n * d];
            head[p0 * d..(p0 + pl) * d].iter_mut().zip(&src[..pl * d]).for_each(|(a, &b)| *a = *a + b);
            head[sq.start * d..][..l * d].iter_mut().zip(&src[pl * d..]).for_each(|(a, &b)| *a = *a + b);
        }
    }
    (dq, dk, dv)
}

impl VarlenAttention {
    fn packed(&self, q: &Layout, k: &Layout) -> Result<Packed> {
        let (_, hk, gn, d) = q.shape().dims4()?;
        let n = k.dims()[2];
        Ok(Packed { hk, g: gn / n, n, d })
    }

    /// [`varlen_bwd`] on one dtype's storages, as tensors on `dev`.
    fn grads<T: Float + candle_core::WithDType>(
        &self,
        (q, k, v, g): (&[T], &[T], &[T], &[T]),
        (ql, kl, vl, gl): (&Layout, &Layout, &Layout, &Layout),
        p: Packed,
        dev: &candle_core::Device,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let c = |s, l| contiguous(s, l, self.name());
        let (a, b, e) = varlen_bwd(c(q, ql)?, c(k, kl)?, c(v, vl)?, c(g, gl)?, &self.seqs, p);
        Ok((
            Tensor::from_vec(a, ql.dims(), dev)?,
            Tensor::from_vec(b, kl.dims(), dev)?,
            Tensor::from_vec(e, vl.dims(), dev)?,
        ))
    }
}

impl CustomOp3 for VarlenAttention {
    fn name(&self) -> &'static str {
        "r2vpo-attention-varlen"
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
        let p = self.packed(l1, l2)?;
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) => CpuStorage::F32(varlen_fwd(
                contiguous(q, l1, n)?,
                contiguous(k, l2, n)?,
                contiguous(v, l3, n)?,
                &self.seqs,
                p,
            )),
            (CpuStorage::F64(q), CpuStorage::F64(k), CpuStorage::F64(v)) => CpuStorage::F64(varlen_fwd(
                contiguous(q, l1, n)?,
                contiguous(k, l2, n)?,
                contiguous(v, l3, n)?,
                &self.seqs,
                p,
            )),
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let n = self.name();
        let grad = grad.contiguous()?;
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let p = self.packed(ql, kl)?;
        use candle_core::Storage::Cpu;
        let (shapes, dev) = ((ql, kl, vl, gl), q.device().clone());
        let (dq, dk, dv) = match (&*qs, &*ks, &*vs, &*gs) {
            (Cpu(CpuStorage::F32(q)), Cpu(CpuStorage::F32(k)), Cpu(CpuStorage::F32(v)), Cpu(CpuStorage::F32(g))) => {
                self.grads((q, k, v, g), shapes, p, &dev)?
            }
            (Cpu(CpuStorage::F64(q)), Cpu(CpuStorage::F64(k)), Cpu(CpuStorage::F64(v)), Cpu(CpuStorage::F64(g))) => {
                self.grads((q, k, v, g), shapes, p, &dev)?
            }
            _ => return Err(Error::Msg(format!("{n}: backward needs f32 or f64 CPU tensors of one dtype"))),
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
