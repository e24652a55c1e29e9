//! Hoisting: the part of a graph that depends only on arguments that stay the same from call to
//! call (a model's weights, between updates) is split off into a module of its own, run once per
//! version of those arguments; the rest reads its results as extra arguments.
//!
//! Worth hoisting is what costs time on every call and does not grow the weights: a kernel laid
//! out for the backend's convolutions (XLA:CPU otherwise transposes each convolution kernel on
//! every execution) and arithmetic on weights (batch norm's scale and shift, merged adapters).
//! Pure reshapes and transposes feeding other ops are left alone: XLA folds those into their
//! consumers, and a hoisted copy would only double the weight's memory.

use std::collections::BTreeSet;

use super::Prepared;
use crate::ir::{ArgAttrs, Builder, Func, KernelLayout, Module, OpKind, Rewriter, Value};

/// What to hoist: one flag per argument of the module, true for those that stay the same from
/// call to call; and the layout convolution kernels computed once are given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoistRequest {
    pub stable: Vec<bool>,
    pub conv_kernels: KernelLayout,
}

/// Splits `module` when part of it depends only on the arguments `request` marks stable and is
/// worth computing once: returns the module computing the rest (the original arguments, then
/// one per hoisted value, in order) and the module computing the hoisted values. When nothing
/// is worth it (or the flags do not fit), the module comes back as it was, with no second one.
/// Convolutions whose kernel is stable are first given kernels in the requested layout, the
/// transpose then hoisted.
pub fn hoist(module: Module, request: &HoistRequest) -> (Module, Option<Prepared>) {
    let stable = &request.stable;
    if stable.len() != module.main.args().len() || !stable.contains(&true) {
        return (module, None);
    }
    let f = relayout_kernels(&module.main, stable, request.conv_kernels);
    let origin = Origin::of(&f, stable);
    let hoisted = choose(&f, &origin);
    if hoisted.is_empty() {
        return (module, None);
    }
    let (prep, reads) = prep_function(&f, &origin, &hoisted);
    let main = main_function(f, &hoisted);
    let main = super::dead_code::dead_code(Module { main, ..module });
    let prepared = Prepared {
        module: Module::new(prep),
        reads,
    };
    (main, Some(prepared))
}

/// Where each value comes from: `stable` for values computed from stable arguments and
/// constants alone, `from_args` for those among them that read at least one stable argument,
/// and the op (by index) that defines each op result (None for the arguments).
struct Origin {
    stable: Vec<bool>,
    from_args: Vec<bool>,
    defined_by: Vec<Option<usize>>,
}

impl Origin {
    fn of(f: &Func, stable_args: &[bool]) -> Origin {
        let n = f.value_count();
        let mut origin = Origin {
            stable: vec![false; n],
            from_args: vec![false; n],
            defined_by: f.defining_ops(),
        };
        for (&arg, &is_stable) in f.args().iter().zip(stable_args) {
            origin.stable[arg.index()] = is_stable;
            origin.from_args[arg.index()] = is_stable;
        }
        for op in f.ops() {
            let stable =
                !op.kind().is_random() && op.operands().iter().all(|o| origin.stable[o.index()]);
            let from_args = stable && op.operands().iter().any(|o| origin.from_args[o.index()]);
            for r in op.results() {
                origin.stable[r.index()] = stable;
                origin.from_args[r.index()] = from_args;
            }
        }
        origin
    }

    fn computed_from_args(&self, v: Value) -> bool {
        self.from_args[v.index()] && self.defined_by[v.index()].is_some()
    }
}

/// `f` with each convolution whose kernel is stable given a kernel in `layout`: a transpose of
/// the torch-layout kernel, which hoisting then computes once.
fn relayout_kernels(f: &Func, stable_args: &[bool], layout: KernelLayout) -> Func {
    if layout == KernelLayout::OutInSpatial {
        return f.clone();
    }
    let origin = Origin::of(f, stable_args);
    let mut r = Rewriter::new(f);
    for op in f.ops() {
        match op.kind() {
            OpKind::Convolution(attrs)
                if attrs.kernel == KernelLayout::OutInSpatial
                    && origin.from_args[op.operands()[1].index()] =>
            {
                r.at(op);
                let (x, kernel) = (r.value(op.operands()[0]), r.value(op.operands()[1]));
                let b = r.builder();
                let perm = layout.from_torch(b.ty(kernel).rank());
                let transposed = b.transpose(kernel, &perm).expect("a kernel's permutation");
                let mut attrs = attrs.clone();
                attrs.kernel = layout;
                let y = b
                    .convolution(x, transposed, attrs)
                    .expect("the same convolution, its kernel relaid out");
                r.bind(op.results()[0], y).expect("of the same type");
            }
            _ => r.copy(op).expect("an op of a valid function is valid"),
        }
    }
    r.finish()
}

