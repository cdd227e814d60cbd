//! `evaluate` end to end on a tiny random model with the embedded SmolLM2
//! tokenizer and chat template: metric invariants, per-source breakdown, and
//! results that depend neither on the batch size nor on which other problems
//! are evaluated.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::data::{builtin_split, ArithmeticConfig, Problem, PromptTemplate};
use r2vpo_llm::eval::{evaluate, pass_at_k, EvalConfig, EvalError, EvalReport};
use r2vpo_llm::model::{Architecture, ModelConfig};
use r2vpo_llm::sample::SamplingConfig;
use r2vpo_llm::tokenizer::Tokenizer;
use r2vpo_verify::{AnswerFormat, VerifyConfig};

/// New tokens per response: short, so some responses are cut off.
const MAX_TOKENS: usize = 4;

fn tokenizer() -> Tokenizer {
    let gguf = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{e} (run `make deps`)"))
}

/// A tiny random Llama over the full SmolLM2 vocabulary that writes only
/// the digits 1–3, spaces and end-of-turn, so short responses are sometimes
/// right, sometimes wrong and sometimes empty. A large constant in hidden
/// dimension 0 of every embedding survives the (small) random layers and the
/// final RMSNorm; lm_head rows with a positive weight there lift the allowed
/// tokens ~20 logits above the rest of the vocabulary.
fn model(tok: &Tokenizer) -> Transformer {
    let vocab = tok.vocab_size();
    let hidden = 32;
    let cfg = ModelConfig::tiny(Architecture::Llama, vocab, hidden, 64, 2, 4, 2, false);
    let m = Transformer::new_random(cfg, 5, DType::F32, &Device::Cpu).unwrap();
    let id = |s: &str| tok.token_to_id(s).unwrap_or_else(|| panic!("no token {s:?}")) as usize;
    // Weights in dimension 0: end-of-turn a little above the digits (so the
    // mean response is a few tokens), the space token below them.
    let lift: Vec<(usize, f32)> =
        vec![(id("1"), 4.0), (id("2"), 4.0), (id("3"), 4.0), (id("Ġ"), 3.8), (tok.eos_token_id() as usize, 4.1)];
    for (name, var) in m.named_vars() {
        let (embed, head) = (name == "model.embed_tokens.weight", name == "lm_head.weight");
        if !(embed || head) {
            continue;
        }
        let mut w = var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        if embed {
            w.chunks_mut(hidden).for_each(|row| row[0] = 10.0);
        } else {
            for (t, a) in &lift {
                w[t * hidden] = *a;
            }
        }
        var.set(&Tensor::from_vec(w, (vocab, hidden), &Device::Cpu).unwrap()).unwrap();
    }
    m
}

fn problems() -> Vec<Problem> {
    let p = |id: &str, q: &str, a: &str, s: &str| Problem {
        id: id.into(),
        question: q.into(),
        answer: a.into(),
        source: s.into(),
    };
    let mut ps = vec![
        p("h0", "What is 1 + 1?", "2", "hand"),
        p("h1", "What is 2 + 1?", "3", "hand"),
        p("h2", "What is 4 - 3?", "1", "hand"),
        p("h3", "What is 9 - 2?", "7", "hand"),
    ];
    ps.extend(builtin_split("arith-eval", &ArithmeticConfig { difficulty: 1, count: 3, seed: 0 }).unwrap());
    ps
}

fn config(batch_size: usize) -> EvalConfig {
    EvalConfig {
        k: 8,
        pass_k: vec![1, 2, 8],
        batch_size,
        template: PromptTemplate::Plain,
        sampling: SamplingConfig { max_new_tokens: MAX_TOKENS, seed: 3, ..SamplingConfig::test_time() },
        verify: VerifyConfig { format: AnswerFormat::LastNumber, ..VerifyConfig::default() },
        ..EvalConfig::default()
    }
}

/// The parts of a report that must not depend on how it was computed.
fn results(r: &EvalReport) -> impl PartialEq + std::fmt::Debug + '_ {
    (&r.overall, &r.per_source, &r.problems, r.generated_tokens)
}

