//! Episode videos: frames from MuJoCo's own OpenGL renderer (`mjr_*`, the
//! one dm_control's `physics.render` drives), drawn offscreen on EGL, piped
//! to ffmpeg and written as H.264 MP4 files that browsers play.
//!
//! * **Context.** `mujoco_rs`'s renderer opens an EGL pbuffer on the first
//!   EGL device that yields one. With no GPU that is Mesa's software device
//!   (llvmpipe), from Debian's `libegl1`, `libegl-mesa0` and
//!   `libgl1-mesa-dri`, which `make deps` installs (`scripts/egl.sh`).
//! * **Encoder.** ffmpeg from the pinned `imageio-ffmpeg` wheel (a static
//!   build with libx264), unpacked to `.deps/ffmpeg/ffmpeg` by `make deps`;
//!   `$R2VPO_FFMPEG` points elsewhere. Frames go to its stdin as raw RGB, so
//!   no frame touches the disk; writing the same frames with a Rust H.264
//!   encoder would mean compiling OpenH264's C++ here for no gain.
//! * **Trajectories.** A frame is drawn from a copy of the environment's
//!   `MjData` (`mjv_copyData`), never from the data the simulation steps, so
//!   recording cannot change a trajectory (`tests/video.rs` checks returns
//!   with and without video).
//! * **Per-episode edits.** dm_control moves a reacher's or finger's target
//!   by editing the model; here the task keeps those positions
//!   ([`Task::moved_objects`](crate::Task::moved_objects)), and the copy gets
//!   them before drawing, so the target is where the reward says it is.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;

use mujoco_rs::prelude::*;
use mujoco_rs::renderer::MjRenderer;
use serde::{Deserialize, Serialize};

use crate::env::Env;
use crate::error::{TrainError, TrainResult};
use crate::tasks::MovedObject;

/// Environment variable naming the ffmpeg binary to encode with.
pub const FFMPEG_ENV_VAR: &str = "R2VPO_FFMPEG";

/// The ffmpeg `make deps` unpacks, relative to the workspace root.
const DEFAULT_FFMPEG_REL: &str = ".deps/ffmpeg/ffmpeg";

/// Resolves the ffmpeg binary: `$R2VPO_FFMPEG`, else
/// `<workspace>/.deps/ffmpeg/ffmpeg`.
pub fn ffmpeg_path() -> PathBuf {
    if let Some(p) = std::env::var_os(FFMPEG_ENV_VAR).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    // The crate sits at <workspace>/crates/r2vpo-control.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(DEFAULT_FFMPEG_REL)
}

/// The `[video]` table of a control config: what an episode video looks
/// like, and how often training records one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VideoConfig {
    /// Record the first episode of the evaluation at or after every this
    /// many env steps, and of the final one, into `videos/` of the run
    /// folder (0: never; `control eval --video DIR` records regardless).
    pub every: u64,
    /// Frame width in pixels (even, at most the model's offscreen width,
    /// 640 in the suite's models).
    pub width: u32,
    /// Frame height in pixels (even, at most the model's offscreen height,
    /// 480).
    pub height: u32,
    /// The model camera to film from, by index (the suite's first camera
    /// is the one dm_control's `render()` uses); -1: MuJoCo's free camera
    /// looking at the whole model.
    pub camera: i32,
    /// Highest frame rate: control steps are skipped evenly to stay at or
    /// under it (cartpole's 100 Hz control becomes 50 fps).
    pub max_fps: f64,
}

impl Default for VideoConfig {
    fn default() -> Self {
        Self { every: 0, width: 320, height: 240, camera: 0, max_fps: 50.0 }
    }
}

impl VideoConfig {
    /// Checks the values that need no model.
    pub fn validate(&self) -> TrainResult<()> {
        for (field, v) in [("video.width", self.width), ("video.height", self.height)] {
            if v < 16 || v % 2 != 0 {
                return Err(TrainError::Config {
                    field: field.into(),
                    message: format!("{v}: must be even and at least 16 (H.264 in yuv420p halves both axes)"),
                });
            }
        }
        if self.camera < -1 {
            return Err(TrainError::Config {
                field: "video.camera".into(),
                message: format!("{}: a camera index (0, 1, …) or -1 for the free camera", self.camera),
            });
        }
        if !(self.max_fps.is_finite() && self.max_fps >= 1.0) {
            return Err(TrainError::Config {
                field: "video.max_fps".into(),
                message: format!("{}: must be at least 1", self.max_fps),
            });
        }
        Ok(())
    }

    /// Control steps per frame and the resulting frame rate for a task
    /// stepping every `control_timestep` seconds.
    pub fn stride_and_fps(&self, control_timestep: f64) -> (usize, f64) {
        let control_hz = 1.0 / control_timestep;
        let stride = (control_hz / self.max_fps).ceil().max(1.0) as usize;
        (stride, control_hz / stride as f64)
    }
}

