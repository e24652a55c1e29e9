//! Rotary position embedding as tpuc lowers Llama's (and Hugging Face's) form:
//! `x * cos + rotate_half(x) * sin`, `rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])`.

use super::{either, Defs, Match};
use crate::ir::{AttrValue, BinaryOp, OpKind, UnaryOp, Value};

/// `x * cos + rotate_half(x) * sin` (each product and the sum in either order), `cos` and `sin`
/// broadcast to `x`: `tpuc.rotary` with `style = "half"`.
pub(super) fn rotary(defs: &Defs, root: usize) -> Option<Match> {
    let f = defs.func();
    let out = f.ops()[root].result()?;
    let (_, a, b) = defs.binary(out, BinaryOp::Add)?;
    let (ops, _) = either(a, b, |plain, rotated| {
        let (cos_mul, p, q) = defs.binary(plain, BinaryOp::Mul)?;
        let (sin_mul, r, s) = defs.binary(rotated, BinaryOp::Mul)?;
        // x times the broadcast cosines; its rotation times the broadcast sines.
        let (x, _) = either(p, q, |x, cos| defs.broadcast(cos).map(|_| x))?;
        let (half_ops, _) = either(r, s, |rot, sin| {
            defs.broadcast(sin)?;
            rotate_half(defs, rot, x)
        })?;
        Some([half_ops, vec![cos_mul, sin_mul]].concat())
    })?;
    let ops = [ops, vec![root]].concat();
    Some(Match::new(f, ops, "tpuc.rotary").with("style", AttrValue::Str("half".into())))
}

/// The ops of `v = cat(-x[..., d/2:], x[..., :d/2])` along `x`'s last dimension.
fn rotate_half(defs: &Defs, v: Value, x: Value) -> Option<Vec<usize>> {
    let f = defs.func();
    let (cat, op) = defs.op(v)?;
    let rank = f.ty(x).rank();
    let d = *f.ty(x).shape.last()?;
    if op.kind()
        != &(OpKind::Concatenate {
            dim: rank as i64 - 1,
        })
        || op.operands().len() != 2
    {
        return None;
    }
    let (neg, high) = defs.unary(op.operands()[0], UnaryOp::Neg)?;
    let high_slice = half(defs, high, x, d / 2, d)?;
    let low_slice = half(defs, op.operands()[1], x, 0, d / 2)?;
    (d % 2 == 0).then(|| vec![cat, neg, high_slice, low_slice])
}

/// The op of `v = x[..., from:to]` (along the last dimension, whole elsewhere).
fn half(defs: &Defs, v: Value, x: Value, from: i64, to: i64) -> Option<usize> {
    let (i, op) = defs.op(v)?;
    let OpKind::Slice {
        start,
        limit,
        strides,
    } = op.kind()
    else {
        return None;
    };
    let shape = &defs.func().ty(x).shape;
    let last = shape.len().checked_sub(1)?;
    let whole = (0..last).all(|k| start[k] == 0 && limit[k] == shape[k]);
    (op.operands()[0] == x
        && whole
        && start[last] == from
        && limit[last] == to
        && strides.iter().all(|&s| s == 1))
    .then_some(i)
}
