//! The decoder on tiny random configs: every parameter gets a gradient,
//! whole-model finite differences in f64, padding invariance, KV-cache
//! decode against the full forward, scoring path = training path, and a
//! save/load round trip.

use candle_core::{DType, Device, Tensor, Var};
use r2vpo_llm::backend::candle::load_hf_dir;
use r2vpo_llm::backend::candle::{KvCache, PrefixedRows, Transformer};
use r2vpo_llm::model::{Architecture, ModelConfig};

const ARCHS: [Architecture; 3] = [Architecture::Llama, Architecture::Qwen2, Architecture::Qwen3];

fn tiny(arch: Architecture, tied: bool) -> ModelConfig {
    let mut c = ModelConfig::tiny(arch, 50, 32, 48, 2, 4, 2, tied);
    if arch == Architecture::Llama {
        // Exercise llama3 RoPE scaling in the gradient and cache tests too.
        c.rope_scaling = Some(serde_json::json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8
        }));
    }
    if arch == Architecture::Qwen3 {
        c.head_dim = Some(12);
    }
    c
}

fn model(arch: Architecture, tied: bool, dtype: DType) -> Transformer {
    Transformer::new_random(tiny(arch, tied), 7, dtype, &Device::Cpu).unwrap()
}

/// A left-padded batch: row 0 full, row 1 with 2 pads, row 2 with 4 pads.
fn batch() -> (Tensor, Tensor, Tensor) {
    let ids: Vec<Vec<u32>> =
        vec![vec![3, 17, 5, 44, 9, 21, 30, 2], vec![0, 0, 8, 19, 33, 4, 12, 41], vec![0, 0, 0, 0, 25, 6, 49, 11]];
    let mask: Vec<Vec<u32>> = vec![vec![1; 8], [vec![0; 2], vec![1; 6]].concat(), [vec![0; 4], vec![1; 4]].concat()];
    let targets: Vec<Vec<u32>> = ids.iter().map(|r| r[1..].iter().copied().chain([1]).collect()).collect();
    let d = Device::Cpu;
    (Tensor::new(ids, &d).unwrap(), Tensor::new(mask, &d).unwrap(), Tensor::new(targets, &d).unwrap())
}

/// Negative sum of log-probs over real, non-final positions.
fn loss(m: &Transformer) -> Tensor {
    let (ids, mask, tg) = batch();
    let lp = m.forward_logprobs(&ids, &mask, &tg).unwrap();
    let mut w = mask.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
    w.iter_mut().for_each(|r| *r.last_mut().unwrap() = 0.0);
    let w = Tensor::new(w, &Device::Cpu).unwrap().to_dtype(m.dtype()).unwrap();
    (lp * w).unwrap().sum_all().unwrap().neg().unwrap()
}

#[test]
fn every_parameter_receives_a_gradient() {
    for arch in ARCHS {
        for tied in [true, false] {
            let m = model(arch, tied, DType::F32);
            let grads = loss(&m).backward().unwrap();
            let vars = m.named_vars();
            assert!(!vars.is_empty());
            let mut missing = vec![];
            for (name, v) in &vars {
                match grads.get(v.as_tensor()) {
                    None => missing.push(name.clone()),
                    Some(g) => {
                        let n = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
                        assert!(n.is_finite() && n > 0.0, "{arch:?} {name}: gradient norm² {n}");
                    }
                }
            }
            assert!(missing.is_empty(), "{arch:?} tied={tied}: no gradient for {missing:?}");
        }
    }
}

