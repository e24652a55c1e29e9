//! The typing rule of every op, from the StableHLO spec: its result types from its operands'
//! types and its attributes, or why they do not fit. Builders add an op only when its rule
//! holds; the verifier checks that every op's results are what the rule says.

use tpuc_dtype::DType;

use super::attrs::{ConvAttrs, DotDims, GatherDims, ScatterDims};
use super::ops::{BinaryOp, FftKind, OpKind, UnaryOp};
use super::types::TensorType;

type Rule = Result<Vec<TensorType>, String>;

fn one(ty: TensorType) -> Rule {
    Ok(vec![ty])
}

/// The result types of `kind` applied to operands of these types.
pub fn infer(kind: &OpKind, operands: &[&TensorType]) -> Rule {
    let arity = |n: usize| -> Result<(), String> {
        if operands.len() == n {
            Ok(())
        } else {
            Err(format!(
                "takes {n} operand{}, got {}",
                if n == 1 { "" } else { "s" },
                operands.len()
            ))
        }
    };
    match kind {
        OpKind::Constant(lit) => {
            arity(0)?;
            let elem_bytes = lit.ty.elem.byte_size();
            let expected = if lit.splat {
                elem_bytes
            } else {
                lit.ty.numel().max(0) as usize * elem_bytes
            };
            if lit.ty.shape.iter().any(|&d| d < 0) || lit.bytes.len() != expected {
                return Err(format!(
                    "{} needs {expected} bytes, got {}",
                    lit.ty,
                    lit.bytes.len()
                ));
            }
            one(lit.ty.clone())
        }
        OpKind::Iota { dim, ty } => {
            arity(0)?;
            if *dim < 0 || *dim as usize >= ty.rank() || ty.shape.iter().any(|&d| d < 0) {
                return Err(format!("dimension {dim} out of range for {ty}"));
            }
            one(ty.clone())
        }
        OpKind::Unary(op) => {
            arity(1)?;
            unary(*op, operands[0])
        }
        OpKind::Binary(op) => {
            arity(2)?;
            binary(*op, operands[0], operands[1])
        }
        OpKind::Compare { compare, .. } => {
            arity(2)?;
            let ty = same(operands)?;
            if !compare.fits(ty.elem) {
                return Err(format!(
                    "comparison type {} does not compare {}",
                    compare.mnemonic(),
                    ty.elem
                ));
            }
            one(ty.with_elem(DType::Bool))
        }
        OpKind::Select => {
            arity(3)?;
            let ty = same(&operands[1..])?;
            let p = operands[0];
            if p.elem != DType::Bool || (p.rank() != 0 && p.shape != ty.shape) {
                return Err(format!("predicate {p} does not fit {ty}"));
            }
            one(ty)
        }
        OpKind::Clamp => {
            arity(3)?;
            let ty = operands[1];
            for b in [operands[0], operands[2]] {
                if b.elem != ty.elem || (b.rank() != 0 && b.shape != ty.shape) {
                    return Err(format!("bound {b} does not fit {ty}"));
                }
            }
            one(ty.clone())
        }
        OpKind::Convert { to } => {
            arity(1)?;
            if operands[0].elem.is_complex() && !to.is_complex() {
                return Err(format!(
                    "converting {} to {to} would drop the imaginary part: take the real part first",
                    operands[0]
                ));
            }
            one(operands[0].with_elem(*to))
        }
        OpKind::BitcastConvert { to } => {
            arity(1)?;
            let x = operands[0];
            let (from_bytes, to_bytes) = (x.elem.byte_size(), to.byte_size());
            if x.elem.is_bool() || to.is_bool() {
                return Err(format!("cannot reinterpret the bits of {x} as {to}"));
            }
            let mut shape = x.shape.clone();
            if from_bytes > to_bytes {
                shape.push((from_bytes / to_bytes) as i64);
            } else if from_bytes < to_bytes {
                let ratio = (to_bytes / from_bytes) as i64;
                if shape.last() != Some(&ratio) {
                    return Err(format!(
                        "reading {x} as {to} needs a last dimension of {ratio}"
                    ));
                }
                shape.pop();
            }
            one(TensorType::new(shape, *to))
        }
        OpKind::Cholesky { .. } => {
            arity(1)?;
            square_matrices(operands[0])?;
            one(operands[0].clone())
        }
        OpKind::TriangularSolve { left_side, .. } => {
            arity(2)?;
            let (a, b) = (operands[0], operands[1]);
            let n = square_matrices(a)?;
            let r = b.rank();
            let solved = if *left_side {
                r.wrapping_sub(2)
            } else {
                r.wrapping_sub(1)
            };
            if r != a.rank()
                || b.elem != a.elem
                || a.shape[..r - 2] != b.shape[..r - 2]
                || b.shape[solved] != n
            {
                return Err(format!("right-hand sides {b} do not fit the matrices {a}"));
            }
            one(b.clone())
        }
        OpKind::CustomCall { results, .. } => Ok(results.clone()),
        OpKind::OptimizationBarrier => {
            arity(1)?;
            one(operands[0].clone())
        }
        OpKind::IsFinite => {
            arity(1)?;
            if !operands[0].elem.is_float() {
                return Err(format!(
                    "needs a floating-point operand, got {}",
                    operands[0]
                ));
            }
            one(operands[0].with_elem(DType::Bool))
        }
        OpKind::BroadcastInDim { dims, shape } => {
            arity(1)?;
            let ty = operands[0];
            if dims.len() != ty.rank() {
                return Err(format!("{} dimensions given for {ty}", dims.len()));
            }
            for (i, &d) in dims.iter().enumerate() {
                let ok = d >= 0
                    && (d as usize) < shape.len()
                    && (ty.shape[i] == 1 || ty.shape[i] == shape[d as usize])
                    && (i == 0 || dims[i - 1] < d);
                if !ok {
                    return Err(format!(
                        "cannot broadcast {ty} to {shape:?} with dimensions {dims:?}"
                    ));
                }
            }
            one(ty.with_shape(shape.clone()))
        }
        OpKind::Reshape { shape } => {
            arity(1)?;
            let ty = operands[0];
            if shape.iter().any(|&d| d < 0) || shape.iter().product::<i64>() != ty.numel() {
                return Err(format!("cannot reshape {ty} to {shape:?}"));
            }
            one(ty.with_shape(shape.clone()))
        }
        OpKind::Transpose { perm } => {
            arity(1)?;
            let ty = operands[0];
            if !is_permutation(perm, ty.rank()) {
                return Err(format!(
                    "{perm:?} is not a permutation of the dimensions of {ty}"
                ));
            }
            one(ty.with_shape(perm.iter().map(|&p| ty.shape[p as usize]).collect()))
        }
        OpKind::Slice {
            start,
            limit,
            strides,
        } => {
            arity(1)?;
            let ty = operands[0];
            let rank = ty.rank();
            if start.len() != rank || limit.len() != rank || strides.len() != rank {
                return Err(format!("bounds of the wrong rank for {ty}"));
            }
            let mut shape = Vec::with_capacity(rank);
            for i in 0..rank {
                if start[i] < 0 || limit[i] < start[i] || limit[i] > ty.shape[i] || strides[i] < 1 {
                    return Err(format!(
                        "invalid slice {start:?}..{limit:?} step {strides:?} of {ty}"
                    ));
                }
                shape.push((limit[i] - start[i] + strides[i] - 1) / strides[i]);
            }
            one(ty.with_shape(shape))
        }
        OpKind::Concatenate { dim } => {
            let Some(first) = operands.first() else {
                return Err("takes at least one operand".into());
            };
            if *dim < 0 || *dim as usize >= first.rank() {
                return Err(format!("dimension {dim} out of range for {first}"));
            }
            let d = *dim as usize;
            let mut total = 0;
            for t in operands {
                let compatible = t.elem == first.elem
                    && t.rank() == first.rank()
                    && (0..t.rank()).all(|i| i == d || t.shape[i] == first.shape[i]);
                if !compatible {
                    return Err(format!("cannot concatenate {first} and {t} along {dim}"));
                }
                total += t.shape[d];
            }
            let mut shape = first.shape.clone();
            shape[d] = total;
            one(first.with_shape(shape))
        }
        OpKind::Pad {
            low,
            high,
            interior,
        } => {
            arity(2)?;
            let (ty, value) = (operands[0], operands[1]);
            if value.rank() != 0 || value.elem != ty.elem {
                return Err(format!("padding value {value} does not fit {ty}"));
            }
            let rank = ty.rank();
            if low.len() != rank || high.len() != rank || interior.len() != rank {
                return Err(format!("padding of the wrong rank for {ty}"));
            }
            let mut shape = Vec::with_capacity(rank);
            for i in 0..rank {
                let d = ty.shape[i];
                let n = low[i] + high[i] + d + (d - 1).max(0) * interior[i];
                if interior[i] < 0 || n < 0 {
                    return Err(format!(
                        "invalid padding {low:?}/{high:?}/{interior:?} of {ty}"
                    ));
                }
                shape.push(n);
            }
            one(ty.with_shape(shape))
        }
        OpKind::Reverse { dims } => {
            arity(1)?;
            let ty = operands[0];
            if dims.iter().any(|&d| d < 0 || d as usize >= ty.rank()) {
                return Err(format!("dimensions {dims:?} out of range for {ty}"));
            }
            one(ty.clone())
        }
        OpKind::DynamicUpdateSlice => {
            let [ty, update, starts @ ..] = operands else {
                return Err("takes an operand, an update and start indices".into());
            };
            let fits = update.elem == ty.elem
                && update.rank() == ty.rank()
                && update.shape.iter().zip(&ty.shape).all(|(u, d)| u <= d);
            if !fits {
                return Err(format!("update {update} does not fit in {ty}"));
            }
            start_indices(starts, ty)?;
            one((*ty).clone())
        }
        OpKind::DynamicSlice { sizes } => {
            let [ty, starts @ ..] = operands else {
                return Err("takes an operand and start indices".into());
            };
            let fits = sizes.len() == ty.rank()
                && sizes
                    .iter()
                    .zip(&ty.shape)
                    .all(|(&s, &d)| (0..=d).contains(&s));
            if !fits {
                return Err(format!("a part of sizes {sizes:?} does not fit in {ty}"));
            }
            start_indices(starts, ty)?;
            one(ty.with_shape(sizes.clone()))
        }
        OpKind::DotGeneral { dims, .. } => {
            arity(2)?;
            dot_general(dims, operands[0], operands[1])
        }
        OpKind::Convolution(attrs) => {
            arity(2)?;
            convolution(attrs, operands[0], operands[1])
        }
        OpKind::Reduce { dims, body } => {
            let n = body.arity();
            arity(2 * n)?;
            let (inputs, inits) = operands.split_at(n);
            let shape = &inputs[0].shape;
            for (x, init) in inputs.iter().zip(inits) {
                if x.shape != *shape || init.rank() != 0 || init.elem != x.elem {
                    return Err(format!("operand {x} with init {init} does not fit"));
                }
            }
            body_fits(*body, inputs)?;
            if dims.iter().any(|&d| d < 0 || d as usize >= shape.len())
                || dims.windows(2).any(|w| w[0] >= w[1])
            {
                return Err(format!(
                    "dimensions {dims:?} must be sorted, distinct and in range for {shape:?}"
                ));
            }
            let out: Vec<i64> = (0..shape.len())
                .filter(|d| !dims.contains(&(*d as i64)))
                .map(|d| shape[d])
                .collect();
            Ok(inputs
                .iter()
                .map(|x| TensorType::new(out.clone(), x.elem))
                .collect())
        }
        OpKind::ReduceWindow {
            window,
            strides,
            padding,
            body,
        } => {
            arity(2)?;
            let (x, init) = (operands[0], operands[1]);
            if body.arity() != 1 {
                return Err("a window reduces one operand".into());
            }
            body_fits(*body, &operands[..1])?;
            let rank = x.rank();
            if init.rank() != 0
                || init.elem != x.elem
                || window.len() != rank
                || strides.len() != rank
                || padding.len() != rank
            {
                return Err(format!("attributes or init {init} do not fit {x}"));
            }
            let mut shape = Vec::with_capacity(rank);
            for i in 0..rank {
                let padded = x.shape[i] + padding[i].0 + padding[i].1;
                if window[i] < 1 || strides[i] < 1 || padded < window[i] {
                    return Err(format!(
                        "window {window:?} does not fit {x} padded by {padding:?}"
                    ));
                }
                shape.push((padded - window[i]) / strides[i] + 1);
            }
            one(x.with_shape(shape))
        }
        OpKind::Gather(dims) => {
            arity(2)?;
            gather(dims, operands[0], operands[1])
        }
        OpKind::Scatter { dims, mode } => {
            arity(3)?;
            if let super::ops::ScatterMode::Combine(op) = mode {
                binary(*op, operands[0], operands[0])?;
            }
            scatter(dims, operands[0], operands[1], operands[2])
        }
        OpKind::Sort { dim, compare, .. } => {
            let Some(first) = operands.first() else {
                return Err("takes at least one operand".into());
            };
            if *dim < 0
                || *dim as usize >= first.rank()
                || operands.iter().any(|x| x.shape != first.shape)
            {
                return Err(format!(
                    "operands or dimension {dim} do not fit {:?}",
                    first.shape
                ));
            }
            if !compare.fits(first.elem) {
                return Err(format!(
                    "comparison type {} does not compare {}",
                    compare.mnemonic(),
                    first.elem
                ));
            }
            Ok(operands.iter().map(|&t| t.clone()).collect())
        }
        OpKind::RngBitGenerator { shape, bits } => {
            arity(1)?;
            let state = operands[0];
            if *state != TensorType::new(vec![2], DType::U64)
                || !matches!(bits, DType::U32 | DType::U64)
                || shape.iter().any(|&d| d < 0)
            {
                return Err(format!("state {state} or bits of {bits} unsupported"));
            }
            Ok(vec![state.clone(), TensorType::new(shape.clone(), *bits)])
        }
        OpKind::Real | OpKind::Imag => {
            arity(1)?;
            let ty = operands[0];
            if !ty.elem.is_complex() {
                return Err(format!("needs a complex operand, got {ty}"));
            }
            one(ty.with_elem(ty.elem.real_part()))
        }
        OpKind::Complex => {
            arity(2)?;
            let ty = same(operands)?;
            let Some(elem) = ty.elem.complex_of() else {
                return Err(format!("needs float32 or float64 parts, got {ty}"));
            };
            one(ty.with_elem(elem))
        }
        OpKind::Fft { kind, length } => {
            arity(1)?;
            fft(*kind, length, operands[0])
        }
        OpKind::AllReduce { op, groups } => {
            arity(1)?;
            group_size(groups)?;
            binary(*op, operands[0], operands[0])
        }
        OpKind::AllGather { dim, groups } => {
            arity(1)?;
            let n = group_size(groups)?;
            let ty = operands[0];
            let d = dimension(*dim, ty)?;
            let mut shape = ty.shape.clone();
            shape[d] *= n;
            one(ty.with_shape(shape))
        }
        OpKind::ReduceScatter { dim, op, groups } => {
            arity(1)?;
            let n = group_size(groups)?;
            binary(*op, operands[0], operands[0])?;
            let ty = operands[0];
            let d = dimension(*dim, ty)?;
            if ty.shape[d] % n != 0 {
                return Err(format!(
                    "dimension {d} of {ty} does not split into {n} equal parts"
                ));
            }
            let mut shape = ty.shape.clone();
            shape[d] /= n;
            one(ty.with_shape(shape))
        }
        OpKind::AllToAll {
            split_dim,
            concat_dim,
            groups,
        } => {
            arity(1)?;
            let n = group_size(groups)?;
            let ty = operands[0];
            let (split, concat) = (dimension(*split_dim, ty)?, dimension(*concat_dim, ty)?);
            if ty.shape[split] % n != 0 {
                return Err(format!(
                    "dimension {split} of {ty} does not split into {n} equal parts"
                ));
            }
            let mut shape = ty.shape.clone();
            shape[split] /= n;
            shape[concat] *= n;
            one(ty.with_shape(shape))
        }
        OpKind::ShardingConstraint(sharding) => {
            arity(1)?;
            if sharding.dims.len() != operands[0].rank() {
                return Err(format!(
                    "a sharding of {} dimensions for {}",
                    sharding.dims.len(),
                    operands[0]
                ));
            }
            one(operands[0].clone())
        }
        OpKind::While { cond, body } => {
            let carried: Vec<TensorType> = operands.iter().map(|&t| t.clone()).collect();
            let condition = TensorType::scalar(DType::Bool);
            signature("the condition", cond.func(), &carried, &[condition])?;
            signature("the body", body.func(), &carried, &carried)?;
            Ok(carried)
        }
        OpKind::Case { branches } => {
            let Some((index, passed)) = operands.split_first() else {
                return Err("takes an index operand".into());
            };
            if **index != TensorType::scalar(DType::I32) {
                return Err(format!("its index is a tensor<i32>, got {index}"));
            }
            let Some(first) = branches.first() else {
                return Err("has at least one branch".into());
            };
            let passed: Vec<TensorType> = passed.iter().map(|&t| t.clone()).collect();
            let results = first.func().result_types();
            for (i, branch) in branches.iter().enumerate() {
                signature(&format!("branch {i}"), branch.func(), &passed, &results)?;
            }
            Ok(results)
        }
        OpKind::Call { name, callee } => {
            let passed: Vec<TensorType> = operands.iter().map(|&t| t.clone()).collect();
            let results = callee.func().result_types();
            signature(&format!("@{name}"), callee.func(), &passed, &results)?;
            Ok(results)
        }
        OpKind::Foreign(function) => {
            let passed: Vec<TensorType> = operands.iter().map(|&t| t.clone()).collect();
            if passed != function.operands {
                return Err(format!(
                    "the kernel of {} takes {}, the op passes {}",
                    function.name,
                    types_text(&function.operands),
                    types_text(&passed)
                ));
            }
            Ok(function.results.clone())
        }
        OpKind::Composite {
            name,
            decomposition,
            ..
        } => {
            if !name.contains('.') {
                return Err(format!("its name {name:?} has no namespace (`tpuc.name`)"));
            }
            let passed: Vec<TensorType> = operands.iter().map(|&t| t.clone()).collect();
            let results = decomposition.func().result_types();
            signature(
                &format!("the decomposition of {name}"),
                decomposition.func(),
                &passed,
                &results,
            )?;
            Ok(results)
        }
    }
}

