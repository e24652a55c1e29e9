//! Normalisation layers in inference form.

use tpuc_fx::Node;

use super::*;

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

fn batch_norm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    if cx.bool(n, "training", false)? {
        return err(
            "not supported: batch_norm with training=True (call model.eval() before exporting)",
        );
    }
    let x = cx.tensor(n, "input")?;
    let mean = cx.opt_tensor(n, "running_mean")?;
    let var = cx.opt_tensor(n, "running_var")?;
    let (Some(mean), Some(var)) = (mean, var) else {
        return err("not supported: batch_norm in inference without running statistics");
    };
    let eps = cx.float(n, "eps", Some(1e-5))?;
    let elem = cx.b.elem(x);
    let (mean, var) = (cx.b.convert(mean, elem), cx.b.convert(var, elem));
    let (y, _) = normalize(cx, x, mean, var, eps, &[1])?;
    let (w, b) = (cx.opt_tensor(n, "weight")?, cx.opt_tensor(n, "bias")?);
    let y = affine(cx, y, w, b, &[1])?;
    let mut outs = vec![Some(y)];
    // _native_batch_norm_legit_no_training also returns (empty) saved statistics.
    outs.extend((1..n.defined_tensors().len()).map(|_| None));
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
    let acc = if matches!(elem, ElemType::F16 | ElemType::BF16) {
        ElemType::F32
    } else {
        elem
    };
    let xa = cx.b.convert(x, acc);
    let dims: Vec<i64> = ((rank - k) as i64..rank as i64).collect();
    let kept: Vec<i64> = (0..(rank - k) as i64).collect();
    let count: i64 = norm_shape.iter().product();
    let zero = cx.b.scalar(acc, 0.0);
    let sum =
        cx.b.reduce(&[xa], &[zero], &dims, ReduceBody::Binary(BinaryOp::Add))?[0];
    let c = cx.full_like(sum, count as f64, None);
    let mean = cx.b.binary(BinaryOp::Div, sum, c)?;
    let mb = cx.b.broadcast_in_dim(mean, &shape, &kept)?;
    let d = cx.b.binary(BinaryOp::Sub, xa, mb)?;
    let sq = cx.b.binary(BinaryOp::Mul, d, d)?;
    let ss =
        cx.b.reduce(&[sq], &[zero], &dims, ReduceBody::Binary(BinaryOp::Add))?[0];
    let var = cx.b.binary(BinaryOp::Div, ss, c)?;
    let (y, rstd) = normalize(cx, xa, mean, var, eps, &kept)?;
    let (w, b) = (cx.opt_tensor(n, "weight")?, cx.opt_tensor(n, "bias")?);
    let y = affine(cx, y, w, b, &dims)?;
    let y = cx.b.convert(y, elem);
    if n.defined_tensors().len() == 1 {
        return Ok(vec![Some(y)]);
    }
    // native_layer_norm: (y, mean, rstd) with statistics shaped [..., 1, ...].
    let stat = cx.out_type(n, 1)?;
    let mean = cx.b.reshape(mean, &stat.shape)?;
    let rstd = cx.b.reshape(rstd, &stat.shape)?;
    Ok(vec![
        Some(y),
        Some(cx.b.convert(mean, stat.elem)),
        Some(cx.b.convert(rstd, stat.elem)),
    ])
}

pub fn register(r: &mut Registry) {
    r.add(
        &[
            "aten.batch_norm.default",
            "aten._native_batch_norm_legit_no_training.default",
        ],
        batch_norm,
    );
    r.add(
        &["aten.layer_norm.default", "aten.native_layer_norm.default"],
        layer_norm,
    );
}
