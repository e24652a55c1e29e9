//! Fusion: named patterns recognised in the lowered IR become `stablehlo.composite` ops named
//! `tpuc.<pattern>`, with typed attributes and a version, whose decomposition (a private
//! function of the module) is the ops matched. Nothing is computed differently: a backend that
//! knows a pattern's name may run a kernel of its own, XLA inlines one it does not know.
//!
//! A pattern is matched from its last op (the root) back through what it reads; the match is
//! outlined only when no value it computes on the way is read outside it.

mod attention;
mod kernels;
mod losses;
mod mlp;
mod norms;
mod rotary;

use std::collections::HashSet;

use crate::ir::{
    AttrValue, BinaryOp, BuildResult, DType, Func, Module, Op, OpKind, ReduceBody, Rewriter,
    UnaryOp, Value,
};

/// What the fusion stage does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fusion {
    /// Nothing: every op as lowered.
    #[default]
    None,
    /// Named patterns become composites whose decomposition is the ops matched.
    Patterns,
    /// As `Patterns`, each composite then computed by the formulation the registry holds for
    /// the plugin where it has one (`kernels.rs`).
    Kernels,
}

impl Fusion {
    pub const ALL: [Fusion; 3] = [Fusion::None, Fusion::Patterns, Fusion::Kernels];

    /// What the commands and the Python API use unless told: the choice measured best on
    /// XLA:CPU (tools/bench_fusion.py: no model slower than op by op, long attention 0.6x the
    /// time in a seventh of the memory). The library's own default, [`Fusion::default`], lowers
    /// op by op, so that its tests and golden modules read each op as lowered.
    pub const RECOMMENDED: Fusion = Fusion::Kernels;

    /// Whether patterns become composites.
    pub fn patterns(self) -> bool {
        self != Fusion::None
    }

    /// The name users write: `none`, `patterns`.
    pub const fn name(self) -> &'static str {
        match self {
            Fusion::None => "none",
            Fusion::Patterns => "patterns",
            Fusion::Kernels => "kernels",
        }
    }

    /// What it means, for help texts.
    pub fn description(self) -> &'static str {
        match self {
            Fusion::None => "Every op as lowered",
            Fusion::Patterns => {
                "Named patterns (RMSNorm, ...) as stablehlo.composite ops tpuc.<pattern>, \
                 computed by the ops matched"
            }
            Fusion::Kernels => {
                "As patterns, each computed by the formulation tpuc holds for the plugin where it \
                 has one (grouped-query attention as one batched product over head groups, long \
                 attention in blocks of keys)"
            }
        }
    }
}

impl std::str::FromStr for Fusion {
    type Err = String;

    fn from_str(s: &str) -> Result<Fusion, String> {
        Fusion::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("fusion must be none, patterns or kernels, not {s:?}"))
    }
}

/// A pattern recognised in a function: its ops (indices, in order, the root last), what they
/// read from outside, and the composite that stands for them.
#[derive(Clone, Debug, PartialEq)]
pub struct Match {
    pub ops: Vec<usize>,
    pub inputs: Vec<Value>,
    pub name: &'static str,
    pub attributes: Vec<(String, AttrValue)>,
}

/// The ops of a function by the values they define, to match patterns backwards.
pub struct Defs<'f> {
    f: &'f Func,
    by_value: Vec<Option<usize>>,
}

impl<'f> Defs<'f> {
    pub fn new(f: &'f Func) -> Defs<'f> {
        Defs {
            f,
            by_value: f.defining_ops(),
        }
    }

    pub fn func(&self) -> &'f Func {
        self.f
    }

    /// The op defining `v` and its index; None for an argument.
    pub fn op(&self, v: Value) -> Option<(usize, &'f Op)> {
        let i = (*self.by_value.get(v.index())?)?;
        Some((i, &self.f.ops()[i]))
    }
}

impl Match {
    /// A match of the ops `ops` (indices, the root last, any order before it), reading from
    /// outside what they read that they do not define, in the order first read.
    pub fn new(f: &Func, mut ops: Vec<usize>, name: &'static str) -> Match {
        ops.sort_unstable();
        ops.dedup();
        let defined: HashSet<Value> = ops
            .iter()
            .flat_map(|&i| f.ops()[i].results().iter().copied())
            .collect();
        let mut inputs = Vec::new();
        for &i in &ops {
            for &v in f.ops()[i].operands() {
                if !defined.contains(&v) && !inputs.contains(&v) {
                    inputs.push(v);
                }
            }
        }
        Match {
            ops,
            inputs,
            name,
            attributes: Vec::new(),
        }
    }

    pub fn with(mut self, key: &str, value: AttrValue) -> Match {
        self.attributes.push((key.to_string(), value));
        self
    }
}

