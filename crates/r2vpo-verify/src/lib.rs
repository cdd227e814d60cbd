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
//!   be exactly equal, so `0.333` ≠ `1/3`, and integers of any size compare
//!   digit by digit. A terminating decimal never equals an irrational value
//!   (`3.14159` ≠ `\pi`; see [`VerifyConfig::accept_decimal_approximation`]).
//!   Otherwise, when either side is irrational, numbers are equal when
//!   `|a − b| ≤ max(rel_tol·max(|a|,|b|), abs_tol)` (defaults 1e-6 and
//!   1e-9; the absolute floor makes 0 comparable).
//! - **Expressions and relations.** Expressions in variables are equal when
//!   they agree at eight fixed points (`x+1` = `1+x`, `\frac{x^2-1}{x-1}` =
//!   `x+1`, `2\sin x\cos x` = `\sin 2x`); equations and inequalities when
//!   one's `right − left` is a constant multiple of the other's, positive for
//!   inequalities (`x \le 5` = `5 \ge x`, `2x-y+1=0` = `y-2x-1=0`). An
//!   inequality in one variable equals its interval (`1 \le x < 3` =
//!   `[1, 3)`).
//! - **Structures.** Matrices (`pmatrix`, `bmatrix`, `array`) compare cell by
//!   cell, and a one-column matrix equals the tuple of its entries. Labelled
//!   parts compare by name (`a=2, b=3` = `(a,b)=(2,3)`), and against plain
//!   parts in the order named. `a \pm b` is the list `a+b, a-b`. Several
//!   boxes joined only by "and", commas or part labels are one list answer.
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
//! - **Echoes.** An unevaluated expression (`\sqrt{49}`) against a plain
//!   number is wrong when the response already wrote it before the answer:
//!   the question restated. And by default an answer that is arithmetic on
//!   numbers left undone (`17 \times 23` for 391) is wrong whether or not
//!   the response wrote it before
//!   ([`VerifyConfig::refuse_undone_arithmetic`]);
//!   [`VerifyConfig::require_literal_answer`] goes further and wants a
//!   plain number in lowest terms whenever the gold is one.
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

