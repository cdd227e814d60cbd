//! `llm train` with `[rollout] backend = "http"` against two real
//! `r2vpo serve` processes: iterations run with pushed weights, a server
//! killed mid-run is failed over, a SIGKILLed learner resumes, and with no
//! server left the run stops with a checkpoint and resumes once one is back.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{root, tiny_dir, Server};

#[path = "../../r2vpo-queue/tests/support/redis_server.rs"]
mod redis_server;

fn write_config(dir: &Path, urls: &[&str], iterations: usize) -> PathBuf {
    let gguf = common::gguf();
    let urls: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    let text = format!(
        r#"
iterations = {iterations}
prompts_per_iter = 2
group_size = 4
minibatch_size = 4
micro_batch_size = 2
checkpoint_every = 1
histogram_every = 0
mode = "off"
[model]
path = "{}"
[model.random]
hidden = 32
intermediate = 64
layers = 2
heads = 4
kv_heads = 2
seed = 3
init_std = 0.5
[data]
count = 40
[sampling]
max_new_tokens = 6
[replay]
minibatch_size = 4
capacity_iters = 2
[optim]
lr = 1e-3
[rollout]
backend = "http"
urls = [{}]
timeout_s = 20
connect_timeout_s = 2
retries = 3
backoff_s = 0.05
"#,
        gguf.display(),
        urls.join(", ")
    );
    let p = dir.join("http.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn train(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root()).args(["--threads", "1", "llm", "train", "--quiet", "--no-export"]).args(args);
    c
}

fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn wait_for_lines(dir: &Path, n: usize, child: &mut std::process::Child) {
    let t0 = Instant::now();
    while metrics(dir).len() < n {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before {n} iterations");
        assert!(t0.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn http_rollouts_fail_over_resume_and_stop_with_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_dir(&tmp.path().join("init"), 3);
    let m = model.to_str().unwrap();
    let a = Server::start(&["--model", m]);
    let b = Server::start(&["--model", m]);
    let b_port: u16 = b.url.rsplit(':').next().unwrap().parse().unwrap();
    let cfg = write_config(tmp.path(), &[&a.url, &b.url], 6);
    let out = tmp.path().join("run");

    // Kill server A after two iterations: the run fails over to B.
    let mut child = train(&["--config", cfg.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_lines(&out, 2, &mut child);
    let st = a.signal(libc::SIGKILL);
    assert!(!st.success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("failures: connect"), "the lost server is reported: {err}");
    // ...and counted in events.jsonl.
    let events = std::fs::read_to_string(out.join("events.jsonl")).unwrap();
    let faults: Vec<serde_json::Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "rollout_faults")
        .collect();
    assert!(!faults.is_empty(), "{events}");
    assert!(faults.iter().all(|e| e["total"]["failures"].as_object().is_some_and(|m| !m.is_empty())), "{events}");
    let ms = metrics(&out);
    assert_eq!(ms.len(), 6);
    for (i, mline) in ms.iter().enumerate() {
        // Weights are pushed every iteration (sync_every = 1), so each
        // rollout comes from the version of its own iteration.
        assert_eq!(mline["rollout_version"], i as u64, "{mline}");
        assert!(mline["entropy"].as_f64().unwrap().is_finite(), "r2vpo serve reports entropies");
        assert!(mline["version_lag_max"].as_u64().unwrap() <= 1, "replay capacity 2: {mline}");
    }
    assert!(ms[5]["updates"].as_u64().unwrap() > 0);
    // Only the newest pushed folder is kept.
    let pushed: Vec<_> = std::fs::read_dir(out.join("weights")).unwrap().flatten().collect();
    assert_eq!(pushed.len(), 1, "{pushed:?}");

    // SIGKILL the learner mid-run, then resume.
    let mut child = train(&["--resume", out.to_str().unwrap(), "--set", "iterations=9"]).spawn().unwrap();
    wait_for_lines(&out, 7, &mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    let st = train(&["--resume", out.to_str().unwrap(), "--set", "iterations=9"]).status().unwrap();
    assert!(st.success());
    assert_eq!(metrics(&out).len(), 9);

    // No server left: the run stops with a clear error and a checkpoint...
    drop(b);
    let o = train(&["--resume", out.to_str().unwrap(), "--set", "iterations=11"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("no rollout server is available"), "{err}");
    let hint = format!("continue with: r2vpo llm train --resume {}", out.display());
    assert!(err.contains(&hint), "the error does not say how to resume: {err}");
    assert_eq!(metrics(&out).len(), 9);
    // ...and continues once a server is back on B's address.
    let _b2 = Server::start_on(b_port, &["--model", m]);
    let o = train(&["--resume", out.to_str().unwrap(), "--set", "iterations=11"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ms = metrics(&out);
    assert_eq!(ms.len(), 11);
    assert_eq!(ms[10]["rollout_version"], 10);
}

#[test]
fn a_server_with_the_wrong_logprob_mode_or_sampling_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), &["http://127.0.0.1:9"], 2);
    // At T ≠ 1 the raw (T = 1) and processed log-probs differ: asking for
    // the sampling distribution from a raw server, or for the T = 1 model
    // from a processed one, would make ρ wrong, so both are refused before
    // anything runs.
    for (mode, behaviour) in [("raw", "sampled"), ("processed", "model")] {
        let r = tmp.path().join(format!("r-{mode}"));
        let o = train(&[
            "--config",
            cfg.to_str().unwrap(),
            "--out",
            r.to_str().unwrap(),
            "--set",
            "sampling.temperature=0.7",
            "--set",
            &format!("rollout.logprobs_mode=\"{mode}\""),
            "--set",
            &format!("behaviour_logprobs=\"{behaviour}\""),
        ])
        .output()
        .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(err.contains("rollout.logprobs_mode") && err.contains("recompute"), "{err}");
        assert!(!r.exists(), "a refused run leaves no folder");
    }
    // With recomputed behaviour log-probs the same sampling is fine (but
    // nothing listens on port 9: a clear error, after a checkpoint).
    let o = train(&[
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        tmp.path().join("r2").to_str().unwrap(),
        "--set",
        "sampling.temperature=0.7",
        "--set",
        "behaviour_logprobs=\"recompute\"",
        "--set",
        "rollout.logprobs_mode=\"processed\"",
        "--set",
        "rollout.retries=1",
    ])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("no rollout server is available"), "{err}");
}

/// `llm train --async` with actor threads over rollout servers: each actor
/// owns one server, pushes every weight version it fetches to it, and the
/// learner consumes every batch once within the staleness bound.
#[test]
fn async_actors_sample_from_their_own_servers_and_push_their_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_dir(&tmp.path().join("init"), 3);
    let m = model.to_str().unwrap();
    let servers = [Server::start(&["--model", m]), Server::start(&["--model", m])];
    let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    let cfg = write_config(tmp.path(), &urls, 5);
    let out = tmp.path().join("run");
    let args = |out: &Path, extra: &[&str]| {
        let mut v: Vec<String> = ["--config", cfg.to_str().unwrap(), "--out", out.to_str().unwrap(), "--async"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(["--set", "actors.count=2", "--set", "actors.max_staleness=1"].map(String::from));
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let a = args(&out, &[]);
    let o = train(&a.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let ms = metrics(&out);
    assert_eq!(ms.len(), 5);
    let mut batches = Vec::new();
    for (i, line) in ms.iter().enumerate() {
        let q = &line["queue"];
        assert_eq!(q["stale_dropped"], 0, "{line}");
        batches.extend(q["batches"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()));
        for pair in q["fresh_lag"].as_array().unwrap() {
            assert!(pair[0].as_u64().unwrap() <= 1, "fresh data lags at most max_staleness: {line}");
        }
        // The samples carry the version their server reported, which is
        // the version the actor pushed: within the bound of this iteration.
        let v = line["rollout_version"].as_u64().unwrap();
        assert!(v <= i as u64 && v + 1 >= i as u64, "iteration {i}: {line}");
    }
    batches.sort_unstable();
    assert_eq!(batches, (0..5).collect::<Vec<u64>>(), "every batch consumed once");
    // Each actor pushed to its own server from a folder of its own (the
    // newest version kept), and each server serves a pushed version.
    for (i, s) in servers.iter().enumerate() {
        let pushed: Vec<_> = std::fs::read_dir(out.join(format!("weights/actor-{i}"))).unwrap().flatten().collect();
        assert_eq!(pushed.len(), 1, "{pushed:?}");
        let h: serde_json::Value = common::client().get(format!("{}/health", s.url)).send().unwrap().json().unwrap();
        let v = h["weight_version"].as_str().map(|v| v.parse::<u64>().unwrap()).or(h["weight_version"].as_u64());
        assert!(v.is_some_and(|v| v >= 1), "server {i} got the actors' pushes: {h}");
    }

    // One URL per actor is required, and pushes must follow every version:
    // both refused before a folder is made.
    let r = tmp.path().join("refused");
    let a = args(&r, &["--set", "actors.count=3"]);
    let o = train(&a.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("rollout.urls") && err.contains("actors.count"), "{err}");
    assert!(!r.exists());
    let a = args(&r, &["--set", "rollout.sync_every=2"]);
    let o = train(&a.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("rollout.sync_every"), "{err}");
    assert!(!r.exists());
}

/// `llm learn` with an `llm actor` process that samples from its own
/// `r2vpo serve` (Redis queue): the actor pushes the versions it fetches to
/// its server from `RUN/rollout-weights/<name>`, and the run finishes.
#[test]
fn an_actor_process_samples_from_its_own_server() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_dir(&tmp.path().join("init"), 3);
    let server = Server::start(&["--model", model.to_str().unwrap()]);
    let redis = redis_server::Redis::start_anywhere(tmp.path());
    let cfg = write_config(tmp.path(), &[&server.url], 4);
    let run = tmp.path().join("run");
    let r2vpo = env!("CARGO_BIN_EXE_r2vpo");
    let mut learner = Command::new(r2vpo)
        .current_dir(root())
        .args(["--threads", "1", "llm", "learn", "--quiet", "--no-export", "--config", cfg.to_str().unwrap()])
        .args(["--out", run.to_str().unwrap(), "--set", "queue.backend=\"redis\""])
        .args(["--set", &format!("queue.url=\"{}\"", redis.url()), "--set", "actors.max_staleness=1"])
        .stderr(std::fs::File::create(tmp.path().join("learner.log")).unwrap())
        .spawn()
        .unwrap();
    let resolved = run.join("config.toml");
    let t0 = Instant::now();
    while !resolved.exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the learner wrote no config.toml");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut actor = Command::new(r2vpo)
        .current_dir(root())
        .args(["--threads", "1", "llm", "actor", "--config", resolved.to_str().unwrap(), "--name", "a0"])
        .stderr(std::fs::File::create(tmp.path().join("actor.log")).unwrap())
        .spawn()
        .unwrap();
    let read = |n: &str| std::fs::read_to_string(tmp.path().join(n)).unwrap_or_default();
    let logs = || format!("learner: {}\nactor: {}", read("learner.log"), read("actor.log"));
    let learned = common::wait_learner_and_actor(&mut learner, &mut actor, Duration::from_secs(600), &logs);
    assert!(learned.success(), "{}", logs());
    let status = actor.wait().unwrap();
    assert!(status.success() && read("actor.log").contains("sampling from http"), "{}", logs());
    assert_eq!(metrics(&run).len(), 4);
    let pushed: Vec<_> = std::fs::read_dir(run.join("rollout-weights/a0")).unwrap().flatten().collect();
    assert_eq!(pushed.len(), 1, "{pushed:?}");
    let h: serde_json::Value = common::client().get(format!("{}/health", server.url)).send().unwrap().json().unwrap();
    let v = h["weight_version"].as_str().map(|v| v.parse::<u64>().unwrap()).or(h["weight_version"].as_u64());
    assert!(v.is_some_and(|v| v >= 1), "the actor pushed to its server: {h}");
}

/// With `[model.lora]` and `rollout.push_adapter`, the learner pushes its
/// adapter as a PEFT folder (kilobytes here, not the model) and `r2vpo
/// serve` folds it into the base it started with: the server then samples
/// with the log-probs of that base with that adapter.
#[test]
fn lora_learners_push_adapters_that_the_server_folds_into_its_base() {
    use r2vpo_llm::model::lora;
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_dir(&tmp.path().join("init"), 3);
    let m = model.to_str().unwrap();
    let s = Server::start(&["--model", m]);
    let cfg = write_config(tmp.path(), &[&s.url], 3);
    let text = std::fs::read_to_string(&cfg).unwrap();
    // The verifier rewards nothing a random model says: the entropy bonus
    // gives the adapters a gradient.
    let text = format!("entropy_coef = 0.05\n{text}\n[model.lora]\nrank = 4\nalpha = 8\n");
    std::fs::write(&cfg, text).unwrap();
    let out = tmp.path().join("run");
    let o = train(&[
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--set",
        "rollout.push_adapter=true",
    ])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ms = metrics(&out);
    assert_eq!(ms.len(), 3);
    for (i, mline) in ms.iter().enumerate() {
        assert_eq!(mline["rollout_version"], i as u64, "{mline}");
    }
    let pushed: Vec<PathBuf> = std::fs::read_dir(out.join("weights")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(pushed.len(), 1, "{pushed:?}");
    let adapter = &pushed[0];
    let bytes = std::fs::metadata(adapter.join(lora::ADAPTER_WEIGHTS)).unwrap().len();
    let full = std::fs::metadata(model.join("model.safetensors")).unwrap().len();
    assert!(!adapter.join("model.safetensors").exists() && bytes * 5 < full, "adapter {bytes} B, model {full} B");

    // What the server samples is the base with the pushed adapter, which
    // two updates moved away from the base (B ≠ 0).
    let (cfg_m, base) = r2vpo_llm::model::source::open(&model).unwrap();
    let (read, files) = lora::open_peft(adapter).unwrap();
    {
        use r2vpo_llm::model::TensorSource;
        let b = files.tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight").unwrap();
        let moved = b.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(moved > 0.0, "the pushed adapter is the initial one");
    }
    let src = lora::MergedSource::new(&cfg_m, base, &read, Box::new(files)).unwrap();
    let merged = r2vpo_llm::backend::candle::Transformer::from_source(
        cfg_m.clone(),
        &src,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let prompt = [1u32, 9690, 198, 2683, 314, 216, 34];
    let (code, v) = common::post(
        &format!("{}/v1/completions", s.url),
        &serde_json::json!({"prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": 4, "n": 2, "logprobs": 0,
                            "return_token_ids": true}),
    );
    assert_eq!(code, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        let ids: Vec<u32> = serde_json::from_value(c["token_ids"].clone()).unwrap();
        let served: Vec<f32> = serde_json::from_value(c["logprobs"]["token_logprobs"].clone()).unwrap();
        let seq: Vec<u32> = prompt.iter().chain(&ids).copied().collect();
        let t = candle_core::Tensor::new(seq.as_slice(), &candle_core::Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let mask = t.ones_like().unwrap();
        let n = seq.len();
        let targets =
            candle_core::Tensor::cat(&[t.narrow(1, 1, n - 1).unwrap(), t.narrow(1, n - 1, 1).unwrap()], 1).unwrap();
        let lp = merged.score_logprobs(&t, &mask, &targets).unwrap().to_vec2::<f32>().unwrap().remove(0);
        for (k, s) in served.iter().enumerate() {
            let want = lp[prompt.len() - 1 + k];
            assert!((s - want).abs() < 5e-4, "token {k}: served {s}, base + adapter {want}");
        }
    }
}
