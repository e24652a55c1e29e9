//! Normalisations as tpuc lowers them: RMSNorm.

use super::{either, Defs, Match};
use crate::ir::{AttrValue, BinaryOp, UnaryOp, Value};

/// RMSNorm over the last dimension, `x * rsqrt(mean(x * x) + eps)`, times a weight broadcast
/// along that dimension when there is one: `tpuc.rms_norm` with `epsilon` (when a constant).
pub(super) fn rms_norm(defs: &Defs, root: usize) -> Option<Match> {
    let f = defs.func();
    let out = f.ops()[root].result()?;
    let shape = f.ty(out).shape.clone();
    let last = shape.len().checked_sub(1)? as i64;
    let mut ops = Vec::new();
    let normed = match weighted(defs, out, last) {
        Some((weight_ops, normed)) => {
            ops.extend(weight_ops);
            normed
        }
        None => out,
    };
    let (mul, a, b) = defs.binary(normed, BinaryOp::Mul)?;
    let ((x, scale_ops, r), _) = either(a, b, |x, s| {
        let (i, r, _) = defs.broadcast(s)?;
        Some((x, vec![i], r))
    })?;
    let (rsqrt, shifted) = defs.unary(r, UnaryOp::Rsqrt)?;
    let (add, p, q) = defs.binary(shifted, BinaryOp::Add)?;
    // eps a constant (an attribute), or a scalar the program takes (the tpuc device's programs
    // take an op's floats as operands): then an operand.
    let ((mean, eps_ops, eps), _) = either(p, q, |m, e| match defs.constant(e) {
        Some((ops, eps)) => Some((m, ops, Some(eps))),
        None => {
            let (i, scalar, _) = defs.broadcast(e)?;
            (f.ty(scalar).rank() == 0).then_some((m, vec![i], None))
        }
    })?;
    let (divide, summed, count) = defs.binary(mean, BinaryOp::Div)?;
    let (count_ops, n) = defs.constant(count)?;
    if n != shape[last as usize] as f64 {
        return None;
    }
    let (reshape, reduced) = defs.reshape(summed)?;
    let (sum_ops, squares, dims) = defs.sum(reduced)?;
    if dims != [last] {
        return None;
    }
    let (square, s1, s2) = defs.binary(squares, BinaryOp::Mul)?;
    if s1 != s2 || !defs.alike(s1, x) {
        return None;
    }
    ops.extend([mul, rsqrt, add, divide, reshape, square]);
    ops.extend(
        scale_ops
            .iter()
            .chain(&eps_ops)
            .chain(&count_ops)
            .chain(&sum_ops),
    );
    ops.push(root);
    let m = Match::new(f, ops, "tpuc.rms_norm");
    Some(match eps {
        Some(eps) => m.with("epsilon", AttrValue::f32(eps as f32)),
        None => m,
    })
}

/// `out = broadcast(w) * normed` (either order), `w` a vector broadcast along dimension `last`:
/// the broadcast's op and `normed`.
fn weighted(defs: &Defs, out: Value, last: i64) -> Option<(Vec<usize>, Value)> {
    let (mul, a, b) = defs.binary(out, BinaryOp::Mul)?;
    let (normed, broadcast) = either(a, b, |normed, w| {
        let (i, _, dims) = defs.broadcast(w)?;
        (dims == [last]).then_some((normed, i))
    })?
    .0;
    Some((vec![mul, broadcast], normed))
}