pub use extract::{
    answer_line, answer_phrase, clean_answer, final_boxed, last_boxed, last_math_span, last_number, strip_think,
};

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
    /// Accept a terminating decimal within tolerance of an irrational gold
    /// (`3.14159` for `\pi`). Off by default: a decimal is rational, so it
    /// is an approximation however many digits it has, and graders of
    /// exact-answer benchmarks mark it wrong.
    pub accept_decimal_approximation: bool,
    /// Bare comma lists ignore order (sets always do, tuples never do).
    pub unordered_lists: bool,
    /// Longer extracted answers or gold strings are rejected unverified.
    pub max_input_chars: usize,
    /// When the gold answer is a plain number, accept only a plain number
    /// (a decimal, or a fraction in lowest terms): an answer that still
    /// holds arithmetic (`92 + 35`, `\sqrt{49}`, `\frac{254}{2}` for 127)
    /// is wrong even though it evaluates to the gold value, since
    /// restating the question earns the reward otherwise: GRPO on the
    /// built-in task learned exactly that (see `results/llm/README.md`).
    /// An equation chain is judged by its last side (`x = 10 - 3 = 7`).
    /// Off by default, as math benchmarks accept equivalent expressions
    /// (`2^{100}`, `\frac{2}{4}`); the arithmetic training configs turn it
    /// on. Without it, [`verify`] still refuses an answer that restates an
    /// expression written earlier in the response.
    pub require_literal_answer: bool,
    /// When the gold answer is a plain number, refuse an answer that is
    /// arithmetic on numbers left undone (`17 \times 23`, `\frac{1}{2} +
    /// \frac{1}{3}`, `5!`, `\sqrt{49}`) even though it evaluates to the
    /// gold value: a reward that does the policy's arithmetic for it can be
    /// earned without solving anything, and graders of exact-answer
    /// benchmarks mark an unfinished computation wrong. Unlike
    /// [`VerifyConfig::require_literal_answer`], every way of writing one
    /// number still counts: unreduced fractions (`\frac{28}{6}`), mixed
    /// numbers (`4\frac{2}{3}`), signs and parentheses, scientific
    /// notation and powers of integers (`2^{100}`, the usual final form of
    /// a large count). On by default; math-verify evaluates
    /// such answers (the differences are allow-listed in the differential
    /// test).
    pub refuse_undone_arithmetic: bool,
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
            accept_decimal_approximation: false,
            unordered_lists: true,
            max_input_chars: 1000,
            require_literal_answer: false,
            refuse_undone_arithmetic: true,
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
    /// Tuples, intervals, sets, unions, lists, matrices or labelled parts
    /// with matching elements.
    StructuralMatch,
    /// Expressions in variables, or equations and inequalities, that agree
    /// at every test point.
    SymbolicMatch,
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
            Reason::SymbolicMatch => write!(f, "equal as expressions or relations at every test point"),
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
    // verl parity (`MinervaExact`) sees exactly what verl captures; the math
    // equivalence reads answers the way models phrase them: joined boxes,
    // and an answer line without its prose ("The final answer is $5$. I
    // hope it is correct.").
    let math = cfg.equivalence == Equivalence::Math;
    let boxed = || if math { final_boxed(text) } else { last_boxed(text).map(str::to_string) };
    let line = || {
        answer_line(text, cfg.answer_line_window)
            .map(|l| if math { extract::clean_answer(l) } else { l.to_string() })
            .filter(|l| !l.is_empty())
    };
    match cfg.format {
        AnswerFormat::Boxed => boxed(),
        AnswerFormat::AnswerLine => line(),
        AnswerFormat::LastNumber => last_number(text).map(str::to_string),
        AnswerFormat::Auto => boxed().or_else(line).or_else(|| {
            let whole = text.trim();
            if reads_as_math(whole, cfg) {
                return Some(whole.to_string());
            }
            // "The answer is 12." or "the answer is no", but not "the answer
            // is determined by the equation itself": prose is no answer, and
            // a number later in the text may be.
            if let Some(p) = answer_phrase(text).filter(|p| {
                p.chars().count() <= MAX_PHRASE_ANSWER
                    && (reads_as_math(p, cfg) || p.split_whitespace().count() <= MAX_PHRASE_WORDS)
            }) {
                return Some(p);
            }
            if let Some(span) = last_math_span(text).filter(|m| reads_as_math(m, cfg) || bound_on_one_unknown(m)) {
                return Some(span);
            }
            last_number(text).map(str::to_string)
        }),
    }
}

/// A "the answer is …" sentence longer than this is prose, not an answer.
const MAX_PHRASE_ANSWER: usize = 100;

/// Words a "the answer is …" answer that does not read as mathematics may
/// have (`no`, `\textbf{(B)}`, `x = 5 \text{ or } 7`): more is a sentence.
const MAX_PHRASE_WORDS: usize = 3;

/// Whether `s` is short enough and normalises to a value with no text parts
/// (arithmetic too large to evaluate counts: it is still one whole answer).
fn reads_as_math(s: &str, cfg: &VerifyConfig) -> bool {
    !s.is_empty() && !too_long(s, cfg) && equiv::parse_value(&normalize::normalize(s).text).is_mathematical()
}

