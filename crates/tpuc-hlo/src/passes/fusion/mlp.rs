//! Gated MLPs as tpuc lowers them: `act(x @ gate) * (x @ up)`, the activation SiLU (SwiGLU),
//! GELU exact or tanh (GeGLU) or ReLU (ReGLU); linear layers with their activation.

use super::{either, Defs, Match};
use crate::ir::{AttrValue, BinaryOp, OpKind, UnaryOp, Value};

/// `act(x @ w_gate) * (x @ w_up)` (either order), both products of the same `x` (or of views
/// of it the lowering made alike), `act` one [`activation`] reads: `tpuc.gated_mlp` with
/// `activation`.
pub(super) fn gated_mlp(defs: &Defs, root: usize) -> Option<Match> {
    let f = defs.func();
    let out = f.ops()[root].result()?;
    let (_, a, b) = defs.binary(out, BinaryOp::Mul)?;
    let ((act_ops, gate_x, up_ops, up_x, name), _) = either(a, b, |act, up| {
        let (act_ops, gate, name) = activation(defs, act)?;
        let (gate_ops, gate_x) = product(defs, gate)?;
        let (up_ops, up_x) = product(defs, up)?;
        Some(([act_ops, gate_ops].concat(), gate_x, up_ops, up_x, name))
    })?;
    if !defs.alike(gate_x, up_x) {
        return None;
    }
    let ops = [act_ops, up_ops, vec![root]].concat();
    Some(Match::new(f, ops, "tpuc.gated_mlp").with("activation", AttrValue::Str(name.into())))
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

/// `act(x @ w + b)`, the bias broadcast along the product's rows (through the views a batched
/// linear layer makes), `act` ReLU, SiLU or GELU (exact or tanh): `tpuc.linear` with
/// `activation`.
pub(super) fn linear(defs: &Defs, root: usize) -> Option<Match> {
    let f = defs.func();
    let out = f.ops()[root].result()?;
    let (act_ops, y, name) = activation(defs, out)?;
    let (view, biased) = match defs.reshape(y) {
        Some((i, v)) => (vec![i], v),
        None => (vec![], y),
    };
    let (add, p, q) = defs.binary(biased, BinaryOp::Add)?;
    let ((product_op, bias_op), _) = either(p, q, |product, bias| {
        let (i, op) = defs.op(product)?;
        let (b, _, _) = defs.broadcast(bias)?;
        matches!(op.kind(), OpKind::DotGeneral { .. }).then_some((i, b))
    })?;
    let ops = [act_ops, view, vec![add, product_op, bias_op, root]].concat();
    Some(Match::new(f, ops, "tpuc.linear").with("activation", AttrValue::Str(name.into())))
}

/// `v = act(y)` as tpuc lowers the activations: its ops, `y` and the activation's name.
fn activation(defs: &Defs, v: Value) -> Option<(Vec<usize>, Value, &'static str)> {
    if let Some((ops, y)) = silu(defs, v) {
        return Some((ops, y, "silu"));
    }
    if let Some((max, a, b)) = defs.binary(v, BinaryOp::Max) {
        let ((zero_ops, y), _) = either(a, b, |y, zero| {
            let (ops, z) = defs.constant(zero)?;
            (z == 0.0).then_some((ops, y))
        })?;
        return Some(([vec![max], zero_ops].concat(), y, "relu"));
    }
    gelu(defs, v)
}

/// `v = (0.5 * y) * (1 + inner)`, `inner` `erf(y * (1/sqrt 2))` (GELU) or
/// `tanh(sqrt(2/pi) * (y + 0.044715 * y^3))` (its tanh approximation).
fn gelu(defs: &Defs, v: Value) -> Option<(Vec<usize>, Value, &'static str)> {
    let (outer, a, b) = defs.binary(v, BinaryOp::Mul)?;
    let ((half_ops, y, one_ops, inner), _) = either(a, b, |scaled, shifted| {
        let (hx, h, x) = defs.binary(scaled, BinaryOp::Mul)?;
        let ((half, y), _) = either(h, x, |h, y| {
            let (ops, k) = defs.constant(h)?;
            (k == 0.5).then_some((ops, y))
        })?;
        let (add, o, i) = defs.binary(shifted, BinaryOp::Add)?;
        let ((one, inner), _) = either(o, i, |o, inner| {
            let (ops, k) = defs.constant(o)?;
            (k == 1.0).then_some((ops, inner))
        })?;
        Some((
            [vec![hx], half].concat(),
            y,
            [vec![add], one].concat(),
            inner,
        ))
    })?;
    let (inner_ops, name) = if let Some((erf, t)) = defs.unary(inner, UnaryOp::Erf) {
        let (mul, p, q) = defs.binary(t, BinaryOp::Mul)?;
        let ((c_ops, _), _) = either(p, q, |x, c| {
            let (ops, k) = defs.constant(c)?;
            (x == y && (k - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-6).then_some((ops, x))
        })?;
        ([vec![erf, mul], c_ops].concat(), "gelu")
    } else {
        let (tanh, t) = defs.unary(inner, UnaryOp::Tanh)?;
        let (mul, p, q) = defs.binary(t, BinaryOp::Mul)?;
        let ((c_ops, s), _) = either(p, q, |c, s| {
            let (ops, k) = defs.constant(c)?;
            ((k - (2.0 / std::f64::consts::PI).sqrt()).abs() < 1e-6).then_some((ops, s))
        })?;
        let (sum, p, q) = defs.binary(s, BinaryOp::Add)?;
        let ((cube_ops, _), _) = either(p, q, |x, kx3| {
            let (m, k, x3) = defs.binary(kx3, BinaryOp::Mul)?;
            let (k_ops, kv) = defs.constant(k)?;
            let (m3, x2, x1) = defs.binary(x3, BinaryOp::Mul)?;
            let (m2, a, b) = defs.binary(x2, BinaryOp::Mul)?;
            let fits = x == y && x1 == y && a == y && b == y && (kv - 0.044715).abs() < 1e-6;
            fits.then(|| ([vec![m, m3, m2], k_ops].concat(), x))
        })?;
        (
            [vec![tanh, mul, sum], c_ops, cube_ops].concat(),
            "gelu_tanh",
        )
    };
    Some((
        [vec![outer], half_ops, one_ops, inner_ops].concat(),
        y,
        name,
    ))
}
