//! DeepMind Control Suite tasks on real MuJoCo physics, for the r2vpo
//! continuous-control experiments.
//!
//! * [`physics`]: loads the suite's MJCF models (fetched by `make deps`;
//!   [`mjcf`] edits their text where a task needs it) and
//!   steps them exactly like dm_control 1.0.50's legacy step, detecting MuJoCo
//!   warnings and keeping MuJoCo from writing `MUJOCO_LOG.TXT`.
//! * [`tasks`]: rewards, observations, resets and per-episode edits of each
//!   task, one module per domain, plus the registry ([`task_names`]).
//! * [`env`](mod@env): a single environment ([`make_env`]): 1000-step episodes ending
//!   by truncation, actions in `[-1, 1]^nu`.
//! * [`vec_env`]: N environments over one shared model, stepped with rayon,
//!   auto-reset, observation normalisation and reward scaling ([`VecEnv`]).
//! * [`video`]: episode videos, drawn offscreen by MuJoCo's renderer and
//!   encoded to MP4 by ffmpeg.
//!
//! Parity with dm_control is checked by golden trajectories recorded with
//! `scripts/dmc_golden.py` and replayed in `tests/golden.rs`.
#![warn(missing_docs)]

pub mod bench;
pub mod brax;
pub mod env;
pub mod error;
pub mod mjcf;
pub mod native;
pub mod physics;
pub mod policy;
pub mod rewards;
pub mod run;
pub mod stats;
pub mod tasks;
pub mod trainer;
pub mod vec_env;
pub mod video;

pub use env::{load_task_model, make_env, Env, StepResult};
pub use error::{Error, PhysicsWarning, Result};
pub use physics::{load_edited_model, load_model, suite_dir, Physics, PhysicsState, SUITE_ENV_VAR};
pub use tasks::{task_names, task_spec, MovedObject, Task, TaskSpec};
pub use vec_env::{EpisodeStats, RunningMeanStd, VecEnv, VecEnvConfig, VecStep};
