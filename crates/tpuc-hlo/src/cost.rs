//! What a module computes and moves, counted from its IR before XLA sees it: floating-point
//! operations (a product's multiply-adds as two, one per element of an elementwise op or a
//! reduction's input), transcendental functions, and bytes read and written. An estimate by
//! design: the bytes assume every op reads its operands from memory and writes its result
//! (XLA's fusion keeps many in registers, so its own count after fusion is lower), and a loop's
//! body is counted once (its trip count is the program's to decide).

use crate::ir::{BinaryOp, Func, Module, OpKind, UnaryOp};

/// The counts of one module (or function), as [`count`] makes them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    pub flops: f64,
    /// Of `flops`, those of products (dot_general and convolution).
    pub product_flops: f64,
    pub transcendentals: f64,
    pub bytes: f64,
    /// Loops whose body was counted once.
    pub loops: usize,
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, other: Cost) {
        self.flops += other.flops;
        self.product_flops += other.product_flops;
        self.transcendentals += other.transcendentals;
        self.bytes += other.bytes;
        self.loops += other.loops;
    }
}

/// The counts of `module`'s main function, the functions it calls counted at each call.
pub fn count(module: &Module) -> Cost {
    count_func(&module.main)
}

fn count_func(f: &Func) -> Cost {
    let mut cost = Cost::default();
    for op in f.ops() {
        let elements = |v: &crate::ir::Value| f.ty(*v).numel() as f64;
        let bytes = |v: &crate::ir::Value| {
            let t = f.ty(*v);
            t.numel() as f64 * t.elem.byte_size() as f64
        };
        let results: f64 = op.results().iter().map(elements).sum();
        let nested = match op.kind() {
            // What a call or a named pattern computes is its function's.
            OpKind::Call { callee, .. } => Some(count_func(callee.func())),
            OpKind::Composite { decomposition, .. } => Some(count_func(decomposition.func())),
            OpKind::While { cond, body } => {
                let mut c = count_func(cond.func());
                c += count_func(body.func());
                c.loops += 1;
                Some(c)
            }
            OpKind::Case { branches } => {
                // One branch runs: the costliest.
                let mut most = Cost::default();
                for b in branches {
                    let c = count_func(b.func());
                    if c.flops >= most.flops {
                        most = c;
                    }
                }
                Some(most)
            }
            _ => None,
        };
        if let Some(c) = nested {
            cost += c;
            continue;
        }
        let moves_data = !matches!(
            op.kind(),
            OpKind::Constant(_)
                | OpKind::Iota { .. }
                | OpKind::Reshape { .. }
                | OpKind::ShardingConstraint(_)
        );
        if moves_data {
            cost.bytes += op.operands().iter().map(bytes).sum::<f64>()
                + op.results().iter().map(bytes).sum::<f64>();
        }
        match op.kind() {
            OpKind::DotGeneral { dims, .. } => {
                let lhs = f.ty(op.operands()[0]);
                let depth: i64 = dims
                    .lhs_contracting
                    .iter()
                    .map(|&d| lhs.shape[d as usize])
                    .product();
                cost.flops += 2.0 * results * depth as f64;
                cost.product_flops += 2.0 * results * depth as f64;
            }
            OpKind::Convolution(conv) => {
                let kernel = f.ty(op.operands()[1]);
                let (_, per_group, spatial) = conv.kernel.split(&kernel.shape);
                let window: i64 = spatial.iter().product();
                cost.flops += 2.0 * results * (per_group * window) as f64;
                cost.product_flops += 2.0 * results * (per_group * window) as f64;
            }
            OpKind::Unary(u) if transcendental(*u) => cost.transcendentals += results,
            OpKind::Binary(BinaryOp::Pow | BinaryOp::Atan2) => cost.transcendentals += results,
            OpKind::Unary(_)
            | OpKind::Binary(_)
            | OpKind::Compare { .. }
            | OpKind::Select
            | OpKind::Clamp => cost.flops += results,
            OpKind::Reduce { .. } | OpKind::ReduceWindow { .. } => {
                let inputs = op.operands().len() / 2;
                cost.flops += op.operands()[..inputs].iter().map(elements).sum::<f64>();
            }
            _ => {}
        }
    }
    cost
}

fn transcendental(u: UnaryOp) -> bool {
    !matches!(
        u,
        UnaryOp::Abs
            | UnaryOp::Neg
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::RoundEven
            | UnaryOp::RoundAwayFromZero
            | UnaryOp::Sign
            | UnaryOp::Not
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, Builder, DType, DotDims, TensorType};

    fn f32s(shape: &[i64]) -> TensorType {
        TensorType::new(shape.to_vec(), DType::F32)
    }

    #[test]
    fn products_count_two_flops_per_multiply_add_and_elementwise_ops_one() {
        let mut b = Builder::new();
        let x = b.arg(f32s(&[4, 8]), ArgAttrs::default());
        let w = b.arg(f32s(&[8, 16]), ArgAttrs::default());
        let dims = DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contracting: vec![1],
            rhs_contracting: vec![0],
        };
        let y = b.dot_general(x, w, dims, Default::default()).unwrap();
        let e = b.unary(UnaryOp::Exp, y).unwrap();
        let s = b.binary(BinaryOp::Add, e, y).unwrap();
        let total = b.reduce_by(s, &[1], BinaryOp::Add).unwrap();
        let cost = count(&Module::new(b.finish(vec![total], vec![])));
        // 2*4*16*8 for the product, 64 for the add, 64 for the sum's inputs.
        assert_eq!(cost.flops, 1024.0 + 64.0 + 64.0);
        assert_eq!(cost.product_flops, 1024.0);
        assert_eq!(cost.transcendentals, 64.0);
        // The product reads 32+128 floats and writes 64; the exp 64+64; the add 3*64; the sum
        // 64 + its initial value + 4.
        assert_eq!(cost.bytes, 4.0 * (224.0 + 128.0 + 192.0 + 64.0 + 1.0 + 4.0));
        assert_eq!(cost.loops, 0);
    }

    #[test]
    fn a_function_called_twice_counts_twice() {
        let mut inner = Builder::new();
        let a = inner.arg(f32s(&[10]), ArgAttrs::default());
        let n = inner.unary(UnaryOp::Neg, a).unwrap();
        let callee = inner.finish(vec![n], vec![]);
        let mut b = Builder::new();
        let x = b.arg(f32s(&[10]), ArgAttrs::default());
        let region = crate::ir::Region::new(callee);
        let once = b.call("neg", region.clone(), &[x]).unwrap();
        let twice = b.call("neg", region, &once).unwrap();
        let cost = count(&Module::new(b.finish(twice, vec![])));
        assert_eq!(cost.flops, 20.0);
    }
}
