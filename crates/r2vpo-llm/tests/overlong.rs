//! Issue #17: prompts longer than the model's context, over-long dataset
//! lines and byte-order marks. One bad row must neither crash nor stall a
//! run: the sampler refuses requests beyond the context, `evaluate` and the
//! trainer skip (or truncate) such problems and say so, and JSONL lines over
//! the line bound are skipped without being parsed.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use r2vpo_llm::backend::candle::{load_model, Transformer};
use r2vpo_llm::chat::ChatTemplate;
use r2vpo_llm::data::{
    load_problems, load_problems_reporting, DataConfig, DataError, Fitted, OverlongPrompts, Problem, PromptFitter,
    PromptTemplate, MAX_LINE_BYTES,
};
use r2vpo_llm::eval::{evaluate, EvalConfig, EvalError};
use r2vpo_llm::model::{Architecture, ModelConfig};
use r2vpo_llm::sample::{
    check_prompt_fits, generate_ids, max_prompt_len, ContextOverflow, GenerationRequest, SampleError, SamplingConfig,
};
use r2vpo_llm::tokenizer::Tokenizer;
use r2vpo_llm::train::{ModelSource, TrainConfig, TrainError, Trainer};
use r2vpo_verify::{AnswerFormat, VerifyConfig};

fn gguf() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing (run `make deps`)", p.display());
    p
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&gguf()).unwrap()
}

/// A random Llama over the SmolLM2 vocabulary with a 512-token context
/// (`ModelConfig::tiny`).
fn tiny_model(tok: &Tokenizer) -> Transformer {
    let cfg = ModelConfig::tiny(Architecture::Llama, tok.vocab_size(), 32, 64, 2, 4, 2, true);
    assert_eq!(cfg.max_position_embeddings, 512);
    Transformer::new_random(cfg, 1, DType::F32, &Device::Cpu).unwrap()
}

/// `What is 1+1+…+1?` with `n` ones: about 2n tokens.
fn long_question(n: usize) -> String {
    format!("What is {}1?", "1+".repeat(n - 1))
}

fn problem(id: &str, question: &str) -> Problem {
    Problem { id: id.into(), question: question.into(), answer: "2".into(), source: "s".into() }
}

fn eval_cfg(max_new_tokens: usize) -> EvalConfig {
    EvalConfig {
        k: 2,
        batch_size: 4,
        template: PromptTemplate::Plain,
        sampling: SamplingConfig { max_new_tokens, ..SamplingConfig::test_time() },
        verify: VerifyConfig { format: AnswerFormat::LastNumber, ..VerifyConfig::default() },
        ..EvalConfig::default()
    }
}

#[test]
fn check_prompt_fits_is_the_context_bound() {
    assert_eq!(max_prompt_len(4, 512), 508);
    assert_eq!(max_prompt_len(600, 512), 0);
    assert!(check_prompt_fits(508, 4, 512).is_ok());
    assert!(check_prompt_fits(0, 512, 512).is_ok());
    let e = check_prompt_fits(509, 4, 512).unwrap_err();
    assert_eq!(e, ContextOverflow { prompt_len: 509, max_new_tokens: 4, context: 512 });
    let msg = e.to_string();
    assert!(msg.contains("509") && msg.contains("512") && msg.contains("at most 508"), "{msg}");
    // No overflow on absurd lengths.
    assert!(check_prompt_fits(usize::MAX, usize::MAX, 8192).is_err());
}

