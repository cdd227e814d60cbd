//! `r2vpo serve`: an OpenAI-compatible server over the continuous-batching
//! [`Engine`], with SGLang's weight-update endpoints.
//!
//! Routes: `POST /v1/completions` and `POST /v1/chat/completions` (both
//! with per-token log-probs, up to 20 alternatives per token, and
//! `stream`), `GET /v1/models`, `POST /tokenize`, `POST /detokenize`,
//! `GET /metrics` (Prometheus), `GET /health`, `GET /get_weight_version`,
//! `POST /update_weights_from_disk`, `POST /pause_generation`,
//! `POST /continue_generation`. With an API key, every route wants
//! `Authorization: Bearer KEY`.
//!
//! Bad input is answered with a 4xx and OpenAI's error body naming the
//! field; nothing a client sends can stop the server. SIGINT/SIGTERM stop
//! accepting connections, let in-flight requests finish, and exit 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use serde::de::DeserializeOwned;
use tokio::sync::{oneshot, Mutex};

use r2vpo_llm::backend::open::BackendSpec;
use r2vpo_llm::backend::{BackendKind, ComputeDtype};
use r2vpo_llm::chat::{ChatMessage, ChatTemplate};
use r2vpo_llm::engine::{DecodeModel, Engine, EngineConfig, EngineError, Job, JobOutput, StopWhen, MAX_TOP_LOGPROBS};
use r2vpo_llm::model::lora;
use r2vpo_llm::model::source::{self, check};
use r2vpo_llm::model::{ModelConfig, ModelError, TensorSource};
use r2vpo_llm::rollout::LogprobsMode;
use r2vpo_llm::sample::{request_seed, FinishReason, Generation, SampleError, SamplingConfig};
use r2vpo_llm::tokenizer::Tokenizer;

use crate::metrics::Metrics;
use crate::protocol::{
    AssistantMessage, ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs, ChatMessageIn,
    ChatTemplateKwargs, ChatTokenLogprob, Choice, CompletionRequest, CompletionResponse, DetokenizeRequest,
    DetokenizeResponse, ErrorBody, ErrorDetail, Logprobs, Prompt, Stop, TokenizeRequest, TokenizeResponse, TopLogprob,
    UpdateWeightsRequest, UpdateWeightsResponse, Usage,
};
use crate::stream::{self, token_bytes};

/// Everything `r2vpo serve` needs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// A GGUF file or Hugging Face folder.
    pub model: PathBuf,
    /// Tokenizer source (default: `model`).
    pub tokenizer: Option<PathBuf>,
    /// Interface to bind (loopback by default).
    pub host: String,
    /// Port; 0 picks a free one (the address is printed).
    pub port: u16,
    /// Bearer token required on every route.
    pub api_key: Option<String>,
    /// Name reported by `/v1/models` and in answers.
    pub served_model_name: String,
    /// Sequences decoded together.
    pub max_batch: usize,
    /// Jobs (prompts) waiting for admission before answering 429.
    pub max_waiting: usize,
    /// Prompt tokens prefilled per decode step (longer prompts are
    /// prefilled in chunks between decode steps of the running rows).
    pub prefill_chunk: usize,
    /// Prompts in one request.
    pub max_prompts: usize,
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// What `token_logprobs` mean: raw (T = 1, untruncated) or processed.
    pub logprobs_mode: LogprobsMode,
    /// The version of the initial weights.
    pub weight_version: String,
    /// Return raw log-probs from one full-sequence scoring pass per request
    /// (the learner's computation) instead of those recorded while
    /// decoding ([`r2vpo_llm::engine::Job::rescore`]).
    pub rescore_logprobs: bool,
    /// The compute backend that decodes: `candle` (the CPU) or `torch`
    /// (libtorch, on the CPU or a CUDA GPU; a binary built with the torch
    /// feature).
    pub backend: String,
    /// Where the torch backend decodes: `cpu`, `cuda` or `cuda:N` (candle
    /// serves on the CPU).
    pub device: String,
    /// The dtype of the served weights: `f32`, or `bf16` (on the candle
    /// backend the weight matrices are held in bf16 and the activations,
    /// KV cache, logits and log-probs are f32; on the torch backend the
    /// forward computes in bf16 and logits and log-probs are f32).
    pub dtype: String,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            model: PathBuf::from(r2vpo_llm::train::config::EMBEDDED_MODEL),
            tokenizer: None,
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            served_model_name: "r2vpo".into(),
            max_batch: 64,
            max_waiting: 1024,
            prefill_chunk: 512,
            max_prompts: 256,
            max_body_bytes: 8 << 20,
            logprobs_mode: LogprobsMode::Raw,
            weight_version: "0".into(),
            rescore_logprobs: false,
            backend: "candle".into(),
            device: "cpu".into(),
            dtype: "f32".into(),
        }
    }
}

