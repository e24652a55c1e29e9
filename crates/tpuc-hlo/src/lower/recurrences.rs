//! Orthogonal polynomials of a degree each element gives, by torch's three-term recurrences:
//! Hermite's physicists' (H) and probabilists' (He), Laguerre's (L) and Legendre's (P). torch
//! runs the recurrence as many times as an element's degree; here it is one loop up to the
//! largest degree, each element keeping its value once its own degree is reached, computed in
//! the result's type as torch computes it (step by step the same arithmetic), with torch's
//! values for negative degrees (0), degrees 0 and 1, x = 0 (Laguerre: 1), |x| = 1 (Legendre:
//! +-1) and Hermite degrees beyond its limit (NaN: 128 in float32, 512 in float64).

use tpuc_fx::Node;

use super::prelude::*;
use super::special::float_result;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    HermiteH,
    HermiteHe,
    Laguerre,
    Legendre,
}

/// `a + b`, `a * b`, ... of two values of one type.
fn op(cx: &mut Ctx, kind: BinaryOp, a: Value, b: Value) -> OpResult<Value> {
    Ok(cx.b.binary(kind, a, b)?)
}

/// The degree of each element as torch casts it: truncated to an integer, -1 (so 0) where it
/// is not finite.
fn degrees(cx: &mut Ctx, n: Value) -> OpResult<Value> {
    let n = cx.b.convert(n, DType::F64);
    let magnitude = cx.b.unary(UnaryOp::Abs, n)?;
    let whole = cx.b.unary(UnaryOp::Floor, magnitude)?;
    let sign = cx.b.unary(UnaryOp::Sign, n)?;
    let truncated = op(cx, BinaryOp::Mul, whole, sign)?;
    let finite = cx.b.is_finite(n)?;
    let minus_one = cx.full_like(n, -1.0, None);
    let truncated = cx.b.select(finite, truncated, minus_one)?;
    Ok(cx.b.convert(truncated, DType::I64))
}

/// One step of `family`'s recurrence: from p = P_{k-1} and q = P_k, P_{k+1}; `k` the step's
/// number as the type's value (torch's integer counter, converted where it meets a float).
/// Each is `(c q - m p) / d` as torch writes it: H: c = x + x, m = 2k (torch counts k by twos),
/// no d; He: c = x, m = k; L: c = 2k + (1 - x), m = k, d = k + 1; P: c = (2k + 1) x, m = k,
/// d = k + 1.
fn step(cx: &mut Ctx, family: Family, x: Value, k: Value, p: Value, q: Value) -> OpResult<Value> {
    let one = cx.full_like(x, 1.0, None);
    let twice_k = op(cx, BinaryOp::Add, k, k)?;
    let (c, m) = match family {
        Family::HermiteH => (op(cx, BinaryOp::Add, x, x)?, twice_k),
        Family::HermiteHe => (x, k),
        Family::Laguerre => {
            let one_minus_x = op(cx, BinaryOp::Sub, one, x)?;
            (op(cx, BinaryOp::Add, twice_k, one_minus_x)?, k)
        }
        Family::Legendre => {
            let odd = op(cx, BinaryOp::Add, twice_k, one)?;
            (op(cx, BinaryOp::Mul, odd, x)?, k)
        }
    };
    let cq = op(cx, BinaryOp::Mul, c, q)?;
    let mp = op(cx, BinaryOp::Mul, m, p)?;
    let next = op(cx, BinaryOp::Sub, cq, mp)?;
    match family {
        Family::HermiteH | Family::HermiteHe => Ok(next),
        Family::Laguerre | Family::Legendre => {
            let d = op(cx, BinaryOp::Add, k, one)?;
            op(cx, BinaryOp::Div, next, d)
        }
    }
}

