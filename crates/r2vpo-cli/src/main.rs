//! `r2vpo` — the command line of the R²VPO training system.
//!
//! One binary, subcommands per domain. Training commands are driven by TOML
//! configs (`--config FILE`) with `--set key.path=value` overrides; every run
//! folder receives the fully resolved config.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "mimalloc")]
extern "C" {
    /// From the mimalloc library that the `mimalloc` crate links.
    fn mi_option_set(option: i32, value: std::os::raw::c_long);
}

/// Keeps freed memory mapped instead of returning it to the OS after 10 ms
/// (mimalloc's default), unless `MIMALLOC_PURGE_DELAY` says otherwise. LLM
/// training frees and re-allocates gigabytes of activations per step; with
/// purging, the kernel re-zeroes those pages every time: SmolLM2 forward +
/// backward of 8 × 193 tokens took 5.5 s + 12.5 s with purging and 4.0 s +
/// 9.0 s without (2 cores), at the price of a higher resident size.
fn tune_allocator() {
    #[cfg(feature = "mimalloc")]
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // `mi_option_purge_delay` is entry 15 of `mi_option_e` in both the v2
        // and v3 headers vendored by libmimalloc-sys 0.1.49.
        // SAFETY: sets a process-wide allocator option; no allocation state
        // depends on its previous value.
        unsafe { mi_option_set(15, -1) };
    }
}

mod args;
mod config;
mod control_cmd;
mod control_stats;
mod dist_cmd;
mod llm_eval;
mod llm_plan;
mod llm_plot;
mod llm_train;
mod serve;
mod toy;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

/// Ratio-Variance Regularized Policy Optimization: training, analysis and
/// benchmarks.
#[derive(Parser, Debug)]
#[command(name = "r2vpo", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Worker threads for tensor maths and parallel environments (default:
    /// $RAYON_NUM_THREADS, else all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The paper's theory: f-divergence ≈ ½·f''(1)·Var[ρ] and the clipping-error bound.
    #[command(subcommand)]
    Analyze(AnalyzeCmd),
    /// Continuous control on DeepMind Control Suite tasks (MuJoCo).
    #[command(subcommand)]
    Control(ControlCmd),
    /// LLM reasoning RL: models, verification, evaluation, training.
    #[command(subcommand)]
    Llm(LlmCmd),
    /// The algorithm core end to end on a synthetic sequence bandit (seconds).
    #[command(subcommand)]
    Toy(ToyCmd),
    /// Benchmarks that print a table and write JSON.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Serve a model over HTTP: OpenAI-compatible completions with per-token
    /// log-probs, continuous batching and weight push (rollouts for `llm train`).
    Serve(serve::ServeArgs),
    /// Show the default or resolved config of a command.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Start the ranks of a distributed job on this machine with torchrun's
    /// variables (for machines without PyTorch's Python; `torchrun
    /// --no-python r2vpo …` works as well).
    Launch(dist_cmd::LaunchArgs),
    /// Distributed jobs: check that ranks are wired up.
    #[command(subcommand)]
    Dist(DistCmd),
}

#[derive(Subcommand, Debug)]
enum DistCmd {
    /// Join the job this process was launched into, check that every rank
    /// runs the same binary and arguments, check and time the collectives
    /// (Gloo); rank 0 prints the table.
    Check(dist_cmd::CheckArgs),
}

#[derive(Subcommand, Debug)]
enum AnalyzeCmd {
    /// Exact f-divergences vs ½·f''(1)·Var[ρ] for Gaussian and categorical
    /// policy pairs (Proposition 3.1, Table 1, Figure 2, Appendix B).
    Divergence(r2vpo_theory::DivergenceArgs),
    /// Check |J_UNC − J_CLIP| ≤ (A_max/ε)·E[(ρ−1)²] on random populations (Theorem 3.3).
    ClipBound(r2vpo_theory::ClipBoundArgs),
}

