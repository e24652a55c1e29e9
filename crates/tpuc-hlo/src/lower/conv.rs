//! Convolution and pooling in 1-3 spatial dimensions (torch's NC... layout).

use tpuc_fx::Node;

use super::*;
use crate::builder::reduction_identity;

/// A per-spatial-dimension list: one value repeated, or one per dimension.
fn per_dim(v: Vec<i64>, spatial: usize, default: i64, what: &str) -> OpResult<Vec<i64>> {
    match v.len() {
        0 => Ok(vec![default; spatial]),
        1 => Ok(vec![v[0]; spatial]),
        n if n == spatial => Ok(v),
        n => err(format!(
            "{what} has {n} values for {spatial} spatial dimensions"
        )),
    }
}

fn conv(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut x = cx.tensor(n, "input")?;
    let w = cx.tensor(n, "weight")?;
    let wrank = cx.b.ty(w).rank();
    let spatial = wrank - 2;
    let unbatched = cx.b.ty(x).rank() == wrank - 1;
    if unbatched {
        let mut s = cx.b.shape(x).to_vec();
        s.insert(0, 1);
        x = cx.b.reshape(x, &s)?;
    }
    // aten.convolution says whether it is transposed; aten.conv_transposeNd always is.
    let transposed = cx.bool(n, "transposed", n.target.starts_with("aten.conv_transpose"))?;
    if let Some(tpuc_fx::Arg::Str(p)) = n.arg("padding") {
        return err(format!(
            "not supported: padding={p:?} (pass explicit padding)"
        ));
    }
    let stride = per_dim(cx.ints(n, "stride", Some(&[1]))?, spatial, 1, "stride")?;
    let padding = per_dim(cx.ints(n, "padding", Some(&[0]))?, spatial, 0, "padding")?;
    let dilation = per_dim(cx.ints(n, "dilation", Some(&[1]))?, spatial, 1, "dilation")?;
    let groups = cx.int(n, "groups", Some(1))?;
    // torch computes 16-bit float convolutions in float32 and rounds once.
    let mut operands = [x, w];
    let half = super::linear::widened(cx, &mut operands);
    let [x, w] = operands;
    let precision = super::linear::precision(cx, cx.b.elem(x));
    let (w, attrs) = if transposed {
        let output_padding = per_dim(
            cx.ints(n, "output_padding", Some(&[0]))?,
            spatial,
            0,
            "output_padding",
        )?;
        let kernel = cx.b.shape(w)[2..].to_vec();
        // The gradient of a strided convolution: dilate the input by the stride and pad it so
        // that every kernel tap reaches every input element, with the kernel flipped.
        let padding = (0..spatial)
            .map(|i| {
                let reach = dilation[i] * (kernel[i] - 1);
                (reach - padding[i], reach - padding[i] + output_padding[i])
            })
            .collect();
        let w = transposed_kernel(cx, w, groups, spatial)?;
        let attrs = ConvAttrs {
            strides: vec![1; spatial],
            padding,
            lhs_dilation: stride,
            rhs_dilation: dilation,
            groups,
            precision,
        };
        (w, attrs)
    } else {
        let attrs = ConvAttrs {
            strides: stride,
            padding: padding.iter().map(|&p| (p, p)).collect(),
            lhs_dilation: vec![1; spatial],
            rhs_dilation: dilation,
            groups,
            precision,
        };
        (w, attrs)
    };
    let y = cx.b.convolution(x, w, attrs)?;
    let mut y = super::linear::narrowed(cx, y, half);
    if let Some(bias) = cx.opt_tensor(n, "bias")? {
        let shape = cx.b.shape(y).to_vec();
        let bias = cx.b.broadcast_in_dim(bias, &shape, &[1])?;
        y = cx.b.binary(BinaryOp::Add, y, bias)?;
    }
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.reshape(y, &out.shape)?)])
}

/// A transposed convolution's weight (in, out/groups, k...) as the kernel of the equivalent
/// direct convolution: (out, in/groups, k...), spatially reversed.
fn transposed_kernel(cx: &mut Ctx, w: Value, groups: i64, spatial: usize) -> OpResult<Value> {
    let shape = cx.b.shape(w).to_vec();
    let (inputs, outputs_per_group) = (shape[0], shape[1]);
    if groups < 1 || inputs % groups != 0 {
        return err(format!(
            "groups={groups} does not divide {inputs} input channels"
        ));
    }
    let mut grouped = vec![groups, inputs / groups, outputs_per_group];
    grouped.extend_from_slice(&shape[2..]);
    let w = cx.b.reshape(w, &grouped)?;
    let mut perm: Vec<i64> = vec![0, 2, 1];
    perm.extend((0..spatial as i64).map(|i| i + 3));
    let w = cx.b.transpose(w, &perm)?;
    let mut direct = vec![groups * outputs_per_group, inputs / groups];
    direct.extend_from_slice(&shape[2..]);
    let w = cx.b.reshape(w, &direct)?;
    let spatial_dims: Vec<i64> = (0..spatial as i64).map(|i| i + 2).collect();
    Ok(cx.b.reverse(w, &spatial_dims)?)
}

struct Window {
    kernel: Vec<i64>,
    stride: Vec<i64>,
    padding: Vec<i64>,
    /// Extra padding on the high side that ceil_mode needs.
    extra: Vec<i64>,
}

