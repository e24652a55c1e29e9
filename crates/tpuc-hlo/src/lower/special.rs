//! Special functions and the integer and float edge ops: polygamma, the Hurwitz zeta function,
//! the scaled Bessel function I1e (the other Bessel functions are in `bessel`), erfcx, ndtri,
//! the regularized incomplete gamma functions, nextafter, hypot, frexp, bit shifts by tensors,
//! gcd and lcm.
//! Where CHLO has the function as torch defines it (the plugin expands it), tpuc emits that;
//! the rest are written out here with torch's algorithms and its rules at the edges.

use tpuc_fx::Node;

use super::elementwise::{computed_wide, digamma_of};
use super::prelude::*;

/// Two operands promoted to the output's type and broadcast, then widened to its accumulation
/// type (float32 for 16-bit floats) for `f`, and the result rounded once.
fn binary_wide(
    cx: &mut Ctx,
    n: &Node,
    names: [&str; 2],
    f: impl FnOnce(&mut Ctx, Value, Value) -> OpResult<Value>,
) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = (cx.operand(n, names[0])?, cx.operand(n, names[1])?);
    let elem = cx.out_type(n, 0)?.elem;
    let v = prepare(cx, &[a, b], elem)?;
    let wide = elem.accumulation();
    let (x, y) = (cx.b.convert(v[0], wide), cx.b.convert(v[1], wide));
    let r = f(cx, x, y)?;
    Ok(vec![Some(cx.b.convert(r, elem))])
}

/// polygamma(n, x): the n-th derivative of digamma, as torch computes it: n = 0 is digamma
/// (with torch's -inf at 0), n = 1 trigamma, and higher orders (-1)^(n+1) n! zeta(n+1, x).
fn polygamma(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let order = cx.int(n, "n", None)?;
    if order < 0 {
        return err(format!("polygamma needs a non-negative order, got {order}"));
    }
    computed_wide(cx, n, |cx, x| match order {
        0 => digamma_of(cx, x),
        1 => trigamma(cx, x),
        _ => {
            let s = cx.full_like(x, (order + 1) as f64, None);
            let z = zeta(cx, s, x)?;
            let factorial: f64 = (1..=order).map(|k| k as f64).product();
            let sign = if order % 2 == 1 { 1.0 } else { -1.0 };
            Ok(cx.scaled(z, sign * factorial)?)
        }
    })
}

/// trigamma: below 1/2 by reflection (minus pi^2 / sin^2(pi x), then at 1 - x), six steps of
/// the recurrence, then the asymptotic series; the same steps as torch's kernel, so that it
/// agrees at the poles too (huge values where sin(pi x) rounds away from zero).
fn trigamma(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let pi = std::f64::consts::PI;
    let half = cx.full_like(x, 0.5, None);
    let one = cx.full_like(x, 1.0, None);
    let reflect = cx.b.compare(CompareDir::Lt, x, half)?;
    let pix = cx.scaled(x, pi)?;
    let sin = cx.b.unary(UnaryOp::Sin, pix)?;
    let sin2 = cx.b.binary(BinaryOp::Mul, sin, sin)?;
    let pi2 = cx.full_like(x, -pi * pi, None);
    let reflected = cx.b.binary(BinaryOp::Div, pi2, sin2)?;
    let zero = cx.full_like(x, 0.0, None);
    let mut result = cx.b.select(reflect, reflected, zero)?;
    let mirrored = cx.b.binary(BinaryOp::Sub, one, x)?;
    let mut x = cx.b.select(reflect, mirrored, x)?;
    for _ in 0..6 {
        let xx = cx.b.binary(BinaryOp::Mul, x, x)?;
        let inv = cx.b.binary(BinaryOp::Div, one, xx)?;
        result = cx.b.binary(BinaryOp::Add, result, inv)?;
        x = cx.b.binary(BinaryOp::Add, x, one)?;
    }
    let xx = cx.b.binary(BinaryOp::Mul, x, x)?;
    let ixx = cx.b.binary(BinaryOp::Div, one, xx)?;
    // 1 + 1/(2x) + ixx (1/6 - ixx (1/30 - ixx / 42)), over x.
    let mut series = cx.scaled(ixx, 1.0 / 42.0)?;
    let c30 = cx.full_like(x, 1.0 / 30.0, None);
    series = cx.b.binary(BinaryOp::Sub, c30, series)?;
    series = cx.b.binary(BinaryOp::Mul, ixx, series)?;
    let c6 = cx.full_like(x, 1.0 / 6.0, None);
    series = cx.b.binary(BinaryOp::Sub, c6, series)?;
    series = cx.b.binary(BinaryOp::Mul, ixx, series)?;
    let two_x = cx.scaled(x, 2.0)?;
    let inv_2x = cx.b.binary(BinaryOp::Div, one, two_x)?;
    series = cx.b.binary(BinaryOp::Add, series, inv_2x)?;
    series = cx.b.binary(BinaryOp::Add, series, one)?;
    series = cx.b.binary(BinaryOp::Div, series, x)?;
    result = cx.b.binary(BinaryOp::Add, result, series)?;
    let negated = cx.b.unary(UnaryOp::Neg, result)?;
    Ok(cx.b.select(reflect, negated, result)?)
}

