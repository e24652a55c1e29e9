//! View-like and data-movement ops: reshapes, permutations, slicing, concatenation, splitting.

use tpuc_fx::Node;

use super::prelude::*;

/// Ops whose result is the input reshaped to the recorded output shape.
fn reshape_to_out(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.reshape(x, &out.shape)?)])
}

/// Where a tensor argument's elements lie in the storage an as_strided view addresses: the
/// permutation of its dimensions into storage order (outermost first) and the storage position
/// of its first element, from the strides torch recorded for it. tpuc's values hold only the
/// tensor's own elements, so a tensor that does not fill one dense block of its storage (a
/// view with gaps or overlaps, symbolic strides) is refused rather than read wrongly.
fn storage_order(cx: &Ctx, n: &Node, arg: &str) -> OpResult<(Vec<i64>, i64)> {
    let Some(Arg::Tensor(name)) = n.arg(arg) else {
        return err(format!("argument {arg} should be a tensor"));
    };
    let Some(meta) = cx.graph.tensor(name) else {
        return err(format!("{name} has no recorded layout"));
    };
    let sizes = meta.static_sizes();
    let strides: Option<Vec<i64>> = meta.strides.iter().map(Dim::as_static).collect();
    let (Some(sizes), Some(strides)) = (sizes, strides) else {
        return err(format!(
            "not supported: as_strided over {name}, whose sizes or strides are symbolic"
        ));
    };
    if strides.len() != sizes.len() {
        return err(format!(
            "{name} has {} sizes but {} strides",
            sizes.len(),
            strides.len()
        ));
    }
    // Size-1 dimensions take no room in the storage: they go first, in their own order; the
    // others from the largest stride down.
    let mut perm: Vec<usize> = (0..sizes.len()).filter(|&d| sizes[d] == 1).collect();
    let mut spanning: Vec<usize> = (0..sizes.len()).filter(|&d| sizes[d] != 1).collect();
    spanning.sort_by_key(|&d| std::cmp::Reverse(strides[d]));
    perm.extend(&spanning);
    let numel: i64 = sizes.iter().product();
    let mut expected = 1;
    let mut dense = true;
    for &d in spanning.iter().rev() {
        dense &= numel == 0 || strides[d] == expected;
        expected *= sizes[d];
    }
    if !dense {
        return err(format!(
            "not supported: as_strided over {name} (sizes {sizes:?}, strides {strides:?}), whose \
             elements do not fill one dense block of its storage"
        ));
    }
    Ok((
        perm.into_iter().map(|d| d as i64).collect(),
        meta.storage_offset,
    ))
}

/// `x` with its dimensions in storage order (`perm`), flattened: the storage block it fills.
fn storage_block(cx: &mut Ctx, x: Value, perm: &[i64]) -> OpResult<Value> {
    let t = cx.b.transpose(x, perm)?;
    let numel = cx.b.ty(x).numel();
    Ok(cx.b.reshape(t, &[numel])?)
}

/// The positions of an as_strided view (size, stride, storage offset; the offset defaults to
/// self's) relative to the first storage element of `self`, each checked to lie in the block
/// `self` fills.
fn view_positions(cx: &Ctx, n: &Node, base: i64, numel: i64) -> OpResult<(Vec<i64>, Vec<i64>)> {
    let size = cx.ints(n, "size", None)?;
    let stride = cx.ints(n, "stride", None)?;
    let offset = cx.opt_int(n, "storage_offset")?.unwrap_or(base);
    if size.len() != stride.len() || size.iter().any(|&d| d < 0) {
        return err(format!(
            "not supported: as_strided with size {size:?} and stride {stride:?}"
        ));
    }
    let positions = strided_positions(&size, &stride, offset - base);
    if let Some(bad) = positions.iter().find(|&&p| p < 0 || p >= numel) {
        return err(format!(
            "not supported: as_strided of storage position {}, outside the {numel} elements (from \
             position {base}) that its input holds",
            bad + base
        ));
    }
    Ok((positions, size))
}

/// as_strided: the elements of `self`'s storage at a strided view's positions. The storage
/// order is the input's recorded layout (channels-last, transposed, ...), not its row-major
/// element order.
fn as_strided(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let (perm, base) = storage_order(cx, n, "self")?;
    let numel = cx.b.ty(x).numel();
    let (positions, size) = view_positions(cx, n, base, numel)?;
    let block = storage_block(cx, x, &perm)?;
    Ok(vec![Some(take_flat(cx, block, &positions, &size)?)])
}

