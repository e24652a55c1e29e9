//! torch's semantics that several op families share, in one place rather than borrowed from
//! one family's file by another: broadcasting and dimension indices, type promotion of
//! arithmetic, matrix products (precision, 16-bit floats computed in float32), the shifted
//! exponentials of a softmax and scans, gathering and scattering by index, complex arguments,
//! per-dimension arguments of windows.

use tpuc_fx::Node;

use super::ctx::{err, Ctx, OpError, OpResult, Operand};
use super::promote::{result_type, Participant};
use crate::ir::*;

/// The common shape of two shapes under numpy broadcasting.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            _ if da == db => da,
            (1, d) | (d, 1) => d,
            _ => return None,
        };
    }
    Some(out)
}

/// Normalises a possibly negative dimension index.
pub fn norm_dim(dim: i64, rank: usize) -> OpResult<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return err(format!(
            "dimension {dim} is out of range for a tensor of rank {rank}"
        ));
    }
    Ok(d as usize)
}

// ----- Type promotion and arithmetic on promoted operands ------------------------------

/// The promoted element type of operands, as torch computes it.
pub(super) fn promoted(cx: &Ctx, ops: &[Operand]) -> OpResult<DType> {
    let parts: Vec<Participant> = ops.iter().map(|&o| cx.participant(o)).collect();
    let d = result_type(&parts).ok_or_else(|| OpError("no operands to promote".into()))?;
    Ok(d)
}

/// Materializes operands as tensors of `elem`, broadcast to a common shape.
pub(super) fn prepare(cx: &mut Ctx, ops: &[Operand], elem: DType) -> OpResult<Vec<Value>> {
    let vs: Vec<Value> = ops.iter().map(|&o| cx.materialize(o, elem)).collect();
    cx.broadcast_all(&vs)
}

pub(super) fn arith(cx: &mut Ctx, a: Operand, b: Operand, op: BinaryOp) -> OpResult<Value> {
    let elem = promoted(cx, &[a, b])?;
    let v = prepare(cx, &[a, b], elem)?;
    Ok(cx.b.binary(op, v[0], v[1])?)
}

pub(super) fn floor_div(cx: &mut Ctx, a: Operand, b: Operand) -> OpResult<Value> {
    let elem = promoted(cx, &[a, b])?;
    let v = prepare(cx, &[a, b], elem)?;
    let (x, y) = (v[0], v[1]);
    if elem.is_float() {
        let q = cx.b.binary(BinaryOp::Div, x, y)?;
        return Ok(cx.b.unary(UnaryOp::Floor, q)?);
    }
    // Integer division truncates; step down when the signs differ and there is a remainder.
    let q = cx.b.binary(BinaryOp::Div, x, y)?;
    if elem.is_unsigned() || elem.is_bool() {
        return Ok(q);
    }
    let r = cx.b.binary(BinaryOp::Rem, x, y)?;
    let zero = cx.full_like(x, 0.0, None);
    let one = cx.full_like(x, 1.0, None);
    let has_rem = cx.b.compare(CompareDir::Ne, r, zero)?;
    let r_neg = cx.b.compare(CompareDir::Lt, r, zero)?;
    let y_neg = cx.b.compare(CompareDir::Lt, y, zero)?;
    let signs_differ = cx.b.compare(CompareDir::Ne, r_neg, y_neg)?;
    let adjust = cx.b.binary(BinaryOp::And, has_rem, signs_differ)?;
    let q1 = cx.b.binary(BinaryOp::Sub, q, one)?;
    Ok(cx.b.select(adjust, q1, q)?)
}

// ----- Matrix products: precision and 16-bit floats computed in float32 ----------------

/// The precision of a dot or convolution computed in `elem`: the option for 32/64-bit floats.
pub(super) fn precision(cx: &Ctx, elem: DType) -> Precision {
    if elem == DType::F32 || elem == DType::F64 {
        cx.opts.precision
    } else {
        Precision::Default
    }
}

/// Widens 16-bit float operands to float32, in which torch's CPU kernels compute matmuls and
/// convolutions; returns the dtype to round the result to once at the end.
pub(super) fn widened(cx: &mut Ctx, values: &mut [Value]) -> Option<DType> {
    let elem = cx.b.elem(values[0]);
    if elem.accumulation() == elem {
        return None;
    }
    for v in values.iter_mut() {
        *v = cx.b.convert(*v, DType::F32);
    }
    Some(elem)
}

pub(super) fn narrowed(cx: &mut Ctx, v: Value, to: Option<DType>) -> Value {
    match to {
        Some(elem) => cx.b.convert(v, elem),
        None => v,
    }
}

/// dot_general as torch computes it: 16-bit floats are multiplied and accumulated in float32
/// and rounded once at the end.
pub(super) fn dot(cx: &mut Ctx, a: Value, b: Value, dims: DotDims) -> OpResult<Value> {
    let mut operands = [a, b];
    let half = widened(cx, &mut operands);
    let [a, b] = operands;
    let p = precision(cx, cx.b.elem(a));
    let r = cx.b.dot_general(a, b, dims, p)?;
    Ok(narrowed(cx, r, half))
}