/// How far the direct sum of the Hurwitz zeta function goes: torch's (Cephes') algorithm sums
/// terms until q + k passes 9, so a q below 9 - this is beyond it (NaN then).
const ZETA_TERMS: usize = 128;

/// The Euler-Maclaurin coefficients of the zeta tail: (2j)! / B_2j for j = 1..=12, from the
/// Bernoulli numbers.
fn zeta_tail_coefficients() -> [f64; 12] {
    const BERNOULLI: [(f64, f64); 12] = [
        (1.0, 6.0),
        (-1.0, 30.0),
        (1.0, 42.0),
        (-1.0, 30.0),
        (5.0, 66.0),
        (-691.0, 2730.0),
        (7.0, 6.0),
        (-3617.0, 510.0),
        (43867.0, 798.0),
        (-174611.0, 330.0),
        (854513.0, 138.0),
        (-236364091.0, 2730.0),
    ];
    let mut out = [0.0; 12];
    let mut factorial = 1.0;
    for (j, (num, den)) in BERNOULLI.into_iter().enumerate() {
        let m = 2 * (j + 1);
        factorial *= ((m - 1) * m) as f64;
        out[j] = factorial * den / num;
    }
    out
}

/// The Hurwitz zeta function zeta(s, q) as torch computes it (Cephes' algorithm): the direct
/// sum of (q + k)^-s until q + k > 9 (at least nine terms), then the Euler-Maclaurin tail;
/// infinite at s = 1 and at q a non-positive integer, NaN for s < 1 and for a negative q with
/// a fractional s.
fn zeta(cx: &mut Ctx, s: Value, q: Value) -> OpResult<Value> {
    let one = cx.full_like(s, 1.0, None);
    let nine = cx.full_like(s, 9.0, None);
    let minus_s = cx.b.unary(UnaryOp::Neg, s)?;
    let mut sum = cx.b.binary(BinaryOp::Pow, q, minus_s)?;
    let mut a = q;
    let mut b = cx.full_like(s, 0.0, None);
    for i in 0..ZETA_TERMS {
        let next_a = cx.b.binary(BinaryOp::Add, a, one)?;
        let next_b = cx.b.binary(BinaryOp::Pow, next_a, minus_s)?;
        let next_sum = cx.b.binary(BinaryOp::Add, sum, next_b)?;
        if i < 9 {
            (a, b, sum) = (next_a, next_b, next_sum);
        } else {
            let active = cx.b.compare(CompareDir::Le, a, nine)?;
            a = cx.b.select(active, next_a, a)?;
            b = cx.b.select(active, next_b, b)?;
            sum = cx.b.select(active, next_sum, sum)?;
        }
    }
    let summed_far_enough = cx.b.compare(CompareDir::Gt, a, nine)?;
    // The tail: b w / (s - 1) - b / 2 + sum_j (s)_(2j-1) b / w^(2j-1) / A_j.
    let w = a;
    let s_minus_1 = cx.b.binary(BinaryOp::Sub, s, one)?;
    let bw = cx.b.binary(BinaryOp::Mul, b, w)?;
    let t = cx.b.binary(BinaryOp::Div, bw, s_minus_1)?;
    sum = cx.b.binary(BinaryOp::Add, sum, t)?;
    let half_b = cx.scaled(b, 0.5)?;
    sum = cx.b.binary(BinaryOp::Sub, sum, half_b)?;
    let mut rising = one;
    let mut k = 0.0;
    for coefficient in zeta_tail_coefficients() {
        let sk = cx.full_like(s, k, None);
        let factor = cx.b.binary(BinaryOp::Add, s, sk)?;
        rising = cx.b.binary(BinaryOp::Mul, rising, factor)?;
        b = cx.b.binary(BinaryOp::Div, b, w)?;
        let ab = cx.b.binary(BinaryOp::Mul, rising, b)?;
        let term = cx.scaled(ab, 1.0 / coefficient)?;
        sum = cx.b.binary(BinaryOp::Add, sum, term)?;
        let sk = cx.full_like(s, k + 1.0, None);
        let factor = cx.b.binary(BinaryOp::Add, s, sk)?;
        rising = cx.b.binary(BinaryOp::Mul, rising, factor)?;
        b = cx.b.binary(BinaryOp::Div, b, w)?;
        k += 2.0;
    }
    let zero = cx.full_like(s, 0.0, None);
    let inf = cx.full_like(s, f64::INFINITY, None);
    let nan = cx.full_like(s, f64::NAN, None);
    let z = cx.b.select(summed_far_enough, sum, nan)?;
    let floor_q = cx.b.unary(UnaryOp::Floor, q)?;
    let floor_s = cx.b.unary(UnaryOp::Floor, s)?;
    let q_whole = cx.b.compare(CompareDir::Eq, q, floor_q)?;
    let s_fractional = cx.b.compare(CompareDir::Ne, s, floor_s)?;
    let q_non_positive = cx.b.compare(CompareDir::Le, q, zero)?;
    let domain = cx.b.binary(BinaryOp::And, q_non_positive, s_fractional)?;
    let z = cx.b.select(domain, nan, z)?;
    let q_pole = cx.b.binary(BinaryOp::And, q_whole, q_non_positive)?;
    let z = cx.b.select(q_pole, inf, z)?;
    let below_one = cx.b.compare(CompareDir::Lt, s, one)?;
    let z = cx.b.select(below_one, nan, z)?;
    let at_one = cx.b.compare(CompareDir::Eq, s, one)?;
    Ok(cx.b.select(at_one, inf, z)?)
}