/// Checks a dynamic slice's or update's start indices: one integer scalar per dimension of
/// `ty`, all of one type.
fn start_indices(starts: &[&TensorType], ty: &TensorType) -> Result<(), String> {
    if starts.len() != ty.rank() {
        return Err(format!("{} start indices for {ty}", starts.len()));
    }
    match starts
        .iter()
        .find(|s| s.rank() != 0 || !s.elem.is_integer() || s.elem != starts[0].elem)
    {
        Some(bad) => Err(format!(
            "start index {bad} is not an integer scalar of the others' type"
        )),
        None => Ok(()),
    }
}

/// Checks that a region's function takes `args` and returns `results`.
fn signature(
    what: &str,
    f: &super::func::Func,
    args: &[TensorType],
    results: &[TensorType],
) -> Result<(), String> {
    let (takes, returns) = (f.arg_types(), f.result_types());
    if takes != args {
        return Err(format!(
            "{what} takes {}, the op passes {}",
            types_text(&takes),
            types_text(args)
        ));
    }
    if returns != results {
        return Err(format!(
            "{what} returns {}, the op needs {}",
            types_text(&returns),
            types_text(results)
        ));
    }
    Ok(())
}

fn types_text(types: &[TensorType]) -> String {
    let each: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("({})", each.join(", "))
}

