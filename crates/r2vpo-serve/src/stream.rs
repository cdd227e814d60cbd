//! Streamed answers (`"stream": true`): server-sent events in OpenAI's
//! chunk formats (`text_completion` chunks for `/v1/completions`,
//! `chat.completion.chunk`s for `/v1/chat/completions`), one chunk per
//! sampled token with its log-probs, a last `usage` chunk on request, and
//! `data: [DONE]`.
//!
//! Text is sent as it becomes final: a token that ends inside a UTF-8
//! character, and the last characters that could begin a stop string, are
//! held back until the next token settles them, so the concatenated deltas
//! equal the unstreamed answer's text. A client that disconnects drops the
//! chunk channel; the engine's sink then reports the sample gone and its
//! row is freed at the next decode step.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use r2vpo_llm::engine::{Engine, EngineError, Job, JobOutput, TokenEvent};
use r2vpo_llm::rollout::LogprobsMode;
use r2vpo_llm::sample::FinishReason;
use r2vpo_llm::tokenizer::Tokenizer;

use crate::metrics::Metrics;

/// Which route's chunk format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `text_completion` chunks.
    Completion,
    /// `chat.completion.chunk`s.
    Chat,
}

/// What a stream needs besides its jobs.
pub(crate) struct Spec {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Samples per prompt.
    pub n: usize,
    pub stops: Vec<String>,
    /// Send each token's log-prob.
    pub logprobs: bool,
    /// `token_id:N` instead of the token's text (completions).
    pub tokens_as_ids: bool,
    pub include_usage: bool,
    pub prompt_tokens: usize,
    pub mode: LogprobsMode,
}

enum Msg {
    Token(usize, TokenEvent),
    Done(Result<JobOutput, EngineError>),
}

/// One choice being streamed.
#[derive(Default)]
struct ChoiceState {
    ids: Vec<u32>,
    /// Bytes of the text already sent.
    sent: usize,
    /// Bytes of the token texts so far (`text_offset`).
    offset: usize,
    finished: bool,
}

/// Submits `jobs` (one per prompt) to `engine` with sinks that feed the
/// stream (and `metrics`' timing), and answers with the event stream.
pub(crate) fn respond(
    engine: &Engine,
    metrics: &Arc<Metrics>,
    tok: Arc<Tokenizer>,
    jobs: Vec<(Vec<u32>, Job)>,
    spec: Spec,
) -> Response {
    let (ev_tx, ev_rx) = mpsc::unbounded_channel::<Msg>();
    let arrival = std::time::Instant::now();
    let prompts = jobs.len();
    for (p, (_, mut job)) in jobs.into_iter().enumerate() {
        let tx = ev_tx.clone();
        let forward: Arc<dyn Fn(TokenEvent) -> bool + Send + Sync> =
            Arc::new(move |e: TokenEvent| tx.send(Msg::Token(p, e)).is_ok());
        job.on_token = Some(metrics.sink(arrival, job.seeds.len(), Some(forward)));
        let tx = ev_tx.clone();
        engine.submit(job, move |r| {
            let _ = tx.send(Msg::Done(r));
        });
    }
    drop(ev_tx);
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(drive(ev_rx, out_tx, spec, prompts, tok));
    let body = Body::from_stream(futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx))
    }));
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The byte length of `text` that is final: everything but a trailing
/// replacement character (a token ending inside a character) and, while
/// the sample runs, the last `hold` characters (a stop string's possible
/// beginning).
fn settled(text: &str, hold: usize, finished: bool) -> usize {
    let mut end = text.len();
    if finished {
        return end;
    }
    let mut chars = text.char_indices().rev();
    for _ in 0..hold {
        match chars.next() {
            Some((i, _)) => end = i,
            None => return 0,
        }
    }
    while text[..end].ends_with('\u{FFFD}') {
        end -= '\u{FFFD}'.len_utf8();
    }
    end
}