/// The element type of `n`'s result, which must be a float (torch promotes integers to one).
pub(super) fn float_result(cx: &Ctx, n: &Node) -> OpResult<DType> {
    let elem = cx.out_type(n, 0)?.elem;
    if !elem.is_float() {
        return err(format!(
            "{} needs a float result, torch recorded {elem}",
            n.target
        ));
    }
    Ok(elem)
}

/// `f` of `self` computed in float64 (the functions below lose digits in float32 on the way),
/// rounded once to the output's type.
pub(super) fn in_double(
    cx: &mut Ctx,
    n: &Node,
    f: impl FnOnce(&mut Ctx, Value) -> OpResult<Value>,
) -> OpResult<Vec<Option<Value>>> {
    // torch.special's newer functions name their argument `x`.
    let x = cx.tensor(n, if n.arg("x").is_some() { "x" } else { "self" })?;
    let elem = float_result(cx, n)?;
    let wide = cx.b.convert(x, DType::F64);
    let r = f(cx, wide)?;
    Ok(vec![Some(cx.b.convert(r, elem))])
}

/// erfcx(x) = exp(x^2) erfc(x): directly below 10 (in float64 neither factor overflows or
/// underflows there), then the asymptotic 1/(x sqrt(pi)) sum_k (-1)^k (2k-1)!! / (2x^2)^k.
fn erfcx(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let x2 = cx.b.binary(BinaryOp::Mul, x, x)?;
    let growth = cx.b.unary(UnaryOp::Exp, x2)?;
    let erfc = cx.b.unary(UnaryOp::Erfc, x)?;
    let direct = cx.b.binary(BinaryOp::Mul, growth, erfc)?;
    let one = cx.full_like(x, 1.0, None);
    let two_x2 = cx.scaled(x2, 2.0)?;
    let inverse = cx.b.binary(BinaryOp::Div, one, two_x2)?;
    let mut power = one;
    let mut sum = one;
    let mut coefficient = 1.0;
    for k in 1..13u32 {
        coefficient *= -f64::from(2 * k - 1);
        power = cx.b.binary(BinaryOp::Mul, power, inverse)?;
        let t = cx.scaled(power, coefficient)?;
        sum = cx.b.binary(BinaryOp::Add, sum, t)?;
    }
    let root_pi_x = cx.scaled(x, std::f64::consts::PI.sqrt())?;
    let asymptotic = cx.b.binary(BinaryOp::Div, sum, root_pi_x)?;
    let ten = cx.full_like(x, 10.0, None);
    let far = cx.b.compare(CompareDir::Ge, x, ten)?;
    Ok(cx.b.select(far, asymptotic, direct)?)
}

