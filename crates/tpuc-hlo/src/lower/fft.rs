//! Discrete Fourier transforms over any dimensions, on stablehlo.fft (which transforms 1 to 3
//! trailing dimensions): the core ops `_fft_r2c`, `_fft_c2r` and `_fft_c2c`, and the
//! `torch.fft` functions (`fft_rfft`, `fft_ihfft2`, ...) that undecomposed exports keep.

use tpuc_fx::Node;

use super::prelude::*;

/// `dims` in range, none repeated, in the order given.
fn checked_dims(dims: Vec<i64>, rank: usize) -> OpResult<Vec<usize>> {
    let dims = dims
        .into_iter()
        .map(|d| norm_dim(d, rank))
        .collect::<OpResult<Vec<_>>>()?;
    let mut seen = dims.clone();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != dims.len() {
        return err(format!("dim {dims:?} repeats a dimension"));
    }
    Ok(dims)
}

/// Applies `f` to `x` with `dims` moved, in order, to the end; moves them back after.
fn along(
    cx: &mut Ctx,
    x: Value,
    dims: &[usize],
    f: impl FnOnce(&mut Ctx, Value) -> OpResult<Value>,
) -> OpResult<Value> {
    let rank = cx.b.ty(x).rank();
    let perm: Vec<i64> = (0..rank)
        .filter(|d| !dims.contains(d))
        .chain(dims.iter().copied())
        .map(|d| d as i64)
        .collect();
    let mut inverse = vec![0i64; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p as usize] = i as i64;
    }
    let moved = cx.b.transpose(x, &perm)?;
    let y = f(cx, moved)?;
    Ok(cx.b.transpose(y, &inverse)?)
}

/// The transform `kind` of `x` over `dims`, their lengths those of `x`.
fn transform(cx: &mut Ctx, x: Value, dims: &[usize], kind: FftKind) -> OpResult<Value> {
    along(cx, x, dims, |cx, moved| {
        let shape = cx.b.shape(moved);
        let length = shape[shape.len() - dims.len()..].to_vec();
        Ok(cx.b.fft(moved, kind, &length)?)
    })
}

/// Complex-to-complex transform over any number of dimensions: the transform is separable, so
/// stablehlo.fft's limit of three dimensions is met three at a time. The inverse is scaled by
/// 1/n, as stablehlo's IFFT is.
fn c2c_over(cx: &mut Ctx, mut x: Value, dims: &[usize], inverse: bool) -> OpResult<Value> {
    let kind = if inverse { FftKind::Ifft } else { FftKind::Fft };
    for chunk in dims.chunks(3) {
        x = transform(cx, x, chunk, kind)?;
    }
    Ok(x)
}

/// Which way a transform goes: torch scales by the signal size according to `norm` and the
/// direction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Inverse,
}

/// The factor torch applies to an unnormalized transform of `size` points: the core ops'
/// `normalization` (0 none, 1 by 1/sqrt(n), 2 by 1/n).
fn normalization_factor(mode: i64, size: i64) -> OpResult<f64> {
    let size = size as f64;
    Ok(match mode {
        0 => 1.0,
        1 => 1.0 / size.sqrt(),
        2 => 1.0 / size,
        other => return err(format!("not supported: normalization={other}")),
    })
}

/// The `normalization` mode of the `torch.fft` functions' `norm` for a direction.
fn norm_mode(norm: Option<&str>, direction: Direction) -> OpResult<i64> {
    Ok(match (norm.unwrap_or("backward"), direction) {
        ("ortho", _) => 1,
        ("backward", Direction::Forward) | ("forward", Direction::Inverse) => 0,
        ("backward", Direction::Inverse) | ("forward", Direction::Forward) => 2,
        (other, _) => {
            return err(format!(
                "not supported: norm={other:?} (backward, ortho or forward)"
            ))
        }
    })
}

fn signal_size(shape: &[i64], dims: &[usize]) -> i64 {
    dims.iter().map(|&d| shape[d]).product()
}

/// `x` in float32 or float64 (torch's CPU FFTs take no 16-bit floats either; integers and
/// bools become float32), or complex when `complex_ok`.
fn fft_input(cx: &mut Ctx, x: Value, complex_ok: bool) -> OpResult<Value> {
    let elem = cx.b.elem(x);
    if elem.complex_of().is_some() || (complex_ok && elem.is_complex()) {
        return Ok(x);
    }
    if elem.is_integer() || elem.is_bool() {
        return Ok(cx.b.convert(x, DType::F32));
    }
    err(format!(
        "not supported: FFT of {} (float32, float64{})",
        elem,
        if complex_ok {
            ", complex64 and complex128"
        } else {
            ""
        }
    ))
}

