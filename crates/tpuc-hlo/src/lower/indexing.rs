//! Gathers: embedding, embedding bags, index_select, gather, advanced indexing (`x[idx]`),
//! and the index lists of triangles (triu_indices / tril_indices).

use tpuc_fx::Node;

use super::prelude::*;
use crate::ir::reduction_identity;

fn embedding(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let w = cx.tensor(n, "weight")?;
    let idx = cx.tensor(n, "indices")?;
    Ok(vec![Some(take_along(cx, w, 0, idx)?)])
}

/// The bag of each of `count` indices: how many of the `bags` bag starts (`offsets`) are at or
/// before its position, minus one.
fn bag_of_indices(cx: &mut Ctx, offsets: Value, count: i64, bags: i64) -> OpResult<Value> {
    let offsets = cx.b.convert(offsets, DType::I64);
    let starts = cx.b.slice(offsets, &[0], &[bags], &[1])?;
    let position =
        cx.b.iota(TensorType::new(vec![count, bags], DType::I64), 0)?;
    let starts_b = cx.b.broadcast_in_dim(starts, &[count, bags], &[1])?;
    let started = cx.b.compare(CompareDir::Ge, position, starts_b)?;
    let started = cx.b.convert(started, DType::I64);
    let started = cx.b.reduce_by(started, &[1], BinaryOp::Add)?;
    let one = cx.full_like(started, 1.0, None);
    Ok(cx.b.binary(BinaryOp::Sub, started, one)?)
}

/// torch's embedding bag (modes sum, mean and max) with the side outputs of torch's CPU kernel,
/// which its backward reads and a program may return:
/// - offset2bag: each index's bag (empty where torch's fast sum path skips it: the recorded
///   shape says which);
/// - bag_size: each bag's count of indices that are not `padding_idx`, the last bag reaching to
///   the end of `indices`; all zeros in mode sum (torch zeroes it);
/// - max_indices: in mode max the row each output element came from (the first maximum in bag
///   order; 0 for an empty bag), otherwise a copy of bag_size.
fn embedding_bag(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let weight = cx.tensor(n, "weight")?;
    let indices = cx.tensor(n, "indices")?;
    let offsets = cx.tensor(n, "offsets")?;
    let mode = cx.int(n, "mode", Some(0))?;
    if !(0..=2).contains(&mode) {
        return err(format!(
            "embedding_bag: unknown mode {mode} (0 sum, 1 mean, 2 max)"
        ));
    }
    let include_last = cx.bool(n, "include_last_offset", false)?;
    let padding_idx = cx.int(n, "padding_idx", Some(-1))?;
    let per_sample = cx.opt_tensor(n, "per_sample_weights")?;
    if per_sample.is_some() && mode != 0 {
        return err("per_sample_weights are only defined for mode sum");
    }
    if cx.b.ty(indices).rank() != 1 || cx.b.ty(offsets).rank() != 1 {
        return err("not supported: embedding_bag with 2-d indices (flatten them with offsets)");
    }
    let count = cx.b.shape(indices)[0];
    let offsets_len = cx.b.shape(offsets)[0];
    let bags = if include_last {
        offsets_len - 1
    } else {
        offsets_len
    };
    let elem = cx.b.elem(weight);
    let rows = cx.b.shape(weight)[0];
    let width = cx.b.shape(weight)[1];
    let i64t = |shape: &[i64]| TensorType::new(shape.to_vec(), DType::I64);

    let indices = cx.b.convert(indices, DType::I64);
    let offsets = cx.b.convert(offsets, DType::I64);
    let bag_of = bag_of_indices(cx, offsets, count, bags)?;

    // Indices that count: not padding_idx. The sums stop at the end offset when it is given;
    // torch's bag sizes (and its max) reach to the end of `indices`.
    let position = cx.b.iota(i64t(&[count]), 0)?;
    let mut counted = cx.full_like(position, 1.0, Some(DType::Bool));
    if padding_idx >= 0 && padding_idx < rows {
        let pad = cx.full_like(indices, padding_idx as f64, None);
        counted = cx.b.compare(CompareDir::Ne, indices, pad)?;
    }
    let mut summed = counted;
    if include_last {
        let end = cx.b.slice(offsets, &[bags], &[bags + 1], &[1])?;
        let end = cx.b.reshape(end, &[])?;
        let end = cx.b.broadcast_in_dim(end, &[count], &[])?;
        let before_end = cx.b.compare(CompareDir::Lt, position, end)?;
        summed = cx.b.binary(BinaryOp::And, summed, before_end)?;
    }
    // membership[i][b]: index i is in bag b.
    let bag_ids = cx.b.iota(i64t(&[count, bags]), 1)?;
    let bag_of_b = cx.b.broadcast_in_dim(bag_of, &[count, bags], &[0])?;
    let member = cx.b.compare(CompareDir::Eq, bag_of_b, bag_ids)?;
    let in_bag = |cx: &mut Ctx, which: Value| -> OpResult<Value> {
        let which = cx.b.broadcast_in_dim(which, &[count, bags], &[0])?;
        Ok(cx.b.binary(BinaryOp::And, member, which)?)
    };
    let counted_member = in_bag(cx, counted)?;
    let sizes = cx.b.convert(counted_member, DType::I64);
    let sizes = cx.b.reduce_by(sizes, &[0], BinaryOp::Add)?;
    let gathered = take_along(cx, weight, 0, indices)?;

    let (output, max_rows) = if mode == 2 {
        let (output, max_rows) = bag_maxima(cx, gathered, indices, bag_of, counted, sizes, bags)?;
        (output, Some(max_rows))
    } else {
        let summed_member = in_bag(cx, summed)?;
        let mut weights = cx.b.convert(summed_member, elem);
        if let Some(w) = per_sample {
            let w = cx.b.convert(w, elem);
            let w = cx.b.broadcast_in_dim(w, &[count, bags], &[0])?;
            weights = cx.b.binary(BinaryOp::Mul, weights, w)?;
        }
        let dims = DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contracting: vec![0],
            rhs_contracting: vec![0],
        };
        let precision = precision(cx, elem);
        let mut output = cx.b.dot_general(weights, gathered, dims, precision)?;
        if mode == 1 {
            let at_least_one = cx.full_like(sizes, 1.0, None);
            let divisor = cx.b.binary(BinaryOp::Max, sizes, at_least_one)?;
            let divisor = cx.b.convert(divisor, elem);
            let divisor = cx.b.broadcast_in_dim(divisor, &[bags, width], &[0])?;
            output = cx.b.binary(BinaryOp::Div, output, divisor)?;
        }
        (output, None)
    };

    let offset2bag_ty = cx.out_type(n, 1)?;
    let offset2bag = if offset2bag_ty.shape == [count] {
        cx.b.convert(bag_of, offset2bag_ty.elem)
    } else {
        cx.b.splat(&offset2bag_ty, 0.0)
    };
    // torch records bag_size as (offsets.size(),) for `_embedding_bag_forward_only` where its
    // kernel returns one per bag in modes mean and max: the sizes fill the recorded shape.
    let recorded_sizes = |cx: &mut Ctx, ty: &TensorType| -> OpResult<Value> {
        if mode == 0 || ty.rank() != 1 {
            return Ok(cx.b.splat(ty, 0.0));
        }
        let fitted = match ty.shape[0] {
            len if len <= bags => cx.b.slice(sizes, &[0], &[len], &[1])?,
            len => {
                let zero = cx.b.scalar(DType::I64, 0.0);
                cx.b.pad(sizes, zero, &[0], &[len - bags], &[0])?
            }
        };
        Ok(cx.b.convert(fitted, ty.elem))
    };
    let bag_size_ty = cx.out_type(n, 2)?;
    let bag_size = recorded_sizes(cx, &bag_size_ty)?;
    let max_indices_ty = cx.out_type(n, 3)?;
    let max_indices = match max_rows {
        Some(rows) => cx.b.convert(rows, max_indices_ty.elem),
        None => recorded_sizes(cx, &max_indices_ty)?,
    };
    Ok(vec![
        Some(output),
        Some(offset2bag),
        Some(bag_size),
        Some(max_indices),
    ])
}

