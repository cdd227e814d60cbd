//! Evaluation: k sampled responses per problem, each verified, summarised as
//! avg@k, unbiased pass@k, maj@k, response length, truncation and
//! answer-extraction rates, overall and per [`Problem::source`].
//!
//! * Sampling defaults to the paper's test-time setting
//!   ([`SamplingConfig::test_time`]: T = 0.6, top-p = 0.95, top-k = 20).
//! * Each question is wrapped by a [`PromptTemplate`] and rendered as the
//!   single user message of the tokenizer's chat template.
//! * A prompt that, with `sampling.max_new_tokens`, does not fit the model's
//!   context (`max_position_embeddings`) is skipped (the default) or
//!   truncated, as [`EvalConfig::overlong_prompts`] says; such problems are
//!   listed in [`EvalReport::skipped_prompts`] /
//!   [`EvalReport::truncated_prompts`], and if every problem is skipped the
//!   evaluation fails with [`EvalError::AllPromptsTooLong`].
//! * Sample `j` of a problem draws from its own random stream, seeded by
//!   [`sample_seed`] from the base seed, the problem id and `j` alone; so a
//!   problem's samples do not depend on the batch size, on the order of the
//!   problems, or on which other problems are evaluated with it (`--limit`
//!   evaluates a prefix of a larger run exactly), up to the rare draw that
//!   floating-point differences between batch shapes can flip (see
//!   [`crate::sample`]).
//!
//! The metrics, per problem with n = k samples of which c are correct, then
//! averaged over problems:
//!
//! * **avg@k** = c / n, the mean accuracy of a single sample;
//! * **pass@k'** (for each k' ≤ k in [`EvalConfig::pass_k`]) is the unbiased
//!   estimator of Chen et al. (2021), 1 − C(n−c, k')/C(n, k') ([`pass_at_k`]);
//!   pass@1 equals avg@k exactly;
//! * **maj@k** = 1 if the answer most samples agree on is correct
//!   ([`majority_vote`]; samples without an extracted answer do not vote, and
//!   a problem where none has one scores 0).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::Policy;
use crate::chat::{ChatError, ChatTemplate};
use crate::data::{
    load_problems_reporting, DataConfig, DataError, Fitted, LoadedProblems, OverlongPrompt, OverlongPrompts, Problem,
    PromptError, PromptFitter, PromptTemplate,
};
use crate::sample::{request_seed, FinishReason, GenerationRequest, SampleError, SamplingConfig};
use crate::tokenizer::{Tokenizer, TokenizerError};
use r2vpo_verify::{verify, Verdict, VerifyConfig};

/// Errors from configuring or running an evaluation.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// An invalid setting; `field` is the dotted config key.
    #[error("eval config field `{field}`: {message}")]
    Config {
        /// The key, e.g. `pass_k` or `sampling.top_p`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The problem list is empty.
    #[error("no problems to evaluate")]
    NoProblems,
    /// The data-parallel exchange of the ranks' shares failed
    /// ([`evaluate_ranks`]).
    #[error("evaluation across ranks: {0}")]
    Ranks(String),
    /// Two problems share an id; ids seed the samples, so they must be unique.
    #[error("problem id `{0}` occurs more than once (ids seed the samples, so they must be unique)")]
    DuplicateId(String),
    /// The tokenizer has no usable chat template.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// Encoding a prompt failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Generation failed.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// No problem is left to evaluate: every prompt, with
    /// `sampling.max_new_tokens`, exceeds the model's context (and could not
    /// be truncated).
    #[error(
        "all {skipped} problem(s) skipped: their prompts exceed the model's context of {context} tokens minus \
         sampling.max_new_tokens {max_new_tokens} (the first, `{first_id}`, has {first_tokens} tokens); shorten the \
         questions, lower sampling.max_new_tokens or set overlong_prompts = \"truncate\""
    )]
    AllPromptsTooLong {
        /// Problems skipped (all of them).
        skipped: usize,
        /// The model's context length.
        context: usize,
        /// `sampling.max_new_tokens`.
        max_new_tokens: usize,
        /// Id of the first skipped problem.
        first_id: String,
        /// Its prompt's length in tokens.
        first_tokens: usize,
    },
}

impl From<PromptError> for EvalError {
    fn from(e: PromptError) -> Self {
        match e {
            PromptError::Chat(e) => EvalError::Chat(e),
            PromptError::Tokenizer(e) => EvalError::Tokenizer(e),
        }
    }
}

