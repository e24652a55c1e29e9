//! Element-wise arithmetic, comparisons, logic, activations, conversions and tensor factories.

use tpuc_fx::{DType, Node};

use super::prelude::*;

fn out_elem(cx: &Ctx, n: &Node) -> OpResult<DType> {
    Ok(cx.out_type(n, 0)?.elem)
}

/// `a op (alpha * b)`, as add, sub and rsub take it.
fn plus_scaled(cx: &mut Ctx, a: Operand, b: Operand, alpha: f64, op: BinaryOp) -> OpResult<Value> {
    if alpha == 1.0 {
        return arith(cx, a, b, op);
    }
    let elem = promoted(cx, &[a, b])?;
    let b = match b {
        Operand::Number(x, d) => Operand::Number(x * alpha, d),
        Operand::Tensor(_) if elem.accumulation() != elem => {
            // torch's CPU kernel for 16-bit floats: a + alpha * b in float32, alpha rounded to
            // the 16-bit type, the result rounded once.
            let v = prepare(cx, &[a, b], elem)?;
            let wide = elem.accumulation();
            let (x, y) = (cx.b.convert(v[0], wide), cx.b.convert(v[1], wide));
            let alpha = cx.full_like(v[1], alpha, None);
            let alpha = cx.b.convert(alpha, wide);
            let scaled = cx.b.binary(BinaryOp::Mul, y, alpha)?;
            let r = cx.b.binary(op, x, scaled)?;
            return Ok(cx.b.convert(r, elem));
        }
        Operand::Tensor(_) => {
            let alpha_dt = if alpha.fract() == 0.0 {
                DType::I64
            } else {
                DType::F64
            };
            Operand::Tensor(arith(
                cx,
                b,
                Operand::Number(alpha, alpha_dt),
                BinaryOp::Mul,
            )?)
        }
    };
    arith(cx, a, b, op)
}

/// `self op (alpha * other)`, as add/sub take it.
fn add_sub(cx: &mut Ctx, n: &Node, op: BinaryOp) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let alpha = cx.float(n, "alpha", Some(1.0))?;
    Ok(vec![Some(plus_scaled(cx, a, b, alpha, op)?)])
}

/// `a op b` for mul and true division. Where the result is a 16-bit float and `b` a scalar (a
/// number or a 0-dimensional tensor), torch's CPU kernels multiply or divide by the scalar's
/// value in float32, not by the scalar rounded to 16 bits, and round once.
fn scaled_arith(
    cx: &mut Ctx,
    a: Operand,
    b: Operand,
    elem: DType,
    op: BinaryOp,
) -> OpResult<Value> {
    let scalar_b = match b {
        Operand::Number(..) => true,
        Operand::Tensor(v) => cx.b.shape(v).is_empty(),
    };
    let wide = elem.accumulation();
    if wide == elem || !elem.is_float() || !scalar_b {
        let v = prepare(cx, &[a, b], elem)?;
        return Ok(cx.b.binary(op, v[0], v[1])?);
    }
    let a = match a {
        Operand::Tensor(v) => Operand::Tensor(cx.b.convert(v, elem)),
        number => number,
    };
    let v = prepare(cx, &[a, b], wide)?;
    let r = cx.b.binary(op, v[0], v[1])?;
    Ok(cx.b.convert(r, elem))
}

fn true_div(cx: &mut Ctx, a: Operand, b: Operand) -> OpResult<Value> {
    let mut elem = promoted(cx, &[a, b])?;
    if !elem.is_float() && !elem.is_complex() {
        elem = DType::F32;
    }
    scaled_arith(cx, a, b, elem, BinaryOp::Div)
}

fn trunc_div(cx: &mut Ctx, a: Operand, b: Operand) -> OpResult<Value> {
    let elem = promoted(cx, &[a, b])?;
    let v = prepare(cx, &[a, b], elem)?;
    let q = cx.b.binary(BinaryOp::Div, v[0], v[1])?;
    if !elem.is_float() {
        return Ok(q);
    }
    trunc(cx, q)
}

fn trunc(cx: &mut Ctx, q: Value) -> OpResult<Value> {
    let zero = cx.full_like(q, 0.0, None);
    let neg = cx.b.compare(CompareDir::Lt, q, zero)?;
    let up = cx.b.unary(UnaryOp::Ceil, q)?;
    let down = cx.b.unary(UnaryOp::Floor, q)?;
    Ok(cx.b.select(neg, up, down)?)
}

/// Python's modulo: the result takes the sign of the divisor.
fn remainder(cx: &mut Ctx, a: Operand, b: Operand) -> OpResult<Value> {
    let elem = promoted(cx, &[a, b])?;
    let v = prepare(cx, &[a, b], elem)?;
    let (x, y) = (v[0], v[1]);
    let r = cx.b.binary(BinaryOp::Rem, x, y)?;
    if elem.is_unsigned() {
        return Ok(r);
    }
    let zero = cx.full_like(x, 0.0, None);
    let nonzero = cx.b.compare(CompareDir::Ne, r, zero)?;
    let r_neg = cx.b.compare(CompareDir::Lt, r, zero)?;
    let y_neg = cx.b.compare(CompareDir::Lt, y, zero)?;
    let differ = cx.b.compare(CompareDir::Ne, r_neg, y_neg)?;
    let fix = cx.b.binary(BinaryOp::And, nonzero, differ)?;
    let shifted = cx.b.binary(BinaryOp::Add, r, y)?;
    Ok(cx.b.select(fix, shifted, r)?)
}

fn pow(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let base = cx.operand(n, "self")?;
    let exp = cx.operand(n, "exponent")?;
    let elem = out_elem(cx, n)?;
    if let (Operand::Tensor(x), Operand::Number(e, _)) = (base, exp) {
        let x = cx.b.convert(x, elem);
        if e == 2.0 {
            return Ok(vec![Some(cx.b.binary(BinaryOp::Mul, x, x)?)]);
        }
        if e == 0.5 && elem.is_float() {
            return Ok(vec![Some(cx.b.unary(UnaryOp::Sqrt, x)?)]);
        }
    }
    let v = prepare(cx, &[base, exp], elem)?;
    Ok(vec![Some(cx.b.binary(BinaryOp::Pow, v[0], v[1])?)])
}

fn compare(cx: &mut Ctx, n: &Node, dir: CompareDir) -> OpResult<Vec<Option<Value>>> {
    let a = cx.operand(n, "self")?;
    let b = cx.operand(n, "other")?;
    let elem = promoted(cx, &[a, b])?;
    let v = prepare(cx, &[a, b], elem)?;
    Ok(vec![Some(cx.b.compare(dir, v[0], v[1])?)])
}