/// ndtri(p), the standard normal quantile: sqrt(2) erfinv(2p - 1).
fn ndtri(cx: &mut Ctx, p: Value) -> OpResult<Value> {
    let two_p = cx.scaled(p, 2.0)?;
    let one = cx.full_like(p, 1.0, None);
    let y = cx.b.binary(BinaryOp::Sub, two_p, one)?;
    let e = cx.b.unary(UnaryOp::ErfInv, y)?;
    cx.scaled(e, std::f64::consts::SQRT_2)
}

/// nextafter in the operands' own type: widening first would step by the wrong amount.
fn nextafter(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = cx.out_type(n, 0)?.elem;
    let v = prepare(cx, &[a, b], elem)?;
    Ok(vec![Some(cx.b.binary(BinaryOp::NextAfter, v[0], v[1])?)])
}

/// hypot as C's: without overflow or underflow on the way (the larger magnitude times
/// sqrt(1 + r^2)), infinite when either operand is, even with a NaN beside it.
fn hypot(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    binary_wide(cx, n, ["self", "other"], |cx, x, y| {
        let ax = cx.b.unary(UnaryOp::Abs, x)?;
        let ay = cx.b.unary(UnaryOp::Abs, y)?;
        let big = cx.b.binary(BinaryOp::Max, ax, ay)?;
        let small = cx.b.binary(BinaryOp::Min, ax, ay)?;
        let zero = cx.full_like(x, 0.0, None);
        let one = cx.full_like(x, 1.0, None);
        let inf = cx.full_like(x, f64::INFINITY, None);
        let big_is_zero = cx.b.compare(CompareDir::Eq, big, zero)?;
        let divisor = cx.b.select(big_is_zero, one, big)?;
        let r = cx.b.binary(BinaryOp::Div, small, divisor)?;
        let r2 = cx.b.binary(BinaryOp::Mul, r, r)?;
        let s = cx.b.binary(BinaryOp::Add, one, r2)?;
        let s = cx.b.unary(UnaryOp::Sqrt, s)?;
        let h = cx.b.binary(BinaryOp::Mul, big, s)?;
        let h = cx.b.select(big_is_zero, zero, h)?;
        let x_inf = cx.b.compare(CompareDir::Eq, ax, inf)?;
        let y_inf = cx.b.compare(CompareDir::Eq, ay, inf)?;
        let any_inf = cx.b.binary(BinaryOp::Or, x_inf, y_inf)?;
        Ok(cx.b.select(any_inf, inf, h)?)
    })
}