/// Mode max of an embedding bag: each bag's elementwise maximum over its `counted` rows
/// (`gathered`, one per index; 0 for an empty bag) and the row index it came from (the first
/// maximum in bag order, as torch's kernel keeps the first of equal values; 0 when empty).
fn bag_maxima(
    cx: &mut Ctx,
    gathered: Value,
    indices: Value,
    bag_of: Value,
    counted: Value,
    sizes: Value,
    bags: i64,
) -> OpResult<(Value, Value)> {
    let count = cx.b.shape(gathered)[0];
    let width = cx.b.shape(gathered)[1];
    let elem = cx.b.elem(gathered);
    let shape = [count, width];
    // Indices that do not count go to bag `bags`, past the end: the scatter drops them.
    let nowhere = cx.full_like(bag_of, bags as f64, None);
    let target = cx.b.select(counted, bag_of, nowhere)?;
    let target = cx.b.broadcast_in_dim(target, &shape, &[0])?;
    let lowest =
        cx.b.splat(&TensorType::new(vec![bags, width], elem), f64::NEG_INFINITY);
    let maxima = scatter_into(
        cx,
        lowest,
        0,
        target,
        gathered,
        ScatterMode::Combine(BinaryOp::Max),
    )?;
    // The first position in each bag holding its maximum, then the row it took.
    let first_bag = cx.full_like(bag_of, 0.0, None);
    let safe_bag = cx.b.select(counted, bag_of, first_bag)?;
    let bag_max = take_along(cx, maxima, 0, safe_bag)?;
    let at_max = cx.b.compare(CompareDir::Eq, gathered, bag_max)?;
    let position = cx.b.iota(TensorType::new(shape.to_vec(), DType::I64), 0)?;
    let past = cx.full_like(position, count as f64, None);
    let candidate = cx.b.select(at_max, position, past)?;
    let first = cx.b.splat(
        &TensorType::new(vec![bags, width], DType::I64),
        count as f64,
    );
    let first = scatter_into(
        cx,
        first,
        0,
        target,
        candidate,
        ScatterMode::Combine(BinaryOp::Min),
    )?;
    let last = cx.full_like(first, (count - 1).max(0) as f64, None);
    let first_safe = cx.b.binary(BinaryOp::Min, first, last)?;
    let flat = cx.b.reshape(first_safe, &[bags * width])?;
    let rows = if count > 0 {
        let rows = take_along(cx, indices, 0, flat)?;
        cx.b.reshape(rows, &[bags, width])?
    } else {
        cx.b.splat(&TensorType::new(vec![bags, width], DType::I64), 0.0)
    };
    let zero = cx.full_like(sizes, 0.0, None);
    let empty = cx.b.compare(CompareDir::Eq, sizes, zero)?;
    let empty = cx.b.broadcast_in_dim(empty, &[bags, width], &[0])?;
    let zeros = cx.full_like(maxima, 0.0, None);
    let output = cx.b.select(empty, zeros, maxima)?;
    let no_row = cx.full_like(rows, 0.0, None);
    let rows = cx.b.select(empty, no_row, rows)?;
    Ok((output, rows))
}

