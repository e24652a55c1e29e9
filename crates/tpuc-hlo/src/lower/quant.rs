//! Quantization: the `quantized_decomposed` ops PT2E quantization leaves in a graph (quantize and
//! dequantize, per tensor and per channel), torch's fake quantization (QAT), the integer
//! matmuls of quantized linear layers (`_int_mm`, `_weight_int8pack_mm`) and the scaled matmul
//! of 8-bit floats (`_scaled_mm`).
//!
//! Each follows torch's reference arithmetic step by step, in the types torch computes in:
//! `round_half_even(x * (1 / scale)) + zero_point`, clamped to `[quant_min, quant_max]`, then
//! converted; dequantization is `(q - zero_point) * scale`. The reciprocal of a Python scale is
//! taken in double precision and rounded to float32 once, as `1.0 / scale` is in Python.

use tpuc_fx::Node;

use super::prelude::*;

/// A per-tensor quantization parameter: a Python number, or a one-element tensor (the `.tensor`
/// overloads) read as a scalar of `elem`.
fn per_tensor_param(cx: &mut Ctx, n: &Node, name: &str, elem: DType) -> OpResult<Value> {
    match cx.operand(n, name)? {
        Operand::Number(v, _) => Ok(cx.b.scalar(elem, v)),
        Operand::Tensor(t) => {
            let count: i64 = cx.b.shape(t).iter().product();
            if count != 1 {
                return err(format!(
                    "{name} should have one element (per-tensor quantization), got shape {:?}",
                    cx.b.shape(t)
                ));
            }
            let scalar = cx.b.reshape(t, &[])?;
            Ok(cx.b.convert(scalar, elem))
        }
    }
}

/// `1 / scale` as float32: a Python float's reciprocal in double precision, a tensor's in its
/// own type widened to double (`scale.item()` is a Python float).
fn per_tensor_inverse_scale(cx: &mut Ctx, n: &Node) -> OpResult<Value> {
    match cx.operand(n, "scale")? {
        Operand::Number(scale, _) => Ok(cx.b.scalar(DType::F32, 1.0 / scale)),
        Operand::Tensor(_) => {
            let scale = per_tensor_param(cx, n, "scale", DType::F64)?;
            let one = cx.b.scalar(DType::F64, 1.0);
            let inverse = cx.b.binary(BinaryOp::Div, one, scale)?;
            Ok(cx.b.convert(inverse, DType::F32))
        }
    }
}

/// The quantization bounds, Python ints or (the `.tensor2` overloads) one-element tensors.
fn bounds(cx: &mut Ctx, n: &Node, elem: DType) -> OpResult<(Value, Value)> {
    let lo = per_tensor_param(cx, n, "quant_min", elem)?;
    let hi = per_tensor_param(cx, n, "quant_max", elem)?;
    Ok((lo, hi))
}

/// The integer type values are quantized to; torch checks the bounds against it.
fn quantized_type(cx: &Ctx, n: &Node) -> OpResult<DType> {
    let Some(elem) = cx.opt_dtype(n, "dtype")? else {
        return err("quantization needs its dtype argument");
    };
    if !elem.is_integer() {
        return err(format!(
            "not supported: quantization to {elem} (tpuc quantizes to integer types)"
        ));
    }
    Ok(elem)
}

/// Float input as torch's quantize ops take it: 16-bit floats widened to float32.
fn float32_input(cx: &mut Ctx, n: &Node) -> OpResult<Value> {
    let x = cx.tensor(n, "input")?;
    let elem = cx.b.elem(x);
    if !matches!(elem, DType::F32 | DType::F16 | DType::BF16) {
        return err(format!(
            "quantization expects a float32 or 16-bit float input, got {elem}"
        ));
    }
    Ok(cx.b.convert(x, DType::F32))
}

