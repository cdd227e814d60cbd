//! `r2vpo llm train` killed with SIGKILL mid-run and continued with
//! `--resume` writes the same metrics as an uninterrupted run (tiny random
//! model with the embedded tokenizer, so it runs in seconds).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write_config(dir: &Path) -> PathBuf {
    let gguf = root().join(".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.exists(), "{} missing (run `make deps`)", gguf.display());
    let text = format!(
        r#"
iterations = 8
prompts_per_iter = 2
group_size = 4
rollout_batch = 8
minibatch_size = 4
micro_batch_size = 2
checkpoint_every = 2
histogram_every = 2
mode = "off"
[model]
path = "{}"
[model.random]
hidden = 32
intermediate = 64
layers = 2
heads = 4
kv_heads = 2
seed = 3
init_std = 1.0
[data]
count = 40
[sampling]
max_new_tokens = 6
[replay]
minibatch_size = 4
[optim]
lr = 1e-3
"#,
        gguf.display()
    );
    let p = dir.join("tiny.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root());
    c
}

/// `metrics.jsonl` lines without the wall-clock `timing` object.
fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|mut v| {
            v.as_object_mut().unwrap().remove("timing");
            v
        })
        .collect()
}

#[test]
fn sigkilled_run_resumes_to_the_uninterrupted_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let full = tmp.path().join("full");
    let st = bin()
        .args(["llm", "train", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&full)
        .args(["--no-export", "--quiet"])
        .status()
        .unwrap();
    assert!(st.success());
    let want = metrics(&full);
    assert_eq!(want.len(), 8);
    assert!(full.join("plots/reward.png").exists() && full.join("plots/summary.md").exists());

    let killed = tmp.path().join("killed");
    let mut child = bin()
        .args(["llm", "train", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&killed)
        .args(["--no-export", "--quiet"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill once a checkpoint exists and an iteration past it was logged.
    let t0 = Instant::now();
    loop {
        let n = metrics(&killed).len();
        if n >= 3 && killed.join("checkpoints/latest").exists() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "the run never got going");
        assert!(child.try_wait().unwrap().is_none(), "the run finished before it could be killed");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let at_kill = metrics(&killed).len();
    assert!(at_kill < 8, "killed after the run had finished ({at_kill} iterations)");

    let st = bin().args(["llm", "train", "--resume"]).arg(&killed).args(["--no-export", "--quiet"]).status().unwrap();
    assert!(st.success());
    assert_eq!(metrics(&killed), want, "resumed metrics differ from the uninterrupted run's");
}

/// A power loss can leave the last line of `metrics.jsonl` torn while the
/// checkpoint (synced first) counts it. `--resume` cuts the log back to its
/// complete lines with a warning naming the file, so the resumed run's
/// plots and every later reader accept it. The same resume keeps the
/// `--no-export` of the run it continues, and says when its final
/// evaluation starts.
#[test]
fn a_torn_metrics_line_is_cut_at_resume_and_the_run_keeps_its_no_export() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path());
    let run = tmp.path().join("torn");
    let st = bin()
        .args(["llm", "train", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&run)
        .args(["--no-export", "--quiet", "--set", "iterations=4"])
        .status()
        .unwrap();
    assert!(st.success());
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    let last = lines[3];
    std::fs::write(&path, format!("{}\n{}", lines[..3].join("\n"), &last[..last.len() / 2])).unwrap();

    let out = bin()
        .args(["llm", "train", "--resume"])
        .arg(&run)
        .args(["--set", "iterations=6", "--set", "eval_at_end=true", "--set", "eval.k=1"])
        .args(["--set", "eval.data.count=2", "--set", "eval.sampling.max_new_tokens=4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("{}: line 4 is torn", path.display())), "{err}");
    // Which record went, and that nothing writes it again.
    assert!(err.contains("the record of iteration 3 is lost and will not be written again"), "{err}");
    assert!(err.contains("resumes from its checkpoint at iteration 4"), "{err}");
    assert!(err.contains("evaluating after 6 iterations"), "{err}");
    let iters: Vec<u64> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("every line parses")["iter"].as_u64().unwrap())
        .collect();
    assert_eq!(iters, [0, 1, 2, 4, 5], "iteration 3's line was torn; the rest are whole and in order");
    assert!(run.join("plots/reward.png").exists());
    assert!(!run.join("model").exists(), "--resume exported a --no-export run");
}
