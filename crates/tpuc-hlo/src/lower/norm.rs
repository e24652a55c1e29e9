//! Normalisation layers: batch norm (inference and training statistics), layer norm, group norm.

use tpuc_fx::Node;

use super::prelude::*;

/// x * rsqrt(var + eps) scaled and shifted, for statistics that broadcast along `kept` dims.
fn normalize(
    cx: &mut Ctx,
    x: Value,
    mean: Value,
    var: Value,
    eps: f64,
    kept: &[i64],
) -> OpResult<(Value, Value)> {
    let shape = cx.b.shape(x).to_vec();
    let e = cx.full_like(var, eps, None);
    let ve = cx.b.binary(BinaryOp::Add, var, e)?;
    let rstd = cx.b.unary(UnaryOp::Rsqrt, ve)?;
    let mb = cx.b.broadcast_in_dim(mean, &shape, kept)?;
    let rb = cx.b.broadcast_in_dim(rstd, &shape, kept)?;
    let centered = cx.b.binary(BinaryOp::Sub, x, mb)?;
    Ok((cx.b.binary(BinaryOp::Mul, centered, rb)?, rstd))
}

fn affine(
    cx: &mut Ctx,
    y: Value,
    weight: Option<Value>,
    bias: Option<Value>,
    dims: &[i64],
) -> OpResult<Value> {
    let shape = cx.b.shape(y).to_vec();
    let mut y = y;
    if let Some(w) = weight {
        let w = cx.b.convert(w, cx.b.elem(y));
        let wb = cx.b.broadcast_in_dim(w, &shape, dims)?;
        y = cx.b.binary(BinaryOp::Mul, y, wb)?;
    }
    if let Some(b) = bias {
        let b = cx.b.convert(b, cx.b.elem(y));
        let bb = cx.b.broadcast_in_dim(b, &shape, dims)?;
        y = cx.b.binary(BinaryOp::Add, y, bb)?;
    }
    Ok(y)
}

/// y = x * alpha + beta per channel, alpha = invstd * weight and beta = bias - mean * alpha,
/// computed in `x`'s accumulation type and rounded once, as torch's CPU kernel does (the same
/// value as normalising first, but not the same rounding).
fn batch_normalized(
    cx: &mut Ctx,
    n: &Node,
    x: Value,
    mean: Value,
    invstd: Value,
) -> OpResult<Value> {
    let elem = cx.b.elem(x);
    let acc = elem.accumulation();
    let (w, b) = (cx.opt_tensor(n, "weight")?, cx.opt_tensor(n, "bias")?);
    let alpha = match w {
        Some(w) => {
            let w = cx.b.convert(w, acc);
            cx.b.binary(BinaryOp::Mul, invstd, w)?
        }
        None => invstd,
    };
    let shift = cx.b.binary(BinaryOp::Mul, mean, alpha)?;
    let beta = match b {
        Some(b) => {
            let b = cx.b.convert(b, acc);
            cx.b.binary(BinaryOp::Sub, b, shift)?
        }
        None => cx.b.unary(UnaryOp::Neg, shift)?,
    };
    let shape = cx.b.shape(x).to_vec();
    let xa = cx.b.convert(x, acc);
    let alpha = cx.b.broadcast_in_dim(alpha, &shape, &[1])?;
    let beta = cx.b.broadcast_in_dim(beta, &shape, &[1])?;
    let scaled = cx.b.binary(BinaryOp::Mul, xa, alpha)?;
    let y = cx.b.binary(BinaryOp::Add, scaled, beta)?;
    Ok(cx.b.convert(y, elem))
}

/// 1 / sqrt(var + eps), as torch writes it (not rsqrt: its rounding differs).
fn inverse_std(cx: &mut Ctx, var: Value, eps: f64) -> OpResult<Value> {
    let e = cx.full_like(var, eps, None);
    let ve = cx.b.binary(BinaryOp::Add, var, e)?;
    let root = cx.b.unary(UnaryOp::Sqrt, ve)?;
    let one = cx.full_like(root, 1.0, None);
    Ok(cx.b.binary(BinaryOp::Div, one, root)?)
}

