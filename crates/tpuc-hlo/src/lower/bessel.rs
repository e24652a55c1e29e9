//! Bessel functions as torch.special defines them: J0, J1, Y0, Y1, the modified I0, I1, K0, K1
//! (and their exponentially scaled forms), the spherical j0 and the Airy function Ai. Each is
//! computed in float64 and rounded once, from power series where they keep float64's digits,
//! asymptotic expansions for large arguments, and for K the trapezoidal rule on its integral
//! representation, which converges exponentially there; torch's rules at 0 and for negative
//! arguments are applied last, and at infinity each function's limit (eager gives NaN for J, Y
//! and Ai there).

use std::f64::consts::{FRAC_2_PI, PI};

use super::prelude::*;
use super::special::in_double;

/// Terms of the power series: more than the switches below need (at |x| = 30, I's switch, the
/// 60th term is below 1e-30 of the largest).
const SERIES_TERMS: u32 = 60;

/// Where J and Y switch from their power series to Hankel's expansion, measured against exact
/// values: the series cancel more digits the larger |x| is, the expansion's smallest term
/// shrinks like e^-2|x|; at 12 both stay within 2e-12 of the exact value.
const OSCILLATING_SWITCH: f64 = 12.0;

/// Where I switches from its power series to its asymptotic expansion: both reach float64's
/// precision there (the series in 50 terms, the expansion in 15).
const GROWING_SWITCH: f64 = 30.0;

/// Where K switches from its power series (which cancels more the larger x is) to the
/// trapezoidal rule.
const DECAYING_SWITCH: f64 = 2.0;

/// Euler's constant.
const EULER_GAMMA: f64 = 0.577_215_664_901_532_9;

/// The power series of the order-`order` (0 or 1) Bessel function of the first kind, J when
/// `alternating`, I otherwise: sum_k (+-1)^k (x/2)^(2k+order) / (k! (k+order)!). With
/// `with_digamma`, also the same sum with each term weighted by psi(k+1) + psi(k+1+order),
/// the series the second kinds (Y, K) are built from.
fn first_kind_series(
    cx: &mut Ctx,
    x: Value,
    order: u32,
    alternating: bool,
    with_digamma: bool,
) -> OpResult<(Value, Option<Value>)> {
    let half = cx.scaled(x, 0.5)?;
    let q = cx.b.binary(BinaryOp::Mul, half, half)?;
    let q = if alternating {
        cx.b.unary(UnaryOp::Neg, q)?
    } else {
        q
    };
    let mut term = if order == 0 {
        cx.full_like(x, 1.0, None)
    } else {
        half
    };
    let mut sum = term;
    // psi(k+1) = H_k - gamma with H_k the k-th harmonic number.
    let digamma_weight = |k: u32| -> f64 {
        let harmonic = |m: u32| (1..=m).map(|j| 1.0 / f64::from(j)).sum::<f64>();
        harmonic(k) + harmonic(k + order) - 2.0 * EULER_GAMMA
    };
    let mut weighted = if with_digamma {
        Some(cx.scaled(term, digamma_weight(0))?)
    } else {
        None
    };
    for k in 1..SERIES_TERMS {
        let t = cx.b.binary(BinaryOp::Mul, term, q)?;
        term = cx.scaled(t, 1.0 / f64::from(k * (k + order)))?;
        sum = cx.b.binary(BinaryOp::Add, sum, term)?;
        if let Some(w) = weighted {
            let t = cx.scaled(term, digamma_weight(k))?;
            weighted = Some(cx.b.binary(BinaryOp::Add, w, t)?);
        }
    }
    Ok((sum, weighted))
}

