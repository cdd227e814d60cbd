//! The HTTP rollout client against servers that misbehave: every fault is
//! retried, counted and reported, never a panic. The faulty servers are
//! small axum apps in this file (fault injection, not a stand-in for a
//! server a user runs: `r2vpo serve` itself is tested in the CLI's tests).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use candle_core::{DType, Device};
use serde_json::{json, Value};

use r2vpo_llm::model::{Architecture, ModelConfig};

use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::rollout::{GroupRequest, RolloutError, RolloutSource};
use r2vpo_llm::sample::SamplingConfig;
use r2vpo_llm::tokenizer::Tokenizer;
use r2vpo_llm::train::{RolloutBackend, RolloutConfig};
use r2vpo_serve::HttpRollout;

#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    Status500,
    NoLogprobs,
    WrongLength,
    NanLogprob,
    WrongCount,
    NotJson,
    Hang,
    WrongMode,
    /// 429: the server's queue is full.
    Busy,
}

struct App {
    fault: Fault,
    /// Requests to answer with the fault before answering well.
    faulty_first: usize,
    seen: AtomicUsize,
}

/// A well-formed answer: `n` choices of `max_tokens` tokens.
fn good(req: &Value) -> Value {
    let n = req["n"].as_u64().unwrap() as usize;
    let max = req["max_tokens"].as_u64().unwrap() as usize;
    let choices: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "index": i, "text": "", "finish_reason": "length",
                "token_ids": vec![5u32; max],
                "logprobs": {"tokens": vec!["token_id:5"; max], "token_logprobs": vec![-1.5; max], "top_logprobs": null, "text_offset": vec![0; max]},
            })
        })
        .collect();
    json!({"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": choices, "weight_version": "0", "logprobs_mode": "raw_logprobs"})
}

async fn completions(State(app): State<Arc<App>>, Json(req): Json<Value>) -> Response {
    let k = app.seen.fetch_add(1, Ordering::SeqCst);
    let fault = if k < app.faulty_first { app.fault } else { Fault::None };
    let mut v = good(&req);
    match fault {
        Fault::None => {}
        Fault::Status500 => return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        Fault::NoLogprobs => v["choices"][0]["logprobs"] = Value::Null,
        Fault::WrongLength => v["choices"][0]["logprobs"]["token_logprobs"] = json!([-1.0]),
        Fault::NanLogprob => v["choices"][0]["logprobs"]["token_logprobs"][0] = Value::Null,
        Fault::WrongCount => v["choices"].as_array_mut().unwrap().pop().map(|_| ()).unwrap_or(()),
        Fault::NotJson => return (StatusCode::OK, "<html>proxy error</html>").into_response(),
        Fault::Hang => tokio::time::sleep(Duration::from_secs(30)).await,
        Fault::WrongMode => v["logprobs_mode"] = json!("processed_logprobs"),
        Fault::Busy => return (StatusCode::TOO_MANY_REQUESTS, "queue full").into_response(),
    }
    Json(v).into_response()
}

/// Acknowledges every push, claiming version 999 whatever was pushed.
async fn update_weights(Json(_): Json<Value>) -> Json<Value> {
    Json(json!({"success": true, "message": "ok", "weight_version": "999"}))
}

