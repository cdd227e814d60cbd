//! `r2vpo serve` as a user runs it: a real process on a free loopback port
//! serving a tiny random model, checked through HTTP against the learner's
//! own recomputation of the log-probs.

mod common;

use candle_core::{Device, Tensor};
use common::{post, tiny, tiny_dir, Server};
use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::tokenizer::PaddedBatch;
use serde_json::{json, Value};

/// log π(token) of each response token, recomputed by the learner's
/// full-sequence scoring pass.
fn learner_logprobs(m: &Transformer, prompt: &[u32], responses: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let seqs: Vec<Vec<u32>> = responses.iter().map(|r| [prompt.to_vec(), r.clone()].concat()).collect();
    let b = PaddedBatch::left_pad(&seqs, 0);
    let (ids, mask) = b.to_tensors(&Device::Cpu).unwrap();
    let w = b.width();
    let targets = Tensor::cat(&[ids.narrow(1, 1, w - 1).unwrap(), ids.narrow(1, w - 1, 1).unwrap()], 1).unwrap();
    let lp = m.score_logprobs(&ids, &mask, &targets).unwrap().to_vec2::<f32>().unwrap();
    responses.iter().enumerate().map(|(i, r)| (0..r.len()).map(|k| lp[i][w - r.len() + k - 1]).collect()).collect()
}