/// The (2, K) row and column indices of the upper (triu) or lower (tril) triangle, a constant.
fn triangle_indices(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let rows = cx.int(n, "row", None)?;
    let cols = cx.int(n, "col", None)?;
    let offset = cx.int(n, "offset", Some(0))?;
    let upper = n.target.contains("triu");
    let mut row_ids = Vec::new();
    let mut col_ids = Vec::new();
    for r in 0..rows {
        for c in 0..cols {
            if (upper && c - r >= offset) || (!upper && c - r <= offset) {
                row_ids.push(r);
                col_ids.push(c);
            }
        }
    }
    let out = cx.out_type(n, 0)?;
    if out.shape != [2, row_ids.len() as i64] {
        return err(format!(
            "torch recorded shape {:?} for {} indices",
            out.shape,
            row_ids.len()
        ));
    }
    let values: Vec<f64> = row_ids.iter().chain(&col_ids).map(|&v| v as f64).collect();
    Ok(vec![Some(cx.b.dense(out, &values)?)])
}

/// nonzero_static(self, size, fill_value): the coordinates of the first `size` nonzero
/// elements (row-major), one row each, the remaining rows filled with `fill_value`.
fn nonzero_static(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let size = cx.int(n, "size", None)?;
    let fill = cx.int(n, "fill_value", Some(-1))?;
    let out = cx.out_type(n, 0)?;
    let shape = cx.b.shape(x).to_vec();
    let rank = shape.len() as i64;
    let numel = cx.b.ty(x).numel();
    let filled = cx.b.splat(
        &TensorType::new(vec![size + 1, rank], DType::I64),
        fill as f64,
    );
    if numel == 0 || size == 0 {
        let empty = cx.b.slice(filled, &[0, 0], &[size, rank], &[1, 1])?;
        return Ok(vec![Some(cx.b.convert(empty, out.elem))]);
    }
    let flat = cx.b.reshape(x, &[numel])?;
    let zero = cx.full_like(flat, 0.0, None);
    let set = cx.b.compare(CompareDir::Ne, flat, zero)?;
    let row = rank_among_set(cx, set)?;
    // Unset elements, and set ones past `size`, go to the spare last row, cut off below.
    let spare = cx.full_like(row, size as f64, None);
    let row = cx.b.binary(BinaryOp::Min, row, spare)?;
    let row = cx.b.select(set, row, spare)?;
    // Coordinates of every flat position: [numel, rank].
    let coordinates: Vec<f64> = (0..numel)
        .flat_map(|p| {
            let mut rest = p;
            let mut c = vec![0.0; shape.len()];
            for d in (0..shape.len()).rev() {
                c[d] = (rest % shape[d]) as f64;
                rest /= shape[d];
            }
            c
        })
        .collect();
    let coordinates =
        cx.b.dense(TensorType::new(vec![numel, rank], DType::I64), &coordinates)?;
    let dims = ScatterDims {
        update_window_dims: vec![1],
        inserted_window_dims: vec![0],
        input_batching_dims: vec![],
        scatter_indices_batching_dims: vec![],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
    };
    let row = cx.b.reshape(row, &[numel, 1])?;
    let scattered =
        cx.b.scatter(filled, row, coordinates, dims, ScatterMode::Replace)?;
    let rows = cx.b.slice(scattered, &[0, 0], &[size, rank], &[1, 1])?;
    Ok(vec![Some(cx.b.convert(rows, out.elem))])
}

/// masked_scatter: the positions where `mask` is set take consecutive elements of `source`
/// (in row-major order); the others keep `self`.
fn masked_scatter(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let mask = cx.tensor(n, "mask")?;
    let source = cx.tensor(n, "source")?;
    let [x, mask] = cx.broadcast_all(&[x, mask])?[..] else {
        unreachable!("two values in, two out")
    };
    Ok(vec![Some(scatter_masked(cx, x, mask, source)?)])
}

