//! Sharding: lays a module out over a device mesh for XLA's SPMD partitioner, as a plan decided
//! (`crate::plan`): every argument and result gets its sharding (whole on every device unless
//! the plan splits it). tpuc never writes collectives here: XLA partitions the computation and communicates. A program
//! that communicates itself (one rank's, with collectives) instead runs per device
//! ([`per_device`]).

use crate::ir::{
    ArgAttrs, BuildResult, Mesh, MeshSharding, Module, OpKind, Rewriter, Sharding, ShardingDialect,
};

/// How to lay a module out over devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardingRequest {
    pub mesh: Mesh,
    pub dialect: ShardingDialect,
    /// One sharding per argument; arguments beyond them (values hoisting derived from the
    /// weights) are whole on every device.
    pub args: Vec<Sharding>,
    /// One sharding per result, None for one left to XLA's partitioner (it lays the result out
    /// as what computes it leaves it); results beyond them are whole on every device.
    pub results: Vec<Option<Sharding>>,
    /// Per argument, the layout its uses see where that differs from its own (a weight the plan
    /// `fsdp` gathers at use): a sharding constraint right after the argument.
    pub at_use: Vec<Option<Sharding>>,
}

/// `module` annotated as `request` says: every argument and result gets a sharding, the module
/// the mesh; arguments used in another layout than their own are constrained to it.
pub fn annotate(module: Module, request: &ShardingRequest) -> BuildResult<Module> {
    let mut module = constrain_at_use(module, &request.at_use)?;
    module.sharding = Some(MeshSharding {
        mesh: request.mesh.clone(),
        dialect: request.dialect,
    });
    let f = &mut module.main;
    for (i, &arg) in f.args().to_vec().iter().enumerate() {
        let sharding = request
            .args
            .get(i)
            .cloned()
            .unwrap_or_else(|| Sharding::replicated(f.ty(arg).rank()));
        f.set_arg_attrs(
            i,
            ArgAttrs {
                sharding: Some(sharding),
                ..ArgAttrs::default()
            },
        );
    }
    for (i, &r) in f.results().to_vec().iter().enumerate() {
        let sharding = match request.results.get(i) {
            Some(given) => given.clone(),
            None => Some(Sharding::replicated(f.ty(r).rank())),
        };
        f.set_result_attrs(
            i,
            ArgAttrs {
                sharding,
                ..ArgAttrs::default()
            },
        );
    }
    Ok(module)
}

/// `module` with each argument that `at_use` gives a layout constrained to it before any use.
fn constrain_at_use(module: Module, at_use: &[Option<Sharding>]) -> BuildResult<Module> {
    if at_use.iter().all(Option::is_none) {
        return Ok(module);
    }
    let old = &module.main;
    let mut layouts = at_use.iter();
    let mut rw = Rewriter::with_args(old, |b, ty, attrs| {
        let arg = b.arg(ty.clone(), attrs.clone());
        match layouts.next().cloned().flatten() {
            Some(layout) => b.op1(OpKind::ShardingConstraint(layout), &[arg]),
            None => Ok(arg),
        }
    })?;
    for op in old.ops() {
        rw.copy(op)?;
    }
    Ok(Module {
        main: rw.finish(),
        ..module
    })
}

/// `module`, one device's program (a rank's of a torch.distributed program, its collectives
/// among the devices), made the body of a module run on every device of `mesh`, each on its own
/// arguments: every argument gains a leading dimension of one, split over all the mesh's axes,
/// so callers pass the devices' values stacked (device d's at index d, devices numbered
/// row-major); every result gains the same leading dimension, each device holding its own part,
/// so callers receive the devices' results stacked.
pub fn per_device(module: Module, mesh: &Mesh) -> BuildResult<Module> {
    let axes: Vec<String> = mesh.axes.iter().map(|a| a.name.clone()).collect();
    let stacked = |rank: usize| {
        let mut s = Sharding::replicated(rank + 1);
        s.dims[0] = axes.clone();
        ArgAttrs {
            sharding: Some(s),
            ..ArgAttrs::default()
        }
    };
    let old = &module.main;
    let mut rw = Rewriter::with_args(old, |b, ty, _| {
        let one = b.arg(
            ty.with_shape(with_leading_one(&ty.shape)),
            stacked(ty.rank()),
        );
        b.reshape(one, &ty.shape)
    })?;
    for op in old.ops() {
        rw.copy(op)?;
    }
    // Each device's result, its part of the stacked result the caller assembles.
    let mut results = Vec::new();
    let mut attrs = Vec::new();
    for &r in old.results() {
        let value = rw.value(r);
        let shape = rw.builder().shape(value).to_vec();
        results.push(rw.builder().reshape(value, &with_leading_one(&shape))?);
        attrs.push(stacked(shape.len()));
    }
    Ok(Module {
        main: rw.finish_returning(results, attrs),
        sharding: Some(MeshSharding {
            mesh: mesh.clone(),
            dialect: ShardingDialect::Shardy,
        }),
        manual: true,
    })
}

