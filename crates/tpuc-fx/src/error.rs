use std::path::PathBuf;

/// Why a program could not be read or is not well formed. Every variant names the file and,
/// where there is one, the node or entry at fault.
#[derive(Debug, thiserror::Error)]
pub enum FxError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid .pt2 archive: {message}")]
    Archive { path: PathBuf, message: String },
    #[error("{path}: {entry}: invalid JSON at {location}: {message}")]
    Json {
        path: PathBuf,
        entry: String,
        location: String,
        message: String,
    },
    #[error("{path}: unsupported schema version {major}.{minor} (tpuc reads torch.export schema {supported}.x)")]
    SchemaVersion {
        path: PathBuf,
        major: i64,
        minor: i64,
        supported: i64,
    },
    #[error("{path}: not a tpuc .fx file: {message}")]
    FxFormat { path: PathBuf, message: String },
    #[error("{path}: {context}: {message}")]
    Invalid {
        path: PathBuf,
        context: String,
        message: String,
    },
}

pub type Result<T, E = FxError> = std::result::Result<T, E>;