#[test]
fn whole_model_gradients_match_finite_differences_f64() {
    for arch in ARCHS {
        let m = model(arch, false, DType::F64);
        let grads = loss(&m).backward().unwrap();
        let picks = [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.1.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.1.mlp.down_proj.weight",
            "model.norm.weight",
            "lm_head.weight",
        ];
        let vars = m.named_vars();
        let extra: Vec<&str> = vars
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| n.ends_with("q_norm.weight") || n.ends_with("k_proj.bias"))
            .collect();
        for name in picks.iter().copied().chain(extra) {
            let var: &Var = &vars.iter().find(|(n, _)| n == name).unwrap().1;
            let g: Vec<f64> = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            // The entry with the largest gradient, plus a fixed one.
            let big = g.iter().enumerate().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).unwrap().0;
            for idx in [big, base.len() / 3] {
                let eval = |d: f64| {
                    let mut v = base.clone();
                    v[idx] += d;
                    var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap()).unwrap();
                    loss(&m).to_scalar::<f64>().unwrap()
                };
                let eps = 1e-5;
                let fd = (eval(eps) - eval(-eps)) / (2.0 * eps);
                eval(0.0);
                let err = (fd - g[idx]).abs() / (1e-6 + fd.abs().max(g[idx].abs()));
                assert!(
                    err < 1e-5 || (fd - g[idx]).abs() < 1e-9,
                    "{arch:?} {name}[{idx}]: fd {fd:e} vs backward {:e} (rel {err:e})",
                    g[idx]
                );
            }
        }
    }
}

#[test]
fn scoring_path_equals_training_path_and_keeps_no_graph() {
    let m = model(Architecture::Qwen2, false, DType::F32);
    let (ids, mask, tg) = batch();
    let a = m.forward_logprobs(&ids, &mask, &tg).unwrap();
    let b = m.score_logprobs(&ids, &mask, &tg).unwrap();
    let d = (a - &b).unwrap().abs().unwrap().max_keepdim(1).unwrap().max(0).unwrap().to_vec1::<f32>().unwrap()[0];
    assert_eq!(d, 0.0);
    // A detached result has no gradient path back to the weights.
    let g = b.sum_all().unwrap().backward().unwrap();
    assert!(m.named_vars().iter().all(|(_, v)| g.get(v.as_tensor()).is_none()));
}

#[test]
fn left_padding_does_not_change_a_row() {
    for arch in ARCHS {
        let m = model(arch, true, DType::F32);
        let (ids, mask, tg) = batch();
        let batched = m.score_logprobs(&ids, &mask, &tg).unwrap().to_vec2::<f32>().unwrap();
        // Row 2 alone, without its 4 pads.
        let one = |t: &Tensor| t.narrow(0, 2, 1).unwrap().narrow(1, 4, 4).unwrap();
        let alone = m.score_logprobs(&one(&ids), &one(&mask), &one(&tg)).unwrap().to_vec2::<f32>().unwrap();
        for j in 0..4 {
            assert!(
                (batched[2][4 + j] - alone[0][j]).abs() < 1e-5,
                "{arch:?} pos {j}: {} vs {}",
                batched[2][4 + j],
                alone[0][j]
            );
        }
        assert!(batched.iter().flatten().all(|x| x.is_finite()));
    }
}

