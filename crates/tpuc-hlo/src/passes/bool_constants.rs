//! Boolean constants as bytes: each boolean constant that is not a splat becomes bytes compared
//! with zero, which XLA folds back into a boolean constant. The CPU plugin refuses a boolean
//! constant of more than 100 elements ("Failed to parse using StableHLO v1.16.1"): MLIR writes
//! such constants in its hex form, whose layout for i1 differs between our MLIR and the
//! plugin's. A legalisation for the plugin, so the last pass.

use crate::ir::{CompareDir, DType, Literal, Module, OpKind, Rewriter};

pub fn bool_constants_as_bytes(mut module: Module) -> Module {
    let f = &module.main;
    let needed = f.ops().iter().any(
        |op| matches!(op.kind(), OpKind::Constant(lit) if lit.ty.elem == DType::Bool && !lit.splat),
    );
    if !needed {
        return module;
    }
    let mut r = Rewriter::new(f);
    for op in f.ops() {
        match op.kind() {
            OpKind::Constant(lit) if lit.ty.elem == DType::Bool && !lit.splat => {
                r.at(op);
                let b = r.builder();
                let ty = lit.ty.with_elem(DType::U8);
                let bytes = b
                    .constant(Literal {
                        ty: ty.clone(),
                        bytes: lit.bytes.clone(),
                        splat: false,
                    })
                    .expect("one byte per boolean");
                let zero = b.splat(&ty, 0.0);
                let set = b
                    .compare(CompareDir::Ne, bytes, zero)
                    .expect("bytes compare with bytes");
                r.bind(op.results()[0], set)
                    .expect("the comparison is boolean");
            }
            _ => r.copy(op).expect("an op of a valid function is valid"),
        }
    }
    module.main = r.finish();
    module
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, Builder, TensorType};

    #[test]
    fn boolean_constants_become_bytes_compared_with_zero() {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![3], DType::F32), ArgAttrs::default());
        let mask = b
            .constant(Literal {
                ty: TensorType::new(vec![3], DType::Bool),
                bytes: vec![1, 0, 1].into(),
                splat: false,
            })
            .unwrap();
        let zero = b.splat(&TensorType::new(vec![3], DType::F32), 0.0);
        let y = b.select(mask, x, zero).unwrap();
        let m = bool_constants_as_bytes(Module::new(b.finish(vec![y], vec![])));
        crate::ir::verify(&m).unwrap();
        let text = crate::ir::print(&m);
        assert!(
            text.contains("stablehlo.constant elements=3 : tensor<3xui8>")
                && text.contains("stablehlo.compare %1, %2 dir=NE type=UNSIGNED : tensor<3xi1>"),
            "{text}"
        );
    }
}