#[test]
fn evaluate_end_to_end_invariants_and_batch_independence() {
    let tok = tokenizer();
    let m = model(&tok);
    let ps = problems();
    let mut calls = Vec::new();
    let rep = evaluate(&m, &tok, &ps, &config(5), &mut |d, t| calls.push((d, t))).unwrap();
    let n = ps.len() * 8;
    assert_eq!(calls.first(), Some(&(0, n)));
    assert_eq!(calls.last(), Some(&(n, n)));
    assert!(calls.windows(2).all(|w| w[0].0 < w[1].0 && w[1].0 - w[0].0 <= 5), "{calls:?}");

    let o = &rep.overall;
    eprintln!("{}", rep.to_markdown());
    assert_eq!((o.problems, o.samples), (ps.len(), n));
    // The model is non-trivial here: some samples right, some wrong, some
    // without an answer, some cut off.
    assert!(o.avg_at_k > 0.0 && o.avg_at_k < 1.0, "avg {}", o.avg_at_k);
    assert!(o.extracted_fraction > 0.0 && o.extracted_fraction < 1.0, "{}", o.extracted_fraction);
    assert!(o.truncated_fraction > 0.0 && o.truncated_fraction < 1.0, "{}", o.truncated_fraction);
    assert!(o.mean_response_tokens >= 1.0 && o.mean_response_tokens <= MAX_TOKENS as f64);
    // pass@1 is avg@k by the estimator's identity, bit for bit.
    assert_eq!(o.pass_at[&1], o.avg_at_k);
    assert!(o.pass_at[&1] <= o.pass_at[&2] && o.pass_at[&2] <= o.pass_at[&8]);
    assert!((0.0..=1.0).contains(&o.maj_at_k));
    // pass@k at k = n is the fraction of problems with any correct sample.
    let any = rep.problems.iter().filter(|p| p.correct > 0).count() as f64 / ps.len() as f64;
    assert!((o.pass_at[&8] - any).abs() < 1e-12);
    // maj@k never beats pass@k at k = n.
    assert!(o.maj_at_k <= o.pass_at[&8]);

    for (p, r) in ps.iter().zip(&rep.problems) {
        assert_eq!((&r.id, &r.source, &r.gold), (&p.id, &p.source, &p.answer));
        assert_eq!(r.sample_correct.len(), 8);
        assert_eq!(r.correct, r.sample_correct.iter().filter(|&&c| c).count());
        assert_eq!(r.extracted.len(), 8);
        assert!(r.response_tokens.iter().all(|&t| (1..=MAX_TOKENS).contains(&t)));
        // Truncated samples are full length (a full-length one may also have
        // ended on end-of-turn).
        assert!(r.truncated <= r.response_tokens.iter().filter(|&&t| t == MAX_TOKENS).count());
        // Correct samples have an answer, and it is the gold one.
        for (c, e) in r.sample_correct.iter().zip(&r.extracted) {
            if *c {
                assert_eq!(e.as_deref(), Some(p.answer.as_str()));
            }
        }
        // The majority answer is an answer some sample gave, and it is
        // correct exactly when it equals the gold answer here.
        if let Some(a) = &r.majority_answer {
            assert!(r.extracted.iter().any(|e| e.as_deref() == Some(a.as_str())));
            assert_eq!(r.majority_correct, *a == p.answer);
        } else {
            assert!(!r.majority_correct && r.extracted.iter().all(Option::is_none));
        }
        assert!(r.responses.is_none());
    }

    // Per source: sorted, adding up to the whole.
    let sources: Vec<&str> = rep.per_source.iter().map(|s| s.source.as_str()).collect();
    assert_eq!(sources, ["arith-d1", "hand"]);
    assert_eq!(rep.per_source.iter().map(|s| s.problems).sum::<usize>(), ps.len());
    let weighted: f64 = rep.per_source.iter().map(|s| s.avg_at_k * s.problems as f64).sum::<f64>() / ps.len() as f64;
    assert!((weighted - o.avg_at_k).abs() < 1e-12);
    let hand = &rep.per_source[1];
    let c: usize = rep.problems.iter().filter(|p| p.source == "hand").map(|p| p.correct).sum();
    assert!((hand.avg_at_k - c as f64 / 32.0).abs() < 1e-12);
    assert!(
        (hand.pass_at[&2] - (0..4).map(|i| pass_at_k(8, rep.problems[i].correct, 2)).sum::<f64>() / 4.0).abs() < 1e-12
    );
    assert_eq!(rep.generated_tokens, rep.problems.iter().flat_map(|p| &p.response_tokens).sum::<usize>());
    assert!(rep.tokens_per_s > 0.0 && rep.wall_seconds > 0.0);

    // The Markdown table: a header, a rule, one row per source, `all`,
    // then the two sources' macro average.
    let md = rep.to_markdown();
    let lines: Vec<&str> = md.lines().collect();
    assert_eq!(lines.len(), 2 + 2 + 1 + 1);
    assert!(lines[0].contains("avg@8") && lines[0].contains("pass@2") && lines[0].contains("maj@8"), "{md}");
    assert!(lines[2].starts_with("| arith-d1 | 3 |") && lines[4].starts_with("| all | 7 |"), "{md}");
    assert!(lines[5].starts_with("| macro average | 7 |"), "{md}");

    // Batch size changes nothing (one row at a time, and all rows at once).
    for b in [1, 64] {
        let other = evaluate(&m, &tok, &ps, &config(b), &mut |_, _| {}).unwrap();
        assert_eq!(results(&other), results(&rep), "batch size {b}");
    }
    // Nor does evaluating a subset: a problem's samples depend on its id.
    let sub = evaluate(&m, &tok, &ps[2..5], &config(7), &mut |_, _| {}).unwrap();
    assert_eq!(sub.problems, rep.problems[2..5]);
    // Another seed draws other samples.
    let mut reseeded = config(5);
    reseeded.sampling.seed = 4;
    let other = evaluate(&m, &tok, &ps, &reseeded, &mut |_, _| {}).unwrap();
    assert_ne!(other.problems, rep.problems);
}