/// Broadcasts each of `params` (scalars) to `like`'s shape.
fn splat_all<const N: usize>(
    cx: &mut Ctx,
    like: Value,
    params: [Value; N],
) -> OpResult<[Value; N]> {
    let shape = cx.b.shape(like).to_vec();
    let mut out = params;
    for v in out.iter_mut() {
        *v = cx.b.broadcast_in_dim(*v, &shape, &[])?;
    }
    Ok(out)
}

/// `clamp(round_half_even(x * inverse_scale) + zero_point, lo, hi)`, all of one float type
/// and shape.
fn quantized_float(
    cx: &mut Ctx,
    x: Value,
    inverse_scale: Value,
    zero_point: Value,
    lo: Value,
    hi: Value,
) -> OpResult<Value> {
    let scaled = cx.b.binary(BinaryOp::Mul, x, inverse_scale)?;
    let rounded = cx.b.unary(UnaryOp::RoundEven, scaled)?;
    let shifted = cx.b.binary(BinaryOp::Add, rounded, zero_point)?;
    // clamp as torch.clamp: max with the lower bound, then min with the upper.
    let v = cx.b.binary(BinaryOp::Max, shifted, lo)?;
    Ok(cx.b.binary(BinaryOp::Min, v, hi)?)
}

fn quantize_per_tensor(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let to = quantized_type(cx, n)?;
    let x = float32_input(cx, n)?;
    let inverse = per_tensor_inverse_scale(cx, n)?;
    let zero_point = per_tensor_param(cx, n, "zero_point", DType::F32)?;
    let (lo, hi) = bounds(cx, n, DType::F32)?;
    let [inverse, zero_point, lo, hi] = splat_all(cx, x, [inverse, zero_point, lo, hi])?;
    let q = quantized_float(cx, x, inverse, zero_point, lo, hi)?;
    Ok(vec![Some(cx.b.convert(q, to))])
}

/// The float type dequantization produces: `out_dtype`, float32 unless given.
fn dequantized_type(cx: &Ctx, n: &Node) -> OpResult<DType> {
    let elem = cx.opt_dtype(n, "out_dtype")?.unwrap_or(DType::F32);
    if !elem.is_float() {
        return err(format!(
            "dequantization needs a float out_dtype, got {elem}"
        ));
    }
    Ok(elem)
}

fn dequantize_per_tensor(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = dequantized_type(cx, n)?;
    let q = cx.tensor(n, "input")?;
    if !cx.b.elem(q).is_integer() {
        return err(format!(
            "dequantization expects an integer input, got {}",
            cx.b.elem(q)
        ));
    }
    // (input.to(out_dtype) - zero_point) * scale: each step rounded to out_dtype, computed (as
    // torch's kernels do for 16-bit floats) in float32 with the parameters unrounded.
    let wide = out.accumulation();
    let x = cx.b.convert(q, out);
    let x = cx.b.convert(x, wide);
    let zero_point = per_tensor_param(cx, n, "zero_point", wide)?;
    let scale = per_tensor_param(cx, n, "scale", wide)?;
    let [zero_point, scale] = splat_all(cx, x, [zero_point, scale])?;
    let centred = cx.b.binary(BinaryOp::Sub, x, zero_point)?;
    let centred = cx.rounded_to(centred, out);
    let y = cx.b.binary(BinaryOp::Mul, centred, scale)?;
    Ok(vec![Some(cx.b.convert(y, out))])
}

/// A per-channel parameter (a vector with one entry per index of `axis`) broadcast to `shape`.
fn per_channel(cx: &mut Ctx, v: Value, shape: &[i64], axis: usize, name: &str) -> OpResult<Value> {
    let got = cx.b.shape(v).to_vec();
    if got.len() != 1 || got[0] != shape[axis] {
        return err(format!(
            "{name} should have one entry per channel ({} along dimension {axis}), got shape {got:?}",
            shape[axis]
        ));
    }
    Ok(cx.b.broadcast_in_dim(v, shape, &[axis as i64])?)
}

