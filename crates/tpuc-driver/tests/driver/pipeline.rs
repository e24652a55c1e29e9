//! The driver's pipeline and the emitter: compiling again in a process reuses what was
//! compiled, `tpuc run` computes weight-derived values once, data parallelism in both sharding
//! dialects, GSPMD's spellings, kernels emitted in the plugin's layout.
use std::sync::Arc;

use crate::runner::Runner;
use libtest_mimic::{Failed, Trial};
use tpuc_driver::RunOptions;
use tpuc_driver::{
    EmitFormat, Hoist, LowerOptions, Options, Precision, ShardingDialect, Source, Target,
    TargetInfo,
};
use tpuc_hlo::ir::{
    ArgAttrs, Builder, DType, Mesh, MeshSharding, Module, OpKind, Sharding, TensorType,
};
use tpuc_pjrt::discover::PluginKind;

use crate::execution::{check_outputs, inputs_of};
use crate::lowering_dir;

fn options() -> Options {
    Options {
        hoist: Hoist::Weights,
        sizes: Some(Default::default()),
        ..Options::default()
    }
}

fn in_process_reuse() -> Result<(), Failed> {
    let target = Target::open(Some("cpu"), 1, &[])?;
    let dir = tempfile::tempdir()?;
    let case = dir.path().join("mlp.pt2");
    std::fs::copy(lowering_dir().join("mlp.pt2"), &case)?;
    let (first, reused) = target.compile(Source::File(&case), &options())?;
    if reused {
        return Err("the first compile cannot reuse anything".into());
    }
    let (again, reused) = target.compile(Source::File(&case), &options())?;
    if !reused || !Arc::ptr_eq(&first, &again) {
        return Err("the same program and options compile again".into());
    }
    let other = Options {
        lower: LowerOptions {
            precision: Precision::Default,
            ..LowerOptions::default()
        },
        ..options()
    };
    if target.compile(Source::File(&case), &other)?.1 {
        return Err("other options reuse the first executable".into());
    }
    // A file rewritten in place is another program.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&case)?
        .set_modified(later)?;
    if target.compile(Source::File(&case), &options())?.1 {
        return Err("a rewritten file reuses the old executable".into());
    }
    Ok(())
}

fn run_hoists_weight_derived_values() -> Result<(), Failed> {
    let case = lowering_dir().join("resnet_cnn_core.pt2");
    for hoist_weights in [true, false] {
        let options = RunOptions {
            hoist_weights,
            cache_dir: Some("off".into()),
            ..RunOptions::default()
        };
        let runner = Runner::new(&case, None, &options).map_err(|e| format!("{e:#}"))?;
        if runner.is_prepared() != hoist_weights {
            return Err(format!(
                "hoisting {hoist_weights}: prepared {}",
                runner.is_prepared()
            )
            .into());
        }
        let outputs = runner
            .run(inputs_of(&case)?)
            .map_err(|e| format!("{e:#}"))?;
        check_outputs(&outputs, &case)?;
    }
    Ok(())
}

fn emitted(case: &str, options: &Options, target: &TargetInfo) -> Result<String, Failed> {
    let path = lowering_dir().join(case);
    let e = tpuc_driver::emit(Source::File(&path), options, target, EmitFormat::Text)?;
    Ok(String::from_utf8(e.module)?)
}

fn data_parallel_in_both_dialects() -> Result<(), Failed> {
    let two = TargetInfo::new(PluginKind::Cpu, 2);
    for (dialect, present, absent) in [
        (
            ShardingDialect::Shardy,
            vec![
                "\"sdy.mesh\"() {mesh = #sdy.mesh<[\"dp\"=2]>, sym_name = \"mesh\"} : () -> ()",
                "sdy.sharding = #sdy.sharding<@mesh, [{\"dp\"}, {}]>",
                "sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>",
            ],
            "mhlo.sharding",
        ),
        (
            ShardingDialect::Gspmd,
            vec![
                "mhlo.sharding = \"{devices=[2,1]<=[2]}\"",
                "mhlo.sharding = \"{replicated}\"",
            ],
            "sdy.",
        ),
    ] {
        let options = Options {
            dialect,
            ..options()
        };
        let text = emitted("mlp.pt2", &options, &two)?;
        for needle in present {
            if !text.contains(needle) {
                return Err(format!("{dialect:?}: no `{needle}` in\n{text}").into());
            }
        }
        if text.contains(absent) {
            return Err(format!("{dialect:?} mixed with `{absent}`:\n{text}").into());
        }
        for case in ["mlp.pt2", "resnet_cnn_core.pt2"] {
            let case = lowering_dir().join(case);
            let run = RunOptions {
                devices: 2,
                dialect,
                ..RunOptions::default()
            };
            let runner = Runner::new(&case, None, &run).map_err(|e| format!("{e:#}"))?;
            let outputs = runner
                .run(inputs_of(&case)?)
                .map_err(|e| format!("{e:#}"))?;
            check_outputs(&outputs, &case).map_err(|e| format!("{dialect:?}: {e:?}"))?;
        }
    }
    Ok(())
}

