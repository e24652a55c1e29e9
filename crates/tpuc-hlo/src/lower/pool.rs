//! Pooling in 1-3 spatial dimensions (torch's NC... layout, or unbatched C...): max pooling
//! (with the indices torch returns), average and adaptive average pooling, and the backward ops
//! of each that aot_autograd's backward graphs contain.

use tpuc_fx::Node;

use super::prelude::*;
use crate::ir::reduction_identity;

/// A pooling window over the trailing `spatial` dims.
struct Window {
    kernel: Vec<i64>,
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    /// Extra padding on the high side that ceil_mode needs.
    extra: Vec<i64>,
}

impl Window {
    /// The window of node `n`, pooling `input` (spatial sizes) to `pooled` (spatial sizes).
    fn of(cx: &Ctx, n: &Node, input: &[i64], pooled: &[i64]) -> OpResult<Window> {
        let spatial = input.len();
        let kernel = per_dim(cx.ints(n, "kernel_size", None)?, spatial, 1, "kernel_size")?;
        let stride_arg = cx.ints(n, "stride", Some(&[]))?;
        let stride = if stride_arg.is_empty() {
            kernel.clone()
        } else {
            per_dim(stride_arg, spatial, 1, "stride")?
        };
        let padding = per_dim(cx.ints(n, "padding", Some(&[0]))?, spatial, 0, "padding")?;
        let dilation = per_dim(cx.ints(n, "dilation", Some(&[1]))?, spatial, 1, "dilation")?;
        if kernel
            .iter()
            .chain(&stride)
            .chain(&dilation)
            .any(|&v| v < 1)
            || padding.iter().any(|&p| p < 0)
        {
            return err(format!(
                "not supported: pooling window kernel {kernel:?}, stride {stride:?}, padding \
                 {padding:?}, dilation {dilation:?}"
            ));
        }
        let extra = (0..spatial)
            .map(|i| {
                let span = (kernel[i] - 1) * dilation[i] + 1;
                ((pooled[i] - 1) * stride[i] + span - input[i] - 2 * padding[i]).max(0)
            })
            .collect();
        Ok(Window {
            kernel,
            stride,
            padding,
            dilation,
            extra,
        })
    }

    /// `op` over each window of `x` (padding holds `op`'s identity). A batched input
    /// [N, C, spatial...] is reduced channels-last, [N, spatial..., C], and transposed back:
    /// XLA keeps convolution outputs channels-last, so around a pooling between convolutions
    /// both transposes vanish, where a channels-first reduction made XLA copy the tensor to
    /// channels-first and back (ResNet-18 on XLA:CPU: about 6% of its time).
    fn reduce(&self, cx: &mut Ctx, x: Value, op: BinaryOp) -> OpResult<Value> {
        let rank = cx.b.ty(x).rank();
        let spatial = self.kernel.len();
        let elem = cx.b.elem(x);
        let init = cx.b.scalar(elem, reduction_identity(op, elem));
        let kernel = full_rank(rank, spatial, &self.kernel, 1);
        let stride = full_rank(rank, spatial, &self.stride, 1);
        let padding = self.full_padding(rank);
        if rank != spatial + 2 {
            return Ok(cx
                .b
                .reduce_window(x, init, &kernel, &stride, &padding, op)?);
        }
        // [N, C, s...] -> [N, s..., C] and back.
        let to_last: Vec<i64> = [0].into_iter().chain(2..rank as i64).chain([1]).collect();
        let to_first: Vec<i64> = [0, rank as i64 - 1]
            .into_iter()
            .chain(1..rank as i64 - 1)
            .collect();
        let permuted = |v: &[i64]| to_last.iter().map(|&d| v[d as usize]).collect::<Vec<_>>();
        let padding: Vec<(i64, i64)> = to_last.iter().map(|&d| padding[d as usize]).collect();
        let last = cx.b.transpose(x, &to_last)?;
        let pooled = cx.b.reduce_window(
            last,
            init,
            &permuted(&kernel),
            &permuted(&stride),
            &padding,
            op,
        )?;
        Ok(cx.b.transpose(pooled, &to_first)?)
    }