fn channel_axis(cx: &Ctx, n: &Node, rank: usize) -> OpResult<usize> {
    let axis = cx.int(n, "axis", None)?;
    norm_dim(axis, rank)
}

fn quantize_per_channel(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let to = quantized_type(cx, n)?;
    let x = float32_input(cx, n)?;
    let shape = cx.b.shape(x).to_vec();
    let axis = channel_axis(cx, n, shape.len())?;
    let scales = cx.tensor(n, "scales")?;
    let zero_points = cx.tensor(n, "zero_points")?;
    // input * (1.0 / scales): the reciprocal in the scales' type, the product promoted.
    let scale_elem = cx.b.elem(scales);
    if !scale_elem.is_float() {
        return err(format!("scales should be floats, got {scale_elem}"));
    }
    let elem = promote_types(DType::F32, scale_elem);
    let one = cx.full_like(scales, 1.0, None);
    let inverse = cx.b.binary(BinaryOp::Div, one, scales)?;
    let inverse = cx.b.convert(inverse, elem);
    let inverse = per_channel(cx, inverse, &shape, axis, "scales")?;
    let zero_points = cx.b.convert(zero_points, elem);
    let zero_points = per_channel(cx, zero_points, &shape, axis, "zero_points")?;
    let x = cx.b.convert(x, elem);
    let (lo, hi) = bounds(cx, n, elem)?;
    let [lo, hi] = splat_all(cx, x, [lo, hi])?;
    let q = quantized_float(cx, x, inverse, zero_points, lo, hi)?;
    Ok(vec![Some(cx.b.convert(q, to))])
}

fn dequantize_per_channel(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = dequantized_type(cx, n)?;
    let q = cx.tensor(n, "input")?;
    let shape = cx.b.shape(q).to_vec();
    let axis = channel_axis(cx, n, shape.len())?;
    let scales = cx.tensor(n, "scales")?;
    // (input - zero_points) * scales with torch's promotion (integers widen, then the scales'
    // float type), converted to out_dtype at the end.
    let mut centred = q;
    if let Some(zero_points) = cx.opt_tensor(n, "zero_points")? {
        let elem = promote_types(cx.b.elem(q), cx.b.elem(zero_points));
        let zero_points = cx.b.convert(zero_points, elem);
        let zero_points = per_channel(cx, zero_points, &shape, axis, "zero_points")?;
        let wide = cx.b.convert(q, elem);
        centred = cx.b.binary(BinaryOp::Sub, wide, zero_points)?;
    }
    let elem = promote_types(cx.b.elem(centred), cx.b.elem(scales));
    let centred = cx.b.convert(centred, elem);
    let scales = cx.b.convert(scales, elem);
    let scales = per_channel(cx, scales, &shape, axis, "scales")?;
    let x = cx.b.binary(BinaryOp::Mul, centred, scales)?;
    Ok(vec![Some(cx.b.convert(x, out))])
}

// ----- Fake quantization (torch.ao QAT): quantize and dequantize in one op ----------------

/// torch's fake-quantize kernels: `q = round_half_even(x * inverse_scale) + zero_point`,
/// output `(clamp(q, lo, hi) - zero_point) * scale`, mask `lo <= q <= hi` (where the gradient
/// flows). Operands are of one float type and shape.
fn fake_quantized(
    cx: &mut Ctx,
    x: Value,
    scale: Value,
    zero_point: Value,
    lo: Value,
    hi: Value,
) -> OpResult<(Value, Value)> {
    let one = cx.full_like(scale, 1.0, None);
    let inverse = cx.b.binary(BinaryOp::Div, one, scale)?;
    let scaled = cx.b.binary(BinaryOp::Mul, x, inverse)?;
    let rounded = cx.b.unary(UnaryOp::RoundEven, scaled)?;
    let q = cx.b.binary(BinaryOp::Add, rounded, zero_point)?;
    let above = cx.b.compare(CompareDir::Ge, q, lo)?;
    let below = cx.b.compare(CompareDir::Le, q, hi)?;
    let mask = cx.b.binary(BinaryOp::And, above, below)?;
    let clamped = cx.b.binary(BinaryOp::Max, q, lo)?;
    let clamped = cx.b.binary(BinaryOp::Min, clamped, hi)?;
    let centred = cx.b.binary(BinaryOp::Sub, clamped, zero_point)?;
    Ok((cx.b.binary(BinaryOp::Mul, centred, scale)?, mask))
}

