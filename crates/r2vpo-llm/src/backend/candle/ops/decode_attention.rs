//! Attention for a decode step that records no gradient, reading the key/value cache in place.

use super::*;

/// Queries per row at or below which [`attention_no_grad`] runs: decode
/// steps (one new token) and short chunks. Longer passes go to candle's
/// batched matmuls, which block for the cache and win there.
pub const ATTENTION_MAX_T: usize = 8;

/// Scaled-dot-product attention for a step that records no gradient, in
/// one pass per (row, kv head): `q (B, Hkv, G·T, D)` (already scaled; the
/// G query heads sharing a kv head stacked as `G·T` rows, `T` new tokens
/// each), `k, v (B, Hkv, TK, D)` with any strides but a unit last one (the
/// KV cache's views), additive `mask (B, 1, 1, T, TK)`. Returns
/// `(B, Hkv, G·T, D)`, or `None` where it does not apply (a gradient, not
/// f32 on the CPU, `T` above [`ATTENTION_MAX_T`]) and the caller runs the
/// matmul–softmax–matmul composite. Replaces eight candle ops (and their
/// allocations) per layer per decode step; same arithmetic (score, mask,
/// max-shifted exp, normalise, weighted sum) in another summation order.
///
/// `shared[r] = (s, l)` (empty: none) says row `r`'s first `l` keys and
/// values are those of row `s` ([`super::super::transformer::KvCache`]'s record of
/// rows replicated from one prefill): they are read from row `s`, so the
/// samples of one prompt read its keys from memory once, not once each.
/// The values are the same either way; wrong entries give wrong results.
pub fn attention_no_grad(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    t: usize,
    shared: &[(usize, usize)],
) -> Result<Option<Tensor>> {
    let ok = t <= ATTENTION_MAX_T
        && fused_ok(q)
        && [q, k, v, mask].iter().all(|x| x.dtype() == DType::F32 && !x.track_op() && x.device().is_cpu());
    if !ok {
        return Ok(None);
    }
    let (b, hk, gt, d) = q.dims4()?;
    let tk = k.dim(2)?;
    if k.dims4()? != (b, hk, tk, d)
        || v.dims4()? != (b, hk, tk, d)
        || mask.dims() != [b, 1, 1, t, tk]
        || gt % t != 0
        || !(shared.is_empty() || shared.len() == b && shared.iter().all(|&(s, _)| s < b))
    {
        return Err(Error::Msg(format!(
            "attention: q {:?}, k {:?}, v {:?}, mask {:?} for {t} new tokens, {} shared rows",
            q.dims(),
            k.dims(),
            v.dims(),
            mask.dims(),
            shared.len()
        )));
    }
    let (q, mask) = (q.contiguous()?, mask.contiguous()?);
    let name = "r2vpo-attention";
    let (qg, ql) = q.storage_and_layout();
    let (mg, ml) = mask.storage_and_layout();
    let (kg, kl) = k.storage_and_layout();
    let (vg, vl) = v.storage_and_layout();
    let (qd, md) = (f32_data(&qg, ql, name)?, f32_data(&mg, ml, name)?);
    let (kd, vd) = (f32_storage(&kg, name)?, f32_storage(&vg, name)?);
    let (ks, vs) = (kl.stride(), vl.stride());
    if ks[3] != 1 || vs[3] != 1 {
        return Ok(None);
    }
    let (ko, vo) = (kl.start_offset(), vl.start_offset());
    let mut out = vec![0f32; b * hk * gt * d];
    // The SIMD pass's score sums follow the vector width (8 or 16 lanes);
    // the portable one's do not.
    let reference = r2vpo_kernels::dispatch::reference();
    out.par_chunks_mut(gt * d).enumerate().for_each(|(rh, o)| {
        let (r, h) = (rh / hk, rh % hk);
        let (s, l) = shared.get(r).copied().unwrap_or((r, 0));
        let kv = KvRows {
            k: &kd[ko + r * ks[0] + h * ks[1]..],
            v: &vd[vo + r * vs[0] + h * vs[1]..],
            k_shared: &kd[ko + s * ks[0] + h * ks[1]..],
            v_shared: &vd[vo + s * vs[0] + h * vs[1]..],
            shared: l.min(tk),
            k_row: ks[2],
            v_row: vs[2],
            mask: &md[r * t * tk..(r + 1) * t * tk],
            t,
            tk,
            d,
        };
        let qs = &qd[rh * gt * d..(rh + 1) * gt * d];
        if reference {
            attend_any(qs, kv, o);
        } else {
            pulp::Arch::new().dispatch(Attend((qs, kv, o)));
        }
    });
    Ok(Some(Tensor::from_vec(out, (b, hk, gt, d), q.device())?))
}

