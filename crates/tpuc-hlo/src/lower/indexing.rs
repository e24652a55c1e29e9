//! Gathers: embedding, embedding bags, index_select, gather, advanced indexing (`x[idx]`),
//! and the index lists of triangles (triu_indices / tril_indices).

use tpuc_fx::Node;

use super::*;

/// Wraps negative indices (`i < 0` -> `i + size`), as torch's indexing does.
fn wrap_negative(cx: &mut Ctx, idx: Value, size: i64) -> OpResult<Value> {
    let idx = cx.b.convert(idx, ElemType::I64);
    let zero = cx.full_like(idx, 0.0, None);
    let n = cx.full_like(idx, size as f64, None);
    let neg = cx.b.compare(CompareDir::Lt, idx, zero)?;
    let wrapped = cx.b.binary(BinaryOp::Add, idx, n)?;
    Ok(cx.b.select(neg, wrapped, idx)?)
}

/// Takes whole slices of `x` along `dim` at `idx` (any shape); the index dims replace `dim`.
fn take_along(cx: &mut Ctx, x: Value, dim: usize, idx: Value) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let ishape = cx.b.shape(idx).to_vec();
    let idx = cx.b.convert(idx, ElemType::I64);
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

fn embedding(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let w = cx.tensor(n, "weight")?;
    let idx = cx.tensor(n, "indices")?;
    Ok(vec![Some(take_along(cx, w, 0, idx)?)])
}

/// torch's embedding bag (modes sum and mean), with the auxiliary outputs torch's CPU kernel
/// returns: offset2bag (bag of each index; empty in sum mode), bag_size (0 in sum mode) and
/// max_indices (0 in sum mode, bag_size in mean mode).
fn embedding_bag(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let weight = cx.tensor(n, "weight")?;
    let indices = cx.tensor(n, "indices")?;
    let offsets = cx.tensor(n, "offsets")?;
    let mode = cx.int(n, "mode", Some(0))?;
    if mode != 0 && mode != 1 {
        return err("not supported: embedding_bag with mode max");
    }
    let include_last = cx.bool(n, "include_last_offset", false)?;
    let padding_idx = cx.int(n, "padding_idx", Some(-1))?;
    let per_sample = cx.opt_tensor(n, "per_sample_weights")?;
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
    let i64t = |shape: &[i64]| TensorType::new(shape.to_vec(), ElemType::I64);

    // Bag of each index: how many bag starts are at or before its position, minus one.
    let indices = cx.b.convert(indices, ElemType::I64);
    let offsets = cx.b.convert(offsets, ElemType::I64);
    let starts = cx.b.slice(offsets, &[0], &[bags], &[1])?;
    let position = cx.b.iota(i64t(&[count, bags]), 0)?;
    let starts_b = cx.b.broadcast_in_dim(starts, &[count, bags], &[1])?;
    let started = cx.b.compare(CompareDir::Ge, position, starts_b)?;
    let started = cx.b.convert(started, ElemType::I64);
    let started = cx.b.reduce_by(started, &[1], BinaryOp::Add)?;
    let one = cx.full_like(started, 1.0, None);
    let bag_of = cx.b.binary(BinaryOp::Sub, started, one)?;

    // Indices that count: not padding_idx, and before the end offset when it is given.
    let position = cx.b.iota(i64t(&[count]), 0)?;
    let mut valid = cx.full_like(position, 1.0, Some(ElemType::I1));
    if include_last {
        let end = cx.b.slice(offsets, &[bags], &[bags + 1], &[1])?;
        let end = cx.b.reshape(end, &[])?;
        let end = cx.b.broadcast_in_dim(end, &[count], &[])?;
        let before_end = cx.b.compare(CompareDir::Lt, position, end)?;
        valid = cx.b.binary(BinaryOp::And, valid, before_end)?;
    }
    if padding_idx >= 0 && padding_idx < rows {
        let pad = cx.full_like(indices, padding_idx as f64, None);
        let not_pad = cx.b.compare(CompareDir::Ne, indices, pad)?;
        valid = cx.b.binary(BinaryOp::And, valid, not_pad)?;
    }
    // membership[i][b]: index i counts in bag b.
    let bag_ids = cx.b.iota(i64t(&[count, bags]), 1)?;
    let bag_of_b = cx.b.broadcast_in_dim(bag_of, &[count, bags], &[0])?;
    let member = cx.b.compare(CompareDir::Eq, bag_of_b, bag_ids)?;
    let valid_b = cx.b.broadcast_in_dim(valid, &[count, bags], &[0])?;
    let member = cx.b.binary(BinaryOp::And, member, valid_b)?;
    let mut weights = cx.b.convert(member, elem);
    if let Some(w) = per_sample {
        if mode != 0 {
            return err("per_sample_weights are only defined for mode sum");
        }
        let w = cx.b.convert(w, elem);
        let w = cx.b.broadcast_in_dim(w, &[count, bags], &[0])?;
        weights = cx.b.binary(BinaryOp::Mul, weights, w)?;
    }
    let gathered = take_along(cx, weight, 0, indices)?;
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![0],
        rhs_contracting: vec![0],
    };
    let precision = super::linear::precision(cx, elem);
    let mut output = cx.b.dot_general(weights, gathered, dims, precision)?;
    let counts = cx.b.convert(member, ElemType::I64);
    let counts = cx.b.reduce_by(counts, &[0], BinaryOp::Add)?;
    if mode == 1 {
        let at_least_one = cx.full_like(counts, 1.0, None);
        let divisor = cx.b.binary(BinaryOp::Max, counts, at_least_one)?;
        let divisor = cx.b.convert(divisor, elem);
        let width = cx.b.shape(output)[1];
        let divisor = cx.b.broadcast_in_dim(divisor, &[bags, width], &[0])?;
        output = cx.b.binary(BinaryOp::Div, output, divisor)?;
    }
    let zeros = |cx: &mut Ctx, i: usize| -> OpResult<Value> {
        let ty = cx.out_type(n, i)?;
        Ok(cx.b.splat(&ty, 0.0))
    };
    let (offset2bag, bag_size, max_indices) = if mode == 0 {
        (zeros(cx, 1)?, zeros(cx, 2)?, zeros(cx, 3)?)
    } else {
        (bag_of, counts, counts)
    };
    Ok(vec![
        Some(output),
        Some(offset2bag),
        Some(bag_size),
        Some(max_indices),
    ])
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
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| crate::builder::scalar_bytes(out.elem, v))
        .collect();
    let literal = Literal {
        ty: out,
        bytes: bytes.into(),
        splat: false,
    };
    Ok(vec![Some(cx.b.constant(literal)?)])
}

