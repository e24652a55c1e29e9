//! Gated MLPs as tpuc lowers them: `act(x @ gate) * (x @ up)`, the activation SiLU (SwiGLU).

use super::{either, Defs, Match};
use crate::ir::{AttrValue, BinaryOp, OpKind, UnaryOp, Value};

/// `silu(x @ w_gate) * (x @ w_up)` (either order), both products of the same `x` (or of views
/// of it the lowering made alike): `tpuc.gated_mlp` with `activation = "silu"`.
pub(super) fn gated_mlp(defs: &Defs, root: usize) -> Option<Match> {
    let f = defs.func();
    let out = f.ops()[root].result()?;
    let (_, a, b) = defs.binary(out, BinaryOp::Mul)?;
    let ((act_ops, gate_x, up_ops, up_x), _) = either(a, b, |act, up| {
        let (act_ops, gate) = silu(defs, act)?;
        let (gate_ops, gate_x) = product(defs, gate)?;
        let (up_ops, up_x) = product(defs, up)?;
        Some(([act_ops, gate_ops].concat(), gate_x, up_ops, up_x))
    })?;
    if !alike(defs, gate_x, up_x) {
        return None;
    }
    let ops = [act_ops, up_ops, vec![root]].concat();
    Some(Match::new(f, ops, "tpuc.gated_mlp").with("activation", AttrValue::Str("silu".into())))
}

/// `v = g * logistic(g)` (either order): its ops and `g`.
fn silu(defs: &Defs, v: Value) -> Option<(Vec<usize>, Value)> {
    let (mul, a, b) = defs.binary(v, BinaryOp::Mul)?;
    let ((logistic, g), _) = either(a, b, |g, s| {
        let (i, x) = defs.unary(s, UnaryOp::Logistic)?;
        (x == g).then_some((i, g))
    })?;
    Some((vec![mul, logistic], g))
}

/// `v`, a matrix product (`dot_general`) of an activation by a weight, or a view of one (a
/// linear layer on a batch of sequences multiplies their rows flattened): its ops and the
/// activation.
fn product(defs: &Defs, v: Value) -> Option<(Vec<usize>, Value)> {
    let (view, product) = match defs.reshape(v) {
        Some((i, p)) => (vec![i], p),
        None => (vec![], v),
    };
    let (i, op) = defs.op(product)?;
    matches!(op.kind(), OpKind::DotGeneral { .. })
        .then(|| ([view, vec![i]].concat(), op.operands()[0]))
}

/// Whether `a` and `b` are the same value, or the same view (one op of the same kind) of one.
fn alike(defs: &Defs, a: Value, b: Value) -> bool {
    if a == b {
        return true;
    }
    match (defs.op(a), defs.op(b)) {
        (Some((_, x)), Some((_, y))) => {
            x.kind() == y.kind()
                && x.operands() == y.operands()
                && matches!(
                    x.kind(),
                    OpKind::Reshape { .. } | OpKind::Transpose { .. } | OpKind::Convert { .. }
                )
        }
        _ => false,
    }
}
