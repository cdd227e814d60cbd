//! Math datasets: built-in procedurally generated arithmetic tasks, JSONL and
//! Parquet loaders, de-duplication and prompt templates.
//!
//! * [`generate_arithmetic`] / [`builtin_split`] produce seeded arithmetic
//!   problems (four difficulty levels, the last being short multi-step word
//!   problems) with exact integer answers computed in Rust, so training and
//!   evaluation run with no downloaded dataset.
//! * [`load_jsonl`] / [`load_jsonl_with`] read one JSON object per line,
//!   [`load_parquet`] reads a Parquet file; both understand two record
//!   layouts ([`RecordLayout`], chosen in configs by [`DataSchema`]):
//!   - **flat**: top-level question / answer / source fields with
//!     configurable names;
//!   - **verl**: verl's RL dataset layout, as in DAPO-Math-17k — `prompt` a
//!     list of `{role, content}` chat messages (the question is the content of
//!     the last `user` message), gold answer in `reward_model.ground_truth`,
//!     source in `data_source`, id from `extra_info.index` when present.
//! * [`dedupe`] drops repeated questions by [`normalize_question`];
//!   [`load_problems`] does all of this from a [`DataConfig`].
//! * [`PromptTemplate`] renders a question as DAPO's "Answer:" prompt, the
//!   `\boxed{}` prompt, or unchanged; [`prompt::PromptFitter`] turns it into
//!   token ids that fit the model's context, skipping or truncating
//!   over-long prompts ([`OverlongPrompts`]).
//!
//! JSONL files may start with a UTF-8 byte-order mark (it is ignored). A
//! line longer than [`MAX_LINE_BYTES`] (1 MiB) is not parsed: it is skipped
//! and reported as a [`SkippedRecord`] (see [`load_problems_reporting`]),
//! so one runaway row cannot stall or kill a run; the rest of the file is
//! read as usual.
//!
//! verl datasets store the prompt **already templated** (DAPO-Math-17k's
//! user message is DAPO's "Answer:" prompt around the problem), so use them
//! with [`PromptTemplate::Plain`] (`template = "plain"`); another template
//! would wrap the prompt twice. Nothing here changes the template for you.
//!
//! Parquet files are read through the `parquet` crate's row API (no arrow),
//! with the snappy (pyarrow, pandas and Hugging Face `datasets` default),
//! gzip and lz4 codecs; zstd (polars' default) needs this crate's
//! `parquet-zstd` feature, which compiles libzstd from C. A file using a
//! codec that is not built in gives [`DataError::UnsupportedCodec`] with a
//! hint.

use std::collections::HashSet;
use std::fmt;
use std::io::BufRead;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

mod parquet_rows;
pub mod prompt;

pub use prompt::{Fitted, OverlongPrompt, OverlongPrompts, PromptError, PromptFitter};

/// The longest JSONL line (in bytes, without its line ending) that is
/// parsed: 1 MiB, far above any real math problem (DAPO-Math-17k's longest
/// line is a few KiB). A longer line is skipped with a [`SkippedRecord`]
/// without being held in memory or parsed.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Errors from generating or loading datasets.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line is not a valid JSON object.
    #[error("{path}:{line}: invalid JSON: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What the parser said.
        message: String,
    },
    /// A required field is absent from a record (a JSONL line or a Parquet
    /// row), or a nested field is absent from its parent.
    #[error("{}: missing field `{key}`", .at.locate(.path))]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The record.
        at: Position,
        /// The field that was looked for, as a path: `answer`,
        /// `reward_model.ground_truth`, `prompt[2].role`.
        key: String,
    },
    /// A field is present but holds the wrong kind of value (for an answer:
    /// neither a string nor a number; null counts as wrong).
    #[error("{}: field `{key}` must be {expected}, found {found}", .at.locate(.path))]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The record.
        at: Position,
        /// The field, as a path (see [`DataError::MissingKey`]).
        key: String,
        /// What was expected, e.g. `a string or a number`.
        expected: String,
        /// What was found instead, e.g. `null`, `an array`.
        found: String,
    },
    /// The file is not a readable Parquet file (bad magic bytes, corrupt
    /// footer or metadata).
    #[error("{path}: not a readable Parquet file: {message}")]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// What the Parquet reader said.
        message: String,
    },
    /// A Parquet row could not be decoded (corrupt page, bad encoding).
    #[error("{path}: row {row}: cannot decode Parquet data: {message}")]
    ParquetRow {
        /// The file.
        path: PathBuf,
        /// 1-based row number.
        row: usize,
        /// What the Parquet reader said.
        message: String,
    },
    /// A Parquet file lacks a top-level column the record layout needs.
    #[error("{path}: no column `{column}` (columns: {available})")]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column looked for.
        column: String,
        /// The file's top-level columns, comma-separated.
        available: String,
    },
    /// A needed Parquet column is compressed with a codec this build cannot
    /// decompress.
    #[error("{path}: column `{column}` is compressed with {codec}, which this build cannot read; {hint}")]
    UnsupportedCodec {
        /// The file.
        path: PathBuf,
        /// The column (dotted leaf path).
        column: String,
        /// The codec, e.g. `ZSTD`.
        codec: String,
        /// What to do about it.
        hint: String,
    },
    /// A difficulty outside `1..=4`.
    #[error("arithmetic difficulty must be in 1..=4, got {0}")]
    BadDifficulty(u8),
    /// A built-in split name other than `arith-train` / `arith-eval`.
    #[error("unknown built-in split `{0}` (expected `arith-train` or `arith-eval`)")]
    UnknownSplit(String),
    /// A data path whose extension names no supported format.
    #[error("{0}: unsupported dataset format (expected `builtin:<split>`, `.jsonl` or `.parquet`)")]
    UnknownFormat(PathBuf),
    /// The dataset holds no problems after filtering.
    #[error("dataset `{0}` has no problems")]
    Empty(String),
    /// `skip` left out every problem the dataset holds.
    #[error("dataset `{path}`: `skip = {skip}` leaves no problem (it holds {skip} or fewer; for a built-in split raise `count` above `skip`)")]
    AllLeftOut {
        /// The dataset.
        path: String,
        /// The `skip` setting.
        skip: usize,
    },
    /// Every record read was skipped (e.g. all lines over [`MAX_LINE_BYTES`]),
    /// so no problem is left.
    #[error("dataset `{path}` has no usable problems: {skipped} record(s) skipped, the first: {first}")]
    AllSkipped {
        /// The dataset (`DataConfig::path`).
        path: String,
        /// How many records were skipped.
        skipped: usize,
        /// The first skipped record, located and explained.
        first: String,
    },
    /// The generator could not find enough distinct questions.
    #[error("could only generate {got} distinct problems of difficulty {difficulty}, {wanted} requested")]
    Exhausted {
        /// The difficulty.
        difficulty: u8,
        /// Requested count.
        wanted: usize,
        /// Distinct problems found.
        got: usize,
    },
}

/// Where a record sits in its file, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// 1-based line of a JSONL file.
    Line(usize),
    /// 1-based row of a Parquet file (row 1 is the first row, `df.iloc[0]`
    /// in pandas), counted across row groups.
    Row(usize),
}

