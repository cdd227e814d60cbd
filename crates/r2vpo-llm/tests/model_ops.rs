//! The fused ops against composite candle ops and against central finite
//! differences in f64 (forward values and gradients).

use candle_core::{DType, Device, Tensor, Var};
use r2vpo_llm::backend::candle::ops;

fn pseudo(shape: &[usize], seed: f64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i as f64 + 1.0) * 0.7123 + seed).sin() * 1.5).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

/// Loss = Σ out ⊙ R, so the upstream gradient is a generic tensor R.
fn loss(out: &Tensor, seed: f64) -> Tensor {
    let r = pseudo(out.dims(), seed, out.dtype());
    (out * r).unwrap().sum_all().unwrap()
}

/// Gradients of `f` w.r.t. every input, via backward.
fn grads(f: &dyn Fn(&[Tensor]) -> Tensor, inputs: &[Tensor]) -> Vec<Tensor> {
    let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let l = loss(&f(&ts), 0.31);
    let g = l.backward().unwrap();
    vars.iter().map(|v| g.get(v.as_tensor()).expect("input received no gradient").clone()).collect()
}

/// Central finite differences on a few entries of each input, in f64.
fn check_fd(f: &dyn Fn(&[Tensor]) -> Tensor, inputs: &[Tensor], tol: f64) {
    let g = grads(f, inputs);
    let eps = 1e-5;
    for (k, inp) in inputs.iter().enumerate() {
        let base: Vec<f64> = inp.flatten_all().unwrap().to_vec1().unwrap();
        let gk: Vec<f64> = g[k].flatten_all().unwrap().to_vec1().unwrap();
        let step = (base.len() / 7).max(1);
        for idx in (0..base.len()).step_by(step) {
            let eval = |d: f64| {
                let mut v = base.clone();
                v[idx] += d;
                let mut ins = inputs.to_vec();
                ins[k] = Tensor::from_vec(v, inp.dims(), &Device::Cpu).unwrap();
                scalar(&loss(&f(&ins), 0.31))
            };
            let fd = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let err = (fd - gk[idx]).abs() / (1.0 + fd.abs());
            assert!(err < tol, "input {k} entry {idx}: fd {fd} vs backward {}, err {err}", gk[idx]);
        }
    }
}

fn compare(fused: &dyn Fn(&[Tensor]) -> Tensor, composite: &dyn Fn(&[Tensor]) -> Tensor, inputs: &[Tensor], tol: f64) {
    compare_split(fused, composite, inputs, tol, tol)
}

/// [`compare`] with one bound for the values and another for the gradients.
fn compare_split(
    fused: &dyn Fn(&[Tensor]) -> Tensor,
    composite: &dyn Fn(&[Tensor]) -> Tensor,
    inputs: &[Tensor],
    tol: f64,
    grad_tol: f64,
) {
    let (a, b) = (fused(inputs), composite(inputs));
    assert_eq!(a.dims(), b.dims());
    let d = max_abs_diff(&a, &b);
    assert!(d < tol, "forward differs by {d}");
    let (ga, gb) = (grads(fused, inputs), grads(composite, inputs));
    for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
        let d = max_abs_diff(x, y);
        assert!(d < grad_tol, "gradient {i} differs by {d}");
    }
}

fn rope_tables(b: usize, t: usize, half: usize, dtype: DType) -> (Tensor, Tensor) {
    let mut c = vec![];
    let mut s = vec![];
    for bi in 0..b {
        for ti in 0..t {
            for i in 0..half {
                let a = (ti + 2 * bi) as f64 / 10f64.powf(i as f64 / half as f64);
                c.push(a.cos());
                s.push(a.sin());
            }
        }
    }
    let mk = |v| Tensor::from_vec(v, (b, t, half), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
    (mk(c), mk(s))
}

#[test]
fn softmax_matches_composite_and_fd() {
    let f = |x: &[Tensor]| ops::softmax_last_dim(&x[0]).unwrap();
    let c = |x: &[Tensor]| ops::softmax_composite(&x[0]).unwrap();
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        compare(&f, &c, &[pseudo(&[2, 3, 17], 0.1, dt)], tol);
    }
    check_fd(&f, &[pseudo(&[3, 11], 0.2, DType::F64)], 1e-7);
    // Large inputs run the multi-threaded path.
    compare(&f, &c, &[pseudo(&[64, 300], 0.3, DType::F32)], 1e-5);
}

