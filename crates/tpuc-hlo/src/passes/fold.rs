//! Constant folding: ops whose operands are all known when compiling (constants, iotas and what
//! is computed from them) are evaluated here and replaced by constants.
//!
//! XLA's own folder leaves iotas and broadcasts alone, and so everything computed from them:
//! a table built from `torch.arange` (a rotary embedding's cos/sin, ...) would be recomputed on
//! every call, and inside a fusion once per element of each consumer (once per attention head).
//! Values are computed as the device would: each float32 result is rounded to float32
//! (transcendental functions are computed in float64 first, so they are at least as accurate
//! as the device's); integers wrap at their width. What cannot be computed exactly as the
//! device does (integer division by zero, float-to-integer conversion out of range, 16-bit
//! floats, complex numbers) is left for the device.

use crate::ir::{
    BinaryOp, CompareDir, CompareType, DType, Func, Literal, Module, OpKind, TensorType, UnaryOp,
    Value,
};

/// The largest tensor evaluated here (elements). Larger results stay computed by the device:
/// they would bloat the module more than they save.
const MAX_ELEMENTS: usize = 1 << 18;

/// A known tensor's elements in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Elems {
    /// float32 values are held rounded to float32.
    Float(Vec<f64>),
    /// Wrapped to the element type's width (unsigned types up to 32 bits hold their value).
    Int(Vec<i64>),
    Bool(Vec<bool>),
}

impl Elems {
    fn len(&self) -> usize {
        match self {
            Elems::Float(v) => v.len(),
            Elems::Int(v) => v.len(),
            Elems::Bool(v) => v.len(),
        }
    }

    /// The elements at these linear indices.
    fn pick(&self, indices: &[usize]) -> Elems {
        match self {
            Elems::Float(v) => Elems::Float(indices.iter().map(|&i| v[i]).collect()),
            Elems::Int(v) => Elems::Int(indices.iter().map(|&i| v[i]).collect()),
            Elems::Bool(v) => Elems::Bool(indices.iter().map(|&i| v[i]).collect()),
        }
    }

    /// `self` then `other`, both of one kind.
    fn extend(&mut self, other: &Elems) -> Option<()> {
        match (self, other) {
            (Elems::Float(a), Elems::Float(b)) => a.extend_from_slice(b),
            (Elems::Int(a), Elems::Int(b)) => a.extend_from_slice(b),
            (Elems::Bool(a), Elems::Bool(b)) => a.extend_from_slice(b),
            _ => return None,
        }
        Some(())
    }
}

/// Whether values of this element type are evaluated here.
fn foldable(elem: DType) -> bool {
    !matches!(
        elem,
        DType::F16 | DType::BF16 | DType::U64 | DType::C64 | DType::C128
    )
}

fn round_float(elem: DType, x: f64) -> f64 {
    if elem == DType::F32 {
        x as f32 as f64
    } else {
        x
    }
}

fn wrap_int(elem: DType, x: i64) -> i64 {
    match elem {
        DType::I8 => x as i8 as i64,
        DType::I16 => x as i16 as i64,
        DType::I32 => x as i32 as i64,
        DType::U8 => x as u8 as i64,
        DType::U16 => x as u16 as i64,
        DType::U32 => x as u32 as i64,
        _ => x,
    }
}