#[test]
fn kv_cache_decode_matches_full_forward() {
    for arch in ARCHS {
        let m = model(arch, false, DType::F32);
        let (ids, mask, _) = batch();
        let full: Vec<Vec<Vec<f32>>> = m.forward_logits(&ids, &mask).unwrap().to_vec3().unwrap();
        let mut cache = KvCache::new(&m, 3);
        // Prefill 5 tokens, then decode the remaining 3 one at a time.
        let step = |c: &mut KvCache, a: usize, n: usize| -> Vec<Vec<f32>> {
            m.forward_step(&ids.narrow(1, a, n).unwrap(), &mask.narrow(1, a, n).unwrap(), c).unwrap().to_vec2().unwrap()
        };
        let mut outs = vec![(4, step(&mut cache, 0, 5))];
        for p in 5..8 {
            outs.push((p, step(&mut cache, p, 1)));
        }
        assert_eq!(cache.len(), 8);
        assert_eq!(cache.positions(), vec![8, 6, 4]);
        for (p, o) in outs {
            for r in 0..3 {
                let d = o[r].iter().zip(&full[r][p]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(d < 1e-4, "{arch:?} row {r} pos {p}: cache vs full differ by {d}");
            }
        }
    }
}

/// A cache made for its length decodes the same bits as one that grows by
/// doubling, and one reserved too short still grows past its reserve.
#[test]
fn kv_cache_with_capacity_decodes_the_same_bits() {
    let m = model(ARCHS[0], false, DType::F32);
    let (ids, mask, _) = batch();
    let run = |mut c: KvCache| -> Vec<Vec<Vec<f32>>> {
        let mut outs = Vec::new();
        for (a, n) in [(0, 5), (5, 1), (6, 1), (7, 1)] {
            let o = m.forward_step(&ids.narrow(1, a, n).unwrap(), &mask.narrow(1, a, n).unwrap(), &mut c).unwrap();
            outs.push(o.to_vec2().unwrap());
        }
        assert_eq!(c.len(), 8);
        outs
    };
    let grown = run(KvCache::new(&m, 3));
    assert_eq!(run(KvCache::with_capacity(&m, 3, 8)), grown);
    assert_eq!(run(KvCache::with_capacity(&m, 3, 6)), grown);
}

#[test]
fn kv_cache_rows_can_feed_masked_padding() {
    // A finished row feeds a pad with mask 0; the other row must be unaffected.
    let m = model(Architecture::Llama, true, DType::F32);
    let d = Device::Cpu;
    let ids = Tensor::new(vec![vec![5u32, 6, 7], vec![8u32, 9, 10]], &d).unwrap();
    let ones = Tensor::ones((2, 3), DType::U32, &d).unwrap();
    let mut c = KvCache::new(&m, 2);
    m.forward_step(&ids, &ones, &mut c).unwrap();
    let next = Tensor::new(vec![vec![11u32], vec![0u32]], &d).unwrap();
    let nm = Tensor::new(vec![vec![1u32], vec![0u32]], &d).unwrap();
    let out = m.forward_step(&next, &nm, &mut c).unwrap().to_vec2::<f32>().unwrap();
    let solo = m
        .forward_logits(
            &Tensor::new(vec![vec![5u32, 6, 7, 11]], &d).unwrap(),
            &Tensor::ones((1, 4), DType::U32, &d).unwrap(),
        )
        .unwrap()
        .to_vec3::<f32>()
        .unwrap();
    let diff = out[0].iter().zip(&solo[0][3]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-4, "row 0 changed by {diff}");
    assert_eq!(c.positions(), vec![4, 3]);
}

#[test]
fn save_and_load_round_trip() {
    for arch in ARCHS {
        for tied in [true, false] {
            let m = model(arch, tied, DType::F32);
            let dir = tempfile::tempdir().unwrap();
            r2vpo_llm::backend::Policy::save_hf(&m, dir.path()).unwrap();
            let back = load_hf_dir(dir.path(), DType::F32, &Device::Cpu).unwrap();
            assert_eq!(back.config().architecture(), Some(arch));
            assert_eq!(back.num_parameters(), m.num_parameters());
            let (ids, mask, _) = batch();
            let a = m.forward_logits(&ids, &mask).unwrap();
            let b = back.forward_logits(&ids, &mask).unwrap();
            let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(d, 0.0, "{arch:?} tied={tied}");
            let has_head = back.named_vars().iter().any(|(n, _)| n == "lm_head.weight");
            assert_eq!(has_head, !tied);
        }
    }
}

#[test]
fn training_step_moves_log_probs() {
    // One plain SGD step on the NLL raises the mean log-prob: the gradients
    // flow into weights the forward actually uses.
    let m = model(Architecture::Qwen3, true, DType::F32);
    let before = loss(&m).to_scalar::<f32>().unwrap();
    let g = loss(&m).backward().unwrap();
    for (_, v) in m.named_vars() {
        let gv = g.get(v.as_tensor()).unwrap();
        v.set(&(v.as_tensor() - (gv * 0.01).unwrap()).unwrap()).unwrap();
    }
    let after = loss(&m).to_scalar::<f32>().unwrap();
    assert!(after < before, "loss {before} -> {after}");
}

#[test]
fn kv_cache_select_rows_keeps_decoding_the_chosen_rows() {
    let m = model(Architecture::Qwen3, true, DType::F32);
    let (ids, mask, _) = batch();
    let full: Vec<Vec<Vec<f32>>> = m.forward_logits(&ids, &mask).unwrap().to_vec3().unwrap();
    let mut c = KvCache::new(&m, 3);
    m.forward_step(&ids.narrow(1, 0, 7).unwrap(), &mask.narrow(1, 0, 7).unwrap(), &mut c).unwrap();
    // Keep rows 2 and 0 (in that order) and decode the last token.
    c.select_rows(&[2, 0]).unwrap();
    let idx = Tensor::new(&[2u32, 0], &Device::Cpu).unwrap();
    let last = |t: &Tensor| t.index_select(&idx, 0).unwrap().narrow(1, 7, 1).unwrap();
    let out = m.forward_step(&last(&ids), &last(&mask), &mut c).unwrap().to_vec2::<f32>().unwrap();
    for (k, r) in [2usize, 0].into_iter().enumerate() {
        let d = out[k].iter().zip(&full[r][7]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d < 1e-4, "row {r}: {d}");
    }
    assert!(c.select_rows(&[5]).is_err());
    assert!(m.forward_step(&ids.narrow(1, 0, 0).unwrap(), &mask.narrow(1, 0, 0).unwrap(), &mut c).is_err());
}

/// The trainer's tail path scores exactly the last r tokens of each row,
/// equal to the matching columns of the full path, with and without a
/// graph, and its gradient reaches every parameter.
#[test]
fn tail_logprobs_match_the_full_forward() {
    for arch in ARCHS {
        let m = model(arch, true, DType::F32);
        let (ids, mask, tg) = batch();
        let full: Vec<Vec<f32>> = m.forward_logprobs(&ids, &mask, &tg).unwrap().to_vec2().unwrap();
        let r = 3;
        for tail in [m.tail_logprobs(&ids, &mask, r).unwrap(), m.score_tail_logprobs(&ids, &mask, r).unwrap()] {
            let tail: Vec<Vec<f32>> = tail.to_vec2().unwrap();
            for (f, t) in full.iter().zip(&tail) {
                // Column c scores token W − r + c, predicted at position W − r − 1 + c.
                for c in 0..r {
                    assert!((f[8 - r - 1 + c] - t[c]).abs() < 1e-5, "{arch:?}: {} vs {}", f[8 - r - 1 + c], t[c]);
                }
            }
        }
        let grads = m.tail_logprobs(&ids, &mask, r).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, v) in m.named_vars() {
            assert!(grads.get(v.as_tensor()).is_some(), "{arch:?}: no gradient for {name}");
        }
        let ent: Vec<Vec<f32>> = m.tail_entropy(&ids, &mask, r).unwrap().to_vec2().unwrap();
        assert!(ent.iter().flatten().all(|&e| e > 0.0 && e <= (50f32).ln() + 1e-4), "{ent:?}");
        assert!(m.tail_logprobs(&ids, &mask, 8).is_err(), "a tail as wide as the batch has no context");
    }
}