/// `y \leq 4`, `t \neq 4`: an inequality between one unknown and a number,
/// a whole answer when it is the last math a response writes ("Thus $y
/// \leq 4$ is the solution."), where its number alone would be a different
/// answer. Equations are left to the number (`x = 3` reads as 3).
fn bound_on_one_unknown(s: &str) -> bool {
    let n = normalize::normalize(s).text;
    match equiv::parse_value(&n) {
        equiv::Value::Relation { sides, ops } => {
            let unknown = |t: &str| t.len() <= 2 && t.chars().all(|c| c.is_ascii_alphabetic());
            let number = |t: &str| equiv::parse_value(t).as_num().is_some();
            sides.len() == 2
                && ops.iter().all(|o| !matches!(o, equiv::Rel::Eq))
                && (unknown(&sides[0]) && number(&sides[1]) || number(&sides[0]) && unknown(&sides[1]))
        }
        _ => false,
    }
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
    let mut a = normalize::normalize(answer);
    let mut g = normalize::normalize(gold);
    // `A:B=3:8`, `|PQ|=5`: a gold that names what its value is, against an
    // answer that gives only the value.
    if let Some(value) = labelled_gold_value(&g.text).filter(|_| !is_relation_text(&a.text)) {
        g.text = value;
    }
    let vg = equiv::parse_value(&g.text);
    // `m + n = 47`, `x = 10 - 3 = 7`: against a bare value, an equation
    // chain states its last side.
    if vg.as_num().is_some() || is_ratio(&g.text) {
        if let Some(last) = equiv::equation_result(&a.text) {
            a.text = last;
        }
    }
    // `3,25` or `12,5 km` against one number: a decimal comma, where a
    // thousands reading is impossible (not exactly three digits after the
    // comma). Only as written, with no space after the comma: `2, 5` lists
    // two answers (normalisation drops that space, so the raw answer is
    // asked). Against a list gold the comma still separates answers, and
    // `1,250` stays one thousand two hundred and fifty.
    if vg.as_num().is_some() && !comma_then_space(answer) {
        if let Some(decimal) = decimal_comma_number(&a.text) {
            a.text = decimal;
        }
    }
    // `\textbf{(C)}\ 12` against the value `12`: the choice's value is the
    // answer (a letter gold is judged by `choice_against_letter`).
    if let Some(value) = choice_value(&a.text).filter(|_| choice_label(&g.text).is_none() && !is_choice_letter(&g.text))
    {
        a.text = value.to_string();
    }
    let mut va = equiv::parse_value(&a.text);
    let mut vg = vg;
    // An equation against an assignment (`2x - y + 1 = 0` against
    // `y = 2x+1`): the assignment, read whole, is an equation too.
    let is_relation = |v: &equiv::Value| matches!(v, equiv::Value::Relation { .. });
    let read_whole = |s: &str| Some(equiv::parse_value(&normalize::normalize_with(s, false).text)).filter(is_relation);
    match (is_relation(&va), is_relation(&vg)) {
        (true, false) => vg = read_whole(gold).unwrap_or(vg),
        (false, true) => va = read_whole(answer).unwrap_or(va),
        _ => {}
    }
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
    } else if cfg.refuse_undone_arithmetic
        && is_number_literal(&v.normalized_gold)
        && undone_arithmetic(&v.normalized_answer)
    {
        Reason::Mismatch(
            "arithmetic left undone: the answer still computes a number (refuse_undone_arithmetic)".to_string(),
        )
    } else if v.normalized_answer == v.normalized_gold {
        v.correct = true;
        Reason::StringMatch
    } else if let (Some(x), Some(y)) = (integer_digits(&v.normalized_answer), integer_digits(&v.normalized_gold)) {
        // Integers of any size compare digit by digit, never in floating
        // point, where two 40-digit integers one apart are "equal".
        v.correct = x == y;
        if v.correct {
            Reason::NumericMatch
        } else {
            Reason::Mismatch(format!("integers differ: {x} vs {y}"))
        }
    } else if !cfg.accept_decimal_approximation
        && (decimal_against_irrational(&v.normalized_answer, &vg)
            || decimal_against_irrational(&v.normalized_gold, &va))
    {
        Reason::Mismatch("a terminating decimal is rational and never equals an irrational value".to_string())
    } else if let Some(letter) = choice_against_letter(&v.normalized_answer, &v.normalized_gold) {
        v.correct = letter;
        if letter {
            Reason::StringMatch
        } else {
            Reason::Mismatch("a different choice".to_string())
        }
    } else if equiv::equal(&va, &vg, tol) {
        v.correct = true;
        match va {
            equiv::Value::Num(_) => Reason::NumericMatch,
            equiv::Value::Text(_) | equiv::Value::Unevaluated { .. } => Reason::StringMatch,
            equiv::Value::Expr { .. } | equiv::Value::Relation { .. } => Reason::SymbolicMatch,
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

/// The value of a gold written as a labelled equation (`A:B=3:8` → `3:8`,
/// `|PQ|=5` → `5`): one `=`, a left side that only names (letters, bars,
/// colons, no digits or operators) and a right side without unknowns. An
/// equation in unknowns (`x + y = 5`, `y = 2x + 1`) is not a label.
fn labelled_gold_value(gold: &str) -> Option<String> {
    let (lhs, rhs) = gold.split_once('=')?;
    let (lhs, rhs) = (lhs.trim(), rhs.trim());
    if rhs.contains('=') || lhs.is_empty() || rhs.is_empty() || lhs.len() > 16 || is_relation_text(rhs) {
        return None;
    }
    let names_only = lhs.chars().all(|c| c.is_ascii_alphabetic() || matches!(c, '|' | ':' | ' ' | '\\' | '{' | '}'))
        && lhs.chars().any(|c| c.is_ascii_alphabetic());
    // A plain assignment `x = 5` is the normaliser's (it strips those).
    let single_name = lhs.chars().filter(char::is_ascii_alphabetic).count() == 1 && !lhs.contains(['|', ':']);
    let value = equiv::parse_value(rhs);
    (names_only && !single_name && (value.is_mathematical() || is_ratio(rhs))).then(|| rhs.to_string())
}

/// Whether normalised text reads as a relation (an equation or inequality).
fn is_relation_text(s: &str) -> bool {
    matches!(equiv::parse_value(s), equiv::Value::Relation { .. })
}

/// `3:8`: a ratio of plain numbers.
fn is_ratio(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').map(str::trim).collect();
    parts.len() >= 2 && parts.iter().all(|p| is_decimal(p))
}

/// Whether a comma in `s` is followed by white space (or a LaTeX space).
fn comma_then_space(s: &str) -> bool {
    s.match_indices(',').any(|(i, _)| {
        let rest = &s[i + 1..];
        rest.starts_with(char::is_whitespace)
            || rest.starts_with("\\ ")
            || rest.starts_with("\\,")
            || rest.starts_with("\\;")
    })
}

/// `3,25` → `3.25`: one comma between digits with other than three digits
/// after it (a thousands group has exactly three), in a plain number.
fn decimal_comma_number(s: &str) -> Option<String> {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = body.split_once(',')?;
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
    (digits(int) && digits(frac) && frac.len() != 3).then(|| s.replacen(',', ".", 1))
}

/// An answer that is arithmetic left undone (`2+3`, `\sqrt{49}`) where the
/// gold is a plain number, and that already stood in the response before the
/// answer ("Find the value of $2+3$ … $\boxed{2+3}$"): the question echoed
/// back, not answered. Rewarding it teaches a policy to copy the question.
fn restates_earlier_math(response: &str, answer: &str, v: &Verdict) -> bool {
    if is_number_literal(&v.normalized_answer) || !is_number_literal(&v.normalized_gold) {
        return false;
    }
    let answer = answer.trim();
    let Some(at) = response.rfind(answer) else { return false };
    let before = &response[..at];
    // The same text earlier (`2+3` in "the value of $2+3$"), or a math span
    // that normalises to the same expression. Spans are read only within
    // the last paragraph-sized stretch, where `$` pairs are reliable.
    if before.contains(answer) {
        return true;
    }
    let mut from = before.len().saturating_sub(2000);
    while !before.is_char_boundary(from) {
        from -= 1;
    }
    let text = before[from..].replace("\\$", "").replace("$$", "$").replace("\\(", "$").replace("\\)", "$");
    text.split('$')
        .skip(1)
        .step_by(2)
        .any(|span| !span.trim().is_empty() && normalize::normalize(span).text == v.normalized_answer)
}

/// `-007` → `-7`: the canonical digits of an integer literal.
fn integer_digits(s: &str) -> Option<String> {
    let t = s.trim();
    let (sign, body) = match t.strip_prefix('-') {
        Some(b) => ("-", b),
        None => ("", t.strip_prefix('+').unwrap_or(t)),
    };
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = body.trim_start_matches('0');
    Some(if digits.is_empty() { "0".to_string() } else { format!("{sign}{digits}") })
}

/// A decimal literal with a fractional part (`3.14159`) against a value the
/// evaluator could only approximate (`\pi`, `\sqrt{2}`): an approximation,
/// however many digits it has.
fn decimal_against_irrational(text: &str, other: &equiv::Value) -> bool {
    text.contains('.') && is_decimal(text) && matches!(other.as_num(), Some(num::Num::Approx(x)) if x.is_finite())
}

/// Multiple choice: when the gold is one of the letters A–E, an answer
/// that opens with a choice in parentheses (`(E) 8`, from `\textbf{(E) }8`)
/// is that choice; `None` when this rule does not apply.
fn choice_against_letter(answer: &str, gold: &str) -> Option<bool> {
    let g = gold.chars().collect::<Vec<_>>();
    if !(g.len() == 1 && ('A'..='E').contains(&g[0])) {
        return None;
    }
    let a: Vec<char> = answer.chars().collect();
    match a.as_slice() {
        ['(', l, ')', ..] if l.is_ascii_uppercase() => Some(*l == g[0]),
        _ => None,
    }
}

/// The letter of a normalised answer that starts with a choice label
/// `(A)` … `(E)`.
fn choice_label(s: &str) -> Option<char> {
    match s.as_bytes() {
        [b'(', l @ b'A'..=b'E', b')', ..] => Some(*l as char),
        _ => None,
    }
}

/// A gold that is one choice letter, `A` … `E`.
fn is_choice_letter(s: &str) -> bool {
    matches!(s.as_bytes(), [b'A'..=b'E'])
}

/// What follows a choice label (`(C)12` → `12`), if anything does.
fn choice_value(s: &str) -> Option<&str> {
    choice_label(s)?;
    Some(s[3..].trim()).filter(|v| !v.is_empty())
}

/// Optional sign, digits, at most one decimal point.
fn is_decimal(s: &str) -> bool {
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

/// A number written plainly: a decimal (in scientific notation too:
/// `1.5e3`, `2.5\times10^{-3}`), or a fraction in lowest terms
/// (`\frac{3}{4}`, `-3/4`); `\frac{254}{2}` is arithmetic left undone.
fn is_number_literal(s: &str) -> bool {
    if is_decimal(s) {
        return true;
    }
    let t = s.trim();
    for times in ["e", "E", "\\times10^", "\\cdot10^"] {
        if let Some((m, e)) = t.split_once(times) {
            let e = e.strip_prefix('{').and_then(|e| e.strip_suffix('}')).unwrap_or(e);
            let e = e.strip_prefix(['-', '+']).unwrap_or(e);
            if is_decimal(m) && !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
                return true;
            }
        }
    }
    let t = t.strip_prefix(['-', '+']).unwrap_or(t);
    let parts = if let Some(rest) = t.strip_prefix("\\frac{") {
        rest.strip_suffix('}').and_then(|r| r.split_once("}{"))
    } else {
        t.split_once('/')
    };
    let Some((n, d)) = parts else { return false };
    let (Ok(n), Ok(d)) = (n.parse::<u128>(), d.parse::<u128>()) else { return false };
    let gcd = |mut a: u128, mut b: u128| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    d > 1 && gcd(n, d) == 1
}

/// One number however written: a [`is_number_literal`] form, any fraction
/// of integers (`\frac{28}{6}`, `\frac{-3}{4}`, `28/6`), a mixed number
/// (`4\frac{2}{3}`), a power of integers (`2^{100}`, `10^{6}`), each with
/// a sign and in parentheses or not.
fn is_number_form(s: &str) -> bool {
    // Signs and enclosing parentheses, in any order: `-(1/2)`, `(-3)`.
    let mut t = s.trim();
    loop {
        if let Some(rest) = t.strip_prefix(['-', '+']) {
            t = rest.trim();
        } else if let Some(inner) = enclosed(t) {
            t = inner.trim();
        } else {
            break;
        }
    }
    if is_number_literal(t) {
        return true;
    }
    let int = |x: &str| {
        let x = x.strip_prefix(['-', '+']).unwrap_or(x);
        !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit())
    };
    // A power of integers (`2^{100}`, `10^6`) is how large numbers are
    // written as final answers (the fixture set's labels say so).
    if let Some((b, e)) = t.split_once('^') {
        let e = e.strip_prefix('{').and_then(|e| e.strip_suffix('}')).unwrap_or(e);
        return int(b) && !b.starts_with(['-', '+']) && int(e);
    }
    if let Some((n, d)) = t.split_once('/') {
        return int(n) && int(d);
    }
    // A whole part before a fraction makes a mixed number.
    let whole = t.bytes().take_while(u8::is_ascii_digit).count();
    let frac = &t[whole..];
    if let Some((n, d)) =
        frac.strip_prefix("\\frac{").and_then(|r| r.strip_suffix('}')).and_then(|r| r.split_once("}{"))
    {
        return int(n) && int(d) && (whole == 0 || !n.starts_with(['-', '+']));
    }
    false
}

/// The inside of `(…)` when the first parenthesis closes at the end (not
/// `(1)+(2)`).
fn enclosed(t: &str) -> Option<&str> {
    let inner = t.strip_prefix('(')?.strip_suffix(')')?;
    let mut depth = 0i32;
    for c in inner.chars() {
        depth += match c {
            '(' => 1,
            ')' => -1,
            _ => 0,
        };
        if depth < 0 {
            return None;
        }
    }
    (depth == 0).then_some(inner)
}

/// Arithmetic on numbers left undone: no variables or constants (only the
/// commands of arithmetic, roots and logarithms), at least one operation,
/// and not one number however written ([`is_number_form`]).
fn undone_arithmetic(s: &str) -> bool {
    if is_number_form(s) {
        return false;
    }
    let mut rest = s.to_string();
    let mut operation = false;
    // The evaluator's operators and functions (`expr.rs`), longest first
    // where one is a prefix of another.
    for cmd in [
        "\\times", "\\cdot", "\\ast", "\\div", "\\dfrac", "\\tfrac", "\\frac", "\\sqrt", "\\log", "\\ln", "\\binom",
        "\\sin", "\\cos", "\\tan", "\\exp",
    ] {
        if rest.contains(cmd) {
            operation = true;
            rest = rest.replace(cmd, " ");
        }
    }
    for cmd in ["\\left", "\\right"] {
        rest = rest.replace(cmd, " ");
    }
    let t = rest.trim().trim_start_matches(['-', '+']);
    operation |= t.contains(['+', '-', '*', '/', '^', '!']);
    // A product by juxtaposition: `17(23)`, `(17)(23)`, `(17)23`.
    let b = t.as_bytes();
    operation |= b
        .windows(2)
        .any(|w| (w[1] == b'(' && (w[0].is_ascii_digit() || w[0] == b')')) || (w[0] == b')' && w[1].is_ascii_digit()));
    operation
        && t.bytes().any(|b| b.is_ascii_digit())
        && t.bytes().all(|b| b.is_ascii_digit() || b" .+-*/^!(){}[]_".contains(&b))
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
        Some(answer) => {
            let mut v = is_equivalent(&answer, gold, cfg);
            if v.correct && cfg.equivalence == Equivalence::Math && restates_earlier_math(response, &answer, &v) {
                v.correct = false;
                v.reason = Reason::Mismatch(
                    "the answer restates an expression from earlier in the response, left unevaluated".to_string(),
                );
            }
            v
        }
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