/// `x` with the positions where `mask` (x's shape) is set replaced, in row-major order, by
/// consecutive elements of `source`.
/// For a 1-d mask: at each set position, how many set positions come before it (its rank
/// among them, from 0); unset positions get the rank of the next set one minus one.
fn rank_among_set(cx: &mut Ctx, set: Value) -> OpResult<Value> {
    let ones = cx.b.convert(set, DType::I64);
    let running = scan(cx, ones, 0, BinaryOp::Add)?;
    let one = cx.full_like(running, 1.0, None);
    Ok(cx.b.binary(BinaryOp::Sub, running, one)?)
}

fn scatter_masked(cx: &mut Ctx, x: Value, mask: Value, source: Value) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let numel = cx.b.ty(x).numel();
    let source_numel = cx.b.ty(source).numel();
    if numel == 0 || source_numel == 0 {
        return Ok(x);
    }
    // The k-th set position takes source[k].
    let flat_mask = cx.b.reshape(mask, &[numel])?;
    let k = rank_among_set(cx, flat_mask)?;
    // Unset positions may point past the source; clamp (their gathered value is discarded).
    let lo = cx.full_like(k, 0.0, None);
    let hi = cx.full_like(k, (source_numel - 1) as f64, None);
    let k = cx.b.clamp(lo, k, hi)?;
    let flat_source = cx.b.reshape(source, &[source_numel])?;
    let taken = take_along(cx, flat_source, 0, k)?;
    let taken = cx.b.reshape(taken, &shape)?;
    let taken = cx.b.convert(taken, cx.b.elem(x));
    Ok(cx.b.select(mask, taken, x)?)
}

/// The operands of torch's scatter ops: (self, dim, index, updates), the updates being the
/// index-shaped leading part of `src` in self's type, or `value` everywhere when `src` is None.
fn scatter_operands(
    cx: &mut Ctx,
    n: &Node,
    src: Option<Value>,
) -> OpResult<(Value, usize, Value, Value)> {
    let x = cx.tensor(n, "self")?;
    let index = cx.tensor(n, "index")?;
    let rank = cx.b.ty(x).rank();
    let dim = norm_dim(cx.int(n, "dim", None)?, rank)?;
    let index_shape = cx.b.shape(index).to_vec();
    if index_shape.len() != rank {
        return err(format!(
            "index has rank {}, self has rank {rank}",
            index_shape.len()
        ));
    }
    let elem = cx.b.elem(x);
    let updates = match src {
        Some(src) => {
            let src = cx.b.convert(src, elem);
            cx.b.slice(src, &vec![0; rank], &index_shape, &vec![1; rank])?
        }
        None => {
            let value = cx.float(n, "value", None)?;
            cx.b.splat(&TensorType::new(index_shape, elem), value)
        }
    };
    Ok((x, dim, index, updates))
}

/// torch's scatter along `dim`: `x[i][index[i][j]] = src[i][j]` (for dim 1), the update
/// combined with the element there by `mode`. Each element of `index` addresses one element.
fn scatter_along(
    cx: &mut Ctx,
    n: &Node,
    src: Option<Value>,
    mode: ScatterMode,
) -> OpResult<Vec<Option<Value>>> {
    let (x, dim, index, updates) = scatter_operands(cx, n, src)?;
    scatter_into(cx, x, dim, index, updates, mode).map(|v| vec![Some(v)])
}

/// scatter_reduce(self, dim, index, src, reduce, include_self): sum, prod, mean, amax, amin.
/// Without include_self, the positions that receive updates start from the reduction's identity
/// instead of their own value; mean divides by the number of values combined there.
fn scatter_reduce(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let src = cx.tensor(n, "src")?;
    let (x, dim, index, updates) = scatter_operands(cx, n, Some(src))?;
    reduce_scattered(cx, n, x, dim, index, updates).map(|v| vec![Some(v)])
}

/// index_reduce(self, dim, index, source, reduce, include_self): scatter_reduce with the 1-d
/// `index` addressing whole slices of `self` along `dim`.
fn index_reduce(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut x = cx.tensor(n, "self")?;
    let mut source = cx.tensor(n, "source")?;
    let index = cx.tensor(n, "index")?;
    let shape = cx.b.shape(x).to_vec();
    // A 0-d tensor indexes like a 1-element vector.
    if shape.is_empty() {
        x = cx.b.reshape(x, &[1])?;
        if cx.b.ty(source).rank() == 0 {
            source = cx.b.reshape(source, &[1])?;
        }
    }
    let rank = cx.b.ty(x).rank();
    let dim = norm_dim(cx.int(n, "dim", None)?, rank)?;
    let source_shape = cx.b.shape(source).to_vec();
    let index_len = cx.b.shape(index).iter().product::<i64>();
    if source_shape.len() != rank || source_shape[dim] != index_len {
        return err(format!(
            "source {source_shape:?} does not fit self {shape:?} with {index_len} indices along \
             dim {dim}"
        ));
    }
    let index = cx.b.reshape(index, &[index_len])?;
    let index = cx.b.broadcast_in_dim(index, &source_shape, &[dim as i64])?;
    let updates = cx.b.convert(source, cx.b.elem(x));
    let r = reduce_scattered(cx, n, x, dim, index, updates)?;
    Ok(vec![Some(cx.b.reshape(r, &shape)?)])
}

