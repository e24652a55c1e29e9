//! Reductions, softmax and cumulative ops.

use tpuc_fx::Node;

use super::*;
use crate::ir::reduction_identity;

/// The dimensions a reduction covers: `dim` (int, list, or absent/empty = all).
fn reduce_dims(cx: &Ctx, n: &Node, x: Value) -> OpResult<Vec<i64>> {
    let rank = cx.b.ty(x).rank();
    let dims = cx.opt_ints(n, "dim")?.unwrap_or_default();
    if dims.is_empty() {
        return Ok((0..rank as i64).collect());
    }
    let dims = dims
        .iter()
        .map(|&d| norm_dim(d, rank).map(|d| d as i64))
        .collect::<OpResult<Vec<_>>>()?;
    // A 0-d tensor accepts dim 0 or -1 and has nothing to reduce.
    Ok(if rank == 0 { vec![] } else { dims })
}

pub fn reduce_to(
    cx: &mut Ctx,
    x: Value,
    dims: &[i64],
    op: BinaryOp,
    out: &TensorType,
) -> OpResult<Value> {
    let acc = out.elem.accumulation();
    let x = cx.b.convert(x, acc);
    let r = cx.b.reduce_by(x, dims, op)?;
    let r = cx.b.convert(r, out.elem);
    Ok(cx.b.reshape(r, &out.shape)?)
}

fn simple_reduce(cx: &mut Ctx, n: &Node, op: BinaryOp) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let dims = reduce_dims(cx, n, x)?;
    let out = cx.out_type(n, 0)?;
    let x = if matches!(op, BinaryOp::Or | BinaryOp::And) {
        let zero = cx.full_like(x, 0.0, None);
        cx.b.compare(CompareDir::Ne, x, zero)?
    } else {
        x
    };
    Ok(vec![Some(reduce_to(cx, x, &dims, op, &out)?)])
}

fn mean(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let dims = reduce_dims(cx, n, x)?;
    let out = cx.out_type(n, 0)?;
    let acc_ty = out.with_elem(out.elem.accumulation());
    let s = reduce_to(cx, x, &dims, BinaryOp::Add, &acc_ty)?;
    // The true count where the reduced dimensions are padded to a bucket.
    let c = cx.reduced_count(n, "self", x, &dims, s)?;
    let m = cx.b.binary(BinaryOp::Div, s, c)?;
    Ok(vec![Some(cx.b.convert(m, out.elem))])
}

fn variance(cx: &mut Ctx, n: &Node, x: Value, out: &TensorType) -> OpResult<Value> {
    let dims = reduce_dims(cx, n, x)?;
    let correction = if n.target.ends_with(".correction") {
        cx.float(n, "correction", Some(1.0))?
    } else if cx.bool(n, "unbiased", true)? {
        1.0
    } else {
        0.0
    };
    let shape = cx.b.shape(x).to_vec();
    let count: i64 = dims.iter().map(|&d| shape[d as usize]).product();
    let acc = out.elem.accumulation();
    let x = cx.b.convert(x, acc);
    let kept: Vec<i64> = (0..shape.len() as i64)
        .filter(|d| !dims.contains(d))
        .collect();
    let kept_shape: Vec<i64> = kept.iter().map(|&d| shape[d as usize]).collect();
    let sum = reduce_to(
        cx,
        x,
        &dims,
        BinaryOp::Add,
        &TensorType::new(kept_shape.clone(), acc),
    )?;
    let c = cx.full_like(sum, count as f64, None);
    let m = cx.b.binary(BinaryOp::Div, sum, c)?;
    let mb = cx.b.broadcast_in_dim(m, &shape, &kept)?;
    let d = cx.b.binary(BinaryOp::Sub, x, mb)?;
    let sq = cx.b.binary(BinaryOp::Mul, d, d)?;
    let ss = reduce_to(
        cx,
        sq,
        &dims,
        BinaryOp::Add,
        &TensorType::new(kept_shape, acc),
    )?;
    let denom = cx.full_like(ss, (count as f64 - correction).max(0.0), None);
    let v = cx.b.binary(BinaryOp::Div, ss, denom)?;
    let v = cx.b.convert(v, out.elem);
    Ok(cx.b.reshape(v, &out.shape)?)
}

