//! Resampling: upsampling (nearest, nearest-exact, linear/bilinear/trilinear) and
//! grid_sampler_2d. Source positions follow torch's CPU kernels: upsampling computes them in
//! float32, grid sampling in the input's type.

use tpuc_fx::Node;

use super::prelude::*;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nearest,
    NearestExact,
    Linear { align_corners: bool },
}

fn upsample_spatial(n: &Node) -> usize {
    if n.target.contains("1d") {
        1
    } else if n.target.contains("3d") {
        3
    } else {
        2
    }
}

/// The user's scale factor of each spatial dim, where given (`scale_factors` in the `.vec`
/// overloads; `scales`/`scales_h`... otherwise).
fn user_scales(cx: &Ctx, n: &Node, spatial: usize) -> OpResult<Vec<Option<f64>>> {
    if n.target.ends_with(".vec") {
        return Ok(match n.arg("scale_factors") {
            Some(tpuc_fx::Arg::Floats(v)) if v.len() == spatial => {
                v.iter().map(|&f| Some(f)).collect()
            }
            Some(tpuc_fx::Arg::Floats(v)) => {
                return err(format!(
                    "scale_factors has {} values for {spatial} spatial dimensions",
                    v.len()
                ))
            }
            _ => vec![None; spatial],
        });
    }
    let names: &[&str] = match spatial {
        1 => &["scales"],
        2 => &["scales_h", "scales_w"],
        _ => &["scales_d", "scales_h", "scales_w"],
    };
    names.iter().map(|name| cx.opt_float(n, name)).collect()
}

/// torch's `area_pixel_compute_scale` (as float32).
fn source_scale(input: i64, output: i64, align_corners: bool, user: Option<f64>) -> f32 {
    if align_corners {
        if output > 1 {
            (input - 1) as f32 / (output - 1) as f32
        } else {
            0.0
        }
    } else {
        match user {
            Some(s) if s > 0.0 => (1.0 / s) as f32,
            _ => input as f32 / output as f32,
        }
    }
}

/// For each output position along one dim: the two source positions and their weights.
fn source_positions(
    input: i64,
    output: i64,
    mode: Mode,
    user: Option<f64>,
) -> Vec<(i64, i64, f32)> {
    let align = matches!(
        mode,
        Mode::Linear {
            align_corners: true
        }
    );
    let scale = source_scale(input, output, align, user);
    (0..output)
        .map(|dst| match mode {
            Mode::Nearest => {
                let src = ((dst as f32 * scale).floor() as i64).min(input - 1);
                (src, src, 0.0)
            }
            Mode::NearestExact => {
                let src = (((dst as f32 + 0.5) * scale).floor() as i64).min(input - 1);
                (src, src, 0.0)
            }
            Mode::Linear { align_corners } => {
                let src = if align_corners {
                    scale * dst as f32
                } else {
                    (scale * (dst as f32 + 0.5) - 0.5).max(0.0)
                };
                let i0 = (src.floor() as i64).min(input - 1);
                let i1 = if i0 < input - 1 { i0 + 1 } else { i0 };
                let lambda = (src - i0 as f32).clamp(0.0, 1.0);
                (i0, i1, lambda)
            }
        })
        .collect()
}

