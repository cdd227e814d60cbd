//! The HTTP rollout source of `llm train`: OpenAI-style completion servers
//! (`r2vpo serve`, vLLM, SGLang, llama.cpp) behind
//! [`r2vpo_llm::rollout::RolloutSource`].
//!
//! One group (a prompt and G samples) is one `POST /v1/completions` with
//! the prompt as token ids, `n = G`, `logprobs = 0`,
//! `return_tokens_as_token_ids` and `return_token_ids` set. Groups are
//! spread over the servers, `max_in_flight` at a time per server; a failed
//! request (connection refused, timeout, 5xx, an answer that breaks the
//! contract) is retried with exponential back-off on the next live server,
//! and a server that fails `max_failures` times in a row is left out until
//! the next rollout. Only when no server is left does the rollout fail.
//!
//! What the client relies on in an answer: `choices[i].token_ids` (vLLM's
//! `return_token_ids`) or else `logprobs.tokens` as `token_id:N` (vLLM's
//! `return_tokens_as_token_ids`); `logprobs.token_logprobs`, one finite
//! number ≤ 0 per token; `finish_reason`; and, when present,
//! `weight_version` (`r2vpo serve`; SGLang's `metadata.weight_version`),
//! `logprobs_mode` (`r2vpo serve`) and `entropies` (`r2vpo serve`). Without
//! a stated version a sample is attributed to the last version pushed to
//! that server.
//!
//! Weights are written once per push as a Hugging Face folder
//! (`weights_dir/vNNNNNN`, renamed into place so a server never reads half
//! a folder), then announced per `rollout.weight_push` by the engine's
//! `WeightLoader` (the one part of the contract where engines differ): SGLang's
//! `POST /update_weights_from_disk {model_path, weight_version}` (also
//! `r2vpo serve`'s), vLLM's development-mode
//! `POST /collective_rpc {"method": "reload_weights", …}` followed by
//! `POST /reset_prefix_cache`, or nothing. A server that missed a push is
//! brought up to date before it is used again. Only the newest folder is
//! kept.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use candle_core::DType;
use r2vpo_llm::backend::Policy;
use r2vpo_llm::model::save::HfLayout;
use r2vpo_llm::rollout::{
    GroupRequest, GroupRollout, LogprobsMode, RolloutCounters, RolloutError, RolloutSource, WeightSnapshot,
};
use r2vpo_llm::sample::{FinishReason, Generation, SamplingConfig};
use r2vpo_llm::tokenizer::Tokenizer;
use r2vpo_llm::train::{PushDtype, RolloutConfig, WeightPush, VLLM_ADAPTER_NAME};

use crate::server::mode_name;

/// A server as the client sees it.
#[derive(Debug, Default)]
struct Server {
    url: String,
    /// Consecutive failures.
    failures: usize,
    /// The weight version it last acknowledged.
    pushed: Option<u64>,
    /// The model name its requests ask for, once a push changed it (a vLLM
    /// server serves a pushed adapter under its own name).
    model: Option<String>,
}

/// The HTTP [`RolloutSource`].
pub struct HttpRollout {
    cfg: RolloutConfig,
    client: reqwest::blocking::Client,
    weights_dir: PathBuf,
    servers: Vec<Mutex<Server>>,
    /// The newest pushed version, its folder, and whether that folder is
    /// an adapter.
    current: Option<(u64, PathBuf, bool)>,
    counters: Mutex<RolloutCounters>,
    /// How the servers take new weights (`rollout.weight_push`); `None`
    /// for servers that keep their weights.
    loader: Option<Box<dyn WeightLoader>>,
}

/// Sends one JSON `POST` to a server, with the client's key, time-outs and
/// failure classes.
type Post<'a> = &'a dyn Fn(&str, &serde_json::Value) -> Result<String, Failure>;