fn var(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(variance(cx, n, x, &out)?)])
}

/// var_mean: (variance, mean) over the same dims.
fn var_mean(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let v = var(cx, n)?.remove(0);
    let m = mean(cx, n)?.remove(0);
    Ok(vec![v, m])
}

fn std(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let v = variance(cx, n, x, &out)?;
    Ok(vec![Some(cx.b.unary(UnaryOp::Sqrt, v)?)])
}

/// (values, indices) of the max (`largest`) or min along one dimension, as torch picks them:
/// the first index on ties, and for floats a NaN over any number (the first NaN).
pub(super) fn arg_reduce(
    cx: &mut Ctx,
    x: Value,
    dim: usize,
    largest: bool,
) -> OpResult<(Value, Value)> {
    let ty = cx.b.ty(x).clone();
    if ty.rank() == 0 {
        let zero = cx.b.scalar(DType::I64, 0.0);
        return Ok((x, zero));
    }
    let idx = cx.b.iota(ty.with_elem(DType::I64), dim as i64)?;
    let op = if largest {
        BinaryOp::Max
    } else {
        BinaryOp::Min
    };
    let body = ReduceBody::ArgExtremum {
        largest,
        nan_wins: ty.elem.is_float(),
    };
    let init_v = cx.b.scalar(ty.elem, reduction_identity(op, ty.elem));
    let init_i = cx.b.scalar(DType::I64, 0.0);
    let r =
        cx.b.reduce(&[x, idx], &[init_v, init_i], &[dim as i64], body)?;
    Ok((r[0], r[1]))
}

fn max_min_dim(cx: &mut Ctx, n: &Node, largest: bool) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let dim = norm_dim(cx.int(n, "dim", None)?, cx.b.ty(x).rank())?;
    let (v, i) = arg_reduce(cx, x, dim, largest)?;
    let (tv, ti) = (cx.out_type(n, 0)?, cx.out_type(n, 1)?);
    Ok(vec![
        Some(cx.b.reshape(v, &tv.shape)?),
        Some(cx.b.reshape(i, &ti.shape)?),
    ])
}

fn arg_max_min(cx: &mut Ctx, n: &Node, largest: bool) -> OpResult<Vec<Option<Value>>> {
    let mut x = cx.tensor(n, "self")?;
    let dim = match cx.opt_int(n, "dim")? {
        Some(d) => norm_dim(d, cx.b.ty(x).rank())?,
        None => {
            let numel = cx.b.ty(x).numel();
            x = cx.b.reshape(x, &[numel])?;
            0
        }
    };
    let (_, i) = arg_reduce(cx, x, dim, largest)?;
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.reshape(i, &out.shape)?)])
}

/// (log-)softmax along `dim`, stabilised by the maximum along it.
fn softmax_along(cx: &mut Ctx, x: Value, dim: usize, log: bool) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let kept: Vec<i64> = (0..shape.len() as i64)
        .filter(|&d| d != dim as i64)
        .collect();
    let (_, shifted, e) = shifted_exp(cx, x, dim)?;
    let s = cx.b.reduce_by(e, &[dim as i64], BinaryOp::Add)?;
    if log {
        let ls = cx.b.unary(UnaryOp::Log, s)?;
        let lsb = cx.b.broadcast_in_dim(ls, &shape, &kept)?;
        Ok(cx.b.binary(BinaryOp::Sub, shifted, lsb)?)
    } else {
        let sb = cx.b.broadcast_in_dim(s, &shape, &kept)?;
        Ok(cx.b.binary(BinaryOp::Div, e, sb)?)
    }
}

fn softmax(cx: &mut Ctx, n: &Node, log: bool) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let dim = norm_dim(cx.int(n, "dim", None)?, cx.b.ty(x).rank())?;
    let x = cx.b.convert(x, out.elem.accumulation());
    let r = softmax_along(cx, x, dim, log)?;
    Ok(vec![Some(cx.b.convert(r, out.elem))])
}