/// Complex-to-complex transform, unnormalized then times `factor`.
fn c2c_scaled(
    cx: &mut Ctx,
    x: Value,
    dims: &[usize],
    direction: Direction,
    factor: f64,
) -> OpResult<Value> {
    let inverse = direction == Direction::Inverse;
    let y = c2c_over(cx, x, dims, inverse)?;
    // stablehlo's inverse is already scaled by 1/n.
    let size = signal_size(cx.b.shape(x), dims) as f64;
    cx.scaled(y, if inverse { factor * size } else { factor })
}

/// Real-to-complex transform (forward), unnormalized then times `factor`; with `onesided`, the
/// last dimension keeps the non-negative half of its spectrum.
fn r2c_scaled(
    cx: &mut Ctx,
    x: Value,
    dims: &[usize],
    onesided: bool,
    factor: f64,
) -> OpResult<Value> {
    let Some((&last, rest)) = dims.split_last() else {
        return err("dim is empty");
    };
    let y = if onesided {
        let half = transform(cx, x, &[last], FftKind::Rfft)?;
        c2c_over(cx, half, rest, false)?
    } else {
        let complex =
            cx.b.elem(x)
                .complex_of()
                .expect("a float32 or float64 input");
        let x = cx.b.convert(x, complex);
        c2c_over(cx, x, dims, false)?
    };
    cx.scaled(y, factor)
}

/// `x` with each of `dims` cut or zero-padded at its end to `sizes`: one pad, whose negative
/// padding cuts.
fn resized(cx: &mut Ctx, x: Value, dims: &[usize], sizes: &[i64]) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let mut high = vec![0; shape.len()];
    for (&d, &size) in dims.iter().zip(sizes) {
        high[d] = size - shape[d];
    }
    if high.iter().all(|&h| h == 0) {
        return Ok(x);
    }
    let zero = cx.b.scalar(cx.b.elem(x), 0.0);
    let none = vec![0; shape.len()];
    Ok(cx.b.pad(x, zero, &none, &high, &none)?)
}

/// Complex-to-real transform (inverse) whose last dimension's output is `out_len` long,
/// unnormalized then times `factor`. It reads the first out_len/2 + 1 coefficients of the
/// last dimension: extra ones are dropped, missing ones are zeros.
fn c2r_scaled(
    cx: &mut Ctx,
    x: Value,
    dims: &[usize],
    out_len: i64,
    factor: f64,
) -> OpResult<Value> {
    let Some((&last, rest)) = dims.split_last() else {
        return err("dim is empty");
    };
    if out_len < 1 {
        return err(format!("the output length {out_len} must be positive"));
    }
    let y = c2c_over(cx, x, rest, true)?;
    let y = resized(cx, y, &[last], &[out_len / 2 + 1])?;
    let y = along(cx, y, &[last], |cx, moved| {
        Ok(cx.b.fft(moved, FftKind::Irfft, &[out_len])?)
    })?;
    // stablehlo's inverses are scaled by 1/size.
    let size = signal_size(cx.b.shape(y), dims);
    cx.scaled(y, factor * size as f64)
}

// ----- the core ops -----------------------------------------------------------------------

fn core_dims(cx: &Ctx, n: &Node, x: Value) -> OpResult<Vec<usize>> {
    checked_dims(cx.ints(n, "dim", None)?, cx.b.ty(x).rank())
}

fn core_factor(cx: &Ctx, n: &Node, size: i64) -> OpResult<f64> {
    normalization_factor(cx.int(n, "normalization", None)?, size)
}

fn r2c(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let x = fft_input(cx, x, false)?;
    let dims = core_dims(cx, n, x)?;
    let factor = core_factor(cx, n, signal_size(cx.b.shape(x), &dims))?;
    let onesided = cx.bool(n, "onesided", true)?;
    Ok(vec![Some(r2c_scaled(cx, x, &dims, onesided, factor)?)])
}

fn c2r(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = complex_arg(cx, n, "self")?;
    let dims = core_dims(cx, n, x)?;
    let out_len = cx.int(n, "last_dim_size", None)?;
    let mut out_shape = cx.b.shape(x).to_vec();
    if let Some(&last) = dims.last() {
        out_shape[last] = out_len;
    }
    let factor = core_factor(cx, n, signal_size(&out_shape, &dims))?;
    Ok(vec![Some(c2r_scaled(cx, x, &dims, out_len, factor)?)])
}

fn c2c(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = complex_arg(cx, n, "self")?;
    let dims = core_dims(cx, n, x)?;
    let direction = if cx.bool(n, "forward", true)? {
        Direction::Forward
    } else {
        Direction::Inverse
    };
    let factor = core_factor(cx, n, signal_size(cx.b.shape(x), &dims))?;
    Ok(vec![Some(c2c_scaled(cx, x, &dims, direction, factor)?)])
}