/// The even and odd parts P and Q of an asymptotic expansion sum_k (-1)^(k/2) c_k z^k over
/// k < `terms` (P holds c_0 = 1), c_k = c_(k-1) ratio(k): an oscillating function's amplitude
/// terms, P multiplying one phase and Q the other.
fn oscillating_expansion(
    cx: &mut Ctx,
    z: Value,
    terms: u32,
    ratio: impl Fn(u32) -> f64,
) -> OpResult<(Value, Value)> {
    let one = cx.full_like(z, 1.0, None);
    let (mut p, mut q) = (one, None::<Value>);
    let (mut coefficient, mut power) = (1.0, one);
    for k in 1..terms {
        coefficient *= ratio(k);
        power = cx.b.binary(BinaryOp::Mul, power, z)?;
        let sign = if (k / 2) % 2 == 0 { 1.0 } else { -1.0 };
        let t = cx.scaled(power, sign * coefficient)?;
        if k % 2 == 0 {
            p = cx.b.binary(BinaryOp::Add, p, t)?;
        } else {
            q = Some(match q {
                Some(q) => cx.b.binary(BinaryOp::Add, q, t)?,
                None => t,
            });
        }
    }
    Ok((p, q.expect("two terms or more")))
}

/// Hankel's expansion of J_order(x) (or Y_order(x) when `second_kind`) for large x > 0:
/// sqrt(2 / (pi x)) (P cos chi - Q sin chi) (Y: P sin chi + Q cos chi), chi = x - (2 order + 1)
/// pi / 4, with P and Q the even and odd terms of sum_k (-1)^(k/2) a_k / (8x)^k,
/// a_k = prod_{j<=k} (4 order^2 - (2j-1)^2) / j.
fn hankel(cx: &mut Ctx, x: Value, order: u32, second_kind: bool) -> OpResult<Value> {
    let one = cx.full_like(x, 1.0, None);
    let eight_x = cx.scaled(x, 8.0)?;
    let inverse = cx.b.binary(BinaryOp::Div, one, eight_x)?;
    let mu = 4.0 * f64::from(order * order);
    let (p, q) = oscillating_expansion(cx, inverse, 30, |k| {
        let odd = f64::from(2 * k - 1);
        (mu - odd * odd) / f64::from(k)
    })?;
    let shift = cx.full_like(x, f64::from(2 * order + 1) * PI / 4.0, None);
    let chi = cx.b.binary(BinaryOp::Sub, x, shift)?;
    let (cos, sin) = (
        cx.b.unary(UnaryOp::Cos, chi)?,
        cx.b.unary(UnaryOp::Sin, chi)?,
    );
    let combined = if second_kind {
        let a = cx.b.binary(BinaryOp::Mul, p, sin)?;
        let b = cx.b.binary(BinaryOp::Mul, q, cos)?;
        cx.b.binary(BinaryOp::Add, a, b)?
    } else {
        let a = cx.b.binary(BinaryOp::Mul, p, cos)?;
        let b = cx.b.binary(BinaryOp::Mul, q, sin)?;
        cx.b.binary(BinaryOp::Sub, a, b)?
    };
    let amplitude = cx.scaled(inverse, 16.0 / PI)?;
    let amplitude = cx.b.unary(UnaryOp::Sqrt, amplitude)?;
    Ok(cx.b.binary(BinaryOp::Mul, amplitude, combined)?)
}

/// J_order(x): even (order 0) or odd (order 1) in x, 0 at infinity.
fn bessel_j(cx: &mut Ctx, x: Value, order: u32) -> OpResult<Value> {
    let a = cx.b.unary(UnaryOp::Abs, x)?;
    let (series, _) = first_kind_series(cx, a, order, true, false)?;
    let far = hankel(cx, a, order, false)?;
    let is_far = cx.compared(a, CompareDir::Ge, OSCILLATING_SWITCH)?;
    let v = cx.b.select(is_far, far, series)?;
    let infinite = cx.compared(a, CompareDir::Eq, f64::INFINITY)?;
    let v = cx.value_where(infinite, 0.0, v)?;
    if order == 1 {
        let sign = cx.b.unary(UnaryOp::Sign, x)?;
        return Ok(cx.b.binary(BinaryOp::Mul, v, sign)?);
    }
    Ok(v)
}