    /// Low and high padding of every dim of a rank-`rank` tensor (leading dims unpadded).
    fn full_padding(&self, rank: usize) -> Vec<(i64, i64)> {
        let spatial = self.kernel.len();
        let mut padding = vec![(0, 0); rank - spatial];
        padding.extend((0..spatial).map(|i| (self.padding[i], self.padding[i] + self.extra[i])));
        padding
    }
}

/// Expands per-spatial-dim window attributes to the full rank (leading dims untouched).
fn full_rank(rank: usize, spatial: usize, v: &[i64], fill: i64) -> Vec<i64> {
    let mut out = vec![fill; rank - spatial];
    out.extend_from_slice(v);
    out
}

fn pool_spatial(n: &Node) -> usize {
    if n.target.contains("1d") {
        1
    } else if n.target.contains("3d") {
        3
    } else {
        2
    }
}

/// The trailing `spatial` sizes of `shape`.
fn spatial_of(shape: &[i64], spatial: usize) -> OpResult<Vec<i64>> {
    if shape.len() < spatial + 1 {
        return err(format!(
            "a {spatial}-d pooling needs a tensor of rank {} or {}, got shape {shape:?}",
            spatial + 1,
            spatial + 2
        ));
    }
    Ok(shape[shape.len() - spatial..].to_vec())
}

/// A forward pooling node's input, output type and window.
fn forward_pooling(cx: &Ctx, n: &Node) -> OpResult<(Value, TensorType, Window)> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let spatial = pool_spatial(n);
    let w = Window::of(
        cx,
        n,
        &spatial_of(cx.b.shape(x), spatial)?,
        &spatial_of(&out.shape, spatial)?,
    )?;
    Ok((x, out, w))
}

fn max_pool(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (x, out, w) = forward_pooling(cx, n)?;
    let slots = output_slots(n);
    let indices_used = slots
        .get(1)
        .copied()
        .flatten()
        .is_some_and(|name| cx.is_used(name));
    if indices_used || w.dilation.iter().any(|&d| d != 1) {
        let (values, indices) = max_pool_with_indices(cx, x, &w, &out.shape)?;
        let mut outs = vec![Some(values), Some(indices)];
        outs.truncate(slots.len());
        return Ok(outs);
    }
    let mut outs = vec![Some(w.reduce(cx, x, BinaryOp::Max)?)];
    // Indices no later node reads are not computed.
    outs.extend((1..slots.len()).map(|_| None));
    Ok(outs)
}

