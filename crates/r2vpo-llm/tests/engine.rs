//! Continuous batching ([`r2vpo_llm::engine::Engine`]): jobs that join a
//! running batch at different steps sample exactly what
//! [`generate_ids`] samples for the same seeds, and their log-probs equal
//! a full-sequence recomputation (ρ = 1 before any update).

use std::sync::mpsc;
use std::time::Duration;

use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::engine::{Engine, EngineConfig, EngineError, Job, TokenEvent};
use r2vpo_llm::sample::{generate_ids, request_seed, Generation, GenerationRequest, SamplingConfig};

mod common;
use common::VOCAB;

fn model(seed: u64) -> Transformer {
    common::peaked_model(seed)
}

/// `model(seed)`'s weights, as a weight push carries them.
fn weights(seed: u64) -> Box<dyn r2vpo_llm::model::TensorSource> {
    Box::new(r2vpo_llm::backend::Policy::export(&model(seed), 0).unwrap())
}

/// The learner's recomputation of `gens`, all continuations of `prompt`.
fn rescored(m: &Transformer, prompt: &[u32], gens: &[Generation]) -> Vec<Vec<f32>> {
    let reqs: Vec<GenerationRequest> =
        gens.iter().map(|_| GenerationRequest { prompt_ids: prompt.to_vec(), seed: 0 }).collect();
    common::rescored(m, &reqs, gens)
}

/// An engine on `model(11)` at weight version "0", without EOS.
fn engine(max_batch: usize, max_waiting: usize, prefill_chunk: usize) -> Engine {
    Engine::start(model(11), "0".into(), EngineConfig { max_batch, max_waiting, prefill_chunk }, None, 0)
}

fn job(prompt: &[u32], seeds: &[u64], max_new: usize, temperature: f64) -> Job {
    Job {
        prompt_ids: prompt.to_vec(),
        seeds: seeds.to_vec(),
        sampling: SamplingConfig { temperature, max_new_tokens: max_new, ..SamplingConfig::default() },
        stop_when: None,
        ignore_eos: false,
        rescore: false,
        top_logprobs: 0,
        on_token: None,
    }
}

#[test]
fn jobs_joining_a_running_batch_sample_what_generate_samples() {
    let prompts: Vec<Vec<u32>> =
        vec![vec![3, 17, 5, 44, 9, 21], vec![8, 19], vec![25, 6, 49, 11, 2, 33, 40, 1, 7], vec![12]];
    let max_new = [24usize, 5, 17, 30];
    // EOS 0 ends some samples early, so rows leave the batch mid-way.
    let eos = Some(0u32);
    let engine = Engine::start(
        model(11),
        "v0".into(),
        EngineConfig { max_batch: 16, max_waiting: 64, prefill_chunk: 4 },
        eos,
        0,
    );
    let (tx, rx) = mpsc::channel();
    for (k, p) in prompts.iter().enumerate() {
        let seeds: Vec<u64> = (0..3).map(|i| request_seed(99, (k * 3 + i) as u64)).collect();
        let t = if k == 1 { 0.0 } else { 1.0 };
        let tx = tx.clone();
        engine.submit(job(p, &seeds, max_new[k], t), move |r| tx.send((k, r)).unwrap());
        // Later jobs arrive while earlier ones are decoding.
        std::thread::sleep(Duration::from_millis(15));
    }
    let mut outs: Vec<_> = (0..prompts.len()).map(|_| rx.recv().unwrap()).collect();
    outs.sort_by_key(|(k, _)| *k);
    let m = model(11);
    let mut worst = 0.0f32;
    for (k, out) in outs {
        let out = out.unwrap();
        assert_eq!(out.weight_version, "v0");
        let seeds: Vec<u64> = (0..3).map(|i| request_seed(99, (k * 3 + i) as u64)).collect();
        let reqs: Vec<GenerationRequest> =
            seeds.iter().map(|&seed| GenerationRequest { prompt_ids: prompts[k].clone(), seed }).collect();
        let t = if k == 1 { 0.0 } else { 1.0 };
        let cfg = SamplingConfig { temperature: t, max_new_tokens: max_new[k], ..SamplingConfig::default() };
        let want = generate_ids(&m, &reqs, &cfg, eos, 0).unwrap();
        for (g, w) in out.generations.iter().zip(&want) {
            assert_eq!(g.token_ids, w.token_ids, "prompt {k}: the same seed samples the same tokens");
            assert_eq!(g.finish_reason, w.finish_reason);
        }
        for (g, r) in out.generations.iter().zip(rescored(&m, &prompts[k], &out.generations)) {
            for (a, b) in g.model_logprobs.iter().zip(&r) {
                worst = worst.max((a - b).abs());
            }
        }
    }
    assert!(worst < 1e-5, "served log-probs differ from the recomputation by {worst}");
    let s = engine.stats();
    assert_eq!((s.completed, s.running, s.waiting), (4, 0, 0));
    engine.shutdown();
}