fn gspmd_spellings() -> Result<(), Failed> {
    let two_by_two = Mesh {
        axes: ["dp", "tp"]
            .iter()
            .map(|n| tpuc_hlo::ir::MeshAxis {
                name: n.to_string(),
                size: 2,
            })
            .collect(),
    };
    let dims = |d: &[&[&str]]| Sharding {
        dims: d
            .iter()
            .map(|axes| axes.iter().map(|a| a.to_string()).collect())
            .collect(),
    };
    for (mesh, sharding, expected) in [
        (
            Mesh::line("dp", 2),
            dims(&[&["dp"], &[]]),
            "{devices=[2,1]<=[2]}",
        ),
        (Mesh::line("dp", 2), dims(&[&[], &[]]), "{replicated}"),
        (
            two_by_two.clone(),
            dims(&[&["dp"], &["tp"]]),
            "{devices=[2,2]<=[4]}",
        ),
        (
            two_by_two.clone(),
            dims(&[&["tp"], &["dp"]]),
            "{devices=[2,2]<=[2,2]T(1,0)}",
        ),
        (
            two_by_two.clone(),
            dims(&[&["tp"], &[]]),
            "{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}",
        ),
        (
            two_by_two,
            dims(&[&["dp", "tp"], &[]]),
            "{devices=[4,1]<=[4]}",
        ),
    ] {
        let got = tpuc_emit::gspmd_sharding(&mesh, &sharding);
        if got != expected {
            return Err(format!("{sharding:?}: {got}, expected {expected}").into());
        }
    }
    Ok(())
}

fn hoisted_kernels_take_the_plugins_layout() -> Result<(), Failed> {
    let case = lowering_dir().join("resnet_cnn_core.pt2");
    for (kind, kernel) in [
        (PluginKind::Cpu, "[b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1]"),
        (PluginKind::Other, "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]"),
    ] {
        let e = tpuc_driver::emit(
            Source::File(&case),
            &options(),
            &TargetInfo::new(kind, 1),
            EmitFormat::Text,
        )?;
        let text = String::from_utf8(e.module)?;
        if e.prepared.is_none() || !text.contains(kernel) {
            return Err(format!("{kind:?}: kernels not read as {kernel}:\n{text}").into());
        }
        let derived = e.signature.args.len() - e.signature.own_args();
        if derived != e.prepared.as_ref().unwrap().1.main.results().len() {
            return Err("the signature lists one derived argument per prepared value".into());
        }
    }
    Ok(())
}

/// A constraint on an intermediate value, in each dialect, as the plugin reads it.
fn sharding_constraints_compile() -> Result<(), Failed> {
    let path = tpuc_pjrt::discover::resolve(Some("cpu"))?;
    let plugin = tpuc_pjrt::Plugin::load(&path)?;
    let client = tpuc_pjrt::Client::new(
        &plugin,
        &tpuc_pjrt::ClientOptions {
            cpu_device_count: Some(2),
            ..Default::default()
        },
    )?;
    for dialect in [ShardingDialect::Shardy, ShardingDialect::Gspmd] {
        let mut b = Builder::new();
        let ty = TensorType::new(vec![4, 2], DType::F32);
        let x = b.arg(
            ty.clone(),
            ArgAttrs {
                sharding: Some(Sharding::split(2, 0, "dp")),
                ..ArgAttrs::default()
            },
        );
        let y = b.unary(tpuc_hlo::ir::UnaryOp::Exp, x)?;
        let z = b.op1(OpKind::ShardingConstraint(Sharding::replicated(2)), &[y])?;
        let module = Module {
            main: b.finish(
                vec![z],
                vec![ArgAttrs {
                    sharding: Some(Sharding::replicated(2)),
                    ..ArgAttrs::default()
                }],
            ),
            sharding: Some(MeshSharding {
                mesh: Mesh::line("dp", 2),
                dialect,
            }),
            manual: false,
        };
        tpuc_hlo::ir::verify(&module)?;
        let text = tpuc_emit::emit_text(&module)?;
        let constraint = match dialect {
            ShardingDialect::Shardy => "\"sdy.sharding_constraint\"",
            ShardingDialect::Gspmd => "call_target_name = \"Sharding\"",
        };
        if !text.contains(constraint) {
            return Err(format!("{dialect:?}: no {constraint} in\n{text}").into());
        }
        let partitioner = match dialect {
            ShardingDialect::Shardy => tpuc_pjrt::Partitioner::Shardy,
            ShardingDialect::Gspmd => tpuc_pjrt::Partitioner::Gspmd,
        };
        client
            .compile_mlir(
                text.as_bytes(),
                &tpuc_pjrt::CompileOptions::spmd(2, partitioner),
            )
            .map_err(|e| format!("{dialect:?}: {e}\n{text}"))?;
    }
    Ok(())
}

