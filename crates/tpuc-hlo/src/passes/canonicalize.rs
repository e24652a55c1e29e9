//! Canonical forms of data movement: a transpose of a transpose becomes one transpose (or
//! nothing, when the two cancel), a reshape of a reshape one reshape, and a view or conversion
//! that changes nothing disappears. The lowering composes views op by op (two poolings in a row
//! transpose to channels-last and back twice); XLA would fold these too, the module is smaller
//! and easier to read without them. Ops are rewritten in place; what they no longer need is
//! left for dead code.

use crate::ir::{Module, OpKind, Value};

pub fn canonicalize(mut module: Module) -> Module {
    let f = &mut module.main;
    // What each value is replaced by (None: itself).
    let mut replaced: Vec<Option<Value>> = vec![None; f.value_count()];
    let defined_by = f.defining_ops();
    for index in 0..f.ops().len() {
        let op = &f.ops()[index];
        let mut operands: Vec<Value> = op
            .operands()
            .iter()
            .map(|&o| replaced[o.index()].unwrap_or(o))
            .collect();
        let mut kind = op.kind().clone();
        if let (Some(&x), Some(result)) = (operands.first(), op.result()) {
            let inner = defined_by[x.index()]
                .map(|i| &f.ops()[i])
                .and_then(|s| Some((s.kind(), *s.operands().first()?)));
            match (&kind, inner) {
                (OpKind::Transpose { perm }, Some((OpKind::Transpose { perm: inner }, y))) => {
                    let perm = perm.iter().map(|&d| inner[d as usize]).collect();
                    kind = OpKind::Transpose { perm };
                    operands = vec![y];
                }
                (OpKind::Reshape { .. }, Some((OpKind::Reshape { .. }, y))) => {
                    operands = vec![y];
                }
                _ => {}
            }
            if kind.is_noop_view(f.ty(operands[0]), f.ty(result)) {
                replaced[result.index()] = Some(operands[0]);
            }
        }
        let op = &f.ops()[index];
        if kind != *op.kind() || operands != op.operands() {
            f.replace_op(index, kind, operands)
                .expect("a canonical form has the type of the view it replaces");
        }
    }
    let results = f
        .results()
        .iter()
        .map(|&r| replaced[r.index()].unwrap_or(r))
        .collect();
    f.set_results(results)
        .expect("replacements have the types of the values they replace");
    module
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, Builder, DType, TensorType};
    use crate::passes::dead_code::dead_code;

    #[test]
    fn view_chains_become_one_op_or_none() {
        let mut b = Builder::new();
        let x = b.arg(
            TensorType::new(vec![2, 3, 4], DType::F32),
            ArgAttrs::default(),
        );
        // Two transposes that cancel, two that compose, two reshapes, a no-op conversion.
        let t1 = b.transpose(x, &[0, 2, 1]).unwrap();
        let back = b.transpose(t1, &[0, 2, 1]).unwrap();
        let t2 = b.transpose(x, &[1, 0, 2]).unwrap();
        let composed = b.transpose(t2, &[2, 0, 1]).unwrap();
        let r1 = b.reshape(x, &[6, 4]).unwrap();
        let r2 = b.reshape(r1, &[24]).unwrap();
        let same = b.convert(back, DType::F32);
        let module = Module::new(b.finish(vec![same, composed, r2], vec![]));
        let f = dead_code(canonicalize(module)).main;
        // The cancelling pair and the conversion are gone: the argument itself is returned.
        assert_eq!(f.results()[0], f.args()[0]);
        assert_eq!(f.ops().len(), 2);
        assert_eq!(f.ops()[0].operands(), &[f.args()[0]]);
        assert_eq!(
            f.ops()[0].kind(),
            &OpKind::Transpose {
                perm: vec![2, 1, 0]
            }
        );
        assert_eq!(f.ty(f.results()[1]).shape, vec![4, 3, 2]);
        assert_eq!(f.ops()[1].operands(), &[f.args()[0]]);
        assert_eq!(f.ops()[1].kind(), &OpKind::Reshape { shape: vec![24] });
        assert_eq!(f.ty(f.results()[2]).shape, vec![24]);
        crate::ir::verify(&Module::new(f)).unwrap();
    }
}