fn window(cx: &Ctx, n: &Node, x: Value, spatial: usize, out: &TensorType) -> OpResult<Window> {
    let kernel = per_dim(cx.ints(n, "kernel_size", None)?, spatial, 1, "kernel_size")?;
    let stride_arg = cx.ints(n, "stride", Some(&[]))?;
    let stride = if stride_arg.is_empty() {
        kernel.clone()
    } else {
        per_dim(stride_arg, spatial, 1, "stride")?
    };
    let padding = per_dim(cx.ints(n, "padding", Some(&[0]))?, spatial, 0, "padding")?;
    let dilation = per_dim(cx.ints(n, "dilation", Some(&[1]))?, spatial, 1, "dilation")?;
    if dilation.iter().any(|&d| d != 1) {
        return err(format!("not supported: pooling with dilation {dilation:?}"));
    }
    let shape = cx.b.shape(x);
    let rank = shape.len();
    let extra = (0..spatial)
        .map(|i| {
            let input = shape[rank - spatial + i];
            let o = out.shape[out.rank() - spatial + i];
            ((o - 1) * stride[i] + kernel[i] - input - 2 * padding[i]).max(0)
        })
        .collect();
    Ok(Window {
        kernel,
        stride,
        padding,
        extra,
    })
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

fn max_pool(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let spatial = pool_spatial(n);
    let rank = cx.b.ty(x).rank();
    let w = window(cx, n, x, spatial, &out)?;
    let elem = cx.b.elem(x);
    let init = cx.b.scalar(elem, reduction_identity(BinaryOp::Max, elem));
    let mut padding: Vec<(i64, i64)> = vec![(0, 0); rank - spatial];
    padding.extend((0..spatial).map(|i| (w.padding[i], w.padding[i] + w.extra[i])));
    let y = cx.b.reduce_window(
        x,
        init,
        &full_rank(rank, spatial, &w.kernel, 1),
        &full_rank(rank, spatial, &w.stride, 1),
        &padding,
        BinaryOp::Max,
    )?;
    let mut outs = vec![Some(y)];
    // max_pool*_with_indices: the indices output is not computed; using it is an error.
    outs.extend((1..n.defined_tensors().len()).map(|_| None));
    Ok(outs)
}

fn avg_pool(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let spatial = pool_spatial(n);
    let rank = cx.b.ty(x).rank();
    let w = window(cx, n, x, spatial, &out)?;
    let include_pad = cx.bool(n, "count_include_pad", true)?;
    let divisor = cx.opt_int(n, "divisor_override")?;
    let elem = cx.b.elem(x);
    let zero = cx.b.scalar(elem, 0.0);
    let kernel = full_rank(rank, spatial, &w.kernel, 1);
    let strides = full_rank(rank, spatial, &w.stride, 1);
    let mut padding: Vec<(i64, i64)> = vec![(0, 0); rank - spatial];
    padding.extend((0..spatial).map(|i| (w.padding[i], w.padding[i] + w.extra[i])));
    let sum =
        cx.b.reduce_window(x, zero, &kernel, &strides, &padding, BinaryOp::Add)?;
    let y = if let Some(d) = divisor {
        let c = cx.full_like(sum, d as f64, None);
        cx.b.binary(BinaryOp::Div, sum, c)?
    } else {
        // Count the elements each window covers: the input, plus the explicit padding when
        // count_include_pad (never the extra ceil_mode padding), as torch does.
        let shape = cx.b.shape(x).to_vec();
        let ones = cx.b.splat(&TensorType::new(shape, elem), 1.0);
        let (region, rest): (Value, Vec<(i64, i64)>) = if include_pad {
            let one = cx.b.scalar(elem, 1.0);
            let low = full_rank(rank, spatial, &w.padding, 0);
            let padded = cx.b.pad(ones, one, &low, &low, &vec![0; rank])?;
            let mut rest = vec![(0, 0); rank - spatial];
            rest.extend((0..spatial).map(|i| (0, w.extra[i])));
            (padded, rest)
        } else {
            (ones, padding.clone())
        };
        let counts =
            cx.b.reduce_window(region, zero, &kernel, &strides, &rest, BinaryOp::Add)?;
        cx.b.binary(BinaryOp::Div, sum, counts)?
    };
    Ok(vec![Some(y)])
}

fn adaptive_avg_pool(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let spatial = pool_spatial(n);
    let rank = cx.b.ty(x).rank();
    // One spatial dimension at a time: output j averages input [floor(j*I/O), ceil((j+1)*I/O)).
    for i in 0..spatial {
        let d = rank - spatial + i;
        let input = cx.b.shape(x)[d];
        let o = out.shape[d];
        if input % o == 0 {
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
            continue;
        }
        let mut parts = Vec::with_capacity(o as usize);
        for j in 0..o {
            let start = (j * input) / o;
            let end = ((j + 1) * input + o - 1) / o;
            let s = cx.b.slice_dim(x, d, start, end, 1)?;
            let mut shape = cx.b.shape(s).to_vec();
            let r = cx.b.reduce_by(s, &[d as i64], BinaryOp::Add)?;
            shape[d] = 1;
            let r = cx.b.reshape(r, &shape)?;
            let c = cx.full_like(r, (end - start) as f64, None);
            parts.push(cx.b.binary(BinaryOp::Div, r, c)?);
        }
        x = cx.b.concatenate(&parts, d as i64)?;
    }
    Ok(vec![Some(x)])
}

pub fn register(r: &mut Registry) {
    r.add(
        &[
            "aten.conv1d.default",
            "aten.conv2d.default",
            "aten.conv3d.default",
            "aten.conv_transpose1d.default",
            "aten.conv_transpose2d.input",
            "aten.conv_transpose3d.input",
            "aten.convolution.default",
        ],
        conv,
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
            "aten.avg_pool1d.default",
            "aten.avg_pool2d.default",
            "aten.avg_pool3d.default",
        ],
        avg_pool,
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
}
