//! Attention: the lowering of torch's attention ops makes the `tpuc.attention` composite itself
//! (`lower::linear`); here its keys and values, when the model repeats their heads for
//! grouped-query attention (`repeat_interleave` or `expand` then `reshape`: the same ops once
//! lowered), are taken before the repeat, which moves into the decomposition, so that a kernel
//! sees the grouped heads. Attention a model writes out op by op is matched too
//! ([`written_out`]).

use super::{Defs, Match};
use crate::ir::{AttrValue, BinaryOp, BuildResult, Func, Op, OpKind, Rewriter, Value};
use crate::passes::fold::{elements_of, Elems};

pub(super) const ATTENTION: &str = "tpuc.attention";

/// `f` with each attention composite reading its keys and values before their heads were
/// repeated; None when there is none to change.
pub(super) fn absorb_repeated_heads(f: &Func) -> BuildResult<Option<Func>> {
    let defs = Defs::new(f);
    let uses = use_counts(f);
    let mut found = Vec::new();
    for (i, op) in f.ops().iter().enumerate() {
        let Some((name, _, _)) = op.kind().composite() else {
            continue;
        };
        if name != ATTENTION || op.operands().len() < 3 {
            continue;
        }
        let repeats: Vec<Option<Repeat>> = op.operands()[1..3]
            .iter()
            .map(|&kv| repeat(&defs, kv).filter(|r| r.only_here(&uses)))
            .collect();
        if repeats.iter().any(Option::is_some) {
            found.push((i, repeats));
        }
    }
    if found.is_empty() {
        return Ok(None);
    }
    let mut rw = Rewriter::new(f);
    for (i, op) in f.ops().iter().enumerate() {
        let Some((_, repeats)) = found.iter().find(|(at, _)| *at == i) else {
            rw.copy(op)?;
            continue;
        };
        rw.at(op);
        let Some((_, _, decomposition)) = op.kind().composite() else {
            unreachable!("found at a composite");
        };
        // The composite's operands, the keys and values before their repeat.
        let mut new: Vec<Value> = op.operands().iter().map(|&v| rw.value(v)).collect();
        for (k, r) in repeats.iter().enumerate() {
            if let Some(r) = r {
                let source = rw.value(r.source);
                new[1 + k] = rw.builder().reshape(source, &r.grouped)?;
            }
        }
        let types: Vec<_> = new.iter().map(|&v| rw.builder().ty(v).clone()).collect();
        let inner = decomposition.func();
        let region = rw.builder().region(&types, |b, args| {
            let mut passed = args.to_vec();
            for (k, r) in repeats.iter().enumerate() {
                if let Some(r) = r {
                    passed[1 + k] = r.rebuild(f, b, args[1 + k])?;
                }
            }
            b.inline(inner, &passed)
        })?;
        let results = rw
            .builder()
            .op(op.kind().with_regions(vec![region]), &new)?;
        for (&old, new) in op.results().iter().zip(results) {
            rw.bind(old, new)?;
        }
    }
    Ok(Some(rw.finish()))
}

/// Keys or values whose heads a model repeated: `reshape(broadcast(reshape(source)))`, the first
/// reshape making a dimension of one after the heads (`[.., kv, 1, s, d]`, from any shape of as
/// many elements: canonical forms merge it with the views before), the broadcast repeating
/// along it, the last merging the repeats into the heads.
struct Repeat {
    source: Value,
    /// The keys' or values' shape with their own heads, `[.., kv, s, d]`.
    grouped: Vec<i64>,
    ops: [usize; 3],
}

impl Repeat {
    /// Whether only the next op of the chain (and the composite, for the last) reads each.
    fn only_here(&self, uses: &[usize]) -> bool {
        self.ops.iter().all(|&i| uses[i] == 1)
    }

    /// The chain again on `b`, from `grouped` (standing for `self.grouped`).
    fn rebuild(&self, f: &Func, b: &mut crate::ir::Builder, grouped: Value) -> BuildResult<Value> {
        let mut v = grouped;
        for &i in &self.ops {
            let op: &Op = &f.ops()[i];
            v = b.op(op.kind().clone(), &[v])?[0];
        }
        Ok(v)
    }
}

fn repeat(defs: &Defs, kv: Value) -> Option<Repeat> {
    let f = defs.func();
    let (merge, wide) = defs.reshape(kv)?;
    let (spread, one, dims) = defs.broadcast(wide)?;
    let (split, source) = defs.reshape(one)?;
    let (o, w, k) = (f.ty(one), f.ty(wide), f.ty(kv));
    // [.., kv, 1, s, d] -> [.., kv, n, s, d] -> [.., kv * n, s, d]
    let rank = k.rank();
    let heads = rank.checked_sub(3)?;
    let mut grouped = o.shape.clone();
    if o.rank() != rank + 1 || grouped.remove(heads + 1) != 1 {
        return None;
    }
    let identity: Vec<i64> = (0..o.rank() as i64).collect();
    let fits = dims == identity
        && w.shape[..=heads] == grouped[..=heads]
        && w.shape[heads + 2..] == grouped[heads + 1..]
        && k.shape[heads] == grouped[heads] * w.shape[heads + 1]
        && k.shape[..heads] == grouped[..heads]
        && k.shape[heads + 1..] == grouped[heads + 1..];
    fits.then_some(Repeat {
        source,
        grouped,
        ops: [split, spread, merge],
    })
}