fn to_bool(cx: &mut Ctx, v: Value) -> OpResult<Value> {
    if cx.b.elem(v).is_bool() {
        return Ok(v);
    }
    let zero = cx.full_like(v, 0.0, None);
    Ok(cx.b.compare(CompareDir::Ne, v, zero)?)
}

fn logical(cx: &mut Ctx, n: &Node, op: BinaryOp) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let b = cx.tensor(n, "other")?;
    let (a, b) = (to_bool(cx, a)?, to_bool(cx, b)?);
    let v = cx.broadcast_all(&[a, b])?;
    let r = cx.b.binary(op, v[0], v[1])?;
    let elem = out_elem(cx, n)?;
    Ok(vec![Some(cx.b.convert(r, elem))])
}

fn bitwise(cx: &mut Ctx, n: &Node, op: BinaryOp) -> OpResult<Vec<Option<Value>>> {
    let a = cx.operand(n, "self")?;
    let b = cx.operand(n, "other")?;
    if promoted(cx, &[a, b])?.is_float() {
        return err("bitwise operations are not defined on floating-point tensors");
    }
    Ok(vec![Some(arith(cx, a, b, op)?)])
}

/// `self` converted to the output's element type, in which a unary op is computed.
fn self_in_out_type(cx: &mut Ctx, n: &Node) -> OpResult<Value> {
    let x = cx.tensor(n, "self")?;
    let elem = out_elem(cx, n)?;
    Ok(cx.b.convert(x, elem))
}

/// `f` of `self` in the output's type (ints become floats for exp, sin, ...), computed in its
/// accumulation type (float32 for 16-bit floats, as torch's CPU kernels compute) and rounded
/// once.
pub(super) fn computed_wide(
    cx: &mut Ctx,
    n: &Node,
    f: impl FnOnce(&mut Ctx, Value) -> OpResult<Value>,
) -> OpResult<Vec<Option<Value>>> {
    let x = self_in_out_type(cx, n)?;
    let elem = cx.b.elem(x);
    let wide = cx.b.convert(x, elem.accumulation());
    let r = f(cx, wide)?;
    Ok(vec![Some(cx.b.convert(r, elem))])
}

fn unary_in_out_type(cx: &mut Ctx, n: &Node, op: UnaryOp) -> OpResult<Vec<Option<Value>>> {
    if matches!(op, UnaryOp::Floor | UnaryOp::Ceil) && !out_elem(cx, n)?.is_float() {
        // Integers are already whole.
        return Ok(vec![Some(cx.tensor(n, "self")?)]);
    }
    computed_wide(cx, n, |cx, x| Ok(cx.b.unary(op, x)?))
}

/// log base 2 or 10: the natural log scaled, computed in the output dtype.
fn log_base(cx: &mut Ctx, n: &Node, base: f64) -> OpResult<Vec<Option<Value>>> {
    let x = self_in_out_type(cx, n)?;
    let ln = cx.b.unary(UnaryOp::Log, x)?;
    let scale = cx.full_like(ln, 1.0 / base.ln(), None);
    Ok(vec![Some(cx.b.binary(BinaryOp::Mul, ln, scale)?)])
}

/// `scale * x` for positive x, `scale * alpha * (exp(input_scale * x) - 1)` otherwise.
fn elu(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let alpha = cx.float(n, "alpha", Some(1.0))?;
    let scale = cx.float(n, "scale", Some(1.0))?;
    let input_scale = cx.float(n, "input_scale", Some(1.0))?;
    let zero = cx.full_like(x, 0.0, None);
    let positive = cx.b.compare(CompareDir::Gt, x, zero)?;
    let scaled_in = cx.full_like(x, input_scale, None);
    let inner = cx.b.binary(BinaryOp::Mul, x, scaled_in)?;
    let expm1 = cx.b.unary(UnaryOp::Expm1, inner)?;
    let alpha_v = cx.full_like(x, alpha, None);
    let negative = cx.b.binary(BinaryOp::Mul, expm1, alpha_v)?;
    let chosen = cx.b.select(positive, x, negative)?;
    let scale_v = cx.full_like(x, scale, None);
    Ok(vec![Some(cx.b.binary(BinaryOp::Mul, chosen, scale_v)?)])
}

fn relu(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let zero = cx.full_like(x, 0.0, None);
    Ok(vec![Some(cx.b.binary(BinaryOp::Max, x, zero)?)])
}

fn silu(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    computed_wide(cx, n, |cx, x| {
        let s = cx.b.unary(UnaryOp::Logistic, x)?;
        Ok(cx.b.binary(BinaryOp::Mul, x, s)?)
    })
}

fn gelu(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let approximate = cx.opt_str(n, "approximate")?.unwrap_or("none");
    computed_wide(cx, n, |cx, x| gelu_of(cx, x, approximate))
}

fn gelu_of(cx: &mut Ctx, x: Value, approximate: &str) -> OpResult<Value> {
    let half = cx.full_like(x, 0.5, None);
    let one = cx.full_like(x, 1.0, None);
    let inner = match approximate {
        "none" => {
            let c = cx.full_like(x, std::f64::consts::FRAC_1_SQRT_2, None);
            let t = cx.b.binary(BinaryOp::Mul, x, c)?;
            cx.b.unary(UnaryOp::Erf, t)?
        }
        "tanh" => {
            let c = cx.full_like(x, (2.0 / std::f64::consts::PI).sqrt(), None);
            let k = cx.full_like(x, 0.044715, None);
            let x2 = cx.b.binary(BinaryOp::Mul, x, x)?;
            let x3 = cx.b.binary(BinaryOp::Mul, x2, x)?;
            let kx3 = cx.b.binary(BinaryOp::Mul, k, x3)?;
            let s = cx.b.binary(BinaryOp::Add, x, kx3)?;
            let t = cx.b.binary(BinaryOp::Mul, c, s)?;
            cx.b.unary(UnaryOp::Tanh, t)?
        }
        other => {
            return err(format!(
                "not supported: approximate={other:?} (expected \"none\" or \"tanh\")"
            ))
        }
    };
    let p = cx.b.binary(BinaryOp::Add, one, inner)?;
    let hx = cx.b.binary(BinaryOp::Mul, half, x)?;
    Ok(cx.b.binary(BinaryOp::Mul, hx, p)?)
}

fn where_self(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let c = cx.tensor(n, "condition")?;
    let c = to_bool(cx, c)?;
    let a = cx.operand(n, "self")?;
    let b = cx.operand(n, "other")?;
    // The type torch recorded: the promoted one (two Python numbers give the default float).
    let elem = out_elem(cx, n)?;
    let a = cx.materialize(a, elem);
    let b = cx.materialize(b, elem);
    let v = cx.broadcast_all(&[c, a, b])?;
    Ok(vec![Some(cx.b.select(v[0], v[1], v[2])?)])
}

