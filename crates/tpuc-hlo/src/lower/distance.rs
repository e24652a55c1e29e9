//! Pairwise distances: cdist (between two sets of rows) and pdist (among the rows of one).

use tpuc_fx::Node;

use super::prelude::*;

/// The p-norm of `diff` over its last dim, as torch's distance kernels define it (p = 0 counts
/// the nonzero differences, p = inf takes the largest).
fn p_norm_last(cx: &mut Ctx, diff: Value, p: f64) -> OpResult<Value> {
    let last = cx.b.ty(diff).rank() as i64 - 1;
    let abs = cx.b.unary(UnaryOp::Abs, diff)?;
    if p == f64::INFINITY {
        return Ok(cx.b.reduce_by(abs, &[last], BinaryOp::Max)?);
    }
    if p == 0.0 {
        let zero = cx.full_like(abs, 0.0, None);
        let nonzero = cx.b.compare(CompareDir::Ne, abs, zero)?;
        let ones = cx.b.convert(nonzero, cx.b.elem(abs));
        return Ok(cx.b.reduce_by(ones, &[last], BinaryOp::Add)?);
    }
    if p == 1.0 {
        return Ok(cx.b.reduce_by(abs, &[last], BinaryOp::Add)?);
    }
    if p == 2.0 {
        let sq = cx.b.binary(BinaryOp::Mul, abs, abs)?;
        let sum = cx.b.reduce_by(sq, &[last], BinaryOp::Add)?;
        return Ok(cx.b.unary(UnaryOp::Sqrt, sum)?);
    }
    let pv = cx.full_like(abs, p, None);
    let powered = cx.b.binary(BinaryOp::Pow, abs, pv)?;
    let sum = cx.b.reduce_by(powered, &[last], BinaryOp::Add)?;
    let inv = cx.full_like(sum, 1.0 / p, None);
    Ok(cx.b.binary(BinaryOp::Pow, sum, inv)?)
}

fn check_p(p: f64) -> OpResult<()> {
    if p < 0.0 || p.is_nan() {
        return err(format!("p-norm distance needs p >= 0, got {p}"));
    }
    Ok(())
}

/// _cdist_forward(x1 [*, P, M], x2 [*, R, M], p, compute_mode) -> [*, P, R]. For p = 2 torch
/// uses `sqrt(max(|a|^2 + |b|^2 - 2 a.b, 1e-30))` through a matmul when compute_mode is 1, or is
/// unset and either set has more than 25 rows; tpuc does the same, so results agree.
fn cdist(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "x1")?;
    let b = cx.tensor(n, "x2")?;
    let p = cx.float(n, "p", Some(2.0))?;
    check_p(p)?;
    let mode = cx.opt_int(n, "compute_mode")?.unwrap_or(0);
    let out = cx.out_type(n, 0)?;
    let (sa, sb) = (cx.b.shape(a).to_vec(), cx.b.shape(b).to_vec());
    if sa.len() < 2 || sb.len() < 2 || sa[sa.len() - 1] != sb[sb.len() - 1] {
        return err(format!(
            "cdist needs x1 [*, P, M] and x2 [*, R, M], got {sa:?} and {sb:?}"
        ));
    }
    let (rows_a, rows_b, m) = (sa[sa.len() - 2], sb[sb.len() - 2], sa[sa.len() - 1]);
    let batch = out.shape[..out.rank() - 2].to_vec();
    let with = |rows: i64| {
        let mut s = batch.clone();
        s.extend([rows, m]);
        s
    };
    let a = cx.b.broadcast_to(a, &with(rows_a))?;
    let b = cx.b.broadcast_to(b, &with(rows_b))?;
    let k = batch.len() as i64;
    let use_mm = p == 2.0 && (mode == 1 || (mode == 0 && (rows_a > 25 || rows_b > 25)));
    if use_mm {
        let squared_norms = |cx: &mut Ctx, v: Value| -> OpResult<Value> {
            let sq = cx.b.binary(BinaryOp::Mul, v, v)?;
            Ok(cx.b.reduce_by(sq, &[k + 1], BinaryOp::Add)?)
        };
        let na = squared_norms(cx, a)?;
        let nb = squared_norms(cx, b)?;
        let batch_dims: Vec<i64> = (0..k).collect();
        let dims = DotDims {
            lhs_batch: batch_dims.clone(),
            rhs_batch: batch_dims.clone(),
            lhs_contracting: vec![k + 1],
            rhs_contracting: vec![k + 1],
        };
        let ab = dot(cx, a, b, dims)?;
        let shape = out.shape.clone();
        let mut a_dims = batch_dims.clone();
        a_dims.push(k);
        let mut b_dims = batch_dims;
        b_dims.push(k + 1);
        let na = cx.b.broadcast_in_dim(na, &shape, &a_dims)?;
        let nb = cx.b.broadcast_in_dim(nb, &shape, &b_dims)?;
        let two = cx.full_like(ab, 2.0, None);
        let twice = cx.b.binary(BinaryOp::Mul, ab, two)?;
        let sum = cx.b.binary(BinaryOp::Add, na, nb)?;
        let d2 = cx.b.binary(BinaryOp::Sub, sum, twice)?;
        let tiny = cx.full_like(d2, 1e-30, None);
        let d2 = cx.b.binary(BinaryOp::Max, d2, tiny)?;
        return Ok(vec![Some(cx.b.unary(UnaryOp::Sqrt, d2)?)]);
    }
    let mut pair = out.shape.clone();
    pair.push(m);
    let mut a_dims: Vec<i64> = (0..k).collect();
    a_dims.extend([k, k + 2]);
    let mut b_dims: Vec<i64> = (0..k).collect();
    b_dims.extend([k + 1, k + 2]);
    let ea = cx.b.broadcast_in_dim(a, &pair, &a_dims)?;
    let eb = cx.b.broadcast_in_dim(b, &pair, &b_dims)?;
    let diff = cx.b.binary(BinaryOp::Sub, ea, eb)?;
    Ok(vec![Some(p_norm_last(cx, diff, p)?)])
}

