//! `r2vpo llm eval`: avg@k / pass@k / maj@k of a model on math problems
//! (issue #5), with the paper's test-time sampling by default.
//!
//! The output folder gets `config.toml` (the resolved [`EvalConfig`],
//! written before generation starts), `eval.json` ([`EvalReport`]: summaries
//! and every problem's samples) and `eval.md` (the command line and the
//! Markdown table).

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use toml::Value;

use r2vpo_llm::backend::open::{open_inference, BackendSpec};
use r2vpo_llm::eval::{evaluate_ranks, load_eval_problems, EvalConfig, EvalReport};
use r2vpo_llm::parallel::{Group, Launch};
use r2vpo_llm::tokenizer::Tokenizer;
use r2vpo_report::edge::{open_run_folder, Existing};

#[cfg(test)]
use crate::args::ConfigArgs;
use crate::args::RunArgs;
use crate::config;

/// The embedded default model (`make deps`).
pub const DEFAULT_MODEL: &str = ".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// `r2vpo llm eval` arguments.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// `--config`, `--set`, `--seed`, `--out`, `--quiet`.
    #[command(flatten)]
    pub run: RunArgs,
    /// Model: a GGUF file or a Hugging Face folder.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Dataset: `builtin:arith-eval`, `builtin:arith-train` or a .jsonl file
    /// (sets `data.path`).
    #[arg(long)]
    pub data: Option<String>,
    /// Samples per problem (sets `k`).
    #[arg(long)]
    pub k: Option<usize>,
    /// Evaluate only the first N problems (sets `data.limit`; with
    /// benchmarks, of each file).
    #[arg(long)]
    pub limit: Option<usize>,
    /// A benchmark file as `NAME=PATH` (JSONL or parquet, read with the
    /// `[data]` settings), repeatable: one row each and their macro average
    /// (sets `benchmarks`).
    #[arg(long = "benchmark", value_name = "NAME=PATH")]
    pub benchmarks: Vec<String>,
    /// The backend that decodes (`--backend`, `--device`, `--dtype`, as
    /// `r2vpo serve`'s); each rank of a launched job takes
    /// `cuda:LOCAL_RANK` for `cuda`.
    #[command(flatten)]
    pub engine: r2vpo_bench::backend_args::BackendArgs,
    /// Under torchrun, srun or `r2vpo launch`: seconds a rank waits for the
    /// others at the exchange that ends the evaluation (the difference
    /// between two ranks' shares).
    #[arg(long, default_value_t = 1800.0)]
    pub dist_timeout: f64,
}

impl EvalArgs {
    /// The backend `--backend`, `--device` and `--dtype` describe, on
    /// this rank's device when launched; the error names the option.
    fn spec(&self, launch: Option<&r2vpo_llm::parallel::Launch>) -> Result<BackendSpec> {
        let mut spec = self.engine.spec()?;
        if let Some(l) = launch {
            spec.device = r2vpo_llm::parallel::rank_device(&spec.device, l.local_rank);
        }
        Ok(spec)
    }
}

/// Loads an [`EvalConfig`] ([`config::load`]: the serialised default, the
/// file merged into it, then each `--set`), then validates it.
pub fn load_config(file: Option<&Path>, sets: &[String]) -> Result<EvalConfig> {
    let cfg: EvalConfig = config::load(file, sets)?;
    cfg.validate().with_context(|| config::source(file, sets))?;
    Ok(cfg)
}