fn with_leading_one(shape: &[i64]) -> Vec<i64> {
    std::iter::once(1).chain(shape.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, BinaryOp, Builder, DType, TensorType};

    #[test]
    fn arguments_and_results_take_their_shardings() {
        let mut b = Builder::new();
        let w = b.arg(TensorType::new(vec![8], DType::F32), ArgAttrs::default());
        let x = b.arg(TensorType::new(vec![4, 8], DType::F32), ArgAttrs::default());
        let wide = b.broadcast_to(w, &[4, 8]).unwrap();
        let y = b.binary(BinaryOp::Add, x, wide).unwrap();
        let request = ShardingRequest {
            mesh: Mesh::line("dp", 2),
            dialect: ShardingDialect::Shardy,
            args: vec![Sharding::replicated(1), Sharding::split(2, 0, "dp")],
            results: vec![],
            at_use: vec![],
        };
        let m = annotate(Module::new(b.finish(vec![y, y], vec![])), &request).unwrap();
        crate::ir::verify(&m).unwrap();
        let text = crate::ir::print(&m);
        assert!(text.starts_with("mesh [dp=2] (shardy)\n"), "{text}");
        assert!(
            text.contains(
                "%0: tensor<8xf32> sharding [{}], %1: tensor<4x8xf32> sharding [{dp}, {}]"
            ),
            "{text}"
        );
        // Results are whole unless the request splits them.
        assert!(
            text.contains("return %3 sharding [{}, {}], %3 sharding [{}, {}]"),
            "{text}"
        );
        let split = ShardingRequest {
            args: vec![],
            results: vec![
                Some(Sharding::replicated(2)),
                Some(Sharding::split(2, 1, "dp")),
            ],
            ..request.clone()
        };
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4, 8], DType::F32), ArgAttrs::default());
        let m = annotate(Module::new(b.finish(vec![x, x], vec![])), &split).unwrap();
        crate::ir::verify(&m).unwrap();
        let text = crate::ir::print(&m);
        assert!(
            text.contains("sharding [{}, {}], %0 sharding [{}, {dp}]"),
            "{text}"
        );

        // A result left to the partitioner has no sharding; the others are whole.
        let open = ShardingRequest {
            args: vec![],
            results: vec![None],
            ..request.clone()
        };
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4, 8], DType::F32), ArgAttrs::default());
        let m = annotate(Module::new(b.finish(vec![x, x], vec![])), &open).unwrap();
        crate::ir::verify(&m).unwrap();
        assert_eq!(m.main.result_attrs()[0].sharding, None);
        assert_eq!(
            m.main.result_attrs()[1].sharding,
            Some(Sharding::replicated(2))
        );

        // A batch the devices do not divide is padded across them: the verifier accepts it.
        let odd = ShardingRequest {
            mesh: Mesh::line("dp", 3),
            args: vec![Sharding::split(2, 0, "dp")],
            ..request
        };
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4, 8], DType::F32), ArgAttrs::default());
        let m = annotate(Module::new(b.finish(vec![x], vec![])), &odd).unwrap();
        crate::ir::verify(&m).unwrap();
    }

    #[test]
    fn arguments_used_in_another_layout_are_constrained_first() {
        let mut b = Builder::new();
        let w = b.arg(TensorType::new(vec![8, 4], DType::F32), ArgAttrs::default());
        let x = b.arg(TensorType::new(vec![2, 8], DType::F32), ArgAttrs::default());
        let dims = crate::ir::DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contracting: vec![1],
            rhs_contracting: vec![0],
        };
        let y = b
            .dot_general(x, w, dims, crate::ir::Precision::Default)
            .unwrap();
        let request = ShardingRequest {
            mesh: Mesh::line("fsdp", 2),
            dialect: ShardingDialect::Shardy,
            args: vec![Sharding::split(2, 0, "fsdp"), Sharding::split(2, 0, "fsdp")],
            results: vec![],
            at_use: vec![Some(Sharding::replicated(2)), None],
        };
        let m = annotate(Module::new(b.finish(vec![y], vec![])), &request).unwrap();
        crate::ir::verify(&m).unwrap();
        let text = crate::ir::print(&m);
        // The weight is stored split and used whole; the batch is used as it comes.
        assert!(
            text.contains("%0: tensor<8x4xf32> sharding [{fsdp}, {}]"),
            "{text}"
        );
        assert!(
            text.contains("%1 = sdy.sharding_constraint %0 sharding=[{}, {}]"),
            "{text}"
        );
        assert!(text.contains("dot_general %2, %1"), "{text}");
        assert_eq!(text.matches("sharding_constraint").count(), 1, "{text}");
    }

    #[test]
    fn a_per_device_module_takes_and_returns_the_devices_values_stacked() {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![3], DType::F32), ArgAttrs::default());
        let total = b.reduce_by(x, &[0], BinaryOp::Add).unwrap();
        let m = per_device(
            Module::new(b.finish(vec![total], vec![])),
            &Mesh::line("ranks", 4),
        )
        .unwrap();
        crate::ir::verify(&m).unwrap();
        assert!(m.manual);
        assert_eq!(m.main.arg_types()[0].shape, vec![1, 3]);
        assert_eq!(m.outer_arg_types()[0].shape, vec![4, 3]);
        // The scalar result: each device's, its part of the stacked result.
        assert_eq!(m.main.result_types()[0].shape, vec![1]);
        assert_eq!(m.outer_result_types()[0].shape, vec![4]);
        let text = crate::ir::print(&m);
        assert!(text.contains("sharding [{ranks}, {}]"), "{text}");
        assert!(text.contains("sharding [{ranks}]"), "{text}");
        assert!(!text.contains("stablehlo.all_gather"), "{text}");
    }
}