/// Errors that keep the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The model or tokenizer did not load.
    #[error("loading {path}: {message}")]
    Load {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A setting is invalid.
    #[error("serve: `{field}`: {message}")]
    Config {
        /// The option.
        field: String,
        /// Why.
        message: String,
    },
    /// Binding or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

struct AppState {
    engine: Engine,
    tok: Arc<Tokenizer>,
    cfg: ServeConfig,
    /// The tokenizer's chat template (`None`: the model has none, and the
    /// chat route answers 400).
    chat: Option<ChatTemplate>,
    metrics: Arc<Metrics>,
    /// One weight update at a time.
    updating: Mutex<()>,
}

/// `logprobs_mode` as vLLM spells it.
pub fn mode_name(m: LogprobsMode) -> &'static str {
    match m {
        LogprobsMode::Raw => "raw_logprobs",
        LogprobsMode::Processed => "processed_logprobs",
        LogprobsMode::Both => "both",
    }
}

/// A 4xx/5xx answer with OpenAI's error body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<String>,
}

impl ApiError {
    fn bad(param: Option<&str>, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: param.map(str::to_string) }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        // A message's first line only: candle's errors append a backtrace
        // under RUST_BACKTRACE, which is the server's business, not the
        // client's.
        let message = self.message.lines().next().unwrap_or_default().to_string();
        let body = ErrorBody {
            error: ErrorDetail { message, kind: kind.into(), param: self.param, code: self.status.as_u16() },
        };
        (self.status, Json(body)).into_response()
    }
}

fn parse<T: DeserializeOwned>(body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| ApiError { status: e.status(), message: e.body_text(), param: None })?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let message = match &param {
            Some(p) => format!("field `{p}`: {}", e.inner()),
            None => format!("invalid JSON body: {}", e.inner()),
        };
        ApiError { status: StatusCode::BAD_REQUEST, message, param }
    })
}

impl ServeConfig {
    /// The backend `--backend`, `--device` and `--dtype` describe; the
    /// error names the option at fault.
    pub fn backend_spec(&self) -> Result<BackendSpec, ServeError> {
        let bad = |field: &str, message: String| ServeError::Config { field: field.into(), message };
        let kind: BackendKind = self.backend.parse().map_err(|m| bad("backend", m))?;
        let compute_dtype: ComputeDtype = self.dtype.parse().map_err(|m| bad("dtype", m))?;
        if kind == BackendKind::Candle && self.device != "cpu" {
            return Err(bad(
                "device",
                format!("`{}`: the candle backend serves on the CPU; --backend torch serves on a GPU", self.device),
            ));
        }
        Ok(BackendSpec { kind, device: self.device.clone(), compute_dtype, checkpointing: false, lora: None })
    }
}

/// The model of `config` with the weights of `source`, on the backend
/// `cfg` names; the error names the option at fault.
fn on_backend(cfg: &ServeConfig, config: &ModelConfig, source: &dyn TensorSource) -> Result<DecodeModel, ServeError> {
    let spec = cfg.backend_spec()?;
    match r2vpo_llm::backend::open::open_inference(&spec, config, source) {
        Ok(m) => Ok(m),
        Err(ModelError::Spec { field, message }) => Err(ServeError::Config { field, message }),
        Err(e) => Err(ServeError::Load { path: cfg.model.clone(), message: e.to_string() }),
    }
}

fn load_tokenizer(cfg: &ServeConfig) -> Result<Tokenizer, ServeError> {
    let path = cfg.tokenizer.clone().unwrap_or_else(|| cfg.model.clone());
    Tokenizer::load(&path).map_err(|e| ServeError::Load { path, message: e.to_string() })
}