/// A finished video.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VideoFile {
    /// The MP4 file.
    pub path: PathBuf,
    /// Frames in it.
    pub frames: usize,
    /// Its frame rate.
    pub fps: f64,
}

/// One video being written: an ffmpeg process reading raw frames.
struct Encoder {
    child: Child,
    stdin: Option<ChildStdin>,
    path: PathBuf,
    partial: PathBuf,
    frames: usize,
}

impl Encoder {
    fn start(path: &Path, width: u32, height: u32, fps: f64) -> TrainResult<Self> {
        let ffmpeg = ffmpeg_path();
        if !ffmpeg.is_file() {
            return Err(TrainError::Video(format!(
                "ffmpeg not found at {} (`make deps` unpacks it; or set {FFMPEG_ENV_VAR})",
                ffmpeg.display()
            )));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| TrainError::File { path: dir.to_path_buf(), message: e.to_string() })?;
        }
        // Written under another name and renamed when ffmpeg is done, so an
        // interrupted run never leaves a truncated MP4 under the real name.
        let partial = path.with_extension("mp4.partial");
        let mut child = Command::new(&ffmpeg)
            .args(["-hide_banner", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24"])
            .args(["-s", &format!("{width}x{height}"), "-framerate", &format!("{fps}"), "-i", "pipe:0"])
            // yuv420p and faststart: what every browser's <video> plays.
            .args(["-an", "-c:v", "libx264", "-preset", "veryfast", "-crf", "23", "-pix_fmt", "yuv420p"])
            .args(["-movflags", "+faststart", "-f", "mp4"])
            .arg(&partial)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| TrainError::Video(format!("starting {}: {e}", ffmpeg.display())))?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin, path: path.to_path_buf(), partial, frames: 0 })
    }

    fn write(&mut self, rgb: &[u8]) -> TrainResult<()> {
        let stdin = self.stdin.as_mut().expect("an open encoder has its stdin");
        if let Err(e) = stdin.write_all(rgb) {
            // ffmpeg stopped reading: its own message says why.
            self.stdin = None;
            let why = self.wait_message();
            return Err(TrainError::Video(format!(
                "ffmpeg stopped taking frames for {}: {e}; {why}",
                self.path.display()
            )));
        }
        self.frames += 1;
        Ok(())
    }

    fn wait_message(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut s) = self.child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        match self.child.wait() {
            Ok(st) => format!("ffmpeg {st}: {}", err.trim()),
            Err(e) => format!("ffmpeg: {e}"),
        }
    }

    fn finish(mut self, fps: f64) -> TrainResult<VideoFile> {
        drop(self.stdin.take());
        let mut err = String::new();
        if let Some(mut s) = self.child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        let status = self.child.wait().map_err(|e| TrainError::Video(format!("waiting for ffmpeg: {e}")))?;
        if !status.success() {
            let _ = std::fs::remove_file(&self.partial);
            return Err(TrainError::Video(format!(
                "ffmpeg failed ({status}) writing {}: {}",
                self.path.display(),
                err.trim()
            )));
        }
        std::fs::rename(&self.partial, &self.path)
            .map_err(|e| TrainError::File { path: self.path.clone(), message: e.to_string() })?;
        Ok(VideoFile { path: self.path.clone(), frames: self.frames, fps })
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        // An abandoned video (an error elsewhere): stop ffmpeg, keep no file.
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Where one recorded environment's episode goes.
#[derive(Clone, Debug)]
pub struct VideoTarget {
    /// The MP4 file to write.
    pub path: PathBuf,
    /// A PNG of the frame halfway through the episode, if wanted.
    pub still: Option<PathBuf>,
}

/// Records the first episode of some environments of an evaluation, one
/// MP4 each, from one offscreen renderer.
pub struct Recorder {
    renderer: MjRenderer,
    /// The drawing copy of whichever environment is being drawn.
    scratch: MjData<Arc<MjModel>>,
    encoders: Vec<Option<Encoder>>,
    targets: Vec<VideoTarget>,
    stride: usize,
    fps: f64,
    still_frame: usize,
    done: Vec<VideoFile>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("targets", &self.targets).field("stride", &self.stride).finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder of `targets.len()` environments (the first ones of the
    /// evaluation) of a task on `model`, stepping every `control_timestep`
    /// seconds for `episode_steps` steps.
    pub fn new(
        cfg: &VideoConfig,
        model: Arc<MjModel>,
        control_timestep: f64,
        episode_steps: usize,
        targets: Vec<VideoTarget>,
    ) -> TrainResult<Self> {
        cfg.validate()?;
        let global = &model.vis().global;
        let (ow, oh) = (global.offwidth as u32, global.offheight as u32);
        if cfg.width > ow || cfg.height > oh {
            return Err(TrainError::Config {
                field: "video.width/height".into(),
                message: format!(
                    "{}x{} is larger than the model's offscreen buffer {ow}x{oh} (<visual><global offwidth/offheight>)",
                    cfg.width, cfg.height
                ),
            });
        }
        let ncam = model.ffi().ncam as i32;
        let camera = match cfg.camera {
            -1 => MjvCamera::new_free(&model),
            c if c < ncam => MjvCamera::new_fixed(c as usize),
            c => {
                return Err(TrainError::Config {
                    field: "video.camera".into(),
                    message: format!("{c}: the model has {ncam} camera(s) (0..{ncam}); -1 is the free camera"),
                })
            }
        };
        let renderer =
            MjRenderer::builder().width(cfg.width).height(cfg.height).camera(camera).build(&model).map_err(|e| {
                TrainError::Video(format!(
                    "no offscreen OpenGL context ({e}); rendering needs EGL with a GPU driver or Mesa's software \
                     one (Debian: apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri; `make deps` does this)"
                ))
            })?;
        let mut renderer = renderer;
        // The renderer's default stores the still uncompressed (230 KB at
        // 320 × 240); the fast level is a third of that.
        renderer.set_png_compression(mujoco_rs::renderer::png::Compression::Fast);
        let (stride, fps) = cfg.stride_and_fps(control_timestep);
        let frames = episode_steps.div_ceil(stride);
        let mut encoders = Vec::with_capacity(targets.len());
        for t in &targets {
            encoders.push(Some(Encoder::start(&t.path, cfg.width, cfg.height, fps)?));
        }
        Ok(Self {
            renderer,
            scratch: MjData::new(model),
            encoders,
            targets,
            stride,
            fps,
            still_frame: frames / 2,
            done: Vec::new(),
        })
    }

    /// Environments being recorded (the first `n` of the evaluation).
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// Whether no environment is recorded.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Whether environment `i`'s video is still open.
    pub fn recording(&self, i: usize) -> bool {
        self.encoders.get(i).is_some_and(Option::is_some)
    }

    /// Draws environment `i` in its current state if its episode is being
    /// recorded and this step is on the frame grid.
    pub fn frame(&mut self, i: usize, env: &Env) -> TrainResult<()> {
        if !self.recording(i) || !env.step_count().is_multiple_of(self.stride) {
            return Ok(());
        }
        env.physics()
            .data()
            .copy_visual_to(&mut self.scratch)
            .map_err(|e| TrainError::Video(format!("copying the state to draw: {e}")))?;
        move_objects(&mut self.scratch, &env.task().moved_objects());
        let video = |e| TrainError::Video(format!("drawing a frame: {e}"));
        self.renderer.sync_data(&mut self.scratch).map_err(video)?;
        self.renderer.render().map_err(video)?;
        let enc = self.encoders[i].as_mut().expect("recording");
        if enc.frames == self.still_frame {
            if let Some(still) = &self.targets[i].still {
                if let Some(dir) = still.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| TrainError::File { path: dir.to_path_buf(), message: e.to_string() })?;
                }
                self.renderer
                    .save_rgb(still)
                    .map_err(|e| TrainError::File { path: still.clone(), message: e.to_string() })?;
            }
        }
        let rgb = self.renderer.rgb_flat().expect("the renderer draws RGB");
        enc.write(rgb)
    }

    /// Closes environment `i`'s video (its episode ended).
    pub fn finish(&mut self, i: usize) -> TrainResult<()> {
        if let Some(enc) = self.encoders.get_mut(i).and_then(Option::take) {
            self.done.push(enc.finish(self.fps)?);
        }
        Ok(())
    }

    /// Closes every open video and returns all of them, in the order they
    /// finished.
    pub fn close(mut self) -> TrainResult<Vec<VideoFile>> {
        for i in 0..self.encoders.len() {
            self.finish(i)?;
        }
        Ok(std::mem::take(&mut self.done))
    }
}

/// Puts the objects a task moved this episode where the task says they
/// are, in the drawing copy only (see the module docs).
fn move_objects(data: &mut MjData<Arc<MjModel>>, moved: &[MovedObject]) {
    for m in moved {
        // SAFETY: only the pointers are read here; the writes are below.
        let (ptr, id, pos) = match *m {
            MovedObject::Geom { id, pos } => (unsafe { data.ffi_mut() }.geom_xpos, id, pos),
            MovedObject::Site { id, pos } => (unsafe { data.ffi_mut() }.site_xpos, id, pos),
        };
        for (k, v) in pos.iter().enumerate() {
            // SAFETY: the task took `id` from this model's geoms or sites,
            // and MuJoCo sizes these arrays 3 × ngeom and 3 × nsite.
            unsafe { *ptr.add(3 * id + k) = *v };
        }
    }
}