#[derive(Subcommand, Debug)]
enum ControlCmd {
    /// List the DeepMind Control tasks with their observation and action sizes.
    Info(ControlInfoArgs),
    /// Train PPO or R²VPO on a control task.
    Train(control_cmd::TrainArgs),
    /// Evaluate a trained control policy (deterministic mean action).
    Eval(control_cmd::EvalArgs),
    /// Run algorithms × seeds × tasks and plot learning curves.
    Compare(control_cmd::CompareArgs),
    /// Compare two methods over a `control compare` folder: per-task score
    /// differences with bootstrap intervals and exact Mann–Whitney tests,
    /// IQM and P(improvement) over tasks, collapses, and a verdict.
    Stats(control_stats::StatsArgs),
}

#[derive(Args, Debug)]
struct ControlInfoArgs {
    /// Only this task (e.g. `cheetah-run`); default: all.
    #[arg(long)]
    task: Option<String>,
}

#[derive(Subcommand, Debug)]
enum LlmCmd {
    /// Print what a GGUF model file declares (architecture, sizes, vocabulary).
    Info(LlmInfoArgs),
    /// Check an answer against a gold answer and show how both were read.
    Verify(LlmVerifyArgs),
    /// Evaluate a model on math problems: avg@k, pass@k, maj@k (test-time sampling).
    Eval(llm_eval::EvalArgs),
    /// RL fine-tuning with R²VPO-ON/OFF and the baselines (resumable).
    Train(llm_train::TrainArgs),
    /// The learner of a multi-machine asynchronous run: `llm train --async`
    /// without actor threads; `llm actor` processes sample (Redis queue).
    Learn(llm_train::TrainArgs),
    /// One actor process of a `llm learn` run (start as many as you like,
    /// on any machine that reaches its Redis and weights folder).
    Actor(llm_train::ActorArgs),
    /// Reward/length/λ curves, ratio histograms by staleness and a summary
    /// table from one or more `llm train` runs.
    Plot(llm_plot::PlotArgs),
    /// Per-rank memory of a training step (weights, gradients, master
    /// weights, AdamW moments, activations, logits) for a model shape, a
    /// world size and a ZeRO stage, against a device size.
    Plan(llm_plan::PlanArgs),
    /// Fold a LoRA adapter (a PEFT folder: `llm train`'s export or
    /// checkpoint `adapter/`, or one PEFT wrote) into its base model and
    /// write the merged model as a Hugging Face folder.
    Merge(LlmMergeArgs),
    /// Write a model (a GGUF file, dequantized, or a Hugging Face folder)
    /// as a Hugging Face folder with its tokenizer: what vLLM or SGLang
    /// serve (`--untied` for vLLM, whose weight reloads never refresh a
    /// tied output head).
    Export(LlmExportArgs),
}

#[derive(Args, Debug)]
struct LlmExportArgs {
    /// A GGUF file or a Hugging Face folder.
    #[arg(long, default_value = ".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// Where to write the folder (created).
    #[arg(long)]
    out: PathBuf,
    /// Write a tied model with an explicit `lm_head.weight` and
    /// `tie_word_embeddings = false`: the folder a vLLM server that takes
    /// weight pushes (`rollout.weight_push = "vllm_reload"`) must start from.
    #[arg(long)]
    untied: bool,
    /// The weights' dtype in the folder.
    #[arg(long, value_enum, default_value_t = ExportDtype::F32)]
    dtype: ExportDtype,
}

/// The dtype of `llm export`'s weights.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ExportDtype {
    F32,
    Bf16,
}