#[test]
fn rms_norm_matches_composite_and_fd() {
    let f = |x: &[Tensor]| ops::rms_norm(&x[0], &x[1], 1e-6).unwrap();
    let c = |x: &[Tensor]| ops::rms_norm_composite(&x[0], &x[1], 1e-6).unwrap();
    for (dt, tol) in [(DType::F64, 1e-11), (DType::F32, 2e-4)] {
        compare(&f, &c, &[pseudo(&[2, 5, 24], 0.4, dt), pseudo(&[24], 0.5, dt)], tol);
    }
    check_fd(&f, &[pseudo(&[4, 9], 0.6, DType::F64), pseudo(&[9], 0.7, DType::F64)], 1e-7);
    compare(&f, &c, &[pseudo(&[128, 200], 0.3, DType::F32), pseudo(&[200], 0.5, DType::F32)], 2e-3);
}

#[test]
fn rope_matches_composite_and_fd() {
    let (b, h, t, d) = (2, 3, 5, 8);
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let (cs, sn) = rope_tables(b, t, d / 2, dt);
        let (c1, s1, c2, s2) = (cs.clone(), sn.clone(), cs.clone(), sn.clone());
        let f = move |x: &[Tensor]| ops::rope(&x[0], &c1, &s1).unwrap();
        let c = move |x: &[Tensor]| ops::rope_composite(&x[0], &c2, &s2).unwrap();
        compare(&f, &c, &[pseudo(&[b, h, t, d], 0.8, dt)], tol);
        if dt == DType::F64 {
            check_fd(&f, &[pseudo(&[b, h, t, d], 0.9, dt)], 1e-7);
        }
    }
}

/// RoPE reads the projections' `(B, T, H, D)` output through its transpose
/// in place (the model's layout), and tables scaled by a constant scale the
/// result by it (the queries' 1/√D), in value and gradient.
#[test]
fn rope_on_a_transposed_view_with_scaled_tables() {
    let (b, h, t, d) = (2, 3, 5, 8);
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let (cs, sn) = rope_tables(b, t, d / 2, dt);
        let scale = 0.3;
        let (c1, s1) = ((&cs * scale).unwrap(), (&sn * scale).unwrap());
        let (c2, s2) = (cs.clone(), sn.clone());
        let f = move |x: &[Tensor]| {
            let view = x[0].transpose(1, 2).unwrap();
            assert!(!view.is_contiguous());
            ops::rope(&view, &c1, &s1).unwrap()
        };
        let c = move |x: &[Tensor]| {
            let y = ops::rope_composite(&x[0].transpose(1, 2).unwrap().contiguous().unwrap(), &c2, &s2).unwrap();
            (y * scale).unwrap()
        };
        compare(&f, &c, &[pseudo(&[b, t, h, d], 0.8, dt)], tol);
        if dt == DType::F64 {
            check_fd(&f, &[pseudo(&[b, t, h, d], 0.9, dt)], 1e-7);
        }
    }
}

#[test]
fn swiglu_matches_composite_and_fd() {
    let f = |x: &[Tensor]| ops::swiglu(&x[0], &x[1]).unwrap();
    let c = |x: &[Tensor]| ops::swiglu_composite(&x[0], &x[1]).unwrap();
    // Above 4096 elements so the parallel chunks and their offsets run.
    let big = [pseudo(&[70, 97], 0.4, DType::F64), pseudo(&[70, 97], 1.7, DType::F64)];
    compare(&f, &c, &big, 1e-12);
    let big32 = [pseudo(&[70, 97], 0.4, DType::F32), pseudo(&[70, 97], 1.7, DType::F32)];
    compare(&f, &c, &big32, 1e-5);
    // Gates out to ±105, past where e^x leaves the f32 range (the f32
    // kernel's σ takes e^(−|x|)): values up to ~160, so a few ulp is ~5e-5.
    let wide = [(pseudo(&[70, 97], 0.4, DType::F32) * 70.0).unwrap(), pseudo(&[70, 97], 1.7, DType::F32)];
    compare(&f, &c, &wide, 2e-4);
    check_fd(&f, &[pseudo(&[3, 7], 0.2, DType::F64), pseudo(&[3, 7], 0.9, DType::F64)], 1e-7);
}