/// `a * b + c` with the product unrounded (inductor's `prims.fma`, in torch's optimizers'
/// graphs): the product of two floats is exact in a float of twice the mantissa, so the sum is
/// computed there and rounded once (f64 has no wider type here: rounded twice).
fn fma(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let ops = [
        cx.operand(n, "a")?,
        cx.operand(n, "b")?,
        cx.operand(n, "c")?,
    ];
    let elem = out_elem(cx, n)?;
    let wide = match elem {
        DType::F32 => DType::F64,
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    };
    let v: Vec<Value> = ops.iter().map(|&o| cx.materialize(o, wide)).collect();
    let v = cx.broadcast_all(&v)?;
    let product = cx.b.binary(BinaryOp::Mul, v[0], v[1])?;
    let sum = cx.b.binary(BinaryOp::Add, product, v[2])?;
    Ok(vec![Some(cx.b.convert(sum, elem))])
}

/// `self` where `mask` is false, `value` (a number or a 0-d tensor) where it is true.
fn masked_fill(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let mask = cx.tensor(n, "mask")?;
    let mask = to_bool(cx, mask)?;
    let value = cx.operand(n, "value")?;
    let elem = out_elem(cx, n)?;
    let x = cx.b.convert(x, elem);
    let value = cx.materialize(value, elem);
    let v = cx.broadcast_all(&[mask, value, x])?;
    let out = cx.out_type(n, 0)?;
    let r = cx.b.select(v[0], v[1], v[2])?;
    Ok(vec![Some(cx.b.broadcast_to(r, &out.shape)?)])
}

/// The upper (triu) or lower (tril) triangle of the last two dimensions, zeros elsewhere.
fn triangle(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let diagonal = cx.int(n, "diagonal", Some(0))?;
    let shape = cx.b.shape(x).to_vec();
    let rank = shape.len();
    if rank < 2 {
        return err("needs at least 2 dimensions");
    }
    let plane = TensorType::new(shape[rank - 2..].to_vec(), DType::I64);
    let rows = cx.b.iota(plane.clone(), 0)?;
    let cols = cx.b.iota(plane, 1)?;
    let offset = cx.b.binary(BinaryOp::Sub, cols, rows)?;
    let diagonal = cx.full_like(offset, diagonal as f64, None);
    let dir = if n.target.contains("triu") {
        CompareDir::Ge
    } else {
        CompareDir::Le
    };
    let keep = cx.b.compare(dir, offset, diagonal)?;
    let keep =
        cx.b.broadcast_in_dim(keep, &shape, &[rank as i64 - 2, rank as i64 - 1])?;
    let zero = cx.full_like(x, 0.0, None);
    Ok(vec![Some(cx.b.select(keep, x, zero)?)])
}

/// Vectors `a` [n] and `b` [m] in `out`'s type, broadcast to its shape [n, m] along rows and
/// columns.
fn outer_operands(cx: &mut Ctx, a: Value, b: Value, out: &TensorType) -> OpResult<(Value, Value)> {
    let (sa, sb) = (cx.b.shape(a).to_vec(), cx.b.shape(b).to_vec());
    if sa.len() != 1 || sb.len() != 1 {
        return err(format!(
            "an outer product needs two vectors, got shapes {sa:?} and {sb:?}"
        ));
    }
    let a = cx.b.convert(a, out.elem);
    let b = cx.b.convert(b, out.elem);
    let a = cx.b.broadcast_in_dim(a, &out.shape, &[0])?;
    let b = cx.b.broadcast_in_dim(b, &out.shape, &[1])?;
    Ok((a, b))
}

/// The outer product of two vectors.
fn outer(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = cx.out_type(n, 0)?;
    let (a, b) = (cx.tensor(n, "self")?, cx.tensor(n, "vec2")?);
    let (a, b) = outer_operands(cx, a, b, &out)?;
    Ok(vec![Some(cx.b.binary(BinaryOp::Mul, a, b)?)])
}

/// addr: beta self + (alpha vec1) vec2, each step in the result's type as torch's CPU kernel
/// computes it (16-bit floats rounded after every product and sum; alpha and beta in that type
/// too); self is ignored, NaN included, when beta is 0. For booleans: (beta and self) or
/// (alpha and vec1 and vec2).
fn addr(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = cx.out_type(n, 0)?;
    let (v1, v2) = (cx.tensor(n, "vec1")?, cx.tensor(n, "vec2")?);
    let (v1, v2) = outer_operands(cx, v1, v2, &out)?;
    let beta = cx.float(n, "beta", Some(1.0))?;
    let alpha = cx.float(n, "alpha", Some(1.0))?;
    let (product, step) = if out.elem.is_bool() {
        (BinaryOp::And, BinaryOp::Or)
    } else {
        (BinaryOp::Mul, BinaryOp::Add)
    };
    let alpha = cx.full_like(v1, alpha, None);
    let scaled = cx.b.binary(product, alpha, v1)?;
    let term = cx.b.binary(product, scaled, v2)?;
    if beta == 0.0 {
        return Ok(vec![Some(term)]);
    }
    let x = cx.tensor(n, "self")?;
    let x = cx.b.convert(x, out.elem);
    let x = cx.b.broadcast_to(x, &out.shape)?;
    let beta = cx.full_like(x, beta, None);
    let x = cx.b.binary(product, beta, x)?;
    Ok(vec![Some(cx.b.binary(step, x, term)?)])
}

/// The cross product of 3-vectors along `dim` (broadcast operands), each product and
/// difference in the result's type as torch's CPU kernel computes it.
fn linalg_cross(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = promoted(cx, &[a, b])?;
    let v = prepare(cx, &[a, b], elem)?;
    let shape = cx.b.shape(v[0]).to_vec();
    let dim = norm_dim(cx.int(n, "dim", Some(-1))?, shape.len())?;
    if shape.get(dim) != Some(&3) {
        return err(format!(
            "linalg.cross needs size 3 along dimension {dim}, got shape {shape:?}"
        ));
    }
    let mut parts = Vec::with_capacity(6);
    for x in [v[0], v[1]] {
        for i in 0..3 {
            parts.push(cx.b.slice_dim(x, dim, i, i + 1, 1)?);
        }
    }
    let (x, y) = (&parts[..3], &parts[3..]);
    let mut components = Vec::with_capacity(3);
    for (i, j) in [(1, 2), (2, 0), (0, 1)] {
        let first = cx.b.binary(BinaryOp::Mul, x[i], y[j])?;
        let second = cx.b.binary(BinaryOp::Mul, x[j], y[i])?;
        components.push(cx.b.binary(BinaryOp::Sub, first, second)?);
    }
    Ok(vec![Some(cx.b.concatenate(&components, dim as i64)?)])
}