/// The size of every group of a collective: groups of one size, of distinct non-negative ids.
fn group_size(groups: &[Vec<i64>]) -> Result<i64, String> {
    let Some(first) = groups.first() else {
        return Err("a collective needs at least one group".into());
    };
    let mut seen = std::collections::HashSet::new();
    for g in groups {
        if g.len() != first.len() || g.is_empty() {
            return Err(format!(
                "groups {groups:?} are not all of one positive size"
            ));
        }
        if g.iter().any(|&id| id < 0 || !seen.insert(id)) {
            return Err(format!(
                "groups {groups:?} repeat a device or name a negative one"
            ));
        }
    }
    Ok(first.len() as i64)
}

fn dimension(dim: i64, ty: &TensorType) -> Result<usize, String> {
    if dim < 0 || dim as usize >= ty.rank() {
        return Err(format!("dimension {dim} out of range for {ty}"));
    }
    Ok(dim as usize)
}

fn same(operands: &[&TensorType]) -> Result<TensorType, String> {
    let first = operands[0];
    for &t in &operands[1..] {
        if t != first {
            return Err(format!("operand types differ: {first} and {t}"));
        }
    }
    Ok(first.clone())
}

pub(super) fn is_permutation(perm: &[i64], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm.iter().all(|&p| {
            p >= 0 && (p as usize) < rank && !std::mem::replace(&mut seen[p as usize], true)
        })
}