impl Position {
    /// `file:7` for a line, `file: row 7` for a row.
    pub fn locate(&self, path: &Path) -> String {
        match self {
            Position::Line(n) => format!("{}:{n}", path.display()),
            Position::Row(n) => format!("{}: row {n}", path.display()),
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Line(n) => write!(f, "line {n}"),
            Position::Row(n) => write!(f, "row {n}"),
        }
    }
}

/// A record that was left out while reading a dataset, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedRecord {
    /// The file.
    pub path: PathBuf,
    /// 1-based line of the JSONL file.
    pub line: usize,
    /// Why, e.g. `line of 10000031 bytes exceeds the 1048576-byte limit`.
    pub reason: String,
}

impl fmt::Display for SkippedRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}; skipped", self.path.display(), self.line, self.reason)
    }
}

/// One math problem with its gold answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// Stable identifier (e.g. `arith-train-d2-17` or `file:42`).
    pub id: String,
    /// The question text, without any prompt template.
    pub question: String,
    /// The gold answer as text (for built-in tasks, an integer).
    pub answer: String,
    /// Where the problem came from (used for per-source breakdowns).
    pub source: String,
}

/// Settings for the built-in arithmetic generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArithmeticConfig {
    /// 1: `a ± b` with 1–2 digit operands; 2: `a ± b` or `a * b` with 2-digit
    /// operands; 3: three operands mixing `+ - *` (precedence applies);
    /// 4: short multi-step word problems.
    pub difficulty: u8,
    /// Number of distinct problems to produce.
    pub count: usize,
    /// Seed of the `ChaCha8Rng` stream.
    pub seed: u64,
}

/// The two built-in splits, disjoint by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    All,
    Train,
    Eval,
}