/// addcmul / addcdiv: self + (value * tensor1) op tensor2, in the order torch's CPU kernel
/// takes, 16-bit floats computed in float32 and rounded once (torch's decompositions would
/// round after every step instead).
fn addc(cx: &mut Ctx, n: &Node, op: BinaryOp) -> OpResult<Vec<Option<Value>>> {
    let operands = [
        cx.operand(n, "self")?,
        cx.operand(n, "tensor1")?,
        cx.operand(n, "tensor2")?,
    ];
    let elem = promoted(cx, &operands)?;
    let what = if op == BinaryOp::Div {
        "addcdiv"
    } else {
        "addcmul"
    };
    if elem.is_bool() || (op == BinaryOp::Div && !elem.is_float() && !elem.is_complex()) {
        return err(format!(
            "{what} of {elem} tensors: torch refuses them (addcdiv takes floats, addcmul \
             numbers)"
        ));
    }
    let value = cx.float(n, "value", Some(1.0))?;
    let v = prepare(cx, &operands, elem.accumulation())?;
    let scaled = cx.scaled(v[1], value)?;
    let term = cx.b.binary(op, scaled, v[2])?;
    let sum = cx.b.binary(BinaryOp::Add, v[0], term)?;
    Ok(vec![Some(cx.b.convert(sum, elem))])
}

/// logit: log(x / (1 - x)), x first clamped to [eps, 1 - eps] when eps is given and not
/// negative; each step in the result's type as torch's CPU kernel computes it.
fn logit(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let elem = super::special::float_result(cx, n)?;
    let x = cx.tensor(n, "self")?;
    let mut x = cx.b.convert(x, elem);
    if let Some(eps) = cx.opt_float(n, "eps")?.filter(|&e| e >= 0.0) {
        let lo = cx.full_like(x, eps, None);
        let hi = cx.full_like(x, 1.0 - eps, None);
        x = cx.b.clamp(lo, x, hi)?;
    }
    let one = cx.full_like(x, 1.0, None);
    let rest = cx.b.binary(BinaryOp::Sub, one, x)?;
    let odds = cx.b.binary(BinaryOp::Div, x, rest)?;
    Ok(vec![Some(cx.b.unary(UnaryOp::Log, odds)?)])
}

fn clamp(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let lo = cx.opt_operand(n, "min")?;
    let hi = cx.opt_operand(n, "max")?;
    if lo.is_none() && hi.is_none() {
        return err("clamp needs min or max");
    }
    let elem = out_elem(cx, n)?;
    let mut v = cx.b.convert(x, elem);
    // max then min, as torch does (min wins when min > max).
    if let Some(lo) = lo {
        let l = prepare(cx, &[Operand::Tensor(v), lo], elem)?;
        v = cx.b.binary(BinaryOp::Max, l[0], l[1])?;
    }
    if let Some(hi) = hi {
        let h = prepare(cx, &[Operand::Tensor(v), hi], elem)?;
        v = cx.b.binary(BinaryOp::Min, h[0], h[1])?;
    }
    Ok(vec![Some(v)])
}

/// Copies, casts and no-ops in inference: the input converted to the recorded output type.
fn convert_to_out(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let name = if n.arg("self").is_some() {
        "self"
    } else {
        "input"
    };
    let x = cx.tensor(n, name)?;
    let elem = out_elem(cx, n)?;
    Ok(vec![Some(cx.b.convert(x, elem))])
}

fn dropout(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    if cx.bool(n, "train", false)? && cx.float(n, "p", Some(0.5))? > 0.0 {
        return err("not supported: dropout with train=True (tpuc compiles inference graphs; call model.eval())");
    }
    let x = cx.tensor(n, "input")?;
    Ok(vec![Some(x)])
}

fn full(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let ty = cx.out_type(n, 0)?;
    // full / full_like / new_full: fill_value; scalar_tensor: s; fill: value.
    let name = ["fill_value", "s", "value"]
        .into_iter()
        .find(|name| n.arg(name).is_some())
        .unwrap_or("fill_value");
    let value = cx.float(n, name, None)?;
    Ok(vec![Some(cx.b.splat(&ty, value))])
}

/// `eye(n[, m])`: ones on the diagonal.
fn eye(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let ty = cx.out_type(n, 0)?;
    if ty.rank() != 2 {
        return err(format!("eye makes a matrix, torch recorded {ty}"));
    }
    let positions = ty.with_elem(DType::I64);
    let rows = cx.b.iota(positions.clone(), 0)?;
    let cols = cx.b.iota(positions, 1)?;
    let diagonal = cx.b.compare(CompareDir::Eq, rows, cols)?;
    Ok(vec![Some(cx.b.convert(diagonal, ty.elem))])
}

fn filled(cx: &mut Ctx, n: &Node, value: f64) -> OpResult<Vec<Option<Value>>> {
    let ty = cx.out_type(n, 0)?;
    Ok(vec![Some(cx.b.splat(&ty, value))])
}

fn arange(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let ty = cx.out_type(n, 0)?;
    let start = cx.float(n, "start", Some(0.0))?;
    let step = cx.float(n, "step", Some(1.0))?;
    // Compute in f64 (or i64) and convert, so large ranges stay exact.
    let wide = if ty.elem.is_float() {
        DType::F64
    } else {
        DType::I64
    };
    let iota = cx.b.iota(ty.with_elem(wide), 0)?;
    let s = cx.full_like(iota, step, None);
    let o = cx.full_like(iota, start, None);
    let scaled = cx.b.binary(BinaryOp::Mul, iota, s)?;
    let r = cx.b.binary(BinaryOp::Add, scaled, o)?;
    Ok(vec![Some(cx.b.convert(r, ty.elem))])
}