impl Defs<'_> {
    /// `v = op(x)`: (its op's index, x).
    pub fn unary(&self, v: Value, op: UnaryOp) -> Option<(usize, Value)> {
        match self.op(v)? {
            (i, o) if *o.kind() == OpKind::Unary(op) => Some((i, o.operands()[0])),
            _ => None,
        }
    }

    /// `v = op(a, b)`: (its op's index, a, b).
    pub fn binary(&self, v: Value, op: BinaryOp) -> Option<(usize, Value, Value)> {
        match self.op(v)? {
            (i, o) if *o.kind() == OpKind::Binary(op) => {
                Some((i, o.operands()[0], o.operands()[1]))
            }
            _ => None,
        }
    }

    /// `v` broadcast from `x` along `dims`: (its op's index, x, dims).
    pub fn broadcast(&self, v: Value) -> Option<(usize, Value, &[i64])> {
        let (i, o) = self.op(v)?;
        match o.kind() {
            OpKind::BroadcastInDim { dims, .. } => Some((i, o.operands()[0], dims)),
            _ => None,
        }
    }

    /// Whether `a` and `b` hold the same data in the same shape: the same value, a view of one
    /// to its own shape, or the same view (one op of the same kind) of one value.
    pub fn alike(&self, a: Value, b: Value) -> bool {
        if a == b {
            return true;
        }
        let (f, same_shape) = (self.f, self.f.ty(a) == self.f.ty(b));
        let view_of = |v: Value, of: Value| {
            self.reshape(v)
                .is_some_and(|(_, x)| x == of && f.ty(x) == f.ty(v))
        };
        if same_shape && (view_of(a, b) || view_of(b, a)) {
            return true;
        }
        match (self.op(a), self.op(b)) {
            (Some((_, x)), Some((_, y))) => {
                x.kind() == y.kind()
                    && x.operands() == y.operands()
                    && matches!(
                        x.kind(),
                        OpKind::Reshape { .. } | OpKind::Transpose { .. } | OpKind::Convert { .. }
                    )
            }
            _ => false,
        }
    }

    /// `v = reshape(x)`: (its op's index, x).
    pub fn reshape(&self, v: Value) -> Option<(usize, Value)> {
        match self.op(v)? {
            (i, o) if matches!(o.kind(), OpKind::Reshape { .. }) => Some((i, o.operands()[0])),
            _ => None,
        }
    }

    /// `v` summed over `dims`: (the reduction's index and its init's, x, dims).
    pub fn sum(&self, v: Value) -> Option<(Vec<usize>, Value, &[i64])> {
        let (i, o) = self.op(v)?;
        let OpKind::Reduce {
            dims,
            body: ReduceBody::Binary(BinaryOp::Add),
        } = o.kind()
        else {
            return None;
        };
        let (init_ops, zero) = self.constant(o.operands()[1])?;
        (zero == 0.0).then(|| ([vec![i], init_ops].concat(), o.operands()[0], &dims[..]))
    }

    /// `v`, a float32 constant of one value throughout (a splat, or a broadcast scalar): the
    /// ops defining it and the value.
    pub fn constant(&self, v: Value) -> Option<(Vec<usize>, f64)> {
        let (i, o) = self.op(v)?;
        match o.kind() {
            OpKind::Constant(lit)
                if lit.ty.elem == DType::F32 && (lit.splat || lit.ty.numel() == 1) =>
            {
                let bytes: [u8; 4] = lit.bytes.get(..4)?.try_into().ok()?;
                Some((vec![i], f64::from(f32::from_le_bytes(bytes))))
            }
            OpKind::BroadcastInDim { .. } => {
                let (ops, x) = self.constant(o.operands()[0])?;
                Some(([vec![i], ops].concat(), x))
            }
            _ => None,
        }
    }
}

/// `test(a, b)`, else `test(b, a)`: what it found and whether the operands were swapped.
pub(super) fn either<T>(
    a: Value,
    b: Value,
    test: impl Fn(Value, Value) -> Option<T>,
) -> Option<(T, bool)> {
    test(a, b)
        .map(|t| (t, false))
        .or_else(|| test(b, a).map(|t| (t, true)))
}

/// Every pattern, tried at each op in turn.
type Pattern = fn(&Defs, usize) -> Option<Match>;

const PATTERNS: &[Pattern] = &[
    norms::rms_norm,
    mlp::gated_mlp,
    mlp::linear,
    rotary::rotary,
    attention::written_out,
    losses::cross_entropy,
];

/// The patterns of `module`'s main function (and its regions, see `passes::everywhere`) as
/// composites; the attention composites of lowering reading grouped keys and values. A match
/// that cannot be outlined is left as the ops it was.
pub fn fuse(module: Module) -> Module {
    fuse_choosing(module, false)
}

/// [`fuse`], then each composite computed by the registry's formulation where it has one.
pub fn fuse_with_kernels(module: Module) -> Module {
    fuse_choosing(module, true)
}