/// Scoring rows that share prompts with each prompt run once gives the
/// same log-probs, entropies and gradients as scoring the whole rows.
#[test]
fn prefixed_tail_matches_whole_rows() {
    let d = Device::Cpu;
    // Two prompts (one shorter, so prefixes are left-padded) and four rows
    // with responses of different lengths.
    let prompts: [&[u32]; 2] = [&[3, 17, 5, 44, 9], &[25, 6, 49]];
    let rows: [(usize, &[u32]); 4] = [(0, &[21, 30, 2]), (1, &[12]), (0, &[8]), (1, &[19, 33])];
    let r = 3;
    let w = 5 + r;
    let (mut ids, mut mask) = (vec![], vec![]);
    let (mut sids, mut smask) = (vec![], vec![]);
    for (p, resp) in rows {
        let full: Vec<u32> = prompts[p].iter().chain(resp).copied().collect();
        ids.push([vec![0; w - full.len()], full.clone()].concat());
        mask.push([vec![0u32; w - full.len()], vec![1; full.len()]].concat());
        let suffix: Vec<u32> = [*prompts[p].last().unwrap()].iter().chain(resp).copied().collect();
        sids.push([vec![0; r + 1 - suffix.len()], suffix.clone()].concat());
        smask.push([vec![0u32; r + 1 - suffix.len()], vec![1; suffix.len()]].concat());
    }
    let pre: Vec<Vec<u32>> = vec![vec![3, 17, 5, 44], vec![0, 0, 25, 6]];
    let pmask: Vec<Vec<u32>> = vec![vec![1; 4], vec![0, 0, 1, 1]];
    let t = |v: Vec<Vec<u32>>| Tensor::new(v, &d).unwrap();
    let (ids, mask, sids, smask, pre, pmask) = (t(ids), t(mask), t(sids), t(smask), t(pre), t(pmask));
    let which = [0usize, 1, 0, 1];
    let resp_mask: Vec<Vec<f32>> =
        rows.iter().map(|(_, resp)| (0..r).map(|c| f32::from(c >= r - resp.len())).collect()).collect();
    let resp_mask = Tensor::new(resp_mask, &d).unwrap();
    for arch in ARCHS {
        let m = model(arch, arch != Architecture::Qwen2, DType::F32);
        let whole = m.tail_logprobs(&ids, &mask, r).unwrap();
        let grouped = PrefixedRows {
            prefix_ids: &pre,
            prefix_mask: &pmask,
            rows: &which,
            suffix_ids: &sids,
            suffix_mask: &smask,
        };
        let shared = m.prefixed_tail_logprobs(&grouped).unwrap();
        let scored = m.score_prefixed_tail_logprobs(&grouped).unwrap();
        let ents = [m.tail_entropy(&ids, &mask, r).unwrap(), m.prefixed_tail_entropy(&grouped).unwrap()];
        let masked = |x: &Tensor| -> Vec<Vec<f32>> { (x * &resp_mask).unwrap().to_vec2().unwrap() };
        let close = |a: &[Vec<f32>], b: &[Vec<f32>], what: &str| {
            let dmax = a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(dmax < 1e-5, "{arch:?} {what}: max |Δ| {dmax}");
        };
        close(&masked(&whole), &masked(&shared), "log-probs");
        close(&masked(&whole), &masked(&scored), "scored log-probs");
        close(&masked(&ents[0]), &masked(&ents[1]), "entropy");
        let g1 = (&whole * &resp_mask).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (&shared * &resp_mask).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, v) in m.named_vars() {
            let a = g1.get(v.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let b = g2.get(v.as_tensor()).unwrap_or_else(|| panic!("{arch:?}: no gradient for {name}"));
            let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let scale = a.iter().fold(1e-3f32, |s, x| s.max(x.abs()));
            let dmax = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(dmax < 1e-4 * scale.max(1.0), "{arch:?} {name}: max |Δgrad| {dmax} (scale {scale})");
        }
    }
    let too_few =
        PrefixedRows { prefix_ids: &pre, prefix_mask: &pmask, rows: &[0, 1], suffix_ids: &sids, suffix_mask: &smask };
    assert!(model(Architecture::Llama, true, DType::F32).prefixed_tail_logprobs(&too_few).is_err());
}