/// as_strided_scatter: `self` with the storage elements an as_strided view of it addresses
/// replaced by `src` (the result keeps self's layout).
fn as_strided_scatter(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let src = cx.tensor(n, "src")?;
    let (perm, base) = storage_order(cx, n, "self")?;
    let numel = cx.b.ty(x).numel();
    let (positions, size) = view_positions(cx, n, base, numel)?;
    if cx.b.shape(src) != size {
        return err(format!(
            "as_strided_scatter of a {:?} source into a view of size {size:?}",
            cx.b.shape(src)
        ));
    }
    let block = storage_block(cx, x, &perm)?;
    let written = put_flat(cx, block, &positions, src)?;
    let stored: Vec<i64> = perm.iter().map(|&d| cx.b.shape(x)[d as usize]).collect();
    let stored = cx.b.reshape(written, &stored)?;
    let mut inverse = vec![0; perm.len()];
    for (i, &d) in perm.iter().enumerate() {
        inverse[d as usize] = i as i64;
    }
    Ok(vec![Some(cx.b.transpose(stored, &inverse)?)])
}

/// The row-major strides of `shape`.
fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// The shape of diagonal(offset, d1, d2) of a tensor of `shape`, and the row-major flat
/// position in that tensor of each of its elements.
fn diagonal_positions(cx: &Ctx, n: &Node, shape: &[i64]) -> OpResult<(Vec<i64>, Vec<i64>)> {
    let rank = shape.len();
    let offset = cx.int(n, "offset", Some(0))?;
    let d1 = norm_dim(cx.int(n, "dim1", Some(0))?, rank)?;
    let d2 = norm_dim(cx.int(n, "dim2", Some(1))?, rank)?;
    if rank < 2 || d1 == d2 {
        return err(format!(
            "diagonal needs two distinct dimensions, got {d1} and {d2} of a rank-{rank} tensor"
        ));
    }
    let strides = contiguous_strides(shape);
    let (row0, col0) = (0.max(-offset), 0.max(offset));
    let length = (shape[d1] - row0).min(shape[d2] - col0).max(0);
    let (mut size, mut stride): (Vec<i64>, Vec<i64>) = (0..rank)
        .filter(|&d| d != d1 && d != d2)
        .map(|d| (shape[d], strides[d]))
        .unzip();
    size.push(length);
    stride.push(strides[d1] + strides[d2]);
    let start = if length > 0 {
        row0 * strides[d1] + col0 * strides[d2]
    } else {
        0
    };
    let positions = strided_positions(&size, &stride, start);
    Ok((size, positions))
}

/// diagonal(offset, dim1, dim2): the other dims in order, then the diagonal.
fn diagonal(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    let (size, positions) = diagonal_positions(cx, n, &shape)?;
    Ok(vec![Some(take_flat(cx, x, &positions, &size)?)])
}

/// diagonal_scatter: `self` with its diagonal (as `diagonal` takes it) replaced by `src`.
fn diagonal_scatter(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let src = cx.tensor(n, "src")?;
    let shape = cx.b.shape(x).to_vec();
    let (size, positions) = diagonal_positions(cx, n, &shape)?;
    if cx.b.shape(src) != size.as_slice() {
        return err(format!(
            "src has shape {:?}, the diagonal {size:?}",
            cx.b.shape(src)
        ));
    }
    Ok(vec![Some(put_flat(cx, x, &positions, src)?)])
}

/// unfold(dimension, size, step): the windows of `size` elements every `step` along the
/// dimension; the window index replaces the dimension and the window is a new last dim.
fn unfold(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    if cx.b.ty(x).rank() == 0 {
        x = cx.b.reshape(x, &[1])?;
    }
    let rank = cx.b.ty(x).rank();
    let dim = norm_dim(cx.int(n, "dimension", None)?, rank)?;
    let size = cx.int(n, "size", None)?;
    let step = cx.int(n, "step", None)?;
    let length = cx.b.shape(x)[dim];
    if size < 0 || step < 1 || size > length {
        return err(format!(
            "unfold of size {size} and step {step} does not fit a dimension of {length}"
        ));
    }
    let windows = (length - size) / step + 1;
    let positions: Vec<f64> = (0..windows)
        .flat_map(|w| (0..size).map(move |j| (w * step + j) as f64))
        .collect();
    let index =
        cx.b.dense(TensorType::new(vec![windows, size], DType::I64), &positions)?;
    let taken = take_along(cx, x, dim, index)?;
    // take_along puts (windows, size) at `dim`; the window's own axis goes last.
    let mut perm: Vec<i64> = (0..rank as i64 + 1)
        .filter(|&d| d != dim as i64 + 1)
        .collect();
    perm.push(dim as i64 + 1);
    let y = cx.b.transpose(taken, &perm)?;
    Ok(vec![Some(cx.b.reshape(y, &out.shape)?)])
}