/// `steps` values from `start` to `end`, computed as torch's CPU kernel does: from the start
/// for the first half, from the end for the second, so both ends are exact.
fn linspace(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let ty = cx.out_type(n, 0)?;
    let start = cx.float(n, "start", None)?;
    let end = cx.float(n, "end", None)?;
    let steps = cx.int(n, "steps", None)?;
    let wide = ty.with_elem(DType::F64);
    if steps <= 1 {
        let value = cx.b.splat(&wide, start);
        return Ok(vec![Some(cx.b.convert(value, ty.elem))]);
    }
    let step = (end - start) / (steps - 1) as f64;
    let i = cx.b.iota(wide.clone(), 0)?;
    let step_v = cx.b.splat(&wide, step);
    let from_start = cx.b.binary(BinaryOp::Mul, i, step_v)?;
    let start_v = cx.b.splat(&wide, start);
    let from_start = cx.b.binary(BinaryOp::Add, from_start, start_v)?;
    let last = cx.b.splat(&wide, (steps - 1) as f64);
    let back = cx.b.binary(BinaryOp::Sub, last, i)?;
    let back = cx.b.binary(BinaryOp::Mul, back, step_v)?;
    let end_v = cx.b.splat(&wide, end);
    let from_end = cx.b.binary(BinaryOp::Sub, end_v, back)?;
    let halfway = cx.b.splat(&wide, (steps / 2) as f64);
    let first_half = cx.b.compare(CompareDir::Lt, i, halfway)?;
    let r = cx.b.select(first_half, from_start, from_end)?;
    Ok(vec![Some(cx.b.convert(r, ty.elem))])
}

/// `src` converted to `self`'s dtype and broadcast to its shape (the functional copy_).
fn copy(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let src = cx.tensor(n, "src")?;
    let shape = cx.b.shape(x).to_vec();
    let src = cx.b.convert(src, cx.b.elem(x));
    Ok(vec![Some(cx.b.broadcast_to(src, &shape)?)])
}

macro_rules! lowering {
    ($name:ident, |$cx:ident, $n:ident| $body:expr) => {
        fn $name($cx: &mut Ctx, $n: &Node) -> OpResult<Vec<Option<Value>>> {
            Ok(vec![Some($body)])
        }
    };
}

lowering!(add, |cx, n| add_sub(cx, n, BinaryOp::Add)?[0]
    .expect("computed"));
lowering!(sub, |cx, n| add_sub(cx, n, BinaryOp::Sub)?[0]
    .expect("computed"));
lowering!(rsub, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let alpha = cx.float(n, "alpha", Some(1.0))?;
    plus_scaled(cx, b, a, alpha, BinaryOp::Sub)?
});
lowering!(mul, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = promoted(cx, &[a, b])?;
    scaled_arith(cx, a, b, elem, BinaryOp::Mul)?
});
lowering!(div, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    match cx.opt_str(n, "rounding_mode")? {
        None => true_div(cx, a, b)?,
        Some("trunc") => trunc_div(cx, a, b)?,
        Some("floor") => floor_div(cx, a, b)?,
        Some(other) => return err(format!("not supported: rounding_mode={other:?}")),
    }
});
lowering!(floor_divide, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    floor_div(cx, a, b)?
});
lowering!(remainder_op, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    remainder(cx, a, b)?
});
lowering!(fmod, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    arith(cx, a, b, BinaryOp::Rem)?
});
lowering!(maximum, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    arith(cx, a, b, BinaryOp::Max)?
});
lowering!(minimum, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    arith(cx, a, b, BinaryOp::Min)?
});
lowering!(atan2, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = out_elem(cx, n)?;
    let v = prepare(cx, &[a, b], elem)?;
    cx.b.binary(BinaryOp::Atan2, v[0], v[1])?
});
/// fmax / fmin: like maximum / minimum, but a NaN loses to a number.
fn nan_ignoring(cx: &mut Ctx, n: &Node, op: BinaryOp) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = out_elem(cx, n)?;
    let v = prepare(cx, &[a, b], elem)?;
    let r = cx.b.binary(op, v[0], v[1])?;
    if !elem.is_float() {
        return Ok(vec![Some(r)]);
    }
    let a_nan = cx.b.compare(CompareDir::Ne, v[0], v[0])?;
    let b_nan = cx.b.compare(CompareDir::Ne, v[1], v[1])?;
    let r = cx.b.select(b_nan, v[0], r)?;
    Ok(vec![Some(cx.b.select(a_nan, v[1], r)?)])
}

/// Whether the sign bit of float `x` is set (negative numbers, -0.0 and negative NaNs): the
/// bits read as a signed integer of the same width are negative.
fn sign_bit(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let bits = same_width_integer(cx.b.elem(x));
    let i = cx.b.bitcast(x, bits)?;
    let zero = cx.full_like(i, 0.0, None);
    Ok(cx.b.compare(CompareDir::Lt, i, zero)?)
}

lowering!(signbit, |cx, n| {
    let x = cx.tensor(n, "self")?;
    let elem = cx.b.elem(x);
    if elem.is_float() {
        sign_bit(cx, x)?
    } else {
        let zero = cx.full_like(x, 0.0, None);
        cx.b.compare(CompareDir::Lt, x, zero)?
    }
});
lowering!(copysign, |cx, n| {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = out_elem(cx, n)?;
    let v = prepare(cx, &[a, b], elem)?;
    let magnitude = cx.b.unary(UnaryOp::Abs, v[0])?;
    let negated = cx.b.unary(UnaryOp::Neg, magnitude)?;
    let negative = sign_bit(cx, v[1])?;
    cx.b.select(negative, negated, magnitude)?
});
/// digamma with torch's value at 0: -inf (the pole's limit from the right) where CHLO's
/// expansion gives NaN.
pub(super) fn digamma_of(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let d = cx.b.unary(UnaryOp::Digamma, x)?;
    let zero = cx.full_like(x, 0.0, None);
    let at_zero = cx.b.compare(CompareDir::Eq, x, zero)?;
    let minus_inf = cx.full_like(x, f64::NEG_INFINITY, None);
    Ok(cx.b.select(at_zero, minus_inf, d)?)
}

