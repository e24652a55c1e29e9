//! Sorting and top-k (values with their indices), stable, NaN ordered after numbers as torch does;
//! searching sorted sequences.

use tpuc_fx::Node;

use super::prelude::*;
use crate::ir::reduction_identity;

/// `x` sorted along `dim`, with the int64 indices of the sorted elements.
fn sorted(cx: &mut Ctx, x: Value, dim: usize, descending: bool) -> OpResult<(Value, Value)> {
    let ty = cx.b.ty(x).clone();
    if ty.rank() == 0 {
        let zero = cx.b.splat(&TensorType::new(vec![], DType::I64), 0.0);
        return Ok((x, zero));
    }
    let indices = cx.b.iota(ty.with_elem(DType::I64), dim as i64)?;
    let order = if descending {
        SortOrder::Descending
    } else {
        SortOrder::Ascending
    };
    if !ty.elem.is_float() {
        let r = cx.b.sort(&[x, indices], dim as i64, order)?;
        return Ok((r[0], r[1]));
    }
    // The comparison is a total order (NaN after every number, as torch sorts), which would
    // also put -0.0 before 0.0; torch treats them as equal, so the sort key folds -0.0 into 0.0
    // and the values ride along unchanged.
    let zero = cx.full_like(x, 0.0, None);
    let is_zero = cx.b.compare(CompareDir::Eq, x, zero)?;
    let key = cx.b.select(is_zero, zero, x)?;
    let r = cx.b.sort(&[key, x, indices], dim as i64, order)?;
    Ok((r[1], r[2]))
}

fn sort(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let dim = norm_dim(cx.int(n, "dim", Some(-1))?, cx.b.ty(x).rank())?;
    let descending = cx.bool(n, "descending", false)?;
    let (values, indices) = sorted(cx, x, dim, descending)?;
    Ok(vec![Some(values), Some(indices)])
}

fn topk(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "self")?;
    let rank = cx.b.ty(x).rank();
    let dim = norm_dim(cx.int(n, "dim", Some(-1))?, rank)?;
    let k = cx.int(n, "k", None)?;
    let largest = cx.bool(n, "largest", true)?;
    let size = cx.b.shape(x).get(dim).copied().unwrap_or(1);
    if k < 0 || k > size {
        return err(format!(
            "k={k} is out of range for a dimension of size {size}"
        ));
    }
    let (values, indices) = sorted(cx, x, dim, largest)?;
    if rank == 0 {
        return Ok(vec![Some(values), Some(indices)]);
    }
    let values = cx.b.slice_dim(values, dim, 0, k, 1)?;
    let indices = cx.b.slice_dim(indices, dim, 0, k, 1)?;
    Ok(vec![Some(values), Some(indices)])
}

/// Which element of each sorted row an order statistic takes.
#[derive(Clone, Copy)]
enum Statistic {
    /// median: the lower middle, or the first NaN when the row has one (torch propagates NaN).
    Median,
    /// nanmedian: the lower middle of the row's numbers (NaN when it has none).
    NanMedian,
    /// kthvalue: the k-th smallest (1-based).
    Kth(i64),
}

/// median / nanmedian / kthvalue: (values, indices) along `dim`. The row is sorted (stably, NaN
/// last) and the statistic's position picked with a one-hot mask.
fn order_statistic(cx: &mut Ctx, n: &Node, which: Statistic) -> OpResult<Vec<Option<Value>>> {
    let mut x = cx.tensor(n, "self")?;
    let whole = n.target.ends_with(".default") && !matches!(which, Statistic::Kth(_));
    if whole {
        let numel = cx.b.ty(x).numel();
        x = cx.b.reshape(x, &[numel])?;
    }
    let rank = cx.b.ty(x).rank();
    if rank == 0 {
        let zero = cx.b.splat(&TensorType::new(vec![], DType::I64), 0.0);
        return Ok(vec![Some(x), Some(zero)]);
    }
    let dim = if whole {
        0
    } else {
        norm_dim(cx.int(n, "dim", Some(-1))?, rank)?
    };
    let size = cx.b.shape(x)[dim];
    if size == 0 {
        return err("an order statistic of an empty dimension");
    }
    let (values, indices) = sorted(cx, x, dim, false)?;
    // How many numbers (not NaN) each row holds, shaped like the reduced row.
    let not_nan = cx.b.compare(CompareDir::Eq, x, x)?;
    let counted = cx.b.convert(not_nan, DType::I64);
    let count = cx.b.reduce_by(counted, &[dim as i64], BinaryOp::Add)?;
    let constant = |cx: &mut Ctx, v: i64| cx.full_like(count, v as f64, None);
    let position = match which {
        Statistic::Kth(k) => {
            if k < 1 || k > size {
                return err(format!(
                    "k={k} is out of range for a dimension of size {size}"
                ));
            }
            constant(cx, k - 1)
        }
        Statistic::Median => {
            let full = constant(cx, size);
            let has_nan = cx.b.compare(CompareDir::Lt, count, full)?;
            let middle = constant(cx, (size - 1) / 2);
            cx.b.select(has_nan, count, middle)?
        }
        Statistic::NanMedian => {
            let one = constant(cx, 1);
            let two = constant(cx, 2);
            let zero = constant(cx, 0);
            let less = cx.b.binary(BinaryOp::Sub, count, one)?;
            let half = cx.b.binary(BinaryOp::Div, less, two)?;
            cx.b.binary(BinaryOp::Max, half, zero)?
        }
    };
    let shape = cx.b.shape(values).to_vec();
    let kept: Vec<i64> = (0..rank as i64).filter(|&d| d != dim as i64).collect();
    let position = cx.b.broadcast_in_dim(position, &shape, &kept)?;
    let iota =
        cx.b.iota(TensorType::new(shape.clone(), DType::I64), dim as i64)?;
    let hit = cx.b.compare(CompareDir::Eq, iota, position)?;
    // The lowest value elsewhere and a max over the row keep the chosen element exactly
    // (NaN and -0.0 included) for every dtype.
    let pick = |cx: &mut Ctx, v: Value| -> OpResult<Value> {
        let elem = cx.b.elem(v);
        let lowest = cx.full_like(v, reduction_identity(BinaryOp::Max, elem), None);
        let chosen = cx.b.select(hit, v, lowest)?;
        Ok(cx.b.reduce_by(chosen, &[dim as i64], BinaryOp::Max)?)
    };
    let value = pick(cx, values)?;
    let index = pick(cx, indices)?;
    let out = cx.out_type(n, 0)?;
    let value = cx.b.reshape(value, &out.shape)?;
    if whole {
        return Ok(vec![Some(value)]);
    }
    Ok(vec![Some(value), Some(cx.b.reshape(index, &out.shape)?)])
}