/// Everything that decides an evaluation (`configs/llm/eval-arith.toml`
/// spells out the defaults, but for the arithmetic configs' lenient
/// `verify.format`).
///
/// Deserializing fills a missing top-level key from [`EvalConfig::default`],
/// but a *partial* nested table (`[sampling]`, `[verify]`, `[data]`) from its
/// own type's `Default` (training sampling, `builtin:arith-train`), which
/// differ from this config's. Layer partial configs onto the serialised
/// default instead, as `r2vpo llm eval` does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Samples per problem.
    pub k: usize,
    /// The k' of the pass@k' columns, each in `1..=k`. Empty (the default)
    /// means `[1, k]`.
    pub pass_k: Vec<usize>,
    /// Sequences decoded together (a memory/throughput trade-off only: the
    /// results do not depend on it).
    pub batch_size: usize,
    /// How a question becomes the user message.
    pub template: PromptTemplate,
    /// Qwen3's thinking switch (`false`: the paper's fast mode); unset leaves
    /// the template's default.
    pub enable_thinking: Option<bool>,
    /// Keep every response text in the report (large; for debugging rewards).
    pub save_responses: bool,
    /// A problem whose prompt plus `sampling.max_new_tokens` exceeds the
    /// model's context (`max_position_embeddings`): `"skip"` (default) leaves
    /// it out, `"truncate"` cuts the question's tail to fit (see
    /// [`OverlongPrompts`]). Either way it is named in a warning and counted
    /// in the report; if every problem is skipped the evaluation fails.
    pub overlong_prompts: OverlongPrompts,
    /// Test-time sampling; `sampling.seed` is the base of every sample's seed.
    pub sampling: SamplingConfig,
    /// Answer extraction and equivalence.
    pub verify: VerifyConfig,
    /// Which problems (read by the caller with [`load_eval_problems`]).
    pub data: DataConfig,
    /// Several benchmark files in one evaluation (AIME 2024, AMC 2023, …):
    /// each is read with `data`'s settings but its own path, its problems'
    /// source is its name (one row each) and the table gains a macro
    /// average over them. Empty (the default): `data` alone.
    pub benchmarks: Vec<Benchmark>,
}

/// One benchmark file of [`EvalConfig::benchmarks`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Benchmark {
    /// The row's name (`aime24`); problem ids become `<name>/<id>`.
    pub name: String,
    /// A JSONL or parquet file, read as `data.path` would be.
    pub path: String,
}

/// The problems an evaluation reads: `cfg.data`, or each of
/// `cfg.benchmarks` with `cfg.data`'s other settings (schema, keys,
/// limit per file), sourced and id-prefixed by its name. Skipped records
/// come back for the caller to report.
pub fn load_eval_problems(cfg: &EvalConfig) -> Result<LoadedProblems, DataError> {
    if cfg.benchmarks.is_empty() {
        return load_problems_reporting(&cfg.data);
    }
    let mut all = LoadedProblems { problems: Vec::new(), skipped: Vec::new() };
    for b in &cfg.benchmarks {
        let data = DataConfig { path: b.path.clone(), ..cfg.data.clone() };
        let loaded = load_problems_reporting(&data)?;
        all.skipped.extend(loaded.skipped);
        all.problems.extend(loaded.problems.into_iter().map(|p| Problem {
            id: format!("{}/{}", b.name, p.id),
            source: b.name.clone(),
            ..p
        }));
    }
    Ok(all)
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            k: 16,
            pass_k: Vec::new(),
            batch_size: 32,
            template: PromptTemplate::Dapo,
            enable_thinking: None,
            save_responses: false,
            overlong_prompts: OverlongPrompts::Skip,
            // 256 new tokens: enough for the built-in tasks' step-by-step
            // answers from small models, and affordable on CPU.
            sampling: SamplingConfig { max_new_tokens: 256, ..SamplingConfig::test_time() },
            // The default problems are the built-in arithmetic ones, whose
            // golds are integers: an unevaluated expression is no answer.
            verify: VerifyConfig { require_literal_answer: true, ..VerifyConfig::dapo() },
            data: DataConfig::builtin_eval(1, 200),
            benchmarks: Vec::new(),
        }
    }
}

impl EvalConfig {
    /// Checks ranges; errors name the dotted field.
    pub fn validate(&self) -> Result<(), EvalError> {
        let bad = |field: &str, message: String| Err(EvalError::Config { field: field.into(), message });
        if self.k == 0 {
            return bad("k", "must be at least 1".into());
        }
        if self.batch_size == 0 {
            return bad("batch_size", "must be at least 1".into());
        }
        if let Some(&p) = self.pass_k.iter().find(|&&p| p == 0 || p > self.k) {
            return bad("pass_k", format!("{p} is not in 1..=k (k = {})", self.k));
        }
        if self.sampling.max_new_tokens == 0 {
            return bad("sampling.max_new_tokens", "must be at least 1".into());
        }
        let mut names = HashSet::new();
        for b in &self.benchmarks {
            if b.name.trim().is_empty() || b.path.trim().is_empty() {
                return bad("benchmarks", format!("{b:?}: every benchmark needs a name and a path"));
            }
            if !names.insert(b.name.as_str()) {
                return bad("benchmarks", format!("the name `{}` is given twice", b.name));
            }
        }
        self.sampling.validate().map_err(|e| match e {
            SampleError::Config { field, message } => EvalError::Config { field: format!("sampling.{field}"), message },
            other => EvalError::Sample(other),
        })
    }

