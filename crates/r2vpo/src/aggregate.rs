//! Loss aggregation: how a `(B, T)` matrix of per-token losses becomes one
//! scalar.
//!
//! The four modes follow verl's `agg_loss` (see `shared/notes/llm-rl-anchors.md`
//! §1). Every mode divides by totals of the **global** batch, handed in as a
//! [`GlobalBatch`], never by counts of the micro-batch at hand: summing the
//! micro-batch losses of an accumulated step then gives exactly the
//! full-batch loss, and so exactly its gradient (the bug class verl fixed in
//! PR#906/#3332).

use candle_core::{DType, Tensor, D};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How per-token losses are reduced to the scalar that is differentiated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregation {
    /// Σ_{i,t} ℓ·m / (tokens in the global batch). Long responses weigh more
    /// (DAPO's token-level loss; verl's and TRL's default).
    #[default]
    TokenMean,
    /// Mean over sequences of each sequence's token mean (the original GRPO).
    SeqMeanTokenMean,
    /// Mean over sequences of each sequence's token sum.
    SeqMeanTokenSum,
    /// Σ_{i,t} ℓ·m / (sequences × a constant horizon) — Dr.GRPO's
    /// length-unbiased normaliser; the horizon is [`GlobalBatch::horizon`].
    SeqMeanTokenSumNorm,
}

impl Aggregation {
    /// The config name (the serde name: `token-mean`, `seq-mean-token-mean`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Aggregation::TokenMean => "token-mean",
            Aggregation::SeqMeanTokenMean => "seq-mean-token-mean",
            Aggregation::SeqMeanTokenSum => "seq-mean-token-sum",
            Aggregation::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
        }
    }
}

/// Normalisers taken over the whole global batch (all micro-batches of one
/// optimizer step).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GlobalBatch {
    /// Number of unmasked tokens in the global batch.
    pub tokens: f64,
    /// Number of sequences with at least one unmasked token.
    pub sequences: f64,
    /// Constant length used by [`Aggregation::SeqMeanTokenSumNorm`]
    /// (by default the padded length `T`; an LLM trainer sets the maximum
    /// response length).
    pub horizon: f64,
}

impl GlobalBatch {
    /// Totals of a single micro-batch given its `(B, T)` 0/1 mask.
    pub fn from_mask(mask: &Tensor) -> Result<Self> {
        Self::from_masks(&[mask])
    }

    /// Totals over several micro-batches (their masks may differ in `B`, and
    /// in `T` too; the horizon is the largest `T`).
    pub fn from_masks(masks: &[&Tensor]) -> Result<Self> {
        let mut g = GlobalBatch { tokens: 0.0, sequences: 0.0, horizon: 0.0 };
        for m in masks {
            let (_, t) = m.dims2()?;
            let per_seq: Vec<f64> = m.to_dtype(DType::F64)?.sum(D::Minus1)?.to_vec1()?;
            g.tokens += per_seq.iter().sum::<f64>();
            g.sequences += per_seq.iter().filter(|&&n| n > 0.0).count() as f64;
            g.horizon = g.horizon.max(t as f64);
        }
        Ok(g)
    }

    /// Overrides the constant horizon of [`Aggregation::SeqMeanTokenSumNorm`].
    pub fn with_horizon(mut self, horizon: f64) -> Self {
        self.horizon = horizon;
        self
    }
}