/// A decode long enough for the cache to outgrow its buffers twice (they
/// start at 64 columns and double), with rows reordered and leading padding
/// trimmed on the way, still gives the full forward's logits at every step.
#[test]
fn kv_cache_growing_reordered_and_trimmed_matches_full_forward() {
    let m = model(Architecture::Qwen3, false, DType::F32);
    let d = Device::Cpu;
    let (w, pads) = (150usize, [0usize, 9]);
    let ids: Vec<Vec<u32>> = (0..2)
        .map(|r| (0..w).map(|i| if i < pads[r] { 0 } else { ((i * 7 + r * 13) % 49 + 1) as u32 }).collect())
        .collect();
    let mask: Vec<Vec<u32>> = (0..2).map(|r| (0..w).map(|i| u32::from(i >= pads[r])).collect()).collect();
    let full: Vec<Vec<Vec<f32>>> = m
        .forward_logits(&Tensor::new(ids.clone(), &d).unwrap(), &Tensor::new(mask.clone(), &d).unwrap())
        .unwrap()
        .to_vec3()
        .unwrap();
    // `order[i]` is the original row now at cache row i.
    let mut order = vec![0usize, 1];
    let mut cache = KvCache::new(&m, 2);
    let mut a = 0;
    for n in std::iter::once(12).chain(std::iter::repeat_n(1, w - 12)) {
        let take = |src: &Vec<Vec<u32>>| -> Tensor {
            Tensor::new(order.iter().map(|&r| src[r][a..a + n].to_vec()).collect::<Vec<_>>(), &d).unwrap()
        };
        let out: Vec<Vec<f32>> = m.forward_step(&take(&ids), &take(&mask), &mut cache).unwrap().to_vec2().unwrap();
        a += n;
        for (i, &r) in order.iter().enumerate() {
            let diff = out[i].iter().zip(&full[r][a - 1]).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-4, "row {r} at position {}: cache vs full differ by {diff}", a - 1);
        }
        if a == 70 {
            cache.select_rows(&[1, 0]).unwrap();
            order = vec![1, 0];
        }
        if a == 100 {
            // Nothing to trim (row 0 has no padding); the call must change nothing.
            cache.trim_padding().unwrap();
        }
    }
    assert_eq!(cache.len(), w);
}