/// torch's scatter along `dim`: `x[i][index[i][j]] = src[i][j]` (for dim 1), the update
/// combined with the element there by `mode`. Each element of `index` addresses one element.
fn scatter_along(
    cx: &mut Ctx,
    n: &Node,
    src: Option<Value>,
    mode: ScatterMode,
) -> OpResult<Vec<Option<Value>>> {
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
            // Only the leading index-shaped part of src is scattered.
            let zeros = vec![0; rank];
            let ones = vec![1; rank];
            let src = cx.b.convert(src, elem);
            cx.b.slice(src, &zeros, &index_shape, &ones)?
        }
        None => {
            let value = cx.float(n, "value", None)?;
            cx.b.splat(&TensorType::new(index_shape.clone(), elem), value)
        }
    };
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
            cx.b.iota(
                TensorType::new(index_shape.clone(), ElemType::I64),
                d as i64,
            )?
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
    Ok(vec![Some(cx.b.scatter(
        x,
        coordinates,
        updates,
        dims,
        mode,
    )?)])
}

fn scatter_reduce(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let src = cx.tensor(n, "src")?;
    let reduce = cx.opt_str(n, "reduce")?.unwrap_or("sum");
    if !cx.bool(n, "include_self", true)? {
        return err("not supported: scatter_reduce with include_self=False");
    }
    let op = match reduce {
        "sum" => BinaryOp::Add,
        "prod" => BinaryOp::Mul,
        "amax" => BinaryOp::Max,
        "amin" => BinaryOp::Min,
        other => {
            return err(format!(
                "not supported: scatter_reduce with reduce={other:?}"
            ))
        }
    };
    scatter_along(cx, n, Some(src), ScatterMode::Combine(op))
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
            cx.b.convert(idx, ElemType::I64)
        } else {
            cx.b.iota(TensorType::new(ishape.clone(), ElemType::I64), d as i64)?
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

/// `x[indices] = values` (or `+=` with accumulate), as a scatter.
fn index_put(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let values = cx.tensor(n, "values")?;
    let accumulate = cx.bool(n, "accumulate", false)?;
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

pub fn register(r: &mut Registry) {
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
    r.add(&["aten.index_select.default"], index_select);
    r.add(&["aten.gather.default"], gather);
    r.add(&["aten.index.Tensor"], index);
    r.add(&["aten.index_put.default"], index_put);
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
}
