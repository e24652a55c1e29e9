//! tpuc's front end: the FX graph model of an exported PyTorch program, the reader of
//! torch.export `.pt2` archives, and tpuc's own `.fx` interchange format.

pub mod dtype;
pub mod error;
pub mod fxfile;
pub mod graph;
mod pt2;
mod schema;
pub mod source;
pub mod symbolic;
pub mod validate;

pub use dtype::DType;
pub use error::{FxError, Result};
pub use graph::*;
pub use pt2::{check_weight_size, program_from_json, read_pt2, SUPPORTED_SCHEMA_MAJOR};

use std::path::Path;

/// Reads a program from a `.pt2` archive or a `.fx` file, chosen by the file's content.
pub fn read_program(path: &Path) -> Result<Program> {
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
    if head == fxfile::MAGIC {
        fxfile::read_fx(path)
    } else if head.starts_with(b"PK") {
        read_pt2(path)
    } else {
        Err(FxError::Archive {
            path: path.to_path_buf(),
            message: "neither a torch.export .pt2 archive (zip) nor a tpuc .fx file".into(),
        })
    }
}