fn unary(op: UnaryOp, ty: &TensorType) -> Rule {
    let e = ty.elem;
    if op.float_only() && !e.is_float() {
        return Err(format!("needs a floating-point operand, got {ty}"));
    }
    if op == UnaryOp::Not && e.is_float() {
        return Err(format!("needs an integer or boolean operand, got {ty}"));
    }
    if matches!(op, UnaryOp::Abs | UnaryOp::Neg | UnaryOp::Sign) && e.is_bool() {
        return Err(format!("is not defined on booleans ({ty})"));
    }
    // The magnitude of a complex number is real.
    one(if op == UnaryOp::Abs {
        ty.with_elem(e.real_part())
    } else {
        ty.clone()
    })
}

fn binary(op: BinaryOp, a: &TensorType, b: &TensorType) -> Rule {
    let ty = same(&[a, b])?;
    if op.is_logical() && ty.elem.is_float() {
        return Err(format!("needs integer or boolean operands, got {ty}"));
    }
    if op.float_only() && !ty.elem.is_float() {
        return Err(format!("needs floating-point operands, got {ty}"));
    }
    if op.is_shift() && !ty.elem.is_integer() {
        return Err(format!("needs integer operands, got {ty}"));
    }
    one(ty)
}

/// Checks `ty` is a batch of square float or complex matrices; returns their size.
fn square_matrices(ty: &TensorType) -> Result<i64, String> {
    let r = ty.rank();
    if r < 2 || ty.shape[r - 1] != ty.shape[r - 2] || !(ty.elem.is_float() || ty.elem.is_complex())
    {
        return Err(format!(
            "needs square float matrices in the last two dimensions, got {ty}"
        ));
    }
    Ok(ty.shape[r - 1])
}