/// The config of `a`: file, then the shortcut flags, then `--set`s.
pub fn resolve(a: &EvalArgs) -> Result<EvalConfig> {
    let mut sets = Vec::new();
    if let Some(d) = &a.data {
        // Quoted, so a path that looks like a number stays a string.
        sets.push(format!("data.path={}", Value::String(d.clone())));
    }
    if let Some(k) = a.k {
        sets.push(format!("k={k}"));
    }
    if let Some(n) = a.limit {
        sets.push(format!("data.limit={n}"));
    }
    if !a.benchmarks.is_empty() {
        let mut items = Vec::new();
        for b in &a.benchmarks {
            let (name, path) = b
                .split_once('=')
                .filter(|(n, p)| !n.is_empty() && !p.is_empty())
                .with_context(|| format!("--benchmark {b:?}: expected NAME=PATH, e.g. aime24=data/aime24.parquet"))?;
            items.push(format!("{{ name = {}, path = {} }}", Value::String(name.into()), Value::String(path.into())));
        }
        sets.push(format!("benchmarks=[{}]", items.join(", ")));
    }
    if let Some(s) = a.run.seed {
        sets.push(format!("sampling.seed={s}"));
    }
    sets.extend(a.run.cfg.sets.iter().cloned());
    load_config(a.run.cfg.config.as_deref(), &sets)
}

/// `YYYYmmdd-HHMMSS` in UTC.
fn utc_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The command line as typed, quoted where a shell would need it.
fn command_line() -> String {
    let quote = |s: String| {
        if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+".contains(c)) {
            s
        } else {
            format!("'{}'", s.replace('\'', r"'\''"))
        }
    };
    let mut args = std::env::args();
    // The binary as `r2vpo`, wherever it was run from.
    args.next();
    std::iter::once("r2vpo".to_string()).chain(args.map(quote)).collect::<Vec<_>>().join(" ")
}

/// `eval.md`: what was run, then the table.
fn markdown(report: &EvalReport, command: &str) -> String {
    let c = &report.config;
    let s = &c.sampling;
    let data = if !c.benchmarks.is_empty() {
        let files: Vec<String> = c.benchmarks.iter().map(|b| format!("{} (`{}`)", b.name, b.path)).collect();
        format!("the benchmarks {}", files.join(", "))
    } else if c.data.path.starts_with("builtin:") {
        format!("`{}` (difficulty {}, seed {})", c.data.path, c.data.difficulty, c.data.seed)
    } else {
        format!("`{}`", c.data.path)
    };
    format!(
        "# Evaluation of `{model}`\n\n```sh\n{command}\n```\n\n\
         {problems} problems from {data}; k = {k} samples each at T = {t}, top-p = {p}, top-k = {tk}, \
         at most {max} new tokens; prompt template `{template}`, answers read as `{format}`. \
         {tokens} tokens generated in {wall:.1} s ({tps:.1} tokens/s, {threads} threads).\n\n{table}",
        model = report.model_path,
        problems = report.overall.problems,
        k = c.k,
        t = s.temperature,
        p = s.top_p,
        tk = s.top_k,
        max = s.max_new_tokens,
        template = serde_plain(&c.template),
        format = serde_plain(&c.verify.format),
        tokens = report.generated_tokens,
        wall = report.wall_seconds,
        tps = report.tokens_per_s,
        threads = rayon::current_num_threads(),
        table = report.to_markdown(),
    )
}

/// A unit enum's serde name (`answer-line`), as configs spell it.
fn serde_plain<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// Evaluates with the resolved config and writes the output folder; returns
/// the report.
///
/// Dataset lines over the line bound (`r2vpo_llm::data::MAX_LINE_BYTES`)
/// and problems whose prompt plus `sampling.max_new_tokens` exceeds the
/// model's context are skipped (or, with `overlong_prompts = "truncate"`,
/// truncated) with a `warning:` line each on stderr and a count; if no
/// problem is left the command fails (exit status 1) saying why.
/// Where and how `llm eval` runs: the model, the backend it decodes on,
/// and (launched) the job's group, rank 0 alone writing the run folder.
struct Runner<'a> {
    model_path: &'a Path,
    spec: BackendSpec,
    group: Option<Box<dyn Group>>,
}