#[test]
fn log_prob_gather_matches_composite_and_fd() {
    let targets = Tensor::from_vec(vec![3u32, 0, 12, 7, 7, 1], (2, 3), &Device::Cpu).unwrap();
    let (t1, t2) = (targets.clone(), targets.clone());
    let f = move |x: &[Tensor]| ops::log_prob_gather(&x[0], &t1).unwrap();
    let c = move |x: &[Tensor]| ops::log_prob_gather_composite(&x[0], &t2).unwrap();
    for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        compare(&f, &c, &[pseudo(&[2, 3, 13], 1.0, dt)], tol);
    }
    check_fd(&f, &[pseudo(&[2, 3, 13], 1.1, DType::F64)], 1e-7);
    // Out-of-range targets are an error, not a panic.
    let bad = Tensor::from_vec(vec![13u32, 0, 0, 0, 0, 0], (2, 3), &Device::Cpu).unwrap();
    assert!(ops::log_prob_gather(&pseudo(&[2, 3, 13], 1.0, DType::F32), &bad).is_err());
}

#[test]
fn fused_ops_record_a_backward() {
    // The failure mode candle-nn's fused ops have: Ok(backward) but no gradient.
    let x = Var::from_tensor(&pseudo(&[2, 6], 0.1, DType::F32)).unwrap();
    let w = Var::from_tensor(&pseudo(&[6], 0.2, DType::F32)).unwrap();
    let y = ops::softmax_last_dim(&ops::rms_norm(x.as_tensor(), w.as_tensor(), 1e-5).unwrap()).unwrap();
    let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    assert!(g.get(x.as_tensor()).is_some() && g.get(w.as_tensor()).is_some());
}

/// The whole model on the composites (what a CUDA device runs: the fused
/// kernels are CPU-only) against the fused CPU path: Qwen3's layout (q/k
/// norms, GQA, tied embeddings), log-probs and every parameter's gradient.
#[test]
fn the_composite_path_of_the_whole_model_matches_the_fused_one() {
    use r2vpo_llm::backend::candle::Transformer;
    use r2vpo_llm::model::{Architecture, ModelConfig};
    let cfg = ModelConfig::tiny(Architecture::Qwen3, 96, 64, 128, 2, 4, 2, true);
    let m = Transformer::new_random_with_std(cfg, 3, 0.3, DType::F32, &Device::Cpu).unwrap();
    let (b, w, r) = (2, 12, 7);
    let ids: Vec<u32> = (0..b * w).map(|i| ((i * 37 + 11) % 96) as u32).collect();
    let ids = Tensor::from_vec(ids, (b, w), &Device::Cpu).unwrap();
    // Left padding on the second row, as the trainer packs groups.
    let att = Tensor::from_vec(
        vec![1u32; w].into_iter().chain((0..w).map(|j| u32::from(j >= 3))).collect(),
        (b, w),
        &Device::Cpu,
    )
    .unwrap();
    let run = || {
        let lp = m.tail_logprobs(&ids, &att, r).unwrap();
        let g = lp.sum_all().unwrap().backward().unwrap();
        let grads: Vec<(String, Tensor)> =
            m.named_vars().into_iter().map(|(n, v)| (n, g.get(v.as_tensor()).unwrap().clone())).collect();
        (lp, grads)
    };
    let (lp, grads) = run();
    let (lp_c, grads_c) = ops::with_composites(run);
    let rel = |a: &Tensor, b: &Tensor| max_abs_diff(a, b) / scalar(&b.abs().unwrap().max_all().unwrap()).max(1e-12);
    assert!(rel(&lp_c, &lp) < 1e-5, "log-probs differ by {:e}", rel(&lp_c, &lp));
    assert_eq!(grads.len(), grads_c.len());
    for ((n, g), (_, gc)) in grads.iter().zip(&grads_c) {
        assert!(rel(gc, g) < 1e-4, "{n}: gradients differ by {:e}", rel(gc, g));
    }
    // The composites did run: float rounding tells the two paths apart.
    let bitwise_equal = max_abs_diff(&lp_c, &lp) == 0.0
        && grads.iter().zip(&grads_c).all(|((_, g), (_, gc))| max_abs_diff(g, gc) == 0.0);
    assert!(!bitwise_equal, "with_composites changed nothing");
    // Outside the closure the fused kernels are back.
    assert_eq!(max_abs_diff(&m.tail_logprobs(&ids, &att, r).unwrap(), &lp), 0.0);
}