/// Loads the model, binds, prints `r2vpo serve: listening on http://ADDR`
/// and serves until SIGINT/SIGTERM. Returns once in-flight requests are
/// answered.
pub fn serve(cfg: ServeConfig) -> Result<(), ServeError> {
    if cfg.max_batch == 0 || cfg.max_prompts == 0 || cfg.max_waiting == 0 || cfg.prefill_chunk == 0 {
        return Err(ServeError::Config {
            field: "max-batch/max-prompts/max-waiting/prefill-chunk".into(),
            message: "must be at least 1".into(),
        });
    }
    if cfg.rescore_logprobs && cfg.logprobs_mode != LogprobsMode::Raw {
        return Err(ServeError::Config {
            field: "rescore-logprobs".into(),
            message: "a scoring pass gives raw log-probs: use it with --logprobs-mode raw_logprobs".into(),
        });
    }
    if cfg.logprobs_mode == LogprobsMode::Both {
        return Err(ServeError::Config { field: "logprobs-mode".into(), message: "raw or processed".into() });
    }
    let tok = load_tokenizer(&cfg)?;
    let (config, source) =
        source::open(&cfg.model).map_err(|e| ServeError::Load { path: cfg.model.clone(), message: e.to_string() })?;
    if config.vocab_size < tok.vocab_size() {
        return Err(ServeError::Load {
            path: cfg.model.clone(),
            message: format!(
                "vocabulary of {} is smaller than the tokenizer's {}",
                config.vocab_size,
                tok.vocab_size()
            ),
        });
    }
    let model = on_backend(&cfg, &config, source.as_ref())?;
    let engine = Engine::start(
        model,
        cfg.weight_version.clone(),
        EngineConfig { max_batch: cfg.max_batch, max_waiting: cfg.max_waiting, prefill_chunk: cfg.prefill_chunk },
        Some(tok.eos_token_id()),
        tok.pad_token_id(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let chat = ChatTemplate::from_tokenizer(&tok).ok();
    let state = Arc::new(AppState {
        engine: engine.clone(),
        tok: Arc::new(tok),
        cfg: cfg.clone(),
        chat,
        metrics: Arc::new(Metrics::new()),
        updating: Mutex::new(()),
    });
    let on_signal = engine.clone();
    let result = rt.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", cfg.host, cfg.port).parse().map_err(|e| ServeError::Config {
            field: "host/port".into(),
            message: format!("`{}:{}`: {e}", cfg.host, cfg.port),
        })?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        println!(
            "r2vpo serve: listening on http://{local} (model {}, {} {} {}, weight version {}, {}, max batch {})",
            cfg.model.display(),
            cfg.backend,
            cfg.device,
            cfg.dtype,
            cfg.weight_version,
            mode_name(cfg.logprobs_mode),
            cfg.max_batch
        );
        axum::serve(listener, router(state)).with_graceful_shutdown(shutdown_signal(on_signal)).await?;
        Ok::<(), ServeError>(())
    });
    engine.shutdown();
    println!("r2vpo serve: stopped");
    result
}

/// Waits for SIGINT/SIGTERM. A paused engine is resumed then: graceful
/// shutdown waits for every request in flight, and requests queued behind
/// `/pause_generation` would otherwise never be admitted, so the server
/// would never stop.
async fn shutdown_signal(engine: Engine) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    engine.pause(false);
    eprintln!("r2vpo serve: shutting down after the requests in flight");
}

fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route("/get_weight_version", get(weight_version))
        .route("/update_weights_from_disk", post(update_weights))
        .route("/pause_generation", post(pause))
        .route("/continue_generation", post(resume))
        .fallback(|| async { ApiError { status: StatusCode::NOT_FOUND, message: "no such route".into(), param: None } })
        .layer(DefaultBodyLimit::max(limit))
        // Outermost: every route, the fallback included, wants the key;
        // every answer, refusals included, is counted.
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        .with_state(state)
}

/// Counts every answer by route (the known routes by path, anything else
/// as `other`) and status.
async fn count_requests(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    const ROUTES: [&str; 11] = [
        "/health",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/metrics",
        "/get_weight_version",
        "/update_weights_from_disk",
        "/pause_generation",
        "/continue_generation",
    ];
    let route = ROUTES.iter().find(|&&r| r == req.uri().path()).copied().unwrap_or("other");
    let response = next.run(req).await;
    st.metrics.request(route, response.status().as_u16());
    response
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let text = st.metrics.render(&st.engine.stats(), st.engine.config().max_batch);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// The messages of a request as the chat template takes them, refusing
/// non-text parts by index.
fn messages_of(msgs: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::bad(Some("messages"), "at least one message is needed"));
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            if let crate::protocol::MessageContent::Parts(parts) = &m.content {
                if let Some(p) = parts.iter().find(|p| p.kind != "text") {
                    return Err(ApiError::bad(
                        Some(&format!("messages[{i}].content")),
                        format!("`{}` parts are not served; only text", p.kind),
                    ));
                }
            }
            Ok(ChatMessage::new(m.role.clone(), m.content.text()))
        })
        .collect()
}

