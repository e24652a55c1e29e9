//! The kernel registry for XLA:CPU (`Fusion::Kernels`): for a composite, a formulation written
//! for the plugin becomes its decomposition. The composite stays, so its name reaches every
//! dump and every backend. (tools/bench_fusion.py measures each against the ops matched; the
//! grouped attention below is as fast at 24 layers, 0.99x, and saves the repeated copies.)
//!
//! - `tpuc.attention` over grouped keys and values (fewer heads than the query, no mask): the
//!   query's heads split into their groups and multiplied with their key/value head as one
//!   batched product, instead of copies of each key/value head made for every query head.
//! - `tpuc.attention` over 1024 keys or more (a multiple of 256, no mask): in blocks of 256
//!   keys with an online softmax, so that the scores held at once grow linearly with the
//!   sequence, not with its square (grouped as above when the heads are).

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
        let chosen = match (name == ATTENTION)
            .then(|| Attention::of(&types, attributes, results, decomposition))
            .flatten()
        {
            Some(a) if a.keys >= BLOCKED_FROM && a.keys % KEY_BLOCK == 0 => {
                Some(a.blocked(&types)?)
            }
            Some(a) if a.groups != a.heads => Some(a.grouped(&types)?),
            _ => None,
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

/// Keys from which attention is computed in blocks (`Attention::blocked`), and the block.
const BLOCKED_FROM: i64 = 1024;
const KEY_BLOCK: i64 = 256;

/// An attention composite the registry computes: `q` [.., H, L, D] over `k`, `v` [.., KV, S,
/// D] (H a multiple of KV), float32, no mask operand, its scale and whether it is causal
/// (top-left aligned, as torch's `is_causal`), the precision of its products and whether it
/// returns the rows' log-sum-exp too (the flash attention of training).
struct Attention {
    batch: usize,
    heads: i64,
    groups: i64,
    queries: i64,
    keys: i64,
    scale: f64,
    causal: bool,
    precision: Precision,
    with_lse: bool,
}

impl Attention {
    fn of(
        types: &[TensorType],
        attributes: &[(String, AttrValue)],
        results: usize,
        decomposition: &Region,
    ) -> Option<Attention> {
        let [q, k, v] = types else { return None };
        let rank = q.rank();
        if rank < 3 || k.rank() != rank || v.rank() != rank || q.elem != DType::F32 || results > 2 {
            return None;
        }
        let (heads, groups) = (q.shape[rank - 3], k.shape[rank - 3]);
        if groups < 1 || heads % groups != 0 || v.shape[rank - 3] != groups {
            return None;
        }
        let (Some(AttrValue::F32(scale)), Some(AttrValue::Bool(causal))) = (
            attribute(attributes, "scale"),
            attribute(attributes, "causal"),
        ) else {
            return None;
        };
        // The decomposition's precision of float products (the option the program was lowered
        // with).
        let precision = decomposition
            .func()
            .ops()
            .iter()
            .find_map(|op| match op.kind() {
                OpKind::DotGeneral { precision, .. } => Some(*precision),
                _ => None,
            })
            .unwrap_or(Precision::Highest);
        Some(Attention {
            batch: rank - 3,
            heads,
            groups,
            queries: q.shape[rank - 2],
            keys: k.shape[rank - 2],
            scale: f64::from(f32::from_bits(*scale)),
            causal: *causal,
            precision,
            with_lse: results == 2,
        })
    }

    /// The query `[.., H, L, D]` as `[.., KV, H/KV, L, D]`.
    fn grouped_shape(&self, q: &TensorType) -> Vec<i64> {
        let mut split = q.shape[..self.batch].to_vec();
        split.extend([
            self.groups,
            self.heads / self.groups,
            self.queries,
            q.shape[self.batch + 2],
        ]);
        split
    }

    /// Products batched over the leading dimensions and the key/value heads, contracting
    /// `lhs` and `rhs`: the grouped query `[.., KV, G, L, D]` with keys `[.., KV, S, D]`
    /// (`scores_dims`), weights `[.., KV, G, L, S]` with values `[.., KV, S, D]` (`values_dims`).
    fn batched_dims(&self, lhs: usize, rhs: usize) -> DotDims {
        let batched: Vec<i64> = (0..=self.batch as i64).collect();
        DotDims {
            lhs_batch: batched.clone(),
            rhs_batch: batched,
            lhs_contracting: vec![(self.batch + lhs) as i64],
            rhs_contracting: vec![(self.batch + rhs) as i64],
        }
    }

    fn scores_dims(&self) -> DotDims {
        self.batched_dims(3, 2)
    }

    fn values_dims(&self) -> DotDims {
        self.batched_dims(3, 1)
    }

    /// `scores` scaled, and where causal, `-inf` past each query's position (`first_key`: the
    /// position of the scores' first column, an i64 scalar; None for 0).
    fn scaled_and_masked(
        &self,
        b: &mut Builder,
        scores: crate::ir::Value,
        first_key: Option<crate::ir::Value>,
    ) -> BuildResult<crate::ir::Value> {
        let shape = b.shape(scores).to_vec();
        let mut scores = if self.scale == 1.0 {
            scores
        } else {
            let factor = b.splat(&TensorType::new(shape.clone(), DType::F32), self.scale);
            b.binary(BinaryOp::Mul, scores, factor)?
        };
        if self.causal {
            let last = shape.len() as i64 - 1;
            let (rows, columns) = (shape[shape.len() - 2], shape[shape.len() - 1]);
            let square = TensorType::new(vec![rows, columns], DType::I64);
            let row = b.iota(square.clone(), 0)?;
            let mut column = b.iota(square, 1)?;
            if let Some(first) = first_key {
                let first = b.broadcast_in_dim(first, &[rows, columns], &[])?;
                column = b.binary(BinaryOp::Add, column, first)?;
            }
            let keep = b.compare(CompareDir::Ge, row, column)?;
            let keep = b.broadcast_in_dim(keep, &shape, &[last - 1, last])?;
            let ninf = b.splat(
                &TensorType::new(shape.clone(), DType::F32),
                f64::NEG_INFINITY,
            );
            scores = b.select(keep, scores, ninf)?;
        }
        Ok(scores)
    }

    /// Attention as one batched product per group of query heads: the softmax as the
    /// decomposition computes it (the row maximum subtracted, the exponentials multiplied with
    /// the values, then divided by their sum).
    fn grouped(&self, types: &[TensorType]) -> BuildResult<Region> {
        let q = &types[0];
        let last = self.batch as i64 + 3;
        let kept: Vec<i64> = (0..last).collect();
        Builder::new().region(types, |b, args| {
            let q5 = b.reshape(args[0], &self.grouped_shape(q))?;
            // [.., KV, G, L, D] x [.., KV, S, D] -> [.., KV, G, L, S]
            let scores = b.dot_general(q5, args[1], self.scores_dims(), self.precision)?;
            let scores = self.scaled_and_masked(b, scores, None)?;
            let shape = b.shape(scores).to_vec();
            let max = b.reduce_by(scores, &[last], BinaryOp::Max)?;
            let max_b = b.broadcast_in_dim(max, &shape, &kept)?;
            let shifted = b.binary(BinaryOp::Sub, scores, max_b)?;
            let exp = b.unary(UnaryOp::Exp, shifted)?;
            let sum = b.reduce_by(exp, &[last], BinaryOp::Add)?;
            // [.., KV, G, L, S] x [.., KV, S, D] -> [.., KV, G, L, D]
            let weighted = b.dot_general(exp, args[2], self.values_dims(), self.precision)?;
            self.finish(b, q, weighted, max, sum)
        })
    }

    /// The output `weighted / sum` as the query's shape, and, for training's flash attention,
    /// each row's log-sum-exp `max + log(sum)`, `[.., H, L]`.
    fn finish(
        &self,
        b: &mut Builder,
        q: &TensorType,
        weighted: crate::ir::Value,
        max: crate::ir::Value,
        sum: crate::ir::Value,
    ) -> BuildResult<Vec<crate::ir::Value>> {
        let out_shape = b.shape(weighted).to_vec();
        let kept: Vec<i64> = (0..self.batch as i64 + 3).collect();
        let sum_b = b.broadcast_in_dim(sum, &out_shape, &kept)?;
        let out = b.binary(BinaryOp::Div, weighted, sum_b)?;
        let out = b.reshape(out, &q.shape)?;
        if !self.with_lse {
            return Ok(vec![out]);
        }
        let log = b.unary(UnaryOp::Log, sum)?;
        let lse = b.binary(BinaryOp::Add, log, max)?;
        Ok(vec![out, b.reshape(lse, &q.shape[..q.rank() - 1])?])
    }

    /// Attention over the keys in blocks of `KEY_BLOCK`, with an online softmax: a loop whose
    /// step multiplies the query with one block of keys, keeps each row's running maximum `m`
    /// and sum of exponentials `l`, and adds the block's weighted values into `acc`, the
    /// earlier sums rescaled by `exp(m_old - m_new)`. The scores held at once are `[.., L,
    /// KEY_BLOCK]` instead of `[.., L, S]`, so memory grows linearly with the keys.
    fn blocked(&self, types: &[TensorType]) -> BuildResult<Region> {
        let (q, k) = (&types[0], &types[1]);
        let batch = self.batch;
        let last = batch as i64 + 3;
        let kept: Vec<i64> = (0..last).collect();
        let q5_shape = self.grouped_shape(q);
        let rows: Vec<i64> = q5_shape[..batch + 3].to_vec();
        let mut acc_shape = rows.clone();
        acc_shape.push(q.shape[batch + 2]);
        let mut block_shape = k.shape.clone();
        block_shape[batch + 1] = KEY_BLOCK;
        let steps = self.keys / KEY_BLOCK;
        Builder::new().region(types, |b, args| {
            let q5 = b.reshape(args[0], &q5_shape)?;
            let f32s = |shape: &[i64]| TensorType::new(shape.to_vec(), DType::F32);
            let m0 = b.splat(&f32s(&rows), f64::NEG_INFINITY);
            let l0 = b.splat(&f32s(&rows), 0.0);
            let acc0 = b.splat(&f32s(&acc_shape), 0.0);
            let step0 = b.scalar(DType::I64, 0.0);
            let init = [step0, m0, l0, acc0, q5, args[1], args[2]];
            let done = b.while_loop(
                &init,
                |b, v| {
                    let steps = b.scalar(DType::I64, steps as f64);
                    b.compare(CompareDir::Lt, v[0], steps)
                },
                |b, v| {
                    let (step, m, l, acc, q5, k, vals) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
                    let block = b.scalar(DType::I64, KEY_BLOCK as f64);
                    let first = b.binary(BinaryOp::Mul, step, block)?;
                    let zero = b.scalar(DType::I64, 0.0);
                    let mut starts = vec![zero; batch + 3];
                    starts[batch + 1] = first;
                    let k_block = b.dynamic_slice(k, &starts, &block_shape)?;
                    let v_block = b.dynamic_slice(vals, &starts, &block_shape)?;
                    let scores = b.dot_general(q5, k_block, self.scores_dims(), self.precision)?;
                    let scores = self.scaled_and_masked(b, scores, Some(first))?;
                    let shape = b.shape(scores).to_vec();
                    let block_max = b.reduce_by(scores, &[last], BinaryOp::Max)?;
                    let m_new = b.binary(BinaryOp::Max, m, block_max)?;
                    let m_new_b = b.broadcast_in_dim(m_new, &shape, &kept)?;
                    let shifted = b.binary(BinaryOp::Sub, scores, m_new_b)?;
                    let p = b.unary(UnaryOp::Exp, shifted)?;
                    // How much the sums so far shrink under the new maximum.
                    let drop = b.binary(BinaryOp::Sub, m, m_new)?;
                    let rescale = b.unary(UnaryOp::Exp, drop)?;
                    let l_old = b.binary(BinaryOp::Mul, l, rescale)?;
                    let block_sum = b.reduce_by(p, &[last], BinaryOp::Add)?;
                    let l_new = b.binary(BinaryOp::Add, l_old, block_sum)?;
                    let rescale_b = b.broadcast_in_dim(rescale, &acc_shape, &kept)?;
                    let acc_old = b.binary(BinaryOp::Mul, acc, rescale_b)?;
                    let weighted = b.dot_general(p, v_block, self.values_dims(), self.precision)?;
                    let acc_new = b.binary(BinaryOp::Add, acc_old, weighted)?;
                    let one = b.scalar(DType::I64, 1.0);
                    let next = b.binary(BinaryOp::Add, step, one)?;
                    Ok(vec![next, m_new, l_new, acc_new, q5, k, vals])
                },
            )?;
            self.finish(b, q, done[3], done[1], done[2])
        })
    }
}
