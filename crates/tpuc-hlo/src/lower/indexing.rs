//! Gathers: embedding, index_select, gather, and advanced indexing (`x[idx]`).

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

fn index_select(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
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
fn index(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
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
        return Ok(vec![Some(x)]);
    }
    let idxs = cx.broadcast_all(&idxs)?;
    let bshape = cx.b.shape(idxs[0]).to_vec();
    let mut cshape = bshape.clone();
    cshape.push(1);
    let parts = idxs
        .iter()
        .map(|&i| cx.b.reshape(i, &cshape))
        .collect::<Result<Vec<_>, _>>()?;
    let all = cx.b.concatenate(&parts, bshape.len() as i64)?;
    let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
    let first = if adjacent { dims[0] } else { 0 };
    let rest: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let offset_dims: Vec<i64> = rest
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
    let mut slice_sizes = shape.clone();
    for &d in &dims {
        slice_sizes[d] = 1;
    }
    let g = GatherDims {
        offset_dims,
        collapsed_slice_dims: dims.iter().map(|&d| d as i64).collect(),
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: dims.iter().map(|&d| d as i64).collect(),
        index_vector_dim: bshape.len() as i64,
        slice_sizes,
    };
    Ok(vec![Some(cx.b.gather(x, all, g)?)])
}

pub fn register(r: &mut Registry) {
    r.add(&["aten.embedding.default"], embedding);
    r.add(&["aten.index_select.default"], index_select);
    r.add(&["aten.gather.default"], gather);
    r.add(&["aten.index.Tensor"], index);
}