/// The part of the rollout contract where engines differ: telling a server
/// to serve the weights the learner wrote to a folder. Completions, log-probs
/// and failures are the same for every engine; one implementation per
/// engine's weight-update endpoint.
trait WeightLoader: Send + Sync {
    /// Makes the server at `url` serve the Hugging Face folder (or, with
    /// `adapter`, the PEFT adapter folder) `dir` as weight version
    /// `version`, or fails without changing what it serves. Returns the
    /// model name requests must then ask for, where it changes.
    fn load(
        &self,
        http: &Http<'_>,
        url: &str,
        dir: &str,
        version: u64,
        adapter: bool,
    ) -> Result<Option<String>, Failure>;

    /// How a full push is written for this engine: as the model is (tied
    /// stays tied), unless the engine needs otherwise.
    fn layout(&self, dtype: PushDtype) -> HfLayout {
        HfLayout { dtype: push_dtype(dtype), untie: false }
    }
}

/// The client's `POST` and `GET`, as a loader uses them.
struct Http<'a> {
    post: Post<'a>,
    get: &'a dyn Fn(&str) -> Result<String, Failure>,
}

fn push_dtype(d: PushDtype) -> DType {
    match d {
        PushDtype::F32 => DType::F32,
        PushDtype::Bf16 => DType::BF16,
    }
}

/// SGLang's `POST /update_weights_from_disk {model_path, weight_version}`,
/// which `r2vpo serve` implements too.
struct UpdateWeightsFromDisk;

impl WeightLoader for UpdateWeightsFromDisk {
    fn load(
        &self,
        http: &Http<'_>,
        url: &str,
        dir: &str,
        version: u64,
        _adapter: bool,
    ) -> Result<Option<String>, Failure> {
        let body = serde_json::json!({"model_path": dir, "weight_version": version.to_string()});
        let text = (http.post)(&format!("{url}/update_weights_from_disk"), &body)?;
        let ok: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Failure::new("protocol", format!("{url}: weight update answer is not JSON: {e}")))?;
        if ok.get("success").and_then(|v| v.as_bool()) == Some(false) {
            return Err(Failure::new("push", format!("{url}: weight update refused: {}", snippet(&text))));
        }
        // Where the server says which version it now serves (`r2vpo serve`
        // does; SGLang's answer may not), it must be this one: samples are
        // attributed to the version their server reports.
        let acked = ok.get("weight_version").map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string));
        match acked {
            Some(v) if v != version.to_string() => {
                Err(Failure::new("push", format!("{url}: pushed weight version {version}, the server reports {v}")))
            }
            _ => Ok(None),
        }
    }
}

/// vLLM's development-mode reload (`VLLM_SERVER_DEV_MODE=1`): the workers
/// re-read the checkpoint folder in place, then the prefix cache, computed
/// by the old weights, is dropped. vLLM does not take a version: samples
/// are attributed to the version last pushed.
///
/// Full pushes are written untied ([`HfLayout::untie`]): vLLM never reloads
/// a tied output head, so a tied push would leave the served `lm_head` at
/// the start weights and bias every ratio without a word. For the same
/// reason a server that was started from a tied folder cannot take pushes
/// at all (its head is the embedding's, and stays stale): where the folder
/// it serves is readable here, it is checked and refused with the remedy.
///
/// Adapter pushes (`rollout.push_adapter`) go to `POST /v1/load_lora_adapter`
/// with `load_inplace`, under [`VLLM_ADAPTER_NAME`], which requests then
/// ask for.
struct VllmReload;