/// The learner's step with gradient checkpointing on `model`: the candle
/// backend's forward and backward of the padded rows `ids` through
/// `loss_of` of the last `r` log-probs. Returns the log-probs, the loss and
/// the gradients by parameter name.
fn checkpointed_step(
    model: r2vpo_llm::backend::candle::Transformer,
    ids: &Tensor,
    att: &Tensor,
    r: usize,
    loss_of: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
) -> (Tensor, Tensor, std::collections::HashMap<String, Tensor>) {
    use r2vpo_llm::backend::batch::{Inputs, MicroBatch};
    use r2vpo_llm::backend::candle::CandleBackend;
    use r2vpo_llm::backend::{forward_backward, Backend, OptimConfig};
    let mut be = CandleBackend::new(model, OptimConfig::default(), true).unwrap();
    let b = ids.dims()[0];
    let zeros = Tensor::zeros((b, r), DType::F32, &Device::Cpu).unwrap();
    let mb = MicroBatch {
        inputs: Inputs::Padded { ids: ids.clone(), attention: att.clone() },
        tail: r,
        mask: zeros.ones_like().unwrap(),
        old_logp: zeros.clone(),
        advantages: zeros,
        ref_logp: None,
        is_weight: None,
    };
    let (fwd, loss, ()) =
        forward_backward::<(), r2vpo_llm::model::ModelError>(&mut be, &mb, false, |lp, _| Ok((loss_of(lp)?, ())))
            .unwrap();
    (fwd.logp, loss, be.gradients().unwrap())
}

/// Gradient checkpointing recomputes each layer in the backward and runs the
/// head a chunk of rows at a time: the same log-probs, loss and gradients as
/// one backward through the whole graph, for tied (Qwen3) and untied (Llama)
/// heads, with left padding, in one chunk or several.
#[test]
fn checkpointed_gradients_equal_the_full_graphs() {
    use r2vpo_llm::backend::candle::Transformer;
    use r2vpo_llm::model::{Architecture, ModelConfig};
    for (arch, tied, chunk_rows) in [
        (Architecture::Qwen3, true, usize::MAX),
        (Architecture::Llama, false, usize::MAX),
        (Architecture::Qwen3, true, 5),
    ] {
        let cfg = ModelConfig::tiny(arch, 96, 64, 128, 3, 4, 2, tied);
        let mut m = Transformer::new_random_with_std(cfg.clone(), 5, 0.3, DType::F32, &Device::Cpu).unwrap();
        m.set_logits_chunk(chunk_rows.saturating_mul(96));
        let (b, w, r) = (3, 14, 6);
        let ids: Vec<u32> = (0..b * w).map(|i| ((i * 53 + 7) % 96) as u32).collect();
        let ids = Tensor::from_vec(ids, (b, w), &Device::Cpu).unwrap();
        let mask: Vec<u32> = (0..b * w).map(|i| u32::from(i % w >= [0, 4, 2][i / w])).collect();
        let att = Tensor::from_vec(mask, (b, w), &Device::Cpu).unwrap();
        let weights =
            Tensor::from_vec((0..b * r).map(|i| (i as f32 * 0.37).sin()).collect(), (b, r), &Device::Cpu).unwrap();
        let loss_of = |lp: &Tensor| (lp * &weights)?.sqr()?.sum_all();
        let lp = m.tail_logprobs(&ids, &att, r).unwrap();
        let loss = loss_of(&lp).unwrap();
        let full = loss.backward().unwrap();
        let mut ck_model = Transformer::new_random_with_std(cfg.clone(), 5, 0.3, DType::F32, &Device::Cpu).unwrap();
        ck_model.set_logits_chunk(chunk_rows.saturating_mul(96));
        let (lp_c, loss_c, ck) = checkpointed_step(ck_model, &ids, &att, r, |lp| loss_of(lp));
        let what = format!("{arch:?}, {chunk_rows} rows a chunk");
        let scale = scalar(&lp.abs().unwrap().max_all().unwrap());
        assert!(max_abs_diff(&lp_c, &lp) / scale < 1e-6, "{what}: log-probs");
        assert!((scalar(&loss_c) - scalar(&loss)).abs() <= 1e-6 * scalar(&loss).abs(), "{what}: loss");
        for (n, v) in m.named_vars() {
            let (g, gc) = (full.get(v.as_tensor()).unwrap(), ck.get(&n).unwrap_or_else(|| panic!("{n}: no gradient")));
            let scale = scalar(&g.abs().unwrap().max_all().unwrap()).max(1e-12);
            assert!(max_abs_diff(gc, g) / scale < 1e-5, "{what} {n}: {:e}", max_abs_diff(gc, g) / scale);
        }
    }
}

