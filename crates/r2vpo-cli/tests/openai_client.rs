//! `r2vpo serve` as OpenAI-API users meet it: the official `openai` Python
//! client (pinned in `.deps/venv-openai` by `make deps`) against a real
//! server on the embedded SmolLM2 (`scripts/openai/client_check.py`:
//! completions and chat with top log-probs, streamed and not, errors as the
//! client's exception classes); then the routes operators use
//! (`/tokenize`, `/detokenize`, `/metrics` moving with the traffic) and a
//! streaming client that goes away, whose row must be freed.

use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{root, Server};

/// The value of the first sample of `metric` (with these labels, written
/// as they appear in the exposition) in a `/metrics` text.
fn sample(text: &str, metric: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(metric) && l[metric.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_official_client_and_operators_routes_work_against_r2vpo_serve() {
    let python = root().join(".deps/venv-openai/bin/python");
    assert!(python.exists(), "{} missing (run `make deps`)", python.display());
    common::gguf();
    let s = Server::start(&["--api-key", "sekret", "--max-batch", "8"]);
    let http = common::client();
    let metrics =
        || -> String { http.get(format!("{}/metrics", s.url)).bearer_auth("sekret").send().unwrap().text().unwrap() };
    let before = metrics();
    assert!(before.contains("r2vpo_weight_version_info{version=\"0\"} 1"), "{before}");

    let out = Command::new(&python)
        .arg(root().join("scripts/openai/client_check.py"))
        .args([s.url.as_str(), "sekret"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the openai client's checks failed:\n{stdout}\n{stderr}");
    eprintln!("{}", stdout.trim());

    // The counters moved with the client's traffic.
    let after = metrics();
    let moved = |m: &str| sample(&after, m) - sample(&before, m);
    assert!(moved("r2vpo_http_requests_total{route=\"/v1/completions\",status=\"200\"}") >= 3.0, "{after}");
    assert!(moved("r2vpo_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"}") >= 3.0, "{after}");
    assert!(moved("r2vpo_http_requests_total{route=\"/v1/chat/completions\",status=\"400\"}") >= 1.0, "{after}");
    assert!(moved("r2vpo_http_requests_total{route=\"/v1/models\",status=\"401\"}") >= 1.0, "{after}");
    assert!(moved("r2vpo_generation_tokens_total") >= 40.0, "{after}");
    assert!(moved("r2vpo_prompt_tokens_total") > 0.0, "{after}");
    assert!(moved("r2vpo_time_to_first_token_seconds_count") >= 6.0, "{after}");
    assert!(moved("r2vpo_time_per_output_token_seconds_count") > 0.0, "{after}");

    // Tokenize and detokenize (vLLM's shapes) round-trip; messages are
    // rendered by the chat template first.
    let post = |route: &str, body: Value| -> (u16, Value) {
        let r = http.post(format!("{}{route}", s.url)).bearer_auth("sekret").json(&body).send().unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    };
    let (code, t) = post("/tokenize", json!({"prompt": "Hello world, 2 + 2 = 4"}));
    assert_eq!(code, 200, "{t}");
    assert_eq!(t["count"].as_u64().unwrap() as usize, t["tokens"].as_array().unwrap().len());
    assert_eq!(t["max_model_len"], 8192, "{t}");
    let (code, d) = post("/detokenize", json!({"tokens": t["tokens"]}));
    assert_eq!((code, d["prompt"].as_str()), (200, Some("Hello world, 2 + 2 = 4")), "{d}");
    let (_, chat) = post("/tokenize", json!({"messages": [{"role": "user", "content": "Hello world, 2 + 2 = 4"}]}));
    assert!(chat["count"].as_u64() > t["count"].as_u64(), "the template adds its turns: {chat}");
    let (code, e) = post("/detokenize", json!({"tokens": [1, 99_999_999]}));
    assert_eq!((code, e["error"]["param"].as_str()), (400, Some("tokens[1]")), "{e}");

    // A streaming client that reads one chunk and hangs up frees its row at
    // once, not after the 400 tokens it asked for.
    let mut r = http
        .post(format!("{}/v1/completions", s.url))
        .bearer_auth("sekret")
        .json(&json!({"prompt": "Tell me a story", "max_tokens": 400, "ignore_eos": true, "stream": true}))
        .send()
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut first = [0u8; 64];
    let n = r.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("data: {"), "{:?}", &first[..n]);
    let health =
        || -> Value { http.get(format!("{}/health", s.url)).bearer_auth("sekret").send().unwrap().json().unwrap() };
    // /health's counts are published after each decode step.
    let t0 = Instant::now();
    while health()["running"] != 1 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the stream is not decoding: {}", health());
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(r);
    let t0 = Instant::now();
    while health()["running"] != 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the gone client's row is still decoding: {}", health());
        std::thread::sleep(Duration::from_millis(20));
    }
    let generated =
        sample(&metrics(), "r2vpo_generation_tokens_total") - sample(&after, "r2vpo_generation_tokens_total");
    assert!(generated < 400.0, "{generated} tokens were decoded for a client that had gone");
}
