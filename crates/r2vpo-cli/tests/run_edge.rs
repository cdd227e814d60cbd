//! The run loop's edge as a user meets it, through the real binary: a
//! signal stops a run with a checkpoint and the shell's exit code, the run
//! resumes to its end, logs written to a file get plain progress lines, and
//! an `--out` folder that holds a run is never overwritten silently.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root());
    c
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0)
}

/// Starts `args`, waits until `ready` holds, sends `signal`, and returns the
/// exit code and stderr.
fn signal_when(args: &[&str], signal: i32, ready: impl Fn() -> bool) -> (Option<i32>, String) {
    let err = tempfile::NamedTempFile::new().unwrap();
    let mut child = bin().args(args).stdout(Stdio::null()).stderr(err.reopen().unwrap()).spawn().unwrap();
    let t0 = Instant::now();
    while !ready() {
        assert!(t0.elapsed() < Duration::from_secs(300), "the run never got going");
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be signalled");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's PID.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let st = child.wait().unwrap();
    (st.code(), std::fs::read_to_string(err.path()).unwrap())
}

#[test]
fn llm_train_sigterm_checkpoints_exits_143_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = common::tiny_llm_config(tmp.path(), 30, 0);
    let out = tmp.path().join("run");
    let (cfg_s, out_s) = (cfg.to_str().unwrap(), out.to_str().unwrap());
    let metrics = out.join("metrics.jsonl");
    let args = ["llm", "train", "--config", cfg_s, "--out", out_s, "--no-export"];
    let (code, err) = signal_when(&args, libc::SIGTERM, || lines(&metrics) >= 2);
    assert_eq!(code, Some(143), "stderr:\n{err}");
    assert!(err.contains("SIGTERM") && err.contains("--resume"), "{err}");
    // stderr is a file here, so progress came as plain lines, one per iteration.
    assert!(err.contains("iterations 1/30") && err.contains("reward"), "{err}");
    let done = lines(&metrics);
    assert!(done < 30 && out.join("checkpoints/latest").exists());
    // A fresh start into the folder is refused, naming the way out.
    let st = bin().args(args).output().unwrap();
    assert!(!st.status.success());
    assert!(String::from_utf8_lossy(&st.stderr).contains("--overwrite"));
    // The run was started with --no-export; its resume exports on request.
    let st = bin().args(["llm", "train", "--resume", out_s, "--quiet", "--set", "export=true"]).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert_eq!(lines(&metrics), 30);
    // TensorBoard draws each (tag, step) once: the steps replayed after the
    // checkpoint were cut from the interrupted process's file.
    let scalars = r2vpo_report::read_scalars(&out).unwrap();
    let mut seen = std::collections::HashSet::new();
    for (tag, step, _) in &scalars {
        assert!(seen.insert((tag.clone(), *step)), "TensorBoard has {tag} at step {step} twice");
    }
    assert!(scalars.iter().any(|(t, s, _)| t == "reward" && *s == 29), "the last iteration is logged");
    // `llm info` reads the exported Hugging Face folder as it reads a GGUF.
    let info = bin().args(["llm", "info", "--model"]).arg(out.join("model")).output().unwrap();
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    let v: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert!(v["parameters"].as_u64().unwrap() > 0 && v["config"]["num_hidden_layers"] == 2, "{v}");
}