/// Y_order(x) = (2/pi) ln(x/2) J_order(x) - D / pi (- 2 / (pi x) for order 1), D the
/// digamma-weighted series; -inf at 0, NaN below, 0 at infinity.
fn bessel_y(cx: &mut Ctx, x: Value, order: u32) -> OpResult<Value> {
    let (j, d) = first_kind_series(cx, x, order, true, true)?;
    let d = d.expect("asked for the weighted series");
    let half = cx.scaled(x, 0.5)?;
    let log = cx.b.unary(UnaryOp::Log, half)?;
    let t = cx.b.binary(BinaryOp::Mul, log, j)?;
    let t = cx.scaled(t, FRAC_2_PI)?;
    let d = cx.scaled(d, 1.0 / PI)?;
    let mut series = cx.b.binary(BinaryOp::Sub, t, d)?;
    if order == 1 {
        let two_over_pi = cx.full_like(x, FRAC_2_PI, None);
        let pole = cx.b.binary(BinaryOp::Div, two_over_pi, x)?;
        series = cx.b.binary(BinaryOp::Sub, series, pole)?;
    }
    let far = hankel(cx, x, order, true)?;
    let is_far = cx.compared(x, CompareDir::Ge, OSCILLATING_SWITCH)?;
    let v = cx.b.select(is_far, far, series)?;
    second_kind_edges(cx, x, v, f64::NEG_INFINITY, 0.0)
}

/// torch's values for a function of the second kind: `at_zero` at 0, NaN for negative x,
/// `at_infinity` at infinity.
fn second_kind_edges(
    cx: &mut Ctx,
    x: Value,
    v: Value,
    at_zero: f64,
    at_infinity: f64,
) -> OpResult<Value> {
    let zero = cx.compared(x, CompareDir::Eq, 0.0)?;
    let v = cx.value_where(zero, at_zero, v)?;
    let negative = cx.compared(x, CompareDir::Lt, 0.0)?;
    let v = cx.value_where(negative, f64::NAN, v)?;
    let infinite = cx.compared(x, CompareDir::Eq, f64::INFINITY)?;
    cx.value_where(infinite, at_infinity, v)
}

/// I_order(x) (order 0 or 1), times exp(-|x|) when `scaled`: the power series up to the
/// switch, then exp(|x|) / sqrt(2 pi |x|) sum_k (-1)^k a_k / |x|^k with
/// a_k = prod_j (4 order^2 - (2j-1)^2) / (8 j).
fn bessel_i(cx: &mut Ctx, x: Value, order: u32, scaled: bool) -> OpResult<Value> {
    let a = cx.b.unary(UnaryOp::Abs, x)?;
    let (mut series, _) = first_kind_series(cx, a, order, false, false)?;
    if scaled {
        let minus = cx.b.unary(UnaryOp::Neg, a)?;
        let decay = cx.b.unary(UnaryOp::Exp, minus)?;
        series = cx.b.binary(BinaryOp::Mul, series, decay)?;
    }
    let one = cx.full_like(a, 1.0, None);
    let inverse = cx.b.binary(BinaryOp::Div, one, a)?;
    let mut coefficient = 1.0;
    let mut power = one;
    let mut sum = one;
    let mu = 4.0 * f64::from(order * order);
    for j in 1..15u32 {
        let odd = f64::from(2 * j - 1);
        coefficient *= -(mu - odd * odd) / (8.0 * f64::from(j));
        power = cx.b.binary(BinaryOp::Mul, power, inverse)?;
        let t = cx.scaled(power, coefficient)?;
        sum = cx.b.binary(BinaryOp::Add, sum, t)?;
    }
    // exp(|x|) / sqrt(2 pi |x|), as one exponential so that it overflows no sooner than I does.
    let two_pi_a = cx.scaled(a, 2.0 * PI)?;
    let log_root = cx.b.unary(UnaryOp::Log, two_pi_a)?;
    let log_root = cx.scaled(log_root, -0.5)?;
    let exponent = if scaled {
        log_root
    } else {
        cx.b.binary(BinaryOp::Add, a, log_root)?
    };
    let factor = cx.b.unary(UnaryOp::Exp, exponent)?;
    let asymptotic = cx.b.binary(BinaryOp::Mul, factor, sum)?;
    let far = cx.compared(a, CompareDir::Gt, GROWING_SWITCH)?;
    let value = cx.b.select(far, asymptotic, series)?;
    if order == 1 {
        // I1 is odd.
        let sign = cx.b.unary(UnaryOp::Sign, x)?;
        return Ok(cx.b.binary(BinaryOp::Mul, value, sign)?);
    }
    Ok(value)
}