fn permute(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let rank = cx.b.ty(x).rank();
    let dims = cx.ints(n, "dims", None)?;
    let perm = dims
        .iter()
        .map(|&d| norm_dim(d, rank).map(|d| d as i64))
        .collect::<OpResult<Vec<_>>>()?;
    Ok(vec![Some(cx.b.transpose(x, &perm)?)])
}

/// `movedim(x, source, destination)` (one dimension or lists of them): each source dimension
/// moves to its destination, the others keep their order in the places left.
fn movedim(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let rank = cx.b.ty(x).rank();
    let dims = |cx: &Ctx, name: &str| -> OpResult<Vec<usize>> {
        let given = if n.target.ends_with(".int") {
            vec![cx.int(n, name, None)?]
        } else {
            cx.ints(n, name, None)?
        };
        given.iter().map(|&d| norm_dim(d, rank)).collect()
    };
    let (from, to) = (dims(cx, "source")?, dims(cx, "destination")?);
    if from.len() != to.len() {
        return err(format!(
            "movedim moves {} dimensions to {} places",
            from.len(),
            to.len()
        ));
    }
    if rank == 0 {
        return Ok(vec![Some(x)]);
    }
    let mut perm: Vec<Option<i64>> = vec![None; rank];
    for (&f, &t) in from.iter().zip(&to) {
        if from.iter().filter(|&&d| d == f).count() > 1 || perm[t].is_some() {
            return err(format!(
                "movedim's source {from:?} and destination {to:?} must not repeat a dimension"
            ));
        }
        perm[t] = Some(f as i64);
    }
    let mut rest = (0..rank as i64).filter(|d| !from.contains(&(*d as usize)));
    let perm: Vec<i64> = perm
        .into_iter()
        .map(|p| p.or_else(|| rest.next()).expect("one dimension per place"))
        .collect();
    Ok(vec![Some(cx.b.transpose(x, &perm)?)])
}

fn transpose(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let rank = cx.b.ty(x).rank();
    let mut perm: Vec<i64> = (0..rank as i64).collect();
    if n.target == "aten.t.default" {
        // t() of a 0-d or 1-d tensor is the tensor itself.
        if rank == 2 {
            perm.swap(0, 1);
        }
    } else if matches!(
        n.target.as_str(),
        "aten.mT.default" | "aten.mH.default" | "aten.adjoint.default"
    ) {
        // The last two dimensions (mH and adjoint also conjugate: real tensors only here).
        if rank < 2 {
            return err(format!(
                "{} needs at least 2 dimensions, got {}",
                n.target,
                cx.b.ty(x)
            ));
        }
        perm.swap(rank - 2, rank - 1);
    } else if rank > 0 {
        let d0 = norm_dim(cx.int(n, "dim0", None)?, rank)?;
        let d1 = norm_dim(cx.int(n, "dim1", None)?, rank)?;
        perm.swap(d0, d1);
    }
    Ok(vec![Some(cx.b.transpose(x, &perm)?)])
}

fn expand(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.broadcast_to(x, &out.shape)?)])
}

/// Python slice bounds clamped like torch: negatives count from the end.
fn clamp_bounds(start: Option<i64>, end: Option<i64>, size: i64) -> (i64, i64) {
    let fix = |v: i64| {
        if v < 0 {
            (v + size).max(0)
        } else {
            v.min(size)
        }
    };
    let s = fix(start.unwrap_or(0));
    let e = fix(end.unwrap_or(size)).max(s);
    (s, e)
}

struct SliceRange {
    dim: usize,
    start: i64,
    end: i64,
    step: i64,
}