/// searchsorted(sorted_sequence, self, out_int32, right, side, sorter): for each value, the
/// number of boundaries before it (`<` from the left, `<=` from the right), counted over a 1-d
/// sequence or over the matching row of an n-d one.
fn searchsorted(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    // bucketize(self, boundaries, ...) is searchsorted over a 1-d sequence.
    let boundaries = match n.arg("boundaries") {
        Some(_) => cx.tensor(n, "boundaries")?,
        None => cx.tensor(n, "sorted_sequence")?,
    };
    let values = cx.tensor(n, "self")?;
    if cx.opt_tensor(n, "sorter")?.is_some() {
        return err("not supported: searchsorted with a sorter (sort the sequence first)");
    }
    let right = match cx.opt_str(n, "side")? {
        Some("right") => true,
        Some("left") => false,
        Some(other) => return err(format!("side must be left or right, not {other:?}")),
        None => cx.bool(n, "right", false)?,
    };
    let out = cx.out_type(n, 0)?;
    let (bs, vs) = (cx.b.shape(boundaries).to_vec(), cx.b.shape(values).to_vec());
    let m = *bs
        .last()
        .ok_or_else(|| OpError("the sorted sequence is 0-d".into()))?;
    if bs.len() > 1 && (vs.len() != bs.len() || vs[..vs.len() - 1] != bs[..bs.len() - 1]) {
        return err(format!(
            "an n-d sorted sequence {bs:?} needs values with the same leading dims, got {vs:?}"
        ));
    }
    // Compare every value with every boundary: [..., K, M].
    let mut pair = vs.clone();
    pair.push(m);
    let r = vs.len() as i64;
    let b_dims: Vec<i64> = if bs.len() == 1 {
        vec![r]
    } else {
        (0..r - 1).chain([r]).collect()
    };
    let elem = promote_types(cx.b.elem(boundaries), cx.b.elem(values));
    let b = cx.b.convert(boundaries, elem);
    let v = cx.b.convert(values, elem);
    let b = cx.b.broadcast_in_dim(b, &pair, &b_dims)?;
    let v =
        cx.b.broadcast_in_dim(v, &pair, &(0..r).collect::<Vec<_>>())?;
    let dir = if right {
        CompareDir::Le
    } else {
        CompareDir::Lt
    };
    let before = cx.b.compare(dir, b, v)?;
    let count = cx.b.convert(before, DType::I64);
    let count = cx.b.reduce_by(count, &[r], BinaryOp::Add)?;
    Ok(vec![Some(cx.b.convert(count, out.elem))])
}

pub fn register(r: &mut Registry) {
    r.add(
        &["aten.searchsorted.Tensor", "aten.bucketize.Tensor"],
        searchsorted,
    );
    r.add(&["aten.median.default", "aten.median.dim"], |cx, n| {
        order_statistic(cx, n, Statistic::Median)
    });
    r.add(
        &["aten.nanmedian.default", "aten.nanmedian.dim"],
        |cx, n| order_statistic(cx, n, Statistic::NanMedian),
    );
    r.add(&["aten.kthvalue.default"], |cx, n| {
        let k = cx.int(n, "k", None)?;
        order_statistic(cx, n, Statistic::Kth(k))
    });
    r.add(&["aten.sort.default", "aten.sort.stable"], sort);
    r.add(&["aten.topk.default"], topk);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::{Arg, DType};

    fn sorted(dtype: DType) -> String {
        let mut g = TestGraph::default();
        let x = g.input("x", dtype, &[5]);
        let out = g.node(
            "aten.sort.default",
            vec![("self", t(&x)), ("descending", Arg::Bool(true))],
            &[(dtype, &[5]), (DType::I64, &[5])],
        );
        g.text(&[&out[0], &out[1]])
    }

    #[test]
    fn floats_sort_in_their_total_order() {
        // NaN after every number, as torch sorts; the IR says so, the emitter only spells it.
        assert_checks(
            &sorted(DType::F32),
            &["stablehlo.sort", "order=Descending type=TOTALORDER"],
        );
        assert_checks(&sorted(DType::I64), &["order=Descending type=SIGNED"]);
        assert_checks(&sorted(DType::U8), &["order=Descending type=UNSIGNED"]);
    }
}