/// Max pooling that also returns, per output, the flat position (within its plane) of the
/// element taken, as torch's kernel picks it: scanning the window in row-major order, a larger
/// value or a NaN replaces the current one; padding is never taken.
fn max_pool_with_indices(
    cx: &mut Ctx,
    x: Value,
    w: &Window,
    out_shape: &[i64],
) -> OpResult<(Value, Value)> {
    let shape = cx.b.shape(x).to_vec();
    let rank = shape.len();
    let spatial = w.kernel.len();
    let lead = rank - spatial;
    let elem = cx.b.elem(x);
    let lowest = cx.b.scalar(elem, reduction_identity(BinaryOp::Max, elem));
    let padding = w.full_padding(rank);
    let low: Vec<i64> = padding.iter().map(|p| p.0).collect();
    let high: Vec<i64> = padding.iter().map(|p| p.1).collect();
    let padded = cx.b.pad(x, lowest, &low, &high, &vec![0; rank])?;
    let index_ty = TensorType::new(out_shape.to_vec(), DType::I64);
    // Row-major stride of each spatial dim within a plane.
    let mut plane_stride = vec![1; spatial];
    for i in (0..spatial.saturating_sub(1)).rev() {
        plane_stride[i] = plane_stride[i + 1] * shape[lead + i + 1];
    }
    // Per spatial dim: the input coordinate of the window start (o * stride - padding).
    let mut starts = Vec::with_capacity(spatial);
    for i in 0..spatial {
        let o = cx.b.iota(index_ty.clone(), (lead + i) as i64)?;
        let s = cx.full_like(o, w.stride[i] as f64, None);
        let p = cx.full_like(o, w.padding[i] as f64, None);
        let os = cx.b.binary(BinaryOp::Mul, o, s)?;
        starts.push(cx.b.binary(BinaryOp::Sub, os, p)?);
    }
    // torch starts from the first in-bounds position of the window, with the lowest value.
    let mut first = cx.b.splat(&index_ty, 0.0);
    for (i, &start) in starts.iter().enumerate() {
        let zero = cx.full_like(start, 0.0, None);
        let d = cx.full_like(start, w.dilation[i] as f64, None);
        let d1 = cx.full_like(start, (w.dilation[i] - 1) as f64, None);
        let neg = cx.b.binary(BinaryOp::Sub, zero, start)?;
        let before = cx.b.binary(BinaryOp::Max, neg, zero)?;
        let rounded = cx.b.binary(BinaryOp::Add, before, d1)?;
        let steps = cx.b.binary(BinaryOp::Div, rounded, d)?;
        let skip = cx.b.binary(BinaryOp::Mul, steps, d)?;
        let coord = cx.b.binary(BinaryOp::Add, start, skip)?;
        let rs = cx.full_like(coord, plane_stride[i] as f64, None);
        let part = cx.b.binary(BinaryOp::Mul, coord, rs)?;
        first = cx.b.binary(BinaryOp::Add, first, part)?;
    }
    let mut best = cx.b.splat(
        &TensorType::new(out_shape.to_vec(), elem),
        reduction_identity(BinaryOp::Max, elem),
    );
    let mut best_index = first;
    let window_count: i64 = w.kernel.iter().product();
    for flat in 0..window_count {
        // The kernel offset (j_1, ..., j_n) of this step, row-major.
        let mut rest = flat;
        let mut j = vec![0; spatial];
        for i in (0..spatial).rev() {
            j[i] = rest % w.kernel[i];
            rest /= w.kernel[i];
        }
        let mut begin = vec![0; rank];
        let mut limit = shape[..lead].to_vec();
        let mut strides = vec![1; rank];
        let mut position = cx.b.splat(&index_ty, 0.0);
        for i in 0..spatial {
            let offset = j[i] * w.dilation[i];
            begin[lead + i] = offset;
            limit.push(offset + (out_shape[lead + i] - 1) * w.stride[i] + 1);
            strides[lead + i] = w.stride[i];
            let off = cx.full_like(starts[i], offset as f64, None);
            let coord = cx.b.binary(BinaryOp::Add, starts[i], off)?;
            let rs = cx.full_like(coord, plane_stride[i] as f64, None);
            let part = cx.b.binary(BinaryOp::Mul, coord, rs)?;
            position = cx.b.binary(BinaryOp::Add, position, part)?;
        }
        let v = cx.b.slice(padded, &begin, &limit, &strides)?;
        let larger = cx.b.compare(CompareDir::Gt, v, best)?;
        let take = if elem.is_float() {
            let nan = cx.b.compare(CompareDir::Ne, v, v)?;
            cx.b.binary(BinaryOp::Or, larger, nan)?
        } else {
            larger
        };
        best = cx.b.select(take, v, best)?;
        best_index = cx.b.select(take, position, best_index)?;
    }
    Ok((best, best_index))
}

/// The backward of max pooling: each gradient goes to the position its output took.
fn max_pool_backward(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let grad = cx.tensor(n, "grad_output")?;
    let x = cx.tensor(n, "self")?;
    let indices = cx.tensor(n, "indices")?;
    let spatial = pool_spatial(n);
    let shape = cx.b.shape(x).to_vec();
    let grad_shape = cx.b.shape(grad).to_vec();
    let lead = shape
        .len()
        .checked_sub(spatial)
        .filter(|&l| l >= 1)
        .ok_or_else(|| {
            OpError(format!(
                "a {spatial}-d pooling backward needs a batched or unbatched input, got {shape:?}"
            ))
        })?;
    let mut planes = shape[..lead].to_vec();
    let mut flat_in = planes.clone();
    flat_in.push(shape[lead..].iter().product());
    planes.push(grad_shape[lead..].iter().product());
    let grad = cx.b.reshape(grad, &planes)?;
    let grad = cx.b.convert(grad, cx.b.elem(x));
    let indices = cx.b.reshape(indices, &planes)?;
    let zeros = cx.b.splat(&TensorType::new(flat_in, cx.b.elem(x)), 0.0);
    let summed = scatter_into(
        cx,
        zeros,
        lead,
        indices,
        grad,
        ScatterMode::Combine(BinaryOp::Add),
    )?;
    Ok(vec![Some(cx.b.reshape(summed, &shape)?)])
}

