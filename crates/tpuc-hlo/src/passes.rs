//! Passes over the StableHLO IR.

use crate::ir::{CompareDir, Literal, Module, Op, OpKind, Value};
use crate::types::ElemType;

/// Removes ops whose results nothing uses (the function's arguments always stay).
pub fn dead_code(mut module: Module) -> Module {
    let f = &mut module.main;
    let mut live = vec![false; f.value_count()];
    for r in &f.results {
        live[r.index()] = true;
    }
    let mut kept: Vec<Op> = Vec::with_capacity(f.ops.len());
    for op in f.ops.drain(..).rev() {
        if op.results.iter().any(|r| live[r.index()]) {
            for o in &op.operands {
                live[o.index()] = true;
            }
            kept.push(op);
        }
    }
    kept.reverse();
    f.ops = kept;
    module
}

/// Rewrites each boolean constant that is not a splat as bytes compared with zero, which XLA
/// folds back into a boolean constant. The CPU plugin refuses a boolean constant of more than
/// 100 elements ("Failed to parse using StableHLO v1.16.1"): MLIR writes such constants in its
/// hex form, whose layout for i1 differs between our MLIR and the plugin's.
pub fn bool_constants_as_bytes(mut module: Module) -> Module {
    let f = &mut module.main;
    let mut ops = Vec::with_capacity(f.ops.len());
    for op in std::mem::take(&mut f.ops) {
        let OpKind::Constant(lit) = &op.kind else {
            ops.push(op);
            continue;
        };
        if lit.ty.elem != ElemType::I1 || lit.splat {
            ops.push(op);
            continue;
        }
        let ty = lit.ty.with_elem(ElemType::U8);
        let constant = |lit, result| Op {
            kind: OpKind::Constant(lit),
            operands: vec![],
            results: vec![result],
            loc: op.loc.clone(),
        };
        let (bytes, zero) = (f.add_value(ty.clone()), f.add_value(ty.clone()));
        ops.push(constant(
            Literal {
                ty: ty.clone(),
                bytes: lit.bytes.clone(),
                splat: false,
            },
            bytes,
        ));
        ops.push(constant(
            Literal {
                ty,
                bytes: vec![0u8].into(),
                splat: true,
            },
            zero,
        ));
        ops.push(Op {
            kind: OpKind::Compare {
                dir: CompareDir::Ne,
                cmp: ElemType::U8.comparison_type(),
            },
            operands: vec![bytes, zero],
            results: op.results,
            loc: op.loc,
        });
    }
    f.ops = ops;
    module
}

/// Canonical forms of data movement: a transpose of a transpose becomes one transpose (or
/// nothing, when the two cancel), a reshape of a reshape one reshape, and a reshape, transpose
/// or conversion that changes nothing disappears. The lowering composes views op by op (two
/// poolings in a row transpose to channels-last and back twice); XLA would fold these too, the
/// module is smaller and easier to read without them.
pub fn canonicalize(mut module: Module) -> Module {
    let f = &mut module.main;
    // What each value is replaced by; ops are rewritten in place, so definitions stay put.
    let mut replaced: Vec<Value> = (0..f.value_count() as u32).map(Value).collect();
    let defined_by = f.defining_ops();
    for index in 0..f.ops.len() {
        for o in &mut f.ops[index].operands {
            *o = replaced[o.index()];
        }
        let op = &f.ops[index];
        if let [result] = op.results[..] {
            let operand = op.operands.first().copied();
            let source = operand
                .and_then(|o| defined_by[o.index()])
                .map(|i| &f.ops[i]);
            let inner = source.and_then(|s| Some((&s.kind, *s.operands.first()?)));
            let rewritten = match (&op.kind, inner) {
                (OpKind::Transpose { perm }, Some((OpKind::Transpose { perm: inner }, x))) => {
                    let perm: Vec<i64> = perm.iter().map(|&d| inner[d as usize]).collect();
                    Some((OpKind::Transpose { perm }, x))
                }
                (OpKind::Reshape, Some((OpKind::Reshape, x))) => Some((OpKind::Reshape, x)),
                _ => None,
            };
            if let Some((kind, x)) = rewritten {
                let op = &mut f.ops[index];
                op.kind = kind;
                op.operands = vec![x];
            }
            let op = &f.ops[index];
            let unchanged = match &op.kind {
                OpKind::Transpose { perm } => perm.iter().enumerate().all(|(i, &d)| d == i as i64),
                OpKind::Reshape | OpKind::Convert => true,
                _ => false,
            } && f.ty(op.operands[0]) == f.ty(result);
            if unchanged {
                replaced[result.index()] = op.operands[0];
            }
        }
    }
    for r in &mut f.results {
        *r = replaced[r.index()];
    }
    module
}

/// The cleanup pipeline run after lowering: constants folded, view chains in canonical form,
/// what no longer has a use removed, boolean constants made readable for the plugin.
pub fn cleanup(mut module: Module) -> Module {
    crate::fold::fold_constants(&mut module.main);
    bool_constants_as_bytes(dead_code(canonicalize(module)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::Builder;
    use crate::ir::ArgAttrs;
    use crate::types::{ElemType, TensorType};

    #[test]
    fn view_chains_become_one_op_or_none() {
        let mut b = Builder::new();
        let x = b.arg(
            TensorType::new(vec![2, 3, 4], ElemType::F32),
            ArgAttrs::default(),
        );
        // Two transposes that cancel, two that compose, two reshapes, a no-op conversion.
        let t1 = b.transpose(x, &[0, 2, 1]).unwrap();
        let back = b.transpose(t1, &[0, 2, 1]).unwrap();
        let t2 = b.transpose(x, &[1, 0, 2]).unwrap();
        let composed = b.transpose(t2, &[2, 0, 1]).unwrap();
        let r1 = b.reshape(x, &[6, 4]).unwrap();
        let r2 = b.reshape(r1, &[24]).unwrap();
        let same = b.convert(back, ElemType::F32);
        let module = Module {
            main: b.finish(vec![same, composed, r2], vec![]),
            attrs: vec![],
        };
        let f = dead_code(canonicalize(module)).main;
        // The cancelling pair and the conversion are gone: the argument itself is returned.
        assert_eq!(f.results[0], f.args[0]);
        assert_eq!(f.ops.len(), 2);
        assert_eq!(f.ops[0].operands, vec![f.args[0]]);
        assert_eq!(
            f.ops[0].kind,
            OpKind::Transpose {
                perm: vec![2, 1, 0]
            }
        );
        assert_eq!(f.ty(f.results[1]).shape, vec![4, 3, 2]);
        assert_eq!(f.ops[1].operands, vec![f.args[0]]);
        assert_eq!(f.ops[1].kind, OpKind::Reshape);
        assert_eq!(f.ty(f.results[2]).shape, vec![24]);
    }
}