/// What the GPU check does where the 98 MB GGUF cannot travel: the
/// tokenizer saved as Hugging Face files by `llm info --save-tokenizer`, and
/// random weights of a `config.json` shape (`model.random.shape`).
#[test]
fn a_random_model_of_a_config_shape_trains_on_a_saved_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = root().join(".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let tok = tmp.path().join("tok");
    let st = bin().args(["llm", "info", "--model"]).arg(&gguf).arg("--save-tokenizer").arg(&tok).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert!(tok.join("tokenizer.json").is_file() && tok.join("tokenizer_config.json").is_file());
    let text = format!(
        "iterations = 2\nprompts_per_iter = 2\ngroup_size = 4\nrollout_batch = 8\nminibatch_size = 4\n\
         micro_batch_size = 2\ncheckpoint_every = 1\n[model]\npath = \"no-such.gguf\"\ntokenizer = \"{}\"\n\
         [model.random]\nshape = \"configs/shapes/qwen3-tiny.json\"\nseed = 3\n[data]\ncount = 40\n\
         [sampling]\nmax_new_tokens = 6\n",
        tok.display()
    );
    let cfg = tmp.path().join("shape.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = tmp.path().join("run");
    let st = bin().args(["llm", "train", "--quiet", "--config"]).arg(&cfg).arg("--out").arg(&out).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert_eq!(lines(&out.join("metrics.jsonl")), 2);
    // The exported model has the shape's layout and the tokenizer's vocabulary.
    let info = bin().args(["llm", "info", "--model"]).arg(out.join("model")).output().unwrap();
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    let v: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let c = &v["config"];
    assert_eq!((c["model_type"].as_str(), c["head_dim"].as_u64()), (Some("qwen3"), Some(32)), "{v}");
    assert_eq!(c["vocab_size"].as_u64(), Some(49152), "{v}");
}

#[test]
fn control_train_sigint_checkpoints_exits_130_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let out_s = out.to_str().unwrap();
    let metrics = out.join("metrics.jsonl");
    let sets = [
        "--set",
        "num_envs=4",
        "--set",
        "unroll=8",
        "--set",
        "batch_size=4",
        "--set",
        "minibatches=2",
        "--set",
        "epochs=1",
        "--set",
        "total_env_steps=20000",
        "--set",
        "eval_every=0",
        "--set",
        "eval_episodes=0",
    ];
    let mut args = vec!["control", "train", "--task", "cartpole-balance", "--algo", "ppo", "--out", out_s];
    args.extend(sets);
    let (code, err) = signal_when(&args, libc::SIGINT, || lines(&metrics) >= 2);
    assert_eq!(code, Some(130), "stderr:\n{err}");
    assert!(err.contains("SIGINT") && err.contains("control train --resume"), "{err}");
    assert!(err.contains("env steps ") && err.contains("steps/s"), "plain progress lines: {err}");
    let before = lines(&metrics);
    assert!(out.join("checkpoints").read_dir().unwrap().count() >= 2);
    let st = bin().args(["control", "train", "--resume", out_s, "--quiet"]).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let ms: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(ms.len() > before);
    let updates: Vec<u64> = ms.iter().map(|m| m["update"].as_u64().unwrap()).collect();
    assert_eq!(updates, (1..=ms.len() as u64).collect::<Vec<_>>(), "no repeated or missing updates");
    assert!(out.join("plots/learning_curve.png").exists());
    let plot = bin().args(["llm", "plot", out_s]).output().unwrap();
    let msg = String::from_utf8_lossy(&plot.stderr);
    assert!(!plot.status.success() && msg.contains("is a control run"), "{msg}");
    assert!(std::fs::read_dir(&out).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("events.out")));
}

#[test]
fn toy_train_refuses_a_used_folder_unless_overwrite_and_bad_configs_leave_none() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("toy");
    let out_s = out.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec!["toy", "train", "--out", out_s, "--quiet", "--set", "iterations=2"];
        a.extend(extra);
        bin().args(&a).output().unwrap()
    };
    let bad = run(&["--set", "temperature=inf"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("temperature"));
    assert!(!out.exists(), "a rejected run must leave no folder");
    assert!(run(&[]).status.success());
    let again = run(&[]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("--overwrite"));
    assert!(run(&["--overwrite"]).status.success());
    let events = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("events.out"));
    assert_eq!(events.count(), 1, "an overwritten run leaves one TensorBoard file");
    // toy compare follows the same rule.
    let cmp = tmp.path().join("cmp");
    let compare = |extra: &[&str]| {
        let mut a = vec!["toy", "compare", "--algos", "grpo", "--seeds", "0", "--set", "iterations=2", "--out"];
        a.push(cmp.to_str().unwrap());
        a.extend(extra);
        bin().args(&a).output().unwrap()
    };
    // A config that fails validation leaves no compare folder either.
    let bad = compare(&["--set", "lr=nan"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("lr"));
    assert!(!cmp.exists(), "a rejected compare must leave no folder");
    assert!(compare(&[]).status.success());
    let again = compare(&[]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("--overwrite"));
    assert!(compare(&["--overwrite"]).status.success());
}