/// What average pooling divides each window's sum by: `divisor_override`, or the number of
/// elements the window covers: the input, plus the explicit padding when count_include_pad
/// (never the extra ceil_mode padding), as torch does. Shaped like the pooled tensor.
fn avg_divisor(
    cx: &mut Ctx,
    n: &Node,
    input_shape: &[i64],
    elem: DType,
    w: &Window,
) -> OpResult<Value> {
    let rank = input_shape.len();
    let spatial = w.kernel.len();
    let include_pad = cx.bool(n, "count_include_pad", true)?;
    let kernel = full_rank(rank, spatial, &w.kernel, 1);
    let strides = full_rank(rank, spatial, &w.stride, 1);
    let zero = cx.b.scalar(elem, 0.0);
    let ones =
        cx.b.splat(&TensorType::new(input_shape.to_vec(), elem), 1.0);
    let (region, rest): (Value, Vec<(i64, i64)>) = if include_pad {
        let one = cx.b.scalar(elem, 1.0);
        let low = full_rank(rank, spatial, &w.padding, 0);
        let padded = cx.b.pad(ones, one, &low, &low, &vec![0; rank])?;
        let mut rest = vec![(0, 0); rank - spatial];
        rest.extend((0..spatial).map(|i| (0, w.extra[i])));
        (padded, rest)
    } else {
        (ones, w.full_padding(rank))
    };
    let counts =
        cx.b.reduce_window(region, zero, &kernel, &strides, &rest, BinaryOp::Add)?;
    Ok(match cx.opt_int(n, "divisor_override")? {
        Some(d) => cx.full_like(counts, d as f64, None),
        None => counts,
    })
}

/// Average pooling, summed and divided in the accumulation type (float32 for 16-bit floats, as
/// torch's kernels compute) and rounded once.
fn avg_pool(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (x, _, w) = forward_pooling(cx, n)?;
    let shape = cx.b.shape(x).to_vec();
    let elem = cx.b.elem(x);
    let wide = cx.b.convert(x, elem.accumulation());
    let sum = w.reduce(cx, wide, BinaryOp::Add)?;
    let divisor = avg_divisor(cx, n, &shape, elem.accumulation(), &w)?;
    let mean = cx.b.binary(BinaryOp::Div, sum, divisor)?;
    Ok(vec![Some(cx.b.convert(mean, elem))])
}

/// The backward of average pooling: every input position sums the (divided) gradients of the
/// windows that cover it. The gradient is dilated by the stride, padded so that each input
/// position sees exactly the windows over it, and summed over kernel-sized windows.
fn avg_pool_backward(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let grad = cx.tensor(n, "grad_output")?;
    let x = cx.tensor(n, "self")?;
    let spatial = pool_spatial(n);
    let shape = cx.b.shape(x).to_vec();
    let rank = shape.len();
    let pooled = cx.b.shape(grad).to_vec();
    let w = Window::of(
        cx,
        n,
        &spatial_of(&shape, spatial)?,
        &spatial_of(&pooled, spatial)?,
    )?;
    let elem = cx.b.elem(x);
    let grad = cx.b.convert(grad, elem);
    let divisor = avg_divisor(cx, n, &shape, elem, &w)?;
    let share = cx.b.binary(BinaryOp::Div, grad, divisor)?;
    let zero = cx.b.scalar(elem, 0.0);
    let mut low = vec![0; rank];
    let mut high = vec![0; rank];
    let mut interior = vec![0; rank];
    for i in 0..spatial {
        let d = rank - spatial + i;
        low[d] = w.kernel[i] - 1 - w.padding[i];
        high[d] = shape[d] + w.padding[i] - (pooled[d] - 1) * w.stride[i] - 1;
        interior[d] = w.stride[i] - 1;
    }
    let spread = cx.b.pad(share, zero, &low, &high, &interior)?;
    let summed = cx.b.reduce_window(
        spread,
        zero,
        &full_rank(rank, spatial, &w.kernel, 1),
        &vec![1; rank],
        &vec![(0, 0); rank],
        BinaryOp::Add,
    )?;
    Ok(vec![Some(summed)])
}