impl VllmReload {
    /// Refuses a server whose served folder (`/v1/models`' `root`) is a
    /// tied model, where that folder is readable from here.
    fn check_untied(http: &Http<'_>, url: &str) -> Result<(), Failure> {
        let text = (http.get)(&format!("{url}/v1/models"))?;
        let models: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Failure::new("protocol", format!("{url}/v1/models: not JSON: {e}")))?;
        let Some(root) = models.pointer("/data/0/root").and_then(|r| r.as_str()) else { return Ok(()) };
        let Ok(cfg) = std::fs::read_to_string(Path::new(root).join("config.json")) else { return Ok(()) };
        let Ok(cfg) = serde_json::from_str::<serde_json::Value>(&cfg) else { return Ok(()) };
        let tied = |v: &serde_json::Value| v.get("tie_word_embeddings").and_then(|t| t.as_bool()) == Some(true);
        if tied(&cfg) || cfg.get("text_config").is_some_and(tied) {
            return Err(Failure {
                kind: "push",
                message: format!(
                    "{url} serves {root}, a model with tied word embeddings: vLLM's reload_weights never \
                     refreshes a tied output head, so after a push it would keep sampling from the start \
                     weights' head and every ratio would be biased. Serve an untied copy instead \
                     (`r2vpo llm export --untied --model {root} --out DIR`; scripts/vllm/serve.py serves an \
                     untied copy of a tied folder by itself)"
                ),
                fatal: true,
            });
        }
        Ok(())
    }
}

impl WeightLoader for VllmReload {
    fn load(
        &self,
        http: &Http<'_>,
        url: &str,
        dir: &str,
        _version: u64,
        adapter: bool,
    ) -> Result<Option<String>, Failure> {
        let model = if adapter {
            let body = serde_json::json!({
                "lora_name": VLLM_ADAPTER_NAME,
                "lora_path": dir,
                "load_inplace": true,
            });
            (http.post)(&format!("{url}/v1/load_lora_adapter"), &body)?;
            Some(VLLM_ADAPTER_NAME.to_string())
        } else {
            Self::check_untied(http, url)?;
            let body = serde_json::json!({
                "method": "reload_weights",
                "kwargs": {"weights_path": dir, "is_checkpoint_format": true},
            });
            (http.post)(&format!("{url}/collective_rpc"), &body)?;
            None
        };
        (http.post)(&format!("{url}/reset_prefix_cache"), &serde_json::json!({}))?;
        Ok(model)
    }

    fn layout(&self, dtype: PushDtype) -> HfLayout {
        HfLayout { dtype: push_dtype(dtype), untie: true }
    }
}

/// Why one request failed (the key of [`RolloutCounters::failures`]).
#[derive(Debug)]
struct Failure {
    kind: &'static str,
    message: String,
    /// A contract violation that retrying cannot fix (e.g. the wrong
    /// log-prob mode): the rollout stops at once.
    fatal: bool,
}

impl Failure {
    fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Failure { kind, message: message.into(), fatal: false }
    }
}

/// The lenient view of an answer (extra fields of vLLM/SGLang ignored).
#[derive(Deserialize)]
struct Answer {
    choices: Vec<AnswerChoice>,
    #[serde(default)]
    weight_version: Option<serde_json::Value>,
    /// SGLang puts it here.
    #[serde(default)]
    metadata: Option<serde_json::Value>,
    #[serde(default)]
    logprobs_mode: Option<String>,
}

#[derive(Deserialize)]
struct AnswerChoice {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    logprobs: Option<AnswerLogprobs>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    entropies: Option<Vec<f32>>,
}

#[derive(Deserialize)]
struct AnswerLogprobs {
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default)]
    token_logprobs: Vec<Option<f64>>,
}

