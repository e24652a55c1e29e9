//! Dead code: ops whose results nothing uses are removed (the function's arguments stay).

use crate::ir::Module;

pub fn dead_code(mut module: Module) -> Module {
    let f = &mut module.main;
    let mut live = vec![false; f.value_count()];
    for r in f.results() {
        live[r.index()] = true;
    }
    let mut keep = vec![false; f.ops().len()];
    for (index, op) in f.ops().iter().enumerate().rev() {
        if op.results().iter().any(|r| live[r.index()]) {
            keep[index] = true;
            for o in op.operands() {
                live[o.index()] = true;
            }
        }
    }
    f.retain_ops(&keep)
        .expect("only ops nothing reads are removed");
    module
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, BinaryOp, Builder, DType, TensorType, UnaryOp};

    #[test]
    fn unused_ops_go_and_used_ones_stay() {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![3], DType::F32), ArgAttrs::default());
        let unused = b.unary(UnaryOp::Exp, x).unwrap();
        let _also_unused = b.binary(BinaryOp::Add, unused, x).unwrap();
        let used = b.unary(UnaryOp::Neg, x).unwrap();
        let y = b.binary(BinaryOp::Mul, used, x).unwrap();
        let f = dead_code(Module::new(b.finish(vec![y], vec![]))).main;
        let names: Vec<&str> = f.ops().iter().map(|op| op.kind().name()).collect();
        assert_eq!(names, ["stablehlo.negate", "stablehlo.multiply"]);
        assert_eq!(f.args().len(), 1);
        crate::ir::verify(&Module::new(f)).unwrap();
    }
}
