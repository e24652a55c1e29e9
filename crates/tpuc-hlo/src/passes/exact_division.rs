//! Exact divisions by constants: XLA's simplifier rewrites `x / c` for a constant `c` into
//! `x * (1 / c)`, which rounds differently from the division torch computes (`x / 100.0`
//! differs from torch in about a quarter of the elements). Each float constant a division
//! reads (directly or through broadcasts, reshapes and conversions) goes through an
//! optimisation barrier, which hides its value from that rewrite; the broadcast still fuses.
//! A legalisation for the plugin, so among the last passes.

use std::collections::HashSet;

use crate::ir::{BinaryOp, Literal, Module, OpKind, Rewriter, TensorType};

pub fn exact_division(mut module: Module) -> Module {
    let f = &module.main;
    let defining = f.defining_ops();
    let ops = f.ops();
    // The constants some float division divides by.
    let mut divisors = HashSet::new();
    for op in ops {
        if op.kind() != &OpKind::Binary(BinaryOp::Div) || !f.ty(op.results()[0]).elem.is_float() {
            continue;
        }
        let mut value = op.operands()[1];
        while let Some(i) = defining[value.index()] {
            match ops[i].kind() {
                OpKind::Constant(_) => {
                    divisors.insert(i);
                    break;
                }
                OpKind::BroadcastInDim { .. } | OpKind::Reshape { .. } | OpKind::Convert { .. } => {
                    value = ops[i].operands()[0];
                }
                _ => break,
            }
        }
    }
    if divisors.is_empty() {
        return module;
    }
    let mut r = Rewriter::new(f);
    for (i, op) in ops.iter().enumerate() {
        let OpKind::Constant(lit) = op.kind() else {
            r.copy(op).expect("an op of a valid function is valid");
            continue;
        };
        if !divisors.contains(&i) {
            r.copy(op).expect("an op of a valid function is valid");
            continue;
        }
        // A splat is hidden as its one element, then broadcast: XLA keeps a broadcast inside
        // the division's loop, where a barrier over the whole tensor would be an array in memory.
        r.at(op);
        let b = r.builder();
        let element = Literal {
            ty: TensorType::new(vec![], lit.ty.elem),
            bytes: lit.bytes.clone(),
            splat: false,
        };
        let source = if lit.splat { element } else { lit.clone() };
        let constant = b.constant(source).expect("a constant");
        let hidden = b
            .op1(OpKind::OptimizationBarrier, &[constant])
            .expect("a barrier takes any tensor");
        let hidden = b
            .broadcast_in_dim(hidden, &lit.ty.shape, &[])
            .expect("a scalar broadcasts to any shape");
        r.bind(op.results()[0], hidden)
            .expect("the broadcast has the constant's type");
    }
    module.main = r.finish();
    module
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, Builder, DType};

    #[test]
    fn float_divisions_by_constants_divide_by_a_hidden_constant() {
        let mut b = Builder::new();
        let ty = TensorType::new(vec![4], DType::F32);
        let x = b.arg(ty.clone(), ArgAttrs::default());
        let hundred = b.scalar(DType::F32, 100.0);
        let divisor = b.broadcast_in_dim(hundred, &[4], &[]).unwrap();
        let q = b.binary(BinaryOp::Div, x, divisor).unwrap();
        let p = b.binary(BinaryOp::Mul, x, divisor).unwrap();
        let m = exact_division(Module::new(b.finish(vec![q, p], vec![])));
        crate::ir::verify(&m).unwrap();
        let text = crate::ir::print(&m);
        let barrier = text
            .find("stablehlo.optimization_barrier")
            .expect("a barrier");
        let broadcast = text.find("stablehlo.broadcast_in_dim").unwrap();
        assert!(
            barrier < broadcast,
            "the scalar is hidden before its broadcast:\n{text}"
        );
        assert_eq!(text.matches("optimization_barrier").count(), 1, "{text}");
    }

    #[test]
    fn a_splat_divisor_is_hidden_as_one_element() {
        let mut b = Builder::new();
        let ty = TensorType::new(vec![8, 8], DType::F32);
        let x = b.arg(ty.clone(), ArgAttrs::default());
        let three = b.splat(&ty, 3.0);
        let q = b.binary(BinaryOp::Div, x, three).unwrap();
        let m = exact_division(Module::new(b.finish(vec![q], vec![])));
        crate::ir::verify(&m).unwrap();
        let text = crate::ir::print(&m);
        assert!(
            text.contains("stablehlo.optimization_barrier %1 : tensor<f32>")
                && text.contains("stablehlo.broadcast_in_dim"),
            "{text}"
        );
    }

    #[test]
    fn divisions_by_computed_values_and_integer_divisions_are_left_alone() {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4], DType::F32), ArgAttrs::default());
        let i = b.arg(TensorType::new(vec![4], DType::I32), ArgAttrs::default());
        let q = b.binary(BinaryOp::Div, x, x).unwrap();
        let seven = b.splat(&TensorType::new(vec![4], DType::I32), 7.0);
        let d = b.binary(BinaryOp::Div, i, seven).unwrap();
        let m = exact_division(Module::new(b.finish(vec![q, d], vec![])));
        assert!(!crate::ir::print(&m).contains("optimization_barrier"));
    }
}
