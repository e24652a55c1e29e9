//! Where a program comes from, reading it, and fixing its symbolic sizes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tpuc_fx::{symbolic, Program};

use crate::error::{Error, Result};

/// A program to compile.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// A torch.export `.pt2` archive or a tpuc `.fx` file (weights included).
    File(&'a Path),
    /// torch.export's serialized `ExportedProgram` JSON of a graph that takes everything as
    /// inputs (what the torch.compile backend hands over), named `name` in messages.
    Json { name: &'a str, bytes: &'a [u8] },
    /// A module `tpuc compile --weights args` wrote, with the archive it was compiled from,
    /// which gives the signature and the weights.
    Module { module: &'a Path, archive: &'a Path },
}

/// A [`Source`] owning what it refers to, for work that outlives the caller's borrow (a
/// compilation in the background).
#[derive(Clone, Debug)]
pub enum OwnedSource {
    File(PathBuf),
    Json { name: String, bytes: Arc<[u8]> },
    Module { module: PathBuf, archive: PathBuf },
}

impl OwnedSource {
    pub fn source(&self) -> Source<'_> {
        match self {
            OwnedSource::File(path) => Source::File(path),
            OwnedSource::Json { name, bytes } => Source::Json { name, bytes },
            OwnedSource::Module { module, archive } => Source::Module { module, archive },
        }
    }
}

impl Source<'_> {
    /// The source as an [`OwnedSource`] (a JSON graph's bytes copied).
    pub fn to_owned_source(&self) -> OwnedSource {
        match *self {
            Source::File(path) => OwnedSource::File(path.to_path_buf()),
            Source::Json { name, bytes } => OwnedSource::Json {
                name: name.to_string(),
                bytes: bytes.into(),
            },
            Source::Module { module, archive } => OwnedSource::Module {
                module: module.to_path_buf(),
                archive: archive.to_path_buf(),
            },
        }
    }

    /// The name messages give the program.
    pub fn name(&self) -> String {
        match self {
            Source::File(path) => path.display().to_string(),
            Source::Json { name, .. } => name.to_string(),
            Source::Module { module, .. } => module.display().to_string(),
        }
    }

    /// The file the program (its graph and weights) is read from, if any.
    fn program_path(&self) -> Option<&Path> {
        match self {
            Source::File(path) | Source::Module { archive: path, .. } => Some(path),
            Source::Json { .. } => None,
        }
    }

    /// Reads the program.
    pub(crate) fn read(&self) -> Result<Program> {
        match self {
            Source::File(path) | Source::Module { archive: path, .. } => {
                Ok(tpuc_fx::read_program(path)?)
            }
            Source::Json { name, bytes } => Ok(tpuc_fx::program_from_json(Path::new(name), bytes)?),
        }
    }

    /// What identifies the program without reading it: a JSON graph's bytes, a file's path,
    /// size and modification time (a file rewritten in place is a new program).
    pub(crate) fn identity(&self, hash: &mut Sha256) -> Result<()> {
        let mut file = |what: &str, path: &Path| -> Result<()> {
            let canonical = path.canonicalize().map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
            let meta = std::fs::metadata(&canonical).map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            hash.update(format!(
                "{what}\0{}\0{}\0{modified}\0",
                canonical.display(),
                meta.len()
            ));
            Ok(())
        };
        match self {
            Source::File(path) => file("file", path),
            Source::Module { module, archive } => {
                file("module", module)?;
                file("archive", archive)
            }
            Source::Json { bytes, .. } => {
                hash.update(b"json\0");
                hash.update(bytes);
                Ok(())
            }
        }
    }

    /// The path errors about the program name.
    pub(crate) fn error_path(&self) -> PathBuf {
        self.program_path()
            .map_or_else(|| PathBuf::from(self.name()), Path::to_path_buf)
    }
}

/// `program` with its symbolic sizes replaced by numbers: those in `given`, then those the
/// shapes of the inputs it will run on show (`inputs`, the user inputs' shapes in order), then
/// the sizes it was exported with. Every size is checked against the range it was exported
/// for. A program without symbolic sizes is returned as it is.
pub(crate) fn specialize(
    program: Program,
    path: &Path,
    given: &BTreeMap<String, i64>,
    inputs: Option<&[Vec<i64>]>,
) -> Result<Program> {
    let Some(values) = symbol_values(&program, path, given, inputs)? else {
        return Ok(program);
    };
    symbolic::specialize(program, &values)
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
}

/// The value of each of `program`'s symbols, as [`specialize`] chooses them; None for a
/// program whose sizes are all static.
pub(crate) fn symbol_values(
    program: &Program,
    path: &Path,
    given: &BTreeMap<String, i64>,
    inputs: Option<&[Vec<i64>]>,
) -> Result<Option<BTreeMap<String, i64>>> {
    let fail = |e: String| Error::Invalid(format!("{}: {e}", path.display()));
    if !symbolic::is_symbolic(program) {
        if let Some(name) = given.keys().next() {
            return Err(fail(format!(
                "no symbolic size {name}: the program's sizes are all static"
            )));
        }
        return Ok(None);
    }
    // Sizes tensor values decide cannot be given (or taken from the example) at all.
    let decided = symbolic::value_decided(program).map_err(fail)?;
    if !decided.is_empty() {
        return Err(Error::Lower {
            what: path.display().to_string(),
            source: Box::new(tpuc_hlo::LowerError::ValueDecided(
                symbolic::describe_value_decided(&decided),
            )),
        });
    }
    let mut sizes = match inputs {
        Some(inputs) => symbolic::sizes_from_inputs(program, inputs).map_err(fail)?,
        None => BTreeMap::new(),
    };
    for (name, &value) in given {
        match sizes.insert(name.clone(), value) {
            Some(seen) if seen != value => {
                return Err(fail(format!(
                    "size {name} is given as {value} but the inputs have {seen}"
                )))
            }
            _ => {}
        }
    }
    symbolic::resolve_sizes(program, &sizes)
        .map(Some)
        .map_err(fail)
}