lowering!(digamma, |cx, n| {
    let x = self_in_out_type(cx, n)?;
    digamma_of(cx, x)?
});
lowering!(angle, |cx, n| {
    let x = cx.tensor(n, "self")?;
    if cx.b.elem(x).is_complex() {
        let re = cx.b.real(x)?;
        let im = cx.b.imag(x)?;
        return Ok(vec![Some(cx.b.binary(BinaryOp::Atan2, im, re)?)]);
    }
    // The angle of a real number: 0 for x >= 0, pi for x < 0, NaN for NaN.
    let x = self_in_out_type(cx, n)?;
    let zero = cx.full_like(x, 0.0, None);
    let pi = cx.full_like(x, std::f64::consts::PI, None);
    let negative = cx.b.compare(CompareDir::Lt, x, zero)?;
    let angle = cx.b.select(negative, pi, zero)?;
    let nan = cx.b.compare(CompareDir::Ne, x, x)?;
    cx.b.select(nan, x, angle)?
});
lowering!(exp2, |cx, n| {
    let x = self_in_out_type(cx, n)?;
    let two = cx.full_like(x, 2.0, None);
    cx.b.binary(BinaryOp::Pow, two, x)?
});
lowering!(ldexp, |cx, n| {
    // self * 2^other, in the output's (float) type.
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = out_elem(cx, n)?;
    let v = prepare(cx, &[a, b], elem)?;
    let two = cx.full_like(v[1], 2.0, None);
    let scale = cx.b.binary(BinaryOp::Pow, two, v[1])?;
    cx.b.binary(BinaryOp::Mul, v[0], scale)?
});
lowering!(neg, |cx, n| {
    let x = cx.tensor(n, "self")?;
    cx.b.unary(UnaryOp::Neg, x)?
});
lowering!(abs, |cx, n| {
    let x = cx.tensor(n, "self")?;
    if cx.b.elem(x).is_unsigned() {
        x
    } else {
        cx.b.unary(UnaryOp::Abs, x)?
    }
});
lowering!(sign, |cx, n| {
    let x = cx.tensor(n, "self")?;
    if cx.b.elem(x).is_bool() {
        x
    } else {
        cx.b.unary(UnaryOp::Sign, x)?
    }
});
lowering!(reciprocal, |cx, n| {
    let x = self_in_out_type(cx, n)?;
    let one = cx.full_like(x, 1.0, None);
    cx.b.binary(BinaryOp::Div, one, x)?
});
lowering!(logical_not, |cx, n| {
    let x = cx.tensor(n, "self")?;
    let b = to_bool(cx, x)?;
    let r = cx.b.unary(UnaryOp::Not, b)?;
    let elem = out_elem(cx, n)?;
    cx.b.convert(r, elem)
});
lowering!(bitwise_not, |cx, n| {
    let x = cx.tensor(n, "self")?;
    cx.b.unary(UnaryOp::Not, x)?
});
// round, to `decimals` places as torch's kernel does it: x * 10^d rounded half to even and
// divided back (x / 10^-d and multiplied back for negative d), 10^d in x's type.
lowering!(round_op, |cx, n| {
    let decimals = cx.opt_int(n, "decimals")?.unwrap_or(0);
    let x = cx.tensor(n, "self")?;
    if !cx.b.elem(x).is_float() {
        if decimals != 0 {
            return err("round with decimals needs a float tensor");
        }
        return Ok(vec![Some(x)]);
    }
    if decimals == 0 {
        return Ok(vec![Some(cx.b.unary(UnaryOp::RoundEven, x)?)]);
    }
    let ten_pow = cx.full_like(x, 10f64.powi(decimals.unsigned_abs().min(400) as i32), None);
    let (scale, unscale) = if decimals > 0 {
        (BinaryOp::Mul, BinaryOp::Div)
    } else {
        (BinaryOp::Div, BinaryOp::Mul)
    };
    let scaled = cx.b.binary(scale, x, ten_pow)?;
    let rounded = cx.b.unary(UnaryOp::RoundEven, scaled)?;
    cx.b.binary(unscale, rounded, ten_pow)?
});
lowering!(trunc_op, |cx, n| {
    let x = cx.tensor(n, "self")?;
    if cx.b.elem(x).is_float() {
        trunc(cx, x)?
    } else {
        x
    }
});
lowering!(isnan, |cx, n| {
    let x = cx.tensor(n, "self")?;
    if cx.b.elem(x).is_float() {
        cx.b.compare(CompareDir::Ne, x, x)?
    } else {
        cx.full_like(x, 0.0, Some(DType::Bool))
    }
});
lowering!(isinf, |cx, n| {
    let x = cx.tensor(n, "self")?;
    if !cx.b.elem(x).is_float() {
        cx.full_like(x, 0.0, Some(DType::Bool))
    } else {
        let a = cx.b.unary(UnaryOp::Abs, x)?;
        let inf = cx.full_like(x, f64::INFINITY, None);
        cx.b.compare(CompareDir::Eq, a, inf)?
    }
});
lowering!(leaky_relu, |cx, n| {
    let x = cx.tensor(n, "self")?;
    let slope = cx.float(n, "negative_slope", Some(0.01))?;
    let zero = cx.full_like(x, 0.0, None);
    let s = cx.full_like(x, slope, None);
    let pos = cx.b.compare(CompareDir::Gt, x, zero)?;
    let scaled = cx.b.binary(BinaryOp::Mul, x, s)?;
    cx.b.select(pos, x, scaled)?
});
/// min(max(x + 3, 0), 6): the ramp of hardsigmoid and hardswish.
fn ramp_to_six(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let three = cx.full_like(x, 3.0, None);
    let zero = cx.full_like(x, 0.0, None);
    let six = cx.full_like(x, 6.0, None);
    let shifted = cx.b.binary(BinaryOp::Add, x, three)?;
    let clamped = cx.b.binary(BinaryOp::Max, shifted, zero)?;
    Ok(cx.b.binary(BinaryOp::Min, clamped, six)?)
}

/// hardsigmoid(x) = ramp(x) / 6 and hardswish(x) = x ramp(x) / 6, in the accumulation type as
/// torch computes them.
fn hard_activation(cx: &mut Ctx, n: &Node, swish: bool) -> OpResult<Vec<Option<Value>>> {
    computed_wide(cx, n, |cx, x| {
        let mut r = ramp_to_six(cx, x)?;
        if swish {
            r = cx.b.binary(BinaryOp::Mul, x, r)?;
        }
        let six = cx.full_like(x, 6.0, None);
        Ok(cx.b.binary(BinaryOp::Div, r, six)?)
    })
}

/// `diff(x, n, dim, prepend, append)`: n-th forward differences along dim, after prepending and
/// appending; for booleans, whether neighbours differ.
fn diff(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let rank = cx.b.ty(x).rank();
    let dim = norm_dim(cx.int(n, "dim", Some(-1))?, rank)?;
    let order = cx.int(n, "n", Some(1))?;
    if order < 0 {
        return err(format!("diff needs n >= 0, got {order}"));
    }
    let elem = out_elem(cx, n)?;
    let mut parts = Vec::new();
    for name in ["prepend", "self", "append"] {
        if let Some(t) = cx.opt_tensor(n, name)? {
            parts.push(cx.b.convert(t, elem));
        }
    }
    let mut v = cx.b.concatenate(&parts, dim as i64)?;
    for _ in 0..order {
        let size = cx.b.shape(v)[dim];
        if size == 0 {
            break;
        }
        let later = cx.b.slice_dim(v, dim, 1, size, 1)?;
        let earlier = cx.b.slice_dim(v, dim, 0, size - 1, 1)?;
        v = if elem.is_bool() {
            cx.b.binary(BinaryOp::Xor, later, earlier)?
        } else {
            cx.b.binary(BinaryOp::Sub, later, earlier)?
        };
    }
    Ok(vec![Some(v)])
}