/// `family`'s polynomial of `x` (in the type it is computed in) and degree `n` (an i64 tensor
/// of x's shape).
fn polynomial(cx: &mut Ctx, family: Family, x: Value, n: Value) -> OpResult<Value> {
    let elem = cx.b.elem(x);
    let shape = cx.b.shape(x).to_vec();
    let one = cx.full_like(x, 1.0, None);
    let first = match family {
        Family::HermiteH => op(cx, BinaryOp::Add, x, x)?,
        Family::HermiteHe | Family::Legendre => x,
        Family::Laguerre => op(cx, BinaryOp::Sub, one, x)?,
    };
    // Steps k = 1 .. (largest degree - 1): P_{k+1} from P_{k-1} and P_k where k < n. Hermite's
    // degrees beyond its limit are NaN whatever the loop gives, so the loop stops there.
    let limit = if elem == DType::F32 { 128.0 } else { 512.0 };
    let mut largest = cx.b.reduce_by(
        n,
        &(0..shape.len() as i64).collect::<Vec<_>>(),
        BinaryOp::Max,
    )?;
    if matches!(family, Family::HermiteH | Family::HermiteHe) {
        let cap = cx.b.scalar(DType::I64, limit + 1.0);
        largest = op(cx, BinaryOp::Min, largest, cap)?;
    }
    let results = cx.counted_loop(1, largest, &[one, first, x, n], |cx, k, v| {
        let (p, q, x, n) = (v[0], v[1], v[2], v[3]);
        let (shape, elem) = (cx.b.shape(x).to_vec(), cx.b.elem(x));
        let k_value = cx.b.convert(k, elem);
        let k_value = cx.b.broadcast_to(k_value, &shape)?;
        let r = step(cx, family, x, k_value, p, q)?;
        let k_wide = cx.b.broadcast_to(k, &shape)?;
        let active = cx.b.compare(CompareDir::Lt, k_wide, n)?;
        let p = cx.b.select(active, q, p)?;
        let q = cx.b.select(active, r, q)?;
        Ok(vec![p, q, x, n])
    })?;
    let mut v = results[1];
    // Degree 0 is 1; then the families' own values, as torch checks them (in this order).
    let constant = cx.compared(n, CompareDir::Eq, 0.0)?;
    v = cx.b.select(constant, one, v)?;
    match family {
        Family::HermiteH | Family::HermiteHe => {
            let beyond = cx.compared(n, CompareDir::Gt, limit)?;
            v = cx.value_where(beyond, f64::NAN, v)?;
        }
        Family::Laguerre => {
            let zero = cx.compared(x, CompareDir::Eq, 0.0)?;
            v = cx.b.select(zero, one, v)?;
        }
        Family::Legendre => {
            // +-1 at |x| = 1: -1 only at x = -1 for odd degrees.
            let magnitude = cx.b.unary(UnaryOp::Abs, x)?;
            let at_one = cx.compared(magnitude, CompareDir::Eq, 1.0)?;
            let two = cx.full_like(n, 2.0, None);
            let parity = op(cx, BinaryOp::Rem, n, two)?;
            let odd = cx.compared(parity, CompareDir::Ne, 0.0)?;
            let negative = cx.compared(x, CompareDir::Lt, 0.0)?;
            let flips = op(cx, BinaryOp::And, odd, negative)?;
            let minus_one = cx.full_like(x, -1.0, None);
            let edge = cx.b.select(flips, minus_one, one)?;
            v = cx.b.select(at_one, edge, v)?;
        }
    }
    let negative = cx.compared(n, CompareDir::Lt, 0.0)?;
    cx.value_where(negative, 0.0, v)
}

fn lower(cx: &mut Ctx, node: &Node, family: Family) -> OpResult<Vec<Option<Value>>> {
    let (x, n) = (cx.operand(node, "x")?, cx.operand(node, "n")?);
    let elem = float_result(cx, node)?;
    // torch computes float16 and bfloat16 in float32.
    let work = if elem.byte_size() < 4 {
        DType::F32
    } else {
        elem
    };
    let v = prepare(cx, &[x, n], DType::F64)?;
    let x = cx.b.convert(v[0], work);
    let n = degrees(cx, v[1])?;
    let r = polynomial(cx, family, x, n)?;
    Ok(vec![Some(cx.b.convert(r, elem))])
}

pub fn register(r: &mut Registry) {
    for (names, family) in [
        (
            scalar_overloads!("special_hermite_polynomial_h"),
            Family::HermiteH,
        ),
        (
            scalar_overloads!("special_hermite_polynomial_he"),
            Family::HermiteHe,
        ),
        (
            scalar_overloads!("special_laguerre_polynomial_l"),
            Family::Laguerre,
        ),
        (
            scalar_overloads!("special_legendre_polynomial_p"),
            Family::Legendre,
        ),
    ] {
        r.add(&names, move |cx, n| lower(cx, n, family));
    }
}