/// cumsum / cumprod in the output's accumulation type (float32 for 16-bit floats, as torch's
/// kernels accumulate), rounded once to the output's type.
fn cumulative(cx: &mut Ctx, n: &Node, op: BinaryOp) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let rank = cx.b.ty(x).rank();
    if rank == 0 {
        return Ok(vec![Some(cx.b.convert(x, out.elem))]);
    }
    let dim = norm_dim(cx.int(n, "dim", None)?, rank)?;
    let x = cx.b.convert(x, out.elem.accumulation());
    let r = scan(cx, x, dim, op)?;
    Ok(vec![Some(cx.b.convert(r, out.elem))])
}

/// cummax / cummin: the running extreme and the position it was taken from. On ties the later
/// position wins and a NaN beats every number (the latest NaN), as torch's kernel has it.
fn cumulative_extreme(cx: &mut Ctx, n: &Node, largest: bool) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    let index_type = cx.out_type(n, 1)?;
    if shape.is_empty() {
        let zero = cx.b.scalar(index_type.elem, 0.0);
        return Ok(vec![Some(x), Some(zero)]);
    }
    let dim = norm_dim(cx.int(n, "dim", None)?, shape.len())?;
    if shape[dim] == 0 {
        let none = cx.b.splat(&index_type, 0.0);
        return Ok(vec![Some(x), Some(none)]);
    }
    let elem = cx.b.elem(x);
    let positions =
        cx.b.iota(TensorType::new(shape.clone(), index_type.elem), dim as i64)?;
    let (op, dir) = if largest {
        (BinaryOp::Max, CompareDir::Ge)
    } else {
        (BinaryOp::Min, CompareDir::Le)
    };
    let identity = [reduction_identity(op, elem), 0.0];
    let r = prefix_scan(
        cx,
        vec![x, positions],
        dim,
        &identity,
        |cx, earlier, later| {
            let mut take_later = cx.b.compare(dir, later[0], earlier[0])?;
            if elem.is_float() {
                let later_nan = cx.b.compare(CompareDir::Ne, later[0], later[0])?;
                let earlier_number = cx.b.compare(CompareDir::Eq, earlier[0], earlier[0])?;
                let wins = cx.b.binary(BinaryOp::And, earlier_number, take_later)?;
                take_later = cx.b.binary(BinaryOp::Or, later_nan, wins)?;
            }
            let v = cx.b.select(take_later, later[0], earlier[0])?;
            let i = cx.b.select(take_later, later[1], earlier[1])?;
            Ok(vec![v, i])
        },
    )?;
    Ok(vec![Some(r[0]), Some(r[1])])
}

/// logcumsumexp: the running log(sum(exp)) combined pairwise as torch's kernel does, so that no
/// prefix underflows: max + log1p(exp(min - max)), and the operand itself where both are the
/// same infinity.
fn logcumsumexp(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?.elem;
    if !out.is_float() {
        return err(format!(
            "not supported: logcumsumexp of {out} (tpuc takes real floats)"
        ));
    }
    let rank = cx.b.ty(x).rank();
    let x = cx.b.convert(x, out.accumulation());
    if rank == 0 {
        return Ok(vec![Some(cx.b.convert(x, out))]);
    }
    let dim = norm_dim(cx.int(n, "dim", None)?, rank)?;
    let r = prefix_scan(
        cx,
        vec![x],
        dim,
        &[f64::NEG_INFINITY],
        |cx, earlier, later| {
            let (a, b) = (earlier[0], later[0]);
            let hi = cx.b.binary(BinaryOp::Max, a, b)?;
            let lo = cx.b.binary(BinaryOp::Min, a, b)?;
            let gap = cx.b.binary(BinaryOp::Sub, lo, hi)?;
            let e = cx.b.unary(UnaryOp::Exp, gap)?;
            let l = cx.b.unary(UnaryOp::Log1p, e)?;
            let sum = cx.b.binary(BinaryOp::Add, hi, l)?;
            let same = cx.b.compare(CompareDir::Eq, lo, hi)?;
            let finite = cx.b.is_finite(lo)?;
            let infinite = cx.b.unary(UnaryOp::Not, finite)?;
            let same_infinity = cx.b.binary(BinaryOp::And, same, infinite)?;
            Ok(vec![cx.b.select(same_infinity, a, sum)?])
        },
    )?;
    Ok(vec![Some(cx.b.convert(r[0], out))])
}

