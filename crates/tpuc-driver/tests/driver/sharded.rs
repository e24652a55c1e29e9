//! Programs laid out over device meshes: golden annotations per plan (each case an options file
//! beside its expected module in testdata/lowering/sharded), the same results as torch on 2, 4
//! and 8 CPU devices, the weights' memory per device under fsdp, the collectives each plan
//! brings into XLA's optimized program, and plans that do not fit refused by name.
use std::path::{Path, PathBuf};

use crate::runner::Runner;
use libtest_mimic::{Failed, Trial};
use tpuc_driver::RunOptions;
use tpuc_driver::{EmitFormat, Mesh, Options, Plan, ShardingDialect};

use crate::execution::{check_outputs, expect_err, inputs_of};
use crate::lowering_dir;

fn sharded_dir() -> PathBuf {
    lowering_dir().join("sharded")
}

/// A golden case: `<name>.options` holds `input = ...`, `mesh = ...`, `plan = ...` (a ready plan
/// or a plan file beside it) and optionally `partitioner = gspmd`.
struct Case {
    name: String,
    input: PathBuf,
    mesh: Mesh,
    plan: Plan,
    dialect: ShardingDialect,
}

fn read_case(path: &Path) -> Result<Case, Failed> {
    let text = std::fs::read_to_string(path)?;
    let mut fields = std::collections::HashMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once(" = ")
            .ok_or_else(|| format!("{}: `{line}` is not `key = value`", path.display()))?;
        fields.insert(key.to_string(), value.to_string());
    }
    let field = |key: &str| {
        fields
            .get(key)
            .cloned()
            .ok_or_else(|| format!("{}: no `{key} = ...`", path.display()))
    };
    let dir = path.parent().expect("a case lives in a directory");
    let plan = field("plan")?;
    let plan = if plan.ends_with(".json") {
        dir.join(plan).display().to_string()
    } else {
        plan
    };
    let (mesh, plan) = tpuc_driver::layout::parse(Some(&field("mesh")?), Some(&plan))
        .map_err(|e| format!("{e:#}"))?
        .expect("a mesh and a plan were given");
    let dialect = match fields.get("partitioner").map(String::as_str) {
        None | Some("shardy") => ShardingDialect::Shardy,
        Some("gspmd") => ShardingDialect::Gspmd,
        Some(other) => return Err(format!("unknown partitioner {other}").into()),
    };
    let name = path.file_name().unwrap().to_string_lossy();
    Ok(Case {
        name: name.trim_end_matches(".options").to_string(),
        input: dir.join(field("input")?),
        mesh,
        plan,
        dialect,
    })
}

fn golden(path: PathBuf) -> Result<(), Failed> {
    let case = read_case(&path)?;
    let options = Options {
        mesh: Some((case.mesh, case.plan)),
        dialect: case.dialect,
        ..Options::default()
    };
    let emitted = tpuc_driver::emit_file(&case.input, &options, EmitFormat::Text)
        .map_err(|e| format!("{e:#}"))?;
    let actual = String::from_utf8(emitted.module)?;
    Ok(tpuc_filetests::golden::compare(
        &sharded_dir().join(format!("{}.mlir", case.name)),
        &actual,
    )?)
}

fn run_options(mesh: Mesh, plan: Plan, dialect: ShardingDialect) -> RunOptions {
    RunOptions {
        mesh: Some((mesh, plan)),
        dialect,
        cache_dir: Some("off".into()),
        ..RunOptions::default()
    }
}

/// The case's module runs over its mesh and gives torch's results.
fn numerics(path: PathBuf) -> Result<(), Failed> {
    let case = read_case(&path)?;
    let runner = Runner::new(
        &case.input,
        None,
        &run_options(case.mesh, case.plan, case.dialect),
    )
    .map_err(|e| format!("{e:#}"))?;
    let outputs = runner
        .run(inputs_of(&case.input)?)
        .map_err(|e| format!("{e:#}"))?;
    check_outputs(&outputs, &case.input)
}

/// Every plan on 4 and 8 devices, for models whose batch and sizes allow it.
fn plans_on_more_devices() -> Result<(), Failed> {
    let llama = lowering_dir().join("llama_block.pt2");
    let mlp = lowering_dir().join("mlp.pt2");
    let cases = [
        (&mlp, "dp=4", "dp"),
        (&mlp, "fsdp=4", "fsdp"),
        (&mlp, "tp=4", "tp"),
        (&mlp, "dp=2,fsdp=2,tp=2", "dp,fsdp,tp"),
        (&llama, "tp=4", "tp"),
        (&llama, "fsdp=2,tp=4", "fsdp,tp"),
        (&llama, "dp=2,tp=2", "dp,tp"),
    ];
    for (model, mesh, plan) in cases {
        let options = run_options(
            mesh.parse().map_err(|e: String| e)?,
            plan.parse().map_err(|e: String| e)?,
            ShardingDialect::Shardy,
        );
        let runner = Runner::new(model, None, &options).map_err(|e| format!("{e:#}"))?;
        let outputs = runner
            .run(inputs_of(model)?)
            .map_err(|e| format!("{e:#}"))?;
        check_outputs(&outputs, model).map_err(|e| format!("{mesh} {plan}: {e:?}"))?;
    }
    Ok(())
}

