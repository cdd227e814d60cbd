//! Conformance against an OpenAI-compatible server nobody here wrote:
//! llama.cpp through llama-cpp-python's server (`make test-conformance`;
//! ignored by `make test`, which cannot build llama.cpp in its time budget).
//!
//! What it checks of the rollout contract:
//! * the prompt tokenizes to the same ids on both sides (same GGUF);
//! * llama.cpp's `logprobs.token_logprobs` are *raw* log-probs: log softmax of
//!   the untruncated logits before temperature, equal to the learner's
//!   recomputation on the same weights at T = 0, 1 and 0.7 — so
//!   `rollout.logprobs_mode = "raw"` is the right setting for it;
//! * llama-cpp-python takes text prompts only (a token-id prompt is answered
//!   with HTTP 500 and a validation error) and returns tokens as text only
//!   (no `token_ids`, no `return_tokens_as_token_ids`), so it cannot carry
//!   the learner's exact token sequences: `HttpRollout` fails with the
//!   server's own message rather than guessing ids from text. It has no
//!   weight-update endpoint either (`weight_push = "none"`).

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use r2vpo_llm::rollout::{GroupRequest, LogprobsMode, RolloutSource};
use r2vpo_llm::sample::SamplingConfig;
use r2vpo_llm::tokenizer::{PaddedBatch, Tokenizer};
use r2vpo_llm::train::{RolloutBackend, RolloutConfig, WeightPush};
use serde_json::{json, Value};

struct Llama(Child);

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python() -> PathBuf {
    let p = common::root().join(".deps/venv-conformance/bin/python");
    assert!(p.exists(), "{} missing: run `make test-conformance` (it installs llama-cpp-python)", p.display());
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
#[ignore = "needs llama-cpp-python: make test-conformance"]
fn llama_cpp_serves_raw_logprobs_that_match_the_learner() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("tiny.gguf");
    let st = Command::new(python())
        .arg(common::root().join("scripts/conformance/tiny_gguf.py"))
        .arg(common::gguf())
        .arg(&gguf)
        .arg("0")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let port = free_port();
    let child = Command::new(python())
        // f32 KV cache (GGML type 0): llama.cpp keeps f16 by default, which
        // alone moves log-probs by ~1e-2 on this model.
        .args(["-m", "llama_cpp.server", "--host", "127.0.0.1", "--n_ctx", "512", "--type_k", "0", "--type_v", "0"])
        .args(["--port", &port.to_string(), "--model"])
        .arg(&gguf)
        .current_dir(tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Llama(child);
    let url = format!("http://127.0.0.1:{port}");
    let http = common::client();
    let t0 = Instant::now();
    while http.get(format!("{url}/v1/models")).send().map(|r| !r.status().is_success()).unwrap_or(true) {
        assert!(t0.elapsed() < Duration::from_secs(120), "llama-cpp-python did not start");
        std::thread::sleep(Duration::from_millis(200));
    }

    let model = r2vpo_llm::backend::candle::load_model(&gguf, DType::F32, &Device::Cpu).unwrap();
    let tok = Tokenizer::load(&gguf).unwrap();
    // Single-token texts, to map llama.cpp's token strings back to ids;
    // strings that several ids decode to are ambiguous and not used.
    let mut by_text: HashMap<String, Vec<u32>> = HashMap::new();
    for id in 0..tok.vocab_size() as u32 {
        by_text.entry(tok.decode(&[id], false).unwrap()).or_default().push(id);
    }
    let mut worst = 0.0f32;
    let mut checked = 0;
    for (k, prompt) in ["What is 2 + 2?", "Compute 17 * 3. Answer:", "The capital of France is"].iter().enumerate() {
        let ids = tok.encode(prompt, false).unwrap();
        for t in [0.0, 1.0, 0.7] {
            let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": t, "logprobs": 0, "seed": k});
            let v: Value = http.post(format!("{url}/v1/completions")).json(&body).send().unwrap().json().unwrap();
            assert_eq!(v["usage"]["prompt_tokens"].as_u64().unwrap() as usize, ids.len(), "same prompt ids: {v}");
            let c = &v["choices"][0];
            assert!(c.get("token_ids").is_none(), "llama-cpp-python now returns token ids: use them");
            let toks: Vec<&str> =
                c["logprobs"]["tokens"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
            let lps: Vec<f32> = c["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let Some(resp): Option<Vec<u32>> =
                toks.iter().map(|s| by_text.get(*s).filter(|v| v.len() == 1).map(|v| v[0])).collect()
            else {
                continue;
            };
            let seq = [ids.clone(), resp.clone()].concat();
            let b = PaddedBatch::left_pad(&[seq], 0);
            let (x, m) = b.to_tensors(&Device::Cpu).unwrap();
            let w = b.width();
            let targets = Tensor::cat(&[x.narrow(1, 1, w - 1).unwrap(), x.narrow(1, w - 1, 1).unwrap()], 1).unwrap();
            let lp = model.score_logprobs(&x, &m, &targets).unwrap().to_vec2::<f32>().unwrap();
            for (j, served) in lps.iter().enumerate() {
                let ours = lp[0][w - resp.len() + j - 1];
                worst = worst.max((served - ours).abs());
            }
            checked += 1;
        }
    }
    eprintln!("llama.cpp vs learner: {checked} samples, max |Δ log-prob| {worst:e}");
    assert!(checked >= 6, "too few samples had unambiguous tokens ({checked})");
    assert!(worst < 1e-3, "llama.cpp's log-probs are not the learner's raw T = 1 log-probs: {worst}");

    // The rollout client cannot use it, and says why.
    let cfg = RolloutConfig {
        backend: RolloutBackend::Http,
        urls: vec![url.clone()],
        logprobs_mode: LogprobsMode::Raw,
        weight_push: WeightPush::None,
        retries: 0,
        ..RolloutConfig::default()
    };
    let mut c = r2vpo_serve::HttpRollout::new(&cfg, tmp.path()).unwrap();
    let groups = vec![GroupRequest { prompt_ids: tok.encode("What is 2 + 2?", false).unwrap(), seeds: vec![1] }];
    let e = c
        .generate(&model, &tok, &groups, &SamplingConfig { max_new_tokens: 4, ..SamplingConfig::default() })
        .unwrap_err()
        .to_string();
    eprintln!("HttpRollout against llama-cpp-python: {e}");
    assert!(e.contains("no rollout server is available") && e.contains("prompt"), "{e}");
}
