//! The learner's experience record: one sampled response with everything
//! the update needs, as the replay buffer keeps it and as a micro-batch
//! packs it ([`crate::backend::batch`]).

use serde::{Deserialize, Serialize};

use crate::queue::GroupEntry;

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
    /// Rollout–trainer mismatch weights per response token (only with
    /// `objective.rollout_correction`; [`r2vpo::correction`]), set when the
    /// learner's recomputed log-probs replace the engine's.
    #[serde(default)]
    pub is_weight: Option<Vec<f32>>,
    /// Weight version that generated the response (see
    /// [`crate::rollout::GroupRollout::weight_version`]).
    #[serde(default)]
    pub version: u64,
}

impl Sample {
    /// The samples of one group entry, in response order (the replay
    /// buffer's items; a reference-KL term is recomputed by the learner,
    /// never shipped).
    pub fn from_group(entry: &GroupEntry) -> Vec<Sample> {
        (0..entry.responses.len())
            .map(|i| Sample {
                problem: entry.problem,
                prompt_ids: entry.prompt_ids.clone(),
                response_ids: entry.responses[i].clone(),
                reward: entry.rewards[i],
                correct: entry.correct[i],
                advantage: entry.advantages[i],
                behaviour_logp: entry.behaviour_logp[i].clone(),
                ref_logp: None,
                is_weight: None,
                version: entry.weight_version,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_entry_becomes_one_sample_per_response() {
        let s = Sample::from_group(&crate::queue::tests::an_entry());
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].problem, s[0].version, s[0].advantage), (3, 9, 0.7));
        assert_eq!(
            s[1],
            Sample {
                problem: 3,
                prompt_ids: vec![1, 2],
                response_ids: vec![8],
                reward: 0.0,
                correct: false,
                advantage: -0.7,
                behaviour_logp: vec![-0.5],
                ref_logp: None,
                is_weight: None,
                version: 9,
            }
        );
    }
}