/// The `dim`, `start`, `end`, `step` arguments of slice / slice_scatter, normalised and clamped.
fn slice_range(cx: &Ctx, n: &Node, shape: &[i64]) -> OpResult<SliceRange> {
    let dim = norm_dim(cx.int(n, "dim", Some(0))?, shape.len())?;
    let step = cx.int(n, "step", Some(1))?;
    if step < 1 {
        return err(format!(
            "not supported: slice step {step} (must be positive)"
        ));
    }
    let (start, end) = clamp_bounds(cx.opt_int(n, "start")?, cx.opt_int(n, "end")?, shape[dim]);
    Ok(SliceRange {
        dim,
        start,
        end,
        step,
    })
}

fn slice(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    let range = slice_range(cx, n, &shape)?;
    Ok(vec![Some(cx.b.slice_dim(
        x,
        range.dim,
        range.start,
        range.end,
        range.step,
    )?)])
}

/// `self` with the elements `start:end:step` along `dim` replaced by `src`: `src` is padded out
/// to `self`'s shape (interior padding for the step) and selected where it landed.
fn embed_along(
    cx: &mut Ctx,
    x: Value,
    src: Value,
    dim: usize,
    start: i64,
    step: i64,
) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let count = cx.b.shape(src)[dim];
    if count == 0 {
        return Ok(x);
    }
    let rank = shape.len();
    let mut low = vec![0; rank];
    let mut high = vec![0; rank];
    let mut interior = vec![0; rank];
    low[dim] = start;
    interior[dim] = step - 1;
    high[dim] = shape[dim] - (start + (count - 1) * step + 1);
    if high[dim] < 0 {
        return err(format!(
            "{count} elements with step {step} from {start} overrun size {}",
            shape[dim]
        ));
    }
    let src = cx.b.convert(src, cx.b.elem(x));
    if step == 1 {
        // One block: written in place of the operand's copy (XLA's dynamic-update-slice), not
        // selected element by element from a padded copy and a padded mask, which costs a pass
        // over the whole operand for each (writes into views of a large storage do this).
        let zero = cx.b.scalar(DType::I64, 0.0);
        let mut starts = vec![zero; rank];
        starts[dim] = cx.b.scalar(DType::I64, start as f64);
        return Ok(cx.b.dynamic_update_slice(x, src, &starts)?);
    }
    let zero = cx.b.scalar(cx.b.elem(x), 0.0);
    let placed = cx.b.pad(src, zero, &low, &high, &interior)?;
    let inside = cx.full_like(src, 1.0, Some(DType::Bool));
    let outside = cx.b.scalar(DType::Bool, 0.0);
    let mask = cx.b.pad(inside, outside, &low, &high, &interior)?;
    Ok(cx.b.select(mask, placed, x)?)
}

fn flip(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let rank = cx.b.ty(x).rank();
    let dims = cx
        .ints(n, "dims", None)?
        .into_iter()
        .map(|d| norm_dim(d, rank).map(|d| d as i64))
        .collect::<OpResult<Vec<_>>>()?;
    if rank == 0 {
        return Ok(vec![Some(x)]);
    }
    Ok(vec![Some(cx.b.reverse(x, &dims)?)])
}

/// Pads (or, for negative amounts, crops) the last dimensions: `pad` lists (low, high) pairs
/// from the last dimension backwards.
fn constant_pad_nd(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let pad = cx.ints(n, "pad", None)?;
    let value = cx.float(n, "value", Some(0.0))?;
    let rank = cx.b.ty(x).rank();
    if pad.len() % 2 != 0 || pad.len() / 2 > rank {
        return err(format!("pad {pad:?} does not fit a tensor of rank {rank}"));
    }
    let mut low = vec![0; rank];
    let mut high = vec![0; rank];
    for (i, pair) in pad.chunks(2).enumerate() {
        low[rank - 1 - i] = pair[0];
        high[rank - 1 - i] = pair[1];
    }
    let elem = cx.b.elem(x);
    let v = cx.b.scalar(elem, value);
    Ok(vec![Some(cx.b.pad(x, v, &low, &high, &vec![0; rank])?)])
}

fn slice_scatter(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let src = cx.tensor(n, "src")?;
    let shape = cx.b.shape(x).to_vec();
    let range = slice_range(cx, n, &shape)?;
    Ok(vec![Some(embed_along(
        cx,
        x,
        src,
        range.dim,
        range.start,
        range.step,
    )?)])
}