// ----- Reductions other families build on ----------------------------------------------

/// The stabilised exponentials of a softmax along `dim`: the maximum along it, `x` less that
/// maximum, and the exponentials of that.
pub(super) fn shifted_exp(cx: &mut Ctx, x: Value, dim: usize) -> OpResult<(Value, Value, Value)> {
    let shape = cx.b.shape(x).to_vec();
    let kept: Vec<i64> = (0..shape.len() as i64)
        .filter(|&d| d != dim as i64)
        .collect();
    let m = cx.b.reduce_by(x, &[dim as i64], BinaryOp::Max)?;
    let mb = cx.b.broadcast_in_dim(m, &shape, &kept)?;
    let shifted = cx.b.binary(BinaryOp::Sub, x, mb)?;
    let e = cx.b.unary(UnaryOp::Exp, shifted)?;
    Ok((m, shifted, e))
}

/// The inclusive scan of `x` along `dim` with `op` (cumulative sum, product, ...): a
/// reduce_window over everything up to each position.
pub(super) fn scan(cx: &mut Ctx, x: Value, dim: usize, op: BinaryOp) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    if shape[dim] == 0 {
        return Ok(x);
    }
    let mut window = vec![1; shape.len()];
    window[dim] = shape[dim];
    let mut padding = vec![(0, 0); shape.len()];
    padding[dim] = (shape[dim] - 1, 0);
    let strides = vec![1; shape.len()];
    let elem = cx.b.elem(x);
    let init = cx.b.scalar(elem, reduction_identity(op, elem));
    Ok(cx
        .b
        .reduce_window(x, init, &window, &strides, &padding, op)?)
}

/// The inclusive scan along `dim` of tuples of values (one shape) under an associative
/// `combine(earlier, later)`, in log2(size) steps (each position combined with the one 2^k
/// before it, the start filled with `identity`, one number per value): for scans no
/// reduce_window body expresses (cummax with its indices, logcumsumexp).
pub(super) fn prefix_scan(
    cx: &mut Ctx,
    values: Vec<Value>,
    dim: usize,
    identity: &[f64],
    combine: impl Fn(&mut Ctx, &[Value], &[Value]) -> OpResult<Vec<Value>>,
) -> OpResult<Vec<Value>> {
    let shape = cx.b.shape(values[0]).to_vec();
    let size = shape[dim];
    let mut current = values;
    let mut step = 1;
    while step < size {
        let mut earlier = Vec::with_capacity(current.len());
        for (&v, &fill) in current.iter().zip(identity) {
            let kept = cx.b.slice_dim(v, dim, 0, size - step, 1)?;
            let elem = cx.b.elem(v);
            let pad_value = cx.b.scalar(elem, fill);
            let mut low = vec![0; shape.len()];
            low[dim] = step;
            let zeros = vec![0; shape.len()];
            earlier.push(cx.b.pad(kept, pad_value, &low, &zeros, &zeros)?);
        }
        current = combine(cx, &earlier, &current)?;
        step *= 2;
    }
    Ok(current)
}

/// The signed integer type as wide as `elem` (whose bits a float's can be read as).
pub(super) fn same_width_integer(elem: DType) -> DType {
    DType::from_kind(tpuc_dtype::Kind::Signed, elem.byte_size()).expect("1, 2, 4 or 8 bytes")
}

// ----- Gathering and scattering by index -----------------------------------------------

/// Wraps negative indices (`i < 0` -> `i + size`), as torch's indexing does.
pub(super) fn wrap_negative(cx: &mut Ctx, idx: Value, size: i64) -> OpResult<Value> {
    let idx = cx.b.convert(idx, DType::I64);
    let zero = cx.full_like(idx, 0.0, None);
    let n = cx.full_like(idx, size as f64, None);
    let neg = cx.b.compare(CompareDir::Lt, idx, zero)?;
    let wrapped = cx.b.binary(BinaryOp::Add, idx, n)?;
    Ok(cx.b.select(neg, wrapped, idx)?)
}

/// Takes whole slices of `x` along `dim` at `idx` (any shape); the index dims replace `dim`.
pub(super) fn take_along(cx: &mut Ctx, x: Value, dim: usize, idx: Value) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let ishape = cx.b.shape(idx).to_vec();
    let idx = cx.b.convert(idx, DType::I64);
    let mut slice_sizes = shape.clone();
    slice_sizes[dim] = 1;
    let offset_dims: Vec<i64> = (0..shape.len() as i64 - 1)
        .map(|d| {
            if d < dim as i64 {
                d
            } else {
                d + ishape.len() as i64
            }
        })
        .collect();
    let dims = GatherDims {
        offset_dims,
        collapsed_slice_dims: vec![dim as i64],
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: vec![dim as i64],
        index_vector_dim: ishape.len() as i64,
        slice_sizes,
    };
    Ok(cx.b.gather(x, idx, dims)?)
}