fn run_eval(
    runner: Runner<'_>,
    cfg: &EvalConfig,
    out: &Path,
    existing: Existing,
    command: &str,
    quiet: bool,
) -> Result<Option<EvalReport>> {
    let Runner { model_path, spec, mut group } = runner;
    let writer = group.as_ref().is_none_or(|g| g.rank() == 0);
    let what = if cfg.benchmarks.is_empty() {
        format!("data `{}` (config table `[data]`)", cfg.data.path)
    } else {
        "the benchmarks (config key `benchmarks`)".to_string()
    };
    let loaded = load_eval_problems(cfg).with_context(|| what)?;
    for r in &loaded.skipped {
        eprintln!("warning: {r}");
    }
    let problems = loaded.problems;
    let hint = if model_path == Path::new(DEFAULT_MODEL) { " (run `make deps`)" } else { "" };
    let (model_cfg, source) =
        r2vpo_llm::model::source::open(model_path).with_context(|| format!("loading the model{hint}"))?;
    let model = open_inference(&spec, &model_cfg, source.as_ref())
        .with_context(|| {
            format!("opening {} on {:?} {} {:?}", model_path.display(), spec.kind, spec.device, spec.compute_dtype)
        })?
        .into_policy();
    drop(source);
    // The errors below name the file they could not read.
    let tok = Tokenizer::load(model_path).context("loading its tokenizer")?;
    let run = if writer {
        let run = open_run_folder(out, existing)?;
        // Written first, so an interrupted evaluation still says what it was.
        run.write_config(&config::to_toml(cfg)?)?;
        Some(run)
    } else {
        None
    };

    let bar = if quiet || !writer {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0).with_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} samples  {msg}  [{elapsed} < {eta}]")
                .expect("static template"),
        )
    };
    let t0 = Instant::now();
    let mut report = evaluate_ranks(
        model.as_ref(),
        &tok,
        &problems,
        cfg,
        &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(format!("{:.2} samples/s", done as f64 / t0.elapsed().as_secs_f64().max(1e-9)));
        },
        group.as_deref_mut().map(|g| g as &mut dyn Group),
    )?;
    bar.finish_and_clear();
    let Some(run) = run else { return Ok(None) };
    for (list, verb) in [(&report.skipped_prompts, "skipped"), (&report.truncated_prompts, "truncated")] {
        for p in list {
            eprintln!(
                "warning: {}: problem `{}`: prompt of {} tokens exceeds {} (the model's context minus \
                 sampling.max_new_tokens {}); {verb}",
                cfg.data.path, p.id, p.prompt_tokens, p.max_prompt_tokens, cfg.sampling.max_new_tokens
            );
        }
    }
    if !report.skipped_prompts.is_empty() || !report.truncated_prompts.is_empty() {
        eprintln!(
            "over-long prompts: {} problem(s) skipped, {} truncated, {} evaluated (overlong_prompts = \"{}\")",
            report.skipped_prompts.len(),
            report.truncated_prompts.len(),
            report.overall.problems,
            serde_plain(&cfg.overlong_prompts)
        );
    }
    report.model_path = model_path.display().to_string();
    r2vpo_report::atomic_write_json(&run.join("eval.json"), &report)?;
    r2vpo_report::atomic_write_string(&run.join("eval.md"), &markdown(&report, command))?;
    Ok(Some(report))
}

/// Joins the evaluation job `launch` describes: every rank must run the
/// same binary on the same model, backend and configuration. Only host
/// values cross ranks (each sample's verdict), so Gloo alone carries them.
#[cfg(feature = "torch")]
fn join_job(launch: &Launch, a: &EvalArgs, cfg: &EvalConfig) -> Result<Box<dyn Group>> {
    use sha2::Digest;
    let what = format!("{}\n{}\n{}", a.model.display(), a.engine.describe(), config::to_toml(cfg)?);
    let hash = format!("{:x}", sha2::Sha256::digest(what.as_bytes()))[..16].to_string();
    let timeout = std::time::Duration::from_secs_f64(a.dist_timeout);
    let pg = r2vpo_llm::parallel::c10d::ProcessGroup::join_checked(launch, timeout, false, &[("eval", &hash)])?;
    Ok(Box::new(pg))
}