impl HttpRollout {
    /// A client of `cfg.urls` that writes pushed weights under
    /// `weights_dir`.
    pub fn new(cfg: &RolloutConfig, weights_dir: &Path) -> Result<Self, RolloutError> {
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs_f64(cfg.connect_timeout_s))
            .timeout(Duration::from_secs_f64(cfg.timeout_s))
            .pool_max_idle_per_host(cfg.max_in_flight)
            .build()
            .map_err(|e| RolloutError::Unavailable(format!("building the HTTP client: {e}")))?;
        Ok(HttpRollout {
            cfg: cfg.clone(),
            client,
            weights_dir: weights_dir.to_path_buf(),
            servers: cfg
                .urls
                .iter()
                .map(|u| Mutex::new(Server { url: u.trim_end_matches('/').to_string(), ..Server::default() }))
                .collect(),
            current: None,
            counters: Mutex::new(RolloutCounters::default()),
            loader: match cfg.weight_push {
                WeightPush::UpdateWeightsFromDisk => Some(Box::new(UpdateWeightsFromDisk)),
                WeightPush::VllmReload => Some(Box::new(VllmReload)),
                WeightPush::None => None,
            },
        })
    }

    /// Counts a failure; the trainer reports it (warning and
    /// `events.jsonl`), so nothing is printed here.
    fn count_failure(&self, f: &Failure) {
        let mut c = self.counters.lock().expect("counters");
        *c.failures.entry(f.kind.to_string()).or_default() += 1;
        c.last_failure = Some(f.message.clone());
    }

    fn post(&self, url: &str, body: &serde_json::Value) -> Result<String, Failure> {
        self.send(url, self.client.post(url).json(body))
    }

    fn get(&self, url: &str) -> Result<String, Failure> {
        self.send(url, self.client.get(url))
    }

    fn send(&self, url: &str, mut req: reqwest::blocking::RequestBuilder) -> Result<String, Failure> {
        if let Some(k) = &self.cfg.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().map_err(|e| {
            let kind = if e.is_timeout() {
                "timeout"
            } else if e.is_connect() {
                "connect"
            } else {
                "transport"
            };
            Failure::new(kind, format!("{url}: {e}"))
        })?;
        let status = resp.status();
        let text = resp.text().map_err(|e| Failure::new("transport", format!("{url}: reading the answer: {e}")))?;
        if status.is_server_error() {
            // vLLM's API server outlives its engine only to answer this,
            // then shuts down: name the cause, the body does not.
            let dead = if text.contains("EngineDeadError") || text.contains("EngineCore encountered an issue") {
                "vLLM's engine died (its log has the cause; restart the server): "
            } else {
                ""
            };
            return Err(Failure::new("http_5xx", format!("{url}: {dead}HTTP {status}: {}", snippet(&text))));
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            // The server's queue is full (`r2vpo serve` answers 429 past
            // --max-waiting, as vLLM and SGLang do under load): busy, not
            // wrong, so retried with back-off like a 5xx.
            return Err(Failure::new("http_429", format!("{url}: HTTP {status}: {}", snippet(&text))));
        }
        if !status.is_success() {
            // A 4xx says this request is wrong; another server would say
            // the same.
            return Err(Failure {
                kind: "http_4xx",
                message: format!("{url}: HTTP {status}: {}", snippet(&text)),
                fatal: true,
            });
        }
        Ok(text)
    }

    /// Pushes the current folder to `server` if it lags.
    fn catch_up(&self, server: &Mutex<Server>) -> Result<(), Failure> {
        let Some((version, dir, adapter)) = &self.current else { return Ok(()) };
        let url = {
            let s = server.lock().expect("server");
            if s.pushed == Some(*version) {
                return Ok(());
            }
            s.url.clone()
        };
        let mut model = None;
        if let Some(loader) = &self.loader {
            let http = Http { post: &|u, body| self.post(u, body), get: &|u| self.get(u) };
            model = loader.load(&http, &url, &dir.to_string_lossy(), *version, *adapter)?;
        }
        let mut s = server.lock().expect("server");
        s.pushed = Some(*version);
        if model.is_some() {
            s.model = model;
        }
        Ok(())
    }

    fn request_body(&self, g: &GroupRequest, sampling: &SamplingConfig, model: &str) -> serde_json::Value {
        let mut body = serde_json::json!({
            "model": model,
            "prompt": g.prompt_ids,
            "n": g.n(),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": if sampling.top_k > 0 { sampling.top_k } else { -1 },
            "seed": wire_seed(g.seeds.first().copied().unwrap_or(0)),
            "logprobs": 0,
            "return_tokens_as_token_ids": true,
            "return_token_ids": true,
        });
        if !sampling.stop_token_ids.is_empty() {
            body["stop_token_ids"] = serde_json::json!(sampling.stop_token_ids);
        }
        body
    }

    /// One group on one server: the request and the contract checks.
    fn one(
        &self,
        server: &Mutex<Server>,
        g: &GroupRequest,
        sampling: &SamplingConfig,
        tok: &Tokenizer,
    ) -> Result<GroupRollout, Failure> {
        self.catch_up(server)?;
        let (url, pushed, model) = {
            let s = server.lock().expect("server");
            (s.url.clone(), s.pushed, s.model.clone().unwrap_or_else(|| self.cfg.model.clone()))
        };
        self.counters.lock().expect("counters").requests += 1;
        let text = self.post(&format!("{url}/v1/completions"), &self.request_body(g, sampling, &model))?;
        let protocol = |m: String| Failure::new("protocol", format!("{url}: {m}"));
        let answer: Answer =
            serde_json::from_str(&text).map_err(|e| protocol(format!("answer is not a completion: {e}")))?;
        if let Some(mode) = &answer.logprobs_mode {
            let want = mode_name(self.cfg.logprobs_mode);
            if mode != want {
                return Err(Failure {
                    kind: "protocol",
                    message: format!(
                        "{url}: serves {mode} but rollout.logprobs_mode is `{want}`: restart the server with \
                         --logprobs-mode {want} or change rollout.logprobs_mode"
                    ),
                    fatal: true,
                });
            }
        }
        let stated = answer
            .weight_version
            .clone()
            .or_else(|| answer.metadata.as_ref().and_then(|m| m.get("weight_version").cloned()));
        let version = match &stated {
            Some(serde_json::Value::String(s)) => {
                s.parse::<u64>().map_err(|_| protocol(format!("weight_version `{s}` is not a learner version")))?
            }
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().ok_or_else(|| protocol(format!("weight_version {n} is not a learner version")))?
            }
            _ => pushed.unwrap_or(0),
        };
        if answer.choices.len() != g.n() {
            return Err(protocol(format!("{} choices for n = {}", answer.choices.len(), g.n())));
        }
        let mut choices = answer.choices;
        if choices.iter().all(|c| c.index.is_some()) {
            choices.sort_by_key(|c| c.index);
        }
        let vocab = tok.vocab_size();
        let mut generations = Vec::with_capacity(choices.len());
        for (i, c) in choices.into_iter().enumerate() {
            let lp = c.logprobs.ok_or_else(|| protocol(format!("choice {i} has no logprobs")))?;
            let ids = match c.token_ids {
                Some(ids) => ids,
                None => lp
                    .tokens
                    .iter()
                    .map(|t| t.strip_prefix("token_id:").and_then(|n| n.parse().ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| protocol(format!("choice {i} has neither token_ids nor token_id:N tokens")))?,
            };
            if ids.is_empty() {
                return Err(protocol(format!("choice {i} has no tokens")));
            }
            if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(protocol(format!("choice {i}: token id {t} is outside the vocabulary of {vocab}")));
            }
            if lp.token_logprobs.len() != ids.len() {
                return Err(protocol(format!(
                    "choice {i}: {} log-probs for {} tokens",
                    lp.token_logprobs.len(),
                    ids.len()
                )));
            }
            let logprobs: Vec<f32> = lp
                .token_logprobs
                .iter()
                .map(|x| x.filter(|v| v.is_finite() && *v <= 1e-6).map(|v| v as f32))
                .collect::<Option<_>>()
                .ok_or_else(|| protocol(format!("choice {i}: a log-prob is missing, non-finite or positive")))?;
            let finish_reason = match c.finish_reason.as_deref() {
                Some("length") => FinishReason::Length,
                Some("stop") | Some("eos") => {
                    if ids.last() == Some(&tok.eos_token_id()) {
                        FinishReason::Eos
                    } else {
                        FinishReason::Stop
                    }
                }
                other => return Err(protocol(format!("choice {i}: finish_reason {other:?}"))),
            };
            let body = match finish_reason {
                FinishReason::Length => &ids[..],
                _ => &ids[..ids.len() - 1],
            };
            let text = tok.decode(body, true).map_err(|e| protocol(format!("choice {i}: {e}")))?;
            let entropy = c.entropies.filter(|e| e.len() == ids.len()).unwrap_or_default();
            generations.push(Generation {
                prompt_len: g.prompt_ids.len(),
                token_ids: ids,
                text,
                finish_reason,
                logprobs: logprobs.clone(),
                model_logprobs: logprobs,
                entropy,
            });
        }
        Ok(GroupRollout { generations, weight_version: version })
    }
}