/// `updates` combined into `x` at `index` along `dim` by the node's `reduce` (sum, prod, mean,
/// amax, amin), with or without `x`'s own elements (`include_self`).
fn reduce_scattered(
    cx: &mut Ctx,
    n: &Node,
    x: Value,
    dim: usize,
    index: Value,
    updates: Value,
) -> OpResult<Value> {
    let reduce = cx.opt_str(n, "reduce")?.unwrap_or("sum");
    let include_self = cx.bool(n, "include_self", true)?;
    let op = match reduce {
        "sum" | "mean" => BinaryOp::Add,
        "prod" => BinaryOp::Mul,
        "amax" => BinaryOp::Max,
        "amin" => BinaryOp::Min,
        other => return err(format!("not supported: {} with reduce={other:?}", n.target)),
    };
    let shape = cx.b.shape(x).to_vec();
    let index_shape = cx.b.shape(index).to_vec();
    let elem = cx.b.elem(x);
    // How many updates each position receives.
    let zeros = cx.b.splat(&TensorType::new(shape.clone(), DType::I64), 0.0);
    let ones = cx.b.splat(&TensorType::new(index_shape, DType::I64), 1.0);
    let counts = scatter_into(
        cx,
        zeros,
        dim,
        index,
        ones,
        ScatterMode::Combine(BinaryOp::Add),
    )?;
    let none = cx.full_like(counts, 0.0, None);
    let touched = cx.b.compare(CompareDir::Gt, counts, none)?;
    let base = if include_self {
        x
    } else {
        let identity = cx.full_like(x, reduction_identity(op, elem), None);
        cx.b.select(touched, identity, x)?
    };
    let combined = scatter_into(cx, base, dim, index, updates, ScatterMode::Combine(op))?;
    if reduce != "mean" {
        return Ok(combined);
    }
    let extra = cx.full_like(counts, f64::from(u8::from(include_self)), None);
    let divisor = cx.b.binary(BinaryOp::Add, counts, extra)?;
    let one = cx.full_like(divisor, 1.0, None);
    let divisor = cx.b.binary(BinaryOp::Max, divisor, one)?;
    let divisor = cx.b.convert(divisor, elem);
    // Integer means round down, as torch's floor division does.
    let mean = if elem.is_float() {
        cx.b.binary(BinaryOp::Div, combined, divisor)?
    } else {
        floor_div(cx, Operand::Tensor(combined), Operand::Tensor(divisor))?
    };
    Ok(cx.b.select(touched, mean, x)?)
}

fn index_select(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut x = cx.tensor(n, "self")?;
    if cx.b.ty(x).rank() == 0 {
        // A 0-d tensor indexes like a 1-element vector.
        x = cx.b.reshape(x, &[1])?;
    }
    let dim = norm_dim(cx.int(n, "dim", None)?, cx.b.ty(x).rank())?;
    let idx = cx.tensor(n, "index")?;
    let size = cx.b.shape(x).get(dim).copied().unwrap_or(1);
    let idx = wrap_negative(cx, idx, size)?;
    let r = take_along(cx, x, dim, idx)?;
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.reshape(r, &out.shape)?)])
}

/// torch.gather: out[i][j][k] = x[i][idx[i][j][k]][k] (for dim 1), by full coordinates.
fn gather(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let rank = cx.b.ty(x).rank();
    let dim = norm_dim(cx.int(n, "dim", None)?, rank)?;
    let idx = cx.tensor(n, "index")?;
    let ishape = cx.b.shape(idx).to_vec();
    let mut coord_shape = ishape.clone();
    coord_shape.push(1);
    let mut coords = Vec::with_capacity(rank);
    for d in 0..rank {
        let c = if d == dim {
            cx.b.convert(idx, DType::I64)
        } else {
            cx.b.iota(TensorType::new(ishape.clone(), DType::I64), d as i64)?
        };
        coords.push(cx.b.reshape(c, &coord_shape)?);
    }
    let all = cx.b.concatenate(&coords, ishape.len() as i64)?;
    let dims = GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: (0..rank as i64).collect(),
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: (0..rank as i64).collect(),
        index_vector_dim: ishape.len() as i64,
        slice_sizes: vec![1; rank],
    };
    Ok(vec![Some(cx.b.gather(x, all, dims)?)])
}

/// `x[i0, i1, ...]` with tensor indices (None = whole dimension).
/// How advanced indexing `x[indices]` addresses `x`: the indexed dims, their (broadcast,
/// wrapped) indices stacked along a last dim, and where the remaining dims go in the result.
struct IndexLayout {
    dims: Vec<i64>,
    stacked: Value,
    /// Positions of the non-indexed dims of `x` in the result.
    window_dims: Vec<i64>,
    index_rank: i64,
}