/// Batch norm with running statistics (inference).
fn batch_norm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input")?;
    let mean = cx.opt_tensor(n, "running_mean")?;
    let var = cx.opt_tensor(n, "running_var")?;
    let (Some(mean), Some(var)) = (mean, var) else {
        return err("not supported: batch_norm in inference without running statistics");
    };
    let eps = cx.float(n, "eps", Some(1e-5))?;
    let acc = cx.b.elem(x).accumulation();
    let (mean_acc, var_acc) = (cx.b.convert(mean, acc), cx.b.convert(var, acc));
    let invstd = inverse_std(cx, var_acc, eps)?;
    let y = batch_normalized(cx, n, x, mean_acc, invstd)?;
    // The saved statistics (outputs 1 and 2) are empty in inference; the functional form also
    // returns the running statistics, unchanged.
    let mut empty = |i: usize| -> OpResult<Option<Value>> {
        Ok(match cx.opt_out_type(n, i)? {
            Some(ty) if ty.numel() == 0 => Some(cx.b.splat(&ty, 0.0)),
            _ => None,
        })
    };
    let (saved_mean, saved_rstd) = (empty(1)?, empty(2)?);
    let mut running = Vec::new();
    for (i, v) in [(3, mean), (4, var)] {
        let elem = cx.opt_out_type(n, i)?.map_or(cx.b.elem(v), |t| t.elem);
        running.push(Some(cx.b.convert(v, elem)));
    }
    let mut outs = vec![Some(y), saved_mean, saved_rstd];
    outs.extend(running);
    outs.truncate(output_slots(n).len());
    Ok(outs)
}

/// Mean and biased variance of `x` over `dims` (shaped like `x` without them), and the count.
fn moments(cx: &mut Ctx, x: Value, dims: &[i64]) -> OpResult<(Value, Value, i64)> {
    let shape = cx.b.shape(x).to_vec();
    let kept: Vec<i64> = (0..shape.len() as i64)
        .filter(|d| !dims.contains(d))
        .collect();
    let count: i64 = dims.iter().map(|&d| shape[d as usize]).product();
    let elem = cx.b.elem(x);
    let zero = cx.b.scalar(elem, 0.0);
    let sum =
        cx.b.reduce(&[x], &[zero], dims, ReduceBody::Binary(BinaryOp::Add))?[0];
    let c = cx.full_like(sum, count as f64, None);
    let mean = cx.b.binary(BinaryOp::Div, sum, c)?;
    let mb = cx.b.broadcast_in_dim(mean, &shape, &kept)?;
    let d = cx.b.binary(BinaryOp::Sub, x, mb)?;
    let sq = cx.b.binary(BinaryOp::Mul, d, d)?;
    let ss =
        cx.b.reduce(&[sq], &[zero], dims, ReduceBody::Binary(BinaryOp::Add))?[0];
    let var = cx.b.binary(BinaryOp::Div, ss, c)?;
    Ok((mean, var, count))
}

/// A statistic reshaped and converted to the type torch recorded for output `i`.
fn stat_output(cx: &mut Ctx, n: &Node, i: usize, v: Value) -> OpResult<Option<Value>> {
    let Some(ty) = cx.opt_out_type(n, i)? else {
        return Ok(None);
    };
    let v = cx.b.reshape(v, &ty.shape)?;
    Ok(Some(cx.b.convert(v, ty.elem)))
}

/// The outputs of a normalisation node: `y` scaled and shifted by the node's weight and bias
/// along `dims` and rounded to `elem`; then, where the op returns them, the mean and rstd.
#[allow(clippy::too_many_arguments)]
fn finish(
    cx: &mut Ctx,
    n: &Node,
    y: Value,
    dims: &[i64],
    elem: DType,
    mean: Value,
    rstd: Value,
) -> OpResult<Vec<Option<Value>>> {
    let (w, b) = (cx.opt_tensor(n, "weight")?, cx.opt_tensor(n, "bias")?);
    let y = affine(cx, y, w, b, dims)?;
    let mut outs = vec![Some(cx.b.convert(y, elem))];
    for (i, stat) in [(1, mean), (2, rstd)] {
        if i < output_slots(n).len() {
            outs.push(stat_output(cx, n, i, stat)?);
        }
    }
    Ok(outs)
}