/// The f32 data of a CPU tensor's storage: all of it (for strided views,
/// read through their layout), or [`f32_data`]'s contiguous run.
pub(super) fn f32_storage<'a>(g: &'a candle_core::Storage, op: &str) -> Result<&'a [f32]> {
    match g {
        candle_core::Storage::Cpu(CpuStorage::F32(v)) => Ok(v.as_slice()),
        _ => Err(Error::Msg(format!("{op}: f32 CPU tensors only"))),
    }
}

/// The elements of a contiguous f32 CPU tensor, from its storage and layout.
pub(super) fn f32_data<'a>(g: &'a candle_core::Storage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    contiguous(f32_storage(g, op)?, l, op)
}

/// The keys, values and mask one (row, kv head) of [`attention_no_grad`]
/// attends to: keys `TK` rows apart by their strides (`k_row`, `v_row`),
/// the first `shared` read from the row that shares them, `mask (T, TK)`.
#[derive(Clone, Copy)]
struct KvRows<'a> {
    k: &'a [f32],
    v: &'a [f32],
    k_shared: &'a [f32],
    v_shared: &'a [f32],
    shared: usize,
    k_row: usize,
    v_row: usize,
    mask: &'a [f32],
    t: usize,
    tk: usize,
    d: usize,
}

impl<'a> KvRows<'a> {
    /// Key `j`'s buffer and where in it the key starts.
    #[inline(always)]
    fn key_at(&self, j: usize) -> (&'a [f32], usize) {
        (if j < self.shared { self.k_shared } else { self.k }, j * self.k_row)
    }

    /// Value `j`'s buffer and where in it the value starts.
    #[inline(always)]
    fn value_at(&self, j: usize) -> (&'a [f32], usize) {
        (if j < self.shared { self.v_shared } else { self.v }, j * self.v_row)
    }

    /// Key `j` (`d` values).
    #[inline(always)]
    fn key(&self, j: usize) -> &'a [f32] {
        let (x, at) = self.key_at(j);
        &x[at..at + self.d]
    }

    /// Value `j` (`d` values).
    #[inline(always)]
    fn value(&self, j: usize) -> &'a [f32] {
        let (x, at) = self.value_at(j);
        &x[at..at + self.d]
    }

    /// Query row `qi`'s mask over the keys (rows cycle through the `T` new
    /// tokens).
    #[inline(always)]
    fn mask_of(&self, qi: usize) -> &'a [f32] {
        &self.mask[(qi % self.t) * self.tk..(qi % self.t + 1) * self.tk]
    }
}

/// One (row, kv head) of [`attention_no_grad`]: `q (G·T, D)` against a
/// [`KvRows`], into `o (G·T, D)`, compiled for the widest SIMD the CPU has
/// (pulp's dispatch).
struct Attend<'a>((&'a [f32], KvRows<'a>, &'a mut [f32]));

impl pulp::WithSimd for Attend<'_> {
    type Output = ();

    /// Head sizes of 64 and 128 (SmolLM2, Llama, Qwen) hold the query and
    /// the output row in registers ([`attend_rows`]); others run
    /// [`attend_any`].
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let (q, kv, o) = self.0;
        match (S::F32_LANES, kv.d) {
            (16, 64) | (8, 32) => attend_rows::<S, 4>(simd, q, kv, o),
            (16, 128) | (8, 64) => attend_rows::<S, 8>(simd, q, kv, o),
            (8, 128) => attend_rows::<S, 16>(simd, q, kv, o),
            _ => attend_any(q, kv, o),
        }
    }
}

/// [`Attend`] for `D = C` SIMD vectors, in explicit vector operations: the
/// compiler's own vectorisation of these loops (plain arrays of 16 lanes)
/// came out two lanes wide with the output row kept in memory, which
/// chained every key's update to the previous one's store; that pass was
/// 19 % of decode time at batch 32 (perf, SmolLM2). The query rows go in
/// blocks of up to `16 / C` ([`attend_block`]), so every key and value row
/// is loaded once per block rather than once per query.
#[inline(always)]
fn attend_rows<S: pulp::Simd, const C: usize>(simd: S, q: &[f32], kv: KvRows, o: &mut [f32]) {
    let d = kv.d;
    let mut p = vec![0f32; 4 * kv.tk];
    let rows = q.len() / d;
    let mut i = 0;
    while i < rows {
        let n = (rows - i).min((16 / C).max(1));
        let (q, o) = (&q[i * d..(i + n) * d], &mut o[i * d..(i + n) * d]);
        match n {
            1 => attend_block::<S, C, 1>(simd, q, kv, o, i, &mut p),
            2 => attend_block::<S, C, 2>(simd, q, kv, o, i, &mut p),
            3 => attend_block::<S, C, 3>(simd, q, kv, o, i, &mut p),
            _ => attend_block::<S, C, 4>(simd, q, kv, o, i, &mut p),
        }
        i += n;
    }
}