/// 64-bit FNV-1a: a hash fixed by definition (unlike `DefaultHasher`), so the
/// train/eval partition (and evaluation seeds) never change between Rust
/// versions.
pub(crate) fn fnv1a(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One question in eight (by hash of the normalised text) belongs to the
/// held-out evaluation split; the rest to training.
fn is_eval_question(question: &str) -> bool {
    fnv1a(&normalize_question(question)).is_multiple_of(8)
}

/// Generates `config.count` distinct arithmetic problems, deterministic in
/// `config.seed` and `config.difficulty`. Answers are exact integers computed
/// with `i64` arithmetic. Problems are not filtered by split; use
/// [`builtin_split`] for disjoint train / eval sets.
pub fn generate_arithmetic(config: &ArithmeticConfig) -> Result<Vec<Problem>, DataError> {
    generate(config, Split::All)
}

/// A built-in split: `"arith-train"` or `"arith-eval"`.
///
/// The splits are disjoint by construction, whatever the seeds and counts:
/// every question is assigned to exactly one split by a fixed hash
/// (64-bit FNV-1a) of its normalised text (one in eight goes to eval), and
/// the two splits also draw from different random streams of the seed. So a
/// model trained on `arith-train` never sees an `arith-eval` question.
pub fn builtin_split(name: &str, config: &ArithmeticConfig) -> Result<Vec<Problem>, DataError> {
    let split = match name {
        "arith-train" => Split::Train,
        "arith-eval" => Split::Eval,
        other => return Err(DataError::UnknownSplit(other.to_string())),
    };
    generate(config, split)
}

fn generate(config: &ArithmeticConfig, split: Split) -> Result<Vec<Problem>, DataError> {
    let d = config.difficulty;
    if !(1..=4).contains(&d) {
        return Err(DataError::BadDifficulty(d));
    }
    let (split_id, prefix) = match split {
        Split::All => (0u64, "arith"),
        Split::Train => (1, "arith-train"),
        Split::Eval => (2, "arith-eval"),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    rng.set_stream(u64::from(d) * 4 + split_id);
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(config.count);
    // Give up after this many draws in a row that add nothing new: the
    // question space (or this split's share of it) is nearly exhausted.
    const MAX_STALL: usize = 20_000;
    let mut stall = 0usize;
    while out.len() < config.count {
        if stall >= MAX_STALL {
            return Err(DataError::Exhausted { difficulty: d, wanted: config.count, got: out.len() });
        }
        stall += 1;
        let (question, answer) = match d {
            1 => level1(&mut rng),
            2 => level2(&mut rng),
            3 => level3(&mut rng),
            _ => level4(&mut rng),
        };
        let keep = match split {
            Split::All => true,
            Split::Train => !is_eval_question(&question),
            Split::Eval => is_eval_question(&question),
        };
        if !keep || !seen.insert(normalize_question(&question)) {
            continue;
        }
        stall = 0;
        out.push(Problem {
            id: format!("{prefix}-d{d}-{}", out.len()),
            question,
            answer: answer.to_string(),
            source: format!("arith-d{d}"),
        });
    }
    Ok(out)
}

fn expr_question(expr: &str) -> String {
    format!("What is {expr}?")
}

/// `a ± b`, operands 1..=99, result never negative.
fn level1(rng: &mut ChaCha8Rng) -> (String, i64) {
    let a: i64 = rng.random_range(1..=99);
    let b: i64 = rng.random_range(1..=99);
    if rng.random_bool(0.5) {
        (expr_question(&format!("{a} + {b}")), a + b)
    } else {
        let (x, y) = if a >= b { (a, b) } else { (b, a) };
        (expr_question(&format!("{x} - {y}")), x - y)
    }
}

/// `a + b`, `a - b` (may be negative) or `a * b`, 2-digit operands.
fn level2(rng: &mut ChaCha8Rng) -> (String, i64) {
    let a: i64 = rng.random_range(10..=99);
    let b: i64 = rng.random_range(10..=99);
    match rng.random_range(0..3) {
        0 => (expr_question(&format!("{a} + {b}")), a + b),
        1 => (expr_question(&format!("{a} - {b}")), a - b),
        _ => (expr_question(&format!("{a} * {b}")), a * b),
    }
}

fn apply(op: char, x: i64, y: i64) -> i64 {
    match op {
        '+' => x + y,
        '-' => x - y,
        _ => x * y,
    }
}

/// `a op b op c` with `op` in `+ - *`, usual precedence.
fn level3(rng: &mut ChaCha8Rng) -> (String, i64) {
    const OPS: [char; 3] = ['+', '-', '*'];
    let op1 = OPS[rng.random_range(0..3)];
    let op2 = OPS[rng.random_range(0..3)];
    // Keep multiplication operands small so products stay readable.
    let mut operand = |next_to_mul: bool| -> i64 {
        if next_to_mul {
            rng.random_range(2..=12)
        } else {
            rng.random_range(1..=99)
        }
    };
    let a = operand(op1 == '*');
    let b = operand(op1 == '*' || op2 == '*');
    let c = operand(op2 == '*');
    let value = if op2 == '*' && op1 != '*' { apply(op1, a, b * c) } else { apply(op2, apply(op1, a, b), c) };
    (expr_question(&format!("{a} {op1} {b} {op2} {c}")), value)
}

const NAMES: [&str; 10] = ["Tom", "Anna", "Ravi", "Mei", "Lucas", "Sara", "Omar", "Emma", "Kofi", "Lena"];
const ITEMS: [&str; 8] = ["apples", "pencils", "marbles", "cookies", "stickers", "books", "stamps", "shells"];

/// Short multi-step word problems; every answer is a non-negative integer.
fn level4(rng: &mut ChaCha8Rng) -> (String, i64) {
    let name = NAMES[rng.random_range(0..NAMES.len())];
    let item = ITEMS[rng.random_range(0..ITEMS.len())];
    match rng.random_range(0..5) {
        0 => {
            let a: i64 = rng.random_range(2..=30);
            let b: i64 = rng.random_range(2..=9);
            let c: i64 = rng.random_range(2..=12);
            (
                format!(
                    "{name} has {a} {item}, then buys {b} bags with {c} {item} in each bag. \
                     How many {item} does {name} have now?"
                ),
                a + b * c,
            )
        }
        1 => {
            let a: i64 = rng.random_range(10..=60);
            let b: i64 = rng.random_range(1..=a);
            let c: i64 = rng.random_range(1..=30);
            (
                format!(
                    "{name} has {a} {item}, gives {b} of them to a friend, and then gets {c} more. \
                     How many {item} does {name} have now?"
                ),
                a - b + c,
            )
        }
        2 => {
            let a: i64 = rng.random_range(3..=12);
            let b: i64 = rng.random_range(2..=9);
            let c: i64 = rng.random_range(1..=a * b);
            (
                format!(
                    "A box holds {a} {item}. {name} fills {b} boxes and then takes out {c} {item}. \
                     How many {item} are left in the boxes?"
                ),
                a * b - c,
            )
        }
        3 => {
            let a: i64 = rng.random_range(2..=9);
            let b: i64 = rng.random_range(2..=15);
            let extra: i64 = rng.random_range(0..=20);
            let paid = a * b + extra;
            (
                format!(
                    "{name} buys {a} {item} at {b} dollars each and pays with {paid} dollars. \
                     How many dollars of change does {name} get?"
                ),
                extra,
            )
        }
        _ => {
            let friends: i64 = rng.random_range(2..=9);
            let each: i64 = rng.random_range(2..=12);
            let kept: i64 = rng.random_range(1..=20);
            let total = friends * each + kept;
            (
                format!(
                    "{name} has {total} {item}, keeps {kept} of them, and shares the rest equally \
                     among {friends} friends. How many {item} does each friend get?"
                ),
                each,
            )
        }
    }
}

/// Normalises a question for de-duplication: lower case, whitespace runs
/// collapsed to one space, leading/trailing whitespace removed.
pub fn normalize_question(question: &str) -> String {
    question.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// Drops every problem whose [`normalize_question`] text was already seen,
/// keeping first occurrences in order. Returns the kept problems and how
/// many were dropped.
pub fn dedupe(problems: Vec<Problem>) -> (Vec<Problem>, usize) {
    let mut seen = HashSet::new();
    let before = problems.len();
    let kept: Vec<Problem> = problems.into_iter().filter(|p| seen.insert(normalize_question(&p.question))).collect();
    let dropped = before - kept.len();
    (kept, dropped)
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The record layout named in configs (`schema = "flat"` / `"verl"`); see
/// [`RecordLayout`] for what each means. Applies to JSONL and Parquet alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataSchema {
    /// Top-level question / answer / source fields named by
    /// [`DataConfig::question_key`], [`DataConfig::answer_key`] and
    /// [`DataConfig::source_key`].
    #[default]
    Flat,
    /// verl's RL dataset layout (DAPO-Math-17k): see [`RecordLayout::Verl`].
    /// Its prompts are already templated: use `template = "plain"`.
    Verl,
}

/// How one record (a JSONL object or a Parquet row) maps to a [`Problem`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordLayout {
    /// Top-level fields. Question and answer must be strings or numbers (a
    /// number is kept as its text, e.g. `144`). The source is the
    /// `source_key` field if given, otherwise the file stem. Ids are
    /// `"{file stem}:{n}"` with `n` the 1-based line (JSONL) or row (Parquet).
    Flat {
        /// Field holding the question.
        question_key: String,
        /// Field holding the gold answer.
        answer_key: String,
        /// Field holding the source label; `None`: the file stem.
        source_key: Option<String>,
    },
    /// verl's RL dataset layout, as in DAPO-Math-17k:
    /// `prompt` — a list of `{role, content}` chat messages, the question
    /// being the `content` of the **last** message whose `role` is `user`
    /// (kept verbatim: for DAPO it already holds the "Answer:" instructions,
    /// so render it with [`PromptTemplate::Plain`]);
    /// `reward_model.ground_truth` — the gold answer (string or number);
    /// `data_source` — the source label;
    /// `extra_info.index` — the id, verbatim, when present and not null,
    /// otherwise `"{file stem}:{n}"` as for [`RecordLayout::Flat`].
    /// Other fields (`ability`, `reward_model.style`, …) are ignored.
    Verl,
}

impl RecordLayout {
    /// The flat layout with the given field names.
    pub fn flat(question_key: &str, answer_key: &str, source_key: Option<&str>) -> Self {
        RecordLayout::Flat {
            question_key: question_key.to_string(),
            answer_key: answer_key.to_string(),
            source_key: source_key.map(str::to_string),
        }
    }

    /// Top-level fields this layout reads: `(name, required)`.
    fn columns(&self) -> Vec<(&str, bool)> {
        match self {
            RecordLayout::Flat { question_key, answer_key, source_key } => {
                let mut cols = vec![(question_key.as_str(), true), (answer_key.as_str(), true)];
                if let Some(k) = source_key {
                    cols.push((k.as_str(), true));
                }
                cols
            }
            RecordLayout::Verl => {
                vec![("prompt", true), ("reward_model", true), ("data_source", true), ("extra_info", false)]
            }
        }
    }
}

/// A field problem inside one record, located by the caller.
#[derive(Debug)]
enum FieldError {
    Missing(String),
    Bad { key: String, expected: &'static str, found: String },
}

impl FieldError {
    fn at(self, path: &Path, at: Position) -> DataError {
        match self {
            FieldError::Missing(key) => DataError::MissingKey { path: path.to_path_buf(), at, key },
            FieldError::Bad { key, expected, found } => {
                DataError::BadValue { path: path.to_path_buf(), at, key, expected: expected.to_string(), found }
            }
        }
    }
}

type Record = serde_json::Map<String, serde_json::Value>;

const SCALAR: &str = "a string or a number";

/// A string, or a number kept as its JSON text.
fn scalar_text(key: &str, value: &serde_json::Value) -> Result<String, FieldError> {
    match value {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        other => Err(FieldError::Bad { key: key.to_string(), expected: SCALAR, found: json_type(other).to_string() }),
    }
}

fn required<'a>(obj: &'a Record, key: &str, name: &str) -> Result<&'a serde_json::Value, FieldError> {
    obj.get(key).ok_or_else(|| FieldError::Missing(name.to_string()))
}

fn object<'a>(value: &'a serde_json::Value, name: &str) -> Result<&'a Record, FieldError> {
    value.as_object().ok_or_else(|| FieldError::Bad {
        key: name.to_string(),
        expected: "an object (struct)",
        found: json_type(value).to_string(),
    })
}