/// The output, and the mask too for the `cachemask` forms (which return both).
fn with_mask(n: &Node, out: Value, mask: Value) -> Vec<Option<Value>> {
    if n.outputs.len() > 1 {
        vec![Some(out), Some(mask)]
    } else {
        vec![Some(out)]
    }
}

fn fake_quantize_input(cx: &mut Ctx, n: &Node) -> OpResult<Value> {
    let x = cx.tensor(n, "self")?;
    if !cx.b.elem(x).is_float() {
        return err(format!(
            "fake quantization expects a float input, got {}",
            cx.b.elem(x)
        ));
    }
    Ok(x)
}

/// Integer bounds as floats of `elem`, checked as torch checks them.
fn int_bounds(cx: &mut Ctx, n: &Node, elem: DType) -> OpResult<(Value, Value)> {
    let lo = cx.int(n, "quant_min", None)?;
    let hi = cx.int(n, "quant_max", None)?;
    if lo > hi {
        return err(format!(
            "quant_min ({lo}) must not be greater than quant_max ({hi})"
        ));
    }
    Ok((cx.b.scalar(elem, lo as f64), cx.b.scalar(elem, hi as f64)))
}

/// The zero point of a fake quantization as a float; torch requires integer zero points here.
fn integer_zero_point(cx: &mut Ctx, zero_point: Value, elem: DType) -> OpResult<Value> {
    let zp = cx.b.elem(zero_point);
    if !zp.is_integer() {
        return err(format!(
            "not supported: fake quantization with a {zp} zero point (tpuc takes integer zero points)"
        ));
    }
    Ok(cx.b.convert(zero_point, elem))
}

fn fake_quantize_per_tensor(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = fake_quantize_input(cx, n)?;
    let elem = cx.b.elem(x);
    // torch's kernel computes in float32 (scale is a float there), rounding once at the end.
    let x32 = cx.b.convert(x, DType::F32);
    let (scale, zero_point) = match (cx.operand(n, "scale")?, cx.operand(n, "zero_point")?) {
        (Operand::Number(s, _), Operand::Number(z, _)) => {
            (cx.b.scalar(DType::F32, s), cx.b.scalar(DType::F32, z))
        }
        _ => {
            let scale = per_tensor_param(cx, n, "scale", DType::F32)?;
            let zp = cx.tensor(n, "zero_point")?;
            let zp = cx.b.reshape(zp, &[])?;
            (scale, integer_zero_point(cx, zp, DType::F32)?)
        }
    };
    let (lo, hi) = int_bounds(cx, n, DType::F32)?;
    let [scale, zero_point, lo, hi] = splat_all(cx, x32, [scale, zero_point, lo, hi])?;
    let (mut out, mut mask) = fake_quantized(cx, x32, scale, zero_point, lo, hi)?;
    out = cx.b.convert(out, elem);
    // The cachemask form with tensor qparams can be switched off: the input passes unchanged.
    if let Some(enabled) = cx.opt_tensor(n, "fake_quant_enabled")? {
        let enabled = cx.b.reshape(enabled, &[])?;
        let enabled = cx.b.convert(enabled, DType::F32);
        let zero = cx.b.scalar(DType::F32, 0.0);
        let on = cx.b.compare(CompareDir::Ne, enabled, zero)?;
        let shape = cx.b.shape(x).to_vec();
        let on = cx.b.broadcast_in_dim(on, &shape, &[])?;
        out = cx.b.select(on, out, x)?;
        let all = cx.full_like(mask, 1.0, None);
        mask = cx.b.select(on, mask, all)?;
    }
    Ok(with_mask(n, out, mask))
}

