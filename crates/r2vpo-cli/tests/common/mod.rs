//! Shared by the tests that start real `r2vpo serve` processes: a tiny
//! model folder, and a server handle that stops its process by PID; and the
//! tiny `llm train` config of the run-edge and tracker tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use r2vpo_llm::backend::candle::Transformer;
use r2vpo_llm::model::{Architecture, ModelConfig};
use r2vpo_llm::tokenizer::Tokenizer;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn gguf() -> PathBuf {
    let p = root().join(".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing (run `make deps`)", p.display());
    p
}

/// A tiny `llm train` config in `dir/tiny.toml`: the embedded tokenizer on
/// a random 2-layer model, 2 prompts × 4 samples of at most 6 tokens an
/// iteration, a checkpoint every `checkpoint_every` iterations (0: only
/// when stopped).
pub fn tiny_llm_config(dir: &Path, iterations: usize, checkpoint_every: usize) -> PathBuf {
    let text = format!(
        "iterations = {iterations}\nprompts_per_iter = 2\ngroup_size = 4\nrollout_batch = 8\nminibatch_size = 4\n\
         micro_batch_size = 2\ncheckpoint_every = {checkpoint_every}\n[model]\npath = \"{}\"\n[model.random]\n\
         hidden = 32\nintermediate = 64\nlayers = 2\nheads = 4\nkv_heads = 2\nseed = 3\ninit_std = 1.0\n[data]\n\
         count = 40\n[sampling]\nmax_new_tokens = 6\n",
        gguf().display()
    );
    let p = dir.join("tiny.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// `--set` overrides that turn `configs/llm/gpu-smoke.toml` into a run of
/// the tiny random Qwen3 shape on the torch backend, on CPU in f32 with the
/// embedded tokenizer, sampling at most 8 tokens and checkpointing every
/// iteration; a test adds its batch shape.
pub fn tiny_torch_run() -> Vec<String> {
    vec![
        format!("model.tokenizer={}", gguf().display()),
        "model.backend=torch".into(),
        "model.device=cpu".into(),
        "model.compute_dtype=f32".into(),
        "model.random.shape=configs/shapes/qwen3-tiny.json".into(),
        "sampling.max_new_tokens=8".into(),
        "checkpoint_every=1".into(),
    ]
}

/// The tiny random model `ModelSource::tiny_random` builds (hidden 32, 2
/// layers, std 0.5, Llama layout, tied embeddings) on the embedded
/// tokenizer, so a server and a learner agree on every weight.
pub fn tiny(seed: u64) -> (Transformer, Tokenizer) {
    let tok = Tokenizer::load(&gguf()).unwrap();
    let cfg = ModelConfig::tiny(Architecture::Llama, tok.vocab_size(), 32, 64, 2, 4, 2, true);
    (Transformer::new_random_with_std(cfg, seed, 0.5, DType::F32, &Device::Cpu).unwrap(), tok)
}

/// Writes [`tiny`]`(seed)` as a Hugging Face folder.
pub fn tiny_dir(dir: &Path, seed: u64) -> PathBuf {
    let (m, tok) = tiny(seed);
    r2vpo_llm::backend::Policy::save_hf(&m, dir).unwrap();
    tok.save_hf_files(dir).unwrap();
    dir.to_path_buf()
}

/// A running `r2vpo serve`; killed (SIGKILL) when dropped unless stopped.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Server {
    /// Starts `r2vpo serve --port 0 ARGS` and waits for its address line.
    pub fn start(args: &[&str]) -> Server {
        Self::start_on(0, args)
    }

    /// [`Server::start`] on a given port.
    pub fn start_on(port: u16, args: &[&str]) -> Server {
        Self::start_with(port, args, &[])
    }

    /// [`Server::start_on`] with these environment variables set. In a
    /// binary built with the torch feature every server decodes on the
    /// torch backend, so the server's contract tests run on both backends
    /// (`make test` runs them once each).
    pub fn start_with(port: u16, args: &[&str], env: &[(&str, &str)]) -> Server {
        let port = port.to_string();
        let backend: &[&str] = if cfg!(feature = "torch") { &["--backend", "torch"] } else { &[] };
        let mut child = Command::new(env!("CARGO_BIN_EXE_r2vpo"))
            .current_dir(root())
            .envs(env.iter().copied())
            .args(["--threads", "1", "serve", "--port", &port])
            .args(backend)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(addr) = r2vpo_serve::server::parse_listening_line(&line) {
                    let _ = tx.send(addr);
                }
            }
        });
        let url = rx.recv_timeout(Duration::from_secs(120)).expect("r2vpo serve printed no address");
        Server { child, url }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` and waits (at most 60 s) for the exit status.
    pub fn signal(mut self, signal: i32) -> std::process::ExitStatus {
        unsafe { libc::kill(self.pid(), signal) };
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "server did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

/// POSTs JSON, returns (status, body as JSON).
pub fn post(url: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let r = client().post(url).json(body).send().unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(serde_json::Value::Null))
}

/// Waits for an `llm learn` process and its `llm actor` to finish, and
/// returns the learner's exit status once the actor has stopped too. A
/// learner waits for its actors' batches by design, so an actor that fails
/// would leave it waiting for ever and the test hanging: the test fails at
/// once with both logs (`logs`) instead, as it does when the pair takes
/// longer than `limit` or the actor outlives the learner by a minute.
pub fn wait_learner_and_actor(
    learner: &mut Child,
    actor: &mut Child,
    limit: Duration,
    logs: &dyn Fn() -> String,
) -> std::process::ExitStatus {
    let t0 = Instant::now();
    let stop = |why: &str, learner: &mut Child, actor: &mut Child| -> ! {
        let _ = learner.kill();
        let _ = actor.kill();
        let _ = learner.wait();
        let _ = actor.wait();
        panic!("{why}\n{}", logs());
    };
    let learned = loop {
        if let Some(s) = learner.try_wait().unwrap() {
            break s;
        }
        if let Some(s) = actor.try_wait().unwrap() {
            if !s.success() {
                stop(&format!("the actor failed ({s}) while the learner waited for it"), learner, actor);
            }
        }
        if t0.elapsed() > limit {
            stop(&format!("the learner and its actor took longer than {limit:?}"), learner, actor);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let t1 = Instant::now();
    while actor.try_wait().unwrap().is_none() {
        if t1.elapsed() > Duration::from_secs(60) {
            stop("the actor did not stop when the run ended", learner, actor);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    learned
}