/// The content of the last `user` message of a verl `prompt`.
fn last_user_content(prompt: &serde_json::Value) -> Result<String, FieldError> {
    const CHAT: &str = "a list of {role, content} chat messages";
    let messages = prompt.as_array().ok_or_else(|| FieldError::Bad {
        key: "prompt".into(),
        expected: CHAT,
        found: json_type(prompt).to_string(),
    })?;
    for (i, message) in messages.iter().enumerate().rev() {
        let name = format!("prompt[{i}]");
        let message = object(message, &name)?;
        let role = required(message, "role", &format!("{name}.role"))?;
        let role = role.as_str().ok_or_else(|| FieldError::Bad {
            key: format!("{name}.role"),
            expected: "a string",
            found: json_type(role).to_string(),
        })?;
        if role == "user" {
            let key = format!("{name}.content");
            let content = required(message, "content", &key)?;
            return content.as_str().map(str::to_string).ok_or_else(|| FieldError::Bad {
                key,
                expected: "a string",
                found: json_type(content).to_string(),
            });
        }
    }
    Err(FieldError::Bad {
        key: "prompt".into(),
        expected: "a chat with a `user` message",
        found: format!("{} message(s), none with role `user`", messages.len()),
    })
}

/// Maps one record to a problem. `fallback_id` is used when the layout
/// gives no id; `stem` is the default source of the flat layout.
fn record_to_problem(
    obj: &Record,
    layout: &RecordLayout,
    stem: &str,
    fallback_id: String,
) -> Result<Problem, FieldError> {
    match layout {
        RecordLayout::Flat { question_key, answer_key, source_key } => {
            let field = |key: &str| scalar_text(key, required(obj, key, key)?);
            let question = field(question_key)?;
            let answer = field(answer_key)?;
            let source = match source_key {
                Some(k) => field(k)?,
                None => stem.to_string(),
            };
            Ok(Problem { id: fallback_id, question, answer, source })
        }
        RecordLayout::Verl => {
            let question = last_user_content(required(obj, "prompt", "prompt")?)?;
            let reward_model = object(required(obj, "reward_model", "reward_model")?, "reward_model")?;
            let answer = scalar_text(
                "reward_model.ground_truth",
                required(reward_model, "ground_truth", "reward_model.ground_truth")?,
            )?;
            let source = scalar_text("data_source", required(obj, "data_source", "data_source")?)?;
            let id = match obj.get("extra_info") {
                None | Some(serde_json::Value::Null) => None,
                Some(extra) => match object(extra, "extra_info")?.get("index") {
                    None | Some(serde_json::Value::Null) => None,
                    Some(index) => Some(scalar_text("extra_info.index", index)?),
                },
            };
            Ok(Problem { id: id.unwrap_or(fallback_id), question, answer, source })
        }
    }
}

fn file_stem(path: &Path, default: &str) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| default.to_string())
}

/// Receives problems as they are read; `Break` stops reading early.
type Sink<'a> = dyn FnMut(Problem) -> ControlFlow<()> + 'a;

/// The outcome of [`read_bounded_line`].
#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    /// End of input: nothing was read.
    Eof,
    /// A line (without its `\n`) is in the buffer.
    Line,
    /// The line had this many bytes (without its `\n`), more than the
    /// bound; it was consumed but not kept.
    TooLong(u64),
}

/// Reads one `\n`-terminated line into `buf` (cleared first, newline not
/// included), keeping at most `max` bytes: a longer line is consumed to its
/// end without being stored, so memory stays bounded by `max` plus the
/// reader's buffer whatever the line's length.
fn read_bounded_line(r: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<LineRead> {
    buf.clear();
    let mut total: u64 = 0;
    let mut any = false;
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            break;
        }
        any = true;
        let (chunk, used, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        total += chunk.len() as u64;
        if total <= max as u64 {
            buf.extend_from_slice(chunk);
        } else {
            buf.clear();
        }
        r.consume(used);
        if done {
            break;
        }
    }
    Ok(if !any {
        LineRead::Eof
    } else if total > max as u64 {
        LineRead::TooLong(total)
    } else {
        LineRead::Line
    })
}

fn read_jsonl(
    path: &Path,
    layout: &RecordLayout,
    skipped: &mut Vec<SkippedRecord>,
    sink: &mut Sink<'_>,
) -> Result<(), DataError> {
    read_jsonl_bounded(path, layout, MAX_LINE_BYTES, skipped, sink)
}

/// [`read_jsonl`] with the line bound as a parameter (tests use small ones).
fn read_jsonl_bounded(
    path: &Path,
    layout: &RecordLayout,
    max_line: usize,
    skipped: &mut Vec<SkippedRecord>,
    sink: &mut Sink<'_>,
) -> Result<(), DataError> {
    let io = |source| DataError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let stem = file_stem(path, "jsonl");
    let mut reader = std::io::BufReader::new(file);
    let mut bytes = Vec::new();
    let mut line = 0usize;
    loop {
        line += 1;
        match read_bounded_line(&mut reader, &mut bytes, max_line).map_err(io)? {
            LineRead::Eof => break,
            LineRead::Line => {}
            LineRead::TooLong(n) => {
                skipped.push(SkippedRecord {
                    path: path.to_path_buf(),
                    line,
                    reason: format!("line of {n} bytes exceeds the {max_line}-byte limit (MAX_LINE_BYTES)"),
                });
                continue;
            }
        }
        let mut text: &[u8] = &bytes;
        // A byte-order mark (as Windows editors write) before the first line.
        if line == 1 {
            text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
        }
        // `\r\n` line endings.
        text = text.strip_suffix(b"\r").unwrap_or(text);
        let raw = std::str::from_utf8(text).map_err(|_| DataError::Json {
            path: path.to_path_buf(),
            line,
            message: "line is not valid UTF-8".to_string(),
        })?;
        if raw.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(raw).map_err(|e| DataError::Json {
            path: path.to_path_buf(),
            line,
            message: e.to_string(),
        })?;
        let obj = value.as_object().ok_or_else(|| DataError::Json {
            path: path.to_path_buf(),
            line,
            message: format!("expected an object, found {}", json_type(&value)),
        })?;
        let problem = record_to_problem(obj, layout, &stem, format!("{stem}:{line}"))
            .map_err(|e| e.at(path, Position::Line(line)))?;
        if sink(problem).is_break() {
            break;
        }
    }
    Ok(())
}

/// Loads problems from a JSONL file in the flat layout: one JSON object per
/// line, blank lines skipped. `question_key` and `answer_key` name the fields
/// holding the question and the gold answer (a string, or a number that is
/// kept as its JSON text); `source_key`, if given, names a field for the
/// source, otherwise the file stem is the source. Ids are
/// `"{file stem}:{line}"`.
///
/// Errors name the file, the 1-based line number and, where relevant, the key.
/// No de-duplication is done here; see [`dedupe`].
pub fn load_jsonl(
    path: &Path,
    question_key: &str,
    answer_key: &str,
    source_key: Option<&str>,
) -> Result<Vec<Problem>, DataError> {
    load_jsonl_with(path, &RecordLayout::flat(question_key, answer_key, source_key))
}

/// Loads problems from a JSONL file (one JSON object per line, blank lines
/// skipped) in the given [`RecordLayout`]. Errors name the file, the 1-based
/// line and the field path (e.g. `reward_model.ground_truth`). No
/// de-duplication is done here; see [`dedupe`].
///
/// Lines over [`MAX_LINE_BYTES`] are skipped with a warning on stderr (use
/// [`load_jsonl_reporting`] to get them instead).
pub fn load_jsonl_with(path: &Path, layout: &RecordLayout) -> Result<Vec<Problem>, DataError> {
    let (out, skipped) = load_jsonl_reporting(path, layout)?;
    warn_skipped(&skipped);
    Ok(out)
}