fn layer_norm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input")?;
    let norm_shape = cx.ints(n, "normalized_shape", None)?;
    let eps = cx.float(n, "eps", Some(1e-5))?;
    let shape = cx.b.shape(x).to_vec();
    let rank = shape.len();
    let k = norm_shape.len();
    if k > rank || shape[rank - k..] != norm_shape[..] {
        return err(format!("normalized_shape {norm_shape:?} does not match the input's trailing dimensions {shape:?}"));
    }
    let elem = cx.b.elem(x);
    let xa = cx.b.convert(x, elem.accumulation());
    let dims: Vec<i64> = ((rank - k) as i64..rank as i64).collect();
    let kept: Vec<i64> = (0..(rank - k) as i64).collect();
    let (mean, var, _) = moments(cx, xa, &dims)?;
    let (y, rstd) = normalize(cx, xa, mean, var, eps, &kept)?;
    // native_layer_norm also returns the statistics, shaped [..., 1, ...].
    finish(cx, n, y, &dims, elem, mean, rstd)
}

/// native_group_norm: (y, mean [N, G], rstd [N, G]); statistics over each group's channels and
/// all spatial positions.
fn group_norm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input")?;
    let groups = cx.int(n, "group", None)?;
    let eps = cx.float(n, "eps", Some(1e-5))?;
    let shape = cx.b.shape(x).to_vec();
    if shape.len() < 2 || groups < 1 || shape[1] % groups != 0 {
        return err(format!(
            "not supported: group_norm of a {shape:?} tensor in {groups} groups (the channel \
             dimension 1 must divide into the groups)"
        ));
    }
    let batch = shape[0];
    let per_group: i64 = shape[1..].iter().product::<i64>() / groups;
    let elem = cx.b.elem(x);
    let xa = cx.b.convert(x, elem.accumulation());
    let grouped = cx.b.reshape(xa, &[batch, groups, per_group])?;
    let (mean, var, _) = moments(cx, grouped, &[2])?;
    let (y, rstd) = normalize(cx, grouped, mean, var, eps, &[0, 1])?;
    let y = cx.b.reshape(y, &shape)?;
    finish(cx, n, y, &[1], elem, mean, rstd)
}