/// The adaptive-average-pooling matrix of one dim: row j averages input
/// [floor(j*I/O), ceil((j+1)*I/O)).
fn adaptive_matrix(input: i64, output: i64) -> Vec<f64> {
    let mut m = vec![0.0; (output * input) as usize];
    for j in 0..output {
        let start = (j * input) / output;
        let end = ((j + 1) * input + output - 1) / output;
        for i in start..end {
            m[(j * input + i) as usize] = 1.0 / (end - start) as f64;
        }
    }
    m
}

/// Applies the constant matrix `m` (rows x cols) along dim `d` of `x`: with `transposed`,
/// `m^T` (x has `rows` there and gets `cols`), else `m` (x has `cols` there and gets `rows`).
fn apply_along(
    cx: &mut Ctx,
    x: Value,
    d: usize,
    m: &[f64],
    (rows, cols): (i64, i64),
    transposed: bool,
) -> OpResult<Value> {
    let elem = cx.b.elem(x);
    let m = cx.b.dense(TensorType::new(vec![rows, cols], elem), m)?;
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![d as i64],
        rhs_contracting: vec![if transposed { 0 } else { 1 }],
    };
    let product = dot(cx, x, m, dims)?;
    // dot_general puts the new dim last; move it back to `d`.
    let rank = cx.b.ty(x).rank() as i64;
    let mut perm: Vec<i64> = (0..rank - 1).collect();
    perm.insert(d, rank - 1);
    Ok(cx.b.transpose(product, &perm)?)
}

fn adaptive_avg_pool(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = cx.out_type(n, 0)?;
    // In the accumulation type, rounded once at the end (as avg_pool).
    let x = cx.tensor(n, "self")?;
    let mut x = cx.b.convert(x, out.elem.accumulation());
    let spatial = pool_spatial(n);
    let rank = cx.b.ty(x).rank();
    spatial_of(cx.b.shape(x), spatial)?;
    // One spatial dimension at a time.
    for i in 0..spatial {
        let d = rank - spatial + i;
        let input = cx.b.shape(x)[d];
        let o = out.shape[d];
        if input % o == 0 {
            // Equal windows: a strided window sum, cheaper than the matrix.
            let k = input / o;
            let mut kernel = vec![1; rank];
            kernel[d] = k;
            let elem = cx.b.elem(x);
            let zero = cx.b.scalar(elem, 0.0);
            let s = cx.b.reduce_window(
                x,
                zero,
                &kernel,
                &kernel,
                &vec![(0, 0); rank],
                BinaryOp::Add,
            )?;
            let c = cx.full_like(s, k as f64, None);
            x = cx.b.binary(BinaryOp::Div, s, c)?;
        } else {
            x = apply_along(cx, x, d, &adaptive_matrix(input, o), (o, input), false)?;
        }
    }
    Ok(vec![Some(cx.b.convert(x, out.elem))])
}