/// Points of the trapezoidal rule for K, past t = 0.
const TRAPEZOID_POINTS: u32 = 32;

/// K_order(x) = int_0^inf exp(-x cosh t) cosh(order t) dt (times exp(x) when `scaled`) by the
/// trapezoidal rule, for x above the switch: the integrand is analytic and decays doubly
/// exponentially, so the error falls like exp(-pi^2 / h) while the step h stays below the
/// integrand's width (~1/sqrt(x)); h = min(1/4, 1/(2 sqrt x)) over 32 steps reaches past
/// where it falls below e^-40 of its peak.
fn k_integral(cx: &mut Ctx, x: Value, order: f64, scaled: bool) -> OpResult<Value> {
    let root = cx.b.unary(UnaryOp::Rsqrt, x)?;
    let narrow = cx.scaled(root, 0.5)?;
    let widest = cx.full_like(x, 0.25, None);
    let step = cx.b.binary(BinaryOp::Min, narrow, widest)?;
    let minus_x = cx.b.unary(UnaryOp::Neg, x)?;
    let one = cx.full_like(x, 1.0, None);
    let mut sum = None::<Value>;
    for j in 0..=TRAPEZOID_POINTS {
        let t = cx.scaled(step, f64::from(j))?;
        let cosh = cx.b.unary(UnaryOp::Cosh, t)?;
        let cosh = if scaled {
            cx.b.binary(BinaryOp::Sub, cosh, one)?
        } else {
            cosh
        };
        let exponent = cx.b.binary(BinaryOp::Mul, minus_x, cosh)?;
        let mut f = cx.b.unary(UnaryOp::Exp, exponent)?;
        if order != 0.0 {
            let nt = cx.scaled(t, order)?;
            let weight = cx.b.unary(UnaryOp::Cosh, nt)?;
            f = cx.b.binary(BinaryOp::Mul, f, weight)?;
        }
        if j == 0 {
            f = cx.scaled(f, 0.5)?;
        }
        sum = Some(match sum {
            Some(s) => cx.b.binary(BinaryOp::Add, s, f)?,
            None => f,
        });
    }
    let sum = sum.expect("the rule has points");
    Ok(cx.b.binary(BinaryOp::Mul, step, sum)?)
}

/// K_order(x) (order 0 or 1), times exp(x) when `scaled`: below the switch
/// K0 = -ln(x/2) I0 + D/2 and K1 = 1/x + ln(x/2) I1 - D/2 (D the digamma-weighted series),
/// above it the integral; inf at 0, NaN below, 0 at infinity.
fn bessel_k(cx: &mut Ctx, x: Value, order: u32, scaled: bool) -> OpResult<Value> {
    let (i, d) = first_kind_series(cx, x, order, false, true)?;
    let d = d.expect("asked for the weighted series");
    let half = cx.scaled(x, 0.5)?;
    let log = cx.b.unary(UnaryOp::Log, half)?;
    let li = cx.b.binary(BinaryOp::Mul, log, i)?;
    let half_d = cx.scaled(d, 0.5)?;
    let mut series = if order == 0 {
        cx.b.binary(BinaryOp::Sub, half_d, li)?
    } else {
        let one = cx.full_like(x, 1.0, None);
        let pole = cx.b.binary(BinaryOp::Div, one, x)?;
        let s = cx.b.binary(BinaryOp::Add, pole, li)?;
        cx.b.binary(BinaryOp::Sub, s, half_d)?
    };
    if scaled {
        let growth = cx.b.unary(UnaryOp::Exp, x)?;
        series = cx.b.binary(BinaryOp::Mul, series, growth)?;
    }
    let integral = k_integral(cx, x, f64::from(order), scaled)?;
    let is_far = cx.compared(x, CompareDir::Gt, DECAYING_SWITCH)?;
    let v = cx.b.select(is_far, integral, series)?;
    second_kind_edges(cx, x, v, f64::INFINITY, 0.0)
}