#[derive(Args, Debug)]
struct LlmMergeArgs {
    /// The base model: a GGUF file or a Hugging Face folder (default: the
    /// adapter's `base_model_name_or_path` where that is a path here).
    #[arg(long)]
    base: Option<PathBuf>,
    /// The adapter folder (`adapter_config.json`, `adapter_model.safetensors`).
    #[arg(long)]
    adapter: PathBuf,
    /// Where to write the merged model (created).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct LlmInfoArgs {
    /// A GGUF file or a Hugging Face folder (default: the embedded
    /// SmolLM2-135M-Instruct from `make deps`).
    #[arg(long, default_value = ".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// Also write the model's tokenizer as Hugging Face files
    /// (`tokenizer.json`, `tokenizer_config.json` with the chat template,
    /// `generation_config.json`) into this folder: what `model.tokenizer`
    /// takes, so a random model (`model.random`) can train where the GGUF
    /// is not (the GPU check carries 2 MB instead of 98).
    #[arg(long, value_name = "DIR")]
    save_tokenizer: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct LlmVerifyArgs {
    /// The model's answer: a whole response or just the final answer (may
    /// start with a hyphen: `--answer -7`).
    #[arg(long, allow_hyphen_values = true)]
    answer: String,
    /// The reference answer (may start with a hyphen).
    #[arg(long, allow_hyphen_values = true)]
    gold: String,
    /// Where the answer is taken from: auto, boxed, answer-line, last-number.
    #[arg(long, default_value = "auto")]
    format: String,
    /// Compare as verl's Minerva normaliser does (exact string match after
    /// normalisation) instead of numerically and structurally.
    #[arg(long)]
    minerva: bool,
    /// Print the verdict as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum ToyCmd {
    /// Train one algorithm on the toy task.
    Train(toy::TrainArgs),
    /// Algorithms × seeds on the toy task, with learning-curve plots.
    Compare(toy::CompareArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// Forward+backward cost of every policy objective (R²VPO vs the baselines).
    Core(r2vpo_bench::objectives::CoreArgs),
    /// Raw physics and end-to-end training throughput on control tasks.
    Control(r2vpo_bench::control::BenchArgs),
    /// Generation throughput of the LLM stack (decode with KV cache at batch 1/8/32).
    Llm(r2vpo_bench::objectives::LlmArgs),
    /// Throughput of `r2vpo serve` under 1/8/32 concurrent clients against
    /// the in-process sampler at the same total batch.
    Serve(r2vpo_bench::serve::ServeBenchArgs),
    /// Iteration time of `llm train` in turn vs `--async` (one actor
    /// thread), and the experience queue's throughput in memory and on Redis.
    Async(r2vpo_bench::queue::AsyncBenchArgs),
    /// One training step (forward + R²VPO + backward + AdamW) of a random
    /// model of any Hugging Face shape on cpu or cuda, or `--check` its
    /// log-probs and gradients against the CPU's.
    Step(r2vpo_bench::step::StepBenchArgs),
    /// One training step over the same samples in each micro-batch layout
    /// (padded rows, shared prompts, packed; by rows and by a token budget),
    /// with response lengths like a reasoning model's.
    Packing(r2vpo_bench::packing::PackingBenchArgs),
}

#[derive(Subcommand, Debug)]
enum ConfigCmd {
    /// Print the resolved config (defaults, then --config, then --set) as TOML.
    Show(ConfigShowArgs),
}

#[derive(Args, Debug)]
struct ConfigShowArgs {
    /// Which command's config: `toy`, `control`, `llm-eval` or `llm-train`.
    kind: String,
    /// `--config` and `--set`.
    #[command(flatten)]
    cfg: args::ConfigArgs,
}

/// Whether the thread count was chosen (`--threads`, `RAYON_NUM_THREADS`)
/// rather than defaulted to every core: `r2vpo launch` splits the cores
/// over its ranks only when it was not.
pub(crate) static THREADS_CHOSEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

fn set_threads(threads: Option<usize>) {
    // candle's CPU backend re-reads /proc/cpuinfo on every matmul unless
    // RAYON_NUM_THREADS is set (shared/notes/candle-llm-training.md §6.3), so
    // always set it, before any thread pool starts.
    let chosen = threads.or_else(|| std::env::var("RAYON_NUM_THREADS").ok().and_then(|v| v.parse().ok()));
    let _ = THREADS_CHOSEN.set(chosen.is_some());
    let n = chosen.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // SAFETY: called first thing in `main`, before any other thread exists.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    // libtorch's intra-op pool (the torch backend on the CPU): the same
    // count, unless OMP_NUM_THREADS was set for libtorch alone; the
    // variable reaches child processes (`launch`'s ranks), and this
    // process's pool is set below.
    if threads.is_some() || std::env::var_os("OMP_NUM_THREADS").is_none() {
        // SAFETY: as above.
        unsafe { std::env::set_var("OMP_NUM_THREADS", n.to_string()) };
    }
    let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    #[cfg(feature = "torch")]
    r2vpo_llm::backend::torch::set_threads(
        std::env::var("OMP_NUM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(n),
    );
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Analyze(cmd) => match cmd {
            AnalyzeCmd::Divergence(a) => print_report(r2vpo_theory::divergence(&a)?),
            AnalyzeCmd::ClipBound(a) => print_report(r2vpo_theory::clip_bound(&a)?),
        },
        Command::Control(cmd) => match cmd {
            ControlCmd::Info(a) => control_info(&a),
            ControlCmd::Train(a) => control_cmd::train(&a),
            ControlCmd::Eval(a) => control_cmd::eval(&a),
            ControlCmd::Compare(a) => control_cmd::compare(&a),
            ControlCmd::Stats(a) => control_stats::stats(&a),
        },
        Command::Llm(cmd) => match cmd {
            LlmCmd::Info(a) => llm_info(&a),
            LlmCmd::Verify(a) => llm_verify(&a),
            LlmCmd::Eval(a) => llm_eval::eval(&a),
            LlmCmd::Train(a) => llm_train::train(&a),
            LlmCmd::Learn(a) => llm_train::train_as(&a, llm_train::Role::Learn),
            LlmCmd::Actor(a) => llm_train::actor(&a),
            LlmCmd::Plot(a) => llm_plot::plot(&a),
            LlmCmd::Plan(a) => llm_plan::run(&a),
            LlmCmd::Merge(a) => llm_merge(&a),
            LlmCmd::Export(a) => llm_export(&a),
        },
        Command::Toy(cmd) => match cmd {
            ToyCmd::Train(a) => toy::cmd_train(&a),
            ToyCmd::Compare(a) => toy::cmd_compare(&a),
        },
        Command::Bench(cmd) => match cmd {
            BenchCmd::Core(a) => r2vpo_bench::objectives::core(&a),
            BenchCmd::Control(a) => r2vpo_bench::control::bench(&a),
            BenchCmd::Llm(a) => r2vpo_bench::objectives::llm(&a),
            BenchCmd::Serve(a) => r2vpo_bench::serve::serve(&a),
            BenchCmd::Async(a) => r2vpo_bench::queue::bench(&a),
            BenchCmd::Step(a) => r2vpo_bench::step::step(&a),
            BenchCmd::Packing(a) => r2vpo_bench::packing::packing(&a),
        },
        Command::Serve(a) => serve::serve(&a),
        Command::Config(ConfigCmd::Show(a)) => config_show(&a),
        Command::Launch(a) => dist_cmd::launch(&a),
        Command::Dist(DistCmd::Check(a)) => dist_cmd::check(&a),
    }
}

fn config_show(a: &ConfigShowArgs) -> Result<()> {
    let text = match a.kind.as_str() {
        "toy" => {
            let c = config::load::<r2vpo_toy::ToyConfig>(a.cfg.config.as_deref(), &a.cfg.sets)?;
            c.validate().with_context(|| config::source(a.cfg.config.as_deref(), &a.cfg.sets))?;
            config::to_toml(&c)?
        }
        "control" => {
            let c = config::load::<r2vpo_control::trainer::TrainConfig>(a.cfg.config.as_deref(), &a.cfg.sets)?;
            c.validate().with_context(|| config::source(a.cfg.config.as_deref(), &a.cfg.sets))?;
            config::to_toml(&c)?
        }
        "llm-eval" => config::to_toml(&llm_eval::load_config(a.cfg.config.as_deref(), &a.cfg.sets)?)?,
        "llm-train" => {
            config::to_toml(&llm_train::load_config_values(a.cfg.config.as_deref(), None, None, &a.cfg.sets)?)?
        }
        other => anyhow::bail!("no config kind `{other}`; known: toy, control, llm-eval, llm-train"),
    };
    print!("{text}");
    Ok(())
}

fn control_info(a: &ControlInfoArgs) -> Result<()> {
    let names: Vec<&str> = match &a.task {
        Some(t) => vec![t.as_str()],
        None => r2vpo_control::task_names().to_vec(),
    };
    let envs = names.iter().map(|n| r2vpo_control::make_env(n, 0, None)).collect::<Result<Vec<_>, _>>()?;
    println!("| task | observation dim | action dim | episode steps |\n|---|---|---|---|");
    for (name, env) in names.iter().zip(envs) {
        println!("| {name} | {} | {} | {} |", env.observation_dim(), env.action_dim(), env.episode_steps());
    }
    Ok(())
}

fn llm_verify(a: &LlmVerifyArgs) -> Result<()> {
    use r2vpo_verify::{verify, AnswerFormat, Equivalence, VerifyConfig};
    let format: AnswerFormat = serde_json::from_value(serde_json::Value::String(a.format.clone()))
        .map_err(|_| anyhow::anyhow!("--format `{}`: expected auto, boxed, answer-line or last-number", a.format))?;
    let equivalence = if a.minerva { Equivalence::MinervaExact } else { Equivalence::Math };
    let cfg = VerifyConfig { format, equivalence, ..VerifyConfig::default() };
    let v = verify(&a.answer, &a.gold, &cfg);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{v}");
    }
    Ok(())
}

/// Prints an analysis' table and the files it wrote.
fn print_report(r: r2vpo_theory::Report) -> Result<()> {
    print!("{}", r.text);
    Ok(())
}

fn llm_merge(a: &LlmMergeArgs) -> Result<()> {
    use r2vpo_llm::model::lora;
    let base = match &a.base {
        Some(b) => b.clone(),
        None => {
            let c = a.adapter.join(lora::ADAPTER_CONFIG);
            let text = std::fs::read_to_string(&c).with_context(|| format!("reading {}", c.display()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{}: not JSON", c.display()))?;
            match v.get("base_model_name_or_path").and_then(|b| b.as_str()).map(PathBuf::from) {
                Some(p) if p.exists() => p,
                other => anyhow::bail!(
                    "{}: base_model_name_or_path {:?} is not a model here; name the base with --base",
                    c.display(),
                    other
                ),
            }
        }
    };
    let cfg = lora::merge_to_hf(&base, &a.adapter, &a.out)?;
    match r2vpo_llm::tokenizer::Tokenizer::load(&base) {
        Ok(tok) => tok.save_hf_files(&a.out)?,
        Err(e) => eprintln!("llm merge: warning: no tokenizer copied from {}: {e}", base.display()),
    }
    println!(
        "merged: {} (rank {}, alpha {}, {}) into {} -> {}",
        a.adapter.display(),
        cfg.rank,
        cfg.alpha,
        cfg.targets.iter().map(|t| t.name()).collect::<Vec<_>>().join(","),
        base.display(),
        a.out.display()
    );
    Ok(())
}

fn llm_export(a: &LlmExportArgs) -> Result<()> {
    use r2vpo_llm::model::save::{save_hf_tensors_as, HfLayout};
    let (cfg, src) = r2vpo_llm::model::source::open(&a.model)?;
    let mut tensors = std::collections::HashMap::new();
    for (name, _) in r2vpo_llm::model::expected_params(&cfg) {
        tensors.insert(name.clone(), src.tensor(&name)?.to_dtype(candle_core::DType::F32)?);
    }
    let dtype = match a.dtype {
        ExportDtype::F32 => candle_core::DType::F32,
        ExportDtype::Bf16 => candle_core::DType::BF16,
    };
    save_hf_tensors_as(&cfg, &tensors, &a.out, HfLayout { dtype, untie: a.untied })?;
    r2vpo_llm::tokenizer::Tokenizer::load(&a.model)?.save_hf_files(&a.out)?;
    println!(
        "exported: {} -> {} ({:?}{})",
        a.model.display(),
        a.out.display(),
        a.dtype,
        if a.untied && cfg.tie_word_embeddings { ", untied" } else { "" }
    );
    Ok(())
}

fn llm_info(a: &LlmInfoArgs) -> Result<()> {
    if let Some(dir) = &a.save_tokenizer {
        let tok = r2vpo_llm::tokenizer::Tokenizer::load(&a.model)?;
        tok.save_hf_files(dir)?;
        eprintln!("llm info: wrote the tokenizer of {} into {}", a.model.display(), dir.display());
    }
    if a.model.is_dir() {
        println!("{}", serde_json::to_string_pretty(&hf_summary(&a.model)?)?);
        return Ok(());
    }
    let s = r2vpo_llm::gguf::read_summary(&a.model)?;
    println!("{}", serde_json::to_string_pretty(&s)?);
    Ok(())
}

/// What `llm info` says about a Hugging Face folder (`--model` takes either
/// everywhere): its `config.json`, and the parameter count from the
/// safetensors headers (memory-mapped, no weights read).
fn hf_summary(dir: &std::path::Path) -> Result<serde_json::Value> {
    use r2vpo_llm::model::{load_hf::weight_files, ModelConfig};
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let (files, _) = weight_files(dir)?;
    // SAFETY: read-only map of files this process does not modify.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }
        .with_context(|| format!("reading the safetensors headers in {}", dir.display()))?;
    let tensors = st.tensors();
    let parameters: usize = tensors.iter().map(|(_, t)| t.shape().iter().product::<usize>()).sum();
    let mut dtypes = std::collections::BTreeMap::<String, usize>::new();
    for (_, t) in &tensors {
        *dtypes.entry(format!("{:?}", t.dtype())).or_default() += 1;
    }
    Ok(serde_json::json!({
        "format": "huggingface",
        "config": cfg,
        "weight_files": files.iter().map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect::<Vec<_>>(),
        "tokenizer": dir.join("tokenizer.json").is_file(),
        "chat_template": dir.join("tokenizer_config.json").is_file(),
        "tensors": tensors.len(),
        "parameters": parameters,
        "dtypes": dtypes,
    }))
}

/// The error and its causes joined by `: `, each cause left out when the
/// text above already says it. Library errors (thiserror) often put their
/// source into their own message *and* report it as the source, so anyhow's
/// `{:#}` would print an OS error twice.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`r2vpo … | head`), as Unix tools do,
    // instead of panicking inside println!.
    // SAFETY: restoring the default disposition of a signal before any
    // thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    tune_allocator();
    let cli = Cli::parse();
    set_threads(cli.threads);
    // A kernel choice this machine cannot run (or a typo in it) is refused
    // before any work, not as a panic inside the first product.
    if let Err(e) = r2vpo_kernels::dispatch::check() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match (e.downcast_ref::<args::Stopped>(), e.downcast_ref::<args::NoCheckpoint>()) {
            (Some(s), _) => {
                eprintln!("{s}");
                ExitCode::from(s.signal.exit_code())
            }
            (None, Some(s)) => {
                eprintln!("{s}");
                ExitCode::from(s.0.signal.exit_code())
            }
            (None, None) => {
                eprintln!("error: {}", error_chain(&e));
                ExitCode::FAILURE
            }
        },
    }
}

/// Argument parsing and error printing of the binary.
#[cfg(test)]
mod cli_tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn an_os_error_is_printed_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let text = io.to_string();
        let e = anyhow::Error::from(r2vpo_report::ReportError::Io { path: "/x/y".into(), source: io })
            .context("output folder /x/y");
        let s = error_chain(&e);
        assert_eq!(s.matches(&text).count(), 1, "{s}");
        assert!(s.starts_with("output folder /x/y: /x/y"), "{s}");
    }

    #[test]
    fn negative_numbers_are_values() {
        let c = Cli::try_parse_from(["r2vpo", "llm", "verify", "--answer", "-7", "--gold", "-7"]).unwrap();
        match c.command {
            Command::Llm(LlmCmd::Verify(v)) => assert_eq!((v.answer.as_str(), v.gold.as_str()), ("-7", "-7")),
            other => panic!("{other:?}"),
        }
        Cli::try_parse_from(["r2vpo", "toy", "train", "--set", "objective.eps_low=-1"]).unwrap();
    }
}