/// frexp: mantissa in [0.5, 1) with the sign of x and exponent with x = mantissa * 2^exponent;
/// (x, 0) for zeros, infinities and NaN. The exponent comes from log2 and is corrected by one
/// where rounding put the mantissa outside its range.
fn frexp(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let elem = cx.b.elem(x);
    if !elem.is_float() {
        return err(format!("frexp needs a float tensor, got {elem}"));
    }
    let exponent_type = cx.out_type(n, 1)?.elem;
    // float64 holds every float32 and 16-bit float exponent and 2^e exactly, subnormals included.
    let w = cx.b.convert(x, DType::F64);
    let a = cx.b.unary(UnaryOp::Abs, w)?;
    let ln = cx.b.unary(UnaryOp::Log, a)?;
    let log2 = cx.scaled(ln, std::f64::consts::LOG2_E)?;
    let e = cx.b.unary(UnaryOp::Floor, log2)?;
    let one = cx.full_like(w, 1.0, None);
    let mut e = cx.b.binary(BinaryOp::Add, e, one)?;
    let half = cx.full_like(w, 0.5, None);
    for _ in 0..2 {
        let m = times_power_of_two(cx, a, e, -1.0)?;
        let too_big = cx.b.compare(CompareDir::Ge, m, one)?;
        let too_small = cx.b.compare(CompareDir::Lt, m, half)?;
        let up = cx.b.binary(BinaryOp::Add, e, one)?;
        let down = cx.b.binary(BinaryOp::Sub, e, one)?;
        e = cx.b.select(too_big, up, e)?;
        e = cx.b.select(too_small, down, e)?;
    }
    let m = times_power_of_two(cx, w, e, -1.0)?;
    // Zeros, infinities and NaN are their own mantissa, with exponent 0.
    let zero = cx.full_like(w, 0.0, None);
    let finite = cx.b.is_finite(w)?;
    let nonzero = cx.b.compare(CompareDir::Ne, w, zero)?;
    let regular = cx.b.binary(BinaryOp::And, finite, nonzero)?;
    let m = cx.b.select(regular, m, w)?;
    let e = cx.b.select(regular, e, zero)?;
    Ok(vec![
        Some(cx.b.convert(m, elem)),
        Some(cx.b.convert(e, exponent_type)),
    ])
}

/// `x * 2^(sign * e)` for float64 `x` and whole `e` in [-1100, 1100], exactly: in two
/// halves, each power of two made from its exponent bits (a normal float64).
fn times_power_of_two(cx: &mut Ctx, x: Value, e: Value, sign: f64) -> OpResult<Value> {
    let half_e = cx.scaled(e, 0.5)?;
    let first = cx.b.unary(UnaryOp::Floor, half_e)?;
    let second = cx.b.binary(BinaryOp::Sub, e, first)?;
    let mut v = x;
    for part in [first, second] {
        let part = cx.scaled(part, sign)?;
        let biased = cx.b.convert(part, DType::I64);
        let bias = cx.full_like(biased, 1023.0, None);
        let biased = cx.b.binary(BinaryOp::Add, biased, bias)?;
        let shift = cx.full_like(biased, 52.0, None);
        let bits = cx.b.binary(BinaryOp::ShiftLeft, biased, shift)?;
        let p = cx.b.bitcast(bits, DType::F64)?;
        v = cx.b.binary(BinaryOp::Mul, v, p)?;
    }
    Ok(v)
}

/// Shifts as torch's kernels do them; StableHLO's out-of-range rule is the same (an amount
/// outside [0, bits) read as unsigned shifts everything out: 0, or the sign for an arithmetic
/// right shift).
fn shift(cx: &mut Ctx, n: &Node, left: bool) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = cx.out_type(n, 0)?.elem;
    if !elem.is_integer() {
        return err(format!("bit shifts need integer tensors, got {elem}"));
    }
    let v = prepare(cx, &[a, b], elem)?;
    let op = match (left, elem.is_unsigned()) {
        (true, _) => BinaryOp::ShiftLeft,
        (false, true) => BinaryOp::ShiftRightLogical,
        (false, false) => BinaryOp::ShiftRightArithmetic,
    };
    Ok(vec![Some(cx.b.binary(op, v[0], v[1])?)])
}

/// The greatest common divisor of |a| and |b| by Euclid's algorithm, unrolled as far as the
/// type can need: consecutive Fibonacci numbers are the slowest pair, and the largest of them
/// in 64 bits takes 92 steps.
fn gcd_of(cx: &mut Ctx, a: Value, b: Value) -> OpResult<Value> {
    let elem = cx.b.elem(a);
    let steps = match elem.byte_size() {
        1 => 12,
        2 => 23,
        4 => 46,
        _ => 92,
    };
    let mut x = cx.b.unary(UnaryOp::Abs, a)?;
    let mut y = cx.b.unary(UnaryOp::Abs, b)?;
    let zero = cx.full_like(x, 0.0, None);
    let one = cx.full_like(x, 1.0, None);
    for _ in 0..steps {
        let done = cx.b.compare(CompareDir::Eq, y, zero)?;
        let divisor = cx.b.select(done, one, y)?;
        let r = cx.b.binary(BinaryOp::Rem, x, divisor)?;
        let next_x = cx.b.select(done, x, y)?;
        let next_y = cx.b.select(done, zero, r)?;
        x = next_x;
        y = next_y;
    }
    // |minimum integer| wraps to itself: torch returns the absolute value as computed.
    Ok(cx.b.unary(UnaryOp::Abs, x)?)
}