#[cfg(not(feature = "torch"))]
fn join_job(launch: &Launch, _: &EvalArgs, _: &EvalConfig) -> Result<Box<dyn Group>> {
    anyhow::bail!(
        "started as rank {} of {}, but this r2vpo was built without libtorch, whose c10d joins the ranks: build it \
         with `make build-torch` (or `make build-gpu`)",
        launch.rank,
        launch.world_size
    )
}

/// `r2vpo llm eval`.
pub fn eval(a: &EvalArgs) -> Result<()> {
    let cfg = resolve(a)?;
    let out =
        a.run.out.clone().unwrap_or_else(|| PathBuf::from(format!("runs/llm/eval-{}", utc_stamp(SystemTime::now()))));
    // Started by torchrun, srun or `r2vpo launch` as one of several
    // ranks: each evaluates its share (docs/distributed.md).
    let launch = Launch::from_env()?.filter(|l| l.world_size > 1);
    let group = launch.as_ref().map(|l| join_job(l, a, &cfg)).transpose()?;
    let runner = Runner { model_path: &a.model, spec: a.spec(launch.as_ref())?, group };
    let Some(report) = run_eval(runner, &cfg, &out, a.run.existing(), &command_line(), a.run.quiet)? else {
        return Ok(());
    };
    print!("{}", report.to_markdown());
    println!(
        "{} samples, {} tokens in {:.1} s ({:.1} tokens/s)",
        report.overall.samples, report.generated_tokens, report.wall_seconds, report.tokens_per_s
    );
    for f in ["config.toml", "eval.json", "eval.md"] {
        println!("written: {}", out.join(f).display());
    }
    if let Some(w) = no_answer_warning(&cfg, &report) {
        eprintln!("{w}");
    }
    Ok(())
}

