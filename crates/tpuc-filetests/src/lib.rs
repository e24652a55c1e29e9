//! tpuc's file tests: readable text cases, each an FX graph and `CHECK` lines on what tpuc makes
//! of it (the IR after lowering, after chosen passes or after the whole pipeline; StableHLO
//! text; or the error). The cases are under `filetests/`, one folder per lowering family and
//! per pass; `tests/filetests` runs them all, with the golden modules of `testdata/lowering`
//! ([`golden`]). [`case`] describes the file format.

pub mod case;
pub mod check;
pub mod golden;
pub mod graph_text;
pub mod testdata;

use tpuc_hlo::ir::{print, verify, Module};
use tpuc_hlo::passes::{
    bool_constants, canonicalize, dead_code, exact_division, fold, narrow_arithmetic,
};
use tpuc_hlo::{pipeline, LowerOptions, PipelineOptions};

use case::{Case, Pass, TestKind};

/// Emits a module as StableHLO text: given by the caller, so that this crate's library does
/// not link MLIR.
pub type Emitter<'a> = &'a dyn Fn(&Module) -> Result<String, String>;

/// Runs a case: what its graph becomes, matched against its checks. The error says what failed
/// and shows the output the checks read.
pub fn run_case(case: &Case, emit: Emitter) -> Result<(), String> {
    let output = output(case, emit)?;
    check::match_checks(&output, &case.checks)
        .map_err(|failure| format!("{failure}\n--- what the checks read:\n{output}"))
}

/// The text the case's checks read.
fn output(case: &Case, emit: Emitter) -> Result<String, String> {
    let lower_options = LowerOptions {
        fusion: case.fusion,
        ..LowerOptions::default()
    };
    let lower = || -> Result<Module, String> {
        tpuc_hlo::lower(&case.program, &lower_options)
            .map(|lowered| lowered.module)
            .map_err(|e| e.to_string())
    };
    let through_pipeline = || -> Result<Module, String> {
        let options = PipelineOptions {
            verify: true,
            fusion: case.fusion,
            ..PipelineOptions::default()
        };
        Ok(pipeline(lower()?, &options)
            .map_err(|e| e.to_string())?
            .main)
    };
    let verified = || -> Result<Module, String> {
        let module = lower()?;
        verify(&module).map_err(|e| e.after("lowering").to_string())?;
        Ok(module)
    };
    let failed = |e: String| format!("lowering failed: {e}");
    match &case.test {
        TestKind::Lower => Ok(print(&through_pipeline().map_err(failed)?)),
        TestKind::Emit => emit(&through_pipeline().map_err(failed)?),
        TestKind::LowerOnly => Ok(print(&verified().map_err(failed)?)),
        TestKind::Passes(passes) => {
            let mut module = verified().map_err(failed)?;
            for &pass in passes {
                module = run_pass(pass, module);
                verify(&module).map_err(|e| e.after(pass.name()).to_string())?;
            }
            Ok(print(&module))
        }
        TestKind::Error => match through_pipeline() {
            Ok(module) => Err(format!(
                "the case expects an error, but the graph lowered:\n{}",
                print(&module)
            )),
            Err(error) => Ok(error),
        },
    }
}

fn run_pass(pass: Pass, module: Module) -> Module {
    match pass {
        Pass::Fold => fold::fold_constants(module),
        Pass::Canonicalize => canonicalize::canonicalize(module),
        Pass::DeadCode => dead_code::dead_code(module),
        Pass::NarrowArithmetic => narrow_arithmetic::arithmetic_in_float32(module),
        Pass::ExactDivision => exact_division::exact_division(module),
        Pass::BoolConstants => bool_constants::bool_constants_as_bytes(module),
    }
}
