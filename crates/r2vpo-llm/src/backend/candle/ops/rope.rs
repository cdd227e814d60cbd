//! Rotate-half RoPE with per-row tables, with its backward.

use super::*;

/// Rotate-half RoPE on `x: (B, H, T, D)` with tables `cos, sin: (B, T, D/2)`.
/// `inverse` rotates by −θ, which is exactly the backward of the forward.
struct Rope {
    inverse: bool,
}

/// `x` from its start offset, read through its first three strides (the
/// last is 1), so the `(B, T, H, D)` projections transposed to `(B, H, T,
/// D)` are read in place rather than copied first. The output is contiguous.
fn rope_kernel<T: Float>(
    x: &[T],
    st: [usize; 3],
    cos: &[T],
    sin: &[T],
    dims: (usize, usize, usize, usize),
    inverse: bool,
) -> Vec<T> {
    let (b, h, t, d) = dims;
    let half = d / 2;
    let mut out = vec![T::ZERO; b * h * t * d];
    // One chunk = one (b, h, t) vector; its table row is (b, t).
    for_rows(&mut out, d, |i, o| {
        let (bi, hi, ti) = (i / (h * t), i / t % h, i % t);
        let tab = (bi * t + ti) * half;
        let (c, s) = (&cos[tab..tab + half], &sin[tab..tab + half]);
        let at = bi * st[0] + hi * st[1] + ti * st[2];
        let xi = &x[at..at + d];
        let (x1, x2) = xi.split_at(half);
        let (o1, o2) = o.split_at_mut(half);
        for j in 0..half {
            let sj = if inverse { -s[j] } else { s[j] };
            o1[j] = x1[j] * c[j] - x2[j] * sj;
            o2[j] = x2[j] * c[j] + x1[j] * sj;
        }
    });
    out
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "r2vpo-rope"
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
        let (b, h, t, d) = l1.shape().dims4()?;
        let (cb, ct, ch) = l2.shape().dims3()?;
        if d % 2 != 0 || (cb, ct, ch) != (b, t, d / 2) || l3.shape() != l2.shape() {
            return Err(Error::Msg(format!(
                "{n}: x {:?} needs cos/sin of shape ({b}, {t}, {}), got {:?} / {:?}",
                l1.dims(),
                d / 2,
                l2.dims(),
                l3.dims()
            )));
        }
        let dims = (b, h, t, d);
        let st = l1.stride();
        if st[3] != 1 {
            return Err(Error::Msg(format!("{n}: x needs a unit last stride, got {st:?}")));
        }
        let (st, at) = ([st[0], st[1], st[2]], l1.start_offset());
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(c), CpuStorage::F32(s)) => CpuStorage::F32(rope_kernel(
                &x[at..],
                st,
                contiguous(c, l2, n)?,
                contiguous(s, l3, n)?,
                dims,
                self.inverse,
            )),
            (CpuStorage::F64(x), CpuStorage::F64(c), CpuStorage::F64(s)) => CpuStorage::F64(rope_kernel(
                &x[at..],
                st,
                contiguous(c, l2, n)?,
                contiguous(s, l3, n)?,
                dims,
                self.inverse,
            )),
            _ => return Err(unsupported(n, s1)),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // The tables are constants (built from positions), so only x gets a gradient.
        let dx = grad.contiguous()?.apply_op3_no_bwd(cos, sin, &Rope { inverse: !self.inverse })?;
        Ok((Some(dx), None, None))
    }
}

/// Rotate-half RoPE (Hugging Face layout) on `x: (B, H, T, D)` with per-row
/// tables `cos, sin: (B, T, D/2)`; differentiable in `x`. Tables multiplied
/// by a constant scale the output by it (the queries' `1/√D`). On the CPU a
/// view of `x` with a unit last stride is read in place; the result is
/// contiguous.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fused_ok(x) && cos.dtype() == x.dtype() {
        let x = if x.rank() == 4 && x.stride()[3] == 1 { x.clone() } else { x.contiguous()? };
        x.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope { inverse: false })
    } else {
        rope_composite(x, cos, sin)
    }
}

/// Reference RoPE from candle primitives.
pub fn rope_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let c = Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?;
    let s = Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&c)? + rot.broadcast_mul(&s)?
}