fn integer_pair(cx: &mut Ctx, n: &Node, what: &str) -> OpResult<(Value, Value)> {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = cx.out_type(n, 0)?.elem;
    if !elem.is_integer() {
        return err(format!("{what} needs integer tensors, got {elem}"));
    }
    let v = prepare(cx, &[a, b], elem)?;
    Ok((v[0], v[1]))
}

fn gcd(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = integer_pair(cx, n, "gcd")?;
    Ok(vec![Some(gcd_of(cx, a, b)?)])
}

/// lcm(a, b) = |a / gcd(a, b) * b|, and 0 where the gcd is 0. As in torch's C++, 8- and 16-bit
/// integers are multiplied and made absolute in 32 bits, then wrapped to their type.
fn lcm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = integer_pair(cx, n, "lcm")?;
    let elem = cx.b.elem(a);
    let g = gcd_of(cx, a, b)?;
    let zero = cx.full_like(a, 0.0, None);
    let one = cx.full_like(a, 1.0, None);
    let g_zero = cx.b.compare(CompareDir::Eq, g, zero)?;
    let divisor = cx.b.select(g_zero, one, g)?;
    let q = cx.b.binary(BinaryOp::Div, a, divisor)?;
    let wide = if elem.byte_size() < 4 {
        DType::I32
    } else {
        elem
    };
    let (q, b) = (cx.b.convert(q, wide), cx.b.convert(b, wide));
    let l = cx.b.binary(BinaryOp::Mul, q, b)?;
    let l = cx.b.unary(UnaryOp::Abs, l)?;
    let l = cx.b.convert(l, elem);
    Ok(vec![Some(cx.b.select(g_zero, zero, l)?)])
}

/// Terms of the incomplete gamma function's series and steps of its continued fraction: both
/// converge to float64's precision within them for a up to about 1000; where they have
/// not (larger a near x), the result is NaN rather than a wrong number. Each is a loop (one
/// body compiled, however many the terms).
const INCOMPLETE_GAMMA_TERMS: u32 = 300;

/// `v`, or `tiny` where its magnitude is below it: Lentz's method keeps its terms off zero so.
fn off_zero(cx: &mut Ctx, v: Value) -> OpResult<Value> {
    let tiny = cx.full_like(v, 1e-300, None);
    let magnitude = cx.b.unary(UnaryOp::Abs, v)?;
    let small = cx.b.compare(CompareDir::Lt, magnitude, tiny)?;
    Ok(cx.b.select(small, tiny, v)?)
}

