//! The tensors one forward/backward of a micro-batch needs, packed from
//! experience records: what every backend takes, whatever it computes on.

use candle_core::{DType, Device, Tensor};

use crate::experience::Sample;

/// The token inputs of a micro-batch, in one of two equivalent layouts.
pub enum Inputs {
    /// Whole rows, prompt then response, left-padded to a common width:
    /// token ids and attention mask `(B, W)`, u32.
    Padded {
        /// Token ids `(B, W)`.
        ids: Tensor,
        /// 1 for real tokens, 0 for left padding `(B, W)`.
        attention: Tensor,
    },
    /// Each distinct prompt once ([`SharedPrompts`]).
    Prefixed(SharedPrompts),
    /// Every sample laid end to end without padding ([`PackedSequences`]).
    Packed(PackedSequences),
}

/// One sequence of a packed row: positions `start..start + len`, causal
/// within themselves, after the keys of an earlier span `prefix` (start,
/// length; length 0 for none) that each of its queries sees whole. A prompt
/// is a sequence; each of its responses is another, whose prefix is the
/// prompt and whose token positions continue from the prompt's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seq {
    /// First packed position.
    pub start: usize,
    /// Positions.
    pub len: usize,
    /// The span `(start, length)` of earlier positions every query of this
    /// sequence sees (its prompt), length 0 for none.
    pub prefix: (usize, usize),
}

/// A micro-batch's samples laid end to end in one row with no padding:
/// each distinct prompt once, then each of its responses, attending to the
/// prompt and causally to itself (block-diagonal attention with a shared
/// prefix, [`crate::backend::candle::ops::attention_varlen`]). The layers'
/// products run on real tokens only, and a group of G samples of one
/// prompt runs the prompt once. verl's `use_remove_padding`, OpenRLHF's
/// and prime-rl's packing pack the same way (without the prompt shared).
/// The LM head runs only on the rows that predict a response token (a
/// prompt's last row predicts the first token of each of its responses),
/// and their log-probs land in the micro-batch's `(B, R)` tail layout, so
/// the loss, its aggregation and every per-token tensor are the padded
/// layout's.
#[derive(Clone)]
pub struct PackedSequences {
    /// Token ids `(1, N)`, u32.
    pub ids: Tensor,
    /// The sequences, tiling `0..N` in order.
    pub seqs: Vec<Seq>,
    /// Each packed position's token position (RoPE): a prompt's from 0, a
    /// response's from its prompt's length.
    pub positions: Vec<usize>,
    /// The packed position whose output predicts each response token,
    /// sample by sample `(S,)` u32, `S = Σ response lengths`.
    pub scored: Tensor,
    /// Those response tokens `(S,)` u32.
    pub targets: Tensor,
    /// Each slot of the flattened `(B, R)` tail: its row in `scored`, or
    /// `S` (a zero appended) for a slot left of a shorter response
    /// `(B·R,)` u32.
    pub to_tail: Tensor,
    /// Each scored row's slot in the flattened `(B, R)` tail `(S,)` u32.
    pub from_tail: Tensor,
}

impl PackedSequences {
    /// Values of the scored rows `(S,)` (log-probs, entropies) in the
    /// micro-batch's tail layout `(B, R)`, 0 at padding slots;
    /// differentiable (an `index_select`, whose backward adds back).
    pub fn to_tail(&self, flat: &Tensor, b: usize, r: usize) -> candle_core::Result<Tensor> {
        let zero = Tensor::zeros(1, flat.dtype(), flat.device())?;
        Tensor::cat(&[flat, &zero], 0)?.index_select(&self.to_tail, 0)?.reshape((b, r))
    }

    /// A tail-layout tensor `(B, R)` (a loss's gradient) as the scored
    /// rows' values `(S,)`.
    pub fn from_tail(&self, tail: &Tensor) -> candle_core::Result<Tensor> {
        tail.flatten_all()?.index_select(&self.from_tail, 0)
    }
}