fn upsample(cx: &mut Ctx, n: &Node, mode: Mode) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input").or_else(|_| cx.tensor(n, "self"))?;
    let out = cx.out_type(n, 0)?;
    let spatial = upsample_spatial(n);
    let rank = cx.b.ty(x).rank();
    if rank < spatial + 1 || out.rank() != rank {
        return err(format!(
            "a {spatial}-d upsampling needs a tensor of rank {} or {}, got {}",
            spatial + 1,
            spatial + 2,
            cx.b.ty(x)
        ));
    }
    let scales = user_scales(cx, n, spatial)?;
    let elem = cx.b.elem(x);
    // Linear modes interpolate in float32 for 16-bit floats, as torch's accscalar_t.
    let work = elem.accumulation();
    let mut y = if matches!(mode, Mode::Linear { .. }) {
        cx.b.convert(x, work)
    } else {
        x
    };
    for (i, &scale) in scales.iter().enumerate() {
        let d = rank - spatial + i;
        let (input, output) = (cx.b.shape(y)[d], out.shape[d]);
        // Every mode maps each position to itself when the size is unchanged.
        if input == output && scale.is_none() {
            continue;
        }
        if input == 0 {
            return err(format!("cannot upsample an empty dimension {d}"));
        }
        let positions = source_positions(input, output, mode, scale);
        let index = |cx: &mut Ctx, which: fn(&(i64, i64, f32)) -> i64| {
            let values: Vec<f64> = positions.iter().map(|p| which(p) as f64).collect();
            cx.b.dense(TensorType::new(vec![output], DType::I64), &values)
        };
        let first = index(cx, |p| p.0)?;
        let near = take_along(cx, y, d, first)?;
        if !matches!(mode, Mode::Linear { .. }) {
            y = near;
            continue;
        }
        let second = index(cx, |p| p.1)?;
        let far = take_along(cx, y, d, second)?;
        let shape = cx.b.shape(near).to_vec();
        let weights = |cx: &mut Ctx, f: &dyn Fn(f32) -> f32| -> OpResult<Value> {
            let values: Vec<f64> = positions.iter().map(|p| f(p.2) as f64).collect();
            let w = cx.b.dense(TensorType::new(vec![output], work), &values)?;
            Ok(cx.b.broadcast_in_dim(w, &shape, &[d as i64])?)
        };
        let w0 = weights(cx, &|l| 1.0 - l)?;
        let w1 = weights(cx, &|l| l)?;
        let a = cx.b.binary(BinaryOp::Mul, near, w0)?;
        let b = cx.b.binary(BinaryOp::Mul, far, w1)?;
        y = cx.b.binary(BinaryOp::Add, a, b)?;
    }
    Ok(vec![Some(cx.b.convert(y, elem))])
}

/// The gradient of nearest (or nearest-exact) upsampling: each output position's gradient
/// added to the source position it copied, one spatial dim at a time, in float32 for 16-bit
/// floats (torch's accumulation type).
fn upsample_nearest_backward(cx: &mut Ctx, n: &Node, mode: Mode) -> OpResult<Vec<Option<Value>>> {
    let grad = cx.tensor(n, "grad_output")?;
    let out = cx.out_type(n, 0)?;
    let spatial = upsample_spatial(n);
    let rank = cx.b.ty(grad).rank();
    if rank != out.rank() || rank < spatial {
        return err(format!(
            "a {spatial}-d upsampling gradient of {} for an input of {out}",
            cx.b.ty(grad)
        ));
    }
    let scales = user_scales(cx, n, spatial)?;
    let work = out.elem.accumulation();
    let mut g = cx.b.convert(grad, work);
    for (i, &scale) in scales.iter().enumerate() {
        let d = rank - spatial + i;
        let (input, output) = (out.shape[d], cx.b.shape(g)[d]);
        if input == output && scale.is_none() {
            continue;
        }
        let positions = source_positions(input, output, mode, scale);
        let values: Vec<f64> = positions.iter().map(|p| p.0 as f64).collect();
        let shape = cx.b.shape(g).to_vec();
        let index =
            cx.b.dense(TensorType::new(vec![output], DType::I64), &values)?;
        let index = cx.b.broadcast_in_dim(index, &shape, &[d as i64])?;
        let mut summed_shape = shape.clone();
        summed_shape[d] = input;
        let zeros = cx.b.splat(&TensorType::new(summed_shape, work), 0.0);
        g = scatter_into(cx, zeros, d, index, g, ScatterMode::Combine(BinaryOp::Add))?;
    }
    Ok(vec![Some(cx.b.convert(g, out.elem))])
}

