//! Convolution in 1-3 spatial dimensions (torch's NC... layout).

use tpuc_fx::Node;

use super::prelude::*;

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
    let window = Strided {
        stride,
        padding,
        dilation,
    };
    let output_padding = if transposed {
        per_dim(
            cx.ints(n, "output_padding", Some(&[0]))?,
            spatial,
            0,
            "output_padding",
        )?
    } else {
        Vec::new()
    };
    let bias = cx.opt_tensor(n, "bias")?;
    let y = convolved(cx, x, w, bias, |cx, w, precision| {
        if transposed {
            let kernel = cx.b.shape(w)[2..].to_vec();
            let attrs = window.transposed(&kernel, &output_padding, groups, precision);
            Ok((transposed_kernel(cx, w, groups, spatial)?, attrs))
        } else {
            Ok((w, window.direct(groups, precision)))
        }
    })?;
    let out = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.reshape(y, &out.shape)?)])
}

/// `x` convolved with the kernel `w` as `layout` gives the attributes (and the kernel, which it
/// may lay out anew) for the precision torch's kernels compute in, plus `bias` per output
/// channel: 16-bit floats are computed in float32 and the bias added before the one rounding,
/// as torch's kernels do.
fn convolved(
    cx: &mut Ctx,
    x: Value,
    w: Value,
    bias: Option<Value>,
    layout: impl FnOnce(&mut Ctx, Value, Precision) -> OpResult<(Value, ConvAttrs)>,
) -> OpResult<Value> {
    let mut operands = [x, w];
    let half = widened(cx, &mut operands);
    let [x, w] = operands;
    let precision = precision(cx, cx.b.elem(x));
    let (w, attrs) = layout(cx, w, precision)?;
    let mut y = cx.b.convolution(x, w, attrs)?;
    if let Some(bias) = bias {
        let shape = cx.b.shape(y).to_vec();
        let bias = cx.b.convert(bias, cx.b.elem(y));
        let bias = cx.b.broadcast_in_dim(bias, &shape, &[1])?;
        y = cx.b.binary(BinaryOp::Add, y, bias)?;
    }
    Ok(narrowed(cx, y, half))
}

/// conv_tbc(self [time, batch, in], weight [kernel, in, out], bias [out], pad): a 1-d
/// convolution over time-major input, returning [time', batch, out].
fn conv_tbc(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let w = cx.tensor(n, "weight")?;
    let bias = cx.tensor(n, "bias")?;
    let pad = cx.int(n, "pad", Some(0))?;
    if cx.b.ty(x).rank() != 3 || cx.b.ty(w).rank() != 3 || cx.b.ty(bias).rank() != 1 {
        return err(format!(
            "conv_tbc needs a 3-d input and weight and a 1-d bias, got {}, {} and {}",
            cx.b.ty(x),
            cx.b.ty(w),
            cx.b.ty(bias)
        ));
    }
    let x = cx.b.transpose(x, &[1, 2, 0])?;
    let w = cx.b.transpose(w, &[2, 1, 0])?;
    let window = Strided {
        stride: vec![1],
        padding: vec![pad],
        dilation: vec![1],
    };
    let y = convolved(cx, x, w, Some(bias), |_, w, precision| {
        Ok((w, window.direct(1, precision)))
    })?;
    Ok(vec![Some(cx.b.transpose(y, &[2, 0, 1])?)])
}

/// The window of a direct convolution, per spatial dim.
struct Strided {
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
}

impl Strided {
    /// The attributes of this convolution itself.
    fn direct(&self, groups: i64, precision: Precision) -> ConvAttrs {
        ConvAttrs {
            strides: self.stride.clone(),
            padding: self.padding.iter().map(|&p| (p, p)).collect(),
            lhs_dilation: vec![1; self.stride.len()],
            rhs_dilation: self.dilation.clone(),
            groups,
            batch_groups: 1,
            precision,
            kernel: KernelLayout::OutInSpatial,
        }
    }