/// The spherical Bessel function j0(x) = sin(x) / x: its Taylor series below 1/2 (where the
/// quotient would lose digits), 0 at infinity, as torch computes it.
fn spherical_bessel_j0(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let x2 = cx.b.binary(BinaryOp::Mul, x, x)?;
    // 1 - x^2/3! + x^4/5! - ...: the coefficients (-1)^k / (2k+1)! for k = 6 down to 0.
    let mut series = cx.full_like(x, 1.0 / 6_227_020_800.0, None);
    let mut factorial = 6_227_020_800.0_f64;
    for k in (0..6).rev() {
        factorial /= f64::from((2 * k + 2) * (2 * k + 3));
        let sign = if k % 2 == 0 { 1.0 } else { -1.0 };
        let c = cx.full_like(x, sign / factorial, None);
        let t = cx.b.binary(BinaryOp::Mul, series, x2)?;
        series = cx.b.binary(BinaryOp::Add, c, t)?;
    }
    let s = cx.b.unary(UnaryOp::Sin, x)?;
    let quotient = cx.b.binary(BinaryOp::Div, s, x)?;
    let a = cx.b.unary(UnaryOp::Abs, x)?;
    let small = cx.compared(a, CompareDir::Lt, 0.5)?;
    let v = cx.b.select(small, series, quotient)?;
    let infinite = cx.compared(a, CompareDir::Eq, f64::INFINITY)?;
    cx.value_where(infinite, 0.0, v)
}

/// Ai(0) and -Ai'(0).
const AIRY_AT_ZERO: [f64; 2] = [0.355_028_053_887_817_2, 0.258_819_403_792_806_8];

/// Below this Ai takes its asymptotic expansion, above it its Maclaurin series (50 terms), which
/// cancels more digits the more negative x is: at -7 both stay within 1e-12 of the exact value
/// (measured).
const AIRY_OSCILLATING_SWITCH: f64 = -7.0;

/// Above this zeta = 2/3 x^(3/2) passes K's switch: Ai(x) = sqrt(x/3) K_{1/3}(zeta) / pi.
const AIRY_DECAYING_SWITCH: f64 = 2.080_083_823;