/// `messages` rendered by the model's chat template and tokenized.
fn render_chat(
    st: &AppState,
    msgs: &[ChatMessageIn],
    add_generation_prompt: bool,
    kwargs: Option<&ChatTemplateKwargs>,
) -> Result<Vec<u32>, ApiError> {
    let Some(template) = &st.chat else {
        return Err(ApiError::bad(Some("messages"), "the served model has no chat template; use /v1/completions"));
    };
    let mut opts = template.default_options(add_generation_prompt);
    opts.enable_thinking = kwargs.and_then(|k| k.enable_thinking);
    let text =
        template.render(&messages_of(msgs)?, &opts).map_err(|e| ApiError::bad(Some("messages"), e.to_string()))?;
    st.tok.encode(&text, false).map_err(|e| ApiError::bad(Some("messages"), e.to_string()))
}

async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let req: TokenizeRequest = parse(body)?;
    let tokens = match (&req.prompt, &req.messages) {
        (Some(text), None) => {
            st.tok.encode(text, req.add_special_tokens).map_err(|e| ApiError::bad(Some("prompt"), e.to_string()))?
        }
        (None, Some(msgs)) => {
            render_chat(&st, msgs, req.add_generation_prompt.unwrap_or(true), req.chat_template_kwargs.as_ref())?
        }
        _ => return Err(ApiError::bad(Some("prompt"), "send either `prompt` or `messages`")),
    };
    Ok(Json(TokenizeResponse { count: tokens.len(), max_model_len: st.engine.context(), tokens }))
}

async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let req: DetokenizeRequest = parse(body)?;
    let vocab = st.engine.vocab_size();
    if let Some((i, t)) = req.tokens.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
        return Err(ApiError::bad(Some(&format!("tokens[{i}]")), format!("{t} is outside the vocabulary of {vocab}")));
    }
    let prompt = st.tok.decode(&req.tokens, false).map_err(|e| ApiError::bad(Some("tokens"), e.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        // The scheme is case-insensitive (RFC 7235 §2.1); the token is not.
        let token = given.and_then(|g| g.split_once(' ')).filter(|(s, _)| s.eq_ignore_ascii_case("bearer"));
        if token.map(|(_, t)| t.trim_start()) != Some(key.as_str()) {
            return ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: "missing or wrong API key (Authorization: Bearer KEY)".into(),
                param: None,
            }
            .into_response();
        }
    }
    next.run(req).await
}

async fn health(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let s = st.engine.stats();
    Json(serde_json::json!({
        "status": "ok",
        "weight_version": s.weight_version,
        "running": s.running,
        "waiting": s.waiting,
        "paused": s.paused,
        "completed": s.completed,
        "generated_tokens": s.generated_tokens,
    }))
}

async fn models(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "object": "list",
        "data": [{
            "id": st.cfg.served_model_name,
            "object": "model",
            "created": now(),
            "owned_by": "r2vpo",
            "root": st.cfg.model.display().to_string(),
            "max_model_len": st.engine.context(),
        }],
    }))
}

async fn weight_version(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "weight_version": st.engine.stats().weight_version }))
}

async fn pause(State(st): State<Arc<AppState>>) -> Json<UpdateWeightsResponse> {
    st.engine.pause(true);
    Json(UpdateWeightsResponse {
        success: true,
        message: "paused: running requests finish, new ones wait".into(),
        weight_version: st.engine.stats().weight_version,
    })
}

async fn resume(State(st): State<Arc<AppState>>) -> Json<UpdateWeightsResponse> {
    st.engine.pause(false);
    Json(UpdateWeightsResponse {
        success: true,
        message: "generation continues".into(),
        weight_version: st.engine.stats().weight_version,
    })
}

