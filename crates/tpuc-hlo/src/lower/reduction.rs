//! Reductions, softmax and cumulative ops.

use tpuc_fx::Node;

use super::prelude::*;
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

/// prims.sum / prod / amax / amin (inp, dims): the reduction over `dims` (which
/// prims list them explicitly), in the recorded dtype.
fn prims_reduce(cx: &mut Ctx, n: &Node, op: BinaryOp) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "inp")?;
    let rank = cx.b.ty(x).rank();
    let dims = cx
        .ints(n, "dims", None)?
        .iter()
        .map(|&d| norm_dim(d, rank).map(|d| d as i64))
        .collect::<OpResult<Vec<_>>>()?;
    let out = cx.out_type(n, 0)?;
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

/// `histc(x, bins, min, max)`: counts of x in `bins` equal bins over [min, max] (the data's
/// range when min = max, widened by one on each side when that is a single value); values
/// outside are not counted, and max falls into the last bin.
fn histc(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let elem = cx.b.elem(x);
    if !elem.is_float() {
        return err(format!("histc needs a float tensor, got {elem}"));
    }
    let bins = cx.int(n, "bins", Some(100))?;
    if bins <= 0 {
        return err(format!("histc needs bins > 0, got {bins}"));
    }
    let (lo, hi) = (
        cx.float(n, "min", Some(0.0))?,
        cx.float(n, "max", Some(0.0))?,
    );
    if lo > hi {
        return err(format!("histc needs max >= min, got min {lo} and max {hi}"));
    }
    let count = cx.b.ty(x).numel();
    let flat = cx.b.reshape(x, &[count])?;
    let wide = cx.b.convert(flat, DType::F64);
    let (mut lo_v, mut hi_v) = (cx.b.scalar(DType::F64, lo), cx.b.scalar(DType::F64, hi));
    if lo == hi {
        let data_lo = cx.b.reduce_by(wide, &[0], BinaryOp::Min)?;
        let data_hi = cx.b.reduce_by(wide, &[0], BinaryOp::Max)?;
        let one = cx.b.scalar(DType::F64, 1.0);
        let same = cx.b.compare(CompareDir::Eq, data_lo, data_hi)?;
        let below = cx.b.binary(BinaryOp::Sub, data_lo, one)?;
        let above = cx.b.binary(BinaryOp::Add, data_hi, one)?;
        lo_v = cx.b.select(same, below, data_lo)?;
        hi_v = cx.b.select(same, above, data_hi)?;
    }
    let lo_b = cx.b.broadcast_in_dim(lo_v, &[count], &[])?;
    let hi_b = cx.b.broadcast_in_dim(hi_v, &[count], &[])?;
    let offset = cx.b.binary(BinaryOp::Sub, wide, lo_b)?;
    let width = cx.b.binary(BinaryOp::Sub, hi_b, lo_b)?;
    let scaled = cx.scaled(offset, bins as f64)?;
    let position = cx.b.binary(BinaryOp::Div, scaled, width)?;
    let position = cx.b.unary(UnaryOp::Floor, position)?;
    let last = cx.full_like(position, (bins - 1) as f64, None);
    let at_max = cx.b.compare(CompareDir::Eq, wide, hi_b)?;
    let position = cx.b.select(at_max, last, position)?;
    let inside_lo = cx.b.compare(CompareDir::Ge, wide, lo_b)?;
    let inside_hi = cx.b.compare(CompareDir::Le, wide, hi_b)?;
    let inside = cx.b.binary(BinaryOp::And, inside_lo, inside_hi)?;
    let position = cx.b.convert(position, DType::I64);
    let grid = TensorType::new(vec![count, bins], DType::I64);
    let position = cx.b.broadcast_in_dim(position, &grid.shape, &[0])?;
    let inside = cx.b.broadcast_in_dim(inside, &grid.shape, &[0])?;
    let bin = cx.b.iota(grid, 1)?;
    let hit = cx.b.compare(CompareDir::Eq, position, bin)?;
    let hit = cx.b.binary(BinaryOp::And, hit, inside)?;
    let ones = cx.b.convert(hit, DType::F64);
    let counts = cx.b.reduce_by(ones, &[0], BinaryOp::Add)?;
    Ok(vec![Some(cx.b.convert(counts, elem))])
}