/// Under fsdp each device holds about 1/N of the weights (within 10%).
fn fsdp_divides_the_weights() -> Result<(), Failed> {
    let llama = lowering_dir().join("llama_block_batch8.pt2");
    let (whole, whole_arguments) = {
        let runner =
            Runner::new(&llama, None, &RunOptions::default()).map_err(|e| format!("{e:#}"))?;
        (
            runner.weight_bytes_per_device()?[0],
            runner.compiled_memory()?.arguments,
        )
    };
    for n in [2, 4, 8] {
        let mesh: Mesh = format!("fsdp={n}").parse()?;
        let options = run_options(mesh, "fsdp".parse()?, ShardingDialect::Shardy);
        let runner = Runner::new(&llama, None, &options).map_err(|e| format!("{e:#}"))?;
        // XLA's own account of one device's arguments (weights and the batch, all split)
        // drops alike.
        let arguments = runner.compiled_memory()?.arguments as f64;
        let expected = whole_arguments as f64 / n as f64;
        if (arguments - expected).abs() > 0.1 * expected {
            return Err(format!(
                "fsdp={n}: the compiled program takes {arguments} bytes of arguments per \
                 device, not about {expected} ({whole_arguments} on one device)"
            )
            .into());
        }
        let per_device = runner.weight_bytes_per_device()?;
        let ideal = whole as f64 / n as f64;
        for (d, &bytes) in per_device.iter().enumerate() {
            if (bytes as f64 - ideal).abs() > 0.1 * ideal {
                return Err(format!(
                    "fsdp={n}: device {d} holds {bytes} bytes of weights, not about {ideal} \
                     ({whole} in all)"
                )
                .into());
            }
        }
    }
    Ok(())
}

/// The collectives of XLA's optimized program for `plan` over `mesh`, counted by kind, from the
/// HLO text XLA dumps (`--xla_dump_to`), as `tpuc run` compiles it.
fn plans_that_do_not_fit_are_refused() -> Result<(), Failed> {
    let llama = lowering_dir().join("llama_block.pt2");
    let options = |mesh: &str, plan: &str| -> Result<RunOptions, Failed> {
        Ok(run_options(
            mesh.parse()?,
            plan.parse()?,
            ShardingDialect::Shardy,
        ))
    };
    expect_err(
        Runner::new(&llama, None, &options("dp=2", "tp")?),
        &["the plan tp works over a mesh axis named tp, but the mesh has dp"],
    )?;
    expect_err(
        Runner::new(&llama, None, &options("tp=8", "tp")?),
        &["has 4 query heads, which the tp axis of 8 does not divide"],
    )?;
    // A target whose devices are not the mesh's.
    let target = tpuc_driver::Target::open(Some("cpu"), 2, &[])?;
    let four = Options {
        mesh: Some(("fsdp=4".parse()?, "fsdp".parse()?)),
        ..Options::default()
    };
    match target.compile(tpuc_driver::Source::File(&llama), &four) {
        Err(e)
            if e.to_string()
                .contains("the mesh fsdp=4 has 4 devices, but the target has 2") => {}
        Err(e) => return Err(format!("unexpected error: {e}").into()),
        Ok(_) => return Err("a mesh of 4 devices compiled for 2".into()),
    }
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(sharded_dir())
        .expect("testdata/lowering/sharded exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".options"))
        .collect();
    cases.sort();
    let mut trials = Vec::new();
    for case in cases {
        let name = case
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".options")
            .to_string();
        let run = case.clone();
        trials.push(Trial::test(format!("sharded::golden::{name}"), move || {
            golden(case)
        }));
        trials.push(Trial::test(
            format!("sharded::numerics::{name}"),
            move || numerics(run),
        ));
    }
    trials.extend([
        Trial::test("sharded::plans_on_more_devices", plans_on_more_devices),
        Trial::test(
            "sharded::fsdp_divides_the_weights",
            fsdp_divides_the_weights,
        ),
        Trial::test(
            "sharded::plans_that_do_not_fit_are_refused",
            plans_that_do_not_fit_are_refused,
        ),
    ]);
    trials
}