#[test]
fn evaluate_saves_responses_and_rejects_bad_input() {
    let tok = tokenizer();
    let m = model(&tok);
    let ps = problems();
    let cfg = EvalConfig { k: 2, pass_k: vec![], save_responses: true, ..config(4) };
    let rep = evaluate(&m, &tok, &ps[..2], &cfg, &mut |_, _| {}).unwrap();
    for r in &rep.problems {
        let texts = r.responses.as_ref().expect("responses saved");
        assert_eq!(texts.len(), 2);
        assert!(texts.iter().all(|t| t.chars().all(|c| "123 ".contains(c))), "{texts:?}");
    }
    // eval.json reads back (floats only to serde_json's parsing precision).
    let back: EvalReport = serde_json::from_str(&serde_json::to_string(&rep).unwrap()).unwrap();
    assert_eq!((&back.config, &back.pass_k, &back.problems), (&rep.config, &rep.pass_k, &rep.problems));
    assert!((back.overall.pass_at[&2] - rep.overall.pass_at[&2]).abs() < 1e-12);

    assert!(matches!(evaluate(&m, &tok, &[], &cfg, &mut |_, _| {}), Err(EvalError::NoProblems)));
    let dup = vec![ps[0].clone(), ps[0].clone()];
    let err = evaluate(&m, &tok, &dup, &cfg, &mut |_, _| {}).unwrap_err();
    assert!(matches!(&err, EvalError::DuplicateId(id) if id == "h0"), "{err}");
    let bad = EvalConfig { pass_k: vec![3], ..cfg };
    let err = evaluate(&m, &tok, &ps, &bad, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("`pass_k`"), "{err}");
}

/// Several benchmark files in one evaluation: each read with `[data]`'s
/// settings (its own `limit`), its problems sourced and id-prefixed by its
/// name, one row each, and a macro average that weighs every benchmark
/// alike (here unlike `all`, which weighs every problem alike).
#[test]
fn benchmarks_get_a_row_each_and_a_macro_average() {
    use r2vpo_llm::data::DataConfig;
    use r2vpo_llm::eval::{load_eval_problems, Benchmark};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, qs: &[(&str, &str)]| {
        let lines: String =
            qs.iter().map(|(q, a)| serde_json::json!({"question": q, "answer": a}).to_string() + "\n").collect();
        let p = dir.path().join(name);
        std::fs::write(&p, lines).unwrap();
        p.display().to_string()
    };
    let a = write(
        "a.jsonl",
        &[("What is 1 + 1?", "2"), ("What is 2 + 1?", "3"), ("What is 4 - 3?", "1"), ("What is 9 - 8?", "1")],
    );
    let b = write("b.jsonl", &[("What is 1 + 2?", "3")]);
    let mut cfg = config(4);
    cfg.data = DataConfig { path: "unused".into(), limit: Some(3), ..DataConfig::default() };
    cfg.benchmarks = vec![Benchmark { name: "bench-a".into(), path: a }, Benchmark { name: "bench-b".into(), path: b }];
    let loaded = load_eval_problems(&cfg).unwrap();
    let ids: Vec<&str> = loaded.problems.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids.len(), 4, "three of a (the limit), one of b: {ids:?}");
    assert!(ids[..3].iter().all(|i| i.starts_with("bench-a/")) && ids[3].starts_with("bench-b/"), "{ids:?}");
    assert!(loaded.problems.iter().all(|p| p.source == p.id.split('/').next().unwrap()));

    let tok = tokenizer();
    let rep = evaluate(&model(&tok), &tok, &loaded.problems, &cfg, &mut |_, _| {}).unwrap();
    let rows: Vec<&str> = rep.per_source.iter().map(|s| s.source.as_str()).collect();
    assert_eq!(rows, ["bench-a", "bench-b"]);
    let m = rep.macro_average.as_ref().expect("a macro average over two benchmarks");
    let (ra, rb) = (&rep.per_source[0], &rep.per_source[1]);
    assert_eq!(m.avg_at_k, (ra.avg_at_k + rb.avg_at_k) / 2.0);
    assert_eq!(m.pass_at[&8], (ra.pass_at[&8] + rb.pass_at[&8]) / 2.0);
    assert_eq!(m.maj_at_k, (ra.maj_at_k + rb.maj_at_k) / 2.0);
    assert_eq!((m.problems, m.samples), (4, 32));
    assert!((rep.overall.avg_at_k - (3.0 * ra.avg_at_k + rb.avg_at_k) / 4.0).abs() < 1e-12);
    let table = rep.to_markdown();
    assert!(table.lines().last().unwrap().starts_with("| macro average | 4 |"), "{table}");

    // One source: no macro row.
    let single = evaluate(&model(&tok), &tok, &loaded.problems[..3], &cfg, &mut |_, _| {}).unwrap();
    assert!(single.macro_average.is_none() && !single.to_markdown().contains("macro"));
    // A name given twice is refused, naming it.
    cfg.benchmarks.push(Benchmark { name: "bench-a".into(), path: "x.jsonl".into() });
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("benchmarks") && e.contains("bench-a"), "{e}");
}