/// Each distinct prompt once, minus its last token, in `prefix_ids (U, P)`;
/// row `b` continues prefix `rows[b]` with `suffix_ids (B, R + 1)` = the
/// prompt's last token then the response, left-padded (see
/// [`crate::backend::candle::Transformer::prefixed_tail_logprobs`]).
pub struct SharedPrompts {
    /// Distinct prompt prefixes `(U, P)`, left-padded.
    pub prefix_ids: Tensor,
    /// Their attention mask `(U, P)`.
    pub prefix_attention: Tensor,
    /// The prefix each row continues.
    pub rows: Vec<usize>,
    /// Last prompt token + response `(B, R + 1)`, left-padded.
    pub suffix_ids: Tensor,
    /// Their attention mask `(B, R + 1)`.
    pub suffix_attention: Tensor,
}

impl SharedPrompts {
    /// The borrowed view the model's prefixed passes take.
    pub fn as_rows(&self) -> PrefixedRows<'_> {
        PrefixedRows {
            prefix_ids: &self.prefix_ids,
            prefix_mask: &self.prefix_attention,
            rows: &self.rows,
            suffix_ids: &self.suffix_ids,
            suffix_mask: &self.suffix_attention,
        }
    }
}

/// A micro-batch ready for a backend. Responses end at the right edge, so
/// the per-token tensors cover only the last `R` = longest-response columns:
/// a response of length `r` occupies columns `[R − r, R)` (see
/// [`crate::backend::candle::Transformer::tail_logprobs`]), whichever [`Inputs`]
/// layout carries the tokens.
pub struct MicroBatch {
    /// The tokens.
    pub inputs: Inputs,
    /// `R`, the number of scored columns.
    pub tail: usize,
    /// 1 at response tokens `(B, R)`, f32.
    pub mask: Tensor,
    /// log π_off at response tokens, 0 elsewhere `(B, R)`, f32.
    pub old_logp: Tensor,
    /// Advantage broadcast over the response tokens `(B, R)`, f32.
    pub advantages: Tensor,
    /// log π_ref at response tokens (when every sample has one) `(B, R)`.
    pub ref_logp: Option<Tensor>,
    /// Rollout–trainer mismatch weights at response tokens, 0 elsewhere
    /// (when every sample has them) `(B, R)`.
    pub is_weight: Option<Tensor>,
}

/// Completes a micro-batch around `inputs` with the per-token tensors both
/// layouts share: mask, behaviour and reference log-probs, advantages.
fn with_tail(inputs: Inputs, samples: &[&Sample], tail: usize, device: &Device) -> candle_core::Result<MicroBatch> {
    let b = samples.len();
    let mut mask = vec![0f32; b * tail];
    let mut old = vec![0f32; b * tail];
    let mut adv = vec![0f32; b * tail];
    let with_ref = !samples.is_empty() && samples.iter().all(|s| s.ref_logp.is_some());
    let mut rf = vec![0f32; if with_ref { b * tail } else { 0 }];
    let with_w = !samples.is_empty() && samples.iter().all(|s| s.is_weight.is_some());
    let mut w = vec![0f32; if with_w { b * tail } else { 0 }];
    for (i, s) in samples.iter().enumerate() {
        let r = s.response_ids.len();
        for k in 0..r {
            let j = i * tail + tail - r + k;
            mask[j] = 1.0;
            old[j] = s.behaviour_logp[k];
            adv[j] = s.advantage;
            if with_ref {
                rf[j] = s.ref_logp.as_ref().expect("checked")[k];
            }
            if with_w {
                w[j] = s.is_weight.as_ref().expect("checked")[k];
            }
        }
    }
    let t = |v: Vec<f32>| Tensor::from_vec(v, (b, tail), device);
    Ok(MicroBatch {
        inputs,
        tail,
        mask: t(mask)?,
        old_logp: t(old)?,
        advantages: t(adv)?,
        ref_logp: if with_ref { Some(t(rf)?) } else { None },
        is_weight: if with_w { Some(t(w)?) } else { None },
    })
}

/// Packs `samples` into whole left-padded rows ([`Inputs::Padded`]).
pub fn pack(samples: &[&Sample], pad_id: u32, device: &Device) -> candle_core::Result<MicroBatch> {
    let b = samples.len();
    let tail = samples.iter().map(|s| s.response_ids.len()).max().unwrap_or(0).max(1);
    // At least one token of context precedes the scored tail.
    let w = samples.iter().map(|s| s.prompt_ids.len() + s.response_ids.len()).max().unwrap_or(0).max(tail + 1);
    let mut ids = vec![pad_id; b * w];
    let mut att = vec![0u32; b * w];
    for (i, s) in samples.iter().enumerate() {
        let len = s.prompt_ids.len() + s.response_ids.len();
        let pad = w - len;
        for (k, &t) in s.prompt_ids.iter().chain(&s.response_ids).enumerate() {
            ids[i * w + pad + k] = t;
            att[i * w + pad + k] = 1;
        }
    }
    let inputs = Inputs::Padded {
        ids: Tensor::from_vec(ids, (b, w), device)?,
        attention: Tensor::from_vec(att, (b, w), device)?,
    };
    with_tail(inputs, samples, tail, device)
}