async fn update_weights(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<UpdateWeightsResponse>, ApiError> {
    let req: UpdateWeightsRequest = parse(body)?;
    let _one = st.updating.lock().await;
    let path = PathBuf::from(&req.model_path);
    let old = st.engine.stats().weight_version;
    let refuse = |message: String| {
        st.metrics.push(false);
        ApiError::bad(Some("model_path"), format!("{message}; still serving weight version {old}"))
    };
    // Only what could be weights is opened: an error about any other file
    // would tell the client that it exists and something of what it holds.
    if !(path.is_dir() || path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))) {
        return Err(refuse(format!("`{}` is neither a model folder nor a .gguf file", req.model_path)));
    }
    // Only the headers are read here; the tensors are read one at a time
    // as the engine sets them, after checking that every one fits. A PEFT
    // adapter folder is folded into the base this server started with, a
    // tensor at a time as it is applied: decoding then costs what the base
    // costs, where separate low-rank products would add r·(in + out) per
    // row and projection to every step.
    let base = st.cfg.model.clone();
    let loaded = tokio::task::spawn_blocking(move || -> r2vpo_llm::model::Result<_> {
        if path.join(lora::ADAPTER_CONFIG).is_file() {
            let (lora, files) = lora::open_peft(&path)?;
            let (config, base) = source::open(&base)?;
            let merged = lora::MergedSource::new(&config, base, &lora, Box::new(files))?;
            Ok((config, Box::new(merged) as Box<dyn TensorSource>))
        } else {
            source::open(&path)
        }
    })
    .await
    .map_err(|e| ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: e.to_string(), param: None })?;
    let (config, source) = loaded.map_err(|e| {
        // candle's GGUF reader quotes the first bytes of a file it cannot
        // read ("unknown magic 0x…"): not the client's to see.
        let e = e.to_string();
        let why = if e.contains("magic") { "not a GGUF file".to_string() } else { e };
        refuse(format!("`{}` did not load: {why}", req.model_path))
    })?;
    if config.vocab_size != st.engine.vocab_size() {
        return Err(refuse(format!(
            "`{}` has a vocabulary of {}, the served model {}",
            req.model_path,
            config.vocab_size,
            st.engine.vocab_size()
        )));
    }
    // The pushed folder's own description must be the served model's: the
    // same tensors with other hyper-parameters (RoPE, norms) would decode
    // wrongly without any tensor failing to fit.
    if let Err(e) = check(&config, source.as_ref()) {
        return Err(refuse(format!("`{}` did not load: {e}", req.model_path)));
    }
    if let Some(d) = st.engine.model_config().differs_from(&config) {
        return Err(refuse(format!("`{}` describes another model than the one served: {d}", req.model_path)));
    }
    let version = req.weight_version.clone().unwrap_or_else(|| req.model_path.clone());
    let (tx, rx) = oneshot::channel();
    st.engine.update_weights(source, version.clone(), move |r| {
        let _ = tx.send(r);
    });
    let applied = rx.await.map_err(|_| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "the engine stopped before the update".into(),
        param: None,
    })?;
    if let Err(e) = applied {
        return Err(refuse(format!("`{}` did not load: {e}", req.model_path)));
    }
    st.metrics.push(true);
    Ok(Json(UpdateWeightsResponse {
        success: true,
        message: format!("loaded {}", req.model_path),
        weight_version: version,
    }))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What both OpenAI routes ask of the engine, checked.
struct Params {
    n: usize,
    max_tokens: usize,
    temperature: f64,
    top_p: f64,
    top_k: i64,
    seed: Option<u64>,
    stops: Vec<String>,
    stop_token_ids: Vec<u32>,
    /// Alternatives per token (0 to [`MAX_TOP_LOGPROBS`]).
    top_logprobs: usize,
    ignore_eos: bool,
    stream: bool,
    /// Return each token's log-prob.
    logprobs: bool,
    /// `stream_options.include_usage`.
    include_usage: bool,
}

/// A streamed answer to `jobs` ([`stream`]) of route `kind`: its id and
/// model name, and the request's checked parameters.
fn streamed(
    st: &Arc<AppState>,
    jobs: Vec<(Vec<u32>, Job)>,
    kind: stream::Kind,
    (id, model, prompt_tokens): (String, String, usize),
    params: Params,
    tokens_as_ids: bool,
) -> Response {
    let spec = stream::Spec {
        kind,
        id,
        created: now(),
        model,
        n: params.n,
        stops: params.stops,
        logprobs: params.logprobs,
        tokens_as_ids,
        include_usage: params.include_usage,
        prompt_tokens,
        mode: st.cfg.logprobs_mode,
    };
    stream::respond(&st.engine, &st.metrics, st.tok.clone(), jobs, spec)
}

/// Refuses `top` alternatives above [`MAX_TOP_LOGPROBS`], naming `field`.
fn check_top(field: &str, top: u32) -> Result<usize, ApiError> {
    if top as usize > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad(Some(field), format!("{top}: at most {MAX_TOP_LOGPROBS} alternatives per token")));
    }
    Ok(top as usize)
}