/// Values computed from stable arguments that an op outside the stable part reads: the
/// candidates for hoisting. Values the function returns stay where they are.
fn frontier(f: &Func, origin: &Origin) -> Vec<Value> {
    let mut returned = vec![false; f.value_count()];
    for r in f.results() {
        returned[r.index()] = true;
    }
    let mut seen = vec![false; f.value_count()];
    let mut found = vec![];
    for op in f.ops() {
        if op.results().iter().all(|r| origin.stable[r.index()]) {
            continue;
        }
        for &o in op.operands() {
            if origin.computed_from_args(o) && !returned[o.index()] && !seen[o.index()] {
                seen[o.index()] = true;
                found.push(o);
            }
        }
    }
    found
}

/// The ops `values` are computed from, by index, in program order.
fn ancestry(f: &Func, origin: &Origin, values: &[Value]) -> BTreeSet<usize> {
    let mut ops = BTreeSet::new();
    let mut stack: Vec<Value> = values.to_vec();
    while let Some(v) = stack.pop() {
        if let Some(index) = origin.defined_by[v.index()] {
            if ops.insert(index) {
                stack.extend(f.ops()[index].operands());
            }
        }
    }
    ops
}

enum Verdict {
    Hoist,
    /// Larger than what it is computed from (a broadcast, say): its operands may be worth it.
    Grows,
    /// Only moves data: leave it to XLA.
    NoGain,
}

/// Whether computing `v` once saves work on every call without growing memory beyond the
/// arguments it comes from: it must be no larger than they are, and either be a kernel of a
/// convolution on changing inputs (`kernels`; a relayout XLA would otherwise redo per call) or
/// involve arithmetic.
fn verdict(f: &Func, origin: &Origin, kernels: &BTreeSet<Value>, v: Value) -> Verdict {
    let ops = ancestry(f, origin, &[v]);
    let mut args = BTreeSet::new();
    for &index in &ops {
        for o in f.ops()[index].operands() {
            if origin.defined_by[o.index()].is_none() {
                args.insert(*o);
            }
        }
    }
    let source_elements: i64 = args.iter().map(|&a| f.ty(a).numel()).sum();
    if f.ty(v).numel() > source_elements {
        return Verdict::Grows;
    }
    if kernels.contains(&v) || ops.iter().any(|&i| !f.ops()[i].kind().moves_data()) {
        Verdict::Hoist
    } else {
        Verdict::NoGain
    }
}

/// The values to hoist: those of the frontier worth it and, in place of one that grows, the
/// values it is computed from, recursively.
fn choose(f: &Func, origin: &Origin) -> Vec<Value> {
    let kernels: BTreeSet<Value> = f
        .ops()
        .iter()
        .filter(|op| {
            matches!(op.kind(), OpKind::Convolution(_)) && !origin.stable[op.results()[0].index()]
        })
        .map(|op| op.operands()[1])
        .collect();
    let mut candidates = frontier(f, origin);
    let mut seen: BTreeSet<Value> = candidates.iter().copied().collect();
    let mut chosen = vec![];
    let mut next = 0;
    while next < candidates.len() {
        let v = candidates[next];
        next += 1;
        match verdict(f, origin, &kernels, v) {
            Verdict::Hoist => chosen.push(v),
            Verdict::NoGain => {}
            Verdict::Grows => {
                let op =
                    &f.ops()[origin.defined_by[v.index()].expect("computed values have an op")];
                for &o in op.operands() {
                    if origin.computed_from_args(o) && seen.insert(o) {
                        candidates.push(o);
                    }
                }
            }
        }
    }
    chosen
}

