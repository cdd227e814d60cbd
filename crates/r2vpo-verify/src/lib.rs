//! # r2vpo-verify — math answer verification
//!
//! The reward of RL with verifiable rewards: whether a model's response
//! states the gold answer. r2vpo's LLM training, `r2vpo llm eval` and
//! `r2vpo llm verify` use it; it depends on nothing but `serde`, so any
//! Rust program can score responses with it.
//!
//! ```
//! use r2vpo_verify::{reward, verify, Reason, VerifyConfig};
//!
//! let cfg = VerifyConfig::default();
//! let v = verify("<think>…</think> The area is \\boxed{\\dfrac{3}{4}}.", "0.75", &cfg);
//! assert!(v.correct);
//! assert_eq!(v.extracted.as_deref(), Some("\\dfrac{3}{4}"));
//! assert_eq!(v.reason, Reason::NumericMatch);
//!
//! // DAPO-Math-17k's "Answer:" line, rewarded ±1.
//! let dapo = VerifyConfig::dapo();
//! assert_eq!(reward("…\nAnswer: 204", "204", &dapo), 1.0);
//! assert_eq!(reward("…\nAnswer: 205", "204", &dapo), -1.0);
//! ```
//!
//! The crate's README holds a table of verdicts that its tests check row by
//! row. Three steps, each inspectable through a [`Verdict`]:
//!
//! 1. **Extraction** ([`extract_answer`]): optionally drop the `<think>` block,
//!    then take the answer in the dataset's [`AnswerFormat`]: the last
//!    `\boxed{}`, the DAPO "Answer:" line, or the last plain number.
//! 2. **Normalisation**: LaTeX and text clean-up (wrappers, `\text{}`, units,
//!    degrees, percent, thousands separators, `\left`/`\right`, `\dfrac`,
//!    shorthand `\frac12`, assignments `x = 5`, trailing periods, spaces).
//! 3. **Equivalence** ([`is_equivalent`]): the normalised strings are read as
//!    numbers (exact rationals where possible, else `f64` via a bounded
//!    evaluator covering radicals and π), tuples and intervals (ordered,
//!    bracket types significant), sets and unions (unordered) or comma lists
//!    (unordered by default), and compared; anything else compares as text.
//!
//! Decisions worth knowing when reading rewards:
//!
//! - **Tolerance.** Two exact rationals (integers, decimals, fractions) must
//!   be exactly equal, so `0.333` ≠ `1/3` and large integers never collide.
//!   When either side is irrational or too large for `i128`, numbers are equal
//!   when `|a − b| ≤ max(rel_tol·max(|a|,|b|), abs_tol)` (defaults 1e-6 and
//!   1e-9; the absolute floor makes 0 comparable).
//! - **Percent.** `%`, `\%` and "percent" are removed, so `50\%` = `50`. When
//!   exactly one side carried a percent mark, the value divided by 100 is also
//!   accepted (`50\%` = `0.5`), as math-verify does; turn this off with
//!   [`VerifyConfig::percent_as_fraction`].
//! - **Comma lists.** `1, 2` is a list of answers and matches `2, 1`
//!   (order-insensitive; see [`VerifyConfig::unordered_lists`]) and the set
//!   `\{1, 2\}`; it never matches the tuple `(1, 2)`. A comma followed by
//!   exactly three digits with no space in an otherwise plain number is a
//!   thousands separator (`1,000` = `1000`, `1,234` is one number), the
//!   convention of the Minerva normaliser.
//! - **Mixed numbers.** `2\frac{1}{2}` is 5/2, not 2 × 1/2.
//! - **Factorials, powers, scientific notation.** These are read whole and
//!   never truncated to a number inside them. `5!` is 120 (a trailing `!` is
//!   not punctuation: dropping it made `\boxed{5!}` equal 5) and `1e3` is
//!   1000. Well-formed arithmetic without a finite value (`9^{9^{9^{9}}}`,
//!   `1e999999`, `171!`, the ambiguous `5!!`) is still a whole answer, but it
//!   matches only the identical normalised expression: it is never read as
//!   one of its numbers (`1e999999` ≠ 999999), and two such values are never
//!   compared numerically. The sound choice, since an evaluation that gave up
//!   must not turn into a reward.
//! - **Limits.** Answers or gold longer than [`VerifyConfig::max_input_chars`]
//!   are rejected, evaluation depth and exponents are bounded, and nothing
//!   panics: a verifier that crashes or hangs inside a rollout worker turns
//!   into silent zero rewards, the failure verl hit with math-verify.
//! - **Not done.** No symbolic algebra: `x+1` and `1+x` are different texts.
//!
//! For bit-exact parity with verl's `math_dapo` reward, set
//! [`VerifyConfig::equivalence`] to [`Equivalence::MinervaExact`].