    /// The pass@k' values reported: [`EvalConfig::pass_k`] sorted and
    /// de-duplicated, or `[1, k]` when it is empty.
    pub fn resolved_pass_k(&self) -> Vec<usize> {
        let mut v = if self.pass_k.is_empty() { vec![1, self.k] } else { self.pass_k.clone() };
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The unbiased pass@k estimator of Chen et al. (2021): the probability that
/// at least one of k samples drawn without replacement from n, of which c
/// are correct, is correct, 1 − C(n−c, k)/C(n, k).
///
/// Computed as 1 − ∏_{i=n−c+1}^{n} (1 − k/i), which never forms the
/// (overflowing) binomials; for k = 1 it returns c/n exactly, so pass@1 and
/// avg@k agree bit for bit.
///
/// # Panics
/// If `k` is not in `1..=n` or `c > n`.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    assert!((1..=n).contains(&k) && c <= n, "pass_at_k needs 1 <= k <= n and c <= n (n = {n}, c = {c}, k = {k})");
    if k == 1 {
        return c as f64 / n as f64;
    }
    if n - c < k {
        return 1.0;
    }
    let fail: f64 = (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    1.0 - fail
}

/// Majority vote over the samples' answers (`None`: no answer, no vote).
/// Returns the index of the first sample carrying the winning answer, or
/// `None` if no sample has one.
///
/// Ties go to the answer that appeared first (lowest sample index): samples
/// are ordered by their seeds, so the result is deterministic, and it favours
/// no answer by its text.
pub fn majority_vote<S: AsRef<str>>(answers: &[Option<S>]) -> Option<usize> {
    let mut tally: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, a) in answers.iter().enumerate() {
        if let Some(a) = a {
            tally.entry(a.as_ref()).or_insert((0, i)).0 += 1;
        }
    }
    tally.into_values().max_by(|(ca, ia), (cb, ib)| ca.cmp(cb).then(ib.cmp(ia))).map(|(_, first)| first)
}

/// The seed of sample `sample` of the problem with id `problem_id` under
/// the base seed `base`: independent of batching and problem order.
pub fn sample_seed(base: u64, problem_id: &str, sample: usize) -> u64 {
    // FNV-1a: fixed by definition, so seeds survive Rust upgrades.
    request_seed(request_seed(base, crate::data::fnv1a(problem_id)), sample as u64)
}

/// The answer a verdict votes with in maj@k: the normalised extracted
/// answer, so `0.50` and `.5` vote together; equivalent answers that
/// normalise differently (`1/2` and `0.5`) count as different votes.
fn vote_key(v: &Verdict) -> Option<String> {
    (v.extracted.is_some() && !v.normalized_answer.is_empty()).then(|| v.normalized_answer.clone())
}

/// Results of one problem.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProblemResult {
    /// [`Problem::id`].
    pub id: String,
    /// [`Problem::source`].
    pub source: String,
    /// The gold answer.
    pub gold: String,
    /// Number of correct samples (of k).
    pub correct: usize,
    /// Per sample: whether it was correct.
    pub sample_correct: Vec<bool>,
    /// Per sample: the extracted answer, before normalisation.
    pub extracted: Vec<Option<String>>,
    /// Per sample: generated tokens, including the end-of-turn token.
    pub response_tokens: Vec<usize>,
    /// Samples cut off by `max_new_tokens`.
    pub truncated: usize,
    /// The normalised answer that won the majority vote.
    pub majority_answer: Option<String>,
    /// Whether the majority answer is correct.
    pub majority_correct: bool,
    /// Per sample: the response text (only with `save_responses`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responses: Option<Vec<String>>,
}

/// Metrics over a set of problems (one source, or all).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The source, or `all`.
    pub source: String,
    /// Problems.
    pub problems: usize,
    /// Samples (problems × k).
    pub samples: usize,
    /// Mean accuracy over all samples.
    pub avg_at_k: f64,
    /// Unbiased pass@k' for each reported k'.
    pub pass_at: BTreeMap<usize, f64>,
    /// Fraction of problems whose majority answer is correct.
    pub maj_at_k: f64,
    /// Mean generated tokens per sample (including the end-of-turn token).
    pub mean_response_tokens: f64,
    /// Fraction of samples cut off by `max_new_tokens`.
    pub truncated_fraction: f64,
    /// Fraction of samples from which an answer was extracted.
    pub extracted_fraction: f64,
}