/// `control compare` validates every run's config before making `--out`,
/// reads a finished run back only when it was made with the same config,
/// and prints plain progress lines when not on a terminal.
#[test]
fn control_compare_validates_first_and_refuses_a_run_made_with_another_config() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cmp");
    let compare = |extra: &[&str]| {
        let mut a = vec!["control", "compare", "--tasks", "cartpole-balance", "--algos", "ppo", "--seeds", "0"];
        for s in ["num_envs=4", "unroll=8", "batch_size=4", "minibatches=2", "epochs=1", "total_env_steps=64"] {
            a.extend(["--set", s]);
        }
        a.extend(["--set", "eval_every=0", "--set", "eval_episodes=0", "--out", out.to_str().unwrap()]);
        a.extend(extra);
        bin().args(&a).output().unwrap()
    };
    let bad = compare(&["--set", "lr=-1"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("lr"));
    assert!(!out.exists(), "a rejected compare must leave no folder");
    let ok = compare(&[]);
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(ok.status.success(), "{err}");
    assert!(err.contains("runs 1/1"), "plain progress line: {err}");
    // The evaluation figure says how the runs evaluated (cpu.toml: the mode).
    let eval_svg = || std::fs::read_to_string(out.join("eval_curves.svg")).unwrap();
    assert!(eval_svg().contains("evaluation return (mode of the policy)"));
    // The same compare again reads the finished run back...
    assert!(compare(&[]).status.success());
    // ...but one with another learning rate does not silently reuse it.
    let other = compare(&["--set", "lr=0.001"]);
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success() && err.contains("`lr`") && err.contains("config.toml"), "{err}");
    // Brax's protocol (paper.toml) samples actions; the figure says so.
    std::fs::remove_dir_all(&out).unwrap();
    assert!(compare(&["--set", "eval_deterministic=false"]).status.success());
    assert!(eval_svg().contains("evaluation return (sampled actions)"));
}

#[test]
fn validation_errors_blame_the_set_and_config_show_validates() {
    // `config show` refuses what a run would refuse, naming the key and the --set.
    for (kind, set, key) in [
        ("toy", "lr=nan", "lr"),
        ("llm-train", "objective.eps_high=5", "eps_high"),
        ("llm-train", "rollout.sync_every=0", "rollout.sync_every"),
        ("control", "objective.eps_high=5", "eps_high"),
    ] {
        let o = bin().args(["config", "show", kind, "--set", set]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{kind} --set {set} was accepted");
        assert!(err.contains(key), "{kind} --set {set}: {err}");
        assert!(err.contains(&format!("--set {set}")), "{kind}: the --set is named: {err}");
    }
    let o = bin().args(["config", "show", "llm-train", "--set", "optim.lr=-1"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--set optim.lr=-1"), "the --set is named: {err}");
}

#[test]
fn llm_resume_without_a_checkpoint_says_so_and_leaves_the_folder_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::copy(common::tiny_llm_config(tmp.path(), 30, 0), run.join("config.toml")).unwrap();
    let before = std::fs::read(run.join("config.toml")).unwrap();
    // The command that starts it afresh is the one it was started with,
    // and each path is named where it is needed, not twice over.
    for command in ["train", "learn"] {
        let o =
            bin().args(["llm", command, "--resume", run.to_str().unwrap(), "--set", "iterations=9"]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        let afresh = format!(
            "r2vpo llm {command} --config {} --out {} --overwrite",
            run.join("config.toml").display(),
            run.display()
        );
        assert!(err.contains("no checkpoint") && err.contains(&afresh), "{err}");
        assert_eq!(err.matches(&*run.display().to_string()).count(), 3, "{err}");
        assert_eq!(std::fs::read(run.join("config.toml")).unwrap(), before, "config.toml untouched");
    }
}

/// A load error names the path it could not read once, not once in the
/// context and again in the cause.
#[test]
fn load_errors_name_each_path_once() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let m = missing.display().to_string();
    for args in [
        vec!["llm", "eval", "--model", &m, "--out", tmp.path().join("ev").to_str().unwrap()],
        vec!["control", "eval", "--run", &m],
    ] {
        let o = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert_eq!(err.matches(&*m).count(), 1, "{args:?}: {err}");
    }
}

/// MuJoCo deprecates an attribute of dm_control's own cheetah.xml
/// (`settotalmass`); no user can act on it, so no control command prints
/// it (it once opened every command's output).
#[test]
fn control_commands_print_no_warning_about_the_suites_own_models() {
    let o = bin().args(["control", "info"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("cheetah-run"));
    assert!(!err.contains("WARNING") && !err.contains("deprecated"), "{err}");
}
