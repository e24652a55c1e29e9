//! No arithmetic in a narrow float type reaches the plugin: every op computing a 16-bit (or 8-bit)
//! float from others of its type is computed in float32 and its result rounded to the narrow
//! type, which is what torch's CPU kernels compute, step for step.
//!
//! Left narrow, the steps are the backend's to choose: XLA may keep a fusion's steps in float32
//! (its excess-precision rewrites), compute them with the host's float16 instructions (on CPUs
//! with AVX512-FP16 its results then differ from every other CPU's by a 16-bit ulp where a
//! product feeds a sum) or with its own float16 approximations of functions. Written as float32
//! steps between explicit roundings, no HLO pass has a narrow step left to choose for; for +, -,
//! *, / and sqrt the float32 result rounded once equals the narrow op's (float32 carries more
//! than twice the narrow significand plus two bits), so the rewrite changes no value where the
//! backend already rounded every step. (LLVM turns such a single step back into a 16-bit
//! instruction where that is exact, which is why the CPU plugin is also kept off float16
//! instructions: `tpuc_pjrt`'s plugin flags.)
//!
//! Exact ops stay narrow (negation, absolute value, sign, rounding to integers, min/max,
//! comparisons, selections, data movement), as do `next_after` (it steps through the narrow
//! type's own values) and reductions, scatters and collectives, whose bodies combine two values
//! with one exact-rounded op. A legalisation for the plugin, so among the last passes.

use crate::ir::{BinaryOp, DType, Module, Op, OpKind, Rewriter, UnaryOp, Value};

pub fn arithmetic_in_float32(mut module: Module) -> Module {
    let f = &module.main;
    if !f.ops().iter().any(|op| computed_narrow(f, op)) {
        return module;
    }
    let mut r = Rewriter::new(f);
    for op in f.ops() {
        if !computed_narrow(f, op) {
            r.copy(op).expect("an op of a valid function is valid");
            continue;
        }
        r.at(op);
        let result = op.results()[0];
        let narrow = f.ty(result).elem;
        let operands: Vec<Value> = op.operands().iter().map(|&o| r.value(o)).collect();
        let b = r.builder();
        let wide: Vec<Value> = operands
            .iter()
            .map(|&o| b.convert(o, narrow.accumulation()))
            .collect();
        let computed = b
            .op1(op.kind().clone(), &wide)
            .expect("an op of narrow floats computes in float32 alike");
        let rounded = b.convert(computed, narrow);
        r.bind(result, rounded)
            .expect("rounded back to the result's type");
    }
    module.main = r.finish();
    module
}

/// Whether `op` computes a narrow float (one whose accumulation type is wider) by arithmetic
/// whose rounding the backend could choose.
fn computed_narrow(f: &crate::ir::Func, op: &Op) -> bool {
    let [result] = op.results() else {
        return false;
    };
    let elem: DType = f.ty(*result).elem;
    if !elem.is_float() || elem.accumulation() == elem {
        return false;
    }
    match op.kind() {
        OpKind::Unary(u) => !matches!(
            u,
            UnaryOp::Abs
                | UnaryOp::Neg
                | UnaryOp::Sign
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::RoundEven
                | UnaryOp::RoundAwayFromZero
                | UnaryOp::Not
        ),
        OpKind::Binary(b) => matches!(
            b,
            BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Rem
                | BinaryOp::Pow
                | BinaryOp::Atan2
        ),
        OpKind::DotGeneral { .. } | OpKind::Convolution(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, Builder, TensorType};

    /// The op names (with their result types) of a module's ops.
    fn ops(m: &Module) -> Vec<String> {
        m.main
            .ops()
            .iter()
            .map(|op| format!("{} {}", op.kind().name(), m.main.ty(op.results()[0])))
            .collect()
    }

    #[test]
    fn a_product_and_the_sum_reading_it_are_computed_wide_and_each_rounded() {
        for narrow in [DType::F16, DType::BF16] {
            let mut b = Builder::new();
            let ty = TensorType::new(vec![4], narrow);
            let x = b.arg(ty.clone(), ArgAttrs::default());
            let y = b.arg(ty.clone(), ArgAttrs::default());
            let product = b.binary(BinaryOp::Mul, x, y).unwrap();
            let sum = b.binary(BinaryOp::Sub, product, x).unwrap();
            let m = arithmetic_in_float32(Module::new(b.finish(vec![sum], vec![])));
            crate::ir::verify(&m).unwrap();
            let n = crate::ir::element_spelling(narrow);
            assert_eq!(
                ops(&m),
                [
                    "stablehlo.convert tensor<4xf32>".to_string(),
                    "stablehlo.convert tensor<4xf32>".into(),
                    "stablehlo.multiply tensor<4xf32>".into(),
                    format!("stablehlo.convert tensor<4x{n}>"),
                    // The product, rounded, is read back wide: the rounding stays explicit.
                    "stablehlo.convert tensor<4xf32>".into(),
                    "stablehlo.convert tensor<4xf32>".into(),
                    "stablehlo.subtract tensor<4xf32>".into(),
                    format!("stablehlo.convert tensor<4x{n}>"),
                ]
            );
            assert_eq!(m.main.ty(m.main.results()[0]).elem, narrow);
        }
    }

    #[test]
    fn functions_matrix_products_and_convolutions_are_computed_wide() {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![2, 3], DType::F16), ArgAttrs::default());
        let e = b.unary(UnaryOp::Exp, x).unwrap();
        let dims = crate::ir::DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contracting: vec![1],
            rhs_contracting: vec![1],
        };
        let d = b
            .dot_general(e, x, dims, crate::ir::Precision::Highest)
            .unwrap();
        let m = arithmetic_in_float32(Module::new(b.finish(vec![d], vec![])));
        crate::ir::verify(&m).unwrap();
        let names = ops(&m);
        assert!(
            names.contains(&"stablehlo.exponential tensor<2x3xf32>".to_string())
                && names.contains(&"stablehlo.dot_general tensor<2x2xf32>".to_string())
                && names.last().unwrap() == "stablehlo.convert tensor<2x2xf16>",
            "{names:?}"
        );
    }

    #[test]
    fn exact_ops_wide_types_and_bit_steps_are_left_alone() {
        let mut b = Builder::new();
        let h = b.arg(TensorType::new(vec![4], DType::BF16), ArgAttrs::default());
        let f = b.arg(TensorType::new(vec![4], DType::F32), ArgAttrs::default());
        let i = b.arg(TensorType::new(vec![4], DType::I32), ArgAttrs::default());
        let negated = b.unary(UnaryOp::Neg, h).unwrap();
        let larger = b.binary(BinaryOp::Max, negated, h).unwrap();
        let floor = b.unary(UnaryOp::Floor, larger).unwrap();
        let next = b.binary(BinaryOp::NextAfter, floor, h).unwrap();
        let wide = b.binary(BinaryOp::Mul, f, f).unwrap();
        let ints = b.binary(BinaryOp::Mul, i, i).unwrap();
        let before = Module::new(b.finish(vec![next, wide, ints], vec![]));
        let after = arithmetic_in_float32(before.clone());
        assert_eq!(crate::ir::print(&after), crate::ir::print(&before));
    }
}