/// Packs `samples` with each distinct prompt stored once
/// ([`Inputs::Prefixed`]); falls back to [`pack`] when sharing cannot help
/// (every prompt a single token, or an empty prompt).
pub fn pack_prefixed(samples: &[&Sample], pad_id: u32, device: &Device) -> candle_core::Result<MicroBatch> {
    if samples.iter().any(|s| s.prompt_ids.is_empty()) || samples.iter().all(|s| s.prompt_ids.len() < 2) {
        return pack(samples, pad_id, device);
    }
    let mut distinct: Vec<&[u32]> = Vec::new();
    let mut rows = Vec::with_capacity(samples.len());
    for s in samples {
        let prefix = &s.prompt_ids[..s.prompt_ids.len() - 1];
        let u = match distinct.iter().position(|d| *d == prefix) {
            Some(u) => u,
            None => {
                distinct.push(prefix);
                distinct.len() - 1
            }
        };
        rows.push(u);
    }
    let (u, p) = (distinct.len(), distinct.iter().map(|d| d.len()).max().unwrap_or(0));
    let mut pids = vec![pad_id; u * p];
    let mut patt = vec![0u32; u * p];
    for (i, d) in distinct.iter().enumerate() {
        let pad = p - d.len();
        pids[i * p + pad..(i + 1) * p].copy_from_slice(d);
        patt[i * p + pad..(i + 1) * p].fill(1);
    }
    let b = samples.len();
    let tail = samples.iter().map(|s| s.response_ids.len()).max().unwrap_or(0).max(1);
    let w = tail + 1;
    let mut sids = vec![pad_id; b * w];
    let mut satt = vec![0u32; b * w];
    for (i, s) in samples.iter().enumerate() {
        let last = *s.prompt_ids.last().expect("non-empty");
        let pad = w - 1 - s.response_ids.len();
        for (k, &t) in std::iter::once(&last).chain(&s.response_ids).enumerate() {
            sids[i * w + pad + k] = t;
            satt[i * w + pad + k] = 1;
        }
    }
    let inputs = Inputs::Prefixed(SharedPrompts {
        prefix_ids: Tensor::from_vec(pids, (u, p), device)?,
        prefix_attention: Tensor::from_vec(patt, (u, p), device)?,
        rows,
        suffix_ids: Tensor::from_vec(sids, (b, w), device)?,
        suffix_attention: Tensor::from_vec(satt, (b, w), device)?,
    });
    with_tail(inputs, samples, tail, device)
}