/// Mixed precision: bf16 compute keeps f32 master weights and gradients,
/// stays close to the f32 log-probs (the logits are f32), and gradient
/// checkpointing gives the same gradients in it.
#[test]
fn bf16_compute_keeps_f32_master_weights_and_tracks_f32() {
    use r2vpo_llm::backend::candle::Transformer;
    use r2vpo_llm::model::{Architecture, ModelConfig};
    let cfg = ModelConfig::tiny(Architecture::Qwen3, 96, 64, 128, 2, 4, 2, true);
    let m32 = Transformer::new_random_with_std(cfg.clone(), 9, 0.3, DType::F32, &Device::Cpu).unwrap();
    let mut m16 = Transformer::new_random_with_std(cfg.clone(), 9, 0.3, DType::F32, &Device::Cpu).unwrap();
    m16.set_compute_dtype(DType::BF16);
    let (b, w, r) = (2, 12, 6);
    let ids = Tensor::from_vec((0..b * w).map(|i| ((i * 29 + 3) % 96) as u32).collect(), (b, w), &Device::Cpu).unwrap();
    let att = Tensor::ones((b, w), DType::U32, &Device::Cpu).unwrap();
    let lp32 = m32.tail_logprobs(&ids, &att, r).unwrap();
    let lp16 = m16.tail_logprobs(&ids, &att, r).unwrap();
    assert_eq!(lp16.dtype(), DType::F32, "log-probs come out of f32 logits");
    let rel = |a: &Tensor, b: &Tensor| max_abs_diff(a, b) / scalar(&b.abs().unwrap().max_all().unwrap());
    // bf16 keeps 8 bits of mantissa (≈ 4e-3 a rounding): 1.2e-2 here,
    // against 0.12 with bf16 weights and logits (bench step, qwen3-tiny).
    assert!(rel(&lp16, &lp32) < 3e-2, "bf16 log-probs off by {:e}", rel(&lp16, &lp32));
    assert!(rel(&lp16, &lp32) > 0.0, "bf16 compute changed nothing");
    let loss_of = |lp: &Tensor| lp.sqr()?.sum_all();
    let full = loss_of(&lp16).unwrap().backward().unwrap();
    let mut ck16 = Transformer::new_random_with_std(cfg, 9, 0.3, DType::F32, &Device::Cpu).unwrap();
    ck16.set_compute_dtype(DType::BF16);
    let (_, _, ck) = checkpointed_step(ck16, &ids, &att, r, |lp| loss_of(lp));
    for (n, v) in m16.named_vars() {
        assert_eq!(v.dtype(), DType::F32, "{n}: master weights stay f32");
        let (g, gc) = (full.get(v.as_tensor()).unwrap(), &ck[&n]);
        assert_eq!(g.dtype(), DType::F32, "{n}: gradients reach the master weights in f32");
        assert!(rel(gc, g) < 2e-2, "{n}: checkpointed bf16 gradients off by {:e}", rel(gc, g));
    }
}

