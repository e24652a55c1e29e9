//! Execution on the XLA CPU plugin: every golden module compiles there, every case matches
//! torch's eager outputs through `tpuc run`'s code path, and `tpuc run` handles bad input.
use std::path::{Path, PathBuf};

use crate::runner::Runner;
use libtest_mimic::{Failed, Trial};
use tpuc_driver::RunOptions;
use tpuc_driver::{EmitFormat, LowerOptions, ShardingDialect};
use tpuc_npy::read_npz;
use tpuc_pjrt::{Client, ClientOptions, CompileOptions, DType, HostTensor, Plugin};

use crate::lowering_dir;

/// Tolerance of the numerics checks: f32 within rtol/atol 1e-5, integers and bools exactly.
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-5;

fn cpu_client() -> Result<Client, Failed> {
    let path = tpuc_pjrt::discover::resolve(Some("cpu")).map_err(|e| e.to_string())?;
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    Ok(Client::new(&plugin, &ClientOptions::default()).map_err(|e| e.to_string())?)
}

/// The golden module, exactly as committed, compiles on the plugin.
fn golden_module_compiles(case: PathBuf) -> Result<(), Failed> {
    let module = std::fs::read(case.with_extension("mlir"))?;
    let exe = cpu_client()?
        .compile_mlir(&module, &CompileOptions::single_device())
        .map_err(|e| format!("{}: {e}", case.display()))?;
    if exe.num_outputs() == 0 {
        return Err("the module has no outputs".into());
    }
    Ok(())
}

pub fn inputs_of(case: &Path) -> Result<Vec<HostTensor>, Failed> {
    Ok(read_npz(&case.with_extension("inputs.npz")).map_err(|e| format!("{e:#}"))?)
}

pub fn check_outputs(outputs: &[HostTensor], case: &Path) -> Result<(), Failed> {
    let expected = read_npz(&case.with_extension("expected.npz")).map_err(|e| format!("{e:#}"))?;
    Ok(compare_all(outputs, &expected)?)
}

/// Every output within the tolerance of torch's.
pub fn compare_all(outputs: &[HostTensor], expected: &[HostTensor]) -> Result<(), String> {
    tpuc_npy::compare::compare_all(outputs, expected, RTOL, ATOL).map_err(|e| format!("{e:#}"))
}

fn run_case(case: &Path, devices: usize) -> Result<(), Failed> {
    run_case_with(case, devices, ShardingDialect::Shardy)
}

fn run_case_with(case: &Path, devices: usize, dialect: ShardingDialect) -> Result<(), Failed> {
    let options = RunOptions {
        devices,
        dialect,
        ..RunOptions::default()
    };
    let runner = Runner::new(case, None, &options).map_err(|e| format!("{e:#}"))?;
    let outputs = runner.run(inputs_of(case)?).map_err(|e| format!("{e:#}"))?;
    check_outputs(&outputs, case)
}

/// A module from `tpuc compile` runs with the archive's weights and gives the same results.
fn compiled_module_with_weights() -> Result<(), Failed> {
    let case = lowering_dir().join("resnet_cnn.pt2");
    let dir = tempfile::tempdir()?;
    for format in [EmitFormat::Text, EmitFormat::Bytecode] {
        let compiled = crate::emit_file(&case, None, &LowerOptions::default(), format)
            .map_err(|e| format!("{e:#}"))?;
        let module = dir.path().join("resnet.mlir");
        std::fs::write(&module, &compiled.module)?;
        let runner = Runner::new(&module, Some(&case), &RunOptions::default())
            .map_err(|e| format!("{e:#}"))?;
        let outputs = runner
            .run(inputs_of(&case)?)
            .map_err(|e| format!("{e:#}"))?;
        check_outputs(&outputs, &case)?;
    }
    Ok(())
}

pub fn expect_err<T>(result: anyhow::Result<T>, needles: &[&str]) -> Result<(), Failed> {
    match result {
        Ok(_) => Err(format!("expected an error mentioning {needles:?}").into()),
        Err(e) => {
            let message = format!("{e:#}");
            match needles.iter().find(|n| !message.contains(*n)) {
                Some(missing) => Err(format!("error lacks `{missing}`: {message}").into()),
                None => Ok(()),
            }
        }
    }
}