/// The one algorithm table ([`r2vpo::algo::ALGORITHMS`]) seen through every
/// trainer's `--algo`: each name gives the same objective and mode in the
/// toy, control and LLM configs, and the README lists exactly the table.
#[cfg(test)]
mod algo_table_tests {
    use r2vpo::algo::{Mode, ALGORITHMS};

    use crate::config;

    #[test]
    fn every_name_resolves_to_the_same_settings_everywhere() {
        for a in ALGORITHMS {
            let want = a.objective_config();
            let toy: r2vpo_toy::ToyConfig = config::load(None, &crate::toy::algo_overrides(a.name).unwrap()).unwrap();
            assert_eq!((&toy.objective, toy.mode), (&want, a.mode), "toy --algo {}", a.name);
            let mut typed = r2vpo_toy::ToyConfig::default();
            a.apply_dual(&mut typed.dual);
            a.apply_group_norm(&mut typed.group_norm);
            assert_eq!((&toy.dual, &toy.group_norm), (&typed.dual, &typed.group_norm), "toy --algo {}", a.name);
            let llm: r2vpo_llm::train::TrainConfig =
                config::load(None, &r2vpo_llm::train::TrainConfig::algo_overrides(a.name).unwrap()).unwrap();
            assert_eq!((&llm.objective, llm.mode), (&want, a.mode), "llm --algo {}", a.name);
            if let Some(l) = a.fixed_lambda {
                assert_eq!(
                    (llm.dual.mode, llm.dual.lambda0),
                    (r2vpo::dual::DualMode::Fixed, l),
                    "llm --algo {}",
                    a.name
                );
            }
            if let Some(b) = a.scale_by_std {
                assert_eq!(llm.group_norm.scale_by_std, b, "llm --algo {}", a.name);
            }
            let dppo = matches!(
                a.objective.kind,
                r2vpo::objective::ObjectiveKind::DppoTv | r2vpo::objective::ObjectiveKind::DppoKl
            );
            match (a.mode, r2vpo_control::trainer::algo_overrides(a.name)) {
                (Mode::On, Err(e)) if dppo => assert!(e.to_string().contains("density"), "{e}"),
                (Mode::On, Ok(sets)) => {
                    let c: r2vpo_control::trainer::TrainConfig = config::load(None, &sets).unwrap();
                    assert_eq!(c.objective, want, "control --algo {}", a.name);
                }
                (Mode::Off, Err(e)) => assert!(e.to_string().contains("replay"), "{e}"),
                (m, r) => panic!("control --algo {}: mode {m:?} gave {r:?}", a.name),
            }
        }
    }

