//! User kernels (`tpuc_fx::kernels`) through the whole back end: a program whose custom op a
//! kernel computes, written as a `.fx` file, compiled and run on the XLA CPU plugin as `tpuc
//! run` runs it; kernels that cannot join the module refused by name.
use std::path::{Path, PathBuf};

use libtest_mimic::{Failed, Trial};
use tpuc_driver::{EmitFormat, LowerOptions, RunOptions};
use tpuc_fx::fxfile::{write_fx, WeightStorage};
use tpuc_fx::kernels::{Kernel, KernelTensor};
use tpuc_fx::DType;
use tpuc_pjrt::HostTensor;

use crate::runner::Runner;

/// `y = mylib.twice(x)` and its double: two calls of one kernel.
const GRAPH: &str = "input x: float32[4]
y: float32[4] = mylib.twice.default(x=x)
z: float32[4] = mylib.twice.default(x=y)
output z";

/// A kernel module as JAX writes one (generic form): `main` calls a private helper, whose
/// name the splice must rename with its use.
fn twice_module(ty: &str) -> String {
    format!(
        r#""builtin.module"() <{{sym_name = "jit_twice"}}> ({{
  "func.func"() <{{function_type = ({ty}) -> {ty}, sym_name = "main", sym_visibility = "public"}}> ({{
  ^bb0(%arg0: {ty}):
    %0 = "func.call"(%arg0) <{{callee = @helper}}> : ({ty}) -> {ty}
    "func.return"(%0) : ({ty}) -> ()
  }}) : () -> ()
  "func.func"() <{{function_type = ({ty}) -> {ty}, sym_name = "helper", sym_visibility = "private"}}> ({{
  ^bb0(%arg0: {ty}):
    %0 = "stablehlo.add"(%arg0, %arg0) : ({ty}, {ty}) -> {ty}
    "func.return"(%0) : ({ty}) -> ()
  }}) : () -> ()
}}) : () -> ()
"#
    )
}

fn kernel(mlir: String, version: &str) -> Kernel {
    let vector = KernelTensor {
        dtype: DType::F32,
        shape: vec![4],
    };
    Kernel {
        op: "mylib.twice.default".into(),
        inputs: vec![vector.clone()],
        outputs: vec![vector],
        operands: vec![0],
        mlir,
        stablehlo_version: version.into(),
    }
}

/// The program of [`GRAPH`] with `kernel`, written to `dir`.
fn program_file(dir: &Path, name: &str, kernel: Kernel) -> Result<PathBuf, Failed> {
    let lines: Vec<(usize, &str)> = GRAPH.lines().enumerate().collect();
    let program = tpuc_filetests::graph_text::parse_program(&lines)
        .map_err(|e| e.to_string())?
        .with_kernels(vec![kernel])
        .map_err(|(at, what)| format!("{at}: {what}"))?;
    let path = dir.join(format!("{name}.fx"));
    write_fx(&program, &path, WeightStorage::Inline).map_err(|e| e.to_string())?;
    Ok(path)
}

fn a_kernel_called_twice_runs_as_one_private_function() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let path = program_file(
        dir.path(),
        "twice",
        kernel(twice_module("tensor<4xf32>"), "1.0.0"),
    )?;
    let emitted = crate::emit_file(&path, None, &LowerOptions::default(), EmitFormat::Text)?;
    let text = String::from_utf8(emitted.module.clone())?;
    // One copy of the kernel's functions, renamed after its op, however many calls.
    for (needle, count) in [
        ("func.func private @mylib_twice_default(", 1),
        ("func.func private @mylib_twice_default__helper(", 1),
        ("call @mylib_twice_default(", 2),
        ("call @mylib_twice_default__helper(", 1),
        ("@helper", 0),
    ] {
        if text.matches(needle).count() != count {
            return Err(format!("{needle} not {count} times in\n{text}").into());
        }
    }
    let runner = Runner::new(&path, None, &RunOptions::default())?;
    let x = HostTensor::from_slice(DType::F32, &[4], &[1.0f32, -2.0, 0.5, 3.0])?;
    let out: Vec<f32> = runner.run(vec![x])?[0].to_vec()?;
    if out != [4.0, -8.0, 2.0, 12.0] {
        return Err(format!("got {out:?}").into());
    }
    Ok(())
}

fn kernels_that_cannot_join_the_module_are_named() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let ops = "\"builtin.module\"() ({\n  \"sdy.mesh\"() <{sym_name = \"mesh\"}> : () -> ()\n}) : () -> ()";
    for (name, mlir, needles) in [
        (
            "garbage",
            "this is not MLIR".to_string(),
            vec!["the kernel of mylib.twice.default", "does not parse"],
        ),
        (
            "pretty",
            "module { func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { %0 = stablehlo.add %x, %x : tensor<4xf32>\n return %0 : tensor<4xf32> } }".to_string(),
            vec!["does not parse", "generic form"],
        ),
        (
            "other_shapes",
            twice_module("tensor<8xf32>"),
            vec![
                "its main is (tensor<8xf32>) -> tensor<8xf32>",
                "the op needs (tensor<4xf32>) -> tensor<4xf32>",
            ],
        ),
        (
            "not_functions",
            ops.to_string(),
            vec!["holds a sdy.mesh", "functions only"],
        ),
    ] {
        let path = program_file(dir.path(), name, kernel(mlir, "1.0.0"))?;
        let message = match crate::emit_file(&path, None, &LowerOptions::default(), EmitFormat::Text) {
            Ok(_) => return Err(format!("{name}: compiled").into()),
            Err(e) => format!("{e:#}"),
        };
        for needle in needles {
            if !message.contains(needle) {
                return Err(format!("{name}: {needle:?} not in {message}").into());
            }
        }
    }
    // A kernel written for a StableHLO newer than the plugin reads is refused before compiling.
    let path = program_file(
        dir.path(),
        "future",
        kernel(twice_module("tensor<4xf32>"), "99.0.0"),
    )?;
    let message = match Runner::new(&path, None, &RunOptions::default()) {
        Ok(_) => return Err("a kernel for StableHLO 99 ran".into()),
        Err(e) => format!("{e:#}"),
    };
    for needle in [
        "serialized for StableHLO 99.0.0",
        "newer than the plugin reads",
        "save_kernels",
    ] {
        if !message.contains(needle) {
            return Err(format!("{needle:?} not in {message}").into());
        }
    }
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test(
            "kernels::a_kernel_called_twice_runs_as_one_private_function",
            a_kernel_called_twice_runs_as_one_private_function,
        ),
        Trial::test(
            "kernels::kernels_that_cannot_join_the_module_are_named",
            kernels_that_cannot_join_the_module_are_named,
        ),
    ]
}