/// The regularized incomplete gamma functions P(a, x) (lower) and Q(a, x) = 1 - P (upper), in
/// float64: P by its series x^a e^-x / Gamma(a+1) sum_n x^n / ((a+1)...(a+n)) for x < a + 1,
/// Q by its continued fraction (Lentz's method) above, the other as 1 minus it; torch's values
/// where a or x is 0, negative or infinite.
fn incomplete_gamma(cx: &mut Ctx, a: Value, x: Value, upper: bool) -> OpResult<Value> {
    let one = cx.full_like(x, 1.0, None);
    let log_x = cx.b.unary(UnaryOp::Log, x)?;
    let a_log_x = cx.b.binary(BinaryOp::Mul, a, log_x)?;
    let power_decay = cx.b.binary(BinaryOp::Sub, a_log_x, x)?;
    // The series: each step adds the next term, x / (a + n) times the one before.
    let series = cx.repeated(INCOMPLETE_GAMMA_TERMS - 1, &[a, one, one, x], |cx, _, v| {
        let (denominator, term, sum, x) = (v[0], v[1], v[2], v[3]);
        let one = cx.full_like(x, 1.0, None);
        let denominator = cx.b.binary(BinaryOp::Add, denominator, one)?;
        let ratio = cx.b.binary(BinaryOp::Div, x, denominator)?;
        let term = cx.b.binary(BinaryOp::Mul, term, ratio)?;
        let sum = cx.b.binary(BinaryOp::Add, sum, term)?;
        Ok(vec![denominator, term, sum, x])
    })?;
    let (term, sum) = (series[1], series[2]);
    let a_plus_one = cx.b.binary(BinaryOp::Add, a, one)?;
    let log_gamma = cx.b.unary(UnaryOp::Lgamma, a_plus_one)?;
    let log_prefactor = cx.b.binary(BinaryOp::Sub, power_decay, log_gamma)?;
    let prefactor = cx.b.unary(UnaryOp::Exp, log_prefactor)?;
    let lower_series = cx.b.binary(BinaryOp::Mul, prefactor, sum)?;
    let series_residual = cx.b.binary(BinaryOp::Div, term, sum)?;
    // The continued fraction for Q: 1 / (x+1-a - 1(1-a) / (x+3-a - 2(2-a) / (x+5-a - ...))).
    let x_minus_a = cx.b.binary(BinaryOp::Sub, x, a)?;
    let b = cx.b.binary(BinaryOp::Add, x_minus_a, one)?;
    let c = cx.full_like(x, 1e300, None);
    let b0 = off_zero(cx, b)?;
    let d = cx.b.binary(BinaryOp::Div, one, b0)?;
    let init = [a, b, c, d, d, one];
    let fraction = cx.repeated(INCOMPLETE_GAMMA_TERMS - 1, &init, |cx, k, v| {
        let (a, b, c, d, fraction) = (v[0], v[1], v[2], v[3], v[4]);
        let shape = cx.b.shape(a).to_vec();
        // a_i = -i (i - a) = i a - i^2, for i = k + 1.
        let one = cx.b.scalar(DType::F64, 1.0);
        let i = cx.b.binary(BinaryOp::Add, k, one)?;
        let square = cx.b.binary(BinaryOp::Mul, i, i)?;
        let square = cx.b.unary(UnaryOp::Neg, square)?;
        let i = cx.b.broadcast_to(i, &shape)?;
        let square = cx.b.broadcast_to(square, &shape)?;
        let ia = cx.b.binary(BinaryOp::Mul, a, i)?;
        let an = cx.b.binary(BinaryOp::Add, ia, square)?;
        let two = cx.full_like(a, 2.0, None);
        let b = cx.b.binary(BinaryOp::Add, b, two)?;
        let ad = cx.b.binary(BinaryOp::Mul, an, d)?;
        let dn = cx.b.binary(BinaryOp::Add, ad, b)?;
        let dn = off_zero(cx, dn)?;
        let ac = cx.b.binary(BinaryOp::Div, an, c)?;
        let cn = cx.b.binary(BinaryOp::Add, b, ac)?;
        let c = off_zero(cx, cn)?;
        let one = cx.full_like(a, 1.0, None);
        let d = cx.b.binary(BinaryOp::Div, one, dn)?;
        let step = cx.b.binary(BinaryOp::Mul, d, c)?;
        let fraction = cx.b.binary(BinaryOp::Mul, fraction, step)?;
        Ok(vec![a, b, c, d, fraction, step])
    })?;
    let (fraction, step) = (fraction[4], fraction[5]);
    let log_gamma_a = cx.b.unary(UnaryOp::Lgamma, a)?;
    let log_prefactor = cx.b.binary(BinaryOp::Sub, power_decay, log_gamma_a)?;
    let prefactor = cx.b.unary(UnaryOp::Exp, log_prefactor)?;
    let upper_fraction = cx.b.binary(BinaryOp::Mul, prefactor, fraction)?;
    let fraction_residual = cx.b.binary(BinaryOp::Sub, step, one)?;
    // Pick the method, then the function.
    let threshold = cx.b.binary(BinaryOp::Add, a, one)?;
    let by_series = cx.b.compare(CompareDir::Lt, x, threshold)?;
    let (series_value, fraction_value) = if upper {
        (
            cx.b.binary(BinaryOp::Sub, one, lower_series)?,
            upper_fraction,
        )
    } else {
        (
            lower_series,
            cx.b.binary(BinaryOp::Sub, one, upper_fraction)?,
        )
    };
    let v = cx.b.select(by_series, series_value, fraction_value)?;
    // Not converged: NaN.
    let residual = cx.b.select(by_series, series_residual, fraction_residual)?;
    let residual = cx.b.unary(UnaryOp::Abs, residual)?;
    let unconverged = cx.compared(residual, CompareDir::Gt, 1e-14)?;
    let v = cx.value_where(unconverged, f64::NAN, v)?;
    // torch's edges (P; Q mirrors them): x = 0 gives 0, a = 0 gives 1 for x > 0, x = inf 1,
    // a = inf 0, and NaN for negative arguments and for a = x = 0 or a = x = inf.
    let (zero_value, one_value) = if upper { (1.0, 0.0) } else { (0.0, 1.0) };
    let x_zero = cx.compared(x, CompareDir::Eq, 0.0)?;
    let v = cx.value_where(x_zero, zero_value, v)?;
    let a_zero = cx.compared(a, CompareDir::Eq, 0.0)?;
    let v = cx.value_where(a_zero, one_value, v)?;
    let x_infinite = cx.compared(x, CompareDir::Eq, f64::INFINITY)?;
    let v = cx.value_where(x_infinite, one_value, v)?;
    let a_infinite = cx.compared(a, CompareDir::Eq, f64::INFINITY)?;
    let v = cx.value_where(a_infinite, zero_value, v)?;
    let both_zero = cx.b.binary(BinaryOp::And, x_zero, a_zero)?;
    let both_infinite = cx.b.binary(BinaryOp::And, x_infinite, a_infinite)?;
    let x_negative = cx.compared(x, CompareDir::Lt, 0.0)?;
    let a_negative = cx.compared(a, CompareDir::Lt, 0.0)?;
    let mut undefined = cx.b.binary(BinaryOp::Or, both_zero, both_infinite)?;
    for mask in [x_negative, a_negative] {
        undefined = cx.b.binary(BinaryOp::Or, undefined, mask)?;
    }
    cx.value_where(undefined, f64::NAN, v)
}

