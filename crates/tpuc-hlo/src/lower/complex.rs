//! Complex numbers: their parts, conjugates and views as real pairs. (Other lowerings that
//! handle complex tensors are registered with `Registry::add_complex`; every other op refuses
//! them.)

use tpuc_fx::Node;

use super::prelude::*;

/// `conj` of a complex tensor; a real tensor is its own conjugate.
fn conjugate(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let elem = cx.out_type(n, 0)?.elem;
    let x = cx.b.convert(x, elem);
    Ok(vec![Some(if elem.is_complex() { conj(cx, x)? } else { x })])
}

fn real(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    Ok(vec![Some(if cx.b.elem(x).is_complex() {
        cx.b.real(x)?
    } else {
        x
    })])
}

fn imag(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = complex_arg(cx, n, "self")?;
    Ok(vec![Some(cx.b.imag(x)?)])
}

/// [..., 2] real pairs from a complex tensor.
fn view_as_real(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = complex_arg(cx, n, "self")?;
    let mut shape = cx.b.shape(x).to_vec();
    shape.push(1);
    let re = cx.b.real(x)?;
    let im = cx.b.imag(x)?;
    let re = cx.b.reshape(re, &shape)?;
    let im = cx.b.reshape(im, &shape)?;
    Ok(vec![Some(
        cx.b.concatenate(&[re, im], shape.len() as i64 - 1)?,
    )])
}

/// A complex tensor from [..., 2] real pairs.
fn view_as_complex(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let shape = cx.b.shape(x).to_vec();
    if shape.last() != Some(&2) || cx.b.elem(x).complex_of().is_none() {
        return err(format!(
            "not supported: view_as_complex of {} (needs float32 or float64 with a last \
             dimension of 2)",
            cx.b.ty(x)
        ));
    }
    let last = shape.len() - 1;
    let part = |cx: &mut Ctx, i: i64| -> OpResult<Value> {
        let p = cx.b.slice_dim(x, last, i, i + 1, 1)?;
        Ok(cx.b.reshape(p, &shape[..last])?)
    };
    let re = part(cx, 0)?;
    let im = part(cx, 1)?;
    Ok(vec![Some(cx.b.complex(re, im)?)])
}

/// `torch.complex(real, imag)`.
fn complex(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = cx.out_type(n, 0)?;
    let parts = [cx.tensor(n, "real")?, cx.tensor(n, "imag")?]
        .map(|p| cx.b.convert(p, out.elem.real_part()));
    let parts = cx.broadcast_all(&parts)?;
    Ok(vec![Some(cx.b.complex(parts[0], parts[1])?)])
}

/// `torch.polar(abs, angle)`: abs * (cos(angle) + i sin(angle)).
fn polar(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = cx.out_type(n, 0)?;
    let parts = [cx.tensor(n, "abs")?, cx.tensor(n, "angle")?]
        .map(|p| cx.b.convert(p, out.elem.real_part()));
    let parts = cx.broadcast_all(&parts)?;
    let (r, theta) = (parts[0], parts[1]);
    let c = cx.b.unary(UnaryOp::Cos, theta)?;
    let s = cx.b.unary(UnaryOp::Sin, theta)?;
    let re = cx.b.binary(BinaryOp::Mul, r, c)?;
    let im = cx.b.binary(BinaryOp::Mul, r, s)?;
    Ok(vec![Some(cx.b.complex(re, im)?)])
}

pub fn register(r: &mut Registry) {
    r.add_complex(
        &[
            "aten._conj.default",
            "aten._conj_physical.default",
            "aten.conj_physical.default",
            "aten.resolve_conj.default",
        ],
        conjugate,
    );
    r.add_complex(&["aten.real.default"], real);
    r.add_complex(&["aten.imag.default"], imag);
    r.add_complex(&["aten.view_as_real.default"], view_as_real);
    r.add_complex(&["aten.view_as_complex.default"], view_as_complex);
    r.add_complex(&["aten.complex.default"], complex);
    r.add_complex(&["aten.polar.default"], polar);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::DType;

    #[test]
    fn view_as_real_pairs_the_parts_in_a_last_dimension() {
        let mut g = TestGraph::default();
        let z = g.input("z", DType::C64, &[3]);
        let r = g.node1(
            "aten.view_as_real.default",
            vec![("self", t(&z))],
            DType::F32,
            &[3, 2],
        );
        assert_checks(
            &g.text(&[&r]),
            &[
                "stablehlo.real %0 : tensor<3xf32>",
                "stablehlo.imag %0 : tensor<3xf32>",
                "stablehlo.concatenate",
                "dim=1 : tensor<3x2xf32>",
            ],
        );
    }
}
