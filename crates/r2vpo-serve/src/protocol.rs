//! The wire contract: OpenAI's `/v1/completions` and
//! `/v1/chat/completions` as vLLM extends them (with vLLM's `/tokenize` and
//! `/detokenize`), and SGLang's weight-update endpoints.
//!
//! Requests are parsed strictly (an unknown field is a 400 naming it);
//! answers carry everything a learner needs per token — `token_ids`
//! (vLLM's `return_token_ids` field), `logprobs.token_logprobs`, and two
//! fields of ours that stock servers lack: `weight_version` (SGLang's name)
//! and `logprobs_mode` (vLLM's server flag, echoed so a client can check
//! what the numbers mean). The client side ([`crate::client`]) reads
//! answers leniently so the same code drives vLLM, SGLang and llama.cpp.

use serde::{Deserialize, Serialize};

/// `prompt` of a completion request: text or token ids, one or a list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text prompt (tokenized without extra special tokens: a chat
    /// template's output already has them).
    Text(String),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several text prompts.
    Texts(Vec<String>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `stop`: one string or several.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The strings.
    pub fn strings(&self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

fn one() -> usize {
    1
}
fn sixteen() -> usize {
    16
}
fn one_f() -> f64 {
    1.0
}
fn minus_one() -> i64 {
    -1
}

/// `POST /v1/completions`. Defaults are OpenAI's (`n` 1, `max_tokens` 16,
/// `temperature` 1, `top_p` 1) and vLLM's (`top_k` −1 = off).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// Model name; any value is accepted by a one-model server.
    #[serde(default)]
    pub model: Option<String>,
    /// The prompt(s).
    pub prompt: Prompt,
    /// Samples per prompt.
    #[serde(default = "one")]
    pub n: usize,
    /// New tokens at most per sample.
    #[serde(default = "sixteen")]
    pub max_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[serde(default = "one_f")]
    pub temperature: f64,
    /// Nucleus mass in (0, 1].
    #[serde(default = "one_f")]
    pub top_p: f64,
    /// Keep the k most likely tokens; −1 or 0 is off.
    #[serde(default = "minus_one")]
    pub top_k: i64,
    /// Seed: sample `i` of prompt `p` draws from `request_seed(seed, p·n + i)`;
    /// without one the server picks a random seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Stop strings (the text is cut before the first one; its tokens stay
    /// in `token_ids`).
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Token ids that end a sample (vLLM), besides the model's EOS.
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Log-probs of the sampled tokens are returned when this is present,
    /// with this many alternatives per token (0 to 20) in `top_logprobs`.
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Echoing the prompt is not supported (must be false).
    #[serde(default)]
    pub echo: bool,
    /// Answer as server-sent events, one chunk per token, ending with
    /// `data: [DONE]`.
    #[serde(default)]
    pub stream: bool,
    /// With `stream`: `include_usage` adds a last chunk with the counts.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// vLLM: `logprobs.tokens` as `token_id:N` strings.
    #[serde(default)]
    pub return_tokens_as_token_ids: bool,
    /// vLLM: return `token_ids` (always returned here).
    #[serde(default)]
    pub return_token_ids: bool,
    /// vLLM: keep generating past EOS (benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
    /// OpenAI's end-user tag; ignored.
    #[serde(default)]
    pub user: Option<String>,
}

/// `stream_options` of a streamed request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
    /// OpenAI's per-chunk usage flag; accepted, not acted on.
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// `logprobs` of a choice (OpenAI's legacy completions shape).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Logprobs {
    /// The tokens as text, or `token_id:N` with `return_tokens_as_token_ids`.
    pub tokens: Vec<String>,
    /// log-prob of each sampled token (meaning: the answer's `logprobs_mode`).
    pub token_logprobs: Vec<Option<f64>>,
    /// Per token, the requested number of most likely tokens → their
    /// log-probs under the model's T = 1 distribution (vLLM's raw mode);
    /// `null` when `logprobs` was 0.
    pub top_logprobs: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    /// Character offset of each token in `text`.
    pub text_offset: Vec<usize>,
}