/// `None` when no dim is indexed (`x[...]` is `x`).
fn index_layout(cx: &mut Ctx, n: &Node, x: Value) -> OpResult<Option<IndexLayout>> {
    let shape = cx.b.shape(x).to_vec();
    let indices = cx.opt_tensors(n, "indices")?;
    let mut dims = Vec::new();
    let mut idxs = Vec::new();
    for (d, i) in indices.iter().enumerate() {
        if let Some(i) = i {
            if cx.b.elem(*i).is_bool() {
                return err(
                    "not supported: boolean mask indexing (its result shape depends on the data)",
                );
            }
            dims.push(d);
            let w = wrap_negative(cx, *i, shape[d])?;
            idxs.push(w);
        }
    }
    if dims.is_empty() {
        return Ok(None);
    }
    let idxs = cx.broadcast_all(&idxs)?;
    let bshape = cx.b.shape(idxs[0]).to_vec();
    let mut cshape = bshape.clone();
    cshape.push(1);
    let parts = idxs
        .iter()
        .map(|&i| cx.b.reshape(i, &cshape))
        .collect::<Result<Vec<_>, _>>()?;
    let stacked = cx.b.concatenate(&parts, bshape.len() as i64)?;
    // Adjacent indexed dims keep their place in the result; otherwise they go first (torch).
    let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
    let first = if adjacent { dims[0] } else { 0 };
    let rest: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let window_dims = rest
        .iter()
        .enumerate()
        .map(|(k, &d)| {
            if adjacent && d < first {
                k as i64
            } else {
                (k + bshape.len()) as i64
            }
        })
        .collect();
    Ok(Some(IndexLayout {
        dims: dims.iter().map(|&d| d as i64).collect(),
        stacked,
        window_dims,
        index_rank: bshape.len() as i64,
    }))
}

fn index(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let Some(layout) = index_layout(cx, n, x)? else {
        return Ok(vec![Some(x)]);
    };
    let mut slice_sizes = cx.b.shape(x).to_vec();
    for &d in &layout.dims {
        slice_sizes[d as usize] = 1;
    }
    let g = GatherDims {
        offset_dims: layout.window_dims,
        collapsed_slice_dims: layout.dims.clone(),
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: layout.dims,
        index_vector_dim: layout.index_rank,
        slice_sizes,
    };
    Ok(vec![Some(cx.b.gather(x, layout.stacked, g)?)])
}

/// `x[mask] = values` (or `+=`) for a boolean mask over x's leading dims: one value per
/// selected row when `values` broadcasts to a row, else consecutive rows of `values`.
fn index_put_mask(
    cx: &mut Ctx,
    x: Value,
    mask: Value,
    values: Value,
    accumulate: bool,
) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let mask_shape = cx.b.shape(mask).to_vec();
    let k = mask_shape.len();
    if k > shape.len() || shape[..k] != mask_shape[..] {
        return err(format!(
            "not supported: a boolean mask of shape {mask_shape:?} indexing a tensor of shape {shape:?}"
        ));
    }
    let full =
        cx.b.broadcast_in_dim(mask, &shape, &(0..k as i64).collect::<Vec<_>>())?;
    let values = cx.b.convert(values, cx.b.elem(x));
    let base = if accumulate {
        cx.full_like(x, 0.0, None)
    } else {
        x
    };
    let vshape = cx.b.shape(values).to_vec();
    let placed = if broadcast_shapes(&vshape, &shape[k..]).as_deref() == Some(&shape[k..]) {
        let v = cx.b.broadcast_to(values, &shape)?;
        cx.b.select(full, v, base)?
    } else if vshape.len() == shape.len() - k + 1 && vshape[1..] == shape[k..] {
        scatter_masked(cx, base, full, values)?
    } else {
        return err(format!(
            "values of shape {vshape:?} do not fit rows of shape {:?}",
            &shape[k..]
        ));
    };
    Ok(if accumulate {
        cx.b.binary(BinaryOp::Add, x, placed)?
    } else {
        placed
    })
}

/// `x[indices] = values` (or `+=` with accumulate), as a scatter.
fn index_put(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let values = cx.tensor(n, "values")?;
    let accumulate = cx.bool(n, "accumulate", false)?;
    if let [Some(mask)] = cx.opt_tensors(n, "indices")?[..] {
        if cx.b.elem(mask).is_bool() {
            return Ok(vec![Some(index_put_mask(cx, x, mask, values, accumulate)?)]);
        }
    }
    let Some(layout) = index_layout(cx, n, x)? else {
        let shape = cx.b.shape(x).to_vec();
        let values = cx.b.convert(values, cx.b.elem(x));
        let values = cx.b.broadcast_to(values, &shape)?;
        if accumulate {
            return Ok(vec![Some(cx.b.binary(BinaryOp::Add, x, values)?)]);
        }
        return Ok(vec![Some(values)]);
    };
    // The updates have the shape `x[indices]` would have.
    let shape = cx.b.shape(x).to_vec();
    let index_shape = cx.b.shape(layout.stacked)[..layout.index_rank as usize].to_vec();
    let rest: Vec<i64> = (0..shape.len())
        .filter(|d| !layout.dims.contains(&(*d as i64)))
        .map(|d| shape[d])
        .collect();
    let mut update_shape = vec![0; index_shape.len() + rest.len()];
    let mut remaining = index_shape.iter();
    for (k, &w) in layout.window_dims.iter().enumerate() {
        update_shape[w as usize] = rest[k];
    }
    for (pos, slot) in update_shape.iter_mut().enumerate() {
        if !layout.window_dims.contains(&(pos as i64)) {
            *slot = *remaining.next().unwrap_or(&1);
        }
    }
    let values = cx.b.convert(values, cx.b.elem(x));
    let updates = cx.b.broadcast_to(values, &update_shape)?;
    let dims = ScatterDims {
        update_window_dims: layout.window_dims,
        inserted_window_dims: layout.dims.clone(),
        input_batching_dims: vec![],
        scatter_indices_batching_dims: vec![],
        scatter_dims_to_operand_dims: layout.dims,
        index_vector_dim: layout.index_rank,
    };
    let mode = if accumulate {
        ScatterMode::Combine(BinaryOp::Add)
    } else {
        ScatterMode::Replace
    };
    Ok(vec![Some(cx.b.scatter(
        x,
        layout.stacked,
        updates,
        dims,
        mode,
    )?)])
}