/// [`load_jsonl_with`], returning the lines it skipped (over
/// [`MAX_LINE_BYTES`]) instead of printing them.
pub fn load_jsonl_reporting(
    path: &Path,
    layout: &RecordLayout,
) -> Result<(Vec<Problem>, Vec<SkippedRecord>), DataError> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    read_jsonl(path, layout, &mut skipped, &mut |p| {
        out.push(p);
        ControlFlow::Continue(())
    })?;
    Ok((out, skipped))
}

/// Prints one `warning:` line per skipped record to stderr.
fn warn_skipped(skipped: &[SkippedRecord]) {
    for s in skipped {
        eprintln!("warning: {s}");
    }
}

/// Loads problems from a Parquet file in the given [`RecordLayout`], rows in
/// file order across row groups. Only the columns the layout needs are
/// decoded; nested columns (verl's `prompt: list<struct<content, role>>`,
/// `reward_model: struct<…>`) are read whole. Strings, integers, floats,
/// decimals and UTF-8 binary columns are accepted where a string or number is
/// expected.
///
/// Errors: [`DataError::NotParquet`] (not a Parquet file),
/// [`DataError::MissingColumn`] (a needed top-level column is absent, with
/// the columns that exist), [`DataError::UnsupportedCodec`],
/// [`DataError::MissingKey`] / [`DataError::BadValue`] naming the 1-based row
/// and the field path, [`DataError::ParquetRow`] for undecodable data.
/// No de-duplication is done here; see [`dedupe`].
pub fn load_parquet(path: &Path, layout: &RecordLayout) -> Result<Vec<Problem>, DataError> {
    let mut out = Vec::new();
    parquet_rows::read_parquet(path, layout, &mut |p| {
        out.push(p);
        ControlFlow::Continue(())
    })?;
    Ok(out)
}

/// Where a run's problems come from: one table of a TOML config
/// (`[data]`, `[eval_data]`), shared by `llm eval` and `llm train`.
///
/// ```toml
/// [data]                      # DAPO-Math-17k as verl ships it
/// path = "dapo-math-17k.parquet"
/// schema = "verl"             # prompts are pre-templated: use template = "plain"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `builtin:arith-train` / `builtin:arith-eval` for the generated tasks,
    /// otherwise a path to a `.jsonl` (or `.json`, read as JSONL) or
    /// `.parquet` file.
    pub path: String,
    /// Built-in tasks: difficulty 1–4 (see [`ArithmeticConfig`]).
    pub difficulty: u8,
    /// Built-in tasks: how many problems to generate.
    pub count: usize,
    /// Built-in tasks: generator seed.
    pub seed: u64,
    /// Files: the record layout, `flat` (default) or `verl`. With `verl` the
    /// three `*_key` settings are ignored, and since verl prompts are already
    /// templated the dataset should be used with `template = "plain"`.
    pub schema: DataSchema,
    /// Flat schema: field holding the question.
    pub question_key: String,
    /// Flat schema: field holding the gold answer.
    pub answer_key: String,
    /// Flat schema: field holding the source label (default: the file stem).
    pub source_key: Option<String>,
    /// Drop repeated questions ([`dedupe`]), keeping first occurrences.
    pub dedupe: bool,
    /// Keep only the first `limit` problems (after de-duplication); reading
    /// a file stops once they are found.
    pub limit: Option<usize>,
    /// Leave out the first `skip` problems (after de-duplication, before
    /// `limit`). The same source read with `skip = N` and with `limit = N`
    /// (or a built-in `count = N`) gives disjoint sets, so a validation
    /// split can be cut from the problems after a held-out one: built-in
    /// `arith-eval` with `count = 200, skip = 100` is the 100 problems after
    /// `count = 100`'s.
    #[serde(skip_serializing_if = "is_zero")]
    pub skip: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            path: "builtin:arith-train".into(),
            difficulty: 1,
            count: 2000,
            seed: 0,
            schema: DataSchema::Flat,
            question_key: "question".into(),
            answer_key: "answer".into(),
            source_key: None,
            dedupe: true,
            limit: None,
            skip: 0,
        }
    }
}

impl DataConfig {
    /// The built-in held-out split with the given size and difficulty.
    pub fn builtin_eval(difficulty: u8, count: usize) -> Self {
        Self { path: "builtin:arith-eval".into(), difficulty, count, ..Self::default() }
    }

    /// The record layout of [`DataConfig::schema`] with this config's keys.
    pub fn layout(&self) -> RecordLayout {
        match self.schema {
            DataSchema::Flat => RecordLayout::flat(&self.question_key, &self.answer_key, self.source_key.as_deref()),
            DataSchema::Verl => RecordLayout::Verl,
        }
    }
}

/// Loads the problems `cfg` describes: generated for `builtin:<split>`,
/// otherwise read from a `.jsonl` / `.json` (JSONL) or `.parquet` file in the
/// layout of [`DataConfig::schema`]; de-duplicated and truncated as
/// configured. De-duplication happens while reading, so a file with many
/// repeats (DAPO-Math-17k holds each of its ~17.9k questions about 100 times)
/// never holds the repeats in memory.
///
/// JSONL lines over [`MAX_LINE_BYTES`] are skipped, each with a `warning:`
/// line on stderr; [`load_problems_reporting`] returns them instead. If
/// every record was skipped the error is [`DataError::AllSkipped`].
pub fn load_problems(cfg: &DataConfig) -> Result<Vec<Problem>, DataError> {
    let loaded = load_problems_reporting(cfg)?;
    warn_skipped(&loaded.skipped);
    Ok(loaded.problems)
}

/// What [`load_problems_reporting`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedProblems {
    /// The problems, as [`load_problems`] returns them.
    pub problems: Vec<Problem>,
    /// Records left out (JSONL lines over [`MAX_LINE_BYTES`]), in file
    /// order; callers should warn about each and report the count.
    pub skipped: Vec<SkippedRecord>,
}

/// [`load_problems`] without printing: the skipped records come back in
/// [`LoadedProblems::skipped`] for the caller to report.
pub fn load_problems_reporting(cfg: &DataConfig) -> Result<LoadedProblems, DataError> {
    let limit = cfg.limit.unwrap_or(usize::MAX);
    let mut skipped = Vec::new();
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    let mut left_out = 0usize;
    let mut keep = |p: Problem| {
        if problems.len() >= limit {
            return ControlFlow::Break(());
        }
        if !cfg.dedupe || seen.insert(normalize_question(&p.question)) {
            if left_out < cfg.skip {
                left_out += 1;
                return ControlFlow::Continue(());
            }
            problems.push(p);
        }
        if problems.len() >= limit {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    if let Some(split) = cfg.path.strip_prefix("builtin:") {
        let generated =
            builtin_split(split, &ArithmeticConfig { difficulty: cfg.difficulty, count: cfg.count, seed: cfg.seed })?;
        for p in generated {
            if keep(p).is_break() {
                break;
            }
        }
    } else {
        let path = Path::new(&cfg.path);
        let layout = cfg.layout();
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("jsonl") | Some("json") => read_jsonl(path, &layout, &mut skipped, &mut keep)?,
            Some("parquet") => parquet_rows::read_parquet(path, &layout, &mut keep)?,
            _ => return Err(DataError::UnknownFormat(path.to_path_buf())),
        }
    }
    if problems.is_empty() {
        if let Some(first) = skipped.first() {
            return Err(DataError::AllSkipped {
                path: cfg.path.clone(),
                skipped: skipped.len(),
                first: first.to_string(),
            });
        }
        if cfg.skip > 0 {
            return Err(DataError::AllLeftOut { path: cfg.path.clone(), skip: cfg.skip });
        }
        return Err(DataError::Empty(cfg.path.clone()));
    }
    Ok(LoadedProblems { problems, skipped })
}

/// How a question is wrapped into the user message given to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptTemplate {
    /// DAPO's prompt asking for a final `Answer: …` line.
    #[default]
    Dapo,
    /// The question followed by a request to put the answer in `\boxed{}`.
    Boxed,
    /// The question unchanged.
    Plain,
}