/// `ops::linear` takes the small-row kernel up to 32 rows of f32 and
/// gemm above; both must agree with `x · wᵀ` in value and
/// gradient, on shapes whose sizes are not multiples of the SIMD width or
/// the tiles.
#[test]
fn linear_matches_matmul_in_value_and_gradient() {
    for &(m, k, n) in &[(1, 37, 50), (5, 64, 13), (32, 96, 70), (33, 96, 70), (300, 130, 90)] {
        let x = pseudo(&[m, k], 0.4, DType::F32);
        let w = pseudo(&[n, k], 1.9, DType::F32);
        // Up to 32 rows, and on AMX above: f32 sums of up to 130 terms of
        // size ≤ 2.25, in different orders: ~1e-6 relative; an indexing
        // slip is O(1). Otherwise gemm is called as candle calls it (into an
        // output not zero-filled first): the same bits. So is the AVX2
        // kernel's (`r2vpo_kernels::avx2`, CPUs with AVX2 but neither AVX-512 nor
        // AMX): at these k it and gemm's AVX2 kernel both sum each output as
        // one FMA chain in k order. The gradients too where gemm runs the
        // backward, not where the AVX2 kernel or OpenBLAS does (sums of up
        // to 300 such terms, blocked over k in their own ways).
        // The reference choice (`R2VPO_MATMUL=reference`) sums unfused, so
        // it is within rounding too.
        use r2vpo_kernels::dispatch::{forward, Forward};
        let exact = m > 32 && matches!(forward(), Forward::Gemm | Forward::Avx2);
        let tol = if exact { f64::MIN_POSITIVE } else { 2e-4 };
        let gemm_backward = !r2vpo_kernels::dispatch::backward_blas() && forward() == Forward::Gemm;
        let grad_tol = if exact && gemm_backward { f64::MIN_POSITIVE } else { 2e-4 };
        compare_split(
            &|t| ops::linear(&t[0], &t[1]).unwrap(),
            &|t| t[0].matmul(&t[1].t().unwrap()).unwrap(),
            &[x, w],
            tol,
            grad_tol,
        );
    }
    // In f64 (candle's matmul whatever the rows): finite differences.
    check_fd(
        &|t| ops::linear(&t[0], &t[1]).unwrap(),
        &[pseudo(&[3, 5], 0.2, DType::F64), pseudo(&[4, 5], 0.9, DType::F64)],
        1e-6,
    );
}

/// Queries `(B, Hkv, G·T, D)` and keys and values as the KV cache hands
/// them over: the first `TK` rows of `(B, Hkv, cap, D)` buffers (returned
/// too), so not contiguous. `[B, Hkv, G, T, TK, D, cap]`.
fn cache_operands(dims: [usize; 7]) -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
    let [b, hk, g, t, tk, d, cap] = dims;
    let q = pseudo(&[b, hk, g * t, d], 0.3, DType::F32);
    let kbuf = pseudo(&[b, hk, cap, d], 1.1, DType::F32);
    let vbuf = pseudo(&[b, hk, cap, d], 2.3, DType::F32);
    let (k, v) = (kbuf.narrow(2, 0, tk).unwrap(), vbuf.narrow(2, 0, tk).unwrap());
    assert!(!k.is_contiguous());
    (q, kbuf, vbuf, k, v)
}

/// The no-grad attention kernel against matmul–softmax–matmul, on keys and
/// values that are views into larger buffers (as the KV cache hands them
/// over), with masked keys, GQA groups and several new tokens per row;
/// for head sizes of 64 and 128 (the kernel's register paths) and 20 (its
/// general one), key counts that are and are not a multiple of four, and
/// one to three new tokens (3, 6 or 9 query rows per kv head: every size
/// of the kernel's query blocks, 1 to 4, and blocks that start mid-token).
#[test]
fn attention_no_grad_matches_the_composite_on_cache_views() {
    for (d, tk, t) in [(20, 11, 2), (64, 11, 2), (64, 12, 2), (128, 13, 2), (64, 13, 1), (128, 12, 1), (64, 12, 3)] {
        attention_no_grad_case(d, tk, t);
    }
}