/// The weight gradient of an embedding bag (dense): each bag's output gradient added to the
/// rows of the indices it took (times the sample's weight; divided by the bag's size for mode
/// mean, by the index's count with scale_grad_by_freq); for mode max, to the row each output
/// element was taken from. The padding index receives nothing.
fn embedding_bag_backward(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    if cx.bool(n, "sparse", false)? {
        return err("not supported: embedding_bag backward with sparse=True (tpuc computes dense gradients)");
    }
    let grad = cx.tensor(n, "grad")?;
    let indices = cx.tensor(n, "indices")?;
    let out = cx.out_type(n, 0)?;
    let (rows, width) = (out.shape[0], out.shape[1]);
    let mode = cx.int(n, "mode", Some(0))?;
    let padding_idx = cx.int(n, "padding_idx", Some(-1))?;
    let grad = cx.b.convert(grad, out.elem.accumulation());
    let zeros =
        cx.b.splat(&TensorType::new(out.shape.clone(), cx.b.elem(grad)), 0.0);
    if mode == 2 {
        // An empty bag (size 0: torch's forward records row 0 for it) passes nothing back.
        let taken = cx.tensor(n, "maximum_indices")?;
        let taken = cx.b.convert(taken, DType::I64);
        let sizes = cx.tensor(n, "bag_size")?;
        let sizes = cx.b.convert(sizes, DType::I64);
        let zero = cx.full_like(taken, 0.0, None);
        let no_size = cx.full_like(sizes, 0.0, None);
        let empty = cx.b.compare(CompareDir::Le, sizes, no_size)?;
        let empty =
            cx.b.broadcast_in_dim(empty, cx.b.shape(taken).to_vec().as_slice(), &[0])?;
        let index = cx.b.select(empty, zero, taken)?;
        let nothing = cx.full_like(grad, 0.0, None);
        let updates = cx.b.select(empty, nothing, grad)?;
        let g = scatter_into(
            cx,
            zeros,
            0,
            index,
            updates,
            ScatterMode::Combine(BinaryOp::Add),
        )?;
        return Ok(vec![Some(cx.b.convert(g, out.elem))]);
    }
    if mode != 0 && mode != 1 {
        return err(format!("embedding_bag backward: unknown mode {mode}"));
    }
    let count = cx.b.ty(indices).numel();
    let indices = cx.b.reshape(indices, &[count])?;
    let indices = cx.b.convert(indices, DType::I64);
    let recorded = cx.tensor(n, "offset2bag")?;
    let bags = if cx.b.ty(recorded).numel() == count {
        cx.b.reshape(recorded, &[count])?
    } else {
        // The forward's fast path records no bags: they follow from the offsets.
        let offsets = cx.tensor(n, "offsets")?;
        let starts = cx.b.ty(offsets).numel();
        let bags_count = cx.b.shape(grad)[0].min(starts);
        bag_of_indices(cx, offsets, count, bags_count)?
    };
    let mut contributions = take_along(cx, grad, 0, bags)?;
    // Each index's contribution is multiplied by these factors (one value per index).
    let mut factors: Vec<Value> = Vec::new();
    if let Some(weights) = cx.opt_tensor(n, "per_sample_weights")? {
        let w = cx.b.convert(weights, cx.b.elem(grad));
        factors.push(cx.b.reshape(w, &[count])?);
    }
    if mode == 1 {
        let sizes = cx.tensor(n, "bag_size")?;
        let sizes = cx.b.convert(sizes, cx.b.elem(grad));
        let per_index = take_along(cx, sizes, 0, bags)?;
        let one = cx.full_like(per_index, 1.0, None);
        let nonzero = cx.b.binary(BinaryOp::Max, per_index, one)?;
        let inverse = cx.b.binary(BinaryOp::Div, one, nonzero)?;
        factors.push(inverse);
    }
    if cx.bool(n, "scale_grad_by_freq", false)? {
        let ones = cx.b.splat(&TensorType::new(vec![count], DType::I64), 1.0);
        let empty = cx.b.splat(&TensorType::new(vec![rows], DType::I64), 0.0);
        let counts = scatter_into(
            cx,
            empty,
            0,
            indices,
            ones,
            ScatterMode::Combine(BinaryOp::Add),
        )?;
        let per_index = take_along(cx, counts, 0, indices)?;
        let per_index = cx.b.convert(per_index, cx.b.elem(grad));
        let one = cx.full_like(per_index, 1.0, None);
        let inverse = cx.b.binary(BinaryOp::Div, one, per_index)?;
        factors.push(inverse);
    }
    if padding_idx >= 0 {
        let pad = cx.full_like(indices, padding_idx as f64, None);
        let kept = cx.b.compare(CompareDir::Ne, indices, pad)?;
        let kept = cx.b.convert(kept, cx.b.elem(grad));
        factors.push(kept);
    }
    if let Some((&first, rest)) = factors.split_first() {
        let mut scale = first;
        for &f in rest {
            scale = cx.b.binary(BinaryOp::Mul, scale, f)?;
        }
        let scale = cx.b.broadcast_in_dim(scale, &[count, width], &[0])?;
        contributions = cx.b.binary(BinaryOp::Mul, contributions, scale)?;
    }
    let index = cx.b.broadcast_in_dim(indices, &[count, width], &[0])?;
    let g = scatter_into(
        cx,
        zeros,
        0,
        index,
        contributions,
        ScatterMode::Combine(BinaryOp::Add),
    )?;
    Ok(vec![Some(cx.b.convert(g, out.elem))])
}

