//! `scripts/gpu/check.sh --dry-run` through this build's binary: the GPU
//! check's CPU parts (every phase the GPU machine runs that has a CPU
//! meaning: correctness against the fused kernels, the sampler check, the
//! steps, `llm train` end to end and a checkpoint resumed across runs, the
//! summary), so the script run on a scarce borrowed GPU cannot rot unseen.

use std::path::PathBuf;
use std::process::Command;

/// Runs `check.sh --dry-run` with this build's binary and `env` in a
/// temporary folder; asserts it succeeded and returns its output folder
/// (with the temporary folder that holds it) and `status.txt`.
fn dry_run(env: &[(&str, std::ffi::OsString)]) -> (tempfile::TempDir, PathBuf, String) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let st = Command::new("bash")
        .current_dir(&root)
        .args(["scripts/gpu/check.sh", "--dry-run"])
        .env("R2VPO_BIN", env!("CARGO_BIN_EXE_r2vpo"))
        .env("OUT_DRY", &out)
        .env("RUNS", tmp.path().join("runs"))
        .env("TOK", tmp.path().join("tok"))
        .env("RAYON_NUM_THREADS", "2")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&st.stdout).into_owned() + &String::from_utf8_lossy(&st.stderr);
    assert!(st.status.success(), "{log}");
    let status = std::fs::read_to_string(out.join("status.txt")).unwrap();
    (tmp, out, status)
}

#[cfg(not(feature = "torch"))]
#[test]
fn the_gpu_checks_dry_run_passes_every_phase() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    // numpy for the bf16 folder the load phase writes: the Brax venv `make
    // deps` makes has it.
    let (_tmp, out, status) = dry_run(&[("NUMPY_PY", root.join(".deps/venv-brax/bin/python").into())]);
    for phase in [
        "check-f32",
        "check-sampler-f32",
        "r2vpo-step",
        "r2vpo-ck-step",
        "plan-torch-step",
        "plan-torch-ck-step",
        "bf16-folder",
        "serve-load",
        "train-e2e",
        "xdev-2",
        "summary",
    ] {
        assert!(status.contains(&format!("{phase} rc=0")), "{phase} did not pass:\n{status}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## Sampler against learner") && summary.contains("| 2 |"), "{summary}");
    assert!(summary.contains("## Loading a bf16 model") && summary.contains("candle cpu f32"), "{summary}");
}

/// The torch build's phases of the end-to-end section: the torch run, the
/// collectives checked through a launched job of one, and the torch run
/// again as that job (the distributed learner), which on the CPU gives the
/// plain run's figures; and the packing bench on the torch backend.
#[cfg(feature = "torch")]
#[test]
fn the_gpu_checks_distributed_learner_phases_pass_in_the_dry_run() {
    let (_tmp, out, status) = dry_run(&[
        ("R2VPO_TORCH_BIN", env!("CARGO_BIN_EXE_r2vpo").into()),
        ("ONLY", "train-torch-e2e dist-check train-torch-dist1 r2vpo-torch-packing summary".into()),
    ]);
    for phase in ["train-torch-e2e", "dist-check", "train-torch-dist1", "r2vpo-torch-packing", "summary"] {
        assert!(status.contains(&format!("{phase} rc=0")), "{phase} did not pass:\n{status}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    // The packing bench on the torch backend: padded rows first, packed faster
    // in tokens computed (the dry run's times are too small to compare).
    let rows = summary["packing"]["rows"].as_array().unwrap_or_else(|| panic!("no packing rows: {summary}"));
    assert!(rows[0]["layout"].as_str().unwrap().starts_with("padded rows"), "{rows:?}");
    let packed = rows.iter().find(|r| r["layout"].as_str().unwrap().starts_with("packed")).unwrap();
    assert!(packed["computed_tokens"].as_u64() < rows[0]["computed_tokens"].as_u64(), "{rows:?}");
    let dist = &summary["dist"];
    assert!(dist["train_tok_s_dist"].as_f64().unwrap() > 0.0, "{dist}");
    assert!(dist["worst_rel"].as_f64().unwrap() <= 1e-4, "{dist}");
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("## `dist check` on the device") && md.contains("| all-reduce |"), "{md}");
}
