//! Softmax with cross-entropy: `cross_entropy(logits, targets)` as torch decomposes it (the
//! log-softmax composite the lowering makes, the target classes' log-probabilities gathered and
//! negated, targets equal to `ignore_index` left out, the sum or the mean over the counted
//! ones) becomes one `tpuc.cross_entropy` composite of the logits and the targets.

use std::collections::HashSet;

use super::{Defs, Match};
use crate::ir::{AttrValue, BinaryOp, CompareDir, OpKind, UnaryOp, Value};

const LOG_SOFTMAX: &str = "tpuc.log_softmax";

pub(super) fn cross_entropy(defs: &Defs, root: usize) -> Option<Match> {
    let f = defs.func();
    let result = *f.ops()[root].results().first()?;
    let (reduction, summed) = match defs.binary(result, BinaryOp::Div) {
        Some((_, total, _count)) => ("mean", total),
        None => ("sum", result),
    };
    if f.ty(summed).rank() != 0 {
        return None;
    }
    let (_, picked, _) = defs.sum(summed)?;
    let (_, select) = defs
        .op(picked)
        .filter(|(_, o)| *o.kind() == OpKind::Select)?;
    let (kept, loss, zero) = (
        select.operands()[0],
        select.operands()[1],
        select.operands()[2],
    );
    if defs.constant(zero)?.1 != 0.0 {
        return None;
    }
    let (_, gathered) = defs.unary(loss, UnaryOp::Neg)?;
    let mut gathered = gathered;
    while let Some((_, x)) = defs.reshape(gathered) {
        gathered = x;
    }
    let (_, gather) = defs.op(gathered)?;
    let OpKind::Gather(_) = gather.kind() else {
        return None;
    };
    let (_, log_softmax) = defs.op(gather.operands()[0])?;
    let (name, attributes, _) = log_softmax.kind().composite()?;
    let classes_last = AttrValue::I64(f.ty(gather.operands()[0]).rank() as i64 - 1);
    if name != LOG_SOFTMAX
        || !attributes
            .iter()
            .any(|(k, v)| k == "dim" && *v == classes_last)
    {
        return None;
    }
    let logits = log_softmax.operands()[0];
    // `targets != ignore_index` says which targets count.
    let (_, compare) = defs.op(kept)?;
    let OpKind::Compare {
        dir: CompareDir::Ne,
        ..
    } = compare.kind()
    else {
        return None;
    };
    let (targets, ignored) = (compare.operands()[0], compare.operands()[1]);
    let ignore_index = integer_scalar(defs, ignored)?;
    let ops = slice(defs, root, &[logits, targets])?;
    Some(
        Match::new(f, ops, "tpuc.cross_entropy")
            .with("reduction", AttrValue::Str(reduction.into()))
            .with("ignore_index", AttrValue::I64(ignore_index)),
    )
}

/// The ops `root` is computed by from `boundary` alone (and constants); None when it reads
/// another value of the function's arguments.
fn slice(defs: &Defs, root: usize, boundary: &[Value]) -> Option<Vec<usize>> {
    let f = defs.func();
    let mut ops = vec![root];
    let mut seen: HashSet<usize> = HashSet::from([root]);
    let mut next = vec![root];
    while let Some(i) = next.pop() {
        for &v in f.ops()[i].operands() {
            if boundary.contains(&v) {
                continue;
            }
            let (j, _) = defs.op(v)?;
            if seen.insert(j) {
                ops.push(j);
                next.push(j);
            }
        }
    }
    Some(ops)
}

/// An integer scalar constant, possibly broadcast.
fn integer_scalar(defs: &Defs, v: Value) -> Option<i64> {
    let (_, o) = defs.op(v)?;
    match o.kind() {
        OpKind::BroadcastInDim { .. } => integer_scalar(defs, o.operands()[0]),
        OpKind::Constant(lit) if lit.ty.elem.is_integer() && (lit.splat || lit.ty.numel() == 1) => {
            let size = lit.ty.elem.byte_size();
            let mut bytes = [0u8; 8];
            bytes[..size].copy_from_slice(lit.bytes.get(..size)?);
            // Sign-extended from its width.
            let shift = 64 - 8 * size as u32;
            Some((i64::from_le_bytes(bytes) << shift) >> shift)
        }
        _ => None,
    }
}