/// `put(self, index, source, accumulate)`: `source`'s elements written (or added) into
/// `self` flattened, at `index` (negative indices from the end).
fn put(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let index = cx.tensor(n, "index")?;
    let source = cx.tensor(n, "source")?;
    let shape = cx.b.shape(x).to_vec();
    let numel = cx.b.ty(x).numel();
    let count = cx.b.ty(index).numel();
    if cx.b.ty(source).numel() != count {
        return err(format!(
            "put needs as many source elements as indices, got {} and {count}",
            cx.b.ty(source).numel()
        ));
    }
    if count == 0 {
        return Ok(vec![Some(x)]);
    }
    let flat = cx.b.reshape(x, &[numel])?;
    let index = cx.b.reshape(index, &[count])?;
    let index = wrap_negative(cx, index, numel)?;
    let values = cx.b.convert(source, cx.b.elem(x));
    let values = cx.b.reshape(values, &[count])?;
    let mode = if cx.bool(n, "accumulate", false)? {
        ScatterMode::Combine(BinaryOp::Add)
    } else {
        ScatterMode::Replace
    };
    let put = scatter_into(cx, flat, 0, index, values, mode)?;
    Ok(vec![Some(cx.b.reshape(put, &shape)?)])
}

pub fn register(r: &mut Registry) {
    r.add(&["aten.put.default"], put);
    r.add(
        &[
            "aten._embedding_bag_backward.default",
            "aten._embedding_bag_dense_backward.default",
        ],
        embedding_bag_backward,
    );
    r.add(&["aten.embedding.default"], embedding);
    r.add(
        &[
            "aten._embedding_bag.default",
            "aten._embedding_bag_forward_only.default",
            "aten.embedding_bag.padding_idx",
        ],
        embedding_bag,
    );
    r.add(
        &["aten.triu_indices.default", "aten.tril_indices.default"],
        triangle_indices,
    );
    r.add_complex(&["aten.index_select.default"], index_select);
    r.add_complex(&["aten.gather.default"], gather);
    r.add_complex(&["aten.index.Tensor"], index);
    r.add(
        &["aten.index_put.default", "aten._index_put_impl.default"],
        index_put,
    );
    r.add(&["aten.scatter.src"], |cx, n| {
        let src = cx.tensor(n, "src")?;
        scatter_along(cx, n, Some(src), ScatterMode::Replace)
    });
    r.add(&["aten.scatter.value"], |cx, n| {
        scatter_along(cx, n, None, ScatterMode::Replace)
    });
    r.add(&["aten.scatter_add.default"], |cx, n| {
        let src = cx.tensor(n, "src")?;
        scatter_along(cx, n, Some(src), ScatterMode::Combine(BinaryOp::Add))
    });
    r.add(&["aten.scatter_reduce.two"], scatter_reduce);
    r.add(&["aten.index_reduce.default"], index_reduce);
    r.add(
        &["aten.scatter.reduce", "aten.scatter.value_reduce"],
        |cx, n| {
            let op = match cx.opt_str(n, "reduce")? {
                Some("add") => BinaryOp::Add,
                Some("multiply") => BinaryOp::Mul,
                other => return err(format!("not supported: scatter with reduce={other:?}")),
            };
            let src = cx.opt_tensor(n, "src")?;
            scatter_along(cx, n, src, ScatterMode::Combine(op))
        },
    );
    r.add(&["aten.masked_scatter.default"], masked_scatter);
    r.add(&["aten.nonzero_static.default"], nonzero_static);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn index_select_gathers_whole_rows() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[5, 3]);
        let i = g.input("i", DType::I64, &[2]);
        let y = g.node1(
            "aten.index_select.default",
            vec![("self", t(&x)), ("dim", Arg::Int(0)), ("index", t(&i))],
            DType::F32,
            &[2, 3],
        );
        assert_checks(&g.text(&[&y]), &["stablehlo.gather", ": tensor<2x3xf32>"]);
    }
}