#![warn(missing_docs)]

mod equiv;
mod expr;
pub mod extract;
mod minerva;
mod normalize;
mod num;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use extract::{answer_line, last_boxed, last_math_span, last_number, strip_think};

/// Where a dataset's responses put their final answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnswerFormat {
    /// The last `\boxed{…}` / `\fbox{…}` (MATH-style prompts).
    Boxed,
    /// The last "Answer: …" line (DAPO-Math-17k's prompt, verl `math_dapo`).
    AnswerLine,
    /// The last plain number (built-in arithmetic tasks).
    LastNumber,
    /// Boxed, else the Answer line, else the whole text if it reads as a
    /// mathematical value (so a bare `\frac{1}{2}` passed on the command line
    /// works), else the last `$…$` span if it reads as one, else the last
    /// number.
    #[default]
    Auto,
}

/// How extracted answers are compared with the gold answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Equivalence {
    /// Normalisation plus numeric and structural equivalence (this crate).
    #[default]
    Math,
    /// verl `math_dapo`: Minerva string normalisation, then exact string
    /// equality. For reproducing DAPO numbers, not for general use.
    MinervaExact,
}

/// Everything that decides a reward; `Default` suits most datasets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VerifyConfig {
    /// Where the answer sits in a response.
    pub format: AnswerFormat,
    /// Drop everything up to the last `</think>` before extracting; a
    /// response with an unclosed `<think>` then has no answer.
    pub strip_think: bool,
    /// Characters at the end of the response searched for the "Answer:" line;
    /// `Some(300)` matches verl, `None` searches everything.
    pub answer_line_window: Option<usize>,
    /// Comparison rules.
    pub equivalence: Equivalence,
    /// Relative tolerance for inexact numbers.
    pub rel_tol: f64,
    /// Absolute tolerance floor, so answers near zero can match.
    pub abs_tol: f64,
    /// Accept `p%` for `p/100` when only one side has a percent mark.
    pub percent_as_fraction: bool,
    /// Bare comma lists ignore order (sets always do, tuples never do).
    pub unordered_lists: bool,
    /// Longer extracted answers or gold strings are rejected unverified.
    pub max_input_chars: usize,
    /// When the gold answer is a plain number, accept only a plain number:
    /// an answer that still holds arithmetic (`92 + 35` for 127) is wrong
    /// even though it evaluates to the gold value. Arithmetic tasks need
    /// this, or restating the question earns the reward: GRPO on the
    /// built-in task learned exactly that (see `results/llm/README.md`).
    /// Off by default, as math benchmarks accept equivalent expressions.
    pub require_literal_answer: bool,
    /// Reward for a correct answer.
    pub correct_reward: f64,
    /// Reward for a wrong or missing answer.
    pub incorrect_reward: f64,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        Self {
            format: AnswerFormat::Auto,
            strip_think: true,
            answer_line_window: Some(300),
            equivalence: Equivalence::Math,
            rel_tol: 1e-6,
            abs_tol: 1e-9,
            percent_as_fraction: true,
            unordered_lists: true,
            max_input_chars: 1000,
            require_literal_answer: false,
            correct_reward: 1.0,
            incorrect_reward: 0.0,
        }
    }
}