/// The function computing `hoisted` from the stable arguments it needs, and the positions of
/// those arguments in `f`.
fn prep_function(f: &Func, origin: &Origin, hoisted: &[Value]) -> (Func, Vec<usize>) {
    let ops = ancestry(f, origin, hoisted);
    let mut read = vec![false; f.value_count()];
    for &index in &ops {
        for o in f.ops()[index].operands() {
            read[o.index()] = true;
        }
    }
    let mut b = Builder::new();
    let mut renamed: Vec<Option<Value>> = vec![None; f.value_count()];
    let mut positions = vec![];
    for (position, &arg) in f.args().iter().enumerate() {
        if read[arg.index()] {
            renamed[arg.index()] = Some(b.arg(f.ty(arg).clone(), ArgAttrs::default()));
            positions.push(position);
        }
    }
    for &index in &ops {
        let op = &f.ops()[index];
        b.set_loc(op.loc().clone());
        let operands: Vec<Value> = op
            .operands()
            .iter()
            .map(|o| renamed[o.index()].expect("operands are defined before use"))
            .collect();
        let results = b
            .op(op.kind().clone(), &operands)
            .expect("an op of a valid function is valid");
        for (&old, new) in op.results().iter().zip(results) {
            renamed[old.index()] = Some(new);
        }
    }
    let results = hoisted
        .iter()
        .map(|v| renamed[v.index()].expect("hoisted values are computed"))
        .collect();
    (b.finish(results, Vec::new()), positions)
}

