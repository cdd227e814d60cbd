//! # r2vpo-report — what a run leaves on disk
//!
//! Run folders, atomic file writes, metric logs (JSONL and CSV), PNG/SVG
//! plots, and the experiment trackers a run can also report to (MLflow,
//! Weights & Biases: [`track`]). Shared by the CLI and the domain crates so every command writes its
//! outputs the same way: nothing already written is lost if a process dies
//! mid-write, because every file is written to a temporary sibling and
//! renamed into place.

#![warn(missing_docs)]

pub mod config;
pub mod edge;
pub mod golden;
mod io;
pub mod jsonl;
mod lock;
pub mod plot;
mod tensorboard;
pub mod track;

pub use io::{
    atomic_write, atomic_write_json, atomic_write_string, permissions_as_created, CsvWriter, JsonlWriter, ReportError,
    RunDir,
};
pub use lock::{RunLock, LOCK_FILE};
pub use tensorboard::{read_scalars, truncate_events_after, TensorBoardWriter};