impl VerifyConfig {
    /// DAPO-Math-17k: "Answer:" line in the last 300 characters, reward ±1,
    /// with this crate's equivalence (use [`Equivalence::MinervaExact`] for
    /// verl's exact string match).
    pub fn dapo() -> Self {
        Self { format: AnswerFormat::AnswerLine, incorrect_reward: -1.0, ..Self::default() }
    }

    /// MATH-style `\boxed{}` answers, reward 1/0.
    pub fn boxed() -> Self {
        Self { format: AnswerFormat::Boxed, ..Self::default() }
    }
}

/// Why a verdict came out the way it did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum Reason {
    /// The normalised strings are identical.
    StringMatch,
    /// Both are numbers and equal (exactly, or within tolerance).
    NumericMatch,
    /// Equal once the percent-marked side is divided by 100.
    PercentMatch,
    /// Tuples, intervals, sets, unions or lists with matching elements.
    StructuralMatch,
    /// Equal after verl's Minerva normalisation ([`Equivalence::MinervaExact`]).
    MinervaMatch,
    /// The response holds no answer in the configured format.
    NoAnswer,
    /// The gold answer is empty after normalisation: a data problem, reported
    /// rather than silently scored.
    EmptyGold,
    /// Answer or gold exceeds [`VerifyConfig::max_input_chars`].
    TooLong,
    /// Not equivalent; the text says how they differ.
    Mismatch(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::StringMatch => write!(f, "normalised strings are identical"),
            Reason::NumericMatch => write!(f, "numerically equal"),
            Reason::PercentMatch => write!(f, "equal reading the percentage as a fraction"),
            Reason::StructuralMatch => write!(f, "same structure, elements equal"),
            Reason::MinervaMatch => write!(f, "equal after Minerva normalisation"),
            Reason::NoAnswer => write!(f, "no answer found in the response"),
            Reason::EmptyGold => write!(f, "gold answer is empty after normalisation"),
            Reason::TooLong => write!(f, "answer or gold longer than max_input_chars"),
            Reason::Mismatch(why) => write!(f, "mismatch: {why}"),
        }
    }
}

/// The full outcome of one verification, for rewards and for debugging them
/// (`r2vpo llm verify` prints it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Whether the answer counts as correct.
    pub correct: bool,
    /// The extracted answer (`None` if extraction found nothing).
    pub extracted: Option<String>,
    /// The answer after normalisation.
    pub normalized_answer: String,
    /// The gold answer after normalisation.
    pub normalized_gold: String,
    /// How the normalised answer was read (`1/2`, `≈1.414…`, `[1, 3)`, `text "x"`).
    pub parsed_answer: String,
    /// How the normalised gold was read.
    pub parsed_gold: String,
    /// Why the verdict is what it is.
    pub reason: Reason,
}

impl Verdict {
    /// The reward this verdict earns under `cfg`.
    pub fn reward(&self, cfg: &VerifyConfig) -> f64 {
        if self.correct {
            cfg.correct_reward
        } else {
            cfg.incorrect_reward
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "verdict:           {}", if self.correct { "CORRECT" } else { "INCORRECT" })?;
        writeln!(f, "reason:            {}", self.reason)?;
        writeln!(f, "extracted:         {}", self.extracted.as_deref().unwrap_or("<none>"))?;
        writeln!(f, "normalised answer: {}", self.normalized_answer)?;
        writeln!(f, "normalised gold:   {}", self.normalized_gold)?;
        writeln!(f, "parsed answer:     {}", self.parsed_answer)?;
        write!(f, "parsed gold:       {}", self.parsed_gold)
    }
}

fn too_long(s: &str, cfg: &VerifyConfig) -> bool {
    s.chars().nth(cfg.max_input_chars).is_some()
}