pub fn register(r: &mut Registry) {
    r.add_complex(&["aten.sum.default", "aten.sum.dim_IntList"], |cx, n| {
        simple_reduce(cx, n, BinaryOp::Add)
    });
    r.add_complex(&["aten.prod.default", "aten.prod.dim_int"], |cx, n| {
        simple_reduce(cx, n, BinaryOp::Mul)
    });
    r.add(&["aten.amax.default", "aten.max.default"], |cx, n| {
        simple_reduce(cx, n, BinaryOp::Max)
    });
    r.add(&["aten.amin.default", "aten.min.default"], |cx, n| {
        simple_reduce(cx, n, BinaryOp::Min)
    });
    r.add(
        &["aten.any.default", "aten.any.dim", "aten.any.dims"],
        |cx, n| simple_reduce(cx, n, BinaryOp::Or),
    );
    r.add(
        &["aten.all.default", "aten.all.dim", "aten.all.dims"],
        |cx, n| simple_reduce(cx, n, BinaryOp::And),
    );
    r.add_complex(&["aten.mean.default", "aten.mean.dim"], mean);
    r.add(&["aten.var_mean.correction", "aten.var_mean.dim"], var_mean);
    r.add(
        &["aten.var.dim", "aten.var.correction", "aten.var.default"],
        var,
    );
    r.add(
        &["aten.std.dim", "aten.std.correction", "aten.std.default"],
        std,
    );
    r.add(&["aten.max.dim"], |cx, n| max_min_dim(cx, n, true));
    r.add(&["aten.min.dim"], |cx, n| max_min_dim(cx, n, false));
    r.add(&["aten.argmax.default"], |cx, n| arg_max_min(cx, n, true));
    r.add(&["aten.argmin.default"], |cx, n| arg_max_min(cx, n, false));
    r.add(&["aten.softmax.int", "aten._softmax.default"], |cx, n| {
        softmax(cx, n, false)
    });
    r.add(
        &["aten.log_softmax.int", "aten._log_softmax.default"],
        |cx, n| softmax(cx, n, true),
    );
    r.add(&["aten.cumsum.default"], |cx, n| {
        cumulative(cx, n, BinaryOp::Add)
    });
    r.add(&["aten.cumprod.default"], |cx, n| {
        cumulative(cx, n, BinaryOp::Mul)
    });
    r.add(&["aten.cummax.default"], |cx, n| {
        cumulative_extreme(cx, n, true)
    });
    r.add(&["aten.cummin.default"], |cx, n| {
        cumulative_extreme(cx, n, false)
    });
    r.add(&["aten.logcumsumexp.default"], logcumsumexp);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    fn argmax(dtype: DType) -> String {
        let mut g = TestGraph::default();
        let x = g.input("x", dtype, &[3, 4]);
        let i = g.node1(
            "aten.argmax.default",
            vec![("self", t(&x)), ("dim", Arg::Int(1))],
            DType::I64,
            &[3],
        );
        g.text(&[&i])
    }

    #[test]
    fn argmax_states_torch_rules_in_the_ir() {
        // For floats a NaN wins; for integers there is no NaN to rank.
        assert_checks(
            &argmax(DType::F32),
            &["stablehlo.reduce", "dims=[1] body=argmax(nan wins)"],
        );
        let ints = argmax(DType::I32);
        assert_checks(&ints, &["stablehlo.reduce", "dims=[1] body=argmax :"]);
        assert!(!ints.contains("nan wins"), "{ints}");
    }
}