/// Each collective, over groups of two of four devices, in a module run per device: spelled as
/// the plugin reads it inside `sdy.manual_computation`; outside such a module, refused.
fn collectives_compile_per_device() -> Result<(), Failed> {
    use tpuc_hlo::ir::BinaryOp;
    let pairs = vec![vec![0, 1], vec![2, 3]];
    let mut b = Builder::new();
    let x = b.arg(TensorType::new(vec![4, 2], DType::F32), ArgAttrs::default());
    let kinds = [
        OpKind::AllReduce {
            op: BinaryOp::Max,
            groups: pairs.clone(),
        },
        OpKind::AllGather {
            dim: 1,
            groups: pairs.clone(),
        },
        OpKind::ReduceScatter {
            dim: 0,
            op: BinaryOp::Add,
            groups: pairs.clone(),
        },
        OpKind::AllToAll {
            split_dim: 0,
            concat_dim: 1,
            groups: pairs,
        },
    ];
    let results = kinds
        .into_iter()
        .map(|kind| b.op1(kind, &[x]))
        .collect::<Result<Vec<_>, _>>()?;
    let rank_program = Module::new(b.finish(results, vec![]));
    match tpuc_emit::emit_text(&rank_program) {
        Err(e) if e.to_string().contains("does not run per device") => {}
        other => return Err(format!("a collective outside a manual module: {other:?}").into()),
    }
    let module = tpuc_hlo::passes::sharding::per_device(rank_program, &Mesh::line("ranks", 4))?;
    tpuc_hlo::ir::verify(&module)?;
    let text = tpuc_emit::emit_text(&module)?;
    for needle in [
        "\"sdy.manual_computation\"",
        "manual_axes = #sdy<manual_axes{\"ranks\"}>",
        "replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>",
        "channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>",
        "split_count = 2 : i64",
    ] {
        if !text.contains(needle) {
            return Err(format!("no {needle} in\n{text}").into());
        }
    }
    let path = tpuc_pjrt::discover::resolve(Some("cpu"))?;
    let plugin = tpuc_pjrt::Plugin::load(&path)?;
    let client = tpuc_pjrt::Client::new(
        &plugin,
        &tpuc_pjrt::ClientOptions {
            cpu_device_count: Some(4),
            ..Default::default()
        },
    )?;
    client
        .compile_mlir(
            text.as_bytes(),
            &tpuc_pjrt::CompileOptions::spmd(4, tpuc_pjrt::Partitioner::Shardy),
        )
        .map_err(|e| format!("{e}\n{text}"))?;
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test("pipeline::in_process_reuse", in_process_reuse),
        Trial::test(
            "pipeline::run_hoists_weight_derived_values",
            run_hoists_weight_derived_values,
        ),
        Trial::test(
            "pipeline::data_parallel_in_both_dialects",
            data_parallel_in_both_dialects,
        ),
        Trial::test("emit::gspmd_spellings", gspmd_spellings),
        Trial::test(
            "emit::hoisted_kernels_take_the_plugins_layout",
            hoisted_kernels_take_the_plugins_layout,
        ),
        Trial::test(
            "emit::sharding_constraints_compile",
            sharding_constraints_compile,
        ),
        Trial::test(
            "emit::collectives_compile_per_device",
            collectives_compile_per_device,
        ),
    ]
}