/// grid_sampler_2d(input [N, C, H, W], grid [N, Ho, Wo, 2]) with bilinear (0) or nearest (1)
/// interpolation and zeros (0) or border (1) padding; grid holds (x, y) in [-1, 1]. Every step
/// is in the input's type, in the order of torch's scalar CPU kernel (the one 16-bit floats
/// take, which rounds after each step); corner positions are integers.
fn grid_sampler_2d(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input")?;
    let grid = cx.tensor(n, "grid")?;
    let interpolation = cx.int(n, "interpolation_mode", None)?;
    let padding_mode = cx.int(n, "padding_mode", None)?;
    let align_corners = cx.bool(n, "align_corners", false)?;
    if !matches!(interpolation, 0 | 1) || !matches!(padding_mode, 0 | 1) {
        return err(format!(
            "not supported: grid_sampler_2d with interpolation_mode={interpolation} \
             (bilinear=0 and nearest=1 are) and padding_mode={padding_mode} (zeros=0 and \
             border=1 are)"
        ));
    }
    let (xs, gs) = (cx.b.shape(x).to_vec(), cx.b.shape(grid).to_vec());
    if xs.len() != 4 || gs.len() != 4 || gs[3] != 2 || gs[0] != xs[0] {
        return err(format!(
            "grid_sampler_2d needs input [N, C, H, W] and grid [N, H', W', 2], got {xs:?} and {gs:?}"
        ));
    }
    let (batch, channels, height, width) = (xs[0], xs[1], xs[2], xs[3]);
    let (out_h, out_w) = (gs[1], gs[2]);
    let elem = cx.b.elem(x);
    let grid = cx.b.convert(grid, elem);
    let plane = [batch, out_h, out_w];
    let spread = [batch, channels, out_h, out_w];
    // Unnormalised source coordinate along one axis (torch's grid_sampler_compute_source_index).
    let source = |cx: &mut Ctx, component: i64, size: i64| -> OpResult<Value> {
        let c = cx.b.slice(
            grid,
            &[0, 0, 0, component],
            &[batch, out_h, out_w, component + 1],
            &[1; 4],
        )?;
        let c = cx.b.reshape(c, &plane)?;
        let one = cx.full_like(c, 1.0, None);
        let two = cx.full_like(c, 2.0, None);
        let plus = cx.b.binary(BinaryOp::Add, c, one)?;
        let coord = if align_corners {
            // ((c + 1) / 2) * (size - 1)
            let half = cx.b.binary(BinaryOp::Div, plus, two)?;
            cx.scaled(half, (size - 1) as f64)?
        } else {
            // ((c + 1) * size - 1) / 2
            let scaled = cx.scaled(plus, size as f64)?;
            let minus = cx.b.binary(BinaryOp::Sub, scaled, one)?;
            cx.b.binary(BinaryOp::Div, minus, two)?
        };
        if padding_mode == 1 {
            let lo = cx.full_like(coord, 0.0, None);
            let hi = cx.full_like(coord, (size - 1) as f64, None);
            Ok(cx.b.clamp(lo, coord, hi)?)
        } else {
            Ok(coord)
        }
    };
    let sx = source(cx, 0, width)?;
    let sy = source(cx, 1, height)?;
    // Values at integer positions (ix, iy) of each output, zero where out of bounds.
    let flat = cx.b.reshape(x, &[batch, channels, height * width])?;
    let sample = |cx: &mut Ctx, ix: Value, iy: Value| -> OpResult<Value> {
        let zero = cx.full_like(ix, 0.0, None);
        let w_hi = cx.full_like(ix, (width - 1) as f64, None);
        let h_hi = cx.full_like(iy, (height - 1) as f64, None);
        let mut inside = cx.b.compare(CompareDir::Ge, ix, zero)?;
        for (v, dir, bound) in [
            (ix, CompareDir::Le, w_hi),
            (iy, CompareDir::Ge, zero),
            (iy, CompareDir::Le, h_hi),
        ] {
            let ok = cx.b.compare(dir, v, bound)?;
            inside = cx.b.binary(BinaryOp::And, inside, ok)?;
        }
        let column = cx.b.clamp(zero, ix, w_hi)?;
        let row = cx.b.clamp(zero, iy, h_hi)?;
        let row = cx.scaled(row, width as f64)?;
        let pos = cx.b.binary(BinaryOp::Add, row, column)?;
        let pos = cx.b.reshape(pos, &[batch, out_h * out_w])?;
        // Per batch element: gather its plane's positions for every channel.
        let dims = GatherDims {
            offset_dims: vec![1],
            collapsed_slice_dims: vec![2],
            operand_batching_dims: vec![0],
            start_indices_batching_dims: vec![0],
            start_index_map: vec![2],
            index_vector_dim: 2,
            slice_sizes: vec![1, channels, 1],
        };
        let taken = cx.b.gather(flat, pos, dims)?; // [N, C, Ho*Wo]
        let taken = cx.b.reshape(taken, &spread)?;
        let mask = cx.b.broadcast_in_dim(inside, &spread, &[0, 2, 3])?;
        let zeros = cx.full_like(taken, 0.0, None);
        Ok(cx.b.select(mask, taken, zeros)?)
    };
    let corner = |cx: &mut Ctx, v: Value| -> OpResult<Value> {
        let rounded = cx.b.unary(UnaryOp::Floor, v)?;
        Ok(cx.b.convert(rounded, DType::I64))
    };
    let result = if interpolation == 1 {
        let ix = cx.b.unary(UnaryOp::RoundEven, sx)?;
        let iy = cx.b.unary(UnaryOp::RoundEven, sy)?;
        let (ix, iy) = (cx.b.convert(ix, DType::I64), cx.b.convert(iy, DType::I64));
        sample(cx, ix, iy)?
    } else {
        let (x0, y0) = (corner(cx, sx)?, corner(cx, sy)?);
        let one = cx.full_like(x0, 1.0, None);
        let x1 = cx.b.binary(BinaryOp::Add, x0, one)?;
        let y1 = cx.b.binary(BinaryOp::Add, y0, one)?;
        // The distances to the corners, as the kernel takes them: (x1 - x) and (x - x0).
        let (x0f, x1f) = (cx.b.convert(x0, elem), cx.b.convert(x1, elem));
        let (y0f, y1f) = (cx.b.convert(y0, elem), cx.b.convert(y1, elem));
        let east = cx.b.binary(BinaryOp::Sub, x1f, sx)?;
        let west = cx.b.binary(BinaryOp::Sub, sx, x0f)?;
        let south = cx.b.binary(BinaryOp::Sub, y1f, sy)?;
        let north = cx.b.binary(BinaryOp::Sub, sy, y0f)?;
        let mut acc: Option<Value> = None;
        for (ix, iy, wx, wy) in [
            (x0, y0, east, south),
            (x1, y0, west, south),
            (x0, y1, east, north),
            (x1, y1, west, north),
        ] {
            let v = sample(cx, ix, iy)?;
            let w = cx.b.binary(BinaryOp::Mul, wx, wy)?;
            let w = cx.b.broadcast_in_dim(w, &spread, &[0, 2, 3])?;
            let term = cx.b.binary(BinaryOp::Mul, v, w)?;
            acc = Some(match acc {
                Some(a) => cx.b.binary(BinaryOp::Add, a, term)?,
                None => term,
            });
        }
        acc.expect("four corners")
    };
    Ok(vec![Some(result)])
}