/// How many ops (and results) read each op's results, by op index.
fn use_counts(f: &Func) -> Vec<usize> {
    let defining = f.defining_ops();
    let mut uses = vec![0; f.ops().len()];
    let reads = f
        .ops()
        .iter()
        .flat_map(|op| op.operands().iter())
        .chain(f.results());
    for v in reads {
        if let Some(Some(i)) = defining.get(v.index()) {
            uses[*i] += 1;
        }
    }
    uses
}

/// Attention a model writes out (minGPT, Hugging Face's eager attention): `softmax(scores) @ v`,
/// the scores `q @ k^T` scaled by a constant (a division or a product; none is a scale of 1),
/// then masked by a boolean mask filling `-inf` or by an additive mask (`causal` when the mask
/// is a constant hiding exactly what lies after each query's position), views allowed between
/// the steps. The root is the product with the values; the product's factors, the values and
/// the mask are the composite's operands.
pub(super) fn written_out(defs: &Defs, root: usize) -> Option<Match> {
    let f = defs.func();
    let op = &f.ops()[root];
    let OpKind::DotGeneral { .. } = op.kind() else {
        return None;
    };
    let mut ops = vec![root];
    let probabilities = through_reshape(defs, op.operands()[0], &mut ops);
    let (softmax, softmax_op) = defs.op(probabilities)?;
    match softmax_op.kind().composite() {
        Some((SOFTMAX, attributes, _))
            if attributes.iter().any(|(k, v)| {
                k == "dim" && *v == AttrValue::I64(f.ty(probabilities).rank() as i64 - 1)
            }) => {}
        _ => return None,
    }
    ops.push(softmax);
    let mut scores = softmax_op.operands()[0];
    // The mask: a constant one filling -inf where it holds, or an added one.
    let mut causal = false;
    if let Some((at, select)) = defs.op(scores).filter(|(_, o)| *o.kind() == OpKind::Select) {
        let (hidden, fill, kept) = (
            select.operands()[0],
            select.operands()[1],
            select.operands()[2],
        );
        let (fill_ops, value) = defs.constant(fill)?;
        if value != f64::NEG_INFINITY {
            return None;
        }
        // The mask stays an operand (a model may compute it once for every layer); what it
        // holds is read where it is a constant.
        causal = mask_matrix(defs, hidden, boolean_mask).is_some_and(|m| hides_the_future(&m));
        ops.extend([vec![at], fill_ops].concat());
        scores = kept;
    } else if let Some((at, a, b)) = defs.binary(scores, BinaryOp::Add) {
        // The scores are the product's side; the other is the mask: a constant one of zeros
        // and a very negative number (Hugging Face's causal masks, folded) is read, any other
        // is an operand.
        let product_side = |v: Value| scaled_product(defs, v).is_some();
        let mask;
        (scores, mask) = if product_side(a) {
            (a, b)
        } else if product_side(b) {
            (b, a)
        } else {
            return None;
        };
        ops.push(at);
        causal = mask_matrix(defs, mask, additive_mask).is_some_and(|m| hides_the_future(&m));
    }
    let (scale_ops, scale, product) = scaled_product(defs, scores)?;
    ops.extend(scale_ops);
    let raw = through_reshape(defs, product, &mut ops);
    let (dot, _) = defs.op(raw)?;
    ops.push(dot);
    Some(
        Match::new(f, ops, ATTENTION)
            .with("scale", AttrValue::f32(scale as f32))
            .with("causal", AttrValue::Bool(causal)),
    )
}

const SOFTMAX: &str = "tpuc.softmax";

/// `v`, or what a chain of reshapes made it of (their ops added to `ops`).
fn through_reshape(defs: &Defs, mut v: Value, ops: &mut Vec<usize>) -> Value {
    while let Some((at, x)) = defs.reshape(v) {
        ops.push(at);
        v = x;
    }
    v
}

/// `v` as a product's result (`dot_general`, maybe reshaped) scaled by a constant: the scaling's
/// ops, the scale, the product's value (before its reshapes).
fn scaled_product(defs: &Defs, v: Value) -> Option<(Vec<usize>, f64, Value)> {
    let is_product = |v: Value| {
        let x = through_reshape(defs, v, &mut Vec::new());
        defs.op(x)
            .is_some_and(|(_, o)| matches!(o.kind(), OpKind::DotGeneral { .. }))
            .then_some(v)
    };
    if let Some((at, a, b)) = defs.binary(v, BinaryOp::Div) {
        let (ops, c) = scalar(defs, b)?;
        let product = is_product(a)?;
        return Some(([vec![at], ops].concat(), 1.0 / c, product));
    }
    if let Some((at, a, b)) = defs.binary(v, BinaryOp::Mul) {
        let ((ops, c), swapped) = super::either(a, b, |_, c| scalar(defs, c))?;
        let product = is_product(if swapped { b } else { a })?;
        return Some(([vec![at], ops].concat(), c, product));
    }
    Some((Vec::new(), 1.0, is_product(v)?))
}

