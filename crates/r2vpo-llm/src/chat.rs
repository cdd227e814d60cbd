//! Hugging Face chat templates rendered with `minijinja`, configured as
//! transformers configures Jinja2 (`trim_blocks`, `lstrip_blocks`, loop
//! controls, `raise_exception`), plus Python string methods (`.strip()`,
//! `.split()`, `.startswith()`, …) that real templates call, via
//! `minijinja-contrib`'s `pycompat`.
//!
//! Qwen3's `enable_thinking` switch is the paper's fast (no thinking) /
//! slow (thinking) mode: with `enable_thinking = false` its template
//! pre-fills an empty `<think>\n\n</think>\n\n` in the generation prompt.
//! [`strip_think`] removes the reasoning from a completion before the
//! answer is verified.
//!
//! Known divergence: minijinja's `tojson` escapes `<`, `>`, `&` and `'` as
//! `\u003c`… where transformers' writes them verbatim. It matters only for
//! templates that serialise tools or tool calls, which r2vpo does not pass.

use std::collections::BTreeMap;

use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::tokenizer::Tokenizer;

/// Errors from compiling or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The tokenizer's source has no chat template.
    #[error("{source_name}: no chat template (field `chat_template` / `tokenizer.chat_template`)")]
    NoTemplate {
        /// The file or folder the tokenizer came from.
        source_name: String,
    },
    /// The template does not parse.
    #[error("chat template syntax error: {0}")]
    Syntax(String),
    /// Rendering failed, including the template calling `raise_exception`.
    #[error("chat template rendering failed: {0}")]
    Render(String),
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, ChatError>;

/// One chat turn, as Hugging Face templates index it (`message['role']`,
/// `message.content`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

impl ChatMessage {
    /// A turn with the given role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }

    /// A `user` turn.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// A `system` turn.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// An `assistant` turn.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Variables a template sees besides `messages`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RenderOptions {
    /// Append the opening of an assistant turn (for generation).
    pub add_generation_prompt: bool,
    /// Qwen3's thinking switch; `None` leaves the variable undefined, which
    /// Qwen3's template treats as thinking on.
    pub enable_thinking: Option<bool>,
    /// `bos_token`; `None` renders as the empty string.
    pub bos_token: Option<String>,
    /// `eos_token`.
    pub eos_token: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`, a Hugging Face Jinja chat template.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        // transformers compiles templates with trim_blocks and lstrip_blocks;
        // without them, `{% if %}` lines leave stray newlines in prompts.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("raise_exception: {msg}")))
        });
        env.add_template_owned(NAME, source.to_string()).map_err(|e| ChatError::Syntax(format!("{e:#}")))?;
        Ok(ChatTemplate { env, bos_token: None, eos_token: String::new() })
    }

    /// The tokenizer's template, with its BOS/EOS texts as the default
    /// `bos_token`/`eos_token` (see [`ChatTemplate::default_options`]).
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Self> {
        let src = tok.chat_template().ok_or_else(|| ChatError::NoTemplate { source_name: tok.source().to_string() })?;
        let mut t = Self::new(src)?;
        t.bos_token = tok.bos_token();
        t.eos_token = tok.eos_token();
        Ok(t)
    }

    /// Options with this template's BOS/EOS texts, the given generation
    /// prompt flag, and thinking left undefined.
    pub fn default_options(&self, add_generation_prompt: bool) -> RenderOptions {
        RenderOptions {
            add_generation_prompt,
            enable_thinking: None,
            bos_token: self.bos_token.clone(),
            eos_token: self.eos_token.clone(),
        }
    }

    /// Renders `messages` with `opts`.
    pub fn render(&self, messages: &[ChatMessage], opts: &RenderOptions) -> Result<String> {
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| Value::from_pairs([("role", m.role.as_str()), ("content", m.content.as_str())]))
            .collect();
        ctx.insert("messages", Value::from(msgs));
        ctx.insert("add_generation_prompt", Value::from(opts.add_generation_prompt));
        ctx.insert("bos_token", Value::from(opts.bos_token.clone().unwrap_or_default()));
        ctx.insert("eos_token", Value::from(opts.eos_token.clone()));
        // Left undefined when unset: Qwen3 tests `enable_thinking is defined`.
        if let Some(t) = opts.enable_thinking {
            ctx.insert("enable_thinking", Value::from(t));
        }
        let tmpl = self.env.get_template(NAME).map_err(|e| ChatError::Render(format!("{e:#}")))?;
        tmpl.render(Value::from(ctx)).map_err(|e| ChatError::Render(format!("{e:#}")))
    }

    /// Renders a single user question as a generation prompt.
    pub fn prompt(&self, user: &str, enable_thinking: Option<bool>) -> Result<String> {
        let mut opts = self.default_options(true);
        opts.enable_thinking = enable_thinking;
        self.render(&[ChatMessage::user(user)], &opts)
    }
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// The completion with its reasoning removed, for answer verification:
/// * text up to a `</think>` that has no `<think>` before it is dropped
///   (templates such as DeepSeek-R1-Distill's put the opening tag in the
///   prompt, so the completion only closes it);
/// * every `<think>…</think>` block is removed;
/// * an unclosed `<think>` drops the rest of the text: the reasoning was cut
///   off (by the length limit), so no answer follows it;
/// * leading whitespace is trimmed.
pub fn strip_think(text: &str) -> String {
    let mut s = text;
    if let Some(c) = s.find(CLOSE) {
        if s.find(OPEN).is_none_or(|o| o > c) {
            s = &s[c + CLOSE.len()..];
        }
    }
    let mut out = String::with_capacity(s.len());
    while let Some(o) = s.find(OPEN) {
        out.push_str(&s[..o]);
        match s[o..].find(CLOSE) {
            Some(c) => s = &s[o + c + CLOSE.len()..],
            None => {
                s = "";
                break;
            }
        }
    }
    out.push_str(s);
    out.trim_start().to_string()
}