/// One sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// `prompt_index · n + sample_index`.
    pub index: usize,
    /// Generated text (without the final EOS, cut at a stop string).
    pub text: String,
    /// Per-token log-probs when requested.
    pub logprobs: Option<Logprobs>,
    /// `stop` (EOS, a stop id or string) or `length`.
    pub finish_reason: String,
    /// Generated token ids, the final EOS/stop token included.
    pub token_ids: Vec<u32>,
    /// Entropy (nats) of the untruncated T = 1 distribution at each step
    /// (an r2vpo extension; the learner's entropy diagnostic).
    pub entropies: Vec<f32>,
}

/// Token counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (each prompt counted once).
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// The sum.
    pub total_tokens: usize,
}

/// The answer to a completion request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// `cmpl-…`.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// `len(prompts) · n` samples.
    pub choices: Vec<Choice>,
    /// Token counts.
    pub usage: Usage,
    /// The weight version that produced every token of this answer.
    pub weight_version: String,
    /// `raw_logprobs` or `processed_logprobs` (vLLM's names).
    pub logprobs_mode: String,
}

/// A message's `content`: text, or OpenAI's list of parts (the text parts
/// are joined).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": …}, …]`.
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text of the content.
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(t) => t.clone(),
            MessageContent::Parts(p) => p.iter().map(|p| p.text.as_str()).collect(),
        }
    }
}

/// One part of a [`MessageContent::Parts`]; only text parts are served.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    /// Must be `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    #[serde(default)]
    pub text: String,
}

/// One message of a chat request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessageIn {
    /// `system`, `user`, `assistant` or `tool` (whatever the template
    /// knows).
    pub role: String,
    /// The message text.
    pub content: MessageContent,
    /// OpenAI's participant name; ignored.
    #[serde(default)]
    pub name: Option<String>,
}

/// Variables handed to the chat template (vLLM's `chat_template_kwargs`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatTemplateKwargs {
    /// Qwen3's thinking switch (unset: the template's default).
    #[serde(default)]
    pub enable_thinking: Option<bool>,
}

/// `POST /v1/chat/completions`: OpenAI's request, with vLLM's `top_k`,
/// `stop_token_ids`, `ignore_eos`, `return_token_ids` and
/// `chat_template_kwargs`. The sampling fields repeat
/// [`CompletionRequest`]'s rather than sharing a flattened struct: serde's
/// `deny_unknown_fields`, which names a misspelt field in the 400, does not
/// work together with `flatten`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    /// Model name; any value is accepted by a one-model server.
    #[serde(default)]
    pub model: Option<String>,
    /// The conversation, rendered by the model's chat template with an
    /// assistant turn opened.
    pub messages: Vec<ChatMessageIn>,
    /// Samples.
    #[serde(default = "one")]
    pub n: usize,
    /// New tokens at most per sample (OpenAI's older name).
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// New tokens at most per sample (wins over `max_tokens`); default:
    /// whatever the context leaves after the prompt.
    #[serde(default)]
    pub max_completion_tokens: Option<usize>,
    /// Softmax temperature; 0 is greedy.
    #[serde(default = "one_f")]
    pub temperature: f64,
    /// Nucleus mass in (0, 1].
    #[serde(default = "one_f")]
    pub top_p: f64,
    /// Keep the k most likely tokens; −1 or 0 is off.
    #[serde(default = "minus_one")]
    pub top_k: i64,
    /// Seed, as for completions.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Token ids that end a sample, besides the model's EOS.
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Return each sampled token's log-prob.
    #[serde(default)]
    pub logprobs: bool,
    /// With `logprobs`: this many alternatives per token (0 to 20).
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// Answer as server-sent events (`chat.completion.chunk`s).
    #[serde(default)]
    pub stream: bool,
    /// With `stream`: `include_usage`.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// vLLM: add `prompt_token_ids` to the answer (each choice's
    /// `token_ids` are always there).
    #[serde(default)]
    pub return_token_ids: bool,
    /// vLLM: keep generating past EOS.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Variables for the chat template.
    #[serde(default)]
    pub chat_template_kwargs: Option<ChatTemplateKwargs>,
    /// OpenAI's end-user tag; ignored.
    #[serde(default)]
    pub user: Option<String>,
}