impl PromptTemplate {
    /// Renders `question` with this template.
    pub fn render(&self, question: &str) -> String {
        match self {
            PromptTemplate::Dapo => format!(
                "Solve the following math problem step by step. The last line of your response \
                 should be of the form Answer: $Answer (without quotes) where $Answer is the \
                 answer to the problem.\n\n{question}\n\nRemember to put your answer on its own \
                 line after \"Answer:\"."
            ),
            PromptTemplate::Boxed => {
                format!("{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.")
            }
            PromptTemplate::Plain => question.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Independent evaluator for `What is <expr>?` with `+ - *` and the usual
    /// precedence: multiplication first, then left-to-right addition/subtraction.
    fn eval_question(q: &str) -> i64 {
        let expr = q.strip_prefix("What is ").and_then(|s| s.strip_suffix('?')).expect("expression question");
        let tokens: Vec<&str> = expr.split_whitespace().collect();
        // Pass 1: fold products into terms with their signs.
        let mut terms: Vec<(i64, i64)> = Vec::new(); // (sign, value)
        let mut sign = 1;
        let mut cur: i64 = tokens[0].parse().unwrap();
        let mut i = 1;
        while i < tokens.len() {
            let op = tokens[i];
            let n: i64 = tokens[i + 1].parse().unwrap();
            match op {
                "*" => cur *= n,
                "+" | "-" => {
                    terms.push((sign, cur));
                    sign = if op == "+" { 1 } else { -1 };
                    cur = n;
                }
                _ => panic!("unknown operator {op}"),
            }
            i += 2;
        }
        terms.push((sign, cur));
        terms.iter().map(|(s, v)| s * v).sum()
    }

    fn cfg(difficulty: u8, count: usize, seed: u64) -> ArithmeticConfig {
        ArithmeticConfig { difficulty, count, seed }
    }

    #[test]
    fn deterministic_per_seed() {
        for d in 1..=4 {
            let a = generate_arithmetic(&cfg(d, 50, 7)).unwrap();
            let b = generate_arithmetic(&cfg(d, 50, 7)).unwrap();
            let c = generate_arithmetic(&cfg(d, 50, 8)).unwrap();
            assert_eq!(a, b);
            assert_ne!(a, c);
            assert_eq!(a.len(), 50);
            let (kept, dropped) = dedupe(a);
            assert_eq!((kept.len(), dropped), (50, 0), "generated questions are distinct");
        }
    }

    #[test]
    fn expression_answers_match_independent_evaluation() {
        for d in 1..=3 {
            for p in generate_arithmetic(&cfg(d, 300, 3)).unwrap() {
                let expected = eval_question(&p.question);
                assert_eq!(p.answer, expected.to_string(), "{}", p.question);
                assert_eq!(p.source, format!("arith-d{d}"));
                if d == 1 {
                    assert!(expected >= 0, "level 1 never negative: {}", p.question);
                }
            }
        }
    }

    #[test]
    fn hand_checked_items() {
        assert_eq!(eval_question("What is 2 + 3 * 4?"), 14);
        assert_eq!(eval_question("What is 2 * 3 - 4?"), 2);
        assert_eq!(eval_question("What is 10 - 3 - 4?"), 3);
        assert_eq!(eval_question("What is 5 - 2 * 6?"), -7);
        // Level-3 precedence must be visible in the generated data.
        let ps = generate_arithmetic(&cfg(3, 300, 11)).unwrap();
        let p = ps
            .iter()
            .find(|p| {
                p.question.contains(" + ") && p.question.ends_with("?") && {
                    let t: Vec<&str> = p.question.split_whitespace().collect();
                    t[3] == "+" && t[5] == "*"
                }
            })
            .expect("an `a + b * c` item");
        let t: Vec<i64> =
            p.question[8..p.question.len() - 1].split_whitespace().filter_map(|s| s.parse().ok()).collect();
        assert_eq!(p.answer, (t[0] + t[1] * t[2]).to_string());
    }

    #[test]
    fn word_problem_answers() {
        let ps = generate_arithmetic(&cfg(4, 400, 5)).unwrap();
        let nums = |q: &str| -> Vec<i64> {
            q.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect()
        };
        let mut kinds = [0usize; 5];
        for p in &ps {
            let n = nums(&p.question);
            let ans: i64 = p.answer.parse().unwrap();
            assert!(ans >= 0, "{}", p.question);
            let expected = if p.question.contains("bags with") {
                kinds[0] += 1;
                n[0] + n[1] * n[2]
            } else if p.question.contains("to a friend") {
                kinds[1] += 1;
                n[0] - n[1] + n[2]
            } else if p.question.contains("A box holds") {
                kinds[2] += 1;
                n[0] * n[1] - n[2]
            } else if p.question.contains("change") {
                kinds[3] += 1;
                n[2] - n[0] * n[1]
            } else {
                kinds[4] += 1;
                (n[0] - n[1]) / n[2]
            };
            assert_eq!(ans, expected, "{}", p.question);
        }
        assert!(kinds.iter().all(|&k| k > 0), "all templates used: {kinds:?}");
    }

    #[test]
    fn splits_are_disjoint() {
        for d in 1..=4 {
            let train = builtin_split("arith-train", &cfg(d, 1000, 1)).unwrap();
            // Even with the same seed the eval split shares no question.
            let eval = builtin_split("arith-eval", &cfg(d, 200, 1)).unwrap();
            assert_eq!((train.len(), eval.len()), (1000, 200));
            let train_q: HashSet<String> = train.iter().map(|p| normalize_question(&p.question)).collect();
            assert!(eval.iter().all(|p| !train_q.contains(&normalize_question(&p.question))));
            assert!(eval.iter().all(|p| p.id.starts_with("arith-eval-")));
        }
        assert!(matches!(builtin_split("nope", &cfg(1, 1, 1)), Err(DataError::UnknownSplit(_))));
        assert!(matches!(generate_arithmetic(&cfg(5, 1, 1)), Err(DataError::BadDifficulty(5))));
    }

    #[test]
    fn exhaustion_is_an_error_not_a_hang() {
        // Level 1 has fewer than 20 000 distinct questions.
        let err = generate_arithmetic(&cfg(1, 50_000, 1)).unwrap_err();
        assert!(matches!(err, DataError::Exhausted { .. }), "{err}");
    }

    fn write_file(dir: &Path, name: &str, content: &str) -> PathBuf {
        let path = dir.join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(content.as_bytes()).unwrap();
        path
    }

    #[test]
    fn jsonl_loads_and_dedupes() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(
            dir.path(),
            "mini.jsonl",
            "{\"problem\": \"What is 1+1?\", \"solution\": \"2\", \"src\": \"a\"}\n\
             \n\
             {\"problem\": \"  what IS 1+1? \", \"solution\": 2, \"src\": \"b\"}\n\
             {\"problem\": \"What is 2+2?\", \"solution\": \"4\", \"src\": \"a\"}\n",
        );
        let ps = load_jsonl(&path, "problem", "solution", Some("src")).unwrap();
        assert_eq!(ps.len(), 3);
        assert_eq!(ps[1].id, "mini:3");
        assert_eq!(ps[1].answer, "2");
        assert_eq!(ps[1].source, "b");
        let no_src = load_jsonl(&path, "problem", "solution", None).unwrap();
        assert_eq!(no_src[0].source, "mini");
        let (kept, dropped) = dedupe(ps);
        assert_eq!(dropped, 1);
        assert_eq!(kept.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["mini:1", "mini:4"]);
    }

    #[test]
    fn jsonl_errors_name_file_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = write_file(
            dir.path(),
            "missing.jsonl",
            "{\"question\": \"q1\", \"answer\": \"1\"}\n{\"question\": \"q2\"}\n",
        );
        let err = load_jsonl(&missing, "question", "answer", None).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::MissingKey { at: Position::Line(2), .. }), "{msg}");
        assert!(msg.contains("missing.jsonl") && msg.contains(":2:") && msg.contains("`answer`"), "{msg}");

        let bad = write_file(dir.path(), "bad.jsonl", "{\"question\": \"q1\", \"answer\": \"1\"}\n\n{not json\n");
        let err = load_jsonl(&bad, "question", "answer", None).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::Json { line: 3, .. }), "{msg}");
        assert!(msg.contains("bad.jsonl:3:"), "{msg}");

        let wrong = write_file(dir.path(), "wrong.jsonl", "{\"question\": [1], \"answer\": \"1\"}\n");
        let msg = load_jsonl(&wrong, "question", "answer", None).unwrap_err().to_string();
        assert!(msg.contains("wrong.jsonl:1:") && msg.contains("`question`") && msg.contains("array"), "{msg}");

        let absent = dir.path().join("absent.jsonl");
        let msg = load_jsonl(&absent, "question", "answer", None).unwrap_err().to_string();
        assert!(msg.contains("absent.jsonl"), "{msg}");
    }

    fn verl_line(prompt: &str, rest: &str) -> String {
        format!("{{\"data_source\": \"src\", \"prompt\": {prompt}{rest}}}\n")
    }

    #[test]
    fn verl_jsonl_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let gt = ", \"reward_model\": {\"ground_truth\": \"7\", \"style\": \"rule\"}";
        let text = [
            // Last user message wins; system and assistant turns are skipped.
            verl_line(
                concat!(
                    r#"[{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}, "#,
                    r#"{"role": "assistant", "content": "A"}, {"role": "user", "content": "U2"}, "#,
                    r#"{"role": "assistant", "content": "A2"}]"#
                ),
                &format!("{gt}, \"extra_info\": {{\"index\": 41, \"split\": \"train\"}}"),
            ),
            // extra_info without index, or null: the file:line fallback.
            verl_line(r#"[{"content": "Q", "role": "user"}]"#, &format!("{gt}, \"extra_info\": {{\"split\": \"x\"}}")),
            verl_line(r#"[{"content": "Q", "role": "user"}]"#, &format!("{gt}, \"extra_info\": null")),
            // A numeric ground truth is kept as its text.
            verl_line(r#"[{"content": "Q3", "role": "user"}]"#, ", \"reward_model\": {\"ground_truth\": 12.5}"),
        ]
        .concat();
        let path = write_file(dir.path(), "v.jsonl", &text);
        let ps = load_jsonl_with(&path, &RecordLayout::Verl).unwrap();
        let got: Vec<_> = ps.iter().map(|p| (p.id.as_str(), p.question.as_str(), p.answer.as_str())).collect();
        assert_eq!(got, [("41", "U2", "7"), ("v:2", "Q", "7"), ("v:3", "Q", "7"), ("v:4", "Q3", "12.5")]);
        assert!(ps.iter().all(|p| p.source == "src"));
    }

    #[test]
    fn verl_jsonl_errors_name_line_and_field_path() {
        let dir = tempfile::tempdir().unwrap();
        let user = r#"[{"role": "user", "content": "Q"}]"#;
        let cases: [(&str, String, &str, &str); 8] = [
            (
                "no_gt",
                verl_line(user, ", \"reward_model\": {\"style\": \"rule\"}"),
                "reward_model.ground_truth",
                "missing",
            ),
            (
                "null_gt",
                verl_line(user, ", \"reward_model\": {\"ground_truth\": null}"),
                "reward_model.ground_truth",
                "null",
            ),
            ("rm_str", verl_line(user, ", \"reward_model\": \"7\""), "reward_model", "a string"),
            ("prompt_str", verl_line("\"Q\"", ", \"reward_model\": {\"ground_truth\": \"7\"}"), "prompt", "a string"),
            (
                "no_user",
                verl_line(r#"[{"role": "system", "content": "S"}]"#, ", \"reward_model\": {\"ground_truth\": \"7\"}"),
                "prompt",
                "none with role `user`",
            ),
            (
                "no_role",
                verl_line(
                    r#"[{"role": "user", "content": "Q"}, {"content": "X"}]"#,
                    ", \"reward_model\": {\"ground_truth\": 1}",
                ),
                "prompt[1].role",
                "missing",
            ),
            (
                "content_list",
                verl_line(r#"[{"role": "user", "content": ["Q"]}]"#, ", \"reward_model\": {\"ground_truth\": 1}"),
                "prompt[0].content",
                "an array",
            ),
            (
                "index_list",
                verl_line(user, ", \"reward_model\": {\"ground_truth\": 1}, \"extra_info\": {\"index\": [1]}"),
                "extra_info.index",
                "an array",
            ),
        ];
        for (name, bad, key, what) in cases {
            let good = verl_line(user, ", \"reward_model\": {\"ground_truth\": \"7\"}");
            let path = write_file(dir.path(), &format!("{name}.jsonl"), &format!("{good}\n{bad}"));
            let err = load_jsonl_with(&path, &RecordLayout::Verl).unwrap_err();
            let msg = err.to_string();
            match &err {
                DataError::MissingKey { at, key: k, .. } => {
                    assert_eq!((*at, k.as_str(), "missing"), (Position::Line(3), key, what), "{msg}")
                }
                DataError::BadValue { at, key: k, .. } => {
                    assert_eq!((*at, k.as_str()), (Position::Line(3), key), "{msg}");
                    assert!(msg.contains(what), "{msg}");
                }
                _ => panic!("{name}: unexpected {msg}"),
            }
            assert!(msg.starts_with(&format!("{}:3: ", path.display())) && msg.contains(&format!("`{key}`")), "{msg}");
        }
        let no_source = write_file(dir.path(), "nosrc.jsonl", "{\"prompt\": [], \"reward_model\": {}}\n");
        let msg = load_jsonl_with(&no_source, &RecordLayout::Verl).unwrap_err().to_string();
        assert!(msg.contains("nosrc.jsonl:1: ") && msg.contains("`prompt`"), "{msg}");
    }

    #[test]
    fn a_skipped_range_and_the_problems_before_it_are_disjoint() {
        let held_out = DataConfig { path: "builtin:arith-eval".into(), count: 100, ..DataConfig::default() };
        let val = DataConfig { count: 200, skip: 100, ..held_out.clone() };
        let (h, v) = (load_problems(&held_out).unwrap(), load_problems(&val).unwrap());
        assert_eq!((h.len(), v.len()), (100, 100));
        let held: HashSet<String> = h.iter().map(|p| normalize_question(&p.question)).collect();
        assert!(v.iter().all(|p| !held.contains(&normalize_question(&p.question))));
        // The 200 generated are the held-out 100 followed by the validation 100.
        let all = load_problems(&DataConfig { count: 200, ..held_out.clone() }).unwrap();
        assert_eq!(all[100..], v[..]);
        // `limit` counts after `skip`.
        let first = load_problems(&DataConfig { limit: Some(10), ..val.clone() }).unwrap();
        assert_eq!(first[..], v[..10]);
        let none = load_problems(&DataConfig { skip: 200, ..val }).unwrap_err().to_string();
        assert!(none.contains("skip = 200") && none.contains("arith-eval"), "{none}");
    }

    #[test]
    fn load_problems_dedupes_and_limits_while_reading() {
        let dir = tempfile::tempdir().unwrap();
        // The third line is malformed: a limit of 2 distinct problems is met
        // before it, so reading stops and no error is raised.
        let path = write_file(
            dir.path(),
            "d.jsonl",
            "{\"q\": \"A\", \"a\": 1}\n{\"q\": \" a \", \"a\": 1}\n{\"q\": \"B\", \"a\": 2}\n{broken\n",
        );
        let base = DataConfig {
            path: path.display().to_string(),
            question_key: "q".into(),
            answer_key: "a".into(),
            ..DataConfig::default()
        };
        let ps = load_problems(&DataConfig { limit: Some(2), ..base.clone() }).unwrap();
        assert_eq!(ps.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["d:1", "d:3"]);
        let ps = load_problems(&DataConfig { limit: Some(2), dedupe: false, ..base.clone() }).unwrap();
        assert_eq!(ps.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["d:1", "d:2"]);
        let err = load_problems(&base).unwrap_err();
        assert!(matches!(err, DataError::Json { line: 4, .. }), "{err}");
        assert!(matches!(load_problems(&DataConfig { limit: Some(0), ..base }), Err(DataError::Empty(_))));
        let csv = DataConfig { path: "x.csv".into(), ..DataConfig::default() };
        assert!(matches!(load_problems(&csv), Err(DataError::UnknownFormat(_))));
    }

    #[test]
    fn data_config_schema_serde() {
        let cfg: DataConfig = serde_json::from_str(r#"{"path": "d.parquet", "schema": "verl"}"#).unwrap();
        assert_eq!((cfg.schema, cfg.layout()), (DataSchema::Verl, RecordLayout::Verl));
        let cfg: DataConfig = serde_json::from_str(r#"{"path": "d.jsonl", "question_key": "problem"}"#).unwrap();
        assert_eq!(cfg.schema, DataSchema::Flat);
        assert_eq!(cfg.layout(), RecordLayout::flat("problem", "answer", None));
        assert!(serde_json::from_str::<DataConfig>(r#"{"schema": "hf"}"#).is_err());
        assert_eq!(serde_json::to_string(&DataSchema::Verl).unwrap(), "\"verl\"");
    }

    #[test]
    fn prompt_templates() {
        assert_eq!(
            PromptTemplate::Dapo.render("What is 1+1?"),
            "Solve the following math problem step by step. The last line of your response should be of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is 1+1?\n\nRemember to put your answer on its own line after \"Answer:\"."
        );
        assert_eq!(
            PromptTemplate::Boxed.render("Q"),
            "Q\nPlease reason step by step, and put your final answer within \\boxed{}."
        );
        assert_eq!(PromptTemplate::Plain.render("Q"), "Q");
        for (t, name) in [
            (PromptTemplate::Dapo, "\"dapo\""),
            (PromptTemplate::Boxed, "\"boxed\""),
            (PromptTemplate::Plain, "\"plain\""),
        ] {
            assert_eq!(serde_json::to_string(&t).unwrap(), name);
            assert_eq!(serde_json::from_str::<PromptTemplate>(name).unwrap(), t);
        }
    }

    #[test]
    fn bounded_lines_keep_short_lines_and_drop_long_ones() {
        let text = b"ab\r\n\nabcde\nabcdef\n0123456789abcdef\nlast";
        // A reader buffer smaller than the lines, so lines span refills.
        let mut r = std::io::BufReader::with_capacity(3, &text[..]);
        let mut buf = Vec::new();
        let mut got = Vec::new();
        loop {
            match read_bounded_line(&mut r, &mut buf, 5).unwrap() {
                LineRead::Eof => break,
                LineRead::Line => got.push(String::from_utf8(buf.clone()).unwrap()),
                LineRead::TooLong(n) => {
                    assert!(buf.is_empty(), "an over-long line is not kept");
                    got.push(format!("<{n}>"));
                }
            }
        }
        assert_eq!(got, ["ab\r", "", "abcde", "<6>", "<16>", "last"]);
    }

    #[test]
    fn jsonl_skips_overlong_lines_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let big = format!("{{\"question\": \"What is {}1?\", \"answer\": \"1\"}}", "1+".repeat(100));
        let ok = "{\"question\": \"q\", \"answer\": \"1\"}";
        let path = write_file(dir.path(), "long.jsonl", &format!("{ok}\n{big}\n{ok}\n"));
        let mut skipped = Vec::new();
        let mut ids = Vec::new();
        read_jsonl_bounded(&path, &RecordLayout::flat("question", "answer", None), 100, &mut skipped, &mut |p| {
            ids.push(p.id);
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(ids, ["long:1", "long:3"]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].line, 2);
        let msg = skipped[0].to_string();
        assert!(msg.contains("long.jsonl:2:") && msg.contains(&format!("{} bytes", big.len())), "{msg}");
    }

    #[test]
    fn jsonl_accepts_a_byte_order_mark_and_crlf() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(
            dir.path(),
            "bom.jsonl",
            "\u{FEFF}{\"question\": \"q1\", \"answer\": 1}\r\n{\"question\": \"q2\", \"answer\": 2}\r\n",
        );
        let ps = load_jsonl(&path, "question", "answer", None).unwrap();
        assert_eq!(
            ps.iter().map(|p| (p.question.as_str(), p.answer.as_str())).collect::<Vec<_>>(),
            [("q1", "1"), ("q2", "2")]
        );
        // Only at the start of the file: elsewhere it is an error as before.
        let mid = write_file(dir.path(), "mid.jsonl", "{\"question\": \"q1\", \"answer\": 1}\n\u{FEFF}{}\n");
        assert!(matches!(load_jsonl(&mid, "question", "answer", None), Err(DataError::Json { line: 2, .. })));
    }

    #[test]
    fn problem_serde_roundtrip() {
        let p = generate_arithmetic(&cfg(2, 1, 0)).unwrap().remove(0);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Problem>(&json).unwrap(), p);
    }
}