    /// Each `--algo` help names every algorithm its trainer takes.
    #[test]
    fn every_algo_help_lists_the_table() {
        use clap::CommandFactory;
        let cli = crate::Cli::command();
        for (path, on_only) in [(["toy", "train"], false), (["llm", "train"], false), (["control", "train"], true)] {
            let cmd = cli.find_subcommand(path[0]).unwrap().find_subcommand(path[1]).unwrap();
            let arg = cmd.get_arguments().find(|a| a.get_id() == "algo").unwrap();
            let help = arg.get_help().unwrap().to_string();
            let listed: Vec<&str> = help.split([':', ',', ';', '(', ')', ' ', '.']).collect();
            let takes = |a: &r2vpo::algo::Algorithm| {
                !on_only || (a.mode == Mode::On && r2vpo_control::trainer::algo_overrides(a.name).is_ok())
            };
            for a in ALGORITHMS.iter().filter(|a| takes(a)) {
                assert!(listed.contains(&a.name), "{} --algo help lacks {}: {help}", path.join(" "), a.name);
            }
        }
    }

    #[test]
    fn the_readme_lists_the_table() {
        let readme = include_str!("../../../README.md");
        for a in ALGORITHMS {
            let row = format!("| `{}` | {} | {} |", a.name, a.summary, a.source);
            assert!(readme.contains(&row), "README.md lacks the row:\n{row}");
        }
    }
}