/// Batch norm in training mode: normalised by the batch's own statistics (over every dim but
/// the channels, 1). Returns (y, save_mean, save_rstd) and, when running statistics are given,
/// their updated values: `(1 - momentum) * running + momentum * batch`, with the unbiased batch
/// variance, as torch does.
fn batch_norm_training(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input")?;
    let eps = cx.float(n, "eps", Some(1e-5))?;
    let momentum = cx.float(n, "momentum", Some(0.1))?;
    let shape = cx.b.shape(x).to_vec();
    if shape.len() < 2 {
        return err(format!(
            "batch_norm needs a channel dimension, got shape {shape:?}"
        ));
    }
    let elem = cx.b.elem(x);
    let xa = cx.b.convert(x, elem.accumulation());
    let dims: Vec<i64> = (0..shape.len() as i64).filter(|&d| d != 1).collect();
    let (mean, var, count) = moments(cx, xa, &dims)?;
    let invstd = inverse_std(cx, var, eps)?;
    // torch keeps the batch statistics in the parameters' type (the weight's, else the
    // input's) and normalises with those stored values: 16-bit ones are rounded first.
    let param = match cx.opt_tensor(n, "weight")? {
        Some(w) => cx.b.elem(w),
        None => elem,
    };
    let (used_mean, used_invstd) = if param.accumulation() != param {
        (cx.rounded_to(mean, param), cx.rounded_to(invstd, param))
    } else {
        (mean, invstd)
    };
    let y = batch_normalized(cx, n, x, used_mean, used_invstd)?;
    let mut outs = vec![Some(y)];
    for (i, stat) in [(1, mean), (2, invstd)] {
        if i < output_slots(n).len() {
            outs.push(stat_output(cx, n, i, stat)?);
        }
    }
    let running = (
        cx.opt_tensor(n, "running_mean")?,
        cx.opt_tensor(n, "running_var")?,
    );
    let (Some(running_mean), Some(running_var)) = running else {
        return Ok(outs);
    };
    let unbiased = count as f64 / (count - 1).max(1) as f64;
    let corrected = {
        let f = cx.full_like(var, unbiased, None);
        cx.b.binary(BinaryOp::Mul, var, f)?
    };
    let mut updated = Vec::new();
    for (old, batch) in [(running_mean, mean), (running_var, corrected)] {
        let old_elem = cx.b.elem(old);
        let old_acc = cx.b.convert(old, cx.b.elem(batch));
        let keep = cx.full_like(old_acc, 1.0 - momentum, None);
        let take = cx.full_like(batch, momentum, None);
        let a = cx.b.binary(BinaryOp::Mul, old_acc, keep)?;
        let c = cx.b.binary(BinaryOp::Mul, batch, take)?;
        let sum = cx.b.binary(BinaryOp::Add, a, c)?;
        updated.push((sum, old_elem));
    }
    let with_update = n.target == "aten._batch_norm_with_update_functional.default";
    if with_update
        || n.target
            .starts_with("aten._native_batch_norm_legit_functional")
    {
        // The functional forms return the new running statistics, in the type torch records
        // (float32 for 16-bit inputs); _batch_norm_with_update_functional returns an empty
        // reserve (cuDNN's workspace) before them.
        let first = if with_update {
            let reserve = cx.out_type(n, 3)?;
            outs.push(Some(cx.b.splat(&reserve, 0.0)));
            4
        } else {
            3
        };
        for (i, (v, old_elem)) in updated.into_iter().enumerate() {
            let elem = cx
                .opt_out_type(n, first + i)?
                .map_or(old_elem, |ty| ty.elem);
            outs.push(Some(cx.b.convert(v, elem)));
        }
    } else {
        // _native_batch_norm_legit updates them in place: later reads see the new values.
        for (name, (v, old_elem)) in ["running_mean", "running_var"].into_iter().zip(updated) {
            if let Some(Arg::Tensor(t)) = n.arg(name) {
                let v = cx.b.convert(v, old_elem);
                cx.rebind(t, v);
            }
        }
    }
    Ok(outs)
}

/// The batch-norm overloads that take a `training` flag: batch statistics when it is set,
/// running statistics otherwise.
fn batch_norm_any(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    if cx.bool(n, "training", false)? {
        batch_norm_training(cx, n)
    } else {
        batch_norm(cx, n)
    }
}

pub fn register(r: &mut Registry) {
    r.add(
        &["aten._native_batch_norm_legit_no_training.default"],
        batch_norm,
    );
    r.add(
        &[
            "aten.batch_norm.default",
            "aten.native_batch_norm.default",
            "aten._native_batch_norm_legit.default",
            "aten._native_batch_norm_legit.no_stats",
            "aten._native_batch_norm_legit_functional.default",
        ],
        batch_norm_any,
    );
    r.add(
        &["aten._batch_norm_with_update_functional.default"],
        batch_norm_training,
    );
    r.add(&["aten.native_group_norm.default"], group_norm);
    r.add(
        &["aten.layer_norm.default", "aten.native_layer_norm.default"],
        layer_norm,
    );
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn layer_norm_of_half_precision_is_computed_in_float32() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::BF16, &[2, 8]);
        let out = g.node(
            "aten.native_layer_norm.default",
            vec![
                ("input", t(&x)),
                ("normalized_shape", Arg::Ints(vec![8])),
                ("weight", Arg::None),
                ("bias", Arg::None),
                ("eps", Arg::Float(1e-5)),
            ],
            &[
                (DType::BF16, &[2, 8]),
                (DType::F32, &[2, 1]),
                (DType::F32, &[2, 1]),
            ],
        );
        // Statistics in float32 (as torch's CPU kernel), the result rounded once to bfloat16.
        assert_checks(
            &g.text(&[&out[0], &out[1], &out[2]]),
            &[
                "stablehlo.convert %0 to=float32",
                "stablehlo.reduce",
                "stablehlo.rsqrt",
                "to=bfloat16 : tensor<2x8xbf16>",
            ],
        );
    }
}