fn body_fits(body: super::ops::ReduceBody, inputs: &[&TensorType]) -> Result<(), String> {
    match body {
        super::ops::ReduceBody::Binary(op) => binary(op, inputs[0], inputs[0]).map(|_| ()),
        super::ops::ReduceBody::ArgExtremum { nan_wins, .. } => {
            if !inputs[1].elem.is_integer() {
                return Err(format!("indices must be integers, got {}", inputs[1]));
            }
            if nan_wins && !inputs[0].elem.is_float() {
                return Err(format!("NaN rules apply to floats, not {}", inputs[0]));
            }
            if inputs[0].elem.is_complex() {
                return Err(format!("complex numbers have no order ({})", inputs[0]));
            }
            Ok(())
        }
    }
}

fn dot_general(dims: &DotDims, ta: &TensorType, tb: &TensorType) -> Rule {
    if ta.elem != tb.elem {
        return Err(format!("element types differ: {ta} and {tb}"));
    }
    let in_range =
        |ds: &[i64], t: &TensorType| ds.iter().all(|&d| d >= 0 && (d as usize) < t.rank());
    if dims.lhs_batch.len() != dims.rhs_batch.len()
        || dims.lhs_contracting.len() != dims.rhs_contracting.len()
        || !in_range(&dims.lhs_batch, ta)
        || !in_range(&dims.lhs_contracting, ta)
        || !in_range(&dims.rhs_batch, tb)
        || !in_range(&dims.rhs_contracting, tb)
    {
        return Err(format!(
            "invalid dimension numbers {dims:?} for {ta} and {tb}"
        ));
    }
    for (l, r) in dims
        .lhs_batch
        .iter()
        .zip(&dims.rhs_batch)
        .chain(dims.lhs_contracting.iter().zip(&dims.rhs_contracting))
    {
        if ta.shape[*l as usize] != tb.shape[*r as usize] {
            return Err(format!(
                "dimension {l} of {ta} does not match dimension {r} of {tb}"
            ));
        }
    }
    let mut shape: Vec<i64> = dims
        .lhs_batch
        .iter()
        .map(|&d| ta.shape[d as usize])
        .collect();
    let free = |t: &TensorType, batch: &[i64], contracting: &[i64]| -> Vec<i64> {
        (0..t.rank() as i64)
            .filter(|d| !batch.contains(d) && !contracting.contains(d))
            .map(|d| t.shape[d as usize])
            .collect()
    };
    shape.extend(free(ta, &dims.lhs_batch, &dims.lhs_contracting));
    shape.extend(free(tb, &dims.rhs_batch, &dims.rhs_contracting));
    one(TensorType::new(shape, ta.elem))
}