fn select_scatter(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let src = cx.tensor(n, "src")?;
    let shape = cx.b.shape(x).to_vec();
    let (dim, index) = selected_index(cx, n, &shape)?;
    let mut expanded = cx.b.shape(src).to_vec();
    expanded.insert(dim, 1);
    let src = cx.b.reshape(src, &expanded)?;
    Ok(vec![Some(embed_along(cx, x, src, dim, index, 1)?)])
}

fn narrow(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    let dim = norm_dim(cx.int(n, "dim", None)?, shape.len())?;
    let mut start = cx.int(n, "start", None)?;
    if start < 0 {
        start += shape[dim];
    }
    let length = cx.int(n, "length", None)?;
    if start < 0 || length < 0 || start + length > shape[dim] {
        return err(format!(
            "narrow({start}, {length}) is out of range for size {}",
            shape[dim]
        ));
    }
    Ok(vec![Some(cx.b.slice_dim(
        x,
        dim,
        start,
        start + length,
        1,
    )?)])
}

/// The `dim` and `index` arguments of select / select_scatter, normalised and checked.
fn selected_index(cx: &Ctx, n: &Node, shape: &[i64]) -> OpResult<(usize, i64)> {
    let dim = norm_dim(cx.int(n, "dim", None)?, shape.len())?;
    let mut index = cx.int(n, "index", None)?;
    if index < 0 {
        index += shape[dim];
    }
    if index < 0 || index >= shape[dim] {
        return err(format!(
            "index {index} is out of range for dimension {dim} of size {}",
            shape[dim]
        ));
    }
    Ok((dim, index))
}

fn select(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    let (dim, index) = selected_index(cx, n, &shape)?;
    let s = cx.b.slice_dim(x, dim, index, index + 1, 1)?;
    let mut out = shape;
    out.remove(dim);
    Ok(vec![Some(cx.b.reshape(s, &out)?)])
}

fn cat(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let xs = cx.tensors(n, "tensors")?;
    let out = cx.out_type(n, 0)?;
    let dim = norm_dim(cx.int(n, "dim", Some(0))?, out.rank())?;
    // torch skips 1-d empty tensors in cat, whatever the other shapes.
    let kept: Vec<Value> = xs.into_iter().filter(|&x| cx.b.shape(x) != [0]).collect();
    let parts: Vec<Value> = kept
        .into_iter()
        .map(|x| cx.b.convert(x, out.elem))
        .collect();
    if parts.is_empty() {
        return Ok(vec![Some(cx.b.splat(&out, 0.0))]);
    }
    Ok(vec![Some(cx.b.concatenate(&parts, dim as i64)?)])
}

fn stack(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let xs = cx.tensors(n, "tensors")?;
    let out = cx.out_type(n, 0)?;
    let dim = norm_dim(cx.int(n, "dim", Some(0))?, out.rank())?;
    let mut parts = Vec::with_capacity(xs.len());
    for x in xs {
        let mut shape = cx.b.shape(x).to_vec();
        shape.insert(dim, 1);
        let x = cx.b.convert(x, out.elem);
        parts.push(cx.b.reshape(x, &shape)?);
    }
    Ok(vec![Some(cx.b.concatenate(&parts, dim as i64)?)])
}

/// split / split_with_sizes / chunk / unbind: consecutive slices sized as torch recorded.
fn split(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    let dim = norm_dim(cx.int(n, "dim", Some(0))?, shape.len())?;
    let unbind = n.target.starts_with("aten.unbind");
    let mut start = 0;
    let mut outs = Vec::new();
    for i in 0..n.defined_tensors().len() {
        let ty = cx.out_type(n, i)?;
        let size = if unbind { 1 } else { ty.shape[dim] };
        let s = cx.b.slice_dim(x, dim, start, start + size, 1)?;
        outs.push(Some(cx.b.reshape(s, &ty.shape)?));
        start += size;
    }
    if start != shape[dim] {
        return err(format!(
            "the outputs cover {start} of {} elements along dimension {dim}",
            shape[dim]
        ));
    }
    Ok(outs)
}

