//! What can go wrong along the pipeline, each naming what and where.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program could not be read or is not well formed.
    #[error(transparent)]
    Read(#[from] tpuc_fx::FxError),
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A request that does not fit the program or the target.
    #[error("{0}")]
    Invalid(String),
    #[error("cannot compile {what}")]
    Lower {
        what: String,
        #[source]
        source: Box<tpuc_hlo::LowerError>,
    },
    /// A pass broke an invariant of the IR: a bug in tpuc, caught before it reaches the plugin.
    #[error("internal error while compiling {what}")]
    Verify {
        what: String,
        #[source]
        source: Box<tpuc_hlo::ir::VerifyError>,
    },
    #[error(transparent)]
    Emit(#[from] tpuc_emit::EmitError),
    #[error("the PJRT plugin {path} cannot start")]
    Start {
        path: PathBuf,
        #[source]
        source: tpuc_pjrt::Error,
    },
    #[error("the plugin cannot compile {what}")]
    Compile {
        what: String,
        #[source]
        source: tpuc_pjrt::Error,
    },
    #[error(transparent)]
    Pjrt(#[from] tpuc_pjrt::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