/// A sample seed as servers take it: the low 63 bits. Seeds are derived
/// over all of `u64`, but vLLM validates `seed` as a signed 64-bit integer
/// and answers 400 above 2^63 − 1 (so about every second group would fail),
/// and JSON readers that parse into `i64` agree with it. Dropping the top
/// bit keeps the request deterministic per group.
pub fn wire_seed(seed: u64) -> u64 {
    seed & (i64::MAX as u64)
}

fn snippet(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_string(),
    }
}

impl RolloutSource for HttpRollout {
    fn describe(&self) -> String {
        format!("http {}", self.cfg.urls.join(","))
    }

    fn logprobs_mode(&self) -> LogprobsMode {
        self.cfg.logprobs_mode
    }

    fn generate(
        &mut self,
        _policy: &dyn Policy,
        tok: &Tokenizer,
        groups: &[GroupRequest],
        sampling: &SamplingConfig,
    ) -> Result<Vec<GroupRollout>, RolloutError> {
        // Every rollout gives every server a fresh chance.
        for s in &self.servers {
            s.lock().expect("server").failures = 0;
        }
        let next = AtomicUsize::new(0);
        let rr = AtomicUsize::new(0);
        let abort = AtomicBool::new(false);
        let results: Vec<Mutex<Option<GroupRollout>>> = groups.iter().map(|_| Mutex::new(None)).collect();
        let fatal: Mutex<Option<String>> = Mutex::new(None);
        let this = &*self;
        let workers = (this.servers.len() * this.cfg.max_in_flight).min(groups.len()).max(1);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    while !abort.load(Ordering::SeqCst) {
                        let k = next.fetch_add(1, Ordering::SeqCst);
                        let Some(g) = groups.get(k) else { break };
                        let mut tries = 0usize;
                        let mut backoff = this.cfg.backoff_s;
                        let mut last_failed: Option<usize> = None;
                        loop {
                            // The next live server, round robin, not the
                            // one that just failed while another is live.
                            let mut live: Vec<usize> = (0..this.servers.len())
                                .filter(|&i| this.servers[i].lock().expect("server").failures < this.cfg.max_failures)
                                .collect();
                            if live.len() > 1 {
                                live.retain(|&i| Some(i) != last_failed);
                            }
                            if live.is_empty() {
                                *fatal.lock().expect("fatal") = Some(format!(
                                    "every server failed {} times in a row ({})",
                                    this.cfg.max_failures,
                                    this.cfg.urls.join(", ")
                                ));
                                abort.store(true, Ordering::SeqCst);
                                return;
                            }
                            let pick = live[rr.fetch_add(1, Ordering::SeqCst) % live.len()];
                            let server = &this.servers[pick];
                            match this.one(server, g, sampling, tok) {
                                Ok(r) => {
                                    server.lock().expect("server").failures = 0;
                                    *results[k].lock().expect("result") = Some(r);
                                    break;
                                }
                                Err(f) => {
                                    this.count_failure(&f);
                                    if f.fatal || tries >= this.cfg.retries {
                                        *fatal.lock().expect("fatal") = Some(if f.fatal {
                                            f.message
                                        } else {
                                            format!("{} tries failed; last: {}", tries + 1, f.message)
                                        });
                                        abort.store(true, Ordering::SeqCst);
                                        return;
                                    }
                                    server.lock().expect("server").failures += 1;
                                    last_failed = Some(pick);
                                    tries += 1;
                                    this.counters.lock().expect("counters").retries += 1;
                                    std::thread::sleep(Duration::from_secs_f64(backoff));
                                    backoff *= 2.0;
                                }
                            }
                        }
                    }
                });
            }
        });
        if let Some(why) = fatal.into_inner().expect("fatal") {
            return Err(RolloutError::Unavailable(why));
        }
        results
            .into_iter()
            .map(|r| {
                r.into_inner().expect("result").ok_or_else(|| RolloutError::Unavailable("a group got no answer".into()))
            })
            .collect()
    }

    fn sync_weights(&mut self, snapshot: &WeightSnapshot<'_>, tok: &Tokenizer) -> Result<(), RolloutError> {
        let version = snapshot.version();
        if self.loader.is_none() {
            return Ok(());
        }
        let t0 = Instant::now();
        let io = |path: &Path, source: std::io::Error| RolloutError::Io { path: path.to_path_buf(), source };
        std::fs::create_dir_all(&self.weights_dir).map_err(|e| io(&self.weights_dir, e))?;
        let dir = self.weights_dir.join(format!("v{version:06}"));
        let tmp = self.weights_dir.join(format!(".v{version:06}.tmp"));
        for d in [&tmp, &dir] {
            if d.exists() {
                std::fs::remove_dir_all(d).map_err(|e| io(d, e))?;
            }
        }
        let adapter = if self.cfg.push_adapter { snapshot.adapter() } else { Ok(None) };
        let layout = self.loader.as_ref().map_or_else(HfLayout::default, |l| l.layout(self.cfg.push_dtype));
        let is_adapter = match adapter.map_err(|e| RolloutError::Push(e.to_string()))? {
            // `r2vpo serve` folds a PEFT folder into its base; vLLM loads it
            // as a LoRA adapter. Adapters stay f32: megabytes either way.
            Some((lora, tensors)) => {
                r2vpo_llm::model::lora::save_peft(&tmp, lora, None, &tensors)
                    .map_err(|e| RolloutError::Push(e.to_string()))?;
                true
            }
            None => {
                snapshot
                    .weights()
                    .and_then(|w| w.save_hf_dir_as(snapshot.config(), &tmp, layout))
                    .map_err(|e| RolloutError::Push(e.to_string()))?;
                tok.save_hf_files(&tmp).map_err(|e| RolloutError::Push(e.to_string()))?;
                false
            }
        };
        let bytes: u64 = std::fs::read_dir(&tmp)
            .map(|it| it.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        std::fs::rename(&tmp, &dir).map_err(|e| io(&dir, e))?;
        let dir = std::fs::canonicalize(&dir).map_err(|e| io(&dir, e))?;
        self.current = Some((version, dir.clone(), is_adapter));
        let mut errors = Vec::new();
        for s in &self.servers {
            if let Err(f) = self.catch_up(s) {
                self.count_failure(&f);
                errors.push(f.message);
            }
        }
        if errors.len() == self.servers.len() {
            return Err(RolloutError::Unavailable(format!(
                "no server took weight version {version}: {}",
                errors.join("; ")
            )));
        }
        // Older folders are no longer needed: a lagging server is sent the
        // newest one.
        if let Ok(entries) = std::fs::read_dir(&self.weights_dir) {
            for e in entries.flatten() {
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('v') && p != dir {
                    let _ = std::fs::remove_dir_all(&p);
                }
            }
        }
        let mut c = self.counters.lock().expect("counters");
        c.pushes += 1;
        c.push_s += t0.elapsed().as_secs_f64();
        c.push_bytes += bytes;
        Ok(())
    }

    fn counters(&self) -> RolloutCounters {
        self.counters.lock().expect("counters").clone()
    }
}
