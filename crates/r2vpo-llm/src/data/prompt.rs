//! Prompts that fit the model's context.
//!
//! A problem's prompt is its question wrapped by a [`PromptTemplate`],
//! rendered as the single user message of the tokenizer's chat template and
//! encoded. Generation then appends up to `max_new_tokens` tokens, so a
//! prompt may have at most `context − max_new_tokens` tokens
//! ([`crate::sample::check_prompt_fits`], `context` being the model's
//! `max_position_embeddings`). A longer prompt is never sent to the model:
//! [`PromptFitter::fit`] skips it or truncates it, as
//! [`OverlongPrompts`] says, and the caller counts and reports it.

use serde::{Deserialize, Serialize};

use super::PromptTemplate;
use crate::chat::{ChatError, ChatTemplate};
use crate::sample::{check_prompt_fits, max_prompt_len};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// What to do with a problem whose prompt plus `sampling.max_new_tokens`
/// does not fit the model's context (`max_position_embeddings`). The config
/// key is `overlong_prompts` (in `llm eval` configs and at the top level of
/// `llm train` configs; `[eval]` of a train config has its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OverlongPrompts {
    /// Leave the problem out (the default), with a warning naming it; the
    /// count is reported (`skipped_prompts` in `eval.json`,
    /// `prompt_skipped` lines in a training run's `events.jsonl`).
    #[default]
    Skip,
    /// Keep the start of the question and drop its tail, so that the prompt
    /// (whose template text and chat framing before and after the question
    /// are kept whole) has exactly `context − max_new_tokens` tokens. A
    /// prompt whose template alone leaves no room for the question is
    /// skipped as with `skip`. Truncated prompts are counted
    /// (`truncated_prompts` in `eval.json`, `prompt_truncated` events).
    Truncate,
}

/// A problem whose prompt did not fit, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlongPrompt {
    /// The problem's id (for files: `{file stem}:{line}` or the dataset's own
    /// id).
    pub id: String,
    /// Tokens of the full prompt.
    pub prompt_tokens: usize,
    /// The most a prompt may have: `context − max_new_tokens`.
    pub max_prompt_tokens: usize,
}

/// Errors of rendering or encoding a prompt.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The chat template failed.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// The tokenizer failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// One prompt after [`PromptFitter::fit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fitted {
    /// The prompt fits as it is.
    Fits(Vec<u32>),
    /// The prompt was cut to fit ([`OverlongPrompts::Truncate`]).
    Truncated {
        /// The truncated prompt.
        ids: Vec<u32>,
        /// Tokens of the full prompt.
        prompt_tokens: usize,
    },
    /// The prompt does not fit and is to be left out.
    Skipped {
        /// Tokens of the full prompt.
        prompt_tokens: usize,
    },
}

/// Stands for the question while the template around it is measured: a
/// private-use character no dataset should contain, and no whitespace, so
/// templates that trim the message keep it whole.
const MARKER: &str = "\u{E000}r2vpo-question\u{E000}";

/// Builds prompts for one template, tokenizer and context, fitting each into
/// `context − max_new_tokens` tokens.
#[derive(Debug, Clone)]
pub struct PromptFitter {
    template: PromptTemplate,
    enable_thinking: Option<bool>,
    context: usize,
    max_new_tokens: usize,
    overlong: OverlongPrompts,
    /// Truncation only: the prompt's ids before and after the question, or
    /// `None` if the question cannot be located in the rendered template.
    frame: Option<(Vec<u32>, Vec<u32>)>,
}

impl PromptFitter {
    /// A fitter for prompts rendered with `template` and `chat` (Qwen3's
    /// `enable_thinking` as given), encoded with `tok`, for a model of
    /// `context` positions generating up to `max_new_tokens` tokens. Pass the
    /// same `tok` and `chat` to [`PromptFitter::fit`].
    pub fn new(
        tok: &Tokenizer,
        chat: &ChatTemplate,
        template: PromptTemplate,
        enable_thinking: Option<bool>,
        context: usize,
        max_new_tokens: usize,
        overlong: OverlongPrompts,
    ) -> Result<Self, PromptError> {
        let frame = match overlong {
            OverlongPrompts::Skip => None,
            OverlongPrompts::Truncate => {
                let text = chat.prompt(&template.render(MARKER), enable_thinking)?;
                let mut parts = text.split(MARKER);
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(pre), Some(post), None) => Some((tok.encode(pre, false)?, tok.encode(post, false)?)),
                    _ => None,
                }
            }
        };
        Ok(Self { template, enable_thinking, context, max_new_tokens, overlong, frame })
    }

    /// The most tokens a prompt may have: `context − max_new_tokens`.
    pub fn max_prompt_tokens(&self) -> usize {
        max_prompt_len(self.max_new_tokens, self.context)
    }

    /// The model's context length this fitter checks against.
    pub fn context(&self) -> usize {
        self.context
    }

    /// The prompt of `question`: rendered, encoded, and checked with
    /// [`check_prompt_fits`]; an over-long one is skipped or truncated
    /// according to the [`OverlongPrompts`] policy.
    pub fn fit(&self, tok: &Tokenizer, chat: &ChatTemplate, question: &str) -> Result<Fitted, PromptError> {
        let text = chat.prompt(&self.template.render(question), self.enable_thinking)?;
        let ids = tok.encode(&text, false)?;
        if check_prompt_fits(ids.len(), self.max_new_tokens, self.context).is_ok() {
            return Ok(Fitted::Fits(ids));
        }
        let prompt_tokens = ids.len();
        let Some((pre, post)) = &self.frame else {
            return Ok(Fitted::Skipped { prompt_tokens });
        };
        let room = self.max_prompt_tokens().saturating_sub(pre.len() + post.len());
        if room == 0 {
            return Ok(Fitted::Skipped { prompt_tokens });
        }
        let q = tok.encode(question, false)?;
        let mut cut = Vec::with_capacity(self.max_prompt_tokens());
        cut.extend_from_slice(pre);
        cut.extend_from_slice(&q[..room.min(q.len())]);
        cut.extend_from_slice(post);
        debug_assert!(cut.len() <= self.max_prompt_tokens());
        Ok(Fitted::Truncated { ids: cut, prompt_tokens })
    }

    /// The policy this fitter applies.
    pub fn overlong(&self) -> OverlongPrompts {
        self.overlong
    }
}
