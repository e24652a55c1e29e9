//! What the `tpuc` command does beyond parsing its arguments: compiling files and running models
//! (both through `tpuc_driver`'s one pipeline), `.npy` files (`tpuc-npy`, which also compares
//! outputs with references).

/// `println!` that returns an error instead of panicking when standard output is closed
/// (`tpuc ops | head`); `cli::main` treats a broken pipe as a normal end.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}

pub mod cli;
pub mod doctor;
/// `.npy` / `.npz` files (`tpuc-npy`).
pub use tpuc_npy as npy;
mod plugins;
pub mod run;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Result};
use tpuc_driver::{EmitFormat, Emitted, LowerOptions, Options};

/// Compiles a `.pt2` or `.fx` file to StableHLO text or bytecode.
pub fn compile_file(input: &Path, opts: &LowerOptions, format: EmitFormat) -> Result<Emitted> {
    compile_file_with_sizes(input, None, opts, format)
}

/// Compiles a `.pt2` or `.fx` file whose symbolic sizes, if it has any, are fixed first:
/// `sizes` names some (`s0` -> 8), the others take the sizes the program was exported with.
/// With `sizes` None a program with symbolic sizes is refused.
pub fn compile_file_with_sizes(
    input: &Path,
    sizes: Option<&BTreeMap<String, i64>>,
    opts: &LowerOptions,
    format: EmitFormat,
) -> Result<Emitted> {
    let options = Options {
        lower: opts.clone(),
        sizes: sizes.cloned(),
        ..Options::default()
    };
    Ok(tpuc_driver::emit_file(input, &options, format)?)
}

/// Parses `SYMBOL=SIZE` settings (`s0=8`).
pub fn parse_sizes(settings: &[String]) -> Result<BTreeMap<String, i64>> {
    let mut sizes = BTreeMap::new();
    for setting in settings {
        let parsed = setting
            .split_once('=')
            .and_then(|(name, value)| Some((name.trim(), value.trim().parse::<i64>().ok()?)))
            .filter(|(name, _)| !name.is_empty());
        let Some((name, value)) = parsed else {
            bail!("--size {setting:?}: expected SYMBOL=SIZE, e.g. s0=8");
        };
        if sizes.insert(name.to_string(), value).is_some() {
            bail!("--size: size {name} is given twice");
        }
    }
    Ok(sizes)
}