#[test]
fn sampler_refuses_requests_beyond_the_context() {
    let cfg = ModelConfig::tiny(Architecture::Llama, 64, 16, 32, 1, 2, 1, true);
    let model = Transformer::new_random(cfg, 3, DType::F32, &Device::Cpu).unwrap();
    let sampling = SamplingConfig { max_new_tokens: 4, ..SamplingConfig::default() };
    let fits = vec![5u32; 508];
    let gens =
        generate_ids(&model, &GenerationRequest::batch(std::slice::from_ref(&fits), 0), &sampling, None, 0).unwrap();
    assert_eq!(gens[0].token_ids.len(), 4);
    // One token more, as the second request: refused before any work.
    let over = vec![5u32; 509];
    let err = generate_ids(&model, &GenerationRequest::batch(&[fits, over], 0), &sampling, None, 0).unwrap_err();
    assert!(
        matches!(err, SampleError::PromptTooLong { request: 1, source: ContextOverflow { prompt_len: 509, .. } }),
        "{err}"
    );
    assert!(err.to_string().contains("request 1"), "{err}");
    // A 10M-token prompt (a 10 MB question) errors at once instead of
    // trying to allocate its attention scores.
    let t0 = Instant::now();
    let huge = vec![5u32; 10_000_000];
    let err = generate_ids(&model, &GenerationRequest::batch(&[huge], 0), &sampling, None, 0).unwrap_err();
    assert!(matches!(err, SampleError::PromptTooLong { request: 0, .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn jsonl_cfg(path: &Path) -> DataConfig {
    DataConfig { path: path.display().to_string(), ..DataConfig::default() }
}

/// The issue's repro file: one 10 MB question.
fn huge_line() -> String {
    serde_json::json!({"question": format!("What is {}1?", "1+".repeat(5_000_000)), "answer": "1"}).to_string()
}

#[test]
fn huge_jsonl_line_is_skipped_not_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let huge = huge_line();
    assert!(huge.len() > MAX_LINE_BYTES);
    let t0 = Instant::now();
    // Only the huge row: nothing is left, and the error says why and where.
    let only = write(dir.path(), "huge.jsonl", &format!("{huge}\n"));
    let err = load_problems(&DataConfig { limit: Some(1), ..jsonl_cfg(&only) }).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::AllSkipped { skipped: 1, .. }), "{msg}");
    assert!(msg.contains("huge.jsonl:1:") && msg.contains(&format!("{} bytes", huge.len())), "{msg}");
    // Among good rows (with a BOM and CRLF endings): the huge one is
    // skipped and reported, the others load with their own line numbers.
    let ok = |q: &str| serde_json::json!({"question": q, "answer": "1"}).to_string();
    let mixed = write(
        dir.path(),
        "mixed.jsonl",
        &format!("\u{FEFF}{}\r\n{huge}\r\n{}\r\n", ok("What is 0+1?"), ok("What is 1+0?")),
    );
    let loaded = load_problems_reporting(&jsonl_cfg(&mixed)).unwrap();
    assert_eq!(loaded.problems.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["mixed:1", "mixed:3"]);
    assert_eq!(loaded.skipped.len(), 1);
    assert_eq!((loaded.skipped[0].path.as_path(), loaded.skipped[0].line), (mixed.as_path(), 2));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn evaluate_skips_overlong_prompts_and_names_them() {
    let tok = tokenizer();
    let m = tiny_model(&tok);
    let ps = vec![problem("short", "What is 1 + 1?"), problem("long", &long_question(400)), problem("s2", "2?")];
    let rep = evaluate(&m, &tok, &ps, &eval_cfg(4), &mut |_, _| {}).unwrap();
    assert_eq!(rep.problems.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["short", "s2"]);
    assert_eq!(rep.overall.problems, 2);
    assert_eq!(rep.skipped_prompts.len(), 1);
    let s = &rep.skipped_prompts[0];
    assert_eq!((s.id.as_str(), s.max_prompt_tokens), ("long", 508));
    assert!(s.prompt_tokens > 508, "{s:?}");
    assert!(rep.truncated_prompts.is_empty());
    // The lists survive eval.json, and reports written before them still
    // parse.
    let json = serde_json::to_value(&rep).unwrap();
    assert_eq!(json["skipped_prompts"][0]["id"], "long");
    let mut old = json.clone();
    old.as_object_mut().unwrap().remove("skipped_prompts");
    old.as_object_mut().unwrap().remove("truncated_prompts");
    let back: r2vpo_llm::eval::EvalReport = serde_json::from_value(old).unwrap();
    assert!(back.skipped_prompts.is_empty());

    // Prompt + max_new_tokens is what must fit: a prompt that fits with 4
    // new tokens does not with 500.
    let err = evaluate(&m, &tok, &ps[..1], &eval_cfg(500), &mut |_, _| {}).unwrap_err();
    assert!(matches!(err, EvalError::AllPromptsTooLong { skipped: 1, context: 512, max_new_tokens: 500, .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("`short`") && msg.contains("overlong_prompts"), "{msg}");
    let err = evaluate(&m, &tok, &ps, &eval_cfg(512), &mut |_, _| {}).unwrap_err();
    assert!(matches!(&err, EvalError::Config { field, .. } if field == "sampling.max_new_tokens"), "{err}");
}

#[test]
fn evaluate_truncates_when_configured() {
    let tok = tokenizer();
    let m = tiny_model(&tok);
    let ps = vec![problem("short", "What is 1 + 1?"), problem("long", &long_question(400))];
    let cfg = EvalConfig { overlong_prompts: OverlongPrompts::Truncate, ..eval_cfg(4) };
    let rep = evaluate(&m, &tok, &ps, &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(rep.overall.problems, 2);
    assert!(rep.skipped_prompts.is_empty());
    assert_eq!(rep.truncated_prompts.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["long"]);

    // The truncated prompt keeps the chat framing and the template around
    // the question, and has exactly the room left by max_new_tokens.
    let chat = ChatTemplate::from_tokenizer(&tok).unwrap();
    for template in [PromptTemplate::Plain, PromptTemplate::Dapo] {
        let f = PromptFitter::new(&tok, &chat, template, None, 512, 4, OverlongPrompts::Truncate).unwrap();
        let Fitted::Truncated { ids, prompt_tokens } = f.fit(&tok, &chat, &long_question(400)).unwrap() else {
            panic!("expected a truncated prompt");
        };
        assert!(prompt_tokens > 508);
        assert_eq!(ids.len(), 508);
        let text = tok.decode(&ids, false).unwrap();
        let full = chat.prompt(&template.render("What is 1+1"), None).unwrap();
        let (head, tail) = full.split_once("What is 1+1").unwrap();
        assert!(text.starts_with(head) && text.ends_with(tail), "{text}");
        // Short prompts are untouched.
        let Fitted::Fits(ids) = f.fit(&tok, &chat, "2?").unwrap() else { panic!("fits") };
        assert_eq!(ids, tok.encode(&chat.prompt(&template.render("2?"), None).unwrap(), false).unwrap());
    }
    // A context too small for the template alone: skipped even when
    // truncating.
    let f = PromptFitter::new(&tok, &chat, PromptTemplate::Dapo, None, 40, 4, OverlongPrompts::Truncate).unwrap();
    assert!(matches!(f.fit(&tok, &chat, &long_question(50)).unwrap(), Fitted::Skipped { .. }));
}

/// The issue's second repro at the library level: a ≈10k-token question to
/// the embedded SmolLM2 (context 8192) is skipped at once; the other
/// problem is evaluated.
#[test]
fn embedded_model_skips_a_ten_thousand_token_question_promptly() {
    let path = gguf();
    let model = load_model(&path, DType::F32, &Device::Cpu).unwrap();
    let tok = Tokenizer::load(&path).unwrap();
    let context = model.config().max_position_embeddings;
    let ps = vec![problem("big", &long_question(5_000)), problem("small", "What is 1 + 1?")];
    let t0 = Instant::now();
    let rep = evaluate(&model, &tok, &ps, &EvalConfig { k: 1, ..eval_cfg(4) }, &mut |_, _| {}).unwrap();
    assert_eq!(rep.skipped_prompts.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["big"]);
    assert!(rep.skipped_prompts[0].prompt_tokens > context, "{:?} vs {context}", rep.skipped_prompts);
    assert_eq!(rep.overall.problems, 1);
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
}

/// Six short problems and two with ~800-token prompts (context 512).
fn train_data(dir: &Path, short: usize, long: usize) -> String {
    let mut text = String::new();
    for i in 0..short {
        text +=
            &serde_json::json!({"question": format!("What is {i} + 1?"), "answer": (i + 1).to_string()}).to_string();
        text.push('\n');
    }
    for i in 0..long {
        text += &serde_json::json!({"question": long_question(400 + i), "answer": "1"}).to_string();
        text.push('\n');
    }
    write(dir, "mixed.jsonl", &text).display().to_string()
}

fn train_cfg(data: String) -> TrainConfig {
    let mut c = TrainConfig {
        model: ModelSource::tiny_random(gguf().display().to_string(), 7),
        iterations: 2,
        prompts_per_iter: 4,
        group_size: 2,
        rollout_batch: 8,
        minibatch_size: 8,
        micro_batch_size: 4,
        checkpoint_every: 0,
        histogram_every: 0,
        template: PromptTemplate::Plain,
        ..TrainConfig::default()
    };
    c.sampling.max_new_tokens = 6;
    c.data.path = data;
    c
}

fn events(dir: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == kind)
        .collect()
}

#[test]
fn trainer_skips_overlong_problems_and_logs_them() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = train_cfg(train_data(dir.path(), 6, 2));
    let run = dir.path().join("run");
    let mut t = Trainer::new(cfg, &run).unwrap();
    let warnings = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let w = warnings.clone();
    t.set_warning_handler(move |s| w.lock().unwrap().push(s.to_string()));
    // 8 draws from 6 usable problems: the first epoch meets both long ones.
    t.run(&AtomicBool::new(false), &mut |_| {}).unwrap();
    assert_eq!((t.prompts_skipped(), t.prompts_truncated()), (2, 0));
    let ev = events(&run, "prompt_skipped");
    let mut ids: Vec<&str> = ev.iter().map(|e| e["problem"].as_str().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["mixed:7", "mixed:8"]);
    assert!(ev.iter().all(|e| e["max_prompt_tokens"] == 506 && e["context"] == 512), "{ev:?}");
    assert_eq!(ev.iter().map(|e| e["total"].as_u64().unwrap()).max(), Some(2));
    let warnings = warnings.lock().unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings.iter().all(|w| w.contains("mixed.jsonl") && w.contains("skipped")), "{warnings:?}");
}

#[test]
fn trainer_truncates_when_configured_and_fails_clearly_when_nothing_fits() {
    let dir = tempfile::tempdir().unwrap();
    let data = train_data(dir.path(), 6, 2);
    let cfg = TrainConfig { overlong_prompts: OverlongPrompts::Truncate, ..train_cfg(data) };
    let run = dir.path().join("trunc");
    let mut t = Trainer::new(cfg, &run).unwrap();
    t.set_warning_handler(|_| {});
    t.run(&AtomicBool::new(false), &mut |_| {}).unwrap();
    assert_eq!((t.prompts_skipped(), t.prompts_truncated()), (0, 2));
    assert_eq!(events(&run, "prompt_truncated").len(), 2);

    let only_long = tempfile::tempdir().unwrap();
    let cfg = train_cfg(train_data(only_long.path(), 0, 2));
    let mut t = Trainer::new(cfg, &only_long.path().join("run")).unwrap();
    t.set_warning_handler(|_| {});
    let err = t.run(&AtomicBool::new(false), &mut |_| {}).unwrap_err();
    assert!(matches!(&err, TrainError::Config { field, .. } if field == "data"), "{err}");
    assert!(err.to_string().contains("all 2 training problems were skipped"), "{err}");

    // A generation budget that leaves no room at all is a config error.
    let mut cfg = train_cfg(train_data(only_long.path(), 1, 0));
    cfg.sampling.max_new_tokens = 512;
    let err = Trainer::new(cfg, &only_long.path().join("run2")).err().expect("config error");
    assert!(matches!(&err, TrainError::Config { field, .. } if field == "sampling.max_new_tokens"), "{err}");
}

#[test]
fn trainer_reports_skipped_dataset_lines() {
    let dir = tempfile::tempdir().unwrap();
    let ok = serde_json::json!({"question": "What is 1 + 1?", "answer": "2"}).to_string();
    let data = write(dir.path(), "d.jsonl", &format!("{ok}\n{}\n{ok}\n", huge_line()));
    let mut cfg = train_cfg(data.display().to_string());
    cfg.data.dedupe = false;
    let run = dir.path().join("run");
    let _t = Trainer::new(cfg, &run).unwrap();
    let ev = events(&run, "record_skipped");
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0]["line"].as_u64(), ev[0]["path"].as_str()), (Some(2), Some(data.display().to_string().as_str())));
}

#[test]
fn overlong_prompts_key_parses_and_defaults_to_skip() {
    let e: EvalConfig = serde_json::from_str(r#"{"k": 2}"#).unwrap();
    assert_eq!(e.overlong_prompts, OverlongPrompts::Skip);
    let e: EvalConfig = serde_json::from_str(r#"{"overlong_prompts": "truncate"}"#).unwrap();
    assert_eq!(e.overlong_prompts, OverlongPrompts::Truncate);
    assert!(serde_json::from_str::<EvalConfig>(r#"{"overlong_prompts": "cut"}"#).is_err());
    let t: TrainConfig = serde_json::from_str(r#"{"iterations": 3}"#).unwrap();
    assert_eq!((t.overlong_prompts, t.eval.overlong_prompts), (OverlongPrompts::Skip, OverlongPrompts::Skip));
    let t: TrainConfig =
        serde_json::from_str(r#"{"overlong_prompts": "truncate", "eval": {"overlong_prompts": "skip"}}"#).unwrap();
    assert_eq!(t.overlong_prompts, OverlongPrompts::Truncate);
    assert_eq!(serde_json::to_string(&OverlongPrompts::Truncate).unwrap(), "\"truncate\"");
}