    /// The attributes of the transposed convolution (the gradient of this one with respect to
    /// its input): the input dilated by the stride and padded so that every kernel tap reaches
    /// every input element, with the kernel flipped (see [`transposed_kernel`]).
    fn transposed(
        &self,
        kernel: &[i64],
        output_padding: &[i64],
        groups: i64,
        precision: Precision,
    ) -> ConvAttrs {
        let padding = (0..kernel.len())
            .map(|i| {
                let reach = self.dilation[i] * (kernel[i] - 1);
                (
                    reach - self.padding[i],
                    reach - self.padding[i] + output_padding[i],
                )
            })
            .collect();
        ConvAttrs {
            strides: vec![1; kernel.len()],
            padding,
            lhs_dilation: self.stride.clone(),
            rhs_dilation: self.dilation.clone(),
            groups,
            batch_groups: 1,
            precision,
            kernel: KernelLayout::OutInSpatial,
        }
    }
}

/// convolution_backward: the gradients of the input, weight and bias, each computed when
/// `output_mask` asks for it. Of a direct convolution `y = D x`: the input's is a transposed
/// convolution of the output gradient, the weight's a convolution of the input with the output
/// gradient as kernel ([`weight_gradient`]), the bias's the output gradient summed. A transposed
/// convolution is `y = Dᵀ x` for the direct `D` of the same weight, so its input's gradient is
/// `D` of the output gradient, and its weight's is `D`'s weight gradient with the roles of input
/// and output gradient exchanged (⟨g, Dᵀx⟩ = ⟨D g, x⟩).
fn conv_backward(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let transposed = cx.bool(n, "transposed", false)?;
    let grad = cx.tensor(n, "grad_output")?;
    let x = cx.tensor(n, "input")?;
    let w = cx.tensor(n, "weight")?;
    let mask = match n.arg("output_mask") {
        Some(tpuc_fx::Arg::Bools(m)) if m.len() == 3 => [m[0], m[1], m[2]],
        _ => return err("output_mask should be three bools"),
    };
    let (xs, ws, gs) = (
        cx.b.shape(x).to_vec(),
        cx.b.shape(w).to_vec(),
        cx.b.shape(grad).to_vec(),
    );
    if ws.len() < 3 || xs.len() != ws.len() || gs.len() != ws.len() {
        return err(format!(
            "convolution_backward needs batched input, weight and gradient of one rank, got \
             {xs:?}, {ws:?} and {gs:?}"
        ));
    }
    let spatial = ws.len() - 2;
    let window = Strided {
        stride: per_dim(cx.ints(n, "stride", Some(&[1]))?, spatial, 1, "stride")?,
        padding: per_dim(cx.ints(n, "padding", Some(&[0]))?, spatial, 0, "padding")?,
        dilation: per_dim(cx.ints(n, "dilation", Some(&[1]))?, spatial, 1, "dilation")?,
    };
    let groups = cx.int(n, "groups", Some(1))?;
    let mut operands = [grad, x, w];
    let half = widened(cx, &mut operands);
    let [grad, x, w] = operands;
    let precision = precision(cx, cx.b.elem(x));
    let kernel = ws[2..].to_vec();
    let mut outs = vec![None, None, None];
    if mask[0] {
        let gx = if transposed {
            cx.b.convolution(grad, w, window.direct(groups, precision))?
        } else {
            // Output padding restores the input positions the forward's stride skipped at the end.
            let output_padding: Vec<i64> = (0..spatial)
                .map(|i| {
                    let reach = window.dilation[i] * (kernel[i] - 1);
                    xs[i + 2]
                        - ((gs[i + 2] - 1) * window.stride[i] - 2 * window.padding[i] + reach + 1)
                })
                .collect();
            let attrs = window.transposed(&kernel, &output_padding, groups, precision);
            let flipped = transposed_kernel(cx, w, groups, spatial)?;
            cx.b.convolution(grad, flipped, attrs)?
        };
        outs[0] = Some(narrowed(cx, gx, half));
    }
    if mask[1] {
        let (input, output_grad) = if transposed { (grad, x) } else { (x, grad) };
        let dw = weight_gradient(cx, input, output_grad, &window, &kernel, groups, precision)?;
        outs[1] = Some(narrowed(cx, dw, half));
    }
    if mask[2] {
        let dims: Vec<i64> = (0..gs.len() as i64).filter(|&d| d != 1).collect();
        let gb = cx.b.reduce_by(grad, &dims, BinaryOp::Add)?;
        outs[2] = Some(narrowed(cx, gb, half));
    }
    Ok(outs)
}