// ----- the torch.fft functions ------------------------------------------------------------

/// The transform a `torch.fft` function computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    /// fft / ifft: complex (or real) in, complex out.
    Full,
    /// rfft / irfft: real in and the half spectrum out, or back.
    Real,
    /// hfft / ihfft: a Hermitian half spectrum in and real out, or back.
    Hermitian,
}

/// How many dimensions a function takes: one (`n`, `dim`), two (`s`, `dim=[-2, -1]`) or any
/// (`s`, `dim=None`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arity {
    One,
    Two,
    Any,
}

/// The transformed dimensions and their signal lengths (for a complex-to-real transform, the
/// lengths of the real output), as torch derives them from `n`/`s` and `dim`.
fn signal(
    cx: &Ctx,
    n: &Node,
    x: Value,
    arity: Arity,
    to_real: bool,
) -> OpResult<(Vec<usize>, Vec<i64>)> {
    let shape = cx.b.shape(x).to_vec();
    let rank = shape.len();
    let (dims, sizes): (Vec<usize>, Option<Vec<i64>>) = match arity {
        Arity::One => (
            checked_dims(vec![cx.int(n, "dim", Some(-1))?], rank)?,
            cx.opt_int(n, "n")?.map(|len| vec![len]),
        ),
        Arity::Two | Arity::Any => {
            let s = cx.opt_ints(n, "s")?;
            let dim = match (arity, cx.opt_ints(n, "dim")?) {
                (_, Some(d)) => d,
                (Arity::Two, None) => vec![-2, -1],
                // fftn: the last len(s) dimensions, or all of them.
                (_, None) => {
                    let k = s.as_ref().map_or(rank, Vec::len) as i64;
                    (-k..0).collect()
                }
            };
            if let Some(s) = &s {
                if s.len() != dim.len() {
                    return err(format!("s {s:?} and dim {dim:?} differ in length"));
                }
            }
            (checked_dims(dim, rank)?, s)
        }
    };
    let last = dims.len().saturating_sub(1);
    let sizes: Vec<i64> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| match sizes.as_ref().map(|s| s[i]) {
            Some(len) if len != -1 => len,
            _ if to_real && i == last => 2 * (shape[d] - 1),
            _ => shape[d],
        })
        .collect();
    if let Some(bad) = sizes.iter().find(|&&len| len < 1) {
        return err(format!("invalid signal length {bad} along dims {dims:?}"));
    }
    Ok((dims, sizes))
}

/// A `torch.fft` function: `family`, `arity` dimensions, forward or inverse.
fn fft_function(
    cx: &mut Ctx,
    n: &Node,
    family: Family,
    arity: Arity,
    direction: Direction,
) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let norm = cx.opt_str(n, "norm")?;
    let factor = |size: i64, direction| -> OpResult<f64> {
        normalization_factor(norm_mode(norm, direction)?, size)
    };
    // irfft and hfft produce real output from a half spectrum.
    let to_real = matches!(
        (family, direction),
        (Family::Real, Direction::Inverse) | (Family::Hermitian, Direction::Forward)
    );
    let complex_in = family == Family::Full || to_real;
    let x = fft_input(cx, x, complex_in)?;
    let (dims, sizes) = signal(cx, n, x, arity, to_real)?;
    let size: i64 = sizes.iter().product();
    let out = if to_real {
        let complex = cx.b.elem(x).complex_of();
        let x = match complex {
            Some(c) => cx.b.convert(x, c),
            None => x,
        };
        let mut half = sizes.clone();
        let out_len = half.pop().expect("at least one dimension");
        let x = resized(cx, x, &dims[..dims.len() - 1], &half)?;
        // hfft: the inverse real transform of the conjugate, scaled as a forward one.
        let (x, scaled_as) = if family == Family::Hermitian {
            (conj(cx, x)?, Direction::Forward)
        } else {
            (x, Direction::Inverse)
        };
        let f = factor(size, scaled_as)?;
        c2r_scaled(cx, x, &dims, out_len, f)?
    } else {
        let x = resized(cx, x, &dims, &sizes)?;
        let f = factor(size, direction)?;
        match family {
            Family::Full if cx.b.elem(x).is_complex() => c2c_scaled(cx, x, &dims, direction, f)?,
            // A real input's full spectrum; its inverse is the conjugate of the forward one.
            Family::Full => {
                let y = r2c_scaled(cx, x, &dims, false, f)?;
                if direction == Direction::Inverse {
                    conj(cx, y)?
                } else {
                    y
                }
            }
            Family::Real => r2c_scaled(cx, x, &dims, true, f)?,
            // ihfft: the conjugate of the forward half spectrum, scaled as an inverse.
            Family::Hermitian => {
                let y = r2c_scaled(cx, x, &dims, true, f)?;
                conj(cx, y)?
            }
        }
    };
    Ok(vec![Some(out)])
}