/// `mode(x, dim)`: the most frequent value along `dim` (the smallest of those equally
/// frequent) and a position of it (the last), by comparing every pair of elements.
fn mode(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    let (values_ty, index_ty) = (cx.out_type(n, 0)?, cx.out_type(n, 1)?);
    if shape.is_empty() {
        let zero = cx.b.scalar(index_ty.elem, 0.0);
        return Ok(vec![Some(x), Some(zero)]);
    }
    let rank = shape.len();
    let dim = norm_dim(cx.int(n, "dim", Some(-1))?, rank)?;
    let size = shape[dim];
    // Pairs (i, j) along dim in two trailing dimensions: [..., i, j].
    let mut moved: Vec<i64> = (0..rank as i64).filter(|&d| d != dim as i64).collect();
    moved.push(dim as i64);
    let xm = cx.b.transpose(x, &moved)?;
    let lead = cx.b.shape(xm)[..rank - 1].to_vec();
    let mut pairs = lead.clone();
    pairs.extend([size, size]);
    let dims_i: Vec<i64> = (0..rank as i64 - 1).chain([rank as i64 - 1]).collect();
    let dims_j: Vec<i64> = (0..rank as i64 - 1).chain([rank as i64]).collect();
    let xi = cx.b.broadcast_in_dim(xm, &pairs, &dims_i)?;
    let xj = cx.b.broadcast_in_dim(xm, &pairs, &dims_j)?;
    let equal = cx.b.compare(CompareDir::Eq, xi, xj)?;
    let ones = cx.b.convert(equal, DType::I64);
    let counts = cx.b.reduce_by(ones, &[rank as i64], BinaryOp::Add)?;
    let last = rank as i64 - 1;
    let most = cx.b.reduce_by(counts, &[last], BinaryOp::Max)?;
    let most = cx.b.broadcast_in_dim(
        most,
        cx.b.shape(counts).to_vec().as_slice(),
        &(0..last).collect::<Vec<_>>(),
    )?;
    let frequent = cx.b.compare(CompareDir::Eq, counts, most)?;
    let elem = cx.b.elem(xm);
    let highest = cx.full_like(xm, reduction_identity(BinaryOp::Min, elem), None);
    let candidates = cx.b.select(frequent, xm, highest)?;
    let value = cx.b.reduce_by(candidates, &[last], BinaryOp::Min)?;
    let value_b = cx.b.broadcast_in_dim(
        value,
        cx.b.shape(xm).to_vec().as_slice(),
        &(0..last).collect::<Vec<_>>(),
    )?;
    let at = cx.b.compare(CompareDir::Eq, xm, value_b)?;
    let positions =
        cx.b.iota(TensorType::new(cx.b.shape(xm).to_vec(), DType::I64), last)?;
    let none = cx.full_like(positions, -1.0, None);
    let where_at = cx.b.select(at, positions, none)?;
    let index = cx.b.reduce_by(where_at, &[last], BinaryOp::Max)?;
    let index = cx.b.convert(index, index_ty.elem);
    Ok(vec![
        Some(cx.b.reshape(value, &values_ty.shape)?),
        Some(cx.b.reshape(index, &index_ty.shape)?),
    ])
}

/// `hash_tensor(x, dim, keepdim, mode=0)`: the elements widened to their 64-bit type (float64,
/// int64 or uint64), read as uint64 and combined by xor.
fn hash_tensor(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    if cx.int(n, "mode", Some(0))? != 0 {
        return err("not supported: hash_tensor with a mode other than 0 (xor of the bits)");
    }
    let x = cx.tensor(n, "self")?;
    let elem = cx.b.elem(x);
    let wide = match elem.kind() {
        tpuc_dtype::Kind::Float => DType::F64,
        tpuc_dtype::Kind::Signed => DType::I64,
        tpuc_dtype::Kind::Unsigned | tpuc_dtype::Kind::Bool => DType::U64,
        tpuc_dtype::Kind::Complex => return err("not supported: hash_tensor of complex tensors"),
    };
    let w = cx.b.convert(x, wide);
    let bits = cx.b.bitcast(w, DType::U64)?;
    let dims = reduce_dims(cx, n, x)?;
    let h = cx.b.reduce_by(bits, &dims, BinaryOp::Xor)?;
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.reshape(h, &out.shape)?)])
}