fn convolution(attrs: &ConvAttrs, tx: &TensorType, tw: &TensorType) -> Rule {
    let spatial = tx.rank().saturating_sub(2);
    if tx.rank() < 3
        || tw.rank() != tx.rank()
        || tx.elem != tw.elem
        || attrs.strides.len() != spatial
        || attrs.padding.len() != spatial
        || attrs.lhs_dilation.len() != spatial
        || attrs.rhs_dilation.len() != spatial
        || attrs.groups < 1
        || attrs.batch_groups < 1
        || (attrs.groups > 1 && attrs.batch_groups > 1)
    {
        return Err(format!(
            "invalid operands {tx} and {tw} or attributes {attrs:?}"
        ));
    }
    let (out_channels, in_channels, window) = attrs.kernel.split(&tw.shape);
    if tx.shape[1] != in_channels * attrs.groups || out_channels % attrs.groups != 0 {
        return Err(format!(
            "{tx} has {} channels but kernel {tw} with {} groups expects {}",
            tx.shape[1],
            attrs.groups,
            in_channels * attrs.groups
        ));
    }
    if tx.shape[0] % attrs.batch_groups != 0 || out_channels % attrs.batch_groups != 0 {
        return Err(format!(
            "batch {} and {} output channels do not split into {} batch groups",
            tx.shape[0], out_channels, attrs.batch_groups
        ));
    }
    let mut shape = vec![tx.shape[0] / attrs.batch_groups, out_channels];
    for (i, &size) in window.iter().enumerate() {
        let input = (tx.shape[i + 2] - 1) * attrs.lhs_dilation[i] + 1;
        let padded = input + attrs.padding[i].0 + attrs.padding[i].1;
        let kernel = (size - 1) * attrs.rhs_dilation[i] + 1;
        if padded < kernel || attrs.strides[i] < 1 {
            return Err(format!(
                "kernel {tw} does not fit input {tx} with {attrs:?}"
            ));
        }
        shape.push((padded - kernel) / attrs.strides[i] + 1);
    }
    one(TensorType::new(shape, tx.elem))
}

fn gather(dims: &GatherDims, tx: &TensorType, ti: &TensorType) -> Rule {
    if !ti.elem.is_integer() {
        return Err(format!("indices must be integers, got {ti}"));
    }
    if dims.slice_sizes.len() != tx.rank()
        || dims
            .slice_sizes
            .iter()
            .zip(&tx.shape)
            .any(|(&s, &d)| s < 0 || s > d)
        || dims.index_vector_dim < 0
        || dims.index_vector_dim as usize > ti.rank()
    {
        return Err(format!(
            "invalid slice sizes {:?} or index_vector_dim for {tx} and {ti}",
            dims.slice_sizes
        ));
    }
    let index_len = if (dims.index_vector_dim as usize) < ti.rank() {
        ti.shape[dims.index_vector_dim as usize]
    } else {
        1
    };
    if dims.start_index_map.len() as i64 != index_len {
        return Err(format!(
            "start_index_map {:?} does not match index vectors of length {index_len}",
            dims.start_index_map
        ));
    }
    let batch: Vec<i64> = (0..ti.rank())
        .filter(|&d| d as i64 != dims.index_vector_dim)
        .map(|d| ti.shape[d])
        .collect();
    let offsets: Vec<i64> = (0..tx.rank() as i64)
        .filter(|d| {
            !dims.collapsed_slice_dims.contains(d) && !dims.operand_batching_dims.contains(d)
        })
        .map(|d| dims.slice_sizes[d as usize])
        .collect();
    if offsets.len() != dims.offset_dims.len() {
        return Err(format!(
            "offset_dims {:?} do not match the {} offset dimensions",
            dims.offset_dims,
            offsets.len()
        ));
    }
    let rank = batch.len() + offsets.len();
    let mut shape = Vec::with_capacity(rank);
    let (mut bi, mut oi) = (0, 0);
    for d in 0..rank as i64 {
        if dims.offset_dims.contains(&d) {
            shape.push(offsets[oi]);
            oi += 1;
        } else {
            if bi >= batch.len() {
                return Err(format!("offset_dims {:?} out of range", dims.offset_dims));
            }
            shape.push(batch[bi]);
            bi += 1;
        }
    }
    one(tx.with_shape(shape))
}