/// fftshift / ifftshift: a roll of each dimension by half its length (rounded down for
/// fftshift, up for ifftshift).
fn shift(cx: &mut Ctx, n: &Node, inverse: bool) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    let dims = match cx.opt_ints(n, "dim")? {
        Some(d) => checked_dims(d, shape.len())?,
        None => (0..shape.len()).collect(),
    };
    let mut y = x;
    for d in dims {
        let len = shape[d];
        if len < 2 {
            continue;
        }
        let by = if inverse { (len + 1) / 2 } else { len / 2 };
        // Rolling right by `by`: the last `by` elements come first.
        let tail = cx.b.slice_dim(y, d, len - by, len, 1)?;
        let head = cx.b.slice_dim(y, d, 0, len - by, 1)?;
        y = cx.b.concatenate(&[tail, head], d as i64)?;
    }
    Ok(vec![Some(y)])
}

pub fn register(r: &mut Registry) {
    r.add_complex(&["aten._fft_r2c.default"], r2c);
    r.add_complex(&["aten._fft_c2r.default"], c2r);
    r.add_complex(&["aten._fft_c2c.default"], c2c);
    for (name, family, arity, direction) in [
        (
            "aten.fft_fft.default",
            Family::Full,
            Arity::One,
            Direction::Forward,
        ),
        (
            "aten.fft_ifft.default",
            Family::Full,
            Arity::One,
            Direction::Inverse,
        ),
        (
            "aten.fft_fft2.default",
            Family::Full,
            Arity::Two,
            Direction::Forward,
        ),
        (
            "aten.fft_ifft2.default",
            Family::Full,
            Arity::Two,
            Direction::Inverse,
        ),
        (
            "aten.fft_fftn.default",
            Family::Full,
            Arity::Any,
            Direction::Forward,
        ),
        (
            "aten.fft_ifftn.default",
            Family::Full,
            Arity::Any,
            Direction::Inverse,
        ),
        (
            "aten.fft_rfft.default",
            Family::Real,
            Arity::One,
            Direction::Forward,
        ),
        (
            "aten.fft_irfft.default",
            Family::Real,
            Arity::One,
            Direction::Inverse,
        ),
        (
            "aten.fft_rfft2.default",
            Family::Real,
            Arity::Two,
            Direction::Forward,
        ),
        (
            "aten.fft_irfft2.default",
            Family::Real,
            Arity::Two,
            Direction::Inverse,
        ),
        (
            "aten.fft_rfftn.default",
            Family::Real,
            Arity::Any,
            Direction::Forward,
        ),
        (
            "aten.fft_irfftn.default",
            Family::Real,
            Arity::Any,
            Direction::Inverse,
        ),
        (
            "aten.fft_hfft.default",
            Family::Hermitian,
            Arity::One,
            Direction::Forward,
        ),
        (
            "aten.fft_ihfft.default",
            Family::Hermitian,
            Arity::One,
            Direction::Inverse,
        ),
        (
            "aten.fft_hfft2.default",
            Family::Hermitian,
            Arity::Two,
            Direction::Forward,
        ),
        (
            "aten.fft_ihfft2.default",
            Family::Hermitian,
            Arity::Two,
            Direction::Inverse,
        ),
        (
            "aten.fft_hfftn.default",
            Family::Hermitian,
            Arity::Any,
            Direction::Forward,
        ),
        (
            "aten.fft_ihfftn.default",
            Family::Hermitian,
            Arity::Any,
            Direction::Inverse,
        ),
    ] {
        r.add_complex(&[name], move |cx, n| {
            fft_function(cx, n, family, arity, direction)
        });
    }
    r.add_complex(&["aten.fft_fftshift.default"], |cx, n| shift(cx, n, false));
    r.add_complex(&["aten.fft_ifftshift.default"], |cx, n| shift(cx, n, true));
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn a_real_transform_keeps_the_non_negative_half() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[2, 8]);
        let y = g.node1(
            "aten._fft_r2c.default",
            vec![
                ("self", t(&x)),
                ("dim", Arg::Ints(vec![1])),
                ("normalization", Arg::Int(0)),
                ("onesided", Arg::Bool(true)),
            ],
            DType::C64,
            &[2, 5],
        );
        assert_checks(
            &g.text(&[&y]),
            &["stablehlo.fft %0 kind=RFFT length=[8] : tensor<2x5xcomplex<f32>>"],
        );
    }
}