impl Summary {
    /// Each metric's unweighted mean over `rows` (one per source); counts
    /// are totals.
    fn macro_average(rows: &[Summary]) -> Summary {
        let n = rows.len() as f64;
        let mean = |f: &dyn Fn(&Summary) -> f64| rows.iter().map(f).sum::<f64>() / n;
        let ks: Vec<usize> = rows.first().map(|r| r.pass_at.keys().copied().collect()).unwrap_or_default();
        Summary {
            source: "macro average".into(),
            problems: rows.iter().map(|r| r.problems).sum(),
            samples: rows.iter().map(|r| r.samples).sum(),
            avg_at_k: mean(&|r| r.avg_at_k),
            pass_at: ks.iter().map(|&p| (p, mean(&|r| r.pass_at.get(&p).copied().unwrap_or(f64::NAN)))).collect(),
            maj_at_k: mean(&|r| r.maj_at_k),
            mean_response_tokens: mean(&|r| r.mean_response_tokens),
            truncated_fraction: mean(&|r| r.truncated_fraction),
            extracted_fraction: mean(&|r| r.extracted_fraction),
        }
    }

    fn of(source: &str, results: &[&ProblemResult], k: usize, pass_k: &[usize]) -> Self {
        let n = results.len();
        let samples = n * k;
        // Both averages are means of per-problem values in the same order, so
        // pass@1 (= c/k per problem) equals avg@k exactly.
        let mean = |f: &dyn Fn(&ProblemResult) -> f64| results.iter().map(|r| f(r)).sum::<f64>() / n as f64;
        let per_sample =
            |f: &dyn Fn(&ProblemResult) -> usize| results.iter().map(|r| f(r)).sum::<usize>() as f64 / samples as f64;
        Summary {
            source: source.to_string(),
            problems: n,
            samples,
            avg_at_k: mean(&|r| pass_at_k(k, r.correct, 1)),
            pass_at: pass_k.iter().map(|&p| (p, mean(&|r| pass_at_k(k, r.correct, p)))).collect(),
            maj_at_k: mean(&|r| f64::from(u8::from(r.majority_correct))),
            mean_response_tokens: per_sample(&|r| r.response_tokens.iter().sum()),
            truncated_fraction: per_sample(&|r| r.truncated),
            extracted_fraction: per_sample(&|r| r.extracted.iter().filter(|e| e.is_some()).count()),
        }
    }
}

/// The outcome of [`evaluate`]; written as `eval.json` by `r2vpo llm eval`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// The model file or folder (filled in by the caller; empty otherwise).
    pub model_path: String,
    /// The model's `model_type` (e.g. `llama`).
    pub model_type: String,
    /// The model's parameter count.
    pub parameters: usize,
    /// The configuration evaluated with.
    pub config: EvalConfig,
    /// The pass@k' values reported ([`EvalConfig::resolved_pass_k`]).
    pub pass_k: Vec<usize>,
    /// Metrics over all problems.
    pub overall: Summary,
    /// Metrics per source, sorted by source.
    pub per_source: Vec<Summary>,
    /// With more than one source (several [`EvalConfig::benchmarks`]): each
    /// metric's unweighted mean over the sources, as papers average their
    /// benchmarks (a small benchmark counts as much as a large one); `all`
    /// is the mean over problems.
    #[serde(default)]
    pub macro_average: Option<Summary>,
    /// Per-problem results, in the order of the problems given (without the
    /// skipped ones).
    pub problems: Vec<ProblemResult>,
    /// Problems left out because their prompt plus `sampling.max_new_tokens`
    /// exceeds the model's context, in the order given
    /// ([`EvalConfig::overlong_prompts`]).
    #[serde(default)]
    pub skipped_prompts: Vec<OverlongPrompt>,
    /// Problems evaluated with a truncated prompt
    /// (`overlong_prompts = "truncate"`), in the order given.
    #[serde(default)]
    pub truncated_prompts: Vec<OverlongPrompt>,
    /// Tokens generated in total.
    pub generated_tokens: usize,
    /// Wall-clock seconds (prompt rendering, generation, verification).
    pub wall_seconds: f64,
    /// Generated tokens per wall-clock second.
    pub tokens_per_s: f64,
    /// Samples each rank decoded, in rank order, where the ranks of a
    /// data-parallel job shared the evaluation ([`evaluate_ranks`]); empty
    /// for one process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_samples: Vec<usize>,
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