/// Adaptive max pooling with indices: output position i of a spatial dimension of size `in`
/// pools [floor(i in / out), ceil((i + 1) in / out)); its index is the flat position in the
/// input plane (h W + w) of the window's largest value (a NaN over any number, the first on
/// ties), as torch's kernel picks it. One window reduction per output position.
fn adaptive_max_pool(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let (values_ty, index_ty) = (cx.out_type(n, 0)?, cx.out_type(n, 1)?);
    let spatial = pool_spatial(n);
    let shape = cx.b.shape(x).to_vec();
    let rank = shape.len();
    spatial_of(&shape, spatial)?;
    let lead = rank - spatial;
    let sizes = shape[lead..].to_vec();
    let outs = values_ty.shape[lead..].to_vec();
    if sizes.contains(&0) {
        return err("adaptive max pooling of an empty spatial dimension");
    }
    // Every window at once: along each spatial dim, output i reads `reach` positions from its
    // window's start, the ones past its end repeating the window's last (the maximum and the
    // first position holding it do not change). One reduction over the gathered windows: the
    // program's size does not grow with the number of outputs.
    let windows: Vec<Vec<(i64, i64)>> = sizes
        .iter()
        .zip(&outs)
        .map(|(&input, &o)| {
            (0..o)
                .map(|i| (i * input / o, ((i + 1) * input + o - 1) / o))
                .collect()
        })
        .collect();
    let reach: Vec<i64> = windows
        .iter()
        .map(|w| w.iter().map(|(s, e)| e - s).max().unwrap_or(1))
        .collect();
    // source[d][i * reach + k]: the input position output i reads at offset k along dim d.
    let source: Vec<Vec<i64>> = windows
        .iter()
        .zip(&reach)
        .map(|(w, &r)| {
            w.iter()
                .flat_map(|&(s, e)| (0..r).map(move |k| (s + k).min(e - 1)))
                .collect()
        })
        .collect();
    let mut gathered = x;
    for d in 0..spatial {
        // Dim lead + 2d holds the outputs so far; the dims before it alternate outputs and
        // offsets.
        let axis = lead + 2 * d;
        let values: Vec<f64> = source[d].iter().map(|&p| p as f64).collect();
        let index = cx.b.dense(
            TensorType::new(vec![outs[d], reach[d]], DType::I64),
            &values,
        )?;
        gathered = take_along(cx, gathered, axis, index)?;
    }
    // [lead.., o1, r1, o2, r2, ..] -> [lead.., o1, o2, .., r1 * r2 * ..]
    let mut perm: Vec<i64> = (0..lead as i64).collect();
    perm.extend((0..spatial).map(|d| (lead + 2 * d) as i64));
    perm.extend((0..spatial).map(|d| (lead + 2 * d + 1) as i64));
    let gathered = cx.b.transpose(gathered, &perm)?;
    let window: i64 = reach.iter().product();
    let mut flat_shape = shape[..lead].to_vec();
    flat_shape.extend(&outs);
    flat_shape.push(window);
    let gathered = cx.b.reshape(gathered, &flat_shape)?;
    let (value, local) = super::reduction::arg_reduce(cx, gathered, rank, true)?;
    // The offset within the window, unravelled per dim, and the input position it reads.
    let mut remaining = local;
    let mut position = cx.full_like(local, 0.0, None);
    let mut plane_stride = 1;
    for d in (0..spatial).rev() {
        let r = cx.full_like(local, reach[d] as f64, None);
        let offset = cx.b.binary(BinaryOp::Rem, remaining, r)?;
        remaining = cx.b.binary(BinaryOp::Div, remaining, r)?;
        // The output's own coordinate along dim d, then source[d][i * reach + offset].
        let out_shape = cx.b.shape(local).to_vec();
        let output_index =
            cx.b.iota(TensorType::new(out_shape, DType::I64), (lead + d) as i64)?;
        let row = cx.scaled(output_index, reach[d] as f64)?;
        let entry = cx.b.binary(BinaryOp::Add, row, offset)?;
        let values: Vec<f64> = source[d].iter().map(|&p| p as f64).collect();
        let table = cx.b.dense(
            TensorType::new(vec![outs[d] * reach[d]], DType::I64),
            &values,
        )?;
        let coordinate = take_along(cx, table, 0, entry)?;
        let scaled = cx.scaled(coordinate, plane_stride as f64)?;
        position = cx.b.binary(BinaryOp::Add, position, scaled)?;
        plane_stride *= sizes[d];
    }
    let indices = cx.b.convert(position, index_ty.elem);
    Ok(vec![
        Some(cx.b.reshape(value, &values_ty.shape)?),
        Some(cx.b.reshape(indices, &index_ty.shape)?),
    ])
}

/// The backward of adaptive max pooling: each output's gradient added to the input element its
/// index names (flat in the input plane).
fn adaptive_max_pool_backward(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let grad = cx.tensor(n, "grad_output")?;
    let x = cx.tensor(n, "self")?;
    let indices = cx.tensor(n, "indices")?;
    let spatial = pool_spatial(n);
    let shape = cx.b.shape(x).to_vec();
    let rank = shape.len();
    spatial_of(&shape, spatial)?;
    let lead = shape[..rank - spatial].to_vec();
    let plane: i64 = shape[rank - spatial..].iter().product();
    let outputs: i64 = cx.b.shape(grad)[rank - spatial..].iter().product();
    let mut flat_out = lead.clone();
    flat_out.push(outputs);
    let mut flat_in = lead.clone();
    flat_in.push(plane);
    let elem = cx.out_type(n, 0)?.elem;
    let acc = elem.accumulation();
    let g = cx.b.convert(grad, acc);
    let g = cx.b.reshape(g, &flat_out)?;
    let idx = cx.b.reshape(indices, &flat_out)?;
    let zeros = cx.b.splat(&TensorType::new(flat_in, acc), 0.0);
    let dx = scatter_into(
        cx,
        zeros,
        lead.len(),
        idx,
        g,
        ScatterMode::Combine(BinaryOp::Add),
    )?;
    let dx = cx.b.reshape(dx, &shape)?;
    Ok(vec![Some(cx.b.convert(dx, elem))])
}