/// `f` reading each hoisted value from a new trailing argument instead of computing it.
fn main_function(mut f: Func, hoisted: &[Value]) -> Func {
    for &v in hoisted {
        let arg = f.add_arg(f.ty(v).clone(), ArgAttrs::default());
        f.replace_uses(v, arg)
            .expect("an argument of the value's type");
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, ConvAttrs, DType, DotDims, Precision, TensorType, UnaryOp};

    fn f32t(shape: &[i64]) -> TensorType {
        TensorType::new(shape.to_vec(), DType::F32)
    }

    fn conv_attrs() -> ConvAttrs {
        ConvAttrs {
            strides: vec![1, 1],
            padding: vec![(0, 0); 2],
            lhs_dilation: vec![1, 1],
            rhs_dilation: vec![1, 1],
            groups: 1,
            batch_groups: 1,
            precision: Precision::Highest,
            kernel: KernelLayout::OutInSpatial,
        }
    }

    fn module(b: Builder, results: Vec<Value>) -> Module {
        Module::new(b.finish(results, vec![]))
    }

    /// The main module and what was hoisted, both verified; None when nothing was.
    fn hoisted(
        m: &Module,
        stable: &[bool],
        conv_kernels: KernelLayout,
    ) -> Option<(Module, Prepared)> {
        let request = HoistRequest {
            stable: stable.to_vec(),
            conv_kernels,
        };
        let (main, prepared) = hoist(m.clone(), &request);
        crate::ir::verify(&main).unwrap();
        let prepared = prepared?;
        crate::ir::verify(&prepared.module).unwrap();
        Some((main, prepared))
    }

    fn kinds(f: &Func) -> Vec<&'static str> {
        f.ops()
            .iter()
            .map(|op| match op.kind() {
                OpKind::Constant(_) => "constant",
                OpKind::Unary(_) => "unary",
                OpKind::Binary(_) => "binary",
                OpKind::Transpose { .. } => "transpose",
                OpKind::BroadcastInDim { .. } => "broadcast",
                OpKind::Convolution(_) => "convolution",
                OpKind::DotGeneral { .. } => "dot",
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    /// conv(x, w) * broadcast(rsqrt(var + eps)): a convolution and the scale of the batch norm
    /// after it, with x the only input that changes.
    fn conv_and_scale() -> Module {
        let mut b = Builder::new();
        let x = b.arg(f32t(&[1, 4, 8, 8]), ArgAttrs::default());
        let w = b.arg(f32t(&[6, 4, 3, 3]), ArgAttrs::default());
        let var = b.arg(f32t(&[6]), ArgAttrs::default());
        let y = b.convolution(x, w, conv_attrs()).unwrap();
        let eps = b.splat(&f32t(&[6]), 1e-5);
        let shifted = b.binary(BinaryOp::Add, var, eps).unwrap();
        let scale = b.unary(UnaryOp::Rsqrt, shifted).unwrap();
        let wide = b.broadcast_in_dim(scale, &[1, 6, 6, 6], &[1]).unwrap();
        let out = b.binary(BinaryOp::Mul, y, wide).unwrap();
        module(b, vec![out])
    }

    #[test]
    fn hoists_kernel_relayout_and_weight_arithmetic_but_not_broadcasts() {
        let m = conv_and_scale();
        let (main, prep) = hoisted(&m, &[false, true, true], KernelLayout::SpatialInOut).unwrap();
        assert_eq!(prep.reads, vec![1, 2]);
        assert_eq!(
            kinds(&prep.module.main),
            ["transpose", "constant", "binary", "unary"]
        );
        assert_eq!(
            prep.module.main.result_types(),
            vec![f32t(&[3, 3, 4, 6]), f32t(&[6])]
        );
        // main: the original arguments, then the hoisted kernel and scale.
        let main = &main.main;
        assert_eq!(main.args().len(), 5);
        assert_eq!(kinds(main), ["convolution", "broadcast", "binary"]);
        let conv = &main.ops()[0];
        assert_eq!(conv.operands(), &[main.args()[0], main.args()[3]]);
        match conv.kind() {
            OpKind::Convolution(c) => assert_eq!(c.kernel, KernelLayout::SpatialInOut),
            other => panic!("{other:?}"),
        }
        assert_eq!(main.ops()[1].operands(), &[main.args()[4]]);
        assert_eq!(main.result_types(), vec![f32t(&[1, 6, 6, 6])]);
    }

    #[test]
    fn keeps_torch_kernels_when_asked() {
        let (main, prep) = hoisted(
            &conv_and_scale(),
            &[false, true, true],
            KernelLayout::OutInSpatial,
        )
        .unwrap();
        // Only the scale is hoisted; the kernel stays an argument read as it is.
        assert_eq!(prep.reads, vec![2]);
        assert_eq!(kinds(&prep.module.main), ["constant", "binary", "unary"]);
        let conv = &main.main.ops()[0];
        assert_eq!(conv.operands()[1], main.main.args()[1]);
    }

    #[test]
    fn nothing_to_hoist() {
        let m = conv_and_scale();
        // No stable argument, or a stable argument nothing worth computing once reads.
        assert!(hoisted(&m, &[false, false, false], KernelLayout::SpatialInOut).is_none());
        assert!(hoisted(&m, &[true, false, false], KernelLayout::SpatialInOut).is_none());
        // A flag per argument is required.
        assert!(hoisted(&m, &[true], KernelLayout::SpatialInOut).is_none());
        // A transposed weight read by a dot: XLA folds the transpose; a copy would only cost
        // memory.
        let mut b = Builder::new();
        let x = b.arg(f32t(&[2, 4]), ArgAttrs::default());
        let w = b.arg(f32t(&[8, 4]), ArgAttrs::default());
        let wt = b.transpose(w, &[1, 0]).unwrap();
        let dims = DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contracting: vec![1],
            rhs_contracting: vec![0],
        };
        let y = b.dot_general(x, wt, dims, Precision::Highest).unwrap();
        assert!(hoisted(
            &module(b, vec![y]),
            &[false, true],
            KernelLayout::SpatialInOut
        )
        .is_none());
        // Arithmetic on weights that the graph returns as it is stays in the graph.
        let mut b = Builder::new();
        let w = b.arg(f32t(&[8]), ArgAttrs::default());
        let r = b.unary(UnaryOp::Rsqrt, w).unwrap();
        assert!(hoisted(&module(b, vec![r]), &[true], KernelLayout::SpatialInOut).is_none());
    }

    #[test]
    fn random_bits_are_never_hoisted() {
        let mut b = Builder::new();
        let x = b.arg(f32t(&[4]), ArgAttrs::default());
        let seed = b.arg(TensorType::new(vec![2], DType::U64), ArgAttrs::default());
        let (_, bits) = b.rng_bit_generator(seed, &[4], DType::U32).unwrap();
        let bits = b.convert(bits, DType::F32);
        let y = b.binary(BinaryOp::Mul, x, bits).unwrap();
        // Even with the seed marked stable, the generator runs on every call.
        assert!(hoisted(
            &module(b, vec![y]),
            &[false, true],
            KernelLayout::SpatialInOut
        )
        .is_none());
    }
}
