//! The kernel registry for XLA:CPU (`Fusion::Kernels`): for a composite, a formulation written
//! for the plugin becomes its decomposition. The composite stays, so its name reaches every
//! dump and every backend. (tools/bench_fusion.py measures each against the ops matched; the
//! grouped attention below is as fast at 24 layers, 0.99x, and saves the repeated copies.)
//!
//! - `tpuc.attention` over grouped keys and values (fewer heads than the query, no mask): the
//!   query's heads split into their groups and multiplied with their key/value head as one
//!   batched product, instead of copies of each key/value head made for every query head.
//! - causal `tpuc.attention`: the mask computed from positions (an iota comparison) inside the
//!   product's consumer, instead of a stored mask (the constant a model keeps, or the one
//!   constant folding makes of torch's `is_causal`) read from memory.
//! - `tpuc.attention` over 1024 keys or more (a multiple of 256, no mask but a causal one):
//!   in blocks of 256 keys with an online softmax, so that the scores held at once grow
//!   linearly with the sequence, not with its square (grouped as above when the heads are).
//!
//! Which operand is the query, the keys and the values is read off the decomposition's two
//! products (`Roles`): a composite of written-out attention takes the keys transposed, and
//! one whose keys are its values takes them once.

use super::attention::ATTENTION;
use crate::ir::{
    AttrValue, BinaryOp, BuildResult, Builder, CompareDir, DType, DotDims, Func, OpKind, Precision,
    Region, TensorType, UnaryOp, Value,
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
            Some(a) if a.groups != a.heads || a.causal => Some(a.grouped(&types)?),
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

/// Which of an attention composite's operands are its query `[.., H, L, D]`, keys and values
/// (one operand when the keys are the values), and whether the keys come transposed (`[.., D,
/// S]`, as written-out attention multiplies them), read off its decomposition: the scores the
/// product of the query with the keys (or with their heads repeated for grouped query heads),
/// the output the product of the scores' softmax with the values (so repeated). Any other
/// operand is a mask.
#[derive(Debug, PartialEq)]
struct Roles {
    query: usize,
    keys: usize,
    values: usize,
    keys_transposed: bool,
}

impl Roles {
    fn read(f: &Func) -> Option<Roles> {
        let defining = f.defining_ops();
        let products: Vec<(&[Value], &DotDims)> = f
            .ops()
            .iter()
            .filter_map(|op| match op.kind() {
                OpKind::DotGeneral { dims, .. } => Some((op.operands(), dims)),
                _ => None,
            })
            .collect();
        let [(scores, scores_dims), (output, output_dims)] = products[..] else {
            return None;
        };
        let arg = |v: Value| f.args().iter().position(|&a| a == v);
        let rank = f.ty(scores[0]).rank();
        let leading: Vec<i64> = (0..rank as i64 - 2).collect();
        let (last, next_to_last) = (rank as i64 - 1, rank as i64 - 2);
        let batched = |d: &DotDims| d.lhs_batch == leading && d.rhs_batch == leading;
        if rank < 2 || !batched(scores_dims) || !batched(output_dims) {
            return None;
        }
        let query = arg(scores[0])?;
        let contracted = (
            &scores_dims.lhs_contracting[..],
            &scores_dims.rhs_contracting[..],
        );
        let (keys, keys_transposed) = match (arg(scores[1]), contracted) {
            // `q @ k` of keys stored transposed.
            (Some(k), ([l], [r])) if (*l, *r) == (last, next_to_last) => (k, true),
            // `q @ transpose(k)` (torch's attention as lowered), or keys given as `[.., S, D]`.
            (Some(k), ([l], [r])) if (*l, *r) == (last, last) => (k, false),
            (None, ([l], [r])) if (*l, *r) == (last, next_to_last) => {
                let (_, transposed) = defined(f, &defining, scores[1])?;
                let mut swap: Vec<i64> = (0..rank as i64).collect();
                swap.swap(rank - 2, rank - 1);
                match transposed.kind() {
                    OpKind::Transpose { perm } if *perm == swap => {}
                    _ => return None,
                }
                (
                    arg(repeated(f, &defining, transposed.operands()[0]))?,
                    false,
                )
            }
            _ => return None,
        };
        let values = arg(repeated(f, &defining, output[1]))?;
        let contracts_rows = (
            &output_dims.lhs_contracting[..],
            &output_dims.rhs_contracting[..],
        ) == (&[last][..], &[next_to_last][..]);
        contracts_rows.then_some(Roles {
            query,
            keys,
            values,
            keys_transposed,
        })
    }
}

/// [`Roles::read`] as `(query, keys, values, keys transposed)`, for the tests.
#[cfg(test)]
pub(super) fn roles(f: &Func) -> Option<(usize, usize, usize, bool)> {
    Roles::read(f).map(|r| (r.query, r.keys, r.values, r.keys_transposed))
}

/// The op defining `v` in `f`, with its index.
fn defined<'f>(
    f: &'f Func,
    defining: &[Option<usize>],
    v: Value,
) -> Option<(usize, &'f crate::ir::Op)> {
    let i = (*defining.get(v.index())?)?;
    Some((i, &f.ops()[i]))
}