fn attention_no_grad_case(d: usize, tk: usize, t: usize) {
    let (b, hk, g, cap) = (3, 2, 3, 16);
    let (q, _, _, k, v) = cache_operands([b, hk, g, t, tk, d, cap]);
    // Row r masks its first r keys (left padding) and, causally, the last
    // key for the first new token.
    let mut m = vec![0f32; b * t * tk];
    for r in 0..b {
        for i in 0..t {
            for j in 0..tk {
                if j < r || (i == 0 && j == tk - 1) {
                    m[(r * t + i) * tk + j] = -1e9;
                }
            }
        }
    }
    let mask = Tensor::from_vec(m, (b, 1, 1, t, tk), &Device::Cpu).unwrap();
    let got = ops::attention_no_grad(&q, &k, &v, &mask, t, &[]).unwrap().expect("applies to f32 without a gradient");
    let want = ops::with_composites(|| ops::attention_composite(&q, &k, &v, &mask, t)).unwrap();
    let diff = max_abs_diff(&got, &want);
    assert!(diff < 1e-5, "attention (D {d}, {tk} keys, {t} new) differs by {diff}");
    // Not for a pass that records a gradient, nor for long passes.
    let qv = Var::from_tensor(&q).unwrap();
    assert!(ops::attention_no_grad(qv.as_tensor(), &k, &v, &mask, t, &[]).unwrap().is_none());
    let long = ops::ATTENTION_MAX_T + 1;
    let ql = pseudo(&[1, 1, long, d], 0.5, DType::F32);
    let kl = pseudo(&[1, 1, long, d], 0.6, DType::F32);
    let ml = Tensor::zeros((1, 1, 1, long, long), DType::F32, &Device::Cpu).unwrap();
    assert!(ops::attention_no_grad(&ql, &kl, &kl, &ml, long, &[]).unwrap().is_none());
}

