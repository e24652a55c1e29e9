//! Sharding: lays a module out over a device mesh for XLA's SPMD partitioner. tpuc never
//! writes collectives here: it annotates arguments and results, and XLA partitions the
//! computation and communicates.
//!
//! Today's plan is data parallelism: the arguments marked as batched (a model's user inputs)
//! are split along their first dimension over the mesh's one axis, everything else (weights,
//! values derived from them, the random seed, results) is whole on every device.

use crate::ir::{ArgAttrs, Mesh, MeshSharding, Module, Sharding, ShardingDialect};

/// The axis data parallelism splits batches over.
pub const DATA_AXIS: &str = "dp";

/// How to lay a module out over devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardingRequest {
    pub devices: i64,
    pub dialect: ShardingDialect,
    /// One flag per argument (missing ones are false): split along the first dimension.
    pub batched: Vec<bool>,
}

/// `module` annotated for data parallelism as `request` says (every argument and result gets a
/// sharding; the module gets the mesh).
pub fn data_parallel(mut module: Module, request: &ShardingRequest) -> Module {
    module.sharding = Some(MeshSharding {
        mesh: Mesh::line(DATA_AXIS, request.devices),
        dialect: request.dialect,
    });
    let f = &mut module.main;
    for (i, &arg) in f.args().to_vec().iter().enumerate() {
        let rank = f.ty(arg).rank();
        let split = request.batched.get(i).copied().unwrap_or(false) && rank > 0;
        let sharding = if split {
            Sharding::split(rank, 0, DATA_AXIS)
        } else {
            Sharding::replicated(rank)
        };
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
    fn batched_arguments_split_the_rest_whole() {
        let mut b = Builder::new();
        let w = b.arg(TensorType::new(vec![8], DType::F32), ArgAttrs::default());
        let x = b.arg(TensorType::new(vec![4, 8], DType::F32), ArgAttrs::default());
        let wide = b.broadcast_to(w, &[4, 8]).unwrap();
        let y = b.binary(BinaryOp::Add, x, wide).unwrap();
        let request = ShardingRequest {
            devices: 2,
            dialect: ShardingDialect::Shardy,
            batched: vec![false, true],
        };
        let m = data_parallel(Module::new(b.finish(vec![y], vec![])), &request);
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
            devices: 3,
            batched: vec![true],
            ..request
        };
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4, 8], DType::F32), ArgAttrs::default());
        let m = data_parallel(Module::new(b.finish(vec![x], vec![])), &odd);
        let e = crate::ir::verify(&m).unwrap_err();
        assert!(e.to_string().contains("does not split into 3"), "{e}");
    }
}