/// One alternative of [`ChatTokenLogprob::top_logprobs`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token as text.
    pub token: String,
    /// Its log-prob under the model's T = 1 distribution.
    pub logprob: f64,
    /// The token's UTF-8 bytes (a token may hold part of a character).
    pub bytes: Option<Vec<u8>>,
}

/// One sampled token of a chat choice's `logprobs.content`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    /// The token as text.
    pub token: String,
    /// Its log-prob (meaning: the answer's `logprobs_mode`).
    pub logprob: f64,
    /// The token's UTF-8 bytes.
    pub bytes: Option<Vec<u8>>,
    /// The requested alternatives, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// `logprobs` of a chat choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// The assistant's message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: String,
    /// The generated text (cut at a stop string, without the final EOS).
    pub content: String,
}

/// One sample of a chat answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Sample index.
    pub index: usize,
    /// The answer.
    pub message: AssistantMessage,
    /// Per-token log-probs when requested.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: String,
    /// Generated token ids (vLLM's `return_token_ids`), the final EOS/stop
    /// token included.
    pub token_ids: Vec<u32>,
}

/// The answer to a chat request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-…`.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// `n` samples.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// The rendered prompt's token ids, with `return_token_ids`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The weight version that produced every token.
    pub weight_version: String,
    /// `raw_logprobs` or `processed_logprobs`.
    pub logprobs_mode: String,
}

/// `POST /tokenize` (vLLM's shape): a text prompt, or chat messages
/// rendered by the chat template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// Model name; ignored.
    #[serde(default)]
    pub model: Option<String>,
    /// Text to tokenize.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Messages to render and tokenize (instead of `prompt`).
    #[serde(default)]
    pub messages: Option<Vec<ChatMessageIn>>,
    /// With `messages`: open an assistant turn (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// With `prompt`: add the tokenizer's special tokens (default false,
    /// as `/v1/completions` encodes).
    #[serde(default)]
    pub add_special_tokens: bool,
    /// Variables for the chat template.
    #[serde(default)]
    pub chat_template_kwargs: Option<ChatTemplateKwargs>,
}

/// The answer to `/tokenize`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// Number of tokens.
    pub count: usize,
    /// The model's context length.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
}

/// `POST /detokenize`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// Model name; ignored.
    #[serde(default)]
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// The answer to `/detokenize`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The text (special tokens kept).
    pub prompt: String,
}

/// `POST /update_weights_from_disk` (SGLang's shape).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateWeightsRequest {
    /// A Hugging Face folder (or GGUF file) readable by the server.
    pub model_path: String,
    /// The version answers will carry from now on.
    #[serde(default)]
    pub weight_version: Option<String>,
    /// SGLang's cache flag; the cache is always rebuilt here (ignored).
    #[serde(default)]
    pub flush_cache: Option<bool>,
    /// SGLang's abort flag; in-flight requests always finish on the old
    /// weights here (ignored).
    #[serde(default)]
    pub abort_all_requests: Option<bool>,
}

/// The answer to a weight update or pause/continue (SGLang's shape).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateWeightsResponse {
    /// Whether the new weights are serving.
    pub success: bool,
    /// What happened.
    pub message: String,
    /// The version now serving.
    pub weight_version: String,
}

/// An error answer, OpenAI's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Inside [`ErrorBody`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// What is wrong, naming the field or value.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `server_error`…
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending field, when one is.
    pub param: Option<String>,
    /// The HTTP status.
    pub code: u16,
}