lowering!(hardtanh, |cx, n| {
    let x = cx.tensor(n, "self")?;
    let lo = cx.float(n, "min_val", Some(-1.0))?;
    let hi = cx.float(n, "max_val", Some(1.0))?;
    let l = cx.b.scalar(cx.b.elem(x), lo);
    let h = cx.b.scalar(cx.b.elem(x), hi);
    cx.b.clamp(l, x, h)?
});

fn assert_metadata(_: &mut Ctx, _: &Node) -> OpResult<Vec<Option<Value>>> {
    Ok(vec![])
}

pub fn register(r: &mut Registry) {
    r.add_complex(&["aten.add.Tensor", "aten.add.Scalar"], add);
    r.add_complex(&["aten.sub.Tensor", "aten.sub.Scalar"], sub);
    r.add_complex(&["aten.rsub.Scalar", "aten.rsub.Tensor"], rsub);
    r.add_complex(&["aten.mul.Tensor", "aten.mul.Scalar"], mul);
    r.add_complex(&["aten.div.Tensor", "aten.div.Scalar"], div);
    // Rounding divisions are real-only.
    r.add(&["aten.div.Tensor_mode", "aten.div.Scalar_mode"], div);
    r.add(
        &["aten.floor_divide.default", "aten.floor_divide.Scalar"],
        floor_divide,
    );
    r.add(
        &["aten.remainder.Tensor", "aten.remainder.Scalar"],
        remainder_op,
    );
    r.add(&["aten.fmod.Tensor", "aten.fmod.Scalar"], fmod);
    r.add(
        &[
            "aten.pow.Scalar",
            "aten.pow.Tensor_Scalar",
            "aten.pow.Tensor_Tensor",
        ],
        pow,
    );
    r.add(&["aten.maximum.default", "aten.max.other"], maximum);
    r.add(&["aten.minimum.default", "aten.min.other"], minimum);
    r.add(&["aten.atan2.default"], atan2);
    r.add(&["aten.fmax.default"], |cx, n| {
        nan_ignoring(cx, n, BinaryOp::Max)
    });
    r.add(&["aten.fmin.default"], |cx, n| {
        nan_ignoring(cx, n, BinaryOp::Min)
    });
    r.add(&["aten.signbit.default"], signbit);
    r.add(&["aten.copysign.Tensor", "aten.copysign.Scalar"], copysign);
    r.add(&["aten.exp2.default"], exp2);
    r.add_complex(&["aten.angle.default"], angle);
    r.add(&["aten.digamma.default"], digamma);
    r.add(&["aten.ldexp.Tensor"], ldexp);
    for (dir, names) in [
        (CompareDir::Eq, ["aten.eq.Tensor", "aten.eq.Scalar"]),
        (CompareDir::Ne, ["aten.ne.Tensor", "aten.ne.Scalar"]),
        (CompareDir::Lt, ["aten.lt.Tensor", "aten.lt.Scalar"]),
        (CompareDir::Le, ["aten.le.Tensor", "aten.le.Scalar"]),
        (CompareDir::Gt, ["aten.gt.Tensor", "aten.gt.Scalar"]),
        (CompareDir::Ge, ["aten.ge.Tensor", "aten.ge.Scalar"]),
    ] {
        r.add(&names, move |cx, n| compare(cx, n, dir));
    }
    r.add(&["aten.logical_and.default"], |cx, n| {
        logical(cx, n, BinaryOp::And)
    });
    r.add(&["aten.logical_or.default"], |cx, n| {
        logical(cx, n, BinaryOp::Or)
    });
    r.add(&["aten.logical_xor.default"], |cx, n| {
        logical(cx, n, BinaryOp::Xor)
    });
    r.add(&["aten.logical_not.default"], logical_not);
    r.add(
        &[
            "aten.bitwise_and.Tensor",
            "aten.bitwise_and.Scalar",
            "aten.__and__.Tensor",
        ],
        |cx, n| bitwise(cx, n, BinaryOp::And),
    );
    r.add(
        &[
            "aten.bitwise_or.Tensor",
            "aten.bitwise_or.Scalar",
            "aten.__or__.Tensor",
        ],
        |cx, n| bitwise(cx, n, BinaryOp::Or),
    );
    r.add(
        &[
            "aten.bitwise_xor.Tensor",
            "aten.bitwise_xor.Scalar",
            "aten.__xor__.Tensor",
        ],
        |cx, n| bitwise(cx, n, BinaryOp::Xor),
    );
    r.add(&["aten.bitwise_not.default"], bitwise_not);
    r.add_complex(
        &[
            "aten.where.self",
            "aten.where.ScalarOther",
            "aten.where.ScalarSelf",
            "aten.where.Scalar",
        ],
        where_self,
    );
    r.add(&["prims.fma.default"], fma);
    r.add(
        &["aten.masked_fill.Scalar", "aten.masked_fill.Tensor"],
        masked_fill,
    );
    r.add(&["aten.triu.default", "aten.tril.default"], triangle);
    r.add(&["aten.outer.default"], outer);
    r.add(&["aten.addr.default"], addr);
    r.add(&["aten.linalg_cross.default"], linalg_cross);
    r.add(&["aten.logit.default"], logit);
    r.add(&["aten.addcmul.default"], |cx, n| {
        addc(cx, n, BinaryOp::Mul)
    });
    r.add(&["aten.addcdiv.default"], |cx, n| {
        addc(cx, n, BinaryOp::Div)
    });
    r.add(&["aten.log2.default"], |cx, n| log_base(cx, n, 2.0));
    r.add(&["aten.log10.default"], |cx, n| log_base(cx, n, 10.0));
    r.add(&["aten.elu.default"], elu);
    r.add(
        &[
            "aten.clamp.default",
            "aten.clamp.Tensor",
            "aten.clamp_min.default",
            "aten.clamp_max.default",
        ],
        clamp,
    );
    r.add_complex(&["aten.neg.default"], neg);
    r.add_complex(&["aten.abs.default"], abs);
    r.add(&["aten.sign.default"], sign);
    r.add(&["aten.reciprocal.default"], reciprocal);
    r.add(&["aten.round.default", "aten.round.decimals"], round_op);
    r.add(&["aten.trunc.default"], trunc_op);
    r.add(&["aten.isnan.default"], isnan);
    r.add(&["aten.isinf.default"], isinf);
    for (op, name) in [
        (UnaryOp::Exp, "aten.exp.default"),
        (UnaryOp::Expm1, "aten.expm1.default"),
        (UnaryOp::Log, "aten.log.default"),
        (UnaryOp::Log1p, "aten.log1p.default"),
        (UnaryOp::Sqrt, "aten.sqrt.default"),
        (UnaryOp::Rsqrt, "aten.rsqrt.default"),
        (UnaryOp::Tanh, "aten.tanh.default"),
        (UnaryOp::Logistic, "aten.sigmoid.default"),
        (UnaryOp::Sin, "aten.sin.default"),
        (UnaryOp::Cos, "aten.cos.default"),
        (UnaryOp::Tan, "aten.tan.default"),
        (UnaryOp::Floor, "aten.floor.default"),
        (UnaryOp::Ceil, "aten.ceil.default"),
        (UnaryOp::Erf, "aten.erf.default"),
        (UnaryOp::Asin, "aten.asin.default"),
        (UnaryOp::Acos, "aten.acos.default"),
        (UnaryOp::Atan, "aten.atan.default"),
        (UnaryOp::Sinh, "aten.sinh.default"),
        (UnaryOp::Cosh, "aten.cosh.default"),
        (UnaryOp::Asinh, "aten.asinh.default"),
        (UnaryOp::Acosh, "aten.acosh.default"),
        (UnaryOp::Atanh, "aten.atanh.default"),
        (UnaryOp::Lgamma, "aten.lgamma.default"),
        (UnaryOp::ErfInv, "aten.erfinv.default"),
        (UnaryOp::Erfc, "aten.erfc.default"),
    ] {
        r.add(&[name], move |cx, n| unary_in_out_type(cx, n, op));
    }
    r.add(&["aten.relu.default"], relu);
    r.add(&["aten.silu.default"], silu);
    r.add(&["aten.gelu.default"], gelu);
    r.add(&["aten.leaky_relu.default"], leaky_relu);
    r.add(&["aten.hardtanh.default"], hardtanh);
    r.add(&["aten.hardsigmoid.default"], |cx, n| {
        hard_activation(cx, n, false)
    });
    r.add(&["aten.hardswish.default"], |cx, n| {
        hard_activation(cx, n, true)
    });
    r.add(&["aten.diff.default"], diff);
    r.add_complex(
        &[
            "aten.to.dtype",
            "aten.to.device",
            "aten.to.dtype_layout",
            "aten._to_copy.default",
            "aten.clone.default",
            "aten.contiguous.default",
            "aten.alias.default",
            "aten.detach.default",
            "aten.lift_fresh_copy.default",
            "aten.type_as.default",
        ],
        convert_to_out,
    );
    r.add(&["aten.dropout.default"], dropout);
    r.add(&["prims.convert_element_type.default"], |cx, n| {
        let x = cx.tensor(n, "a")?;
        let elem = out_elem(cx, n)?;
        Ok(vec![Some(cx.b.convert(x, elem))])
    });
    r.add(&["aten._assert_tensor_metadata.default"], assert_metadata);
    r.add_complex(
        &[
            "aten.full.default",
            "aten.full_like.default",
            "aten.scalar_tensor.default",
            "aten.new_full.default",
            "aten.fill.Scalar",
        ],
        full,
    );
    r.add(&["aten.linspace.default"], linspace);
    r.add(&["aten.eye.default", "aten.eye.m"], eye);
    r.add_complex(&["aten.copy.default"], copy);
    r.add_complex(
        &[
            "aten.zeros.default",
            "aten.zeros_like.default",
            "aten.new_zeros.default",
            "aten.empty.memory_format",
            "aten.empty_like.default",
            "aten.empty_strided.default",
            "aten.empty_permuted.default",
            "aten.new_empty_strided.default",
        ],
        |cx, n| filled(cx, n, 0.0),
    );
    r.add_complex(
        &[
            "aten.ones.default",
            "aten.ones_like.default",
            "aten.new_ones.default",
        ],
        |cx, n| filled(cx, n, 1.0),
    );
    r.add(
        &[
            "aten.arange.start_step",
            "aten.arange.default",
            "aten.arange.start",
            "prims.iota.default",
        ],
        arange,
    );
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn add_scales_other_by_alpha_and_promotes_operands() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[2, 3]);
        let i = g.input("i", DType::I32, &[2, 3]);
        let y = g.node1(
            "aten.add.Tensor",
            vec![("self", t(&x)), ("other", t(&i)), ("alpha", Arg::Int(2))],
            DType::F32,
            &[2, 3],
        );
        // alpha * other in other's type (an int alpha keeps int32), then promoted to float32
        // and added.
        assert_checks(
            &g.text(&[&y]),
            &[
                "stablehlo.multiply %1, %3 : tensor<2x3xi32>",
                "stablehlo.convert %4 to=float32 : tensor<2x3xf32>",
                "stablehlo.add %0, %5",
                "return %6",
            ],
        );
    }

    #[test]
    fn a_result_torch_typed_otherwise_is_refused() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[2]);
        // torch would never record int64 for float32 + float32.
        let y = g.node1(
            "aten.add.Tensor",
            vec![("self", t(&x)), ("other", t(&x))],
            DType::I64,
            &[2],
        );
        let e = g.lower(&[&y]).unwrap_err().to_string();
        assert!(
            e.contains("node0 (aten.add.Tensor)") && e.contains("torch recorded tensor<2xi64>"),
            "{e}"
        );
    }

    #[test]
    fn a_scalar_factor_of_a_half_tensor_stays_float32() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::BF16, &[4]);
        let y = g.node1(
            "aten.mul.Tensor",
            vec![("self", t(&x)), ("other", Arg::Float(1.0137))],
            DType::BF16,
            &[4],
        );
        assert_checks(
            &g.text(&[&y]),
            &[
                "stablehlo.convert %0 to=float32",
                // 1.0137 in float32 (in bfloat16 it would be 1.015625).
                "stablehlo.constant splat=0x3F81C0EC : tensor<f32>",
                "stablehlo.multiply %1, %3 : tensor<4xf32>",
                "stablehlo.convert %4 to=bfloat16",
            ],
        );
    }

    #[test]
    fn cross_products_and_integer_addcdiv_are_refused_by_name() {
        let mut g = TestGraph::default();
        let a = g.input("a", DType::F32, &[4, 2]);
        let y = g.node1(
            "aten.linalg_cross.default",
            vec![("self", t(&a)), ("other", t(&a))],
            DType::F32,
            &[4, 2],
        );
        let e = g.lower(&[&y]).unwrap_err().to_string();
        assert!(e.contains("needs size 3 along dimension 1"), "{e}");
        let mut g = TestGraph::default();
        let i = g.input("i", DType::I64, &[3]);
        let y = g.node1(
            "aten.addcdiv.default",
            vec![("self", t(&i)), ("tensor1", t(&i)), ("tensor2", t(&i))],
            DType::I64,
            &[3],
        );
        let e = g.lower(&[&y]).unwrap_err().to_string();
        assert!(e.contains("addcdiv of int64 tensors"), "{e}");
    }
}
