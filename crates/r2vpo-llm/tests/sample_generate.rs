//! Batched sampling on a tiny random model: log-probs of sampled tokens
//! equal a full-sequence `score_logprobs` recomputation (what RL
//! correctness hinges on), seeds are per request, top-k = 1 is greedy, and
//! the truncation rules and their renormalised log-probs are exact.

use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::sample::{
    bench_generate, generate_ids, request_seed, sample_token, FinishReason, GenerationRequest, SamplingConfig,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

mod common;
use common::rescored;

fn model() -> Transformer {
    common::peaked_model(11)
}

fn requests() -> Vec<GenerationRequest> {
    let prompts = vec![vec![3, 17, 5, 44, 9, 21], vec![8, 19], vec![25, 6, 49, 11, 2, 33, 40, 1, 7], vec![12]];
    GenerationRequest::batch(&prompts, 1234)
}

#[test]
fn sampled_logprobs_match_full_sequence_scoring() {
    let m = model();
    let mut reqs = requests();
    // A second sample of a prompt goes through the shared-prefill path.
    reqs.push(GenerationRequest { seed: 77, ..reqs[1].clone() });
    // Training sampling: T = 1, top-p = 1, top-k off; a stop token makes rows
    // end at different steps so dropped rows are exercised.
    let cfg = SamplingConfig { max_new_tokens: 24, stop_token_ids: vec![7, 13], ..SamplingConfig::default() };
    let gens = generate_ids(&m, &reqs, &cfg, Some(0), 0).unwrap();
    let re = rescored(&m, &reqs, &gens);
    let mut n = 0;
    for (g, r) in gens.iter().zip(&re) {
        assert!(!g.token_ids.is_empty());
        assert_eq!((g.logprobs.len(), g.model_logprobs.len()), (r.len(), r.len()));
        for ((m, b), r) in g.model_logprobs.iter().zip(&g.logprobs).zip(r) {
            assert!((m - r).abs() < 1e-4, "model lp {m} vs {r}");
            // Untruncated T = 1: the behaviour log-probs are the model's.
            assert!((b - r).abs() < 1e-4, "behaviour lp {b} vs {r}");
            n += 1;
        }
        match g.finish_reason {
            FinishReason::Length => assert_eq!(g.token_ids.len(), 24),
            FinishReason::Eos => assert_eq!(*g.token_ids.last().unwrap(), 0),
            FinishReason::Stop => assert!([7, 13].contains(g.token_ids.last().unwrap())),
        }
    }
    assert!(n > 30, "only {n} tokens checked");
    // The check has power: log-probs read one position off disagree.
    let off: f32 = gens
        .iter()
        .zip(&re)
        .flat_map(|(g, r)| g.model_logprobs[1..].iter().zip(&r[..r.len() - 1]).map(|(a, b)| (a - b).abs()))
        .sum::<f32>()
        / n as f32;
    assert!(off > 0.1, "mean |Δ| one position off is only {off}");
    // And the distributions are far from uniform (log 64 = 4.16).
    let mean = gens.iter().flat_map(|g| &g.model_logprobs).sum::<f32>() / n as f32;
    assert!(mean > -3.5, "mean log p {mean}");
    let reasons: Vec<FinishReason> = gens.iter().map(|g| g.finish_reason).collect();
    eprintln!("mean log p {mean:.3}, one-off mean |Δ| {off:.3}, finish {reasons:?}");
    // Rows ended at different steps, so finished rows were dropped mid-batch.
    assert!(reasons.contains(&FinishReason::Length) && reasons.iter().any(|r| *r != FinishReason::Length));
}

#[test]
fn model_logprobs_match_scoring_under_truncated_sampling() {
    let m = model();
    let reqs = requests();
    let cfg = SamplingConfig { max_new_tokens: 16, ..SamplingConfig::test_time() };
    let gens = generate_ids(&m, &reqs, &cfg, None, 0).unwrap();
    let re = rescored(&m, &reqs, &gens);
    for (g, r) in gens.iter().zip(&re) {
        for ((m, b), r) in g.model_logprobs.iter().zip(&g.logprobs).zip(r) {
            assert!((m - r).abs() < 1e-4, "model lp {m} vs {r}");
            // Still a probability of a token inside the kept set.
            assert!(*b <= 1e-6 && b.is_finite());
        }
    }
}

#[test]
fn a_rows_sample_does_not_depend_on_its_batch() {
    let m = model();
    let reqs = requests();
    let cfg = SamplingConfig { max_new_tokens: 20, stop_token_ids: vec![7], ..SamplingConfig::default() };
    let all = generate_ids(&m, &reqs, &cfg, None, 0).unwrap();
    let alone = generate_ids(&m, &reqs[2..3], &cfg, None, 0).unwrap();
    assert_eq!(alone[0].token_ids, all[2].token_ids);
    let swapped = generate_ids(&m, &[reqs[3].clone(), reqs[0].clone(), reqs[2].clone()], &cfg, None, 0).unwrap();
    assert_eq!(swapped[0].token_ids, all[3].token_ids);
    assert_eq!(swapped[1].token_ids, all[0].token_ids);
    assert_eq!(swapped[2].token_ids, all[2].token_ids);
    for (a, b) in swapped[1].logprobs.iter().zip(&all[0].logprobs) {
        assert!((a - b).abs() < 1e-5);
    }
    // Several samples of one prompt (shared prefill) each match their
    // request decoded alone.
    let group: Vec<GenerationRequest> =
        (0..3).map(|i| GenerationRequest { seed: request_seed(7, i), ..reqs[1].clone() }).collect();
    let mixed = [group.clone(), vec![reqs[0].clone()]].concat();
    let gm = generate_ids(&m, &mixed, &cfg, None, 0).unwrap();
    for (i, r) in group.iter().enumerate() {
        let solo = generate_ids(&m, std::slice::from_ref(r), &cfg, None, 0).unwrap();
        assert_eq!(gm[i].token_ids, solo[0].token_ids);
    }
    assert_ne!(gm[0].token_ids, gm[1].token_ids);
    assert_eq!(gm[3].token_ids, all[0].token_ids);
    // A different seed gives a different sample.
    let other = GenerationRequest { seed: request_seed(99, 0), ..reqs[0].clone() };
    let o = generate_ids(&m, &[other], &cfg, None, 0).unwrap();
    assert_ne!(o[0].token_ids, all[0].token_ids);
}

#[test]
fn top_k_one_is_greedy() {
    let m = model();
    let reqs = requests();
    let greedy = SamplingConfig { max_new_tokens: 12, ..SamplingConfig::greedy() };
    let g = generate_ids(&m, &reqs, &greedy, None, 0).unwrap();
    let k1 = SamplingConfig { top_k: 1, temperature: 0.8, ..greedy.clone() };
    let s = generate_ids(&m, &reqs, &k1, None, 0).unwrap();
    for (a, b) in g.iter().zip(&s) {
        assert_eq!(a.token_ids, b.token_ids);
        assert_eq!(a.model_logprobs, b.model_logprobs);
        assert!(a.logprobs.iter().chain(&b.logprobs).all(|&x| x == 0.0));
        assert_eq!(a.finish_reason, FinishReason::Length);
    }
    // Greedy ignores the seed.
    let g2 = generate_ids(&m, &GenerationRequest::batch(&[reqs[0].prompt_ids.clone()], 5), &greedy, None, 0).unwrap();
    assert_eq!(g2[0].token_ids, g[0].token_ids);
}

fn ln(x: f64) -> f32 {
    x.ln() as f32
}

#[test]
fn truncation_rules_and_renormalised_logprobs() {
    let probs = [0.5f64, 0.3, 0.15, 0.05];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let draw = |cfg: &SamplingConfig, rng: &mut ChaCha8Rng, n: usize| {
        let mut counts = [0usize; 4];
        for _ in 0..n {
            let s = sample_token(&logits, cfg, rng);
            counts[s.token as usize] += 1;
            assert!((s.model_logprob as f32 - ln(probs[s.token as usize])).abs() < 1e-6);
        }
        counts
    };
    // top-p 0.7: 0.5 < 0.7 so the 0.3 token is kept (it crosses 0.7); 0.8 ≥ 0.7 stops.
    let p = SamplingConfig { top_p: 0.7, ..Default::default() };
    let s = sample_token(&logits, &p, &mut rng);
    assert!(s.token < 2);
    assert!((s.logprob as f32 - ln(probs[s.token as usize] / 0.8)).abs() < 1e-6);
    let c = draw(&p, &mut rng, 20_000);
    assert_eq!(c[2] + c[3], 0);
    assert!((c[0] as f64 / 20_000.0 - 0.625).abs() < 0.02, "{c:?}");
    // top-k 3 renormalises over 0.95.
    let k = SamplingConfig { top_k: 3, ..Default::default() };
    let s = sample_token(&logits, &k, &mut rng);
    assert!((s.logprob as f32 - ln(probs[s.token as usize] / 0.95)).abs() < 1e-6);
    assert_eq!(draw(&k, &mut rng, 5_000)[3], 0);
    // Temperature 0.5 squares the probabilities.
    let t = SamplingConfig { temperature: 0.5, ..Default::default() };
    let z: f64 = probs.iter().map(|p| p * p).sum();
    let s = sample_token(&logits, &t, &mut rng);
    assert!((s.logprob as f32 - ln(probs[s.token as usize].powi(2) / z)).abs() < 1e-5);
    let c = draw(&t, &mut rng, 20_000);
    assert!((c[0] as f64 / 20_000.0 - 0.25 / z).abs() < 0.02, "{c:?}");
    // Untruncated frequencies follow the probabilities.
    let c = draw(&SamplingConfig::default(), &mut rng, 20_000);
    for (ci, p) in c.iter().zip(probs) {
        assert!((*ci as f64 / 20_000.0 - p).abs() < 0.015, "{c:?}");
    }
}

#[test]
fn nucleus_wider_than_the_first_candidate_head() {
    // 2000 equally likely tokens and top-p 0.9: the nucleus holds 1800 of them,
    // more than the 256-token head tried first.
    let logits = vec![0.0f32; 2000];
    let cfg = SamplingConfig { top_p: 0.9, ..Default::default() };
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut max_tok = 0;
    for _ in 0..5000 {
        let s = sample_token(&logits, &cfg, &mut rng);
        assert!((s.logprob - (1.0f64 / 1800.0).ln()).abs() < 1e-9);
        max_tok = max_tok.max(s.token);
    }
    // Ties go to lower ids, so the nucleus is ids 0..1800.
    assert!(max_tok < 1800 && max_tok > 1700, "{max_tok}");
}

#[test]
fn config_defaults_presets_and_errors() {
    let d: SamplingConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(d, SamplingConfig::default());
    assert_eq!((d.temperature, d.top_p, d.top_k), (1.0, 1.0, 0));
    let t = SamplingConfig::test_time();
    assert_eq!((t.temperature, t.top_p, t.top_k), (0.6, 0.95, 20));
    let e = serde_json::from_str::<SamplingConfig>(r#"{"top_q": 1}"#).unwrap_err().to_string();
    assert!(e.contains("top_q"), "{e}");
    let m = model();
    let bad = SamplingConfig { top_p: 0.0, ..Default::default() };
    let e = generate_ids(&m, &requests(), &bad, None, 0).unwrap_err().to_string();
    assert!(e.contains("top_p"), "{e}");
    let e = generate_ids(&m, &[GenerationRequest { prompt_ids: vec![], seed: 0 }], &d, None, 0).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    let e = generate_ids(&m, &GenerationRequest::batch(&[vec![999]], 0), &d, None, 0).unwrap_err();
    assert!(e.to_string().contains("999"), "{e}");
    let z = SamplingConfig { max_new_tokens: 0, ..Default::default() };
    let g = generate_ids(&m, &requests(), &z, None, 0).unwrap();
    assert!(g.iter().all(|g| g.token_ids.is_empty() && g.finish_reason == FinishReason::Length));
}

#[test]
fn bench_rows_count_every_token() {
    let m = model();
    let rows = bench_generate(&m, &[1, 2, 3], &[1, 4], 5, &SamplingConfig::default()).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[1].batch, rows[1].prompt_tokens, rows[1].new_tokens), (4, 3, 5));
    assert!(rows.iter().all(|r| r.tokens_per_s > 0.0 && r.seconds > 0.0));
}
