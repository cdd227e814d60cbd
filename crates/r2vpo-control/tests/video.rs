//! Episode videos: real frames from MuJoCo's renderer on EGL (Mesa's
//! software driver here), encoded by the pinned ffmpeg, decoded back by it.

use std::path::Path;
use std::process::Command;

use r2vpo_control::policy::ActorCritic;
use r2vpo_control::trainer::{evaluate_policy, evaluate_policy_recorded, EvalPolicy, TrainConfig};
use r2vpo_control::video::{ffmpeg_path, Recorder, VideoTarget};
use r2vpo_control::RunningMeanStd;

/// Decodes `path` to raw RGB with ffmpeg and returns (frames, bytes).
fn decode(path: &Path, w: usize, h: usize) -> (usize, Vec<u8>) {
    let out = Command::new(ffmpeg_path())
        .args(["-hide_banner", "-loglevel", "error", "-i"])
        .arg(path)
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"])
        .output()
        .expect("running ffmpeg");
    assert!(
        out.status.success(),
        "ffmpeg could not decode {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let frame = w * h * 3;
    assert_eq!(out.stdout.len() % frame, 0, "decoded bytes are not whole {w}x{h} frames");
    (out.stdout.len() / frame, out.stdout)
}

/// The codec and frame rate the container declares, as ffmpeg reads it.
fn stream_line(path: &Path) -> String {
    let out = Command::new(ffmpeg_path()).args(["-hide_banner", "-i"]).arg(path).output().expect("running ffmpeg");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.lines().find(|l| l.contains("Video:")).unwrap_or_default().to_owned()
}

fn config(task: &str) -> TrainConfig {
    let mut cfg = TrainConfig { task: task.into(), eval_deterministic: false, ..TrainConfig::default() };
    cfg.video.width = 160;
    cfg.video.height = 120;
    // Every tenth control step: software rendering takes ≈ 20 ms a frame here.
    cfg.video.max_fps = 10.0;
    cfg
}

/// A cartpole episode is filmed at 10 fps (every tenth control step of
/// 1000) into an H.264 MP4 that decodes to exactly those 100 frames, which
/// show a moving scene; the still is written; and the returns of the
/// filmed evaluation are bit-identical to the unfilmed one's.
#[test]
fn a_filmed_episode_decodes_and_leaves_returns_unchanged() {
    let cfg = config("cartpole-swingup");
    let net = ActorCritic::new(&cfg.policy, 5, 1, 7).unwrap();
    let stats = RunningMeanStd::new(5);
    let policy = EvalPolicy { net: &net, obs_stats: &stats, obs_norm: None };
    let dir = tempfile::tempdir().unwrap();
    let target =
        VideoTarget { path: dir.path().join("videos/ep0.mp4"), still: Some(dir.path().join("plots/frame.png")) };
    let (filmed, files) = evaluate_policy_recorded(&cfg, &policy, 2, 11, vec![target]).unwrap();
    let plain = evaluate_policy(&cfg, &policy, 2, 11).unwrap();
    assert_eq!(filmed.len(), 2);
    assert_eq!(
        filmed.iter().map(|r| r.to_bits()).collect::<Vec<_>>(),
        plain.iter().map(|r| r.to_bits()).collect::<Vec<_>>()
    );

    assert_eq!(files.len(), 1);
    assert_eq!(files[0].frames, 100);
    assert_eq!(files[0].fps, 10.0);
    assert!(!dir.path().join("videos/ep0.mp4.partial").exists());
    let line = stream_line(&files[0].path);
    assert!(line.contains("h264") && line.contains("yuv420p") && line.contains("10 fps"), "{line}");
    let (frames, raw) = decode(&files[0].path, 160, 120);
    assert_eq!(frames, 100);
    // Not a blank picture, and the picture changes: the cart moves.
    let frame = 160 * 120 * 3;
    let first = &raw[..frame];
    let spread = first.iter().max().unwrap() - first.iter().min().unwrap();
    assert!(spread > 50, "first frame is nearly uniform (spread {spread})");
    let differing = (1..frames).filter(|&k| raw[k * frame..(k + 1) * frame] != raw[(k - 1) * frame..k * frame]).count();
    assert!(differing > frames / 2, "only {differing} of {frames} frames differ from the one before");
    let png = std::fs::read(dir.path().join("plots/frame.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
}

/// Bad video settings are refused by field before anything renders.
#[test]
fn bad_video_settings_are_refused_by_field() {
    let net = ActorCritic::new(&TrainConfig::default().policy, 5, 1, 7).unwrap();
    let stats = RunningMeanStd::new(5);
    let policy = EvalPolicy { net: &net, obs_stats: &stats, obs_norm: None };
    let dir = tempfile::tempdir().unwrap();
    let target = || vec![VideoTarget { path: dir.path().join("v.mp4"), still: None }];
    let mut cfg = config("cartpole-swingup");
    cfg.video.width = 161;
    let e = evaluate_policy_recorded(&cfg, &policy, 1, 0, target()).unwrap_err().to_string();
    assert!(e.contains("video.width") && e.contains("even"), "{e}");
    let mut cfg = config("cartpole-swingup");
    cfg.video.camera = 7;
    let e = evaluate_policy_recorded(&cfg, &policy, 1, 0, target()).unwrap_err().to_string();
    assert!(e.contains("video.camera") && e.contains("2 camera"), "{e}");
    let mut cfg = config("cartpole-swingup");
    cfg.video.width = 2000;
    let e = evaluate_policy_recorded(&cfg, &policy, 1, 0, target()).unwrap_err().to_string();
    assert!(e.contains("offscreen buffer"), "{e}");
    assert!(!dir.path().join("v.mp4").exists());
}

/// The reacher's target moves every episode in the task, not in the
/// shared model: a frame draws it where the task put it. The same arm
/// state with two targets gives two different pictures (and the free
/// camera, -1, films too).
#[test]
fn per_episode_targets_are_drawn_where_the_task_put_them() {
    let mut cfg = config("reacher-easy");
    cfg.video.camera = -1;
    let mut env = r2vpo_control::make_env("reacher-easy", 5, None).unwrap();
    env.reset().unwrap();
    let (state, params) = env.snapshot();
    let model = r2vpo_control::load_task_model(env.spec(), None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let targets =
        (0..3).map(|i| VideoTarget { path: dir.path().join(format!("t{i}.mp4")), still: None }).collect::<Vec<_>>();
    let mut rec = Recorder::new(&cfg.video, model, env.physics().control_timestep(), 1000, targets).unwrap();
    let moved = [-params[0], -params[1]];
    for (i, p) in [&params[..], &params[..], &moved[..]].into_iter().enumerate() {
        env.restore(&state, p).unwrap();
        rec.frame(i, &env).unwrap();
    }
    let files = rec.close().unwrap();
    let frames: Vec<Vec<u8>> = files
        .iter()
        .map(|f| {
            let (n, raw) = decode(&f.path, 160, 120);
            assert_eq!((n, f.frames), (1, 1));
            raw
        })
        .collect();
    assert_eq!(frames[0], frames[1], "the same state drew two pictures");
    assert_ne!(frames[0], frames[2], "moving the target changed nothing drawn");
}