/// The backward of adaptive average pooling: the transposed averaging matrix along each dim.
fn adaptive_avg_pool_backward(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut g = cx.tensor(n, "grad_output")?;
    let x = cx.tensor(n, "self")?;
    let spatial = pool_spatial(n);
    let shape = cx.b.shape(x).to_vec();
    spatial_of(&shape, spatial)?;
    let rank = shape.len();
    g = cx.b.convert(g, cx.b.elem(x));
    for i in 0..spatial {
        let d = rank - spatial + i;
        let (input, o) = (shape[d], cx.b.shape(g)[d]);
        g = apply_along(cx, g, d, &adaptive_matrix(input, o), (o, input), true)?;
    }
    Ok(vec![Some(g)])
}

pub fn register(r: &mut Registry) {
    r.add(
        &[
            "aten.adaptive_max_pool1d.default",
            "aten.adaptive_max_pool2d.default",
            "aten.adaptive_max_pool3d.default",
        ],
        adaptive_max_pool,
    );
    r.add(
        &[
            "aten.adaptive_max_pool2d_backward.default",
            "aten.adaptive_max_pool3d_backward.default",
        ],
        adaptive_max_pool_backward,
    );
    r.add(
        &[
            "aten.max_pool1d.default",
            "aten.max_pool2d.default",
            "aten.max_pool3d.default",
            "aten.max_pool2d_with_indices.default",
            "aten.max_pool3d_with_indices.default",
        ],
        max_pool,
    );
    r.add(
        &[
            "aten.max_pool2d_with_indices_backward.default",
            "aten.max_pool3d_with_indices_backward.default",
        ],
        max_pool_backward,
    );
    r.add(
        &[
            "aten.avg_pool1d.default",
            "aten.avg_pool2d.default",
            "aten.avg_pool3d.default",
        ],
        avg_pool,
    );
    r.add(
        &[
            "aten.avg_pool2d_backward.default",
            "aten.avg_pool3d_backward.default",
        ],
        avg_pool_backward,
    );
    r.add(
        &[
            "aten.adaptive_avg_pool1d.default",
            "aten.adaptive_avg_pool2d.default",
            "aten._adaptive_avg_pool2d.default",
            "aten.adaptive_avg_pool3d.default",
            "aten._adaptive_avg_pool3d.default",
        ],
        adaptive_avg_pool,
    );
    r.add(
        &[
            "aten._adaptive_avg_pool2d_backward.default",
            "aten._adaptive_avg_pool3d_backward.default",
        ],
        adaptive_avg_pool_backward,
    );
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn max_pooling_reduces_windows_from_minus_infinity() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[1, 2, 4, 4]);
        let y = g.node1(
            "aten.max_pool2d.default",
            vec![
                ("self", t(&x)),
                ("kernel_size", Arg::Ints(vec![2, 2])),
                ("stride", Arg::Ints(vec![2, 2])),
            ],
            DType::F32,
            &[1, 2, 2, 2],
        );
        // Channels-last, where XLA keeps convolution outputs, and back.
        assert_checks(
            &g.text(&[&y]),
            &[
                "stablehlo.constant splat=0xFF800000 : tensor<f32>",
                "stablehlo.transpose %0 perm=[0, 2, 3, 1]",
                "stablehlo.reduce_window %2, %1 window=[1, 2, 2, 1] strides=[1, 2, 2, 1]",
                "body=stablehlo.maximum",
                "stablehlo.transpose %3 perm=[0, 3, 1, 2]",
            ],
        );
    }
}