fn fuse_choosing(module: Module, kernels: bool) -> Module {
    let mut main = module.main;
    if let Ok(Some(f)) = outline_all(&main) {
        main = f;
    }
    if let Ok(Some(f)) = attention::absorb_repeated_heads(&main) {
        main = f;
    }
    if kernels {
        let before = main.clone();
        if kernels::choose(&mut main).is_err() {
            // A formulation that does not fit is not chosen.
            main = before;
        }
    }
    share_decompositions(&mut main);
    // The repeats moved into attention's decomposition are left unread.
    crate::passes::dead_code::dead_code(Module { main, ..module })
}

/// Composites of one name and attributes whose decompositions compute alike (each layer's
/// norm, say) made to share one, so that the module holds it once.
fn share_decompositions(f: &mut Func) {
    let mut kept: Vec<OpKind> = Vec::new();
    for i in 0..f.ops().len() {
        let op = &f.ops()[i];
        let Some(this) = op.kind().composite() else {
            continue;
        };
        let same = kept.iter().find(|k| match k.composite() {
            Some((name, attributes, decomposition)) => {
                (name, attributes) == (this.0, this.1)
                    && decomposition.func().same_as(this.2.func())
            }
            None => false,
        });
        match same {
            Some(shared) => {
                let (kind, operands) = (shared.clone(), op.operands().to_vec());
                // Alike decompositions have the same signature: this cannot fail.
                let _ = f.replace_op(i, kind, operands);
            }
            None => kept.push(op.kind().clone()),
        }
    }
}

/// The matches of `f`, latest root first, none overlapping another, each outlined; None when
/// nothing matched.
fn outline_all(f: &Func) -> BuildResult<Option<Func>> {
    let defs = Defs::new(f);
    let mut claimed = vec![false; f.ops().len()];
    let mut matches = Vec::new();
    for root in (0..f.ops().len()).rev() {
        if claimed[root] {
            continue;
        }
        let found = PATTERNS.iter().find_map(|p| p(&defs, root));
        let Some(m) = found else { continue };
        if m.ops.iter().any(|&i| claimed[i]) || !self_contained(f, &m) {
            continue;
        }
        for &i in &m.ops {
            claimed[i] = true;
        }
        matches.push(m);
    }
    if matches.is_empty() {
        return Ok(None);
    }
    outline(f, &matches).map(Some)
}

/// Whether the values `m` computes, but for its root's results, are read only by its own ops.
fn self_contained(f: &Func, m: &Match) -> bool {
    let root = *m.ops.last().expect("a match has a root");
    let inside: HashSet<usize> = m.ops.iter().copied().collect();
    let interior: HashSet<Value> = m
        .ops
        .iter()
        .filter(|&&i| i != root)
        .flat_map(|&i| f.ops()[i].results().iter().copied())
        .collect();
    let read_outside = f
        .ops()
        .iter()
        .enumerate()
        .filter(|(i, _)| !inside.contains(i))
        .flat_map(|(_, op)| op.operands().iter())
        .chain(f.results());
    !read_outside.into_iter().any(|v| interior.contains(v))
}

/// `f` with each match's ops replaced by one composite at its root.
fn outline(f: &Func, matches: &[Match]) -> BuildResult<Func> {
    let mut roots = std::collections::HashMap::new();
    let mut skipped = vec![false; f.ops().len()];
    for m in matches {
        for &i in &m.ops {
            skipped[i] = true;
        }
        roots.insert(*m.ops.last().expect("a match has a root"), m);
    }
    let mut rw = Rewriter::new(f);
    for (i, op) in f.ops().iter().enumerate() {
        let Some(m) = roots.get(&i) else {
            if !skipped[i] {
                rw.copy(op)?;
            }
            continue;
        };
        rw.at(op);
        let types: Vec<_> = m.inputs.iter().map(|&v| f.ty(v).clone()).collect();
        let decomposition = rw.builder().region(&types, |b, args| {
            let mut map = std::collections::HashMap::new();
            for (&old, &new) in m.inputs.iter().zip(args) {
                map.insert(old, new);
            }
            for &j in &m.ops {
                let inner = &f.ops()[j];
                // Each op keeps its own place in the user's code.
                b.set_loc(inner.loc().clone());
                let operands: Vec<Value> = inner.operands().iter().map(|v| map[v]).collect();
                let results = b.op(inner.kind().clone(), &operands)?;
                for (&old, new) in inner.results().iter().zip(results) {
                    map.insert(old, new);
                }
            }
            Ok(op.results().iter().map(|r| map[r]).collect())
        })?;
        let args: Vec<Value> = m.inputs.iter().map(|&v| rw.value(v)).collect();
        let results =
            rw.builder()
                .composite(m.name, m.attributes.clone(), 1, decomposition, &args)?;
        for (&old, new) in op.results().iter().zip(results) {
            rw.bind(old, new)?;
        }
    }
    Ok(rw.finish())
}

#[cfg(test)]
mod tests;