/// Starts a faulty server on a free loopback port (its runtime lives on a
/// thread of its own until the test process ends).
fn start(fault: Fault, faulty_first: usize) -> String {
    let app = Arc::new(App { fault, faulty_first, seen: AtomicUsize::new(0) });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let r = Router::new()
                .route("/v1/completions", post(completions))
                .route("/update_weights_from_disk", post(update_weights))
                .with_state(app);
            axum::serve(l, r).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

fn tok() -> Tokenizer {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    Tokenizer::load(&p).unwrap()
}

fn policy(vocab: usize) -> Transformer {
    let cfg = ModelConfig::tiny(Architecture::Llama, vocab, 8, 16, 1, 2, 1, true);
    Transformer::new_random(cfg, 0, DType::F32, &Device::Cpu).unwrap()
}

fn client(urls: Vec<String>) -> HttpRollout {
    let cfg = RolloutConfig {
        backend: RolloutBackend::Http,
        urls,
        timeout_s: 0.5,
        connect_timeout_s: 0.5,
        retries: 2,
        backoff_s: 0.01,
        ..RolloutConfig::default()
    };
    HttpRollout::new(&cfg, &std::env::temp_dir()).unwrap()
}

fn groups() -> Vec<GroupRequest> {
    (0..3).map(|k| GroupRequest { prompt_ids: vec![1, 2, 3 + k], seeds: vec![k as u64; 4] }).collect()
}

fn sampling() -> SamplingConfig {
    SamplingConfig { max_new_tokens: 3, ..SamplingConfig::default() }
}

#[test]
fn every_permanent_fault_is_a_clear_error_and_transient_ones_are_retried() {
    let tok = tok();
    let pol = policy(tok.vocab_size());
    let cases = [
        (Fault::Status500, "http_5xx", "500"),
        (Fault::NoLogprobs, "protocol", "no logprobs"),
        (Fault::WrongLength, "protocol", "log-probs for 3 tokens"),
        (Fault::NanLogprob, "protocol", "missing, non-finite"),
        (Fault::WrongCount, "protocol", "3 choices for n = 4"),
        (Fault::NotJson, "protocol", "not a completion"),
        (Fault::Hang, "timeout", "timed out"),
        (Fault::Busy, "http_429", "429"),
    ];
    for (fault, kind, says) in cases {
        // Always faulty: the rollout fails with the last error, after retries.
        let mut c = client(vec![start(fault, usize::MAX)]);
        let e = c.generate(&pol, &tok, &groups(), &sampling()).unwrap_err();
        assert!(matches!(e, RolloutError::Unavailable(_)), "{fault:?}: {e}");
        let text = e.to_string();
        assert!(text.contains(says) || text.contains("every server failed"), "{fault:?}: {text}");
        let n = c.counters();
        assert!(n.failures.get(kind).copied().unwrap_or(0) >= 1, "{fault:?}: {n:?}");
        // Faulty twice, then well: the rollout succeeds through retries.
        let mut c = client(vec![start(fault, 2)]);
        let r = c.generate(&pol, &tok, &groups(), &sampling()).unwrap();
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|g| g.generations.len() == 4 && g.generations[0].token_ids == vec![5, 5, 5]));
        assert_eq!(r[0].generations[0].model_logprobs, vec![-1.5; 3]);
        let n = c.counters();
        assert_eq!(n.failures.get(kind).copied(), Some(2), "{fault:?}: {n:?}");
        assert!(n.retries >= 2);
    }
}

#[test]
fn a_dead_or_faulty_server_is_failed_over_and_a_contract_mismatch_stops_at_once() {
    let tok = tok();
    let pol = policy(tok.vocab_size());
    // Port 9 (discard) has no listener here: connection refused.
    let mut c = client(vec!["http://127.0.0.1:9".into(), start(Fault::Status500, usize::MAX), start(Fault::None, 0)]);
    let r = c.generate(&pol, &tok, &groups(), &sampling()).unwrap();
    assert_eq!(r.len(), 3);
    // A server serving the wrong log-prob meaning is never retried.
    let mut c = client(vec![start(Fault::WrongMode, usize::MAX), start(Fault::None, 0)]);
    let e = c.generate(&pol, &tok, &groups(), &sampling()).unwrap_err().to_string();
    assert!(e.contains("--logprobs-mode raw_logprobs"), "{e}");
}

#[test]
fn a_push_acknowledged_with_another_version_is_a_failure() {
    let tok = tok();
    let pol = policy(tok.vocab_size());
    let dir = tempfile::tempdir().unwrap();
    let cfg = RolloutConfig {
        backend: RolloutBackend::Http,
        urls: vec![start(Fault::None, 0)],
        timeout_s: 5.0,
        connect_timeout_s: 0.5,
        retries: 1,
        backoff_s: 0.01,
        ..RolloutConfig::default()
    };
    let mut c = HttpRollout::new(&cfg, dir.path()).unwrap();
    let e = c.sync_weights(&r2vpo_llm::rollout::WeightSnapshot::new(&pol, 3), &tok).unwrap_err().to_string();
    assert!(e.contains("pushed weight version 3, the server reports 999"), "{e}");
    assert!(c.counters().failures.get("push").copied().unwrap_or(0) >= 1, "{:?}", c.counters());
}