/// The scoring passes run the head a chunk of rows at a time; at SmolLM2's
/// head shape (576 → 49152), every chunking gives the training path's
/// log-probs bit for bit, so the trainer's first ratios are exactly 1
/// (no chunk goes to a few-row kernel, which sums in another order).
#[test]
fn chunked_scoring_equals_the_training_path_bit_for_bit() {
    let cfg = ModelConfig::tiny(Architecture::Llama, 49152, 576, 64, 1, 9, 3, true);
    let mut m = Transformer::new_random(cfg, 7, DType::F32, &Device::Cpu).unwrap();
    let (b, w, r) = (4, 130, 128);
    let ids: Vec<u32> = (0..b * w).map(|i| (i as u32 * 7919) % 49152).collect();
    let ids = Tensor::from_vec(ids, (b, w), &Device::Cpu).unwrap();
    let mask = Tensor::ones((b, w), DType::U32, &Device::Cpu).unwrap();
    let whole: Vec<Vec<f32>> = m.tail_logprobs(&ids, &mask, r).unwrap().to_vec2().unwrap();
    // 7 to 64 are at or below the few-row kernels' limit (64 rows on AMX),
    // so the chunks must grow past it; 100 (cut to 64-row tiles, then 65
    // rows) leaves a 57-row remainder that must join a chunk.
    for rows in [7, 20, 33, 64, 100, 341, 10_000] {
        m.set_logits_chunk(rows * 49152);
        let chunked: Vec<Vec<f32>> = m.score_tail_logprobs(&ids, &mask, r).unwrap().to_vec2().unwrap();
        assert_eq!(chunked, whole, "chunks of {rows} rows");
    }
}