/// Checks the parameters and turns the prompts into engine jobs (one per
/// prompt), each with the metrics' timing sink.
fn jobs_for(st: &AppState, prompts: Vec<Vec<u32>>, p: &Params) -> Result<Vec<(Vec<u32>, Job)>, ApiError> {
    if p.stream && st.cfg.rescore_logprobs {
        return Err(ApiError::bad(
            Some("stream"),
            "this server rescores log-probs once a sample is done (--rescore-logprobs): send stream = false",
        ));
    }
    let max_batch = st.engine.config().max_batch;
    if p.n == 0 || p.n > max_batch {
        return Err(ApiError::bad(Some("n"), format!("{} must be in 1..={max_batch} (the server's --max-batch)", p.n)));
    }
    if !(p.temperature.is_finite() && p.temperature >= 0.0) {
        return Err(ApiError::bad(Some("temperature"), format!("{} must be finite and >= 0", p.temperature)));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return Err(ApiError::bad(Some("top_p"), format!("{} must be in (0, 1]", p.top_p)));
    }
    if p.max_tokens == 0 {
        return Err(ApiError::bad(Some("max_tokens"), "must be at least 1"));
    }
    if p.stops.iter().any(String::is_empty) {
        return Err(ApiError::bad(Some("stop"), "stop strings must not be empty"));
    }
    if prompts.is_empty() || prompts.len() > st.cfg.max_prompts {
        return Err(ApiError::bad(
            Some("prompt"),
            format!("{} prompts; between 1 and {} (--max-prompts) per request", prompts.len(), st.cfg.max_prompts),
        ));
    }
    let eos = st.tok.eos_token_id();
    let mut stop_ids = p.stop_token_ids.clone();
    stop_ids.extend(st.tok.stop_token_ids().iter().filter(|&&s| s != eos));
    let vocab = st.engine.vocab_size();
    if let Some(&bad) = stop_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            Some("stop_token_ids"),
            format!("{bad} is out of range for the vocabulary of {vocab}"),
        ));
    }
    let sampling = SamplingConfig {
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        max_new_tokens: p.max_tokens,
        stop_token_ids: stop_ids,
        seed: 0,
    };
    let stop_when: Option<StopWhen> = if p.stops.is_empty() {
        None
    } else {
        let tok = st.tok.clone();
        let window = p.stops.iter().map(|s| s.chars().count()).max().unwrap_or(1) + 2;
        let stops = p.stops.clone();
        Some(Arc::new(move |ids: &[u32]| {
            let tail = &ids[ids.len().saturating_sub(window)..];
            tok.decode(tail, false).is_ok_and(|t| stops.iter().any(|s| t.contains(s.as_str())))
        }))
    };
    let seed = p.seed.unwrap_or_else(rand::random);
    let arrival = std::time::Instant::now();
    let mut jobs = Vec::with_capacity(prompts.len());
    for (k, ids) in prompts.into_iter().enumerate() {
        let seeds = (0..p.n).map(|i| request_seed(seed, (k * p.n + i) as u64)).collect();
        let job = Job {
            prompt_ids: ids.clone(),
            seeds,
            sampling: sampling.clone(),
            stop_when: stop_when.clone(),
            ignore_eos: p.ignore_eos,
            rescore: st.cfg.rescore_logprobs,
            top_logprobs: p.top_logprobs,
            on_token: Some(st.metrics.sink(arrival, p.n, None)),
        };
        st.engine.check(&job).map_err(|e| match &e {
            EngineError::Invalid(SampleError::Config { field, message }) => {
                ApiError::bad(Some(field), format!("prompt {k}: {message}"))
            }
            EngineError::Invalid(SampleError::BadPrompt { message, .. }) => {
                ApiError::bad(Some("prompt"), format!("prompt {k} {message}"))
            }
            EngineError::Invalid(SampleError::PromptTooLong { source, .. }) => {
                // Blame the prompt only when it alone leaves no room.
                let field = if source.prompt_len >= source.context { "prompt" } else { "max_tokens" };
                ApiError::bad(Some(field), format!("prompt {k}: {source}"))
            }
            _ => ApiError::bad(Some("prompt"), format!("prompt {k}: {e}")),
        })?;
        jobs.push((ids, job));
    }
    let prompt_tokens = jobs.iter().map(|(ids, _)| ids.len()).sum();
    st.metrics.prompt(prompt_tokens);
    Ok(jobs)
}

/// Submits `jobs` and waits for every answer, in order.
async fn run_jobs(st: &AppState, jobs: Vec<(Vec<u32>, Job)>) -> Result<Vec<JobOutput>, ApiError> {
    let mut waits = Vec::with_capacity(jobs.len());
    for (_, job) in jobs {
        let (tx, rx) = oneshot::channel::<Result<JobOutput, EngineError>>();
        st.engine.submit(job, move |r| {
            let _ = tx.send(r);
        });
        waits.push(rx);
    }
    let mut outputs = Vec::with_capacity(waits.len());
    for rx in waits {
        outputs
            .push(rx.await.map_err(|_| engine_error(EngineError::Stopped("no answer".into())))?.map_err(engine_error)?);
    }
    Ok(outputs)
}

