//! Errors of the runtime: the plugin's own (code and message), and tpuc's checks.
use std::fmt;
use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A PJRT call returned an error.
    #[error("{call}: {code}: {message}")]
    Pjrt {
        call: &'static str,
        code: ErrorCode,
        message: String,
    },
    /// No plugin of that name on this machine.
    #[error("no PJRT plugin `{name}` found (install the Python package `{package}`, or pass a path or set TPUC_PJRT_PLUGIN); looked in:\n  {}", searched.join("\n  "))]
    PluginNotFound {
        name: String,
        package: String,
        searched: Vec<String>,
    },
    /// The file could not be loaded as a PJRT plugin.
    #[error("cannot load PJRT plugin {}: {reason}", path.display())]
    PluginLoad { path: PathBuf, reason: String },
    /// The plugin's function table lacks functions tpuc calls.
    #[error("PJRT plugin {} (API {major}.{minor}) lacks functions tpuc needs (tpuc is built for API {}.{}): {}",
        path.display(), pjrt_sys::PJRT_API_MAJOR, pjrt_sys::PJRT_API_MINOR, missing.join(", "))]
    PluginIncomplete {
        path: PathBuf,
        major: i32,
        minor: i32,
        missing: Vec<&'static str>,
    },
    /// A request tpuc refuses before calling the plugin (wrong count, shape, dtype, ...).
    #[error("{0}")]
    Invalid(String),
    /// A compilation the cache refuses (`TPUC_CACHE_MODE=require`): the graph missed it.
    #[error("{0}")]
    NotCached(String),
}

/// The status code of a PJRT error (absl status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
    /// A code this version of the API does not define.
    Other(i32),
}

impl ErrorCode {
    pub(crate) fn from_raw(code: i32) -> Self {
        use ErrorCode::*;
        match code {
            1 => Cancelled,
            2 => Unknown,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            other => Other(other),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::Other(code) => write!(f, "error code {code}"),
            named => write!(f, "{named:?}"),
        }
    }
}
