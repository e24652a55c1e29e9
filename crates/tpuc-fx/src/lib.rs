//! tpuc's front end: the FX graph model of an exported PyTorch program, the reader of
//! torch.export `.pt2` archives, and tpuc's own `.fx` interchange format.

pub mod buckets;
pub mod dtype;
pub mod error;
pub mod fxfile;
pub mod graph;
pub mod kernels;
mod pt2;
mod schema;
pub mod source;
pub mod symbolic;
#[cfg(test)]
mod testing;
pub mod validate;

pub use dtype::DType;
pub use error::{FxError, Result};
pub use graph::*;
pub use pt2::{check_weight_size, program_from_json, read_pt2, SUPPORTED_SCHEMA_MAJOR};

use std::path::Path;

/// The kinds of file a program is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramFormat {
    /// A torch.export archive (a zip).
    Pt2,
    /// tpuc's `.fx` interchange.
    Fx,
}

/// What `path` holds, by its first bytes: a program format, or `None` for anything else (a
/// compiled module, say).
pub fn program_format(path: &Path) -> Result<Option<ProgramFormat>> {
    use std::io::Read;
    let io = |source| FxError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut head = Vec::with_capacity(fxfile::MAGIC.len());
    std::fs::File::open(path)
        .map_err(io)?
        .take(fxfile::MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(io)?;
    Ok(if head == fxfile::MAGIC {
        Some(ProgramFormat::Fx)
    } else if head.starts_with(b"PK") {
        Some(ProgramFormat::Pt2)
    } else {
        None
    })
}

/// Reads a program from a `.pt2` archive or a `.fx` file, chosen by the file's content.
pub fn read_program(path: &Path) -> Result<Program> {
    match program_format(path)? {
        Some(ProgramFormat::Fx) => fxfile::read_fx(path),
        Some(ProgramFormat::Pt2) => read_pt2(path),
        None => Err(FxError::Archive {
            path: path.to_path_buf(),
            message: "neither a torch.export .pt2 archive (zip) nor a tpuc .fx file".into(),
        }),
    }
}
