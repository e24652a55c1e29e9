//! Attention: the lowering of torch's attention ops makes the `tpuc.attention` composite itself
//! (`lower::linear`); here its keys and values, when the model repeats their heads for
//! grouped-query attention (`repeat_interleave` or `expand` then `reshape`: the same ops once
//! lowered), are taken before the repeat, which moves into the decomposition, so that a kernel
//! sees the grouped heads.

use super::Defs;
use crate::ir::{BuildResult, Func, Op, Rewriter, Value};

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