/// (token ids, log-probs) of each choice; checks that `token_ids` and the
/// `token_id:N` strings agree.
fn choices(v: &Value) -> Vec<(Vec<u32>, Vec<f32>)> {
    v["choices"]
        .as_array()
        .unwrap_or_else(|| panic!("no choices in {v}"))
        .iter()
        .map(|c| {
            let ids: Vec<u32> = serde_json::from_value(c["token_ids"].clone()).unwrap();
            let toks: Vec<u32> = c["logprobs"]["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().strip_prefix("token_id:").unwrap().parse().unwrap())
                .collect();
            assert_eq!(ids, toks, "token ids round-trip");
            let lp: Vec<f32> = c["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            assert_eq!(lp.len(), ids.len());
            (ids, lp)
        })
        .collect()
}

fn max_gap(m: &Transformer, prompt: &[u32], cs: &[(Vec<u32>, Vec<f32>)]) -> f32 {
    let ids: Vec<Vec<u32>> = cs.iter().map(|c| c.0.clone()).collect();
    let mut worst = 0.0f32;
    for (c, r) in cs.iter().zip(learner_logprobs(m, prompt, &ids)) {
        for (a, b) in c.1.iter().zip(&r) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

fn completion(prompt: &[u32], n: usize, max_tokens: usize, temperature: f64, seed: u64) -> Value {
    json!({
        "prompt": prompt, "n": n, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
        "logprobs": 0, "return_tokens_as_token_ids": true,
    })
}

/// How far a served log-prob may be from the learner's full-sequence
/// recomputation without `--rescore-logprobs` (with it: exactly 0, tested
/// below). Incremental decoding and a whole-sequence pass multiply
/// differently shaped matrices, so f32 sums round differently: measured
/// 9e-5 (greedy) and 1.7e-4 (T = 1) on SmolLM2-135M and 4e-5 on the tiny
/// model, for the in-process sampler and the server alike (the server adds no error of its own:
/// `the_server_samples_what_the_in_process_sampler_samples`). Exact ρ = 1
/// at the first update is `behaviour_logprobs = "recompute"`.
const TOL: f32 = 5e-4;

/// How close two computations of the same log-probs on the same kernels
/// must be (the server against the in-process sampler, a rescoring against
/// the learner): 1e-5 nats. Built with the torch feature, the server
/// decodes on libtorch while the reference here is candle: two kernel sets
/// over SmolLM2's 30 layers, measured 3.3e-5 apart on a 2-core AMD EPYC
/// (Zen 3), so 1e-4 there.
const SAME: f32 = if cfg!(feature = "torch") { 1e-4 } else { 1e-5 };

const PROMPT: [u32; 7] = [1, 9690, 198, 2683, 314, 216, 34];

/// A LoRA adapter pushed as a PEFT folder is folded into the base the
/// server started with: it then serves the merged model. An adapter that
/// does not fit (another rank, a target it has no tensors for) is refused
/// with a 400 naming what is wrong, and the old weights keep serving.
#[test]
fn adapter_pushes_serve_the_merged_model_and_bad_adapters_keep_the_old_weights() {
    use r2vpo_llm::model::lora::{self, AdapterInit, LoraConfig, LoraTarget};
    use r2vpo_llm::model::TensorSource;
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny_dir(&tmp.path().join("base"), 7);
    let s = Server::start(&["--model", base.to_str().unwrap()]);
    let url = format!("{}/v1/completions", s.url);
    let (m7, _) = tiny(7);
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: vec![LoraTarget::QProj, LoraTarget::VProj, LoraTarget::DownProj],
        ..LoraConfig::default()
    };
    let init = AdapterInit::new(m7.config(), &lora);
    let tensors: std::collections::HashMap<String, Tensor> = init
        .names()
        .into_iter()
        .map(|n| {
            let t = init.tensor(&n).unwrap();
            let t = if n.ends_with("lora_B.weight") { (t.ones_like().unwrap() * 0.3).unwrap() } else { t };
            (n, t)
        })
        .collect();
    let adapter = tmp.path().join("adapter");
    lora::save_peft(&adapter, &lora, None, &tensors).unwrap();
    let merged = {
        let (cfg, src) = r2vpo_llm::model::source::open(&base).unwrap();
        let (read, files) = lora::open_peft(&adapter).unwrap();
        let src = lora::MergedSource::new(&cfg, src, &read, Box::new(files)).unwrap();
        Transformer::from_source(cfg, &src, candle_core::DType::F32, &Device::Cpu).unwrap()
    };
    let (code, v) = post(
        &format!("{}/update_weights_from_disk", s.url),
        &json!({"model_path": adapter.to_str().unwrap(), "weight_version": "lora-1"}),
    );
    assert_eq!((code, v["weight_version"].as_str()), (200, Some("lora-1")), "{v}");
    let (_, after) = post(&url, &completion(&PROMPT, 4, 12, 1.0, 5));
    let cs = choices(&after);
    assert!(max_gap(&merged, &PROMPT, &cs) < TOL, "the merged model serves");
    assert!(max_gap(&m7, &PROMPT, &cs) > 1e-2, "and the bare base no longer does");

    let edit = |name: &str, f: &dyn Fn(&mut Value)| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(adapter.join(lora::ADAPTER_WEIGHTS), dir.join(lora::ADAPTER_WEIGHTS)).unwrap();
        let mut c: Value =
            serde_json::from_str(&std::fs::read_to_string(adapter.join(lora::ADAPTER_CONFIG)).unwrap()).unwrap();
        f(&mut c);
        std::fs::write(dir.join(lora::ADAPTER_CONFIG), c.to_string()).unwrap();
        dir
    };
    let rank = edit("rank", &|c| c["r"] = json!(8));
    let target = edit("target", &|c| c["target_modules"] = json!(["q_proj", "v_proj", "down_proj", "k_proj"]));
    let dora = edit("dora", &|c| c["use_dora"] = json!(true));
    for (dir, why) in [(&rank, "another rank"), (&target, "k_proj.lora_A.weight"), (&dora, "use_dora")] {
        let (code, v) = post(
            &format!("{}/update_weights_from_disk", s.url),
            &json!({"model_path": dir.to_str().unwrap(), "weight_version": "bad"}),
        );
        assert_eq!(code, 400, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(why) && message.contains("still serving weight version lora-1"), "{message}");
    }
    let (_, still) = post(&url, &completion(&PROMPT, 4, 12, 1.0, 5));
    assert_eq!((still["weight_version"].as_str(), choices(&still)), (Some("lora-1"), cs));
}

#[test]
fn served_logprobs_equal_the_learners_and_weight_pushes_take_effect() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tiny_dir(&tmp.path().join("a"), 7);
    let s = Server::start(&["--model", a.to_str().unwrap()]);
    let url = format!("{}/v1/completions", s.url);
    let (m7, _) = tiny(7);

    // Greedy and T = 1 sampling: ρ = 1 within the f32 gap between
    // incremental decoding and a full-sequence pass (see `TOL`).
    for t in [0.0, 1.0] {
        let (code, v) = post(&url, &completion(&PROMPT, 4, 12, t, 3));
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["weight_version"], "0");
        assert_eq!(v["logprobs_mode"], "raw_logprobs");
        let cs = choices(&v);
        assert_eq!(cs.len(), 4);
        let gap = max_gap(&m7, &PROMPT, &cs);
        assert!(gap < TOL, "T = {t}: served vs learner log-probs differ by {gap}");
    }
    // The same seed gives the same samples.
    let (_, v1) = post(&url, &completion(&PROMPT, 4, 12, 1.0, 5));
    let (_, v2) = post(&url, &completion(&PROMPT, 4, 12, 1.0, 5));
    assert_eq!(choices(&v1), choices(&v2));

    // A weight push changes the distribution and the reported version.
    let b = tiny_dir(&tmp.path().join("b"), 8);
    let (code, v) = post(
        &format!("{}/update_weights_from_disk", s.url),
        &json!({"model_path": b.to_str().unwrap(), "weight_version": "3"}),
    );
    assert_eq!((code, v["success"].as_bool(), v["weight_version"].as_str()), (200, Some(true), Some("3")), "{v}");
    let (_, v3) = post(&url, &completion(&PROMPT, 4, 12, 1.0, 5));
    assert_eq!(v3["weight_version"], "3");
    let (m8, _) = tiny(8);
    let cs = choices(&v3);
    assert!(max_gap(&m8, &PROMPT, &cs) < TOL, "after the push the new weights serve");
    assert!(max_gap(&m7, &PROMPT, &cs) > 1e-2, "and the old ones no longer do");

    // A push that does not load keeps the old weights serving; so does
    // one whose config.json declares fewer layers than its tensors hold
    // (it would load, as another model), and one of another model: weights
    // are set in place, into the model being served.
    let narrower = tmp.path().join("narrower");
    {
        use r2vpo_llm::model::{Architecture, ModelConfig};
        let (_, tok) = tiny(0);
        let cfg = ModelConfig::tiny(Architecture::Llama, tok.vocab_size(), 16, 64, 2, 4, 2, true);
        let m = Transformer::new_random(cfg, 3, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        r2vpo_llm::backend::Policy::save_hf(&m, &narrower).unwrap();
    }
    let fewer = tiny_dir(&tmp.path().join("fewer"), 9);
    let config = fewer.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("\"num_hidden_layers\": 2"), "{text}");
    std::fs::write(&config, text.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1")).unwrap();
    for bad in [
        json!({"model_path": tmp.path().join("missing").to_str().unwrap(), "weight_version": "4"}),
        json!({"model_path": 5}),
        json!({"model_path": fewer.to_str().unwrap(), "weight_version": "4"}),
        json!({"model_path": narrower.to_str().unwrap(), "weight_version": "4"}),
    ] {
        let (code, v) = post(&format!("{}/update_weights_from_disk", s.url), &bad);
        assert_eq!(code, 400, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.len() > 10, "{v}");
        if bad["model_path"].as_str() == fewer.to_str() {
            assert!(message.contains("num_hidden_layers") && message.contains("declares 1 layers"), "{v}");
            assert!(message.contains("tensors of 2") && message.contains("model.layers.1."), "{v}");
            assert!(message.contains("still serving weight version 3"), "{v}");
        }
        if bad["model_path"].as_str() == narrower.to_str() {
            assert!(message.contains("describes another model than the one served"), "{v}");
            assert!(message.contains("still serving weight version 3"), "{v}");
        }
    }
    let (_, v4) = post(&url, &completion(&PROMPT, 4, 12, 1.0, 5));
    assert_eq!(v4["weight_version"], "3");
    assert_eq!(choices(&v4), cs);

    // Pause: a new request waits (reported by /health) until generation
    // continues, then completes with the same answer.
    let health = || -> Value { common::client().get(format!("{}/health", s.url)).send().unwrap().json().unwrap() };
    let (code, v) = post(&format!("{}/pause_generation", s.url), &json!({}));
    assert_eq!((code, v["weight_version"].as_str()), (200, Some("3")), "{v}");
    let waiting = |url: String| std::thread::spawn(move || post(&url, &completion(&PROMPT, 4, 12, 1.0, 5)));
    let pending = waiting(url.clone());
    let t0 = std::time::Instant::now();
    while health()["waiting"].as_u64() != Some(1) {
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "{}", health());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(health()["paused"], true);
    assert!(!pending.is_finished(), "a paused server admits nothing");
    let (code, _) = post(&format!("{}/continue_generation", s.url), &json!({}));
    assert_eq!(code, 200);
    let (code, v5) = pending.join().unwrap();
    assert_eq!((code, choices(&v5)), (200, cs.clone()));

    // SIGTERM while paused with a request queued: the queued request is
    // still answered and the server exits cleanly (it used to wait forever).
    post(&format!("{}/pause_generation", s.url), &json!({}));
    let pending = waiting(url.clone());
    let t0 = std::time::Instant::now();
    while health()["waiting"].as_u64() != Some(1) {
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "{}", health());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let st = s.signal(libc::SIGTERM);
    assert_eq!(st.code(), Some(0), "{st:?}");
    let (code, v6) = pending.join().unwrap();
    assert_eq!((code, choices(&v6)), (200, cs));
}

#[test]
fn concurrent_clients_get_complete_answers_and_bad_requests_get_4xx() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tiny_dir(&tmp.path().join("a"), 7);
    // RUST_BACKTRACE: error bodies must not carry the backtraces candle
    // attaches then.
    let s = Server::start_with(
        0,
        &["--model", a.to_str().unwrap(), "--max-batch", "16", "--api-key", "sekret", "--max-body-bytes", "100000"],
        &[("RUST_BACKTRACE", "1")],
    );
    let url = format!("{}/v1/completions", s.url);
    let auth_post = |url: &str, body: &Value| -> (u16, Value) {
        let r = common::client().post(url).bearer_auth("sekret").json(body).send().unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    };
    let auth = |body: &Value| auth_post(&url, body);
    // 16 requests in flight (n = 1..4, lengths 4..32) plus one over-long prompt.
    let (m7, _) = tiny(7);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                let auth = &auth;
                sc.spawn(move || {
                    let prompt: Vec<u32> = PROMPT.iter().map(|&t| t + i as u32).collect();
                    let (n, max) = (1 + i % 4, 4 + 2 * i);
                    let (code, v) = auth(&completion(&prompt, n, max, 1.0, i as u64));
                    (prompt, n, max, code, v)
                })
            })
            .collect();
        let long: Vec<u32> = vec![5; 600];
        let (code, v) = auth(&completion(&long, 1, 4, 1.0, 0));
        assert_eq!(code, 400, "{v}");
        assert_eq!(v["error"]["param"], "prompt", "{v}");
        for h in hs {
            let (prompt, n, max, code, v) = h.join().unwrap();
            assert_eq!(code, 200, "{v}");
            let cs = choices(&v);
            assert_eq!(cs.len(), n);
            for (c, choice) in cs.iter().zip(v["choices"].as_array().unwrap()) {
                let full = choice["finish_reason"] == "length";
                assert!(c.0.len() <= max && (!full || c.0.len() == max), "{choice}");
            }
            assert!(max_gap(&m7, &prompt, &cs) < TOL);
        }
    });

    // Bad input: a 4xx naming the field, and the server keeps serving.
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"prompt": [1, 2], "bogus": 1}), 400, "bogus"),
        (json!({"prompt": [1, 2], "n": 17}), 400, "n"),
        (json!({"prompt": [1, 2], "max_tokens": 600}), 400, "max_tokens"),
        (json!({"prompt": [1, 4_000_000]}), 400, "prompt"),
        (json!({"prompt": [1, 2], "temperature": -1.0}), 400, "temperature"),
        (json!({"prompt": [1, 2], "top_p": 0.0}), 400, "top_p"),
        (json!({"prompt": [1, 2], "logprobs": 21}), 400, "logprobs"),
        (json!({"prompt": [1, 2], "echo": true}), 400, "echo"),
        (json!({"prompt": []}), 400, "prompt"),
        (json!({"prompt": [1, 2], "n": "two"}), 400, "n"),
    ];
    for (body, code, field) in cases {
        let (c, v) = auth(&body);
        assert_eq!(c, code, "{body} -> {v}");
        assert_eq!(v["error"]["param"], field, "{body} -> {v}");
    }
    let raw = |body: &str| {
        let r = common::client()
            .post(&url)
            .bearer_auth("sekret")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap_or(Value::Null))
    };
    assert_eq!(raw("{not json").0, 400);
    assert_eq!(raw(r#"{"prompt": [1], "temperature": 1e999}"#).0, 400, "non-finite temperature");
    assert_eq!(raw(&format!(r#"{{"prompt": "{}"}}"#, "x".repeat(200_000))).0, 413, "body limit");
    // The key is checked on every route.
    assert_eq!(post(&url, &completion(&PROMPT, 1, 2, 1.0, 0)).0, 401);
    for route in ["/v1/models", "/health", "/get_weight_version"] {
        let get = |key: Option<&str>| {
            let mut r = common::client().get(format!("{}{route}", s.url));
            if let Some(k) = key {
                r = r.bearer_auth(k);
            }
            r.send().unwrap().status().as_u16()
        };
        assert_eq!((get(None), get(Some("wrong")), get(Some("sekret"))), (401, 401, 200), "{route}");
    }
    // The bearer scheme is case-insensitive (RFC 7235); the key is not.
    for (header, want) in [("bearer sekret", 200), ("BEARER sekret", 200), ("Bearer SEKRET", 401)] {
        let code = common::client()
            .get(format!("{}/health", s.url))
            .header("authorization", header)
            .send()
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(code, want, "{header}");
    }
    // A weight push is no oracle for the server's files: nothing that is
    // not a model folder or a .gguf file is opened, and a .gguf that is not
    // one is refused without quoting it; no body carries a backtrace.
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "root:x:0:0").unwrap();
    let fake = tmp.path().join("fake.gguf");
    std::fs::write(&fake, "root:x:0:0").unwrap();
    let broken = tmp.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("config.json"), "{ not json").unwrap();
    for path in [&secret, &fake, &broken] {
        let (code, v) =
            auth_post(&format!("{}/update_weights_from_disk", s.url), &json!({"model_path": path.to_str().unwrap()}));
        let message = v["error"]["message"].as_str().unwrap_or_default().to_string();
        assert_eq!(code, 400, "{v}");
        assert!(!message.contains("root") && !message.contains("746f6f72"), "{message}");
        assert!(!message.contains("backtrace") && !message.contains('\n'), "{message}");
    }
    let (code, v) = auth(&completion(&PROMPT, 2, 3, 0.0, 0));
    assert_eq!(code, 200, "still serving: {v}");
    // Text prompts and stop strings.
    let (code, v) = auth(&json!({"prompt": "What is 2 + 2?", "max_tokens": 8, "n": 2}));
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap() as usize,
        v["choices"].as_array().unwrap().iter().map(|c| c["token_ids"].as_array().unwrap().len()).sum::<usize>()
    );
}

/// The embedded SmolLM2-135M served as `make demo` serves it: ρ = 1 within
/// [`TOL`] for greedy and T = 1 samples, and the same tokens and log-probs
/// as the in-process sampler for the same seeds.
#[test]
fn the_server_samples_what_the_in_process_sampler_samples() {
    let gguf = common::gguf();
    let s = Server::start(&["--model", gguf.to_str().unwrap()]);
    let m = r2vpo_llm::backend::candle::load_model(&gguf, candle_core::DType::F32, &Device::Cpu).unwrap();
    let tok = r2vpo_llm::tokenizer::Tokenizer::load(&gguf).unwrap();
    let prompt = tok.encode("<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n", false).unwrap();
    for t in [0.0, 1.0] {
        let (code, v) = post(&format!("{}/v1/completions", s.url), &completion(&prompt, 4, 10, t, 11));
        assert_eq!(code, 200, "{v}");
        let gap = max_gap(&m, &prompt, &choices(&v));
        eprintln!("SmolLM2 T = {t}: max |served − learner| log-prob {gap:e}");
        assert!(gap < TOL, "T = {t}: {gap}");
        // The in-process sampler with the server's per-sample seeds.
        let seeds: Vec<u64> = (0..4).map(|i| r2vpo_llm::sample::request_seed(11, i)).collect();
        let reqs: Vec<_> = seeds
            .iter()
            .map(|&seed| r2vpo_llm::sample::GenerationRequest { prompt_ids: prompt.clone(), seed })
            .collect();
        let cfg = r2vpo_llm::sample::SamplingConfig { temperature: t, max_new_tokens: 10, ..Default::default() };
        let local = r2vpo_llm::sample::generate(&m, &tok, &reqs, &cfg).unwrap();
        let mut worst = 0.0f32;
        for (c, g) in choices(&v).iter().zip(&local) {
            assert_eq!(c.0, g.token_ids, "same seed, same tokens");
            for (a, b) in c.1.iter().zip(&g.model_logprobs) {
                worst = worst.max((a - b).abs());
            }
        }
        eprintln!("SmolLM2 T = {t}: max |served − in-process| log-prob {worst:e}");
        assert!(worst < SAME, "T = {t}: the server differs from the in-process sampler by {worst}");
    }
    drop(s);
    // With --rescore-logprobs the served log-probs come from the learner's
    // own whole-sequence computation: ρ = 1 within 1e-5 (`SAME`).
    let s = Server::start(&["--model", gguf.to_str().unwrap(), "--rescore-logprobs"]);
    for t in [0.0, 1.0] {
        let (code, v) = post(&format!("{}/v1/completions", s.url), &completion(&prompt, 4, 10, t, 11));
        assert_eq!(code, 200, "{v}");
        let gap = max_gap(&m, &prompt, &choices(&v));
        eprintln!("SmolLM2 T = {t}, --rescore-logprobs: max |served − learner| log-prob {gap:e}");
        assert!(gap < SAME, "T = {t}: {gap}");
    }
}

/// `r2vpo serve --dtype bf16` on the candle backend: the weight matrices
/// held in bf16, everything else in f32. Its log-probs are the learner's
/// on the same weights rounded to bf16 (within [`TOL`], the f32 gap of
/// incremental decoding), not the unrounded f32 model's, and a pushed f32
/// folder is rounded the same way on load. (On the torch backend bf16 is
/// the whole forward in bf16, which this does not describe.)
#[cfg(not(feature = "torch"))]
#[test]
fn a_bf16_server_serves_the_learners_log_probs_on_bf16_rounded_weights() {
    use r2vpo_llm::model::source::{self, NamedTensors};
    let rounded = |dir: &std::path::Path| -> Transformer {
        let (cfg, src) = source::open(dir).unwrap();
        let map = src
            .names()
            .into_iter()
            .map(|n| {
                let t = src.tensor(&n).unwrap();
                (n, t.to_dtype(candle_core::DType::BF16).unwrap().to_dtype(candle_core::DType::F32).unwrap())
            })
            .collect();
        let src = NamedTensors::new(dir, map);
        Transformer::from_source(cfg, &src, candle_core::DType::F32, &Device::Cpu).unwrap()
    };
    let tmp = tempfile::tempdir().unwrap();
    let a = tiny_dir(&tmp.path().join("a"), 7);
    let s = Server::start(&["--model", a.to_str().unwrap(), "--dtype", "bf16"]);
    let url = format!("{}/v1/completions", s.url);
    let (m7, _) = tiny(7);
    let r7 = rounded(&a);
    for t in [0.0, 1.0] {
        let (code, v) = post(&url, &completion(&PROMPT, 4, 12, t, 3));
        assert_eq!(code, 200, "{v}");
        let cs = choices(&v);
        let gap = max_gap(&r7, &PROMPT, &cs);
        assert!(gap < TOL, "T = {t}: bf16 server vs learner on rounded weights: {gap}");
        let unrounded = max_gap(&m7, &PROMPT, &cs);
        assert!(unrounded > TOL, "T = {t}: the served weights are not bf16 (gap to f32 only {unrounded})");
    }
    let b = tiny_dir(&tmp.path().join("b"), 8);
    let (code, v) = post(
        &format!("{}/update_weights_from_disk", s.url),
        &json!({"model_path": b.to_str().unwrap(), "weight_version": "1"}),
    );
    assert_eq!((code, v["success"].as_bool()), (200, Some(true)), "{v}");
    let (_, v) = post(&url, &completion(&PROMPT, 4, 12, 1.0, 5));
    assert_eq!(v["weight_version"], "1");
    let cs = choices(&v);
    assert!(max_gap(&rounded(&b), &PROMPT, &cs) < TOL, "a pushed f32 folder serves rounded to bf16");
}