/// The flat positions of a strided view: `offset + sum(i_k * stride_k)` over every index of
/// `size`, in row-major order.
pub(super) fn strided_positions(size: &[i64], stride: &[i64], offset: i64) -> Vec<i64> {
    let mut out = vec![offset];
    for (&n, &s) in size.iter().zip(stride) {
        out = out
            .iter()
            .flat_map(|&base| (0..n).map(move |i| base + i * s))
            .collect();
    }
    out
}

/// The elements of `x`, in its row-major order, at the flat positions `indices` (a constant),
/// shaped `shape`.
pub(super) fn take_flat(cx: &mut Ctx, x: Value, indices: &[i64], shape: &[i64]) -> OpResult<Value> {
    let numel = cx.b.ty(x).numel();
    if let Some(bad) = indices.iter().find(|&&i| i < 0 || i >= numel) {
        return err(format!(
            "position {bad} is outside the input's {numel} elements"
        ));
    }
    let flat = cx.b.reshape(x, &[numel])?;
    let values: Vec<f64> = indices.iter().map(|&i| i as f64).collect();
    let idx =
        cx.b.dense(TensorType::new(shape.to_vec(), DType::I64), &values)?;
    take_along(cx, flat, 0, idx)
}

/// `x` with the elements at the flat (row-major) positions `positions` (a constant) replaced by
/// `values`, taken in row-major order.
pub(super) fn put_flat(
    cx: &mut Ctx,
    x: Value,
    positions: &[i64],
    values: Value,
) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let numel = cx.b.ty(x).numel();
    let count = positions.len() as i64;
    if count == 0 {
        return Ok(x);
    }
    let flat = cx.b.reshape(x, &[numel])?;
    let values = cx.b.convert(values, cx.b.elem(x));
    let values = cx.b.reshape(values, &[count])?;
    let index: Vec<f64> = positions.iter().map(|&p| p as f64).collect();
    let index =
        cx.b.dense(TensorType::new(vec![count], DType::I64), &index)?;
    let put = scatter_into(cx, flat, 0, index, values, ScatterMode::Replace)?;
    Ok(cx.b.reshape(put, &shape)?)
}

/// Scatters `updates` into `x` along `dim` at `index` (both shaped alike, of x's rank):
/// `x[i][index[i][j]] op= updates[i][j]` for dim 1.
pub(super) fn scatter_into(
    cx: &mut Ctx,
    x: Value,
    dim: usize,
    index: Value,
    updates: Value,
    mode: ScatterMode,
) -> OpResult<Value> {
    let rank = cx.b.ty(x).rank();
    let index_shape = cx.b.shape(index).to_vec();
    let size = cx.b.shape(x)[dim];
    let index = wrap_negative(cx, index, size)?;
    // Full coordinates of each update: its own position, with `index` along `dim`.
    let mut coordinate_shape = index_shape.clone();
    coordinate_shape.push(1);
    let mut coordinates = Vec::with_capacity(rank);
    for d in 0..rank {
        let c = if d == dim {
            index
        } else {
            cx.b.iota(TensorType::new(index_shape.clone(), DType::I64), d as i64)?
        };
        coordinates.push(cx.b.reshape(c, &coordinate_shape)?);
    }
    let coordinates = cx.b.concatenate(&coordinates, rank as i64)?;
    let all: Vec<i64> = (0..rank as i64).collect();
    let dims = ScatterDims {
        update_window_dims: vec![],
        inserted_window_dims: all.clone(),
        input_batching_dims: vec![],
        scatter_indices_batching_dims: vec![],
        scatter_dims_to_operand_dims: all,
        index_vector_dim: rank as i64,
    };
    Ok(cx.b.scatter(x, coordinates, updates, dims, mode)?)
}

// ----- Complex numbers -----------------------------------------------------------------

/// The tensor argument `name`, which must be complex (else an error naming it).
pub(super) fn complex_arg(cx: &Ctx, n: &Node, name: &str) -> OpResult<Value> {
    let x = cx.tensor(n, name)?;
    if !cx.b.elem(x).is_complex() {
        return err(format!("{name} must be complex, got {}", cx.b.elem(x)));
    }
    Ok(x)
}

/// The complex conjugate: the imaginary part negated.
pub(super) fn conj(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let re = cx.b.real(x)?;
    let im = cx.b.imag(x)?;
    let minus_im = cx.b.unary(UnaryOp::Neg, im)?;
    Ok(cx.b.complex(re, minus_im)?)
}

// ----- Per-dimension arguments of convolutions and pooling -----------------------------

/// A per-spatial-dimension list: one value repeated, or one per dimension.
pub(super) fn per_dim(v: Vec<i64>, spatial: usize, default: i64, what: &str) -> OpResult<Vec<i64>> {
    match v.len() {
        0 => Ok(vec![default; spatial]),
        1 => Ok(vec![v[0]; spatial]),
        n if n == spatial => Ok(v),
        n => err(format!(
            "{what} has {n} values for {spatial} spatial dimensions"
        )),
    }
}