/// Issue #17: on a user's own data, responses may give their answers in
/// another form than `verify.format` expects, and every one is then scored
/// wrong; say so instead of reporting a silent 0 %.
fn no_answer_warning(cfg: &EvalConfig, report: &EvalReport) -> Option<String> {
    use r2vpo_verify::AnswerFormat;
    let o = &report.overall;
    if o.samples == 0 || o.extracted_fraction > 0.0 || cfg.verify.format == AnswerFormat::Auto {
        return None;
    }
    let format = serde_json::to_value(cfg.verify.format).ok()?.as_str()?.to_string();
    Some(format!(
        "warning: 0 of {} responses had an answer in the form verify.format = \"{format}\" expects, so every \
         sample scored as wrong; try --set verify.format=auto (boxed, answer line or last number)",
        o.samples
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2vpo_verify::{AnswerFormat, VerifyConfig};

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    fn args() -> EvalArgs {
        EvalArgs {
            model: PathBuf::from(DEFAULT_MODEL),
            run: RunArgs::default(),
            data: None,
            k: None,
            limit: None,
            benchmarks: Vec::new(),
            engine: r2vpo_bench::backend_args::BackendArgs {
                backend: "candle".into(),
                device: "cpu".into(),
                dtype: "f32".into(),
            },
            dist_timeout: 1800.0,
        }
    }

    /// One process on candle's CPU f32, `llm eval`'s default.
    fn alone(model: &Path) -> Runner<'_> {
        Runner { model_path: model, spec: args().spec(None).unwrap(), group: None }
    }

    fn sets(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// `--benchmark NAME=PATH` becomes `benchmarks`, in order; a flag
    /// without `=` is refused with the form it needs.
    #[test]
    fn benchmark_flags_become_the_benchmarks_table() {
        let a = EvalArgs { benchmarks: vec!["aime24=data/aime 24.parquet".into(), "amc=amc.jsonl".into()], ..args() };
        let c = resolve(&a).unwrap();
        let got: Vec<(&str, &str)> = c.benchmarks.iter().map(|b| (b.name.as_str(), b.path.as_str())).collect();
        assert_eq!(got, [("aime24", "data/aime 24.parquet"), ("amc", "amc.jsonl")]);
        let e = resolve(&EvalArgs { benchmarks: vec!["aime24".into()], ..args() }).unwrap_err().to_string();
        assert!(e.contains("NAME=PATH"), "{e}");
    }

    /// The shipped config spells out the defaults, but for the lenient
    /// answer extraction of the arithmetic training configs.
    #[test]
    fn shipped_config_is_the_default_with_the_arithmetic_configs_extraction() {
        let c = load_config(Some(&root().join("configs/llm/eval-arith.toml")), &[]).unwrap();
        let mut want = EvalConfig::default();
        want.verify.format = r2vpo_verify::AnswerFormat::Auto;
        assert_eq!(c, want, "configs/llm/eval-arith.toml and EvalConfig::default() must agree");
        let train =
            crate::llm_train::load_config(Some(&root().join("configs/llm/smollm2-arith.toml")), None, None, &[])
                .unwrap();
        assert_eq!(c.verify.format, train.verify.format, "eval-arith.toml scores unlike the arithmetic training");
    }

    #[test]
    fn partial_tables_keep_the_eval_defaults() {
        let c =
            load_config(None, &sets(&["data.limit=5", "sampling.max_new_tokens=8", "verify.rel_tol=0.01"])).unwrap();
        let d = EvalConfig::default();
        assert_eq!((c.data.path.as_str(), c.data.limit), ("builtin:arith-eval", Some(5)));
        assert_eq!((c.sampling.temperature, c.sampling.max_new_tokens), (0.6, 8));
        assert_eq!((c.verify.format, c.verify.rel_tol), (d.verify.format, 0.01));
        // The same through a file with a partial table.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.toml");
        std::fs::write(&p, "k = 4\n[sampling]\nseed = 9\n[data]\ndifficulty = 3\n").unwrap();
        let c = load_config(Some(&p), &sets(&["k=2"])).unwrap();
        assert_eq!((c.k, c.sampling.seed, c.sampling.top_k), (2, 9, 20));
        assert_eq!((c.data.path.as_str(), c.data.difficulty), ("builtin:arith-eval", 3));
    }

    #[test]
    fn shortcut_flags_then_sets() {
        let a = EvalArgs {
            data: Some("123".into()),
            k: Some(4),
            limit: Some(10),
            run: RunArgs {
                seed: Some(7),
                cfg: ConfigArgs { sets: sets(&["k=2"]), config: None },
                ..RunArgs::default()
            },
            ..args()
        };
        let c = resolve(&a).unwrap();
        assert_eq!((c.data.path.as_str(), c.k, c.data.limit, c.sampling.seed), ("123", 2, Some(10), 7));
    }

    #[test]
    fn errors_name_the_file_and_key() {
        let e = load_config(None, &sets(&["sampling.tempreature=1"])).unwrap_err().to_string();
        assert!(e.contains("sampling") && e.contains("tempreature"), "{e}");
        let e = load_config(None, &sets(&["k=\"x\""])).unwrap_err().to_string();
        assert!(e.contains("`k`"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, "k = 4\npass_k = [1, 8]\n").unwrap();
        let e = format!("{:#}", load_config(Some(&p), &[]).unwrap_err());
        assert!(e.contains("bad.toml") && e.contains("`pass_k`"), "{e}");
        std::fs::write(&p, "k = [").unwrap();
        let e = load_config(Some(&p), &[]).unwrap_err().to_string();
        assert!(e.contains("bad.toml"), "{e}");
    }

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101-000000");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400 + 3 * 3600 + 4 * 60 + 5); // 2000-02-29
        assert_eq!(utc_stamp(t), "20000229-030405");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_767_225_599); // last second of 2025
        assert_eq!(utc_stamp(t), "20251231-235959");
    }

    #[test]
    fn eval_end_to_end_on_the_embedded_model() {
        let model = root().join(DEFAULT_MODEL);
        let cfg =
            load_config(None, &sets(&["k=2", "data.limit=2", "sampling.max_new_tokens=4", "batch_size=3"])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ev");
        let rep = run_eval(alone(&model), &cfg, &out, Existing::Refuse, "r2vpo llm eval --k 2", true)
            .unwrap_or_else(|e| panic!("{e:#} (run `make deps`)"))
            .expect("one process writes its report");
        assert_eq!((rep.overall.problems, rep.overall.samples), (2, 4));
        assert_eq!(rep.overall.truncated_fraction, 1.0, "4 tokens cannot finish an answer");
        let json: EvalReport = serde_json::from_str(&std::fs::read_to_string(out.join("eval.json")).unwrap()).unwrap();
        assert_eq!(json.problems, rep.problems);
        let md = std::fs::read_to_string(out.join("eval.md")).unwrap();
        assert!(md.contains("r2vpo llm eval --k 2") && md.contains("| all | 2 |"), "{md}");
        let back = load_config(Some(&out.join("config.toml")), &[]).unwrap();
        assert_eq!(back, cfg);
        // Issue #17: 4 tokens give no "Answer:" line, and that is said.
        let w = no_answer_warning(&cfg, &rep).expect("a warning");
        assert!(w.contains("0 of 4") && w.contains("verify.format=auto"), "{w}");
        let auto =
            EvalConfig { verify: VerifyConfig { format: AnswerFormat::Auto, ..cfg.verify.clone() }, ..cfg.clone() };
        assert!(no_answer_warning(&auto, &rep).is_none());
        // Issue #17: an existing evaluation is not overwritten silently.
        let e = format!("{:#}", run_eval(alone(&model), &cfg, &out, Existing::Refuse, "", true).unwrap_err());
        assert!(e.contains("output folder") && e.contains("--overwrite"), "{e}");
        run_eval(alone(&model), &cfg, &out, Existing::Overwrite, "", true).unwrap();
    }

    /// Issue #17: a 10 MB row, a ≈10k-token question (context 8192) and a
    /// normal one: the first two are skipped with warnings, the third is
    /// evaluated, promptly; with only bad rows the command fails clearly.
    #[test]
    fn eval_skips_huge_and_overlong_rows() {
        let model = root().join(DEFAULT_MODEL);
        let dir = tempfile::tempdir().unwrap();
        let row = |q: String| serde_json::json!({"question": q, "answer": "2"}).to_string();
        let huge = row(format!("What is {}1?", "1+".repeat(5_000_000)));
        let long = row(format!("What is {}1?", "1+".repeat(5_000)));
        let data = dir.path().join("rows.jsonl");
        std::fs::write(&data, format!("{huge}\n{long}\n{}\n", row("What is 1 + 1?".into()))).unwrap();
        let path = Value::String(data.display().to_string());
        let cfg =
            load_config(None, &sets(&["k=1", "sampling.max_new_tokens=4", &format!("data.path={path}")])).unwrap();
        let t0 = Instant::now();
        let rep = run_eval(alone(&model), &cfg, &dir.path().join("ev"), Existing::Refuse, "r2vpo llm eval", true)
            .unwrap_or_else(|e| panic!("{e:#} (run `make deps`)"))
            .expect("one process writes its report");
        assert!(t0.elapsed().as_secs() < 60, "{:?}", t0.elapsed());
        assert_eq!(rep.problems.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["rows:3"]);
        assert_eq!(rep.skipped_prompts.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["rows:2"]);

        // The issue's command: `--data huge.jsonl --k 1 --limit 1`.
        std::fs::write(&data, format!("{huge}\n")).unwrap();
        let cfg = load_config(None, &sets(&["k=1", "data.limit=1", &format!("data.path={path}")])).unwrap();
        let e = format!(
            "{:#}",
            run_eval(alone(&model), &cfg, &dir.path().join("ev2"), Existing::Refuse, "", true).unwrap_err()
        );
        assert!(e.contains("rows.jsonl:1:") && e.contains("no usable problems"), "{e}");
        std::fs::write(&data, format!("{long}\n")).unwrap();
        let e = format!(
            "{:#}",
            run_eval(alone(&model), &cfg, &dir.path().join("ev3"), Existing::Refuse, "", true).unwrap_err()
        );
        assert!(e.contains("all 1 problem(s) skipped") && e.contains("`rows:1`"), "{e}");
    }
}