/// `segment_reduce(data, reduce, lengths | offsets, axis=0, initial)` over 1-d lengths: each
/// segment's elements (along axis 0) reduced with sum, mean, max, min or prod, starting from
/// `initial` where given; an empty segment is the reduction's identity (its mean NaN).
fn segment_reduce(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let data = cx.tensor(n, "data")?;
    let how = cx.opt_str(n, "reduce")?.unwrap_or("sum");
    if cx.int(n, "axis", Some(0))? != 0 {
        return err("not supported: segment_reduce along an axis other than 0");
    }
    let lengths = match (cx.opt_tensor(n, "lengths")?, cx.opt_tensor(n, "offsets")?) {
        (Some(l), _) => l,
        (None, Some(o)) => {
            let count = cx.b.ty(o).numel();
            let later = cx.b.slice_dim(o, 0, 1, count, 1)?;
            let earlier = cx.b.slice_dim(o, 0, 0, count - 1, 1)?;
            cx.b.binary(BinaryOp::Sub, later, earlier)?
        }
        (None, None) => return err("segment_reduce needs lengths or offsets"),
    };
    if cx.b.ty(lengths).rank() != 1 {
        return err("not supported: segment_reduce with batched (multi-dimensional) lengths");
    }
    let op = match how {
        "sum" | "mean" => BinaryOp::Add,
        "max" => BinaryOp::Max,
        "min" => BinaryOp::Min,
        "prod" => BinaryOp::Mul,
        other => return err(format!("segment_reduce: unknown reduction {other:?}")),
    };
    let initial = cx.opt_float(n, "initial")?;
    if initial.is_some() && how == "mean" {
        return err("not supported: segment_reduce mean with an initial value");
    }
    let shape = cx.b.shape(data).to_vec();
    let segments = cx.b.shape(lengths)[0];
    let count = shape[0];
    let elem = cx.b.elem(data);
    let lengths = cx.b.convert(lengths, DType::I64);
    let ends = scan(cx, lengths, 0, BinaryOp::Add)?;
    let starts = cx.b.binary(BinaryOp::Sub, ends, lengths)?;
    // membership[s, i]: element i belongs to segment s.
    let grid = [segments, count];
    let position = cx.b.iota(TensorType::new(grid.to_vec(), DType::I64), 1)?;
    let starts = cx.b.broadcast_in_dim(starts, &grid, &[0])?;
    let ends = cx.b.broadcast_in_dim(ends, &grid, &[0])?;
    let after = cx.b.compare(CompareDir::Ge, position, starts)?;
    let before = cx.b.compare(CompareDir::Lt, position, ends)?;
    let member = cx.b.binary(BinaryOp::And, after, before)?;
    let mut wide = vec![segments];
    wide.extend_from_slice(&shape);
    let member = cx.b.broadcast_in_dim(member, &wide, &[0, 1])?;
    let dims: Vec<i64> = (1..=shape.len() as i64).collect();
    let values = cx.b.broadcast_in_dim(data, &wide, &dims)?;
    let identity = cx.full_like(values, reduction_identity(op, elem), None);
    let kept = cx.b.select(member, values, identity)?;
    let mut r = cx.b.reduce_by(kept, &[1], op)?;
    if let Some(initial) = initial {
        let init = cx.full_like(r, initial, None);
        r = cx.b.binary(op, r, init)?;
    }
    if how == "mean" {
        let counts = cx.b.convert(member, elem);
        let counts = cx.b.reduce_by(counts, &[1], BinaryOp::Add)?;
        r = cx.b.binary(BinaryOp::Div, r, counts)?;
    }
    Ok(vec![Some(r)])
}

pub fn register(r: &mut Registry) {
    r.add(&["aten.hash_tensor.default"], hash_tensor);
    r.add(&["prims.sum.default"], |cx, n| {
        prims_reduce(cx, n, BinaryOp::Add)
    });
    r.add(&["prims.prod.default"], |cx, n| {
        prims_reduce(cx, n, BinaryOp::Mul)
    });
    r.add(&["prims.amax.default"], |cx, n| {
        prims_reduce(cx, n, BinaryOp::Max)
    });
    r.add(&["prims.amin.default"], |cx, n| {
        prims_reduce(cx, n, BinaryOp::Min)
    });
    r.add(&["aten.segment_reduce.default"], segment_reduce);
    r.add(&["aten.histc.default"], histc);
    r.add(&["aten.mode.default"], mode);
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
