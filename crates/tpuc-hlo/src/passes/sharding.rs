//! Sharding: lays a module out over a device mesh for XLA's SPMD partitioner, as a plan decided
//! (`crate::plan`): every argument gets its sharding, results are whole on every device. tpuc
//! never writes collectives here: XLA partitions the computation and communicates.

use crate::ir::{ArgAttrs, Mesh, MeshSharding, Module, Sharding, ShardingDialect};

/// How to lay a module out over devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardingRequest {
    pub mesh: Mesh,
    pub dialect: ShardingDialect,
    /// One sharding per argument; arguments beyond them (values hoisting derived from the
    /// weights) are whole on every device.
    pub args: Vec<Sharding>,
}

/// `module` annotated as `request` says: every argument and result gets a sharding, the module
/// the mesh.
pub fn annotate(mut module: Module, request: &ShardingRequest) -> Module {
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
            },
        );
    }
    for (i, &r) in f.results().to_vec().iter().enumerate() {
        let rank = f.ty(r).rank();
        f.set_result_attrs(
            i,
            ArgAttrs {
                sharding: Some(Sharding::replicated(rank)),
            },
        );
    }
    module
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, BinaryOp, Builder, DType, TensorType};

    #[test]
    fn arguments_take_their_shardings_results_are_whole() {
        let mut b = Builder::new();
        let w = b.arg(TensorType::new(vec![8], DType::F32), ArgAttrs::default());
        let x = b.arg(TensorType::new(vec![4, 8], DType::F32), ArgAttrs::default());
        let wide = b.broadcast_to(w, &[4, 8]).unwrap();
        let y = b.binary(BinaryOp::Add, x, wide).unwrap();
        let request = ShardingRequest {
            mesh: Mesh::line("dp", 2),
            dialect: ShardingDialect::Shardy,
            args: vec![Sharding::replicated(1), Sharding::split(2, 0, "dp")],
        };
        let m = annotate(Module::new(b.finish(vec![y], vec![])), &request);
        crate::ir::verify(&m).unwrap();
        let text = crate::ir::print(&m);
        assert!(text.starts_with("mesh [dp=2] (shardy)\n"), "{text}");
        assert!(
            text.contains(
                "%0: tensor<8xf32> sharding [{}], %1: tensor<4x8xf32> sharding [{dp}, {}]"
            ),
            "{text}"
        );
        assert!(text.contains("return %3 sharding [{}, {}]"), "{text}");

        // A batch the devices do not divide is refused by the verifier.
        let odd = ShardingRequest {
            mesh: Mesh::line("dp", 3),
            args: vec![Sharding::split(2, 0, "dp")],
            ..request
        };
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4, 8], DType::F32), ArgAttrs::default());
        let m = annotate(Module::new(b.finish(vec![x], vec![])), &odd);
        let e = crate::ir::verify(&m).unwrap_err();
        assert!(e.to_string().contains("does not split into 3"), "{e}");
    }
}