/// The Airy function Ai(x): its Maclaurin series Ai(0) f(x) + Ai'(0) g(x) with
/// f = sum_k 3^k (1/3)_k x^(3k) / (3k)!, g = sum_k 3^k (2/3)_k x^(3k+1) / (3k+1)! in the
/// middle; for large positive x sqrt(x/3) K_{1/3}(zeta) / pi; for large negative x
/// pi^(-1/2) |x|^(-1/4) (sin(zeta + pi/4) P - cos(zeta + pi/4) Q), P and Q the even and odd
/// terms of sum_k (-1)^(k/2) u_k zeta^-k, u_k = u_(k-1) (6k-5)(6k-3)(6k-1) / (216 k (2k-1));
/// 0 at both infinities.
fn airy_ai(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let x2 = cx.b.binary(BinaryOp::Mul, x, x)?;
    let cube = cx.b.binary(BinaryOp::Mul, x2, x)?;
    let (mut f_term, mut g_term) = (cx.full_like(x, 1.0, None), x);
    let (mut f, mut g) = (f_term, g_term);
    for k in 1..50u32 {
        let t = cx.b.binary(BinaryOp::Mul, f_term, cube)?;
        f_term = cx.scaled(t, 1.0 / f64::from((3 * k - 1) * 3 * k))?;
        f = cx.b.binary(BinaryOp::Add, f, f_term)?;
        let t = cx.b.binary(BinaryOp::Mul, g_term, cube)?;
        g_term = cx.scaled(t, 1.0 / f64::from(3 * k * (3 * k + 1)))?;
        g = cx.b.binary(BinaryOp::Add, g, g_term)?;
    }
    let f = cx.scaled(f, AIRY_AT_ZERO[0])?;
    let g = cx.scaled(g, AIRY_AT_ZERO[1])?;
    let series = cx.b.binary(BinaryOp::Sub, f, g)?;
    // zeta = 2/3 |x|^(3/2).
    let a = cx.b.unary(UnaryOp::Abs, x)?;
    let root = cx.b.unary(UnaryOp::Sqrt, a)?;
    let zeta = cx.b.binary(BinaryOp::Mul, a, root)?;
    let zeta = cx.scaled(zeta, 2.0 / 3.0)?;
    // Large positive x.
    let k = k_integral(cx, zeta, 1.0 / 3.0, false)?;
    let third = cx.scaled(a, 1.0 / 3.0)?;
    let factor = cx.b.unary(UnaryOp::Sqrt, third)?;
    let decaying = cx.b.binary(BinaryOp::Mul, factor, k)?;
    let decaying = cx.scaled(decaying, 1.0 / PI)?;
    // Large negative x.
    let one = cx.full_like(x, 1.0, None);
    let inverse = cx.b.binary(BinaryOp::Div, one, zeta)?;
    let (p, q) = oscillating_expansion(cx, inverse, 24, |k| {
        let k = f64::from(k);
        (6.0 * k - 5.0) * (6.0 * k - 3.0) * (6.0 * k - 1.0) / (216.0 * k * (2.0 * k - 1.0))
    })?;
    let quarter = cx.full_like(x, PI / 4.0, None);
    let phase = cx.b.binary(BinaryOp::Add, zeta, quarter)?;
    let (sin, cos) = (
        cx.b.unary(UnaryOp::Sin, phase)?,
        cx.b.unary(UnaryOp::Cos, phase)?,
    );
    let sp = cx.b.binary(BinaryOp::Mul, sin, p)?;
    let cq = cx.b.binary(BinaryOp::Mul, cos, q)?;
    let oscillation = cx.b.binary(BinaryOp::Sub, sp, cq)?;
    let amplitude = cx.b.unary(UnaryOp::Rsqrt, root)?;
    let amplitude = cx.scaled(amplitude, 1.0 / PI.sqrt())?;
    let oscillating = cx.b.binary(BinaryOp::Mul, amplitude, oscillation)?;
    let is_decaying = cx.compared(x, CompareDir::Gt, AIRY_DECAYING_SWITCH)?;
    let v = cx.b.select(is_decaying, decaying, series)?;
    let is_oscillating = cx.compared(x, CompareDir::Lt, AIRY_OSCILLATING_SWITCH)?;
    let v = cx.b.select(is_oscillating, oscillating, v)?;
    let infinite = cx.compared(a, CompareDir::Eq, f64::INFINITY)?;
    cx.value_where(infinite, 0.0, v)
}

pub fn register(r: &mut Registry) {
    for (name, order) in [
        ("aten.special_bessel_j0.default", 0),
        ("aten.special_bessel_j1.default", 1),
    ] {
        r.add(&[name], move |cx, n| {
            in_double(cx, n, |cx, x| bessel_j(cx, x, order))
        });
    }
    for (name, order) in [
        ("aten.special_bessel_y0.default", 0),
        ("aten.special_bessel_y1.default", 1),
    ] {
        r.add(&[name], move |cx, n| {
            in_double(cx, n, |cx, x| bessel_y(cx, x, order))
        });
    }
    for (names, order, scaled) in [
        (
            &["aten.i0.default", "aten.special_modified_bessel_i0.default"][..],
            0,
            false,
        ),
        (&["aten.special_i0e.default"][..], 0, true),
        (
            &[
                "aten.special_i1.default",
                "aten.special_modified_bessel_i1.default",
            ][..],
            1,
            false,
        ),
    ] {
        r.add(names, move |cx, n| {
            in_double(cx, n, |cx, x| bessel_i(cx, x, order, scaled))
        });
    }
    for (name, order, scaled) in [
        ("aten.special_modified_bessel_k0.default", 0, false),
        ("aten.special_modified_bessel_k1.default", 1, false),
        ("aten.special_scaled_modified_bessel_k0.default", 0, true),
        ("aten.special_scaled_modified_bessel_k1.default", 1, true),
    ] {
        r.add(&[name], move |cx, n| {
            in_double(cx, n, |cx, x| bessel_k(cx, x, order, scaled))
        });
    }
    r.add(&["aten.special_spherical_bessel_j0.default"], |cx, n| {
        in_double(cx, n, spherical_bessel_j0)
    });
    r.add(&["aten.special_airy_ai.default"], |cx, n| {
        in_double(cx, n, airy_ai)
    });
}