fn fake_quantize_per_channel(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = fake_quantize_input(cx, n)?;
    let elem = cx.b.elem(x);
    let x32 = cx.b.convert(x, DType::F32);
    let shape = cx.b.shape(x).to_vec();
    let axis = channel_axis(cx, n, shape.len())?;
    let scale = cx.tensor(n, "scale")?;
    let scale = cx.b.convert(scale, DType::F32);
    let scale = per_channel(cx, scale, &shape, axis, "scale")?;
    let zero_point = cx.tensor(n, "zero_point")?;
    let zero_point = integer_zero_point(cx, zero_point, DType::F32)?;
    let zero_point = per_channel(cx, zero_point, &shape, axis, "zero_point")?;
    let (lo, hi) = int_bounds(cx, n, DType::F32)?;
    let [lo, hi] = splat_all(cx, x32, [lo, hi])?;
    let (out, mask) = fake_quantized(cx, x32, scale, zero_point, lo, hi)?;
    let out = cx.b.convert(out, elem);
    Ok(with_mask(n, out, mask))
}

/// The gradient of a fake quantization: the incoming gradient where the value was in range.
fn fake_quantize_backward(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let grad = cx.tensor(n, "grad")?;
    let mask = cx.tensor(n, "mask")?;
    let zero = cx.full_like(grad, 0.0, None);
    Ok(vec![Some(cx.b.select(mask, grad, zero)?)])
}

// ----- Integer matmuls -------------------------------------------------------------------

/// `_int_mm`: int8 matrices multiplied exactly, accumulated in int32.
fn int_mm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let b = cx.tensor(n, "mat2")?;
    for (name, v) in [("self", a), ("mat2", b)] {
        if cx.b.elem(v) != DType::I8 || cx.b.ty(v).rank() != 2 {
            return err(format!(
                "_int_mm expects int8 matrices, got {name} of {} {:?}",
                cx.b.elem(v),
                cx.b.shape(v)
            ));
        }
    }
    let a = cx.b.convert(a, DType::I32);
    let b = cx.b.convert(b, DType::I32);
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![1],
        rhs_contracting: vec![0],
    };
    Ok(vec![Some(cx.b.dot_general(
        a,
        b,
        dims,
        Precision::Default,
    )?)])
}

/// `_weight_int8pack_mm(x, w, scales)`: `x @ w.T * scales` for int8 weights `[n, k]` with one
/// scale per output column, computed in float32 and rounded to x's type once.
fn weight_int8pack_mm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let w = cx.tensor(n, "mat2")?;
    let scales = cx.tensor(n, "scales")?;
    let out = cx.b.elem(x);
    if !out.is_float() || cx.b.elem(w) != DType::I8 {
        return err(format!(
            "_weight_int8pack_mm expects float input and int8 weights, got {out} and {}",
            cx.b.elem(w)
        ));
    }
    let x = cx.b.convert(x, DType::F32);
    let w = cx.b.convert(w, DType::F32);
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![1],
        rhs_contracting: vec![1],
    };
    let p = precision(cx, DType::F32);
    let y = cx.b.dot_general(x, w, dims, p)?;
    let shape = cx.b.shape(y).to_vec();
    let scales = cx.b.convert(scales, DType::F32);
    let scales = per_channel(cx, scales, &shape, 1, "scales")?;
    let y = cx.b.binary(BinaryOp::Mul, y, scales)?;
    Ok(vec![Some(cx.b.convert(y, out))])
}

