//! The pipelines behind the `tpuc` command: compile (read a program, lower it, emit MLIR) and
//! run (compile and execute on a PJRT plugin).

pub mod compare;
pub mod npy;
pub mod run;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
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
    let t0 = Instant::now();
    let program = tpuc_fx::read_program(input)?;
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