/// Packs `samples` end to end without padding ([`Inputs::Packed`]), each
/// distinct prompt once, in order of first appearance; falls back to
/// [`pack`] when a prompt is empty (its first response token would have no
/// context to be scored from).
pub fn pack_sequences(samples: &[&Sample], pad_id: u32, device: &Device) -> candle_core::Result<MicroBatch> {
    if samples.is_empty() || samples.iter().any(|s| s.prompt_ids.is_empty()) {
        return pack(samples, pad_id, device);
    }
    let b = samples.len();
    let tail = samples.iter().map(|s| s.response_ids.len()).max().unwrap_or(0).max(1);
    // Each distinct prompt, with its samples in order.
    let mut prompts: Vec<(&[u32], Vec<usize>)> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        match prompts.iter_mut().find(|(p, _)| *p == s.prompt_ids.as_slice()) {
            Some((_, rows)) => rows.push(i),
            None => prompts.push((&s.prompt_ids, vec![i])),
        }
    }
    let s_total: usize = samples.iter().map(|s| s.response_ids.len()).sum();
    let (mut ids, mut seqs, mut positions) = (Vec::new(), Vec::new(), Vec::new());
    let mut scored = vec![0u32; s_total];
    let mut targets = vec![0u32; s_total];
    let mut to_tail = vec![s_total as u32; b * tail];
    let mut from_tail = vec![0u32; s_total];
    // Scored rows go in sample order, whatever the packing order.
    let first: Vec<usize> = samples
        .iter()
        .scan(0, |at, s| {
            let f = *at;
            *at += s.response_ids.len();
            Some(f)
        })
        .collect();
    for (prompt, rows) in &prompts {
        let (p0, pl) = (ids.len(), prompt.len());
        ids.extend_from_slice(prompt);
        positions.extend(0..pl);
        seqs.push(Seq { start: p0, len: pl, prefix: (0, 0) });
        for &i in rows {
            let s = samples[i];
            let (c0, r) = (ids.len(), s.response_ids.len());
            if r == 0 {
                continue;
            }
            ids.extend_from_slice(&s.response_ids);
            positions.extend(pl..pl + r);
            seqs.push(Seq { start: c0, len: r, prefix: (p0, pl) });
            for k in 0..r {
                let (row, slot) = (first[i] + k, i * tail + tail - r + k);
                to_tail[slot] = row as u32;
                from_tail[row] = slot as u32;
                // The prompt's last position predicts the first response
                // token; each response position the one after it.
                scored[row] = if k == 0 { (p0 + pl - 1) as u32 } else { (c0 + k - 1) as u32 };
                targets[row] = s.response_ids[k];
            }
        }
    }
    let n = ids.len();
    let v = |x: Vec<u32>| {
        let len = x.len();
        Tensor::from_vec(x, len, device)
    };
    let inputs = Inputs::Packed(PackedSequences {
        ids: Tensor::from_vec(ids, (1, n), device)?,
        seqs,
        positions,
        scored: v(scored)?,
        targets: v(targets)?,
        to_tail: v(to_tail)?,
        from_tail: v(from_tail)?,
    });
    with_tail(inputs, samples, tail, device)
}