fn scatter(dims: &ScatterDims, tx: &TensorType, ti: &TensorType, tu: &TensorType) -> Rule {
    if !ti.elem.is_integer() || tu.elem != tx.elem {
        return Err(format!("indices {ti} / updates {tu} do not fit {tx}"));
    }
    let window_rank = tx
        .rank()
        .checked_sub(dims.inserted_window_dims.len() + dims.input_batching_dims.len());
    if window_rank != Some(dims.update_window_dims.len())
        || dims.index_vector_dim < 0
        || dims.index_vector_dim as usize > ti.rank()
    {
        return Err(format!(
            "dimension numbers {dims:?} do not fit {tx}, {ti}, {tu}"
        ));
    }
    let window_rank = dims.update_window_dims.len();
    let scatter_rank = ti.rank() - usize::from((dims.index_vector_dim as usize) < ti.rank());
    if tu.rank() != scatter_rank + window_rank {
        return Err(format!(
            "updates {tu} must have rank {}",
            scatter_rank + window_rank
        ));
    }
    one(tx.clone())
}

fn fft(kind: FftKind, length: &[i64], ty: &TensorType) -> Rule {
    let k = length.len();
    let bad = |why: String| Err(format!("{why} ({ty}, length {length:?})"));
    if k == 0 || k > 3 || k > ty.rank() || length.iter().any(|&l| l < 1) {
        return bad("transforms 1 to 3 trailing dimensions of positive length".into());
    }
    let lead = ty.rank() - k;
    let mut expected_in = length.to_vec();
    let mut out_shape = ty.shape.clone();
    let (in_ok, out_elem) = match kind {
        FftKind::Fft | FftKind::Ifft => (ty.elem.is_complex(), ty.elem),
        FftKind::Rfft => {
            out_shape[ty.rank() - 1] = length[k - 1] / 2 + 1;
            (
                ty.elem.complex_of().is_some(),
                ty.elem.complex_of().unwrap_or(ty.elem),
            )
        }
        FftKind::Irfft => {
            expected_in[k - 1] = length[k - 1] / 2 + 1;
            out_shape[ty.rank() - 1] = length[k - 1];
            (ty.elem.is_complex(), ty.elem.real_part())
        }
    };
    if !in_ok {
        return bad(format!(
            "{} does not take this element type",
            kind.mnemonic()
        ));
    }
    if ty.shape[lead..] != expected_in[..] {
        return bad(format!("trailing dimensions must be {expected_in:?}"));
    }
    one(TensorType::new(out_shape, out_elem))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::attrs::Precision;
    use crate::ir::ops::{CompareDir, CompareType};

    fn t(shape: &[i64], elem: DType) -> TensorType {
        TensorType::new(shape.to_vec(), elem)
    }

    fn refused(kind: OpKind, operands: &[&TensorType], needle: &str) {
        match infer(&kind, operands) {
            Ok(types) => panic!("{kind:?} on {operands:?} typed as {types:?}"),
            Err(why) => assert!(why.contains(needle), "{kind:?}: {why}"),
        }
    }

    #[test]
    fn a_dynamic_slice_has_its_sizes_and_fitting_integer_starts() {
        let (x, i) = (t(&[5, 3], DType::F32), t(&[], DType::I64));
        let sliced = OpKind::DynamicSlice { sizes: vec![1, 3] };
        assert_eq!(
            infer(&sliced, &[&x, &i, &i]).unwrap(),
            vec![t(&[1, 3], DType::F32)]
        );
        refused(
            OpKind::DynamicSlice { sizes: vec![6, 3] },
            &[&x, &i, &i],
            "does not fit",
        );
        refused(sliced.clone(), &[&x, &i], "1 start indices");
        refused(
            sliced,
            &[&x, &i, &t(&[], DType::I32)],
            "of the others' type",
        );
    }

    #[test]
    fn a_matmul_keeps_batch_then_free_dimensions() {
        let dims = DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contracting: vec![2],
            rhs_contracting: vec![1],
        };
        let kind = OpKind::DotGeneral {
            dims,
            precision: Precision::Highest,
        };
        let (a, b) = (t(&[8, 3, 5], DType::F32), t(&[8, 5, 7], DType::F32));
        assert_eq!(infer(&kind, &[&a, &b]), Ok(vec![t(&[8, 3, 7], DType::F32)]));
        refused(
            kind.clone(),
            &[&a, &t(&[8, 4, 7], DType::F32)],
            "does not match",
        );
        refused(
            kind,
            &[&a, &t(&[8, 5, 7], DType::BF16)],
            "element types differ",
        );
    }

    #[test]
    fn unary_rules_follow_the_element_kind() {
        let c = t(&[2], DType::C64);
        assert_eq!(
            infer(&OpKind::Unary(UnaryOp::Abs), &[&c]),
            Ok(vec![t(&[2], DType::F32)]),
            "the magnitude of a complex number is real"
        );
        refused(
            OpKind::Unary(UnaryOp::Neg),
            &[&t(&[2], DType::Bool)],
            "booleans",
        );
        refused(
            OpKind::Unary(UnaryOp::Not),
            &[&t(&[2], DType::F32)],
            "integer or boolean",
        );
        refused(OpKind::Unary(UnaryOp::Abs), &[], "takes 1 operand, got 0");
    }

    #[test]
    fn binary_operands_agree_and_fit_the_op() {
        let (i, f) = (t(&[3], DType::I32), t(&[3], DType::F32));
        assert_eq!(
            infer(&OpKind::Binary(BinaryOp::ShiftLeft), &[&i, &i]),
            Ok(vec![i.clone()])
        );
        refused(
            OpKind::Binary(BinaryOp::ShiftLeft),
            &[&f, &f],
            "integer operands",
        );
        refused(
            OpKind::Binary(BinaryOp::And),
            &[&f, &f],
            "integer or boolean",
        );
        refused(OpKind::Binary(BinaryOp::Atan2), &[&i, &i], "floating-point");
        refused(
            OpKind::Binary(BinaryOp::And),
            &[&i, &t(&[4], DType::I32)],
            "",
        );
    }

    #[test]
    fn comparisons_give_booleans_of_a_fitting_comparison_type() {
        let f = t(&[2, 2], DType::F32);
        let float = OpKind::Compare {
            dir: CompareDir::Lt,
            compare: CompareType::Float,
        };
        assert_eq!(infer(&float, &[&f, &f]), Ok(vec![t(&[2, 2], DType::Bool)]));
        let signed = OpKind::Compare {
            dir: CompareDir::Lt,
            compare: CompareType::Signed,
        };
        refused(signed, &[&f, &f], "does not compare float32");
    }

    #[test]
    fn shape_ops_check_their_attributes() {
        let x = t(&[2, 3], DType::F32);
        let reshape = |shape: &[i64]| OpKind::Reshape {
            shape: shape.to_vec(),
        };
        assert_eq!(
            infer(&reshape(&[3, 2]), &[&x]),
            Ok(vec![t(&[3, 2], DType::F32)])
        );
        refused(reshape(&[4, 2]), &[&x], "cannot reshape");
        let broadcast = |dims: &[i64], shape: &[i64]| OpKind::BroadcastInDim {
            dims: dims.to_vec(),
            shape: shape.to_vec(),
        };
        assert_eq!(
            infer(&broadcast(&[1, 2], &[4, 2, 3]), &[&x]),
            Ok(vec![t(&[4, 2, 3], DType::F32)])
        );
        refused(broadcast(&[2, 1], &[4, 3, 2]), &[&x], "cannot broadcast");
        refused(
            OpKind::Transpose { perm: vec![0, 0] },
            &[&x],
            "not a permutation",
        );
        refused(
            OpKind::Convert { to: DType::F32 },
            &[&t(&[2], DType::C64)],
            "imaginary part",
        );
    }

    #[test]
    fn bit_casts_split_or_join_the_last_dimension() {
        let wide = t(&[4], DType::F32);
        let kind = OpKind::BitcastConvert { to: DType::U8 };
        assert_eq!(infer(&kind, &[&wide]), Ok(vec![t(&[4, 4], DType::U8)]));
        let back = OpKind::BitcastConvert { to: DType::F32 };
        assert_eq!(infer(&back, &[&t(&[4, 4], DType::U8)]), Ok(vec![wide]));
        refused(back, &[&t(&[4, 3], DType::U8)], "last dimension of 4");
    }

    #[test]
    fn linear_algebra_needs_square_matrices_that_fit() {
        let a = t(&[2, 3, 3], DType::F32);
        assert_eq!(
            infer(&OpKind::Cholesky { lower: true }, &[&a]),
            Ok(vec![a.clone()])
        );
        refused(
            OpKind::Cholesky { lower: true },
            &[&t(&[3, 4], DType::F32)],
            "square float matrices",
        );
    }
}
