//! Chebyshev polynomials of the four kinds (T, U, V, W) and their shifted forms, of a degree
//! each element gives. torch runs the three-term recurrence as many times as the degree (a
//! loop whose length is data); tpuc evaluates the closed forms instead, in float64: with
//! theta = acos x inside [-1, 1] and acosh x above it, T_n = cos(n theta), U_n =
//! sin((n+1) theta) / sin theta, V_n = cos((n+1/2) theta) / cos(theta/2) and W_n =
//! sin((n+1/2) theta) / sin(theta/2) (hyperbolic functions above 1), below -1 the reflections
//! T_n(-x) = (-1)^n T_n(x), U likewise, V_n(-x) = (-1)^n W_n(x) and W_n(-x) = (-1)^n V_n(x);
//! torch's values at +-1, 1 for degree 0 (even at NaN) and 0 for negative degrees. The degree is truncated to an integer,
//! as torch casts it.

use tpuc_fx::Node;

use super::prelude::*;
use super::semantics::prepare;
use super::special::float_result;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    T,
    U,
    V,
    W,
}

impl Kind {
    /// The kind whose reflection this kind's value below -1 is.
    fn reflected(self) -> Kind {
        match self {
            Kind::V => Kind::W,
            Kind::W => Kind::V,
            k => k,
        }
    }
}

/// `a * n + b`.
fn affine(cx: &mut Ctx, n: Value, a: f64, b: f64) -> OpResult<Value> {
    let an = cx.scaled(n, a)?;
    let b = cx.full_like(n, b, None);
    Ok(cx.b.binary(BinaryOp::Add, an, b)?)
}

/// The polynomial of `kind` and degree `n` (a whole number >= 0) at x > -1: the closed form
/// for the trigonometric (|x| < 1) and hyperbolic (x > 1) sides, the value at x = 1.
fn from_above_minus_one(cx: &mut Ctx, kind: Kind, x: Value, n: Value) -> OpResult<Value> {
    let trig_theta = cx.b.unary(UnaryOp::Acos, x)?;
    let hyper_theta = cx.b.unary(UnaryOp::Acosh, x)?;
    // (numerator's multiple of theta, denominator's, whether they are sines).
    let (outer, inner, sines) = match kind {
        Kind::T => (n, None, false),
        Kind::U => (affine(cx, n, 1.0, 1.0)?, Some(1.0), true),
        Kind::V => (affine(cx, n, 1.0, 0.5)?, Some(0.5), false),
        Kind::W => (affine(cx, n, 1.0, 0.5)?, Some(0.5), true),
    };
    let mut sides = Vec::new();
    for (theta, [sin, cos]) in [
        (trig_theta, [UnaryOp::Sin, UnaryOp::Cos]),
        (hyper_theta, [UnaryOp::Sinh, UnaryOp::Cosh]),
    ] {
        let f = if sines { sin } else { cos };
        let angle = cx.b.binary(BinaryOp::Mul, outer, theta)?;
        let numerator = cx.b.unary(f, angle)?;
        sides.push(match inner {
            Some(c) => {
                let angle = cx.scaled(theta, c)?;
                let denominator = cx.b.unary(f, angle)?;
                cx.b.binary(BinaryOp::Div, numerator, denominator)?
            }
            None => numerator,
        });
    }
    let above_one = cx.compared(x, CompareDir::Gt, 1.0)?;
    let v = cx.b.select(above_one, sides[1], sides[0])?;
    let at_one = match kind {
        Kind::T | Kind::V => cx.full_like(x, 1.0, None),
        Kind::U => affine(cx, n, 1.0, 1.0)?,
        Kind::W => affine(cx, n, 2.0, 1.0)?,
    };
    let one = cx.compared(x, CompareDir::Eq, 1.0)?;
    Ok(cx.b.select(one, at_one, v)?)
}

/// The polynomial at any x, for degrees `n` as float64 (truncated; negative ones give 0).
fn chebyshev(cx: &mut Ctx, kind: Kind, x: Value, n: Value) -> OpResult<Value> {
    let magnitude = cx.b.unary(UnaryOp::Abs, n)?;
    let whole = cx.b.unary(UnaryOp::Floor, magnitude)?;
    let sign = cx.b.unary(UnaryOp::Sign, n)?;
    let n = cx.b.binary(BinaryOp::Mul, whole, sign)?;
    let direct = from_above_minus_one(cx, kind, x, n)?;
    let minus_x = cx.b.unary(UnaryOp::Neg, x)?;
    let reflected = from_above_minus_one(cx, kind.reflected(), minus_x, n)?;
    // (-1)^n = 1 - 2 (n mod 2).
    let two = cx.full_like(n, 2.0, None);
    let parity = cx.b.binary(BinaryOp::Rem, n, two)?;
    let parity_sign = affine(cx, parity, -2.0, 1.0)?;
    let reflected = cx.b.binary(BinaryOp::Mul, parity_sign, reflected)?;
    let below = cx.compared(x, CompareDir::Le, -1.0)?;
    let v = cx.b.select(below, reflected, direct)?;
    // Degree 0 is 1 even at NaN, as torch has it.
    let constant = cx.compared(n, CompareDir::Eq, 0.0)?;
    let one = cx.full_like(v, 1.0, None);
    let v = cx.b.select(constant, one, v)?;
    let negative = cx.compared(n, CompareDir::Lt, 0.0)?;
    let zero = cx.full_like(v, 0.0, None);
    Ok(cx.b.select(negative, zero, v)?)
}

/// `kind`'s polynomial of `x` (shifted: of 2x - 1) and degree `n`, in float64, rounded once to
/// the output's type.
fn lower(cx: &mut Ctx, node: &Node, kind: Kind, shifted: bool) -> OpResult<Vec<Option<Value>>> {
    let (x, n) = (cx.operand(node, "x")?, cx.operand(node, "n")?);
    let elem = float_result(cx, node)?;
    let v = prepare(cx, &[x, n], DType::F64)?;
    let x = if shifted {
        affine(cx, v[0], 2.0, -1.0)?
    } else {
        v[0]
    };
    let r = chebyshev(cx, kind, x, v[1])?;
    Ok(vec![Some(cx.b.convert(r, elem))])
}

pub fn register(r: &mut Registry) {
    for (names, kind, shifted) in [
        (
            scalar_overloads!("special_chebyshev_polynomial_t"),
            Kind::T,
            false,
        ),
        (
            scalar_overloads!("special_chebyshev_polynomial_u"),
            Kind::U,
            false,
        ),
        (
            scalar_overloads!("special_chebyshev_polynomial_v"),
            Kind::V,
            false,
        ),
        (
            scalar_overloads!("special_chebyshev_polynomial_w"),
            Kind::W,
            false,
        ),
        (
            scalar_overloads!("special_shifted_chebyshev_polynomial_t"),
            Kind::T,
            true,
        ),
        (
            scalar_overloads!("special_shifted_chebyshev_polynomial_u"),
            Kind::U,
            true,
        ),
        (
            scalar_overloads!("special_shifted_chebyshev_polynomial_v"),
            Kind::V,
            true,
        ),
        (
            scalar_overloads!("special_shifted_chebyshev_polynomial_w"),
            Kind::W,
            true,
        ),
    ] {
        r.add(&names, move |cx, n| lower(cx, n, kind, shifted));
    }
}