async fn drive(
    mut rx: mpsc::UnboundedReceiver<Msg>,
    out: mpsc::Sender<Bytes>,
    spec: Spec,
    prompts: usize,
    tok: Arc<Tokenizer>,
) {
    let object = match spec.kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let head = |choices: Value| json!({"id": spec.id, "object": object, "created": spec.created, "model": spec.model, "choices": choices});
    let mut states: Vec<ChoiceState> = (0..prompts * spec.n).map(|_| ChoiceState::default()).collect();
    if spec.kind == Kind::Chat {
        for c in 0..states.len() {
            let first = head(json!([{
                "index": c, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null
            }]));
            if out.send(event(&first)).await.is_err() {
                return;
            }
        }
    }
    let hold = spec.stops.iter().map(|s| s.chars().count()).max().unwrap_or(1) - 1;
    let (mut done, mut completion_tokens, mut version) = (0, 0usize, String::new());
    while let Some(msg) = rx.recv().await {
        let (p, e) = match msg {
            Msg::Token(p, e) => (p, e),
            Msg::Done(Ok(o)) => {
                completion_tokens += o.generations.iter().map(|g| g.token_ids.len()).sum::<usize>();
                if version.is_empty() {
                    version = o.weight_version;
                }
                done += 1;
                if done == prompts {
                    break;
                }
                continue;
            }
            Msg::Done(Err(e)) => {
                let err =
                    json!({"error": {"message": e.to_string(), "type": "server_error", "param": null, "code": 503}});
                let _ = out.send(event(&err)).await;
                break;
            }
        };
        let c = p * spec.n + e.sample;
        let s = &mut states[c];
        if s.finished {
            continue;
        }
        s.ids.push(e.token);
        // The last token is the EOS or stop id when the engine ended on one.
        let body = match e.finish {
            Some(f) if f != FinishReason::Length => &s.ids[..s.ids.len() - 1],
            _ => &s.ids[..],
        };
        let mut text = tok.decode(body, true).unwrap_or_default();
        let cut = spec.stops.iter().filter_map(|stop| text.find(stop.as_str())).min();
        if let Some(cut) = cut {
            text.truncate(cut);
        }
        let finish = match (cut, e.finish) {
            (Some(_), _) => Some("stop"),
            (None, Some(FinishReason::Length)) => Some("length"),
            (None, Some(_)) => Some("stop"),
            (None, None) => None,
        };
        s.finished = finish.is_some();
        let end = settled(&text, hold, s.finished);
        let delta = if end > s.sent && text.is_char_boundary(s.sent) { &text[s.sent..end] } else { "" };
        s.sent = s.sent.max(end);
        let piece = tok.decode(&[e.token], false).unwrap_or_default();
        let lp = f64::from(if spec.mode == LogprobsMode::Processed { e.logprob } else { e.model_logprob });
        let choice = match spec.kind {
            Kind::Completion => {
                let logprobs = spec.logprobs.then(|| {
                    let name = |t: u32| {
                        if spec.tokens_as_ids {
                            format!("token_id:{t}")
                        } else {
                            tok.decode(&[t], false).unwrap_or_default()
                        }
                    };
                    let top: serde_json::Map<String, Value> =
                        e.top.iter().map(|&(t, l)| (name(t), json!(f64::from(l)))).collect();
                    json!({
                        "tokens": [name(e.token)], "token_logprobs": [lp],
                        "top_logprobs": if e.top.is_empty() { Value::Null } else { json!([top]) },
                        "text_offset": [s.offset],
                    })
                });
                json!({"index": c, "text": delta, "logprobs": logprobs, "finish_reason": finish, "token_ids": [e.token]})
            }
            Kind::Chat => {
                let logprobs = spec.logprobs.then(|| {
                    let top: Vec<Value> = e
                        .top
                        .iter()
                        .map(|&(t, l)| {
                            let text = tok.decode(&[t], false).unwrap_or_default();
                            json!({"token": text, "logprob": f64::from(l), "bytes": token_bytes(&tok, t)})
                        })
                        .collect();
                    json!({"content": [{
                        "token": piece, "logprob": lp, "bytes": token_bytes(&tok, e.token), "top_logprobs": top
                    }]})
                });
                json!({"index": c, "delta": {"content": delta}, "logprobs": logprobs, "finish_reason": finish, "token_ids": [e.token]})
            }
        };
        s.offset += piece.len();
        let mut chunk = head(json!([choice]));
        if finish.is_some() {
            chunk["weight_version"] = json!(e.weight_version);
        }
        if out.send(event(&chunk)).await.is_err() {
            return; // the client went away: the engine frees its rows
        }
    }
    if spec.include_usage {
        let mut usage = head(json!([]));
        usage["usage"] = json!({
            "prompt_tokens": spec.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": spec.prompt_tokens + completion_tokens,
        });
        usage["weight_version"] = json!(version);
        if out.send(event(&usage)).await.is_err() {
            return;
        }
    }
    let _ = out.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
}

/// GPT-2's byte-level alphabet read backwards: the byte a character of a
/// byte-level BPE token stands for.
fn byte_of(c: char) -> Option<u8> {
    let u = c as u32;
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    if u < 256 && printable(u) {
        return Some(u as u8);
    }
    // The other bytes are 256, 257, … in byte order.
    let k = u.checked_sub(256)?;
    (0u32..256).filter(|&b| !printable(b)).nth(k as usize).map(|b| b as u8)
}

/// A token's UTF-8 bytes (OpenAI's `bytes`): its text where that is whole
/// characters; for a byte-level BPE piece of a character, the bytes its
/// vocabulary entry stands for; SentencePiece's `<0xNN>` byte tokens.
pub(crate) fn token_bytes(tok: &Tokenizer, id: u32) -> Option<Vec<u8>> {
    let text = tok.decode(&[id], false).ok()?;
    if !text.contains('\u{FFFD}') {
        return Some(text.into_bytes());
    }
    let piece = tok.id_to_token(id)?;
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
        return u8::from_str_radix(hex, 16).ok().map(|b| vec![b]);
    }
    piece.chars().map(byte_of).collect()
}

#[cfg(test)]
mod tests {
    use super::settled;

    #[test]
    fn text_is_held_back_only_where_it_may_still_change() {
        assert_eq!(settled("abc", 0, false), 3);
        assert_eq!(settled("abc", 2, false), 1);
        assert_eq!(settled("ab", 5, false), 0);
        assert_eq!(settled("ab\u{FFFD}", 0, false), 2);
        assert_eq!(settled("ab\u{FFFD}", 0, true), "ab\u{FFFD}".len());
        assert_eq!(settled("héllo", 2, false), "hél".len());
    }
}
