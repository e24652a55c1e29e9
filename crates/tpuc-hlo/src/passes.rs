//! Passes over the StableHLO IR.

use crate::ir::{CompareDir, Literal, Module, Op, OpKind};
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

/// The cleanup pipeline run after lowering: constants folded, what no longer has a use
/// removed, boolean constants made readable for the plugin.
pub fn cleanup(mut module: Module) -> Module {
    crate::fold::fold_constants(&mut module.main);
    bool_constants_as_bytes(dead_code(module))
}