/// Reduces `per_token` (shape `(B, T)`, the loss to minimise) under `mask`
/// (same shape, 1 for tokens that count) to a scalar, normalised by `global`.
///
/// Returns a 0-dim tensor that carries the autograd graph of `per_token`.
pub fn aggregate(per_token: &Tensor, mask: &Tensor, mode: Aggregation, global: &GlobalBatch) -> Result<Tensor> {
    if per_token.dims() != mask.dims() || per_token.rank() != 2 {
        return Err(Error::Shape(format!(
            "aggregate: loss {:?} and mask {:?} must both be (B, T)",
            per_token.dims(),
            mask.dims()
        )));
    }
    let mask = mask.to_dtype(per_token.dtype())?;
    let masked = per_token.mul(&mask)?;
    let safe = |x: f64| if x > 0.0 { x } else { 1.0 };
    let out = match mode {
        Aggregation::TokenMean => (masked.sum_all()? / safe(global.tokens))?,
        Aggregation::SeqMeanTokenSum => (masked.sum_all()? / safe(global.sequences))?,
        Aggregation::SeqMeanTokenSumNorm => (masked.sum_all()? / safe(global.sequences * global.horizon))?,
        Aggregation::SeqMeanTokenMean => {
            // Sequences with no valid token would divide 0 by 0; give them a
            // denominator of 1 so they contribute exactly 0.
            let counts = mask.sum(D::Minus1)?;
            let denom = counts.maximum(1.0)?;
            let per_seq = masked.sum(D::Minus1)?.div(&denom)?;
            (per_seq.sum_all()? / safe(global.sequences))?
        }
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn mats() -> (Tensor, Tensor) {
        let dev = Device::Cpu;
        let l = Tensor::new(&[[1.0f64, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]], &dev).unwrap();
        let m = Tensor::new(&[[1.0f64, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], &dev).unwrap();
        (l, m)
    }

    fn scalar(t: Tensor) -> f64 {
        t.to_scalar::<f64>().unwrap()
    }

    #[test]
    fn hand_worked_values() {
        let (l, m) = mats();
        let g = GlobalBatch::from_mask(&m).unwrap();
        assert_eq!(g, GlobalBatch { tokens: 7.0, sequences: 3.0, horizon: 4.0 });
        let tm = scalar(aggregate(&l, &m, Aggregation::TokenMean, &g).unwrap());
        assert!((tm - 45.0 / 7.0).abs() < 1e-12);
        let smtm = scalar(aggregate(&l, &m, Aggregation::SeqMeanTokenMean, &g).unwrap());
        assert!((smtm - (2.5 + 15.0 + 5.0) / 3.0).abs() < 1e-12);
        let smts = scalar(aggregate(&l, &m, Aggregation::SeqMeanTokenSum, &g).unwrap());
        assert!((smts - 45.0 / 3.0).abs() < 1e-12);
        let norm = scalar(aggregate(&l, &m, Aggregation::SeqMeanTokenSumNorm, &g).unwrap());
        assert!((norm - 45.0 / 12.0).abs() < 1e-12);
    }

    #[test]
    fn masked_tokens_do_not_count_even_if_nonzero() {
        let (l, m) = mats();
        let l2 = (l.clone() + m.affine(-1.0, 1.0).unwrap().affine(1e6, 0.0).unwrap()).unwrap();
        let g = GlobalBatch::from_mask(&m).unwrap();
        for mode in [
            Aggregation::TokenMean,
            Aggregation::SeqMeanTokenMean,
            Aggregation::SeqMeanTokenSum,
            Aggregation::SeqMeanTokenSumNorm,
        ] {
            let a = scalar(aggregate(&l, &m, mode, &g).unwrap());
            let b = scalar(aggregate(&l2, &m, mode, &g).unwrap());
            assert!((a - b).abs() < 1e-9, "{mode:?}");
        }
    }

    /// Gradient accumulated over micro-batches, each normalised by the global
    /// totals, equals the gradient of the full batch — for every mode.
    #[test]
    fn accumulated_gradient_equals_full_batch_gradient() {
        let dev = Device::Cpu;
        let w = Var::from_tensor(
            &Tensor::new(
                &[[0.3f64, -1.2, 0.7, 2.0], [1.1, 0.4, -0.5, 0.9], [0.2, 0.8, -1.5, 0.6], [-0.7, 1.3, 0.1, 0.05]],
                &dev,
            )
            .unwrap(),
        )
        .unwrap();
        let m = Tensor::new(
            &[[1.0f64, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]],
            &dev,
        )
        .unwrap();
        // A non-linear per-token loss so that gradients differ per token.
        let loss_of = |x: &Tensor| x.sqr().unwrap().affine(0.5, 0.0).unwrap().add(&x.sin().unwrap()).unwrap();
        for mode in [
            Aggregation::TokenMean,
            Aggregation::SeqMeanTokenMean,
            Aggregation::SeqMeanTokenSum,
            Aggregation::SeqMeanTokenSumNorm,
        ] {
            let g = GlobalBatch::from_mask(&m).unwrap();
            let full = aggregate(&loss_of(w.as_tensor()), &m, mode, &g).unwrap();
            let gfull = full.backward().unwrap().get(&w).unwrap().to_vec2::<f64>().unwrap();

            let m1 = m.narrow(0, 0, 1).unwrap();
            let m2 = m.narrow(0, 1, 3).unwrap();
            let g2 = GlobalBatch::from_masks(&[&m1, &m2]).unwrap();
            assert_eq!(g, g2);
            let l1 = aggregate(&loss_of(&w.as_tensor().narrow(0, 0, 1).unwrap()), &m1, mode, &g2).unwrap();
            let l2 = aggregate(&loss_of(&w.as_tensor().narrow(0, 1, 3).unwrap()), &m2, mode, &g2).unwrap();
            let ga = l1.backward().unwrap().get(&w).unwrap().clone();
            let gb = l2.backward().unwrap().get(&w).unwrap().clone();
            let gacc = (ga + gb).unwrap().to_vec2::<f64>().unwrap();
            let sum_loss = scalar(l1) + scalar(l2);
            assert!((sum_loss - scalar(full)).abs() < 1e-12, "{mode:?} loss");
            for (ra, rb) in gfull.iter().zip(&gacc) {
                for (a, b) in ra.iter().zip(rb) {
                    assert!((a - b).abs() < 1e-12, "{mode:?}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn shape_mismatch_is_an_error() {
        let (l, _) = mats();
        let m = Tensor::ones((3, 3), DType::F64, &Device::Cpu).unwrap();
        let g = GlobalBatch { tokens: 1.0, sequences: 1.0, horizon: 1.0 };
        assert!(matches!(aggregate(&l, &m, Aggregation::TokenMean, &g), Err(Error::Shape(_))));
    }
}