/// A model opened for inference with a bf16 spec on the candle backend
/// holds its weight matrices in bf16 and computes in f32: its scoring and
/// its KV-cached decoding equal, to f32 summation order, an f32 model whose
/// weights were rounded to bf16, for every architecture, tied and untied;
/// the rounding is real (they differ from the unrounded f32 model); and a
/// weight push is rounded on load the same way.
#[test]
fn bf16_weights_for_inference_are_f32_compute_on_rounded_weights() {
    use r2vpo_llm::backend::open::{open, open_inference, BackendSpec, Opened};
    use r2vpo_llm::backend::{ComputeDtype, OptimConfig, Policy};
    use r2vpo_llm::model::source::NamedTensors;
    use r2vpo_llm::model::{RandomInit, TensorSource};
    let rounded = |src: &dyn TensorSource| -> NamedTensors {
        let map = src
            .names()
            .into_iter()
            .map(|n| {
                let t = src.tensor(&n).unwrap().to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
                (n, t)
            })
            .collect();
        NamedTensors::new("rounded", map)
    };
    // Which bf16 weight kernels this CPU runs (r2vpo-kernels' unit tests
    // compare each with f64; this test runs the one the dispatch picks),
    // on the record `make test` prints.
    let kernels = r2vpo_kernels::bf16w::Kernel::ALL;
    let (ran, skipped): (Vec<_>, Vec<_>) = kernels.into_iter().partition(|k| k.runs());
    let names = |ks: &[r2vpo_kernels::bf16w::Kernel]| ks.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ");
    r2vpo_report::golden::report(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        &format!(
            "bf16 weight products (r2vpo_kernels::bf16w): kernels run and tested on this CPU: {}; not runnable here: {}",
            names(&ran),
            if skipped.is_empty() { "none".into() } else { names(&skipped) }
        ),
    );
    let spec = BackendSpec { compute_dtype: ComputeDtype::Bf16, ..Default::default() };
    let f32_spec = BackendSpec::default();
    let candle = |o: Opened| match o {
        Opened::Candle(m) => m,
        #[allow(unreachable_patterns)]
        _ => panic!("candle spec"),
    };
    let rel = |a: &[Vec<f32>], b: &[Vec<f32>]| -> f32 {
        let (mut d, mut s) = (0f32, 0f32);
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            d = d.max((x - y).abs());
            s = s.max(y.abs());
        }
        d / s
    };
    for arch in ARCHS {
        for tied in [true, false] {
            let cfg = tiny(arch, tied);
            let src = RandomInit::new(cfg.clone(), 11, 0.3);
            let m16 = candle(open_inference(&spec, &cfg, &src).unwrap());
            assert!(m16.bf16_weights() && m16.dtype() == DType::BF16, "{arch:?}: bf16 storage");
            let mr = candle(open(&f32_spec, &cfg, &rounded(&src), OptimConfig::default()).unwrap());
            let m32 = candle(open(&f32_spec, &cfg, &src, OptimConfig::default()).unwrap());
            // A learner's bf16 stays mixed precision with f32 masters.
            let learner = candle(open(&spec, &cfg, &src, OptimConfig::default()).unwrap());
            assert!(!learner.bf16_weights() && learner.dtype() == DType::F32);

            let (ids, mask, tg) = batch();
            // Scoring without a graph: the path a server's and an actor's
            // log-probs take.
            let score =
                |m: &Transformer| -> Vec<Vec<f32>> { m.score_logprobs(&ids, &mask, &tg).unwrap().to_vec2().unwrap() };
            let (s16, sr, s32) = (score(&m16), score(&mr), score(&m32));
            assert!(rel(&s16, &sr) < 2e-6, "{arch:?} tied {tied}: scoring off by {:e}", rel(&s16, &sr));
            assert!(rel(&s32, &sr) > 1e-4, "{arch:?}: the weights were not rounded ({:e})", rel(&s32, &sr));

            let decode = |m: &Transformer| -> Vec<Vec<Vec<f32>>> {
                let mut c = KvCache::new(m, 3);
                [(0, 5), (5, 1), (6, 1), (7, 1)]
                    .iter()
                    .map(|&(a, n)| {
                        let o = m
                            .forward_step(&ids.narrow(1, a, n).unwrap(), &mask.narrow(1, a, n).unwrap(), &mut c)
                            .unwrap();
                        o.to_vec2().unwrap()
                    })
                    .collect()
            };
            for (step, (d16, dr)) in decode(&m16).iter().zip(decode(&mr)).enumerate() {
                assert!(rel(d16, &dr) < 2e-6, "{arch:?} tied {tied} step {step}: decode off by {:e}", rel(d16, &dr));
            }

            // A push of other weights: rounded to bf16 on load.
            let src2 = RandomInit::new(cfg.clone(), 12, 0.3);
            m16.load(&src2).unwrap();
            let mr2 = candle(open(&f32_spec, &cfg, &rounded(&src2), OptimConfig::default()).unwrap());
            assert!(m16.bf16_weights(), "a push keeps the storage dtype");
            assert!(rel(&score(&m16), &score(&mr2)) < 2e-6, "{arch:?}: pushed weights");
        }
    }
}