/// The weight gradient of the direct convolution `window` (kernel sizes `kernel`) of `x` whose
/// output has the gradient `grad`: dw[o, c, k] = sum over batch and output positions of
/// x_pad[b, c, y*s + k*d] * g[b, o, y]: a convolution with x's channels as the batch, the batch
/// as channels, and g (dilated by the stride) as the kernel; positions past the last window's
/// reach are dropped.
fn weight_gradient(
    cx: &mut Ctx,
    mut x: Value,
    grad: Value,
    window: &Strided,
    kernel: &[i64],
    groups: i64,
    precision: Precision,
) -> OpResult<Value> {
    let (xs, gs) = (cx.b.shape(x).to_vec(), cx.b.shape(grad).to_vec());
    let spatial = kernel.len();
    let mut high = Vec::with_capacity(spatial);
    for i in 0..spatial {
        let reach = (kernel[i] - 1) * window.dilation[i] + (gs[i + 2] - 1) * window.stride[i] + 1;
        let h = reach - xs[i + 2] - window.padding[i];
        if h < 0 {
            x = cx.b.slice_dim(x, i + 2, 0, xs[i + 2] + h, 1)?;
            high.push(0);
        } else {
            high.push(h);
        }
    }
    let mut perm: Vec<i64> = (0..xs.len() as i64).collect();
    perm.swap(0, 1);
    let xt = cx.b.transpose(x, &perm)?;
    let gt = cx.b.transpose(grad, &perm)?;
    let attrs = ConvAttrs {
        strides: window.dilation.clone(),
        padding: (0..spatial).map(|i| (window.padding[i], high[i])).collect(),
        lhs_dilation: vec![1; spatial],
        rhs_dilation: window.stride.clone(),
        groups: 1,
        batch_groups: groups,
        precision,
        kernel: KernelLayout::OutInSpatial,
    };
    let dw = cx.b.convolution(xt, gt, attrs)?;
    Ok(cx.b.transpose(dw, &perm)?)
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

pub fn register(r: &mut Registry) {
    r.add(&["aten.convolution_backward.default"], conv_backward);
    r.add(
        &[
            "aten.conv1d.default",
            "aten.conv2d.default",
            "aten.conv3d.default",
            "aten.conv_transpose1d.default",
            "aten.conv_transpose2d.input",
            "aten.conv_transpose3d.input",
            "aten.convolution.default",
            "aten._convolution.default",
            "aten._convolution.deprecated",
        ],
        conv,
    );
    r.add(&["aten.conv_tbc.default"], conv_tbc);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn convolutions_keep_torch_kernels_at_full_precision() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[1, 4, 8, 8]);
        let w = g.input("w", DType::F32, &[6, 2, 3, 3]);
        let y = g.node1(
            "aten.convolution.default",
            vec![
                ("input", t(&x)),
                ("weight", t(&w)),
                ("bias", Arg::None),
                ("stride", Arg::Ints(vec![2, 2])),
                ("padding", Arg::Ints(vec![1, 1])),
                ("dilation", Arg::Ints(vec![1, 1])),
                ("transposed", Arg::Bool(false)),
                ("output_padding", Arg::Ints(vec![0, 0])),
                ("groups", Arg::Int(2)),
            ],
            DType::F32,
            &[1, 6, 4, 4],
        );
        assert_checks(
            &g.text(&[&y]),
            &[
                "stablehlo.convolution %0, %1 strides=[2, 2] padding=[(1, 1), (1, 1)]",
                "groups=2 batch_groups=1 kernel=OutInSpatial precision=highest",
            ],
        );
    }
}