/// _pdist_forward(x [N, M], p) -> the distances of rows i < j, in row-major order of (i, j).
fn pdist(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let p = cx.float(n, "p", Some(2.0))?;
    check_p(p)?;
    let shape = cx.b.shape(x).to_vec();
    if shape.len() != 2 {
        return err(format!("pdist needs a 2-d input, got shape {shape:?}"));
    }
    let rows = shape[0];
    let (first, second): (Vec<f64>, Vec<f64>) = (0..rows)
        .flat_map(|i| (i + 1..rows).map(move |j| (i as f64, j as f64)))
        .unzip();
    let pairs = first.len() as i64;
    if pairs == 0 {
        return Ok(vec![Some(
            cx.b.splat(&TensorType::new(vec![0], cx.b.elem(x)), 0.0),
        )]);
    }
    let index_ty = TensorType::new(vec![pairs], DType::I64);
    let i = cx.b.dense(index_ty.clone(), &first)?;
    let j = cx.b.dense(index_ty, &second)?;
    let xi = take_along(cx, x, 0, i)?;
    let xj = take_along(cx, x, 0, j)?;
    let diff = cx.b.binary(BinaryOp::Sub, xi, xj)?;
    Ok(vec![Some(p_norm_last(cx, diff, p)?)])
}

/// `torch.dist(a, b, p)`: the p-norm of the broadcast difference, over every element.
fn dist(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (a, b) = (cx.operand(n, "self")?, cx.operand(n, "other")?);
    let p = cx.float(n, "p", Some(2.0))?;
    check_p(p)?;
    let out = cx.out_type(n, 0)?.elem;
    if !out.is_float() {
        return err(format!("dist needs float tensors, got {out}"));
    }
    let v = prepare(cx, &[a, b], out.accumulation())?;
    let diff = cx.b.binary(BinaryOp::Sub, v[0], v[1])?;
    let count: i64 = cx.b.shape(diff).iter().product();
    let flat = cx.b.reshape(diff, &[count])?;
    let d = p_norm_last(cx, flat, p)?;
    Ok(vec![Some(cx.b.convert(d, out))])
}

pub fn register(r: &mut Registry) {
    r.add(&["aten._cdist_forward.default"], cdist);
    r.add(&["aten._pdist_forward.default"], pdist);
    r.add(&["aten.dist.default"], dist);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn euclidean_distances_are_square_roots_of_summed_squares() {
        let mut g = TestGraph::default();
        let a = g.input("a", DType::F32, &[3, 4]);
        let b = g.input("b", DType::F32, &[5, 4]);
        let d = g.node1(
            "aten._cdist_forward.default",
            vec![
                ("x1", t(&a)),
                ("x2", t(&b)),
                ("p", Arg::Float(2.0)),
                ("compute_mode", Arg::None),
            ],
            DType::F32,
            &[3, 5],
        );
        assert_checks(
            &g.text(&[&d]),
            &[
                "stablehlo.reduce",
                "stablehlo.sqrt",
                ": tensor<3x5xf32>",
                "return",
            ],
        );
    }
}
