//! The kernel registry for XLA:CPU (`Fusion::Kernels`): for a composite, a formulation written
//! for the plugin becomes its decomposition. The composite stays, so its name reaches every
//! dump and every backend. (tools/bench_fusion.py measures each against the ops matched; the
//! grouped attention below is as fast at 24 layers, 0.99x, and saves the repeated copies.)
//!
//! - `tpuc.attention` over grouped keys and values (fewer heads than the query, no mask): the
//!   query's heads split into their groups and multiplied with their key/value head as one
//!   batched product, instead of copies of each key/value head made for every query head.

use super::attention::ATTENTION;
use crate::ir::{
    AttrValue, BinaryOp, BuildResult, Builder, CompareDir, DType, DotDims, Func, OpKind, Precision,
    Region, TensorType, UnaryOp,
};

/// `f` with each composite the registry has a formulation for computed by it.
pub(super) fn choose(f: &mut Func) -> BuildResult<()> {
    for i in 0..f.ops().len() {
        let op = &f.ops()[i];
        let Some((name, attributes, decomposition)) = op.kind().composite() else {
            continue;
        };
        let types: Vec<TensorType> = op.operands().iter().map(|&v| f.ty(v).clone()).collect();
        let results = op.results().len();
        let chosen = if name == ATTENTION {
            grouped_attention(&types, attributes, results, decomposition)?
        } else {
            None
        };
        if let Some(region) = chosen {
            let (kind, operands) = (op.kind().with_regions(vec![region]), op.operands().to_vec());
            f.replace_op(i, kind, operands)?;
        }
    }
    Ok(())
}

fn attribute<'a>(attributes: &'a [(String, AttrValue)], key: &str) -> Option<&'a AttrValue> {
    attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Attention of `q` [.., H, L, D] over `k`, `v` [.., KV, S, D] with H a multiple of KV: the
/// query as [.., KV, H/KV, L, D], each group against its key/value head in one batched
/// product; the softmax as the decomposition computes it (the row maximum subtracted, the
/// exponentials multiplied with the values, then divided by their sum). None where it does
/// not apply (a mask, heads not grouped, 16-bit types, which the decomposition widens).
fn grouped_attention(
    types: &[TensorType],
    attributes: &[(String, AttrValue)],
    results: usize,
    decomposition: &Region,
) -> BuildResult<Option<Region>> {
    let [q, k, v] = types else { return Ok(None) };
    let rank = q.rank();
    if rank < 3 || k.rank() != rank || v.rank() != rank || q.elem != DType::F32 {
        return Ok(None);
    }
    let (heads, groups) = (q.shape[rank - 3], k.shape[rank - 3]);
    if groups == heads || groups < 1 || heads % groups != 0 || v.shape[rank - 3] != groups {
        return Ok(None);
    }
    let (Some(AttrValue::F32(scale)), Some(AttrValue::Bool(causal))) = (
        attribute(attributes, "scale"),
        attribute(attributes, "causal"),
    ) else {
        return Ok(None);
    };
    let (scale, causal) = (f64::from(f32::from_bits(*scale)), *causal);
    // The decomposition's precision of float products (the option the program was lowered with).
    let precision = decomposition
        .func()
        .ops()
        .iter()
        .find_map(|op| match op.kind() {
            OpKind::DotGeneral { precision, .. } => Some(*precision),
            _ => None,
        })
        .unwrap_or(Precision::Highest);
    let batch = rank - 3;
    let (l, s) = (q.shape[rank - 2], k.shape[rank - 2]);
    let lead: Vec<i64> = q.shape[..batch].to_vec();
    let batched: Vec<i64> = (0..=batch as i64).collect();
    Builder::new()
        .region(types, |b, args| {
            let mut split = lead.clone();
            split.extend([groups, heads / groups, l, q.shape[rank - 1]]);
            let q5 = b.reshape(args[0], &split)?;
            // [.., KV, G, L, D] x [.., KV, S, D] -> [.., KV, G, L, S]
            let dims = DotDims {
                lhs_batch: batched.clone(),
                rhs_batch: batched.clone(),
                lhs_contracting: vec![batch as i64 + 3],
                rhs_contracting: vec![batch as i64 + 2],
            };
            let scores = b.dot_general(q5, args[1], dims, precision)?;
            let shape = b.shape(scores).to_vec();
            let mut scores = if scale == 1.0 {
                scores
            } else {
                let factor = b.splat(&TensorType::new(shape.clone(), DType::F32), scale);
                b.binary(BinaryOp::Mul, scores, factor)?
            };
            let last = shape.len() as i64 - 1;
            if causal {
                let rows = b.iota(TensorType::new(vec![l, s], DType::I64), 0)?;
                let cols = b.iota(TensorType::new(vec![l, s], DType::I64), 1)?;
                let keep = b.compare(CompareDir::Ge, rows, cols)?;
                let keep = b.broadcast_in_dim(keep, &shape, &[last - 1, last])?;
                let ninf = b.splat(
                    &TensorType::new(shape.clone(), DType::F32),
                    f64::NEG_INFINITY,
                );
                scores = b.select(keep, scores, ninf)?;
            }
            let kept: Vec<i64> = (0..last).collect();
            let max = b.reduce_by(scores, &[last], BinaryOp::Max)?;
            let max_b = b.broadcast_in_dim(max, &shape, &kept)?;
            let shifted = b.binary(BinaryOp::Sub, scores, max_b)?;
            let exp = b.unary(UnaryOp::Exp, shifted)?;
            let sum = b.reduce_by(exp, &[last], BinaryOp::Add)?;
            // [.., KV, G, L, S] x [.., KV, S, D] -> [.., KV, G, L, D]
            let dims = DotDims {
                lhs_batch: batched.clone(),
                rhs_batch: batched.clone(),
                lhs_contracting: vec![last],
                rhs_contracting: vec![batch as i64 + 1],
            };
            let weighted = b.dot_general(exp, args[2], dims, precision)?;
            let out_shape = b.shape(weighted).to_vec();
            let sum_b = b.broadcast_in_dim(sum, &out_shape, &kept)?;
            let out = b.binary(BinaryOp::Div, weighted, sum_b)?;
            let out = b.reshape(out, &q.shape)?;
            if results == 1 {
                return Ok(vec![out]);
            }
            // The log-sum-exp of each row, [.., H, L].
            let log = b.unary(UnaryOp::Log, sum)?;
            let lse = b.binary(BinaryOp::Add, log, max)?;
            Ok(vec![out, b.reshape(lse, &q.shape[..rank - 1])?])
        })
        .map(Some)
}
