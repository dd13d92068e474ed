//! Typed errors: one enum per operation where callers react differently.

use thiserror::Error;

/// Reading, writing or validating a parameter file ([`crate::Params`]).
#[derive(Debug, Error)]
pub enum ParamsError {
    /// The TOML text does not describe a parameter set.
    #[error("parameter file is not valid TOML for model::Params: {0}")]
    Parse(#[from] toml::de::Error),
    /// The parameter set could not be written as TOML.
    #[error("cannot write parameters as TOML: {0}")]
    Serialize(#[from] toml::ser::Error),
    /// A rate or threshold is out of range (rates must be finite and > 0,
    /// thresholds finite and >= 0).
    #[error("parameter `{name}` is invalid: {value} ({reason})")]
    Invalid {
        /// Which parameter, e.g. `network.bandwidth`.
        name: String,
        /// The offending value.
        value: f64,
        /// What is required of it.
        reason: &'static str,
    },
}

/// Asking the model for a prediction, a sweep or a block size.
#[derive(Debug, Error)]
pub enum ModelError {
    /// Matrix size or block size is zero, or the block is wider than the matrix.
    #[error("invalid problem: n = {n}, b = {b} (need 1 <= b <= n)")]
    InvalidProblem {
        /// Matrix order (or image side for ray tracing).
        n: u64,
        /// Block width (or grain in rows for ray tracing).
        b: u64,
    },
    /// At least one slave is needed.
    #[error("the number of slaves must be at least 1")]
    ZeroSlaves,
    /// The parameter set is unusable.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// No block size fits the memory budget.
    #[error("memory budget of {budget_bytes} bytes is too small for any block (layout {layout})")]
    MemoryTooSmall {
        /// Total memory budget in bytes.
        budget_bytes: f64,
        /// The memory layout rule that was applied.
        layout: &'static str,
    },
    /// An option that needs a parameter the file does not have.
    #[error("option `{option}` needs parameter `{parameter}`, which the parameter set lacks")]
    MissingParameter {
        /// The option asked for.
        option: &'static str,
        /// The parameter it needs.
        parameter: &'static str,
    },
}