#[test]
fn a_huge_prompt_does_not_hold_up_a_short_one() {
    let engine = engine(8, 8, 16);
    let (tx, rx) = mpsc::channel();
    let long: Vec<u32> = (0..480).map(|i| (i % 60 + 1) as u32).collect();
    let t1 = tx.clone();
    engine.submit(job(&long, &[1, 2], 4, 1.0), move |r| t1.send(("long", r)).unwrap());
    engine.submit(job(&[1, 2, 3], &[3], 6, 1.0), move |r| tx.send(("short", r)).unwrap());
    let first = rx.recv().unwrap();
    let second = rx.recv().unwrap();
    assert_eq!((first.0, second.0), ("short", "long"), "the short job finishes during the long prefill");
    let (short, long_out) = (first.1.unwrap(), second.1.unwrap());
    assert_eq!(short.generations[0].token_ids.len(), 6);
    // A prompt prefilled in 30 chunks samples what one whole pass samples.
    let m = model(11);
    let reqs: Vec<GenerationRequest> =
        [1u64, 2].iter().map(|&seed| GenerationRequest { prompt_ids: long.clone(), seed }).collect();
    let want =
        generate_ids(&m, &reqs, &SamplingConfig { max_new_tokens: 4, ..SamplingConfig::default() }, None, 0).unwrap();
    for (g, w) in long_out.generations.iter().zip(&want) {
        assert_eq!(g.token_ids, w.token_ids);
        for (a, b) in g.model_logprobs.iter().zip(&w.model_logprobs) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
    engine.shutdown();
}

#[test]
fn a_weight_update_waits_for_running_rows_and_changes_the_version() {
    let engine = engine(4, 8, 512);
    let (tx, rx) = mpsc::channel();
    let tx1 = tx.clone();
    engine.submit(job(&[1, 2, 3], &[5, 6], 40, 1.0), move |r| tx1.send(("before", r)).unwrap());
    std::thread::sleep(Duration::from_millis(10));
    let (dtx, drx) = mpsc::channel();
    engine.update_weights(weights(12), "1".into(), move |r| dtx.send(r.is_ok()).unwrap());
    engine.submit(job(&[1, 2, 3], &[5, 6], 40, 1.0), move |r| tx.send(("after", r)).unwrap());
    let a = rx.recv().unwrap();
    assert!(drx.recv().unwrap(), "the update applied");
    let b = rx.recv().unwrap();
    assert_eq!((a.0, b.0), ("before", "after"));
    let (a, b) = (a.1.unwrap(), b.1.unwrap());
    assert_eq!((a.weight_version.as_str(), b.weight_version.as_str()), ("0", "1"));
    // Every token of each answer comes from the weights it names.
    for (out, m) in [(&a, model(11)), (&b, model(12))] {
        for (g, r) in out.generations.iter().zip(rescored(&m, &[1, 2, 3], &out.generations)) {
            for (x, y) in g.model_logprobs.iter().zip(&r) {
                assert!((x - y).abs() < 1e-5, "{x} vs {y}");
            }
        }
    }
    assert_ne!(a.generations[0].model_logprobs, b.generations[0].model_logprobs);
    engine.shutdown();
}

#[test]
fn invalid_jobs_are_refused_and_the_engine_keeps_serving() {
    let engine = engine(4, 8, 512);
    let bad = [
        job(&[], &[1], 4, 1.0),
        job(&[1, VOCAB as u32], &[1], 4, 1.0),
        job(&[1], &[1, 2, 3, 4, 5], 4, 1.0),
        job(&[1], &[1], 0, 1.0),
        job(&[1], &[1], 4, f64::NAN),
        job(&[1; 100], &[1], 4000, 1.0),
    ];
    for j in bad {
        assert!(matches!(engine.run_job(j), Err(EngineError::Invalid(_))));
    }
    assert_eq!(engine.run_job(job(&[1, 2], &[1, 2], 3, 1.0)).unwrap().generations.len(), 2);
    engine.shutdown();
}

#[test]
fn a_large_job_neither_blocks_smaller_ones_nor_is_starved_by_them() {
    let engine = engine(8, 16, 512);
    // All five are waiting when admission starts, so the order below is
    // decided by the scheduler alone (steps, not timing).
    engine.pause(true);
    let (tx, rx) = mpsc::channel();
    let jobs: [(&str, usize, usize); 5] = [("a", 6, 40), ("b", 8, 20), ("c", 2, 5), ("d", 2, 100), ("e", 2, 5)];
    for (k, &(name, n, max_new)) in jobs.iter().enumerate() {
        let seeds: Vec<u64> = (0..n as u64).map(|i| 10 * k as u64 + i).collect();
        let tx = tx.clone();
        engine.submit(job(&[1, 2, 3], &seeds, max_new, 1.0), move |r| tx.send((name, r)).unwrap());
    }
    engine.pause(false);
    let mut order = Vec::new();
    for _ in 0..jobs.len() {
        let (name, r) = rx.recv().unwrap();
        let &(_, n, max_new) = jobs.iter().find(|j| j.0 == name).unwrap();
        let out = r.unwrap();
        assert_eq!(out.generations.len(), n);
        assert!(out.generations.iter().all(|g| g.token_ids.len() == max_new));
        order.push(name);
    }
    // a fills 6 of 8 rows and b (all 8) must wait for it: c and e, short
    // enough to finish before a does, start at once in the 2 free rows
    // (first come, first served would hold them behind b); d, which would
    // still hold its rows when a finishes, waits for b instead of delaying it.
    assert_eq!(order, ["c", "e", "a", "b", "d"]);
    engine.shutdown();
}

#[test]
fn rescored_jobs_equal_the_learners_pass_for_the_weights_that_sampled_them() {
    let engine = engine(8, 8, 512);
    let (tx, rx) = mpsc::channel();
    let mut j = job(&[4, 9, 2, 7], &[1, 2, 3], 30, 1.0);
    j.rescore = true;
    let t1 = tx.clone();
    engine.submit(j, move |r| t1.send(("rescored", r)).unwrap());
    // New weights swap in as soon as the rows finish, typically before the
    // scoring thread is done: the scores must still be the old weights'.
    std::thread::sleep(Duration::from_millis(5));
    let (dtx, drx) = mpsc::channel();
    engine.update_weights(weights(12), "1".into(), move |r| dtx.send(r.is_ok()).unwrap());
    engine.submit(job(&[4, 9], &[7], 8, 1.0), move |r| tx.send(("plain", r)).unwrap());
    let mut got = std::collections::HashMap::new();
    for _ in 0..2 {
        let (name, r) = rx.recv().unwrap();
        got.insert(name, r.unwrap());
    }
    assert!(drx.recv().unwrap(), "the update applied");
    let out = &got["rescored"];
    assert_eq!(out.weight_version, "0");
    assert_eq!(got["plain"].weight_version, "1");
    let want = rescored(&model(11), &[4, 9, 2, 7], &out.generations);
    for (g, w) in out.generations.iter().zip(&want) {
        assert_eq!(g.token_ids.len(), 30);
        for (a, b) in g.model_logprobs.iter().zip(w) {
            assert!((a - b).abs() <= 1e-6, "rescored {a} vs the learner's {b}");
        }
    }
    engine.shutdown();
}

/// Top log-probs are the T = 1 distribution's most likely tokens, in
/// order, with the sampled token's raw log-prob among them where it is one
/// of them; streamed tokens arrive in order and equal the final answer;
/// a sink that returns false frees its sample's row at once.
#[test]
fn top_logprobs_and_streamed_tokens_match_the_answer_and_a_gone_client_frees_its_row() {
    let engine = engine(8, 16, 64);
    let prompt = [3u32, 17, 5, 44];
    let seeds = [request_seed(5, 0), request_seed(5, 1)];
    let (ev_tx, ev_rx) = mpsc::channel::<TokenEvent>();
    let mut j = job(&prompt, &seeds, 12, 1.0);
    j.top_logprobs = 5;
    j.on_token = Some(std::sync::Arc::new(move |e: TokenEvent| ev_tx.send(e).is_ok()));
    let out = engine.run_job(j).unwrap();
    let events: Vec<TokenEvent> = ev_rx.try_iter().collect();
    for (i, (g, top)) in out.generations.iter().zip(&out.top_logprobs).enumerate() {
        let streamed: Vec<&TokenEvent> = events.iter().filter(|e| e.sample == i).collect();
        assert_eq!(streamed.iter().map(|e| e.token).collect::<Vec<_>>(), g.token_ids, "sample {i}");
        assert_eq!(streamed.last().unwrap().finish, Some(g.finish_reason));
        assert!(streamed[..streamed.len() - 1].iter().all(|e| e.finish.is_none()));
        assert_eq!(top.len(), g.token_ids.len());
        for (t, alts) in top.iter().enumerate() {
            assert_eq!(alts.len(), 5);
            assert!(alts.windows(2).all(|w| w[0].1 >= w[1].1), "not most likely first: {alts:?}");
            let mass: f32 = alts.iter().map(|&(_, lp)| lp.exp()).sum();
            assert!(mass <= 1.0 + 1e-5 && alts.iter().all(|&(id, _)| (id as usize) < VOCAB));
            if let Some(&(_, lp)) = alts.iter().find(|&&(id, _)| id == g.token_ids[t]) {
                assert!((lp - g.model_logprobs[t]).abs() < 1e-6, "token {t}: {lp} vs {}", g.model_logprobs[t]);
            }
            assert_eq!(streamed[t].top, *alts);
        }
    }
    // A client gone after three tokens: its sample ends there, the other
    // runs to its length.
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    let mut j = job(&prompt, &seeds, 40, 1.0);
    j.on_token = Some(std::sync::Arc::new(move |e: TokenEvent| {
        e.sample == 1 || counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 2
    }));
    let out = engine.run_job(j).unwrap();
    assert_eq!(out.generations[0].token_ids.len(), 3, "the cancelled sample kept decoding");
    assert_eq!(out.generations[1].token_ids.len(), 40);
}

#[test]
fn a_weight_update_that_does_not_fit_changes_nothing() {
    let engine = engine(4, 8, 512);
    let run = || engine.run_job(job(&[1, 2, 3], &[5, 6], 12, 1.0)).unwrap();
    let before = run();
    let full = r2vpo_llm::backend::Policy::export(&model(12), 7).unwrap();
    // One tensor missing (the last in load order: a partial apply would
    // have changed every other one), one of another shape.
    let mut missing = (*full.tensors).clone();
    missing.remove("model.norm.weight").unwrap();
    let mut reshaped = (*full.tensors).clone();
    let t = reshaped["model.norm.weight"].clone();
    reshaped.insert("model.norm.weight".into(), t.narrow(0, 0, t.dims()[0] - 1).unwrap());
    for (case, tensors) in [("missing", missing), ("reshaped", reshaped)] {
        let (dtx, drx) = mpsc::channel();
        let push = Box::new(r2vpo_llm::weights::Weights::new(7, tensors));
        engine.update_weights(push, "7".into(), move |r| dtx.send(r.map_err(|e| e.to_string())).unwrap());
        let err = drx.recv().unwrap().unwrap_err();
        assert!(err.contains("model.norm.weight"), "{case}: {err}");
        let after = run();
        assert_eq!(after.weight_version, "0", "{case}");
        let ids =
            |o: &r2vpo_llm::engine::JobOutput| o.generations.iter().map(|g| g.token_ids.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&after), ids(&before), "{case}: the old weights answer");
    }
    engine.shutdown();
}