/// A float constant of one value, seen through an optimization barrier the lowering keeps a
/// Python number's rounding with.
fn scalar(defs: &Defs, v: Value) -> Option<(Vec<usize>, f64)> {
    if let Some(found) = defs.constant(v) {
        return Some(found);
    }
    let (at, o) = defs.op(v)?;
    match o.kind() {
        OpKind::BroadcastInDim { .. } | OpKind::OptimizationBarrier => {
            let (ops, c) = scalar(defs, o.operands()[0])?;
            Some(([vec![at], ops].concat(), c))
        }
        _ => None,
    }
}

/// What a constant mask hides over its last two dimensions, `hidden[query][key]`, seen through
/// broadcasts along its leading dimensions (batch, heads), the constant itself read by `leaf`;
/// None when the mask is no constant or varies along other dimensions.
fn mask_matrix(
    defs: &Defs,
    v: Value,
    leaf: fn(&Defs, Value) -> Option<Vec<Vec<bool>>>,
) -> Option<Vec<Vec<bool>>> {
    let (_, o) = defs.op(v)?;
    match o.kind() {
        OpKind::BroadcastInDim { dims, .. }
            if keeps_the_matrix(defs.func(), v, o.operands()[0], dims) =>
        {
            mask_matrix(defs, o.operands()[0], leaf)
        }
        _ => leaf(defs, v),
    }
}

/// The largest mask read (elements): 2048 queries by 2048 keys. A larger one stays an operand
/// of contents unread (not `causal`).
const MASK_READ_LIMIT: usize = 1 << 22;

/// A boolean mask computed from constants alone (folded, or computed from positions as a
/// model's `triu` is): where it is true.
fn boolean_mask(defs: &Defs, v: Value) -> Option<Vec<Vec<bool>>> {
    match elements_of(defs.func(), v, MASK_READ_LIMIT)? {
        Elems::Bool(hidden) => square(defs.func().ty(v), &hidden),
        _ => None,
    }
}

/// A float32 mask computed from constants alone, added to scores, of zeros and numbers at most
/// -1e30 (hiding what they are added to): where it hides.
fn additive_mask(defs: &Defs, v: Value) -> Option<Vec<Vec<bool>>> {
    let ty = defs.func().ty(v);
    if ty.elem != crate::ir::DType::F32 {
        return None;
    }
    let Elems::Float(values) = elements_of(defs.func(), v, MASK_READ_LIMIT)? else {
        return None;
    };
    if values.iter().any(|&x| x != 0.0 && x > -1e30) {
        return None;
    }
    let hidden: Vec<bool> = values.iter().map(|&x| x != 0.0).collect();
    square(ty, &hidden)
}

/// Whether `v`, broadcast from `source` along `dims`, repeats whole matrices: `source`'s last
/// two dimensions are `v`'s, unchanged (a batch's or the heads' dimensions may grow).
fn keeps_the_matrix(f: &Func, v: Value, source: Value, dims: &[i64]) -> bool {
    let (to, from) = (f.ty(v), f.ty(source));
    let (rank, source_rank) = (to.rank(), from.rank());
    source_rank >= 2
        && dims[source_rank - 2..] == [rank as i64 - 2, rank as i64 - 1]
        && from.shape[source_rank - 2..] == to.shape[rank - 2..]
}

/// The matrix over the last two dimensions of a constant of `ty` (its elements `values`, one
/// standing for all), as rows of predicates; None unless every such matrix in it is the same.
fn square(ty: &crate::ir::TensorType, values: &[bool]) -> Option<Vec<Vec<bool>>> {
    let rank = ty.rank();
    if rank < 2 {
        return None;
    }
    let (rows, cols) = (ty.shape[rank - 2] as usize, ty.shape[rank - 1] as usize);
    let at = |i: usize| {
        values
            .get(if values.len() == 1 { 0 } else { i })
            .is_some_and(|&b| b)
    };
    let matrices = (ty.numel() as usize).checked_div(rows * cols)?;
    let first: Vec<Vec<bool>> = (0..rows)
        .map(|r| (0..cols).map(|c| at(r * cols + c)).collect())
        .collect();
    let all_alike = (1..matrices)
        .all(|m| (0..rows * cols).all(|i| at(m * rows * cols + i) == first[i / cols][i % cols]));
    all_alike.then_some(first)
}

/// Whether `hidden` hides exactly the keys after each query's position, query `r` at key
/// position `r`: the top-left alignment of torch's `is_causal`, which the composite's
/// `causal` means. (A cache's mask, its queries the last of the keys, is bottom-right aligned:
/// not `causal`, the mask operand still applying it.)
fn hides_the_future(hidden: &[Vec<bool>]) -> bool {
    !hidden.is_empty()
        && hidden
            .iter()
            .enumerate()
            .all(|(r, row)| row.iter().enumerate().all(|(c, &h)| h == (c > r)))
}