/// What `v` repeats head by head as torch's grouped attention is lowered (`[.., KV, S, D]`
/// viewed `[.., KV, 1, S, D]`, broadcast along the new dimension, viewed `[.., H, S, D]`: each
/// key/value head serving consecutive query heads), else `v`.
fn repeated(f: &Func, defining: &[Option<usize>], v: Value) -> Value {
    let chain = || {
        let (_, merged) = defined(f, defining, v)?;
        let (_, wide) = defined(f, defining, merged.operands().first().copied()?)?;
        let (_, split) = defined(f, defining, wide.operands().first().copied()?)?;
        let x = split.operands().first().copied()?;
        let (OpKind::Reshape { .. }, OpKind::BroadcastInDim { dims, .. }, OpKind::Reshape { .. }) =
            (merged.kind(), wide.kind(), split.kind())
        else {
            return None;
        };
        let shape = &f.ty(x).shape;
        let rank = shape.len();
        let mut unit = shape.clone();
        unit.insert(rank.checked_sub(2)?, 1);
        let identity: Vec<i64> = (0..=rank as i64).collect();
        (f.ty(wide.operands()[0]).shape == unit && *dims == identity).then_some(x)
    };
    chain().unwrap_or(v)
}

/// An attention composite the registry computes: `q` [.., H, L, D] over `k`, `v` [.., KV, S,
/// D] (H a multiple of KV; `roles` says which operands they are), float32, its scale and
/// whether it is causal (top-left aligned, as torch's `is_causal`), the precision of its
/// products and whether it returns the rows' log-sum-exp too (the flash attention of
/// training). A mask operand is taken only with `causal`, the mask then hiding exactly what
/// `causal` does (the fusion stage read it so).
struct Attention {
    roles: Roles,
    query: TensorType,
    key_shape: Vec<i64>,
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
        let roles = Roles::read(decomposition.func())?;
        let (q, v) = (&types[roles.query], &types[roles.values]);
        let mut k = types[roles.keys].clone();
        let rank = q.rank();
        if roles.keys_transposed && k.rank() >= 2 {
            let r = k.rank();
            k.shape.swap(r - 2, r - 1);
        }
        let (Some(AttrValue::F32(scale)), Some(AttrValue::Bool(causal))) = (
            attribute(attributes, "scale"),
            attribute(attributes, "causal"),
        ) else {
            return None;
        };
        let masks = (0..types.len())
            .filter(|i| ![roles.query, roles.keys, roles.values].contains(i))
            .count();
        if rank < 3
            || k.rank() != rank
            || v.rank() != rank
            || [q.elem, k.elem, v.elem] != [DType::F32; 3]
            || results > 2
            || masks > usize::from(*causal)
            || k.shape[rank - 1] != q.shape[rank - 1]
            || v.shape[rank - 1] != q.shape[rank - 1]
            || v.shape[rank - 2] != k.shape[rank - 2]
        {
            return None;
        }
        let (heads, groups) = (q.shape[rank - 3], k.shape[rank - 3]);
        if groups < 1 || heads % groups != 0 || v.shape[rank - 3] != groups {
            return None;
        }
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
            query: q.clone(),
            key_shape: k.shape.clone(),
            roles,
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