pub fn register(r: &mut Registry) {
    r.add(
        &[
            "aten.upsample_nearest1d_backward.default",
            "aten.upsample_nearest2d_backward.default",
            "aten.upsample_nearest3d_backward.default",
        ],
        |cx, n| upsample_nearest_backward(cx, n, Mode::Nearest),
    );
    r.add(
        &[
            "aten._upsample_nearest_exact1d_backward.default",
            "aten._upsample_nearest_exact2d_backward.default",
            "aten._upsample_nearest_exact3d_backward.default",
        ],
        |cx, n| upsample_nearest_backward(cx, n, Mode::NearestExact),
    );
    r.add(
        &[
            "aten.upsample_nearest1d.default",
            "aten.upsample_nearest1d.vec",
            "aten.upsample_nearest2d.default",
            "aten.upsample_nearest2d.vec",
            "aten.upsample_nearest3d.default",
            "aten.upsample_nearest3d.vec",
        ],
        |cx, n| upsample(cx, n, Mode::Nearest),
    );
    r.add(
        &[
            "aten._upsample_nearest_exact1d.default",
            "aten._upsample_nearest_exact1d.vec",
            "aten._upsample_nearest_exact2d.default",
            "aten._upsample_nearest_exact2d.vec",
            "aten._upsample_nearest_exact3d.default",
            "aten._upsample_nearest_exact3d.vec",
        ],
        |cx, n| upsample(cx, n, Mode::NearestExact),
    );
    r.add(
        &[
            "aten.upsample_linear1d.default",
            "aten.upsample_linear1d.vec",
            "aten.upsample_bilinear2d.default",
            "aten.upsample_bilinear2d.vec",
            "aten.upsample_trilinear3d.default",
            "aten.upsample_trilinear3d.vec",
        ],
        |cx, n| {
            let align_corners = cx.bool(n, "align_corners", false)?;
            upsample(cx, n, Mode::Linear { align_corners })
        },
    );
    r.add(&["aten.grid_sampler_2d.default"], grid_sampler_2d);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn nearest_upsampling_picks_source_pixels() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[1, 1, 2, 3]);
        let y = g.node1(
            "aten.upsample_nearest2d.vec",
            vec![
                ("input", t(&x)),
                ("output_size", Arg::Ints(vec![4, 6])),
                ("scale_factors", Arg::None),
            ],
            DType::F32,
            &[1, 1, 4, 6],
        );
        let text = g.text(&[&y]);
        assert_checks(
            &text,
            &["stablehlo.gather", ": tensor<1x1x4x6xf32>", "return"],
        );
    }
}