fn encode(st: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    st.tok.encode(text, false).map_err(|e| ApiError::bad(Some("prompt"), e.to_string()))
}

fn engine_error(e: EngineError) -> ApiError {
    let status = match &e {
        EngineError::Invalid(_) => StatusCode::BAD_REQUEST,
        EngineError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
        EngineError::Stopped(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    ApiError { status, message: e.to_string(), param: None }
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(body)?;
    if req.echo {
        return Err(ApiError::bad(Some("echo"), "echo is not supported"));
    }
    let params = Params {
        n: req.n,
        max_tokens: req.max_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        seed: req.seed,
        stops: req.stop.as_ref().map(Stop::strings).unwrap_or_default(),
        stop_token_ids: req.stop_token_ids.clone().unwrap_or_default(),
        top_logprobs: req.logprobs.map(|k| check_top("logprobs", k)).transpose()?.unwrap_or(0),
        ignore_eos: req.ignore_eos,
        stream: req.stream,
        logprobs: req.logprobs.is_some(),
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
    };
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        Prompt::Ids(ids) => vec![ids.clone()],
        Prompt::IdLists(l) => l.clone(),
        Prompt::Text(t) => vec![encode(&st, t)?],
        Prompt::Texts(ts) => ts.iter().map(|t| encode(&st, t)).collect::<Result<_, _>>()?,
    };
    let jobs = jobs_for(&st, prompts, &params)?;
    let prompt_tokens = jobs.iter().map(|(ids, _)| ids.len()).sum();
    let model = req.model.clone().unwrap_or_else(|| st.cfg.served_model_name.clone());
    let id = format!("cmpl-{:016x}", rand::random::<u64>());
    if req.stream {
        let head = (id, model, prompt_tokens);
        return Ok(streamed(&st, jobs, stream::Kind::Completion, head, params, req.return_tokens_as_token_ids));
    }
    let outputs = run_jobs(&st, jobs).await?;
    // Prompts are admitted in order, so when a weight update lands between
    // two prompts of one request the first carries the oldest version:
    // reporting it never understates a sample's lag.
    let weight_version = outputs.first().map(|o| o.weight_version.clone()).unwrap_or_default();
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    for (p, out) in outputs.into_iter().enumerate() {
        for (i, (g, top)) in out.generations.into_iter().zip(out.top_logprobs).enumerate() {
            completion_tokens += g.token_ids.len();
            choices.push(choice(&st, &req, &params.stops, p * req.n + i, g, &top));
        }
    }
    Ok(Json(CompletionResponse {
        id,
        object: "text_completion".into(),
        created: now(),
        model,
        choices,
        usage: Usage { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens },
        weight_version,
        logprobs_mode: mode_name(st.cfg.logprobs_mode).into(),
    })
    .into_response())
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse(body)?;
    let prompt = render_chat(&st, &req.messages, true, req.chat_template_kwargs.as_ref())?;
    let top = match (req.logprobs, req.top_logprobs) {
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::bad(Some("top_logprobs"), "needs logprobs = true"));
        }
        (_, k) => check_top("top_logprobs", k.unwrap_or(0))?,
    };
    // Without a limit, whatever the context leaves after the prompt.
    let room = st.engine.context().saturating_sub(prompt.len()).max(1);
    let params = Params {
        n: req.n,
        max_tokens: req.max_completion_tokens.or(req.max_tokens).unwrap_or(room),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        seed: req.seed,
        stops: req.stop.as_ref().map(Stop::strings).unwrap_or_default(),
        stop_token_ids: req.stop_token_ids.clone().unwrap_or_default(),
        top_logprobs: top,
        ignore_eos: req.ignore_eos,
        stream: req.stream,
        logprobs: req.logprobs,
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
    };
    let jobs = jobs_for(&st, vec![prompt.clone()], &params)?;
    let prompt_tokens = prompt.len();
    let model = req.model.clone().unwrap_or_else(|| st.cfg.served_model_name.clone());
    let id = format!("chatcmpl-{:016x}", rand::random::<u64>());
    if req.stream {
        return Ok(streamed(&st, jobs, stream::Kind::Chat, (id, model, prompt_tokens), params, false));
    }
    let out = run_jobs(&st, jobs).await?.pop().expect("one job");
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    for (i, (g, top)) in out.generations.into_iter().zip(out.top_logprobs).enumerate() {
        completion_tokens += g.token_ids.len();
        let (text, finish_reason) = answer_text(&st, &params.stops, &g);
        let logprobs = req.logprobs.then(|| ChatLogprobs {
            content: g
                .token_ids
                .iter()
                .enumerate()
                .map(|(t, &id)| ChatTokenLogprob {
                    token: st.tok.decode(&[id], false).unwrap_or_default(),
                    logprob: f64::from(sampled_logprob(&st, &g, t)),
                    bytes: token_bytes(&st.tok, id),
                    top_logprobs: top.get(t).map_or_else(Vec::new, |alts| {
                        alts.iter()
                            .map(|&(a, lp)| TopLogprob {
                                token: st.tok.decode(&[a], false).unwrap_or_default(),
                                logprob: f64::from(lp),
                                bytes: token_bytes(&st.tok, a),
                            })
                            .collect()
                    }),
                })
                .collect(),
        });
        choices.push(ChatChoice {
            index: i,
            message: AssistantMessage { role: "assistant".into(), content: text },
            logprobs,
            finish_reason: finish_reason.into(),
            token_ids: g.token_ids,
        });
    }
    Ok(Json(ChatCompletionResponse {
        id,
        object: "chat.completion".into(),
        created: now(),
        model,
        choices,
        usage: Usage { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens },
        prompt_token_ids: req.return_token_ids.then_some(prompt),
        weight_version: out.weight_version,
        logprobs_mode: mode_name(st.cfg.logprobs_mode).into(),
    })
    .into_response())
}