impl EvalReport {
    /// A Markdown table: one row per source, then `all`, then the macro
    /// average over sources when there are several.
    pub fn to_markdown(&self) -> String {
        let k = self.config.k;
        let mut head = vec!["source".to_string(), "problems".into(), format!("avg@{k}")];
        head.extend(self.pass_k.iter().map(|p| format!("pass@{p}")));
        head.extend([format!("maj@{k}"), "mean tokens".into(), "truncated".into(), "answer found".into()]);
        let mut out = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
        for s in self.per_source.iter().chain(std::iter::once(&self.overall)).chain(&self.macro_average) {
            let mut row = vec![s.source.clone(), s.problems.to_string(), pct(s.avg_at_k)];
            row.extend(self.pass_k.iter().map(|p| s.pass_at.get(p).map_or("-".into(), |&v| pct(v))));
            row.extend([
                pct(s.maj_at_k),
                format!("{:.1}", s.mean_response_tokens),
                pct(s.truncated_fraction),
                pct(s.extracted_fraction),
            ]);
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }
}

/// Evaluates `model` on `problems`: k samples per problem with
/// `cfg.sampling`, decoded `cfg.batch_size` at a time, each verified against
/// the gold answer with `cfg.verify`. `progress(done, total)` is called with
/// sample counts before the first batch and after each one.
///
/// Prompts that do not fit the model's context with
/// `cfg.sampling.max_new_tokens` are skipped or truncated
/// ([`EvalConfig::overlong_prompts`]) and listed in the report; the caller
/// prints the warnings. Errors: [`EvalError::AllPromptsTooLong`] when no
/// problem is left, [`EvalError::Config`] on `sampling.max_new_tokens` when
/// it leaves no room for any prompt.
pub fn evaluate(
    model: &dyn Policy,
    tok: &Tokenizer,
    problems: &[Problem],
    cfg: &EvalConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalReport, EvalError> {
    evaluate_ranks(model, tok, problems, cfg, progress, None)
}

/// What a rank sends of one sample: enough to build its problem's
/// [`ProblemResult`].
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SampleOutcome {
    correct: bool,
    extracted: Option<String>,
    vote: Option<String>,
    tokens: usize,
    truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

/// [`evaluate`] on every rank of a data-parallel job (`group`; `None` is
/// one process, [`evaluate`] itself): the batches of
/// `cfg.batch_size` requests (the ones one process would decode, in the same
/// order) are dealt to the ranks in turn, each rank decodes and verifies its
/// own, and one exchange at the end (`all_gather_bytes` of each sample's
/// verdict, answer, length and, with `save_responses`, text) gives every
/// rank the whole report. Every batch is the one-process batch and every
/// sample keeps its seed, so the report is the one-process report (tested
/// on CPU ranks); the ranks wait on each other only for the difference
/// between their shares, not for a whole evaluation. `progress` counts this
/// rank's samples. Every rank must call it with the same problems and
/// configuration.
pub fn evaluate_ranks(
    model: &dyn Policy,
    tok: &Tokenizer,
    problems: &[Problem],
    cfg: &EvalConfig,
    progress: &mut dyn FnMut(usize, usize),
    mut group: Option<&mut dyn crate::parallel::Group>,
) -> Result<EvalReport, EvalError> {
    cfg.validate()?;
    if problems.is_empty() {
        return Err(EvalError::NoProblems);
    }
    let mut ids = HashSet::new();
    if let Some(p) = problems.iter().find(|p| !ids.insert(p.id.as_str())) {
        return Err(EvalError::DuplicateId(p.id.clone()));
    }
    let t0 = Instant::now();
    let context = model.config().max_position_embeddings;
    let max_new_tokens = cfg.sampling.max_new_tokens;
    if max_new_tokens >= context {
        return Err(EvalError::Config {
            field: "sampling.max_new_tokens".into(),
            message: format!("{max_new_tokens} leaves no room for a prompt in the model's context of {context} tokens"),
        });
    }
    let chat = ChatTemplate::from_tokenizer(tok)?;
    let fitter = PromptFitter::new(
        tok,
        &chat,
        cfg.template,
        cfg.enable_thinking,
        context,
        max_new_tokens,
        cfg.overlong_prompts,
    )?;
    let note = |p: &Problem, prompt_tokens: usize| OverlongPrompt {
        id: p.id.clone(),
        prompt_tokens,
        max_prompt_tokens: fitter.max_prompt_tokens(),
    };
    let mut skipped_prompts = Vec::new();
    let mut truncated_prompts = Vec::new();
    let mut kept: Vec<(&Problem, Vec<u32>)> = Vec::with_capacity(problems.len());
    for p in problems {
        match fitter.fit(tok, &chat, &p.question)? {
            Fitted::Fits(ids) => kept.push((p, ids)),
            Fitted::Truncated { ids, prompt_tokens } => {
                truncated_prompts.push(note(p, prompt_tokens));
                kept.push((p, ids));
            }
            Fitted::Skipped { prompt_tokens } => skipped_prompts.push(note(p, prompt_tokens)),
        }
    }
    if kept.is_empty() {
        let first = &skipped_prompts[0];
        return Err(EvalError::AllPromptsTooLong {
            skipped: skipped_prompts.len(),
            context,
            max_new_tokens,
            first_id: first.id.clone(),
            first_tokens: first.prompt_tokens,
        });
    }
    let k = cfg.k;
    let mut requests = Vec::with_capacity(kept.len() * k);
    for (p, prompt_ids) in &kept {
        // Problem-major order: a batch holds consecutive samples of the same
        // prompts, which `generate` prefills once.
        requests.extend((0..k).map(|j| GenerationRequest {
            prompt_ids: prompt_ids.clone(),
            seed: sample_seed(cfg.sampling.seed, &p.id, j),
        }));
    }
    let (rank, world) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.world()));
    let batches: Vec<&[GenerationRequest]> = requests.chunks(cfg.batch_size).collect();
    let mine: Vec<usize> = (0..batches.len()).filter(|b| b % world == rank).collect();
    let total: usize = mine.iter().map(|&b| batches[b].len()).sum();
    // Each of this rank's batches: (batch index, its samples' outcomes).
    let mut decoded: Vec<(usize, Vec<SampleOutcome>)> = Vec::with_capacity(mine.len());
    let mut done = 0;
    progress(0, total);
    for &b in &mine {
        let gens = model.generate(tok, batches[b], &cfg.sampling)?;
        let first = b * cfg.batch_size;
        let outcomes = gens
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                let problem = kept[(first + i) / k].0;
                let v = verify(&g.text, &problem.answer, &cfg.verify);
                SampleOutcome {
                    correct: v.correct,
                    vote: vote_key(&v),
                    extracted: v.extracted,
                    tokens: g.token_ids.len(),
                    truncated: g.finish_reason == FinishReason::Length,
                    text: cfg.save_responses.then_some(g.text),
                }
            })
            .collect::<Vec<_>>();
        done += outcomes.len();
        decoded.push((b, outcomes));
        progress(done, total);
    }
    let mut rank_samples = Vec::new();
    if let Some(g) = group.as_mut() {
        let bytes = serde_json::to_vec(&decoded).map_err(|e| EvalError::Ranks(e.to_string()))?;
        decoded = Vec::with_capacity(batches.len());
        for (r, part) in g.all_gather_bytes(&bytes).map_err(|e| EvalError::Ranks(e.to_string()))?.iter().enumerate() {
            let theirs: Vec<(usize, Vec<SampleOutcome>)> = serde_json::from_slice(part)
                .map_err(|e| EvalError::Ranks(format!("rank {r}'s outcomes do not parse: {e}")))?;
            rank_samples.push(theirs.iter().map(|(_, o)| o.len()).sum());
            decoded.extend(theirs);
        }
        decoded.sort_by_key(|(b, _)| *b);
    }
    let outcomes: Vec<SampleOutcome> = decoded.into_iter().flat_map(|(_, o)| o).collect();
    if outcomes.len() != requests.len() {
        return Err(EvalError::Ranks(format!(
            "{} samples came back for {} requests (the ranks evaluated different problems?)",
            outcomes.len(),
            requests.len()
        )));
    }

    let results: Vec<ProblemResult> = kept
        .iter()
        .map(|(p, _)| *p)
        .zip(outcomes.chunks(k))
        .map(|(p, os)| {
            let votes: Vec<Option<String>> = os.iter().map(|o| o.vote.clone()).collect();
            let winner = majority_vote(&votes);
            ProblemResult {
                id: p.id.clone(),
                source: p.source.clone(),
                gold: p.answer.clone(),
                correct: os.iter().filter(|o| o.correct).count(),
                sample_correct: os.iter().map(|o| o.correct).collect(),
                extracted: os.iter().map(|o| o.extracted.clone()).collect(),
                response_tokens: os.iter().map(|o| o.tokens).collect(),
                truncated: os.iter().filter(|o| o.truncated).count(),
                majority_answer: winner.and_then(|w| votes[w].clone()),
                majority_correct: winner.is_some_and(|w| os[w].correct),
                responses: cfg.save_responses.then(|| os.iter().map(|o| o.text.clone().unwrap_or_default()).collect()),
            }
        })
        .collect();

    let pass_k = cfg.resolved_pass_k();
    let all: Vec<&ProblemResult> = results.iter().collect();
    let overall = Summary::of("all", &all, k, &pass_k);
    let mut by_source: BTreeMap<&str, Vec<&ProblemResult>> = BTreeMap::new();
    for r in &results {
        by_source.entry(r.source.as_str()).or_default().push(r);
    }
    let per_source: Vec<Summary> = by_source.iter().map(|(s, rs)| Summary::of(s, rs, k, &pass_k)).collect();
    let macro_average = (per_source.len() > 1).then(|| Summary::macro_average(&per_source));
    let generated_tokens: usize = outcomes.iter().map(|o| o.tokens).sum();
    let wall_seconds = t0.elapsed().as_secs_f64();
    Ok(EvalReport {
        model_path: String::new(),
        model_type: model.config().model_type.clone(),
        parameters: crate::model::expected_params(model.config())
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>())
            .sum(),
        config: cfg.clone(),
        pass_k,
        overall,
        per_source,
        macro_average,
        problems: results,
        skipped_prompts,
        truncated_prompts,
        generated_tokens,
        wall_seconds,
        tokens_per_s: generated_tokens as f64 / wall_seconds.max(1e-9),
        rank_samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binom(n: usize, k: usize) -> f64 {
        if k > n {
            return 0.0;
        }
        (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
    }

    /// Fraction of the k-subsets of n samples (the first c correct) that
    /// contain a correct sample, by enumerating every subset as a bitmask.
    fn brute_pass(n: usize, c: usize, k: usize) -> f64 {
        let (mut hit, mut all) = (0u64, 0u64);
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize != k {
                continue;
            }
            all += 1;
            if mask & ((1u32 << c) - 1) != 0 {
                hit += 1;
            }
        }
        hit as f64 / all as f64
    }

    #[test]
    fn pass_at_k_matches_enumeration() {
        for n in 1..=10 {
            for c in 0..=n {
                for k in 1..=n {
                    let got = pass_at_k(n, c, k);
                    let want = brute_pass(n, c, k);
                    assert!((got - want).abs() < 1e-12, "n={n} c={c} k={k}: {got} vs {want}");
                    let closed = 1.0 - binom(n - c, k) / binom(n, k);
                    assert!((got - closed).abs() < 1e-12, "n={n} c={c} k={k}: {got} vs {closed}");
                }
            }
        }
    }

    #[test]
    fn pass_at_k_edge_cases() {
        for n in [1, 4, 16, 200] {
            for k in [1, n / 2 + 1, n] {
                assert_eq!(pass_at_k(n, 0, k), 0.0, "no correct sample");
                assert_eq!(pass_at_k(n, n, k), 1.0, "all correct");
            }
            // k = n: any correct sample is in the only subset.
            assert_eq!(pass_at_k(n, 1, n), 1.0);
            // k = 1 is exactly the mean accuracy.
            for c in 0..=n {
                assert_eq!(pass_at_k(n, c, 1), c as f64 / n as f64);
            }
        }
        // Large n stays finite and accurate (binomials would overflow).
        let p = pass_at_k(2000, 3, 1000);
        assert!((p - (1.0 - (1000.0 * 999.0 * 998.0) / (2000.0 * 1999.0 * 1998.0))).abs() < 1e-12, "{p}");
        // Strictly increasing in k and in c until it reaches 1 (at k > n − c).
        for k in 1..=13 {
            assert!(pass_at_k(16, 3, k) < pass_at_k(16, 3, k + 1));
            assert!(pass_at_k(16, 3, k) < pass_at_k(16, 4, k));
        }
        assert_eq!(pass_at_k(16, 3, 14), 1.0);
    }

    #[test]
    #[should_panic(expected = "1 <= k <= n")]
    fn pass_at_k_rejects_k_above_n() {
        pass_at_k(4, 1, 5);
    }

    #[test]
    fn majority_vote_counts_and_breaks_ties_by_first_appearance() {
        let v = |xs: &[Option<&str>]| majority_vote(xs);
        assert_eq!(v(&[]), None);
        assert_eq!(v(&[None, None]), None);
        assert_eq!(v(&[None, Some("3")]), Some(1));
        assert_eq!(v(&[Some("1"), Some("2"), Some("2")]), Some(1));
        // Missing answers never win, however many there are.
        assert_eq!(v(&[None, None, None, Some("7")]), Some(3));
        // Ties: the answer seen first wins, whatever its text.
        assert_eq!(v(&[Some("9"), Some("1"), Some("1"), Some("9")]), Some(0));
        assert_eq!(v(&[Some("1"), Some("9"), Some("9"), Some("1")]), Some(0));
        assert_eq!(v(&[None, Some("b"), Some("a")]), Some(1));
        // The returned index is the winner's first occurrence.
        assert_eq!(v(&[Some("x"), Some("y"), Some("y"), Some("x"), Some("y")]), Some(1));
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = EvalConfig::default();
        c.validate().unwrap();
        assert_eq!(c.resolved_pass_k(), vec![1, 16]);
        assert_eq!((c.sampling.temperature, c.sampling.top_p, c.sampling.top_k), (0.6, 0.95, 20));
        let one = EvalConfig { k: 1, ..EvalConfig::default() };
        assert_eq!(one.resolved_pass_k(), vec![1]);
        let custom = EvalConfig { pass_k: vec![8, 1, 8, 4], ..EvalConfig::default() };
        assert_eq!(custom.resolved_pass_k(), vec![1, 4, 8]);
        let field = |c: EvalConfig| match c.validate() {
            Err(EvalError::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(EvalConfig { k: 0, ..EvalConfig::default() }), "k");
        assert_eq!(field(EvalConfig { batch_size: 0, ..EvalConfig::default() }), "batch_size");
        assert_eq!(field(EvalConfig { pass_k: vec![1, 17], ..EvalConfig::default() }), "pass_k");
        assert_eq!(field(EvalConfig { pass_k: vec![0], ..EvalConfig::default() }), "pass_k");
        let mut s = EvalConfig::default();
        s.sampling.top_p = 1.5;
        assert_eq!(field(s), "sampling.top_p");
        let mut s = EvalConfig::default();
        s.sampling.max_new_tokens = 0;
        assert_eq!(field(s), "sampling.max_new_tokens");
        let msg = EvalConfig { pass_k: vec![32], ..EvalConfig::default() }.validate().unwrap_err().to_string();
        assert!(msg.contains("`pass_k`") && msg.contains("32"), "{msg}");
    }

    #[test]
    fn config_serde_round_trip_and_unknown_keys() {
        let c = EvalConfig { k: 4, pass_k: vec![1, 2], enable_thinking: Some(false), ..EvalConfig::default() };
        let back: EvalConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert!(serde_json::from_str::<EvalConfig>(r#"{"kk": 4}"#).is_err());
        let partial: EvalConfig = serde_json::from_str(r#"{"k": 2, "sampling": {"max_new_tokens": 8}}"#).unwrap();
        assert_eq!((partial.k, partial.sampling.max_new_tokens), (2, 8));
        // Plain serde fills a partial nested table from that type's own
        // defaults (training sampling, T = 1), not from EvalConfig's: the
        // reason `r2vpo llm eval` layers files onto the serialised default.
        assert_eq!(partial.sampling.temperature, 1.0);
    }

    #[test]
    fn sample_seeds_differ_and_are_stable() {
        let a = sample_seed(0, "arith-eval-d1-0", 0);
        assert_eq!(a, sample_seed(0, "arith-eval-d1-0", 0));
        let others = [
            sample_seed(0, "arith-eval-d1-0", 1),
            sample_seed(0, "arith-eval-d1-1", 0),
            sample_seed(1, "arith-eval-d1-0", 0),
        ];
        assert!(others.iter().all(|&s| s != a));
    }

    #[test]
    fn summary_metrics_by_hand() {
        let r = |c: usize, k: usize, maj: bool, found: usize, trunc: usize| ProblemResult {
            id: String::new(),
            source: "s".into(),
            gold: "1".into(),
            correct: c,
            sample_correct: (0..k).map(|i| i < c).collect(),
            extracted: (0..k).map(|i| (i < found).then(|| "1".to_string())).collect(),
            response_tokens: vec![10; k],
            truncated: trunc,
            majority_answer: None,
            majority_correct: maj,
            responses: None,
        };
        let a = r(0, 4, false, 1, 4);
        let b = r(2, 4, true, 4, 0);
        let s = Summary::of("s", &[&a, &b], 4, &[1, 2, 4]);
        assert_eq!((s.problems, s.samples), (2, 8));
        assert_eq!(s.avg_at_k, 0.25);
        assert_eq!(s.pass_at[&1], 0.25);
        // Problem b: 1 − C(2,2)/C(4,2) = 5/6; a contributes 0.
        assert!((s.pass_at[&2] - 5.0 / 12.0).abs() < 1e-15);
        assert_eq!(s.pass_at[&4], 0.5);
        assert_eq!(s.maj_at_k, 0.5);
        assert_eq!(s.mean_response_tokens, 10.0);
        assert_eq!(s.truncated_fraction, 0.5);
        assert_eq!(s.extracted_fraction, 5.0 / 8.0);
    }
}