/// `_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype)`: 8-bit float matrices
/// widened to float32 and multiplied, scaled by a per-tensor scale or per-row (of a) and
/// per-column (of b) scales, plus the bias, rounded once to `out_dtype` (a's type if absent).
fn scaled_mm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let b = cx.tensor(n, "mat2")?;
    for (name, v) in [("self", a), ("mat2", b)] {
        let elem = cx.b.elem(v);
        if cx.b.ty(v).rank() != 2 || !elem.is_float() {
            return err(format!(
                "_scaled_mm expects float matrices, got {name} of {}",
                cx.b.ty(v)
            ));
        }
    }
    if cx.opt_tensor(n, "scale_result")?.is_some() {
        return err("not supported: _scaled_mm with scale_result (a scaled 8-bit output)");
    }
    let out = cx.out_type(n, 0)?;
    let a = cx.b.convert(a, DType::F32);
    let b = cx.b.convert(b, DType::F32);
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![1],
        rhs_contracting: vec![0],
    };
    let p = precision(cx, DType::F32);
    let mut y = cx.b.dot_general(a, b, dims, p)?;
    let shape = cx.b.shape(y).to_vec();
    for (name, axis) in [("scale_a", 0), ("scale_b", 1)] {
        let s = cx.tensor(n, name)?;
        let s = cx.b.convert(s, DType::F32);
        let count = cx.b.ty(s).numel();
        let s = if count == 1 {
            let s = cx.b.reshape(s, &[])?;
            cx.b.broadcast_in_dim(s, &shape, &[])?
        } else if count == shape[axis] {
            let s = cx.b.reshape(s, &[count])?;
            cx.b.broadcast_in_dim(s, &shape, &[axis as i64])?
        } else {
            return err(format!(
                "{name} must be one scale or one per {} ({}), got {count}",
                if axis == 0 {
                    "row of self"
                } else {
                    "column of mat2"
                },
                shape[axis]
            ));
        };
        y = cx.b.binary(BinaryOp::Mul, y, s)?;
    }
    if let Some(bias) = cx.opt_tensor(n, "bias")? {
        let bias = cx.b.convert(bias, DType::F32);
        let bias = cx.b.broadcast_to(bias, &shape)?;
        y = cx.b.binary(BinaryOp::Add, y, bias)?;
    }
    Ok(vec![Some(cx.b.convert(y, out.elem))])
}

pub fn register(r: &mut Registry) {
    r.add(&["aten._scaled_mm.default"], scaled_mm);
    r.add(
        &[
            "quantized_decomposed.quantize_per_tensor.default",
            "quantized_decomposed.quantize_per_tensor.tensor",
            "quantized_decomposed.quantize_per_tensor.tensor2",
        ],
        quantize_per_tensor,
    );
    r.add(
        &[
            "quantized_decomposed.dequantize_per_tensor.default",
            "quantized_decomposed.dequantize_per_tensor.tensor",
            "quantized_decomposed.dequantize_per_tensor.tensor2",
        ],
        dequantize_per_tensor,
    );
    r.add(
        &["quantized_decomposed.quantize_per_channel.default"],
        quantize_per_channel,
    );
    r.add(
        &["quantized_decomposed.dequantize_per_channel.default"],
        dequantize_per_channel,
    );
    r.add(
        &[
            "aten.fake_quantize_per_tensor_affine.default",
            "aten.fake_quantize_per_tensor_affine.tensor_qparams",
            "aten.fake_quantize_per_tensor_affine_cachemask.default",
            "aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default",
        ],
        fake_quantize_per_tensor,
    );
    r.add(
        &[
            "aten.fake_quantize_per_channel_affine.default",
            "aten.fake_quantize_per_channel_affine_cachemask.default",
        ],
        fake_quantize_per_channel,
    );
    r.add(
        &["aten.fake_quantize_per_tensor_affine_cachemask_backward.default"],
        fake_quantize_backward,
    );
    r.add(&["aten._int_mm.default"], int_mm);
    r.add(&["aten._weight_int8pack_mm.default"], weight_int8pack_mm);
}
