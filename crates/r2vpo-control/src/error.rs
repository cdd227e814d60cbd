//! Errors of the control crate.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Names of MuJoCo's warning kinds, in `mjtWarning` order.
pub const WARNING_NAMES: [&str; 7] = [
    "mjWARN_INERTIA",
    "mjWARN_CONTACTFULL",
    "mjWARN_CNSTRFULL",
    "mjWARN_BADQPOS",
    "mjWARN_BADQVEL",
    "mjWARN_BADQACC",
    "mjWARN_BADCTRL",
];

/// MuJoCo raised new warnings during a physics call: the state is invalid
/// (dm_control raises `PhysicsError` here), so the episode must be reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MuJoCo warning(s) during simulation: {}", self.names().join(", "))]
pub struct PhysicsWarning {
    /// Bit `i` is set when warning kind `i` (see [`WARNING_NAMES`]) fired.
    pub kinds: u32,
}

impl PhysicsWarning {
    /// The names of the warnings that fired.
    pub fn names(&self) -> Vec<&'static str> {
        WARNING_NAMES.iter().enumerate().filter(|(i, _)| self.kinds & (1 << i) != 0).map(|(_, n)| *n).collect()
    }
}

/// Errors of model loading, task construction and environment use.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The dm_control suite folder (or one model in it) is missing.
    #[error(
        "DM Control suite model `{}` not found (suite dir `{}`); run `make deps` to fetch it, \
         or point R2VPO_DMC_SUITE at a copy of dm_control/suite",
        path.display(),
        dir.display()
    )]
    SuiteMissing {
        /// The suite folder searched.
        dir: PathBuf,
        /// The model file that was expected.
        path: PathBuf,
    },
    /// MuJoCo failed to compile a model file.
    #[error("MuJoCo could not load `{}`: {message}", path.display())]
    ModelLoad {
        /// The model file.
        path: PathBuf,
        /// MuJoCo's message.
        message: String,
    },
    /// No task of that name is registered.
    #[error("unknown control task `{name}`; known tasks: {}", known.join(", "))]
    UnknownTask {
        /// The requested name.
        name: String,
        /// The registered names.
        known: Vec<&'static str>,
    },
    /// A model lacks an element the task needs.
    #[error("task `{task}`: model has no {kind} named `{name}`")]
    MissingElement {
        /// The task.
        task: &'static str,
        /// The element kind (body, joint, site, geom, sensor).
        kind: &'static str,
        /// The element name.
        name: String,
    },
    /// A model does not have the shape a task assumes.
    #[error("task `{task}`: unexpected model: {message}")]
    ModelMismatch {
        /// The task.
        task: &'static str,
        /// What differs.
        message: String,
    },
    /// A vector handed in has the wrong length.
    #[error("task `{task}`: `{field}` has length {got}, expected {expected}")]
    BadLength {
        /// The task.
        task: &'static str,
        /// The field (action, qpos, episode_params, ...).
        field: &'static str,
        /// The length given.
        got: usize,
        /// The length required.
        expected: usize,
    },
    /// Resetting kept producing invalid states.
    #[error("task `{task}`: reset failed after {attempts} attempts: {reason}")]
    ResetFailed {
        /// The task.
        task: &'static str,
        /// Attempts made.
        attempts: usize,
        /// The last failure.
        reason: String,
    },
    /// A physics call produced MuJoCo warnings.
    #[error("task `{task}`: {warning}")]
    Physics {
        /// The task.
        task: &'static str,
        /// The warnings.
        warning: PhysicsWarning,
    },
    /// A configuration value is out of range.
    #[error("invalid `{field}`: {message}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why it is invalid.
        message: String,
    },
}

/// Errors of training, evaluation and checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The environment layer failed.
    #[error(transparent)]
    Env(#[from] crate::Error),
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The algorithm core rejected an input.
    #[error(transparent)]
    Core(#[from] r2vpo::Error),
    /// Writing a report file failed.
    #[error(transparent)]
    Report(#[from] r2vpo_report::ReportError),
    /// Reading or parsing a file failed.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A configuration value is out of range.
    #[error("invalid `{field}`: {message}")]
    Config {
        /// Dotted name of the field.
        field: String,
        /// Why it is invalid.
        message: String,
    },
    /// Rendering or encoding an episode video failed.
    #[error("video: {0}")]
    Video(String),
    /// A loss or gradient became non-finite.
    #[error("training diverged at update {update}: {what}")]
    Diverged {
        /// The update index.
        update: u64,
        /// The non-finite quantity.
        what: String,
    },
}

/// Result alias of the trainer.
pub type TrainResult<T> = std::result::Result<T, TrainError>;

pub(crate) fn config_err(field: &str, message: String) -> TrainError {
    TrainError::Config { field: field.into(), message }
}