/// igamma / igammac: both operands promoted and broadcast, computed in float64 and rounded once.
fn igamma(cx: &mut Ctx, n: &Node, upper: bool) -> OpResult<Vec<Option<Value>>> {
    let (a, x) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let elem = float_result(cx, n)?;
    let v = prepare(cx, &[a, x], DType::F64)?;
    let r = incomplete_gamma(cx, v[0], v[1], upper)?;
    Ok(vec![Some(cx.b.convert(r, elem))])
}

pub fn register(r: &mut Registry) {
    r.add(&["aten.igamma.default"], |cx, n| igamma(cx, n, false));
    r.add(&["aten.igammac.default"], |cx, n| igamma(cx, n, true));
    r.add(&["aten.polygamma.default"], polygamma);
    r.add(
        &[
            "aten.special_zeta.default",
            "aten.special_zeta.self_scalar",
            "aten.special_zeta.other_scalar",
        ],
        |cx, n| binary_wide(cx, n, ["self", "other"], zeta),
    );
    r.add(&["aten.special_i1e.default"], |cx, n| {
        computed_wide(cx, n, |cx, x| Ok(cx.b.unary(UnaryOp::BesselI1e, x)?))
    });
    r.add(&["aten.nextafter.default"], nextafter);
    r.add(&["aten.special_erfcx.default"], |cx, n| {
        in_double(cx, n, erfcx)
    });
    r.add(&["aten.special_ndtri.default"], |cx, n| {
        in_double(cx, n, ndtri)
    });
    r.add(&["aten.hypot.default"], hypot);
    r.add(&["aten.frexp.Tensor"], frexp);
    r.add(
        &[
            "aten.bitwise_left_shift.Tensor",
            "aten.bitwise_left_shift.Tensor_Scalar",
            "aten.bitwise_left_shift.Scalar_Tensor",
            "aten.__lshift__.Tensor",
            "aten.__lshift__.Scalar",
        ],
        |cx, n| shift(cx, n, true),
    );
    r.add(
        &[
            "aten.bitwise_right_shift.Tensor",
            "aten.bitwise_right_shift.Tensor_Scalar",
            "aten.bitwise_right_shift.Scalar_Tensor",
            "aten.__rshift__.Tensor",
            "aten.__rshift__.Scalar",
        ],
        |cx, n| shift(cx, n, false),
    );
    r.add(&["aten.gcd.default"], gcd);
    r.add(&["aten.lcm.default"], lcm);
}