/// Extracts the final answer from a full response per `cfg.format`.
///
/// ```
/// use r2vpo_verify::{extract_answer, VerifyConfig};
///
/// let cfg = VerifyConfig::default();
/// // The last box after the reasoning block counts; boxes inside it do not.
/// let text = "<think>maybe \\boxed{3}</think> so \\boxed{4}";
/// assert_eq!(extract_answer(text, &cfg).as_deref(), Some("4"));
/// // An unclosed reasoning block has no answer.
/// assert_eq!(extract_answer("<think>still \\boxed{4}", &cfg), None);
/// ```
pub fn extract_answer(response: &str, cfg: &VerifyConfig) -> Option<String> {
    let text = if cfg.strip_think { strip_think(response) } else { response };
    let found = match cfg.format {
        AnswerFormat::Boxed => last_boxed(text),
        AnswerFormat::AnswerLine => answer_line(text, cfg.answer_line_window),
        AnswerFormat::LastNumber => last_number(text),
        AnswerFormat::Auto => {
            let explicit = last_boxed(text).or_else(|| answer_line(text, cfg.answer_line_window));
            if explicit.is_none() {
                let whole = text.trim();
                if reads_as_math(whole, cfg) {
                    return Some(whole.to_string());
                }
                if let Some(span) = last_math_span(text).filter(|m| reads_as_math(m, cfg)) {
                    return Some(span);
                }
            }
            explicit.or_else(|| last_number(text))
        }
    };
    found.map(str::to_string)
}

/// Whether `s` is short enough and normalises to a value with no text parts
/// (arithmetic too large to evaluate counts: it is still one whole answer).
fn reads_as_math(s: &str, cfg: &VerifyConfig) -> bool {
    !s.is_empty() && !too_long(s, cfg) && equiv::parse_value(&normalize::normalize(s).text).is_mathematical()
}

/// Normalises an answer the way [`is_equivalent`] does (inputs longer than
/// `max_input_chars` of the default config are cut there first).
///
/// ```
/// assert_eq!(r2vpo_verify::normalize_answer("\\text{ } 90^\\circ."), "90");
/// ```
pub fn normalize_answer(answer: &str) -> String {
    let limit = VerifyConfig::default().max_input_chars;
    let cut: String = answer.chars().take(limit).collect();
    normalize::normalize(&cut).text
}

/// Compares an already-extracted answer with the gold answer.
///
/// ```
/// use r2vpo_verify::{is_equivalent, VerifyConfig};
///
/// let cfg = VerifyConfig::default();
/// assert!(is_equivalent("2, 1", "\\{1, 2\\}", &cfg).correct); // a list is a set
/// assert!(!is_equivalent("(2, 1)", "(1, 2)", &cfg).correct); // a tuple is ordered
/// assert!(!is_equivalent("0.333", "\\frac{1}{3}", &cfg).correct); // rationals are exact
/// ```
pub fn is_equivalent(answer: &str, gold: &str, cfg: &VerifyConfig) -> Verdict {
    let mut v = Verdict {
        correct: false,
        extracted: Some(answer.to_string()),
        normalized_answer: String::new(),
        normalized_gold: String::new(),
        parsed_answer: String::new(),
        parsed_gold: String::new(),
        reason: Reason::TooLong,
    };
    if too_long(answer, cfg) || too_long(gold, cfg) {
        return v;
    }
    if cfg.equivalence == Equivalence::MinervaExact {
        v.normalized_answer = minerva::normalize_final_answer(answer);
        v.normalized_gold = minerva::normalize_final_answer(gold);
        v.correct = v.normalized_answer == v.normalized_gold;
        v.reason = if v.normalized_gold.is_empty() {
            v.correct = false;
            Reason::EmptyGold
        } else if v.correct {
            Reason::MinervaMatch
        } else {
            Reason::Mismatch("Minerva-normalised strings differ".to_string())
        };
        return v;
    }
    let a = normalize::normalize(answer);
    let g = normalize::normalize(gold);
    let va = equiv::parse_value(&a.text);
    let vg = equiv::parse_value(&g.text);
    v.normalized_answer = a.text;
    v.normalized_gold = g.text;
    v.parsed_answer = va.to_string();
    v.parsed_gold = vg.to_string();
    let tol = equiv::Tolerance { rel: cfg.rel_tol, abs: cfg.abs_tol, unordered_lists: cfg.unordered_lists };
    v.reason = if v.normalized_gold.is_empty() {
        Reason::EmptyGold
    } else if v.normalized_answer.is_empty() {
        Reason::Mismatch("answer is empty after normalisation".to_string())
    } else if cfg.require_literal_answer
        && is_number_literal(&v.normalized_gold)
        && !is_number_literal(&v.normalized_answer)
    {
        Reason::Mismatch("the answer is an expression, not a number (require_literal_answer)".to_string())
    } else if v.normalized_answer == v.normalized_gold {
        v.correct = true;
        Reason::StringMatch
    } else if equiv::equal(&va, &vg, tol) {
        v.correct = true;
        match va {
            equiv::Value::Num(_) => Reason::NumericMatch,
            equiv::Value::Text(_) | equiv::Value::Unevaluated { .. } => Reason::StringMatch,
            _ => Reason::StructuralMatch,
        }
    } else if cfg.percent_as_fraction && a.percent != g.percent && percent_scaled_equal(&va, &vg, a.percent, tol) {
        v.correct = true;
        Reason::PercentMatch
    } else {
        Reason::Mismatch(equiv::explain_mismatch(&va, &vg))
    };
    v
}

