//! Episode videos through the real binary: `control train` with `[video]
//! every` films evaluations into the run folder, and `control eval --video`
//! films a trained policy; ffmpeg (the pinned one) decodes what they wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2vpo"));
    c.current_dir(root());
    c
}

/// Frames of `path` as ffmpeg decodes them to raw RGB at `w`×`h`.
fn decoded_frames(path: &Path, w: usize, h: usize) -> usize {
    let out = Command::new(r2vpo_control::video::ffmpeg_path())
        .args(["-hide_banner", "-loglevel", "error", "-i"])
        .arg(path)
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len() % (w * h * 3), 0);
    out.stdout.len() / (w * h * 3)
}

#[test]
fn training_films_evaluations_and_eval_films_the_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let run_s = run.to_str().unwrap();
    let mut args = vec!["control", "train", "--task", "cartpole-balance", "--algo", "ppo", "--out", run_s, "--quiet"];
    for s in [
        "num_envs=4",
        "unroll=8",
        "batch_size=4",
        "minibatches=2",
        "epochs=1",
        "total_env_steps=512",
        "eval_every=256",
        "eval_episodes=1",
        "video.every=256",
        "video.width=96",
        "video.height=64",
        // Every tenth control step: software rendering takes ≈ 20 ms a frame.
        "video.max_fps=10",
    ] {
        args.extend(["--set", s]);
    }
    let st = bin().args(&args).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    // Evaluations at 256 and 512 env steps, each filmed: 1000 control steps
    // at 100 Hz, every tenth one drawn.
    let ms: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let videos: Vec<&str> = ms.iter().filter_map(|m| m["video"].as_str()).collect();
    assert_eq!(videos.len(), 2, "{videos:?}");
    for v in &videos {
        assert_eq!(decoded_frames(Path::new(v), 96, 64), 100);
    }
    assert!(run.join("videos/eval-256.mp4").exists() && run.join("videos/eval-512.mp4").exists());
    assert!(run.join("plots/video_frame.png").exists());

    let out = tmp.path().join("films");
    let st = bin()
        .args(["control", "eval", "--run", run_s, "--episodes", "2", "--seed", "4", "--video"])
        .arg(&out)
        .args([
            "--video-episodes",
            "2",
            "--set",
            "video.width=64",
            "--set",
            "video.height=48",
            "--set",
            "video.camera=1",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    for i in 0..2 {
        let v = out.join(format!("cartpole-balance-seed4-ep{i}.mp4"));
        assert!(text.contains(&format!("video: {} (100 frames at 10 fps)", v.display())), "{text}");
        assert_eq!(decoded_frames(&v, 64, 48), 100);
    }
    assert!(out.join("cartpole-balance-seed4-ep0.png").exists());
    assert!(!out.join("cartpole-balance-seed4-ep1.png").exists());

    // A camera the model lacks is refused by field, and nothing is written.
    let st = bin()
        .args(["control", "eval", "--run", run_s, "--episodes", "1", "--video"])
        .arg(tmp.path().join("none"))
        .args(["--set", "video.camera=9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && err.contains("video.camera") && err.contains("9"), "{err}");
    assert!(!tmp.path().join("none").join("cartpole-balance-seed12345-ep0.mp4").exists());
}
