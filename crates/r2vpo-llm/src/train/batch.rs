//! Experience records and the padded tensors one forward/backward needs.

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

/// One sampled response with everything the update needs: Algorithm 2's
/// ⟨x, y, r, Â, log π_off⟩ tuple (the policy version is kept by the replay
/// buffer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Index of the problem in the training set.
    pub problem: usize,
    /// Prompt token ids (chat template applied).
    pub prompt_ids: Vec<u32>,
    /// Response token ids, including the final EOS/stop token if any.
    pub response_ids: Vec<u32>,
    /// Scalar reward.
    pub reward: f32,
    /// Whether the verifier judged the answer correct.
    pub correct: bool,
    /// Group-relative advantage.
    pub advantage: f32,
    /// log π_off per response token.
    pub behaviour_logp: Vec<f32>,
    /// log π_ref per response token (only with a reference-KL term).
    pub ref_logp: Option<Vec<f32>>,
}

/// A left-padded micro-batch. Responses end at the right edge, so the
/// per-token tensors cover only the last `R` = longest-response columns:
/// column `c` belongs to token `W − R + c` of its row, and a response of
/// length `r` occupies columns `[R − r, R)` (see
/// [`crate::model::Transformer::tail_logprobs`]).
pub struct TrainTensors {
    /// Token ids `(B, W)`, u32.
    pub ids: Tensor,
    /// 1 for real tokens, 0 for left padding `(B, W)`, u32.
    pub attention: Tensor,
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
}

/// Packs `samples` into left-padded training tensors.
pub fn pack(samples: &[&Sample], pad_id: u32, device: &Device) -> candle_core::Result<TrainTensors> {
    let b = samples.len();
    let tail = samples.iter().map(|s| s.response_ids.len()).max().unwrap_or(0).max(1);
    // At least one token of context precedes the scored tail.
    let w = samples.iter().map(|s| s.prompt_ids.len() + s.response_ids.len()).max().unwrap_or(0).max(tail + 1);
    let mut ids = vec![pad_id; b * w];
    let mut att = vec![0u32; b * w];
    let mut mask = vec![0f32; b * tail];
    let mut old = vec![0f32; b * tail];
    let mut adv = vec![0f32; b * tail];
    let with_ref = !samples.is_empty() && samples.iter().all(|s| s.ref_logp.is_some());
    let mut rf = vec![0f32; if with_ref { b * tail } else { 0 }];
    for (i, s) in samples.iter().enumerate() {
        let len = s.prompt_ids.len() + s.response_ids.len();
        let pad = w - len;
        for (k, &t) in s.prompt_ids.iter().chain(&s.response_ids).enumerate() {
            ids[i * w + pad + k] = t;
            att[i * w + pad + k] = 1;
        }
        let r = s.response_ids.len();
        for k in 0..r {
            let j = i * tail + tail - r + k;
            mask[j] = 1.0;
            old[j] = s.behaviour_logp[k];
            adv[j] = s.advantage;
            if with_ref {
                rf[j] = s.ref_logp.as_ref().expect("checked")[k];
            }
        }
    }
    let t = |v: Vec<f32>| Tensor::from_vec(v, (b, tail), device);
    Ok(TrainTensors {
        ids: Tensor::from_vec(ids, (b, w), device)?,
        attention: Tensor::from_vec(att, (b, w), device)?,
        tail,
        mask: t(mask)?,
        old_logp: t(old)?,
        advantages: t(adv)?,
        ref_logp: if with_ref { Some(t(rf)?) } else { None },
    })
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
        }
    }

    /// Targets, masks and old log-probs line up with the response tokens.
    #[test]
    fn pack_aligns_response_positions() {
        let a = sample(&[5, 6, 7], &[8, 9], 1.5);
        let b = sample(&[5], &[3, 4, 2], -0.5);
        let t = pack(&[&a, &b], 0, &Device::Cpu).unwrap();
        let ids: Vec<Vec<u32>> = t.ids.to_vec2().unwrap();
        assert_eq!(ids, vec![vec![5, 6, 7, 8, 9], vec![0, 5, 3, 4, 2]]);
        let att: Vec<Vec<u32>> = t.attention.to_vec2().unwrap();
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
    }
}