/// A plain decimal number: optional sign, digits, at most one decimal point.
fn is_number_literal(s: &str) -> bool {
    let t = s.trim();
    let t = t.strip_prefix(['-', '+']).unwrap_or(t);
    let mut digits = 0usize;
    let mut points = 0usize;
    for c in t.chars() {
        match c {
            '0'..='9' => digits += 1,
            '.' => points += 1,
            _ => return false,
        }
    }
    digits > 0 && points <= 1
}

/// `p%` against `p/100`, with `answer_has_percent` saying which side to scale.
fn percent_scaled_equal(a: &equiv::Value, g: &equiv::Value, answer_has_percent: bool, tol: equiv::Tolerance) -> bool {
    let (Some(x), Some(y)) = (a.as_num(), g.as_num()) else { return false };
    let hundred = num::Num::int(100);
    let (x, y) = if answer_has_percent { (x.div(hundred), Ok(y)) } else { (Ok(x), y.div(hundred)) };
    matches!((x, y), (Ok(x), Ok(y)) if x.close_to(y, tol.rel, tol.abs))
}

/// Extracts the answer from a full response and compares it with `gold`.
///
/// This is what `r2vpo llm verify --answer … --gold …` prints: with the
/// default [`AnswerFormat::Auto`], `--answer` may be a whole response or a
/// bare answer.
pub fn verify(response: &str, gold: &str, cfg: &VerifyConfig) -> Verdict {
    match extract_answer(response, cfg) {
        Some(answer) => is_equivalent(&answer, gold, cfg),
        None => {
            let cut: String = gold.chars().take(cfg.max_input_chars).collect();
            let g = match cfg.equivalence {
                Equivalence::Math => normalize::normalize(&cut).text,
                Equivalence::MinervaExact => minerva::normalize_final_answer(&cut),
            };
            Verdict {
                correct: false,
                extracted: None,
                parsed_gold: equiv::parse_value(&g).to_string(),
                normalized_gold: g,
                normalized_answer: String::new(),
                parsed_answer: String::new(),
                reason: Reason::NoAnswer,
            }
        }
    }
}

/// The scalar reward for a response: `cfg.correct_reward` or
/// `cfg.incorrect_reward` (1/0 by default, ±1 for [`VerifyConfig::dapo`]).
pub fn reward(response: &str, gold: &str, cfg: &VerifyConfig) -> f64 {
    verify(response, gold, cfg).reward(cfg)
}

#[cfg(test)]
mod tests;