fn repeat_interleave(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let repeats = cx.int(n, "repeats", None)?;
    let out = cx.out_type(n, 0)?;
    let (x, dim) = match cx.opt_int(n, "dim")? {
        Some(d) => (x, norm_dim(d, cx.b.ty(x).rank())?),
        None => {
            let numel = cx.b.ty(x).numel();
            (cx.b.reshape(x, &[numel])?, 0)
        }
    };
    let shape = cx.b.shape(x).to_vec();
    let mut expanded = shape.clone();
    expanded.insert(dim + 1, repeats);
    let mut unsq = shape.clone();
    unsq.insert(dim + 1, 1);
    let u = cx.b.reshape(x, &unsq)?;
    let dims: Vec<i64> = (0..unsq.len() as i64).collect();
    let b = cx.b.broadcast_in_dim(u, &expanded, &dims)?;
    Ok(vec![Some(cx.b.reshape(b, &out.shape)?)])
}

/// `repeat_interleave(repeats, output_size)`: the position each output element copies,
/// `out[j] = #{i : cumsum(repeats)[i] <= j}`, capped at the last position (torch's rule when the
/// size is known; a size that depends on the repeats' values never reaches a lowering). Each
/// bag's end is marked by adding one into a vector one longer than the output, and the running
/// sum of the marks is the position: linear in both sizes, where comparing every output with
/// every end would be their product.
fn repeat_interleave_positions(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let repeats = cx.tensor(n, "repeats")?;
    let out = cx.out_type(n, 0)?;
    let count = match cx.b.shape(repeats) {
        [count] => *count,
        other => {
            return err(format!(
                "repeats must be one-dimensional, got shape {other:?} (as torch requires)"
            ))
        }
    };
    let size = out.shape[0];
    if size == 0 {
        return Ok(vec![Some(cx.b.splat(&out, 0.0))]);
    }
    if count == 0 {
        return err(format!("repeats is empty but output_size is {size}"));
    }
    let repeats = cx.b.convert(repeats, DType::I64);
    let ends = scan(cx, repeats, 0, BinaryOp::Add)?;
    // Ends at or past the output's end all land in the extra slot.
    let low = cx.full_like(ends, 0.0, None);
    let high = cx.full_like(ends, size as f64, None);
    let ends = cx.b.clamp(low, ends, high)?;
    let zeros =
        cx.b.splat(&TensorType::new(vec![size + 1], DType::I64), 0.0);
    let ones = cx.full_like(ends, 1.0, None);
    let marks = scatter_into(
        cx,
        zeros,
        0,
        ends,
        ones,
        ScatterMode::Combine(BinaryOp::Add),
    )?;
    let marks = cx.b.slice_dim(marks, 0, 0, size, 1)?;
    let positions = scan(cx, marks, 0, BinaryOp::Add)?;
    let last = cx.full_like(positions, (count - 1) as f64, None);
    let positions = cx.b.binary(BinaryOp::Min, positions, last)?;
    Ok(vec![Some(cx.b.convert(positions, out.elem))])
}

fn repeat(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let repeats = cx.ints(n, "repeats", None)?;
    let shape = cx.b.shape(x).to_vec();
    if repeats.len() < shape.len() {
        return err("repeat needs at least as many repeats as dimensions");
    }
    let mut padded = vec![1; repeats.len() - shape.len()];
    padded.extend_from_slice(&shape);
    // [d0, d1] -> [1, d0, 1, d1] -> [r0, d0, r1, d1] -> [r0*d0, r1*d1]
    let inter: Vec<i64> = padded.iter().flat_map(|&d| [1, d]).collect();
    let target: Vec<i64> = padded
        .iter()
        .zip(&repeats)
        .flat_map(|(&d, &r)| [r, d])
        .collect();
    let u = cx.b.reshape(x, &inter)?;
    let dims: Vec<i64> = (0..inter.len() as i64).collect();
    let b = cx.b.broadcast_in_dim(u, &target, &dims)?;
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.reshape(b, &out.shape)?)])
}

/// `x.view(dtype)`: the same bytes read as another type. A narrower type splits each element
/// along the last dimension, a wider one joins that many (torch's rule); booleans are bytes.
fn view_dtype(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let from = cx.b.elem(x);
    if from == out.elem {
        return Ok(vec![Some(x)]);
    }
    if from.is_complex() || out.elem.is_complex() {
        return err(format!(
            "not supported: viewing {from} as {} (complex bits are not reinterpreted)",
            out.elem
        ));
    }
    let as_bytes = |d: DType| if d.is_bool() { DType::U8 } else { d };
    let source = cx.b.convert(x, as_bytes(from));
    let target = as_bytes(out.elem);
    let (from_bytes, to_bytes) = (from.byte_size(), target.byte_size());
    let y = if from_bytes >= to_bytes {
        let y = cx.b.bitcast(source, target)?;
        cx.b.reshape(y, &out.shape)?
    } else {
        let mut grouped = out.shape.clone();
        grouped.push((to_bytes / from_bytes) as i64);
        let grouped = cx.b.reshape(source, &grouped)?;
        cx.b.bitcast(grouped, target)?
    };
    if out.elem.is_bool() {
        let zero = cx.full_like(y, 0.0, None);
        return Ok(vec![Some(cx.b.compare(CompareDir::Ne, y, zero)?)]);
    }
    Ok(vec![Some(y)])
}

