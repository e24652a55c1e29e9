//! The pipelines behind the `tpuc` command: compile (read a program, lower it, emit MLIR) and
//! run (compile and execute on a PJRT plugin).

pub mod compare;
pub mod npy;
pub mod run;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tpuc_fx::Program;
use tpuc_hlo::{EmitFormat, LowerOptions, Lowered};

/// What a compile produced, with the time each stage took.
pub struct Compiled {
    pub lowered: Lowered,
    pub output: Vec<u8>,
    pub nodes: usize,
    pub read: Duration,
    pub lower: Duration,
    pub emit: Duration,
}

/// Compiles a `.pt2` or `.fx` file to StableHLO text or bytecode.
pub fn compile_file(input: &Path, opts: &LowerOptions, format: EmitFormat) -> Result<Compiled> {
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
) -> Result<Compiled> {
    let t0 = Instant::now();
    let mut program = tpuc_fx::read_program(input)?;
    if let Some(sizes) = sizes {
        program = specialize(program, input, sizes, None)?;
    }
    let t1 = Instant::now();
    let lowered = tpuc_hlo::lower(&program, opts)
        .with_context(|| format!("cannot compile {}", input.display()))?;
    let t2 = Instant::now();
    let output = tpuc_hlo::emit(&lowered.module, format)?;
    let t3 = Instant::now();
    Ok(Compiled {
        lowered,
        output,
        nodes: program.graph.nodes.len(),
        read: t1 - t0,
        lower: t2 - t1,
        emit: t3 - t2,
    })
}

/// `program` (read from `path`) with its symbolic sizes replaced by numbers: those in `given`,
/// then those the shapes of the inputs it will run on show (`inputs`, the user inputs' shapes
/// in order), then the sizes it was exported with. Every size is checked against the range it
/// was exported for. A program without symbolic sizes is returned as it is.
pub fn specialize(
    program: Program,
    path: &Path,
    given: &BTreeMap<String, i64>,
    inputs: Option<&[Vec<i64>]>,
) -> Result<Program> {
    use tpuc_fx::symbolic;
    let fail = |e: String| anyhow!("{}: {e}", path.display());
    if !symbolic::is_symbolic(&program) {
        if let Some(name) = given.keys().next() {
            bail!(
                "{}: no symbolic size {name}: the program's sizes are all static",
                path.display()
            );
        }
        return Ok(program);
    }
    let mut sizes = match inputs {
        Some(inputs) => symbolic::sizes_from_inputs(&program, inputs).map_err(fail)?,
        None => BTreeMap::new(),
    };
    for (name, &value) in given {
        match sizes.insert(name.clone(), value) {
            Some(seen) if seen != value => bail!(
                "{}: size {name} is given as {value} but the inputs have {seen}",
                path.display()
            ),
            _ => {}
        }
    }
    let values = symbolic::resolve_sizes(&program, &sizes).map_err(fail)?;
    symbolic::specialize(program, &values).map_err(fail)
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