/// The response part of each row of a `(B, R)` tail tensor built by
/// [`pack`] (e.g. recomputed log-probs), as one vector per sample.
pub fn unpack_responses(values: &Tensor, samples: &[&Sample]) -> candle_core::Result<Vec<Vec<f32>>> {
    let rows: Vec<Vec<f32>> = values.to_dtype(DType::F32)?.to_vec2()?;
    Ok(rows
        .into_iter()
        .zip(samples)
        .map(|(row, s)| {
            let (w, r) = (row.len(), s.response_ids.len());
            row[w - r..].to_vec()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(p: &[u32], r: &[u32], adv: f32) -> Sample {
        Sample {
            problem: 0,
            prompt_ids: p.to_vec(),
            response_ids: r.to_vec(),
            reward: 0.0,
            correct: false,
            advantage: adv,
            behaviour_logp: r.iter().map(|&t| -(t as f32)).collect(),
            ref_logp: None,
            is_weight: None,
            version: 0,
        }
    }

    /// Targets, masks and old log-probs line up with the response tokens.
    #[test]
    fn pack_aligns_response_positions() {
        let a = sample(&[5, 6, 7], &[8, 9], 1.5);
        let b = sample(&[5], &[3, 4, 2], -0.5);
        let t = pack(&[&a, &b], 0, &Device::Cpu).unwrap();
        let Inputs::Padded { ids, attention } = &t.inputs else { panic!("pack makes padded rows") };
        let ids: Vec<Vec<u32>> = ids.to_vec2().unwrap();
        assert_eq!(ids, vec![vec![5, 6, 7, 8, 9], vec![0, 5, 3, 4, 2]]);
        let att: Vec<Vec<u32>> = attention.to_vec2().unwrap();
        assert_eq!(att, vec![vec![1, 1, 1, 1, 1], vec![0, 1, 1, 1, 1]]);
        assert_eq!(t.tail, 3);
        let m: Vec<Vec<f32>> = t.mask.to_vec2().unwrap();
        let old: Vec<Vec<f32>> = t.old_logp.to_vec2().unwrap();
        let adv: Vec<Vec<f32>> = t.advantages.to_vec2().unwrap();
        for (row, s) in [&a, &b].iter().enumerate() {
            // Column c of the tail is token W − R + c of the row.
            let picked: Vec<u32> = (0..3).filter(|&c| m[row][c] == 1.0).map(|c| ids[row][5 - 3 + c]).collect();
            assert_eq!(picked, s.response_ids);
            let lp: Vec<f32> = (0..3).filter(|&c| m[row][c] == 1.0).map(|c| old[row][c]).collect();
            assert_eq!(lp, s.behaviour_logp);
            assert!((0..3).all(|c| adv[row][c] == if m[row][c] == 1.0 { s.advantage } else { 0.0 }));
        }
        let back = unpack_responses(&t.old_logp, &[&a, &b]).unwrap();
        assert_eq!(back, vec![a.behaviour_logp.clone(), b.behaviour_logp.clone()]);
        assert!(t.is_weight.is_none(), "no weights without a correction");
        // Mismatch weights land on the response columns of every layout.
        let (mut a, mut b) = (a, b);
        a.is_weight = Some(vec![0.5, 2.0]);
        b.is_weight = Some(vec![1.0, 0.0, 1.5]);
        for t in [pack(&[&a, &b], 0, &Device::Cpu).unwrap(), pack_sequences(&[&a, &b], 0, &Device::Cpu).unwrap()] {
            let w = t.is_weight.expect("every sample has weights");
            assert_eq!(w.to_vec2::<f32>().unwrap(), vec![vec![0.0, 0.5, 2.0], vec![1.0, 0.0, 1.5]]);
        }
    }

    /// Shared prompts are stored once; each row's suffix is the prompt's
    /// last token then the response, right-aligned like `pack`'s tail.
    #[test]
    fn pack_prefixed_stores_each_prompt_once() {
        let a = sample(&[5, 6, 7], &[8, 9], 1.5);
        let b = sample(&[4], &[3, 4, 2], -0.5);
        let c = sample(&[5, 6, 7], &[1], 0.5);
        let t = pack_prefixed(&[&a, &b, &c], 0, &Device::Cpu).unwrap();
        let Inputs::Prefixed(SharedPrompts { prefix_ids, prefix_attention, rows, suffix_ids, suffix_attention }) =
            &t.inputs
        else {
            panic!("prompts of two tokens or more share a prefix")
        };
        assert_eq!(rows, &vec![0, 1, 0]);
        assert_eq!(prefix_ids.to_vec2::<u32>().unwrap(), vec![vec![5, 6], vec![0, 0]]);
        assert_eq!(prefix_attention.to_vec2::<u32>().unwrap(), vec![vec![1, 1], vec![0, 0]]);
        assert_eq!(suffix_ids.to_vec2::<u32>().unwrap(), vec![vec![0, 7, 8, 9], vec![4, 3, 4, 2], vec![0, 0, 7, 1]]);
        assert_eq!(suffix_attention.to_vec2::<u32>().unwrap(), vec![vec![0, 1, 1, 1], vec![1; 4], vec![0, 0, 1, 1]]);
        let plain = pack(&[&a, &b, &c], 0, &Device::Cpu).unwrap();
        assert_eq!(t.tail, plain.tail);
        for (x, y) in [(&t.mask, &plain.mask), (&t.old_logp, &plain.old_logp), (&t.advantages, &plain.advantages)] {
            assert_eq!(x.to_vec2::<f32>().unwrap(), y.to_vec2::<f32>().unwrap());
        }
        let single = sample(&[5], &[8], 1.0);
        assert!(matches!(pack_prefixed(&[&single], 0, &Device::Cpu).unwrap().inputs, Inputs::Padded { .. }));
    }
}

/// Rows that share prompts, for the candle backend's shared-prefix passes
/// (`Transformer::prefixed_tail_logprobs`):
/// row `b` is the prefix `rows[b]` of `prefix_ids` followed by its own
/// `suffix_ids` row. Both blocks are left-padded, their masks 1 at real tokens.
#[derive(Clone, Copy, Debug)]
pub struct PrefixedRows<'a> {
    /// Distinct prefixes `(U, P)`.
    pub prefix_ids: &'a Tensor,
    /// Their attention mask `(U, P)`.
    pub prefix_mask: &'a Tensor,
    /// The prefix (index into `prefix_ids`) each row continues; `B` entries.
    pub rows: &'a [usize],
    /// Each row's continuation `(B, S)`; its first real token is context only.
    pub suffix_ids: &'a Tensor,
    /// Their attention mask `(B, S)`.
    pub suffix_mask: &'a Tensor,
}