/// Wrong input count, dtype or shape is refused before anything runs, naming the input.
fn bad_inputs() -> Result<(), Failed> {
    let case = lowering_dir().join("indexing.pt2");
    let runner = Runner::new(&case, None, &RunOptions::default()).map_err(|e| format!("{e:#}"))?;
    let good = inputs_of(&case)?;
    expect_err(
        runner.run(good[..1].to_vec()),
        &["takes 2 input(s)", "1 given", "int64 [3]"],
    )?;
    let as_i32 = HostTensor::from_slice(DType::I32, &[3], &[4i32, 0, 2])?;
    expect_err(
        runner.run(vec![good[0].clone(), as_i32]),
        &["input 1", "must be int64 [3]", "int32 [3] was given"],
    )?;
    let wrong_shape = HostTensor::zeros(DType::F32, &[4, 5])?;
    expect_err(
        runner.run(vec![wrong_shape, good[1].clone()]),
        &["input 0", "must be float32 [5, 4]", "[4, 5]"],
    )?;
    // float32 is accepted for bfloat16 inputs; here the input is float32, so f64 is refused.
    let f64s = HostTensor::zeros(DType::F64, &[5, 4])?;
    expect_err(
        runner.run(vec![f64s, good[1].clone()]),
        &["must be float32"],
    )?;
    Ok(())
}

fn bad_models() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let module = dir.path().join("model.mlir");
    std::fs::write(&module, "module {}")?;
    let opts = RunOptions::default();
    expect_err(
        Runner::new(&module, None, &opts),
        &["model.mlir", "--weights"],
    )?;
    let case = lowering_dir().join("llama_block.pt2");
    expect_err(
        Runner::new(&case, Some(&case), &opts),
        &["carries its own weights"],
    )?;
    let missing_plugin = RunOptions {
        plugin: Some("/nonexistent/libpjrt_none.so".into()),
        ..RunOptions::default()
    };
    expect_err(
        Runner::new(&case, None, &missing_plugin),
        &["/nonexistent/libpjrt_none.so"],
    )?;
    // A compiled module cannot be partitioned: tpuc annotates shardings when it compiles.
    let two = RunOptions {
        devices: 2,
        ..RunOptions::default()
    };
    expect_err(
        Runner::new(&module, Some(&case), &two),
        &["2 devices need a .pt2 or .fx model"],
    )?;
    // A module the plugin cannot compile: the error names the file and the plugin's reason.
    std::fs::write(&module, "module { func.func @main( }")?;
    expect_err(
        Runner::new(&module, Some(&case), &opts),
        &["model.mlir", "PJRT_Client_Compile"],
    )?;
    Ok(())
}

pub fn trials(cases: &[PathBuf]) -> Vec<Trial> {
    let mut trials = Vec::new();
    for case in cases {
        let stem = case.file_stem().unwrap().to_string_lossy().into_owned();
        let module_case = case.clone();
        trials.push(Trial::test(format!("plugin_compiles::{stem}"), move || {
            golden_module_compiles(module_case)
        }));
        let run = case.clone();
        trials.push(Trial::test(format!("numerics::{stem}"), move || {
            run_case(&run, 1)
        }));
    }
    for stem in ["llama_block", "resnet_cnn_core"] {
        let case = lowering_dir().join(format!("{stem}.pt2"));
        let uneven = case.clone();
        trials.push(Trial::test(
            format!("numerics::data_parallel::{stem}"),
            move || run_case(&case, 2),
        ));
        // A batch of 2 over 3 devices: padded across them, the true shape returned.
        for (name, dialect) in [
            ("shardy", ShardingDialect::Shardy),
            ("gspmd", ShardingDialect::Gspmd),
        ] {
            let case = uneven.clone();
            trials.push(Trial::test(
                format!("numerics::uneven_batch::{name}::{stem}"),
                move || run_case_with(&case, 3, dialect),
            ));
        }
    }
    trials.extend([
        Trial::test(
            "run::compiled_module_with_weights",
            compiled_module_with_weights,
        ),
        Trial::test("run::bad_inputs", bad_inputs),
        Trial::test("run::bad_models", bad_models),
    ]);
    trials
}
