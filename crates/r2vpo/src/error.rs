//! The core crate's error type.

/// Errors raised by the algorithm core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed (shape mismatch, dtype, device).
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// A configuration value is out of its valid range.
    #[error("invalid value for `{field}`: {message}")]
    InvalidConfig {
        /// Dotted path of the offending field, e.g. `objective.eps_low`.
        field: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// Inputs disagree in shape or length.
    #[error("shape mismatch: {0}")]
    Shape(String),
}

/// Result alias for the core crate.
pub type Result<T> = std::result::Result<T, Error>;
