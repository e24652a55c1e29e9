//! Passes over the StableHLO IR.

use crate::ir::{Module, Op};

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

/// The cleanup pipeline run after lowering: constants folded, then what no longer has a use
/// removed.
pub fn cleanup(mut module: Module) -> Module {
    crate::fold::fold_constants(&mut module.main);
    dead_code(module)
}
