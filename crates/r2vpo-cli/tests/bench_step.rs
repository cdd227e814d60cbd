//! `r2vpo bench step --check` through the binary: the check the GPU
//! machine runs (`scripts/gpu/check.sh`), here on the CPU with the fused
//! kernels off (the ops a CUDA device runs), over two steps with an AdamW
//! update between them, on left-padded rows with the entropy bonus; and
//! `--sampler`, the KV-cache sampler's behaviour log-probs against the
//! learner's recomputation.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn check(extra: &[&str]) -> (bool, serde_json::Value, String) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("check.json");
    let st = Command::new(env!("CARGO_BIN_EXE_r2vpo"))
        .current_dir(root())
        .args(["--threads", "2", "bench", "step", "--shape", "configs/shapes/qwen3-tiny.json", "--composite"])
        .args(["--check", "--batch", "3", "--prompt", "12", "--response", "10", "--out"])
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    let v = std::fs::read_to_string(&out).map(|t| serde_json::from_str(&t).unwrap()).unwrap_or_default();
    (st.status.success(), v, String::from_utf8_lossy(&st.stdout).into_owned() + &String::from_utf8_lossy(&st.stderr))
}

#[test]
fn the_composites_match_the_fused_kernels_over_two_steps_with_padding_and_entropy() {
    let (ok, v, out) = check(&["--pad", "4", "--entropy", "0.01"]);
    assert!(ok, "{out}");
    assert!(v["pass"].as_bool().unwrap() && v["grads_rel_max"].as_f64().unwrap() < 1e-4, "{v}");
    assert_eq!((v["pad"].as_u64(), v["entropy"].as_f64()), (Some(4), Some(0.01)), "{v}");
    // Both steps' gradient norms, on both sides; the update changed them.
    let (g, c) = (v["grad_norm"].as_array().unwrap(), v["cpu_grad_norm"].as_array().unwrap());
    assert_eq!((g.len(), c.len()), (2, 2), "{v}");
    for (a, b) in g.iter().zip(c) {
        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
        assert!(a > 0.0 && (a - b).abs() <= 1e-4 * b, "{v}");
    }
    assert_ne!(g[0], g[1], "{v}");
    // bf16 mixed precision is reported, not gated, at --tolerance inf; at
    // the default 1e-4 it fails, naming the device.
    let (ok, v, out) = check(&["--dtype", "bf16"]);
    assert!(!ok && v["pass"] == false && out.contains("differs from the CPU"), "{out}");
    let (ok, _, out) = check(&["--checkpoint", "--entropy", "0.01"]);
    assert!(!ok && out.contains("--entropy takes no --checkpoint"), "{out}");
}

#[test]
fn the_samplers_log_probs_are_the_learners() {
    let (ok, v, out) = check(&["--sampler", "--pad", "4"]);
    assert!(ok, "{out}");
    assert!(v["max_abs"].as_f64().unwrap() < 1e-5 && v["cpu_max_abs"].as_f64().unwrap() < 1e-5, "{v}");
    assert_eq!((v["tokens"].as_u64(), v["same_tokens_frac"].as_f64()), (Some(30), Some(1.0)), "{v}");
    // A tolerance below f32 rounding fails, naming the device.
    let (ok, _, out) = check(&["--sampler", "--tolerance", "0"]);
    assert!(!ok && out.contains("sampler log-probs differ"), "{out}");
    // Without --check, the sampler is timed: every row to the full length.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sampler.json");
    let st = Command::new(env!("CARGO_BIN_EXE_r2vpo"))
        .current_dir(root())
        .args(["--threads", "2", "bench", "step", "--shape", "configs/shapes/qwen3-tiny.json", "--sampler"])
        .args(["--batch", "2", "--prompt", "8", "--response", "6", "--reps", "2", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        (v["backend"].as_str(), v["batch"].as_u64(), v["response"].as_u64()),
        (Some("candle"), Some(2), Some(6))
    );
    assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0, "{v}");
}

/// `scripts/hf/turns.py` running two real `bench step`s that take turns
/// through `--turns`: every timed step runs alone, in the order A, B, B, A,
/// A, B, and each side reports every step's time; a side that fails stops
/// the run with its status.
#[test]
fn two_benchmarks_take_turns() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_r2vpo");
    // Side b's command is shell-quoted as compare.sh quotes it (`printf
    // %q`, which escapes the braces).
    let side = |name: &str, extra: &str| {
        let turns = if name == "a" { "{turns}" } else { r"\{turns\}" };
        format!(
            "{bin} --threads 1 bench step --shape configs/shapes/qwen3-tiny.json --batch 2 --prompt 6 --response 5 \
             --reps 3 --turns {turns} --out {} {extra}",
            tmp.path().join(format!("{name}.json")).display()
        )
    };
    let log = tmp.path().join("turns.json");
    let run = |a: String, b: String| {
        Command::new("python3")
            .current_dir(root())
            .args(["scripts/hf/turns.py", "--pause", "0.05", "--log"])
            .arg(&log)
            .args([a, b])
            .output()
            .unwrap()
    };
    let out = run(side("a", ""), side("b", "--score"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let turns: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&log).unwrap()).unwrap();
    let order: String = turns.iter().map(|t| t["side"].as_str().unwrap()).collect();
    assert_eq!(order, "abbaab");
    for name in ["a", "b"] {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(tmp.path().join(format!("{name}.json"))).unwrap()).unwrap();
        let times = v["times_s"].as_array().unwrap();
        assert_eq!(times.len(), 3, "{v}");
        // Each step ran inside its turn, from the coordinator's go to the
        // side's done: a side that ran ahead of its turn would have left
        // its byte waiting, and its turn would be shorter than its step.
        let windows = turns
            .iter()
            .filter(|t| t["side"] == name)
            .map(|t| t["end"].as_f64().unwrap() - t["start"].as_f64().unwrap());
        for (t, w) in times.iter().zip(windows) {
            let t = t.as_f64().unwrap();
            assert!(t > 0.0 && t <= w, "side {name}: a {t} s step in a {w} s turn ({turns:?})");
        }
    }
    // A side that cannot start stops the run, naming it.
    let out = run(side("a", ""), side("b", "--check"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("side b exited") && err.contains("no --check"), "{err}");
}

/// A binary built without libtorch refuses the torch backend, saying how
/// to build one that has it.
#[cfg(not(feature = "torch"))]
#[test]
fn a_binary_without_libtorch_says_how_to_get_one() {
    let (ok, _, out) = check(&["--backend", "torch"]);
    assert!(!ok && out.contains("make build-torch"), "{out}");
    let st = Command::new(env!("CARGO_BIN_EXE_r2vpo"))
        .current_dir(root())
        .args(["llm", "train", "--out", "/nonexistent/never", "--set", "model.backend=torch"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && err.contains("model.backend") && err.contains("make build-torch"), "{err}");
}