/// Token `t`'s log-prob in the server's `logprobs_mode`.
fn sampled_logprob(st: &AppState, g: &Generation, t: usize) -> f32 {
    match st.cfg.logprobs_mode {
        LogprobsMode::Processed => g.logprobs[t],
        _ => g.model_logprobs[t],
    }
}

/// A generation's text (without the final EOS or stop id, cut at the first
/// stop string) and its OpenAI finish reason.
fn answer_text(st: &AppState, stops: &[String], g: &Generation) -> (String, &'static str) {
    let body = match g.finish_reason {
        FinishReason::Length => &g.token_ids[..],
        _ => &g.token_ids[..g.token_ids.len().saturating_sub(1)],
    };
    let mut text = st.tok.decode(body, true).unwrap_or_default();
    let mut stopped_by_string = false;
    if let Some(cut) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
        text.truncate(cut);
        stopped_by_string = true;
    }
    let finish_reason = match g.finish_reason {
        FinishReason::Length if !stopped_by_string => "length",
        _ => "stop",
    };
    (text, finish_reason)
}

fn choice(
    st: &AppState,
    req: &CompletionRequest,
    stops: &[String],
    index: usize,
    g: Generation,
    top: &[Vec<(u32, f32)>],
) -> Choice {
    let (text, finish_reason) = answer_text(st, stops, &g);
    let name = |t: u32| {
        if req.return_tokens_as_token_ids {
            format!("token_id:{t}")
        } else {
            st.tok.decode(&[t], false).unwrap_or_default()
        }
    };
    let logprobs = req.logprobs.map(|k| {
        let mut offset = 0;
        let mut tokens = Vec::with_capacity(g.token_ids.len());
        let mut text_offset = Vec::with_capacity(g.token_ids.len());
        for &t in &g.token_ids {
            let piece = st.tok.decode(&[t], false).unwrap_or_default();
            text_offset.push(offset);
            offset += piece.len();
            tokens.push(name(t));
        }
        let top_logprobs = (k > 0).then(|| {
            top.iter()
                .map(|alts| alts.iter().map(|&(a, lp)| (name(a), serde_json::json!(f64::from(lp)))).collect())
                .collect()
        });
        Logprobs {
            tokens,
            token_logprobs: (0..g.token_ids.len()).map(|t| Some(f64::from(sampled_logprob(st, &g, t)))).collect(),
            top_logprobs,
            text_offset,
        }
    });
    Choice { index, text, logprobs, finish_reason: finish_reason.into(), token_ids: g.token_ids, entropies: g.entropy }
}

/// The address a `serve` process printed, read from one line of its
/// stdout (`r2vpo serve: listening on http://ADDR …`).
pub fn parse_listening_line(line: &str) -> Option<String> {
    let rest = line.split("listening on ").nth(1)?;
    Some(rest.split_whitespace().next()?.to_string())
}