/// A causal mask over `tk` keys for `t` new queries after `tk − t` cached
/// ones, row `r` left-padded by `r · pad` keys: its first queries see no
/// key at all, as a left-padded prompt's pad positions do.
fn causal_mask(b: usize, t: usize, tk: usize, pad: usize, dtype: DType) -> Tensor {
    let past = tk - t;
    let mut m = vec![0f64; b * t * tk];
    for r in 0..b {
        for i in 0..t {
            for j in 0..tk {
                if j > past + i || j < r * pad {
                    m[(r * t + i) * tk + j] = -1e9;
                }
            }
        }
    }
    Tensor::from_vec(m, (b, 1, 1, t, tk), &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// The fused attention against matmul–softmax–matmul in value and in all
/// three gradients, and against finite differences, with GQA groups, more
/// query rows than one block (so blocks skip hidden keys), fully masked
/// queries, and a cached prefix.
#[test]
fn attention_matches_composite_and_fd() {
    for &(b, hk, g, t, tk, d, pad) in &[(2, 2, 3, 70, 70, 8, 30), (3, 1, 2, 5, 9, 4, 2)] {
        let mask = causal_mask(b, t, tk, pad, DType::F64);
        let (m1, m2) = (mask.clone(), mask.clone());
        let f = move |x: &[Tensor]| ops::attention(&x[0], &x[1], &x[2], &m1, t).unwrap();
        let c = move |x: &[Tensor]| ops::attention_composite(&x[0], &x[1], &x[2], &m2, t).unwrap();
        let inputs = [
            pseudo(&[b, hk, g * t, d], 0.3, DType::F64),
            pseudo(&[b, hk, tk, d], 1.1, DType::F64),
            pseudo(&[b, hk, tk, d], 2.3, DType::F64),
        ];
        compare(&f, &c, &inputs, 1e-10);
        if t < 10 {
            check_fd(&f, &inputs, 1e-6);
        }
    }
}

/// In f32 on keys and values that are views into larger buffers (the KV
/// cache's layout), value and gradients against the composite, and the op
/// records a backward.
#[test]
fn attention_reads_cache_views_in_f32() {
    let (b, hk, g, t, tk, d, cap) = (2, 3, 3, 40, 100, 64, 128);
    let (q, kbuf, vbuf, k, v) = cache_operands([b, hk, g, t, tk, d, cap]);
    let mask = causal_mask(b, t, tk, 7, DType::F32);
    let scale = 0.125;
    let (m1, m2) = (mask.clone(), mask.clone());
    let f = move |x: &[Tensor]| {
        let (kv, vv) = (x[1].narrow(2, 0, tk).unwrap(), x[2].narrow(2, 0, tk).unwrap());
        ops::attention(&(&x[0] * scale).unwrap(), &kv, &vv, &m1, t).unwrap()
    };
    let c = move |x: &[Tensor]| {
        let (kv, vv) = (x[1].narrow(2, 0, tk).unwrap(), x[2].narrow(2, 0, tk).unwrap());
        ops::attention_composite(&(&x[0] * scale).unwrap(), &kv, &vv, &m2, t).unwrap()
    };
    compare(&f, &c, &[q.clone(), kbuf, vbuf], 1e-5);
    let qv = Var::from_tensor(&q).unwrap();
    assert!(ops::attention(qv.as_tensor(), &k, &v, &mask, t).unwrap().track_op());
    // Operands that do not fit together are refused with their shapes.
    let err = ops::attention(&q, &k, &v, &mask, t + 1).unwrap_err().to_string();
    assert!(err.contains("attention") && err.contains("mask"), "{err}");
}

/// Packed causal attention against each sequence's own matmul–softmax–
/// matmul (its prefix's keys then its own), in value and in all three
/// gradients, and against finite differences: sequences shorter and
/// longer than one block of query rows, an empty one, prompts shared as
/// prefixes by several sequences, GQA groups; f64 and f32.
#[test]
fn packed_attention_matches_each_sequence_alone() {
    use ops::Seq;
    // Each sequence: (length, index of the earlier sequence that is its prefix).
    type Spec = Vec<(usize, Option<usize>)>;
    let cases: [(usize, usize, usize, Spec); 3] = [
        (2, 3, 8, vec![(70, None), (3, Some(0)), (0, None), (130, Some(0)), (1, None), (9, Some(4))]),
        (1, 2, 4, vec![(5, None), (4, None)]),
        (1, 2, 4, vec![(3, None), (2, Some(0)), (3, Some(0))]),
    ];
    for (hk, g, d, spec) in cases {
        let mut seqs: Vec<Seq> = Vec::new();
        for &(len, pre) in &spec {
            let start = seqs.last().map_or(0, |s| s.start + s.len);
            let prefix = pre.map_or((0, 0), |j| (seqs[j].start, seqs[j].len));
            seqs.push(Seq { start, len, prefix });
        }
        let n: usize = spec.iter().map(|s| s.0).sum();
        let (s1, s2) = (seqs.clone(), seqs.clone());
        let f = move |x: &[Tensor]| ops::attention_varlen(&x[0], &x[1], &x[2], &s1).unwrap();
        let c = move |x: &[Tensor]| ops::attention_varlen_composite(&x[0], &x[1], &x[2], &s2).unwrap();
        for dtype in [DType::F64, DType::F32] {
            let inputs = [
                pseudo(&[1, hk, g * n, d], 0.3, dtype),
                pseudo(&[1, hk, n, d], 1.1, dtype),
                pseudo(&[1, hk, n, d], 2.3, dtype),
            ];
            compare(&f, &c, &inputs, if dtype == DType::F64 { 1e-10 } else { 1e-4 });
            if n < 10 && dtype == DType::F64 {
                check_fd(&f, &inputs, 1e-6);
            }
        }
        // The composite is itself each sequence alone: the first sequence's
        // rows equal a plain causal attention over it.
        let inputs = [
            pseudo(&[1, hk, g * n, d], 0.3, DType::F64),
            pseudo(&[1, hk, n, d], 1.1, DType::F64),
            pseudo(&[1, hk, n, d], 2.3, DType::F64),
        ];
        let l0 = spec[0].0;
        let q0 = inputs[0].reshape((1, hk, g, n, d)).unwrap().narrow(3, 0, l0).unwrap().contiguous().unwrap();
        let alone = ops::attention_composite(
            &q0.reshape((1, hk, g * l0, d)).unwrap(),
            &inputs[1].narrow(2, 0, l0).unwrap().contiguous().unwrap(),
            &inputs[2].narrow(2, 0, l0).unwrap().contiguous().unwrap(),
            &causal_mask(1, l0, l0, 0, DType::F64),
            l0,
        )
        .unwrap();
        let packed = f(&inputs).reshape((1, hk, g, n, d)).unwrap().narrow(3, 0, l0).unwrap();
        assert!(max_abs_diff(&packed.reshape((1, hk, g * l0, d)).unwrap(), &alone) < 1e-10);
    }
    // Sequences that do not tile the keys are refused with the shapes.
    let q = pseudo(&[1, 1, 6, 4], 0.1, DType::F32);
    let k = pseudo(&[1, 1, 6, 4], 0.2, DType::F32);
    let short = [Seq { start: 0, len: 2, prefix: (0, 0) }, Seq { start: 2, len: 3, prefix: (0, 2) }];
    let err = ops::attention_varlen(&q, &k, &k, &short).unwrap_err().to_string();
    assert!(err.contains("attention_varlen") && err.contains("tile"), "{err}");
}