    /// The region's query, keys `[.., KV, S, D]` (transposed back where the composite takes
    /// them transposed) and values.
    fn inputs(&self, b: &mut Builder, args: &[Value]) -> BuildResult<[Value; 3]> {
        let mut keys = args[self.roles.keys];
        if self.roles.keys_transposed {
            let rank = self.key_shape.len();
            let mut swap: Vec<i64> = (0..rank as i64).collect();
            swap.swap(rank - 2, rank - 1);
            keys = b.transpose(keys, &swap)?;
        }
        Ok([args[self.roles.query], keys, args[self.roles.values]])
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
        scores: Value,
        first_key: Option<Value>,
    ) -> BuildResult<Value> {
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
        let q = &self.query;
        let last = self.batch as i64 + 3;
        let kept: Vec<i64> = (0..last).collect();
        Builder::new().region(types, |b, args| {
            let [query, keys, values] = self.inputs(b, args)?;
            let q5 = b.reshape(query, &self.grouped_shape(q))?;
            // [.., KV, G, L, D] x [.., KV, S, D] -> [.., KV, G, L, S]
            let scores = b.dot_general(q5, keys, self.scores_dims(), self.precision)?;
            let scores = self.scaled_and_masked(b, scores, None)?;
            let shape = b.shape(scores).to_vec();
            let max = b.reduce_by(scores, &[last], BinaryOp::Max)?;
            let max_b = b.broadcast_in_dim(max, &shape, &kept)?;
            let shifted = b.binary(BinaryOp::Sub, scores, max_b)?;
            let exp = b.unary(UnaryOp::Exp, shifted)?;
            let sum = b.reduce_by(exp, &[last], BinaryOp::Add)?;
            // [.., KV, G, L, S] x [.., KV, S, D] -> [.., KV, G, L, D]
            let weighted = b.dot_general(exp, values, self.values_dims(), self.precision)?;
            self.finish(b, q, weighted, max, sum)
        })
    }

    /// The output `weighted / sum` as the query's shape, and, for training's flash attention,
    /// each row's log-sum-exp `max + log(sum)`, `[.., H, L]`.
    fn finish(
        &self,
        b: &mut Builder,
        q: &TensorType,
        weighted: Value,
        max: Value,
        sum: Value,
    ) -> BuildResult<Vec<Value>> {
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
        let q = &self.query;
        let batch = self.batch;
        let last = batch as i64 + 3;
        let kept: Vec<i64> = (0..last).collect();
        let q5_shape = self.grouped_shape(q);
        let rows: Vec<i64> = q5_shape[..batch + 3].to_vec();
        let mut acc_shape = rows.clone();
        acc_shape.push(q.shape[batch + 2]);
        let mut block_shape = self.key_shape.clone();
        block_shape[batch + 1] = KEY_BLOCK;
        let steps = self.keys / KEY_BLOCK;
        Builder::new().region(types, |b, args| {
            let [query, keys, values] = self.inputs(b, args)?;
            let q5 = b.reshape(query, &q5_shape)?;
            let f32s = |shape: &[i64]| TensorType::new(shape.to_vec(), DType::F32);
            let m0 = b.splat(&f32s(&rows), f64::NEG_INFINITY);
            let l0 = b.splat(&f32s(&rows), 0.0);
            let acc0 = b.splat(&f32s(&acc_shape), 0.0);
            let step0 = b.scalar(DType::I64, 0.0);
            let init = [step0, m0, l0, acc0, q5, keys, values];
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