/// The range of integers an element type holds.
fn int_range(elem: DType) -> (f64, f64) {
    match elem {
        DType::I8 => (i8::MIN as f64, i8::MAX as f64),
        DType::I16 => (i16::MIN as f64, i16::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::U8 => (0.0, u8::MAX as f64),
        DType::U16 => (0.0, u16::MAX as f64),
        DType::U32 => (0.0, u32::MAX as f64),
        // i64::MAX is not a float64; the largest float64 below 2^63 is.
        _ => (i64::MIN as f64, 9_223_372_036_854_774_784.0),
    }
}

/// A literal's elements (its type and size were checked by the caller).
fn decode(lit: &Literal) -> Elems {
    let elem = lit.ty.elem;
    let size = elem.byte_size();
    let chunks = lit.bytes.chunks_exact(size);
    let values: Elems = match elem {
        DType::Bool => Elems::Bool(lit.bytes.iter().map(|&b| b != 0).collect()),
        DType::F32 => Elems::Float(
            chunks
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
        ),
        DType::F64 => Elems::Float(
            chunks
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        _ => Elems::Int(
            chunks
                .map(|c| {
                    let mut wide = [0u8; 8];
                    wide[..size].copy_from_slice(c);
                    // Sign-extend through the width; unsigned types wrap back to their value.
                    wrap_int(
                        elem,
                        i64::from_le_bytes(wide) << (64 - 8 * size) >> (64 - 8 * size),
                    )
                })
                .collect(),
        ),
    };
    if lit.splat {
        values.pick(&vec![0; lit.ty.numel() as usize])
    } else {
        values
    }
}

fn encode(ty: &TensorType, values: &Elems) -> Literal {
    let elem = ty.elem;
    let splat = is_splat(values);
    let count = if splat { 1 } else { values.len() };
    let mut bytes = Vec::with_capacity(count * elem.byte_size());
    for i in 0..count {
        match values {
            Elems::Float(v) if elem == DType::F32 => bytes.extend((v[i] as f32).to_le_bytes()),
            Elems::Float(v) => bytes.extend(v[i].to_le_bytes()),
            Elems::Int(v) => bytes.extend(&v[i].to_le_bytes()[..elem.byte_size()]),
            Elems::Bool(v) => bytes.push(u8::from(v[i])),
        }
    }
    Literal {
        ty: ty.clone(),
        bytes: bytes.into(),
        splat,
    }
}

/// Whether all elements are one value, bit for bit (0.0 and -0.0 differ), as a splat needs.
fn is_splat(values: &Elems) -> bool {
    fn same<T: Copy, K: PartialEq>(v: &[T], key: impl Fn(T) -> K) -> bool {
        v.first()
            .is_some_and(|&first| v.iter().all(|&x| key(x) == key(first)))
    }
    match values {
        Elems::Float(v) => same(v, f64::to_bits),
        Elems::Int(v) => same(v, |x| x),
        Elems::Bool(v) => same(v, |x| x),
    }
}

/// Row-major strides of a shape.
fn strides(shape: &[i64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as usize;
    }
    s
}

/// For each element of `shape`, in row-major order, the linear index `source` maps it to.
fn map_indices(shape: &[i64], mut source: impl FnMut(&[i64]) -> usize) -> Vec<usize> {
    let n: i64 = shape.iter().product();
    let mut index = vec![0i64; shape.len()];
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        out.push(source(&index));
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

fn linear(index: impl Iterator<Item = i64>, strides: &[usize]) -> usize {
    index.zip(strides).map(|(i, s)| i as usize * s).sum()
}

/// What folding knows of a value.
#[derive(Clone)]
enum Known {
    /// Computed.
    Ready(Elems),
    /// The result of an op left in place (a constant, an iota, a broadcast) whose operands are
    /// known: computed when a folded op first reads it, so that weights and broadcasts nothing
    /// folded reads cost nothing.
    Deferred { op: usize },
    /// Not computable here.
    Unknown,
}

/// Evaluates every op it can, in order, and replaces each with a constant, except ops that are
/// themselves cheap for the device (a constant, an iota, a broadcast). Index arithmetic is
/// folded too: XLA:CPU computes a mask such as `iota >= iota` per element of each consumer with
/// index divisions, which costs more than reading the folded mask.
pub fn fold_constants(mut module: Module) -> Module {
    let f = &mut module.main;
    let mut known: Vec<Known> = vec![Known::Unknown; f.value_count()];
    for i in 0..f.ops().len() {
        let op = &f.ops()[i];
        let Some(result) = op.result() else {
            continue;
        };
        let ty = f.ty(result);
        let computable = foldable(ty.elem)
            && ty.numel() as usize <= MAX_ELEMENTS
            && op
                .operands()
                .iter()
                .all(|v| !matches!(known[v.index()], Known::Unknown));
        if !computable {
            continue;
        }
        if op.kind().is_cheap() {
            known[result.index()] = Known::Deferred { op: i };
            continue;
        }
        if let Some(values) = compute(f, &mut known, i) {
            let literal = encode(f.ty(result), &values);
            f.replace_op(i, OpKind::Constant(literal), Vec::new())
                .expect("a folded constant has its op's type");
            known[result.index()] = Known::Ready(values);
        }
    }
    module
}

/// The elements of `v`, computed here as folding computes them, from constants alone (no
/// argument of `f` read) and through values of at most `limit` elements each: for a pass that
/// reads what a constant holds though folding left it computed (a mask too large to fold).
pub(crate) fn elements_of(f: &Func, v: Value, limit: usize) -> Option<Elems> {
    let defining = f.defining_ops();
    let mut known: Vec<Known> = vec![Known::Unknown; f.value_count()];
    // The ops `v` depends on, in program order (defined before read).
    let mut needed = Vec::new();
    let mut pending = vec![v];
    let mut seen = vec![false; f.ops().len()];
    while let Some(x) = pending.pop() {
        let i = (*defining.get(x.index())?)?;
        if !std::mem::replace(&mut seen[i], true) {
            let op = &f.ops()[i];
            if op.results().len() != 1 || f.ty(op.results()[0]).numel() as usize > limit {
                return None;
            }
            needed.push(i);
            pending.extend(op.operands());
        }
    }
    needed.sort_unstable();
    for i in needed {
        let result = f.ops()[i].results()[0];
        known[result.index()] = Known::Ready(compute(f, &mut known, i)?);
    }
    match std::mem::replace(&mut known[v.index()], Known::Unknown) {
        Known::Ready(values) => Some(values),
        _ => None,
    }
}

/// The value of `f.ops[i]`'s single result, its operands computed first where deferred; None
/// when it cannot be computed here (and then every deferred value it needed is marked unknown).
fn compute(f: &Func, known: &mut [Known], i: usize) -> Option<Elems> {
    let op = &f.ops()[i];
    for &v in op.operands() {
        if let Known::Deferred { op: producer } = known[v.index()] {
            known[v.index()] = match compute(f, known, producer) {
                Some(values) => Known::Ready(values),
                None => Known::Unknown,
            };
        }
    }
    let operands: Option<Vec<(&Elems, &TensorType)>> = op
        .operands()
        .iter()
        .map(|&v| match &known[v.index()] {
            Known::Ready(values) => Some((values, f.ty(v))),
            _ => None,
        })
        .collect();
    let ty = f.ty(op.results()[0]);
    let values = evaluate(op.kind(), &operands?, ty)?;
    debug_assert_eq!(values.len(), ty.numel() as usize);
    Some(values)
}

fn evaluate(kind: &OpKind, operands: &[(&Elems, &TensorType)], ty: &TensorType) -> Option<Elems> {
    let elem = ty.elem;
    match kind {
        OpKind::Constant(lit) => Some(decode(lit)),
        OpKind::Iota { dim, .. } => {
            let d = *dim as usize;
            let stride = strides(&ty.shape)[d];
            let size = ty.shape[d] as usize;
            let along = (0..ty.numel() as usize).map(|i| (i / stride) % size);
            match elem {
                DType::Bool => None,
                e if e.is_float() => Some(Elems::Float(
                    along.map(|i| round_float(e, i as f64)).collect(),
                )),
                e => Some(Elems::Int(along.map(|i| wrap_int(e, i as i64)).collect())),
            }
        }
        OpKind::Unary(u) => unary(*u, operands[0].0, elem),
        OpKind::Binary(b) => binary(*b, operands[0].0, operands[1].0, elem),
        OpKind::Compare { dir, compare: how } => {
            if *how == CompareType::TotalOrder {
                return None;
            }
            compare(*dir, operands[0].0, operands[1].0)
        }
        OpKind::Select => {
            let Elems::Bool(pred) = operands[0].0 else {
                return None;
            };
            let (on_true, on_false) = (operands[1].0, operands[2].0);
            let n = on_true.len();
            let chosen: Vec<usize> = (0..n)
                .map(|i| {
                    let p = if pred.len() == 1 { pred[0] } else { pred[i] };
                    if p {
                        i
                    } else {
                        n + i
                    }
                })
                .collect();
            let mut both = on_true.clone();
            both.extend(on_false)?;
            Some(both.pick(&chosen))
        }
        OpKind::Clamp => {
            let (lo, x, hi) = (operands[0].0, operands[1].0, operands[2].0);
            let n = x.len();
            let spread = |b: &Elems| {
                if b.len() == n {
                    b.clone()
                } else {
                    b.pick(&vec![0; n])
                }
            };
            let raised = binary(BinaryOp::Max, x, &spread(lo), elem)?;
            binary(BinaryOp::Min, &raised, &spread(hi), elem)
        }
        OpKind::Convert { .. } => convert(operands[0].0, operands[0].1.elem, elem),
        OpKind::Reshape { .. } => Some(operands[0].0.clone()),
        OpKind::BroadcastInDim { dims, .. } => {
            let (x, xt) = operands[0];
            let xs = strides(&xt.shape);
            let idx =
                map_indices(&ty.shape, |out| {
                    let from = dims.iter().enumerate().map(|(i, &d)| {
                        if xt.shape[i] == 1 {
                            0
                        } else {
                            out[d as usize]
                        }
                    });
                    linear(from, &xs)
                });
            Some(x.pick(&idx))
        }
        OpKind::Transpose { perm } => {
            let (x, xt) = operands[0];
            let xs = strides(&xt.shape);
            // Output dimension i is operand dimension perm[i].
            let idx = map_indices(&ty.shape, |out| {
                perm.iter()
                    .zip(out)
                    .map(|(&p, &i)| i as usize * xs[p as usize])
                    .sum()
            });
            Some(x.pick(&idx))
        }
        OpKind::Slice {
            start,
            strides: step,
            ..
        } => {
            let (x, xt) = operands[0];
            let xs = strides(&xt.shape);
            let idx = map_indices(&ty.shape, |out| {
                linear(
                    out.iter().enumerate().map(|(d, &i)| start[d] + i * step[d]),
                    &xs,
                )
            });
            Some(x.pick(&idx))
        }
        OpKind::Reverse { dims } => {
            let (x, xt) = operands[0];
            let xs = strides(&xt.shape);
            let idx = map_indices(&ty.shape, |out| {
                linear(
                    out.iter().enumerate().map(|(d, &i)| {
                        if dims.contains(&(d as i64)) {
                            xt.shape[d] - 1 - i
                        } else {
                            i
                        }
                    }),
                    &xs,
                )
            });
            Some(x.pick(&idx))
        }
        OpKind::Concatenate { dim } => {
            let d = *dim as usize;
            // All operands one after another; an output index picks its operand's element.
            let mut all = operands[0].0.clone();
            let mut bases = vec![0usize];
            for (x, _) in &operands[1..] {
                bases.push(all.len());
                all.extend(x)?;
            }
            let operand_strides: Vec<Vec<usize>> =
                operands.iter().map(|(_, xt)| strides(&xt.shape)).collect();
            let idx = map_indices(&ty.shape, |out| {
                let mut at = out[d];
                for (k, (_, xt)) in operands.iter().enumerate() {
                    if at < xt.shape[d] {
                        let inner = out
                            .iter()
                            .enumerate()
                            .map(|(i, &x)| if i == d { at } else { x });
                        return bases[k] + linear(inner, &operand_strides[k]);
                    }
                    at -= xt.shape[d];
                }
                unreachable!("concatenate's result type covers its operands")
            });
            Some(all.pick(&idx))
        }
        _ => None,
    }
}

fn unary(op: UnaryOp, x: &Elems, elem: DType) -> Option<Elems> {
    use UnaryOp::*;
    match x {
        Elems::Float(v) => {
            let f: fn(f64) -> f64 = match op {
                Abs => f64::abs,
                Neg => |a| -a,
                Exp => f64::exp,
                Expm1 => f64::exp_m1,
                Log => f64::ln,
                Log1p => f64::ln_1p,
                Sqrt => f64::sqrt,
                Rsqrt => |a| 1.0 / a.sqrt(),
                Cbrt => f64::cbrt,
                Tanh => f64::tanh,
                Logistic => |a| 1.0 / (1.0 + (-a).exp()),
                Sin => f64::sin,
                Cos => f64::cos,
                Tan => f64::tan,
                Floor => f64::floor,
                Ceil => f64::ceil,
                RoundEven => f64::round_ties_even,
                RoundAwayFromZero => f64::round,
                Sign => |a| {
                    if a.is_nan() || a == 0.0 {
                        a
                    } else {
                        a.signum()
                    }
                },
                Asin => f64::asin,
                Acos => f64::acos,
                Atan => f64::atan,
                Sinh => f64::sinh,
                Cosh => f64::cosh,
                Asinh => f64::asinh,
                Acosh => f64::acosh,
                Atanh => f64::atanh,
                Not | Erf | Lgamma | Digamma | ErfInv | Erfc | BesselI1e => return None,
            };
            Some(Elems::Float(
                v.iter().map(|&a| round_float(elem, f(a))).collect(),
            ))
        }
        Elems::Int(v) => {
            let f: fn(i64) -> i64 = match op {
                Abs => i64::wrapping_abs,
                Neg => i64::wrapping_neg,
                Sign => i64::signum,
                Not => |a| !a,
                _ => return None,
            };
            Some(Elems::Int(
                v.iter().map(|&a| wrap_int(elem, f(a))).collect(),
            ))
        }
        Elems::Bool(v) => match op {
            Not => Some(Elems::Bool(v.iter().map(|&a| !a).collect())),
            _ => None,
        },
    }
}

fn binary(op: BinaryOp, x: &Elems, y: &Elems, elem: DType) -> Option<Elems> {
    use BinaryOp::*;
    match (x, y) {
        (Elems::Float(a), Elems::Float(b)) => {
            let f: fn(f64, f64) -> f64 = match op {
                Add => |p, q| p + q,
                Sub => |p, q| p - q,
                Mul => |p, q| p * q,
                Div => |p, q| p / q,
                Rem => |p, q| p % q,
                Pow => f64::powf,
                // StableHLO's maximum and minimum propagate NaN.
                Max => |p, q| {
                    if p.is_nan() || q.is_nan() {
                        f64::NAN
                    } else {
                        p.max(q)
                    }
                },
                Min => |p, q| {
                    if p.is_nan() || q.is_nan() {
                        f64::NAN
                    } else {
                        p.min(q)
                    }
                },
                Atan2 => f64::atan2,
                _ => return None,
            };
            Some(Elems::Float(
                a.iter()
                    .zip(b)
                    .map(|(&p, &q)| round_float(elem, f(p, q)))
                    .collect(),
            ))
        }
        (Elems::Int(a), Elems::Int(b)) => {
            let f: fn(i64, i64) -> Option<i64> = match op {
                Add => |p, q| Some(p.wrapping_add(q)),
                Sub => |p, q| Some(p.wrapping_sub(q)),
                Mul => |p, q| Some(p.wrapping_mul(q)),
                // Division by zero is the device's business.
                Div => |p, q| (q != 0).then(|| p.wrapping_div(q)),
                Rem => |p, q| (q != 0).then(|| p.wrapping_rem(q)),
                Pow => |p, q| u32::try_from(q).ok().map(|q| p.wrapping_pow(q)),
                Max => |p, q| Some(p.max(q)),
                Min => |p, q| Some(p.min(q)),
                And => |p, q| Some(p & q),
                Or => |p, q| Some(p | q),
                Xor => |p, q| Some(p ^ q),
                _ => return None,
            };
            let values: Option<Vec<i64>> = a
                .iter()
                .zip(b)
                .map(|(&p, &q)| f(p, q).map(|r| wrap_int(elem, r)))
                .collect();
            values.map(Elems::Int)
        }
        (Elems::Bool(a), Elems::Bool(b)) => {
            let f: fn(bool, bool) -> bool = match op {
                And | Min | Mul => |p, q| p & q,
                Or | Max | Add => |p, q| p | q,
                Xor => |p, q| p ^ q,
                _ => return None,
            };
            Some(Elems::Bool(
                a.iter().zip(b).map(|(&p, &q)| f(p, q)).collect(),
            ))
        }
        _ => None,
    }
}

fn compare(dir: CompareDir, x: &Elems, y: &Elems) -> Option<Elems> {
    fn by<T: PartialOrd>(dir: CompareDir, a: &[T], b: &[T]) -> Elems {
        Elems::Bool(
            a.iter()
                .zip(b)
                .map(|(p, q)| match dir {
                    CompareDir::Eq => p == q,
                    CompareDir::Ne => p != q,
                    CompareDir::Lt => p < q,
                    CompareDir::Le => p <= q,
                    CompareDir::Gt => p > q,
                    CompareDir::Ge => p >= q,
                })
                .collect(),
        )
    }
    match (x, y) {
        (Elems::Float(a), Elems::Float(b)) => Some(by(dir, a, b)),
        (Elems::Int(a), Elems::Int(b)) => Some(by(dir, a, b)),
        (Elems::Bool(a), Elems::Bool(b)) => Some(by(dir, a, b)),
        _ => None,
    }
}

fn convert(x: &Elems, from: DType, to: DType) -> Option<Elems> {
    if from.is_complex() {
        return None;
    }
    Some(match (x, to) {
        (Elems::Bool(v), DType::Bool) => Elems::Bool(v.clone()),
        (Elems::Bool(v), t) if t.is_float() => {
            Elems::Float(v.iter().map(|&b| f64::from(u8::from(b))).collect())
        }
        (Elems::Bool(v), _) => Elems::Int(v.iter().map(|&b| i64::from(b)).collect()),
        (Elems::Float(v), DType::Bool) => Elems::Bool(v.iter().map(|&a| a != 0.0).collect()),
        (Elems::Float(v), t) if t.is_float() => {
            Elems::Float(v.iter().map(|&a| round_float(t, a)).collect())
        }
        (Elems::Float(v), t) => {
            // Toward zero, as the device converts; values it cannot hold are left to it.
            let (lo, hi) = int_range(t);
            let values: Option<Vec<i64>> = v
                .iter()
                .map(|&a| {
                    let r = a.trunc();
                    (r >= lo && r <= hi).then_some(r as i64)
                })
                .collect();
            Elems::Int(values?)
        }
        (Elems::Int(v), DType::Bool) => Elems::Bool(v.iter().map(|&a| a != 0).collect()),
        (Elems::Int(v), DType::F32) => Elems::Float(v.iter().map(|&a| a as f32 as f64).collect()),
        (Elems::Int(v), t) if t.is_float() => Elems::Float(v.iter().map(|&a| a as f64).collect()),
        (Elems::Int(v), t) => Elems::Int(v.iter().map(|&a| wrap_int(t, a)).collect()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, Builder, Value};

    fn f32s(lit: &Literal) -> Vec<f32> {
        lit.bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn producer(f: &Func, v: Value) -> &OpKind {
        f.ops()
            .iter()
            .find(|op| op.results().contains(&v))
            .unwrap()
            .kind()
    }

    fn fold(f: Func) -> Func {
        fold_constants(Module::new(f)).main
    }

    /// `rows >= cols` over an n x n grid of iotas: a causal mask.
    fn causal_mask(b: &mut Builder, n: i64) -> Value {
        let ty = TensorType::new(vec![n, n], DType::I64);
        let rows = b.iota(ty.clone(), 0).unwrap();
        let cols = b.iota(ty, 1).unwrap();
        b.compare(CompareDir::Ge, rows, cols).unwrap()
    }

    /// A rotary table: cos(arange(4) x 1/10000^(arange(0, 4, 2)/4)), as torch computes it.
    #[test]
    fn folds_a_table_built_from_iotas() {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4, 2], DType::F32), ArgAttrs::default());
        let pos = b.iota(TensorType::new(vec![4], DType::I64), 0).unwrap();
        let pos = b.convert(pos, DType::F32);
        let two = b.iota(TensorType::new(vec![2], DType::F32), 0).unwrap();
        let scale = b.splat(&TensorType::new(vec![2], DType::F32), 0.5);
        let frac = b.binary(BinaryOp::Mul, two, scale).unwrap();
        let base = b.splat(&TensorType::new(vec![2], DType::F32), 10000.0);
        let inv = b.binary(BinaryOp::Pow, base, frac).unwrap();
        let one = b.splat(&TensorType::new(vec![2], DType::F32), 1.0);
        let inv = b.binary(BinaryOp::Div, one, inv).unwrap();
        let ty = TensorType::new(vec![4, 2], DType::F32);
        let rows = b.broadcast_in_dim(pos, &ty.shape, &[0]).unwrap();
        let cols = b.broadcast_in_dim(inv, &ty.shape, &[1]).unwrap();
        let angles = b.binary(BinaryOp::Mul, rows, cols).unwrap();
        let cos = b.unary(UnaryOp::Cos, angles).unwrap();
        let y = b.binary(BinaryOp::Mul, x, cos).unwrap();
        let f = fold(b.finish(vec![y], Vec::new()));
        let OpKind::Constant(lit) = producer(&f, cos) else {
            panic!("cos was not folded: {:?}", producer(&f, cos));
        };
        let mut expected = Vec::new();
        for p in 0..4 {
            for i in 0..2 {
                let inv = 1.0f32 / 10000f32.powf(i as f32 * 0.5);
                expected.push(((p as f32 * inv) as f64).cos() as f32);
            }
        }
        assert_eq!(f32s(lit), expected);
        assert!(!lit.splat);
        // The product with the argument stays.
        assert_eq!(producer(&f, y), &OpKind::Binary(BinaryOp::Mul));
    }

    /// A causal mask folds into bytes compared with zero; the select with an argument stays.
    #[test]
    fn folds_masks_into_bytes_compared_with_zero() {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![3, 3], DType::F32), ArgAttrs::default());
        let mask = causal_mask(&mut b, 3);
        let zero = b.splat(&TensorType::new(vec![3, 3], DType::F32), 0.0);
        let y = b.select(mask, x, zero).unwrap();
        let f = b.finish(vec![y], Vec::new());
        let f = crate::passes::pipeline(Module::new(f), &Default::default())
            .unwrap()
            .main
            .main;
        // The select reads the mask as bytes compared with zero.
        let select = f
            .ops()
            .iter()
            .find(|op| op.results() == [f.results()[0]])
            .unwrap();
        assert_eq!(select.kind(), &OpKind::Select);
        let compare = producer(&f, select.operands()[0]).clone();
        assert!(matches!(
            compare,
            OpKind::Compare {
                dir: CompareDir::Ne,
                ..
            }
        ));
        let compare_op = f
            .ops()
            .iter()
            .find(|op| op.results() == [select.operands()[0]])
            .unwrap();
        let OpKind::Constant(bytes) = producer(&f, compare_op.operands()[0]) else {
            panic!("mask bytes are not a constant");
        };
        assert_eq!(bytes.ty.elem, DType::U8);
        assert_eq!(&bytes.bytes[..], &[1, 0, 0, 1, 1, 0, 1, 1, 1]);
        // The iotas no longer have a use.
        assert!(!f
            .ops()
            .iter()
            .any(|op| matches!(op.kind(), OpKind::Iota { .. })));
        let _ = (x, mask);
    }

    /// An additive causal mask (0 where allowed, -inf elsewhere) folds up to the size limit.
    #[test]
    fn folds_additive_masks_up_to_the_size_limit() {
        for (n, folded) in [(8, true), (1024, false)] {
            let mut b = Builder::new();
            let mask = causal_mask(&mut b, n);
            let fty = TensorType::new(vec![n, n], DType::F32);
            let zero = b.splat(&fty, 0.0);
            let minus_inf = b.splat(&fty, f64::NEG_INFINITY);
            let additive = b.select(mask, zero, minus_inf).unwrap();
            let f = fold(b.finish(vec![additive], Vec::new()));
            match producer(&f, additive) {
                OpKind::Constant(lit) => {
                    assert!(folded, "{n}x{n} mask folded");
                    let v = f32s(lit);
                    assert_eq!((v[0], v[1], v[n as usize]), (0.0, f32::NEG_INFINITY, 0.0));
                }
                kind => assert!(!folded, "{n}x{n} mask not folded: {kind:?}"),
            }
        }
    }

    /// A mask too large to fold is still read by `elements_of` (within its own limit); what
    /// reads an argument, or exceeds the limit, is not.
    #[test]
    fn elements_of_reads_a_mask_left_computed() {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4, 4], DType::Bool), Default::default());
        let mask = causal_mask(&mut b, 1024);
        let small = causal_mask(&mut b, 4);
        let read = b.binary(BinaryOp::And, small, x).unwrap();
        let f = fold(b.finish(vec![mask, read], Vec::new()));
        let Some(Elems::Bool(values)) = elements_of(&f, mask, 1 << 22) else {
            panic!("the 1024x1024 mask was not read");
        };
        assert_eq!((values[0], values[1], values[1024]), (true, false, true));
        assert_eq!(elements_of(&f, mask, 1 << 18), None);
        assert_eq!(elements_of(&f, read, 1 << 22), None);
    }

    #[test]
    fn leaves_what_the_device_must_decide() {
        let mut b = Builder::new();
        let ty = TensorType::new(vec![2], DType::I32);
        let n = b.iota(ty.clone(), 0).unwrap();
        let seven = b.splat(&ty, 7.0);
        // 7 / [0, 1]: division by zero.
        let q = b.binary(BinaryOp::Div, seven, n).unwrap();
        let big = b.splat(&TensorType::new(vec![2], DType::F32), 1e20);
        let cast = b.convert(big, DType::I32);
        let fine = b.binary(BinaryOp::Sub, seven, n).unwrap();
        let f = fold(b.finish(vec![q, cast, fine], Vec::new()));
        assert_eq!(producer(&f, q), &OpKind::Binary(BinaryOp::Div));
        assert_eq!(producer(&f, cast), &OpKind::Convert { to: DType::I32 });
        let OpKind::Constant(lit) = producer(&f, fine) else {
            panic!("7 - iota was not folded");
        };
        assert_eq!(&lit.bytes[..], &[7, 0, 0, 0, 6, 0, 0, 0]);
    }

    #[test]
    fn wraps_integers_and_moves_elements() {
        let mut b = Builder::new();
        let ty = TensorType::new(vec![2, 3], DType::I8);
        let n = b.iota(ty.clone(), 1).unwrap();
        let big = b.splat(&ty, 100.0);
        let sum = b.binary(BinaryOp::Add, n, big).unwrap();
        let wrapped = b.binary(BinaryOp::Add, sum, big).unwrap();
        let t = b.transpose(wrapped, &[1, 0]).unwrap();
        let r = b.reverse(t, &[0]).unwrap();
        let c = b.concatenate(&[r, r], 1).unwrap();
        let s = b.slice(c, &[0, 1], &[3, 4], &[2, 2]).unwrap();
        let f = fold(b.finish(vec![s], Vec::new()));
        let OpKind::Constant(lit) = producer(&f, s) else {
            panic!("not folded");
        };
        // 200, 201, 202 wrap to -56, -55, -54; transposed rows reversed: [-54,-54], [-55,-55],
        // [-56,-56]; concatenated: [-54,-54,-54,-54], ...; rows 0 and 2, columns 1 and 3.
        let got: Vec<i8> = lit.bytes.iter().map(|&b| b as i8).collect();
        assert_eq!(got, vec![-54, -54, -56, -56]);
    }
}