/// `N` query rows of [`attend_rows`] (the first is row `first` of the
/// (row, kv head), which picks their mask rows) against one pass over the
/// keys and one over the values. At batch 32 the cache holds about a
/// quarter of the bytes a decode step reads, and one query at a time read
/// each key and value row once per query head sharing it (SmolLM2: three).
/// Each query's arithmetic is the one-query loop's, in its order (a score
/// is one multiply–add chain over the `C` vectors, then a lane sum; the
/// output sums the keys in order), so the results are the same bits.
#[inline(always)]
fn attend_block<S: pulp::Simd, const C: usize, const N: usize>(
    simd: S,
    q: &[f32],
    kv: KvRows,
    o: &mut [f32],
    first: usize,
    p: &mut [f32],
) {
    let (tk, d) = (kv.tk, kv.d);
    let zero = simd.splat_f32s(0.0);
    let row = |x: &[f32]| -> [S::f32s; C] {
        let xs = S::as_simd_f32s(x).0;
        let mut r = [zero; C];
        r.copy_from_slice(&xs[..C]);
        r
    };
    let qv: [[S::f32s; C]; N] = std::array::from_fn(|a| row(&q[a * d..(a + 1) * d]));
    let mr: [&[f32]; N] = std::array::from_fn(|a| kv.mask_of(first + a));
    let p = &mut p[..N * tk];
    for j in 0..tk {
        let (ahead, at) = kv.key_at(j + PREFETCH_ROWS);
        prefetch_row::<L1>(ahead, at, d);
        let (value, at) = kv.value_at(j);
        prefetch_row::<L2>(value, at, d);
        let kj = row(kv.key(j));
        for a in 0..N {
            let mut acc = zero;
            for c in 0..C {
                acc = simd.mul_add_e_f32s(qv[a][c], kj[c], acc);
            }
            p[a * tk + j] = simd.reduce_sum_f32s(acc) + mr[a][j];
        }
    }
    let mut inv = [0f32; N];
    for (a, pa) in p.chunks_exact_mut(tk).enumerate() {
        let mx = r2vpo_kernels::simd::max16(pa);
        inv[a] = 1.0 / r2vpo_kernels::simd::exp_shifted16((pa, mx));
    }
    let mut acc = [[zero; C]; N];
    for j in 0..tk {
        let vj = row(kv.value(j));
        for a in 0..N {
            let w = simd.splat_f32s(p[a * tk + j] * inv[a]);
            for c in 0..C {
                acc[a][c] = simd.mul_add_e_f32s(w, vj[c], acc[a][c]);
            }
        }
    }
    for (a, or) in o.chunks_exact_mut(d).enumerate() {
        S::as_mut_simd_f32s(or).0[..C].copy_from_slice(&acc[a]);
    }
}

/// Key rows ahead of the one being scored that [`attend_block`] asks for
/// (into L1), while it asks for the value row of the same index (into L2,
/// as the values are read only after the softmax). The cache comes from
/// memory in every decode step, and without these requests the hardware's
/// own prefetching kept too few lines in flight: the kernel read keys and
/// values at 10–12 GB/s (`ops::timing`, batch 32, SmolLM2), where a plain
/// two-thread stream reads 23–25. With them: 18–21 GB/s (16 rows ahead;
/// 8 and 32 were slower, and values into L1 as well slower still).
const PREFETCH_ROWS: usize = 16;

#[cfg(target_arch = "x86_64")]
const L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const L2: i32 = 0;

/// Asks for the cache lines of `x[at..at + d]` into the cache `HINT` names
/// ([`L1`], [`L2`]); nothing if out of range, or off x86-64.
#[inline(always)]
fn prefetch_row<const HINT: i32>(x: &[f32], at: usize, d: usize) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, at, d);
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = x.get(at..at + d) {
        for i in (0..d).step_by(16) {
            // SAFETY: a prefetch is a hint that never faults, and the
            // address is in bounds.
            unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(r.as_ptr().add(i).cast()) }
        }
    }
}

/// [`Attend`] for any head size.
#[inline(always)]
fn attend_any(q: &[f32], kv: KvRows, o: &mut [f32]) {
    let (tk, d) = (kv.tk, kv.d);
    let mut p = vec![0f32; tk];
    for (qi, (qr, or)) in q.chunks_exact(d).zip(o.chunks_exact_mut(d)).enumerate() {
        let mr = kv.mask_of(qi);
        for (j, pj) in p.iter_mut().enumerate() {
            *pj = dot(qr, kv.key(j)) + mr[j];
        }
        let mx = r2vpo_kernels::simd::max16(&p);
        let inv = 1.0 / r2vpo_kernels::simd::exp_shifted16((&mut p, mx));
        for (j, &pj) in p.iter().enumerate() {
            let w = pj * inv;
            for (a, &x) in or.iter_mut().zip(kv.value(j)) {
                *a += w * x;
            }
        }
    }
}