pub fn register(r: &mut Registry) {
    r.add(&["aten.view.dtype"], view_dtype);
    // prims' shape ops name their tensor `a`.
    r.add(
        &[
            "prims.collapse.default",
            "prims.collapse_view.default",
            "prims.split_dim.default",
            "prims.squeeze.default",
            "prims.view_of.default",
            "prims.reshape.default",
        ],
        |cx, n| {
            let x = cx.tensor(n, "a")?;
            let out = cx.out_type(n, 0)?;
            Ok(vec![Some(cx.b.reshape(x, &out.shape)?)])
        },
    );
    r.add_complex(&["aten.slice_scatter.default"], slice_scatter);
    r.add_complex(&["aten.flip.default"], flip);
    r.add_complex(&["aten.constant_pad_nd.default"], constant_pad_nd);
    r.add_complex(&["aten.select_scatter.default"], select_scatter);
    r.add_complex(
        &[
            "aten.view.default",
            "aten.reshape.default",
            "aten._unsafe_view.default",
            "aten.unsqueeze.default",
            "aten.squeeze.dim",
            "aten.squeeze.dims",
            "aten.squeeze.default",
            "aten.flatten.using_ints",
            "aten.unflatten.int",
            "aten.view_as.default",
            "aten.reshape_as.default",
        ],
        reshape_to_out,
    );
    r.add_complex(&["aten.permute.default"], permute);
    r.add_complex(
        &[
            "aten.movedim.int",
            "aten.movedim.intlist",
            "aten.moveaxis.int",
            "aten.moveaxis.intlist",
        ],
        movedim,
    );
    r.add(&["aten.as_strided.default"], as_strided);
    r.add(&["aten.as_strided_scatter.default"], as_strided_scatter);
    r.add(&["aten.diagonal.default"], diagonal);
    r.add(&["aten.diagonal_scatter.default"], diagonal_scatter);
    r.add(&["aten.unfold.default"], unfold);
    r.add_complex(
        &["aten.transpose.int", "aten.t.default", "aten.mT.default"],
        transpose,
    );
    r.add(&["aten.mH.default", "aten.adjoint.default"], transpose);
    r.add_complex(
        &[
            "aten.expand.default",
            "aten.expand_as.default",
            "aten.broadcast_to.default",
        ],
        expand,
    );
    r.add_complex(&["aten.slice.Tensor"], slice);
    r.add_complex(&["aten.narrow.default"], narrow);
    r.add_complex(&["aten.select.int"], select);
    r.add_complex(&["aten.cat.default", "aten.concat.default"], cat);
    r.add_complex(&["aten.stack.default"], stack);
    r.add_complex(
        &[
            "aten.split.Tensor",
            "aten.split_with_sizes.default",
            "aten.chunk.default",
            "aten.unbind.int",
            "aten.tensor_split.sections",
        ],
        split,
    );
    r.add(&["aten.repeat_interleave.self_int"], repeat_interleave);
    r.add(
        &["aten.repeat_interleave.Tensor"],
        repeat_interleave_positions,
    );
    r.add_complex(&["aten.repeat.default"], repeat);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn chained_permutes_become_one_transpose() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[2, 3, 4]);
        let a = g.node1(
            "aten.permute.default",
            vec![("self", t(&x)), ("dims", Arg::Ints(vec![1, 0, 2]))],
            DType::F32,
            &[3, 2, 4],
        );
        let b = g.node1(
            "aten.permute.default",
            vec![("self", t(&a)), ("dims", Arg::Ints(vec![2, 0, 1]))],
            DType::F32,
            &[4, 3, 2],
        );
        let text = g.text(&[&b]);
        assert_checks(&text, &["stablehlo.transpose %0 perm=[2, 1, 0]", "return"]);
        assert_eq!(text.matches("stablehlo.transpose").count(), 1, "{text}");
    }
}
