//! Builders for the StableHLO IR. Each computes the result type from its operands and
//! attributes following the StableHLO spec and refuses ill-typed input.

use std::sync::Arc;

use crate::ir::*;
use crate::types::{ElemType, TensorType};

/// A type error found while building an op: which op and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct TypeError {
    pub op: &'static str,
    pub message: String,
}

pub type BuildResult<T> = Result<T, TypeError>;

fn fail<T>(op: &'static str, message: impl Into<String>) -> BuildResult<T> {
    Err(TypeError {
        op,
        message: message.into(),
    })
}

pub struct Builder {
    func: Func,
    loc: Arc<Loc>,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            func: Func::default(),
            loc: Arc::new(Loc {
                node: String::new(),
                file: None,
            }),
        }
    }

    pub fn set_loc(&mut self, loc: Arc<Loc>) {
        self.loc = loc;
    }

    pub fn ty(&self, v: Value) -> &TensorType {
        self.func.ty(v)
    }

    pub fn shape(&self, v: Value) -> &[i64] {
        &self.func.ty(v).shape
    }

    pub fn elem(&self, v: Value) -> ElemType {
        self.func.ty(v).elem
    }

    fn new_value(&mut self, ty: TensorType) -> Value {
        self.func.add_value(ty)
    }

    fn push(
        &mut self,
        kind: OpKind,
        operands: Vec<Value>,
        result_types: Vec<TensorType>,
    ) -> Vec<Value> {
        let results: Vec<Value> = result_types
            .into_iter()
            .map(|t| self.new_value(t))
            .collect();
        self.func.ops.push(Op {
            kind,
            operands,
            results: results.clone(),
            loc: self.loc.clone(),
        });
        results
    }

    fn push1(&mut self, kind: OpKind, operands: Vec<Value>, ty: TensorType) -> Value {
        self.push(kind, operands, vec![ty])[0]
    }

    pub fn arg(&mut self, ty: TensorType, attrs: ArgAttrs) -> Value {
        let v = self.new_value(ty);
        self.func.args.push(v);
        self.func.arg_attrs.push(attrs);
        v
    }

    pub fn finish(mut self, results: Vec<Value>, result_attrs: Vec<ArgAttrs>) -> Func {
        self.func.result_attrs = result_attrs;
        self.func
            .result_attrs
            .resize(results.len(), ArgAttrs::default());
        self.func.results = results;
        self.func
    }

    // ----- constants -------------------------------------------------------------------------

    pub fn constant(&mut self, lit: Literal) -> BuildResult<Value> {
        let elem_bytes = lit.ty.elem.byte_size();
        let expected = if lit.splat {
            elem_bytes
        } else {
            lit.ty.numel() as usize * elem_bytes
        };
        if lit.ty.shape.iter().any(|&d| d < 0) || lit.bytes.len() != expected {
            return fail(
                "constant",
                format!("{} needs {expected} bytes, got {}", lit.ty, lit.bytes.len()),
            );
        }
        let ty = lit.ty.clone();
        Ok(self.push1(OpKind::Constant(lit), vec![], ty))
    }

    /// A constant tensor of `ty` with these elements, in row-major order.
    pub fn dense(&mut self, ty: TensorType, values: &[f64]) -> BuildResult<Value> {
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| scalar_bytes(ty.elem, v))
            .collect();
        self.constant(Literal {
            ty,
            bytes: bytes.into(),
            splat: false,
        })
    }

    /// A tensor of `ty` filled with `value` (converted to the element type as torch would).
    pub fn splat(&mut self, ty: &TensorType, value: f64) -> Value {
        let lit = Literal {
            ty: ty.clone(),
            bytes: scalar_bytes(ty.elem, value).into(),
            splat: true,
        };
        self.constant(lit).expect("splat constants are well typed")
    }

    pub fn scalar(&mut self, elem: ElemType, value: f64) -> Value {
        self.splat(&TensorType::scalar(elem), value)
    }

    pub fn iota(&mut self, ty: TensorType, dim: i64) -> BuildResult<Value> {
        if dim < 0 || dim as usize >= ty.rank() {
            return fail("iota", format!("dimension {dim} out of range for {ty}"));
        }
        Ok(self.push1(OpKind::Iota { dim }, vec![], ty))
    }

    // ----- element-wise ----------------------------------------------------------------------

    pub fn unary(&mut self, op: UnaryOp, x: Value) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        if op.float_only() && !ty.elem.is_float() {
            return fail(
                op.op_name(),
                format!("needs a floating-point operand, got {ty}"),
            );
        }
        if op == UnaryOp::Not && ty.elem.is_float() {
            return fail(
                op.op_name(),
                format!("needs an integer or boolean operand, got {ty}"),
            );
        }
        if matches!(op, UnaryOp::Abs | UnaryOp::Neg | UnaryOp::Sign) && ty.elem.is_bool() {
            return fail(op.op_name(), format!("is not defined on booleans ({ty})"));
        }
        // The magnitude of a complex number is real.
        let result = if op == UnaryOp::Abs {
            ty.with_elem(ty.elem.real_part())
        } else {
            ty
        };
        Ok(self.push1(OpKind::Unary(op), vec![x], result))
    }

    fn same_types(&self, op: &'static str, values: &[Value]) -> BuildResult<TensorType> {
        let first = self.ty(values[0]).clone();
        for &v in &values[1..] {
            if *self.ty(v) != first {
                return fail(
                    op,
                    format!("operand types differ: {first} and {}", self.ty(v)),
                );
            }
        }
        Ok(first)
    }

    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> BuildResult<Value> {
        let ty = self.same_types(op.op_name(), &[a, b])?;
        if op.is_logical() && ty.elem.is_float() {
            return fail(
                op.op_name(),
                format!("needs integer or boolean operands, got {ty}"),
            );
        }
        if matches!(op, BinaryOp::Atan2) && !ty.elem.is_float() {
            return fail(
                op.op_name(),
                format!("needs floating-point operands, got {ty}"),
            );
        }
        if matches!(
            op,
            BinaryOp::ShiftLeft | BinaryOp::ShiftRightArithmetic | BinaryOp::ShiftRightLogical
        ) && !ty.elem.is_integer()
        {
            return fail(op.op_name(), format!("needs integer operands, got {ty}"));
        }
        Ok(self.push1(OpKind::Binary(op), vec![a, b], ty))
    }

    pub fn compare(&mut self, dir: CompareDir, a: Value, b: Value) -> BuildResult<Value> {
        let ty = self.same_types("stablehlo.compare", &[a, b])?;
        let cmp = ty.elem.comparison_type();
        Ok(self.push1(
            OpKind::Compare { dir, cmp },
            vec![a, b],
            ty.with_elem(ElemType::I1),
        ))
    }

    pub fn select(&mut self, pred: Value, on_true: Value, on_false: Value) -> BuildResult<Value> {
        let ty = self.same_types("stablehlo.select", &[on_true, on_false])?;
        let p = self.ty(pred);
        if p.elem != ElemType::I1 || (p.rank() != 0 && p.shape != ty.shape) {
            return fail(
                "stablehlo.select",
                format!("predicate {p} does not fit {ty}"),
            );
        }
        Ok(self.push1(OpKind::Select, vec![pred, on_true, on_false], ty))
    }

    pub fn clamp(&mut self, min: Value, x: Value, max: Value) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        for bound in [min, max] {
            let b = self.ty(bound);
            if b.elem != ty.elem || (b.rank() != 0 && b.shape != ty.shape) {
                return fail("stablehlo.clamp", format!("bound {b} does not fit {ty}"));
            }
        }
        Ok(self.push1(OpKind::Clamp, vec![min, x, max], ty))
    }

    /// Converts element type; returns `x` itself when it already has that type.
    /// A complex value converted to a real type keeps its real part, as in torch.
    pub fn convert(&mut self, x: Value, elem: ElemType) -> Value {
        if self.elem(x) == elem {
            return x;
        }
        let x = if self.elem(x).is_complex() && !elem.is_complex() {
            self.real(x).expect("complex operand")
        } else {
            x
        };
        if self.elem(x) == elem {
            return x;
        }
        let ty = self.ty(x).with_elem(elem);
        self.push1(OpKind::Convert, vec![x], ty)
    }

    pub fn is_finite(&mut self, x: Value) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        if !ty.elem.is_float() {
            return fail(
                "stablehlo.is_finite",
                format!("needs a floating-point operand, got {ty}"),
            );
        }
        Ok(self.push1(OpKind::IsFinite, vec![x], ty.with_elem(ElemType::I1)))
    }

    // ----- shapes ----------------------------------------------------------------------------

    pub fn broadcast_in_dim(
        &mut self,
        x: Value,
        shape: &[i64],
        dims: &[i64],
    ) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        if dims.len() != ty.rank() {
            return fail(
                "stablehlo.broadcast_in_dim",
                format!("{} dimensions given for {ty}", dims.len()),
            );
        }
        for (i, &d) in dims.iter().enumerate() {
            let ok = d >= 0
                && (d as usize) < shape.len()
                && (ty.shape[i] == 1 || ty.shape[i] == shape[d as usize])
                && (i == 0 || dims[i - 1] < d);
            if !ok {
                return fail(
                    "stablehlo.broadcast_in_dim",
                    format!("cannot broadcast {ty} to {shape:?} with dimensions {dims:?}"),
                );
            }
        }
        if ty.shape == shape {
            return Ok(x);
        }
        Ok(self.push1(
            OpKind::BroadcastInDim {
                dims: dims.to_vec(),
            },
            vec![x],
            ty.with_shape(shape.to_vec()),
        ))
    }

    /// Broadcasts to `shape` with numpy's rule (trailing dimensions aligned).
    pub fn broadcast_to(&mut self, x: Value, shape: &[i64]) -> BuildResult<Value> {
        let rank = self.ty(x).rank();
        if rank > shape.len() {
            return fail(
                "stablehlo.broadcast_in_dim",
                format!("cannot broadcast {} to {shape:?}", self.ty(x)),
            );
        }
        let offset = (shape.len() - rank) as i64;
        let dims: Vec<i64> = (0..rank as i64).map(|i| i + offset).collect();
        self.broadcast_in_dim(x, shape, &dims)
    }

    pub fn reshape(&mut self, x: Value, shape: &[i64]) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        if shape.iter().any(|&d| d < 0) || shape.iter().product::<i64>() != ty.numel() {
            return fail(
                "stablehlo.reshape",
                format!("cannot reshape {ty} to {shape:?}"),
            );
        }
        if ty.shape == shape {
            return Ok(x);
        }
        Ok(self.push1(OpKind::Reshape, vec![x], ty.with_shape(shape.to_vec())))
    }

    pub fn transpose(&mut self, x: Value, perm: &[i64]) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        let mut seen = vec![false; ty.rank()];
        let valid = perm.len() == ty.rank()
            && perm.iter().all(|&p| {
                p >= 0
                    && (p as usize) < ty.rank()
                    && !std::mem::replace(&mut seen[p as usize], true)
            });
        if !valid {
            return fail(
                "stablehlo.transpose",
                format!("{perm:?} is not a permutation of the dimensions of {ty}"),
            );
        }
        if perm.iter().enumerate().all(|(i, &p)| i as i64 == p) {
            return Ok(x);
        }
        let shape = perm.iter().map(|&p| ty.shape[p as usize]).collect();
        Ok(self.push1(
            OpKind::Transpose {
                perm: perm.to_vec(),
            },
            vec![x],
            ty.with_shape(shape),
        ))
    }

    pub fn slice(
        &mut self,
        x: Value,
        start: &[i64],
        limit: &[i64],
        strides: &[i64],
    ) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        if start.len() != ty.rank() || limit.len() != ty.rank() || strides.len() != ty.rank() {
            return fail(
                "stablehlo.slice",
                format!("bounds of the wrong rank for {ty}"),
            );
        }
        let mut shape = Vec::with_capacity(ty.rank());
        for i in 0..ty.rank() {
            if start[i] < 0 || limit[i] < start[i] || limit[i] > ty.shape[i] || strides[i] < 1 {
                return fail(
                    "stablehlo.slice",
                    format!("invalid slice {start:?}..{limit:?} step {strides:?} of {ty}"),
                );
            }
            shape.push((limit[i] - start[i] + strides[i] - 1) / strides[i]);
        }
        if shape == ty.shape {
            return Ok(x);
        }
        Ok(self.push1(
            OpKind::Slice {
                start: start.to_vec(),
                limit: limit.to_vec(),
                strides: strides.to_vec(),
            },
            vec![x],
            ty.with_shape(shape),
        ))
    }

    /// Slices one dimension, keeping the others whole.
    pub fn slice_dim(
        &mut self,
        x: Value,
        dim: usize,
        start: i64,
        limit: i64,
        step: i64,
    ) -> BuildResult<Value> {
        let shape = self.shape(x).to_vec();
        let mut s = vec![0; shape.len()];
        let mut l = shape.clone();
        let mut st = vec![1; shape.len()];
        if dim >= shape.len() {
            return fail(
                "stablehlo.slice",
                format!("dimension {dim} out of range for {}", self.ty(x)),
            );
        }
        s[dim] = start;
        l[dim] = limit;
        st[dim] = step;
        self.slice(x, &s, &l, &st)
    }

    pub fn concatenate(&mut self, xs: &[Value], dim: i64) -> BuildResult<Value> {
        if xs.is_empty() {
            return fail("stablehlo.concatenate", "no operands");
        }
        let first = self.ty(xs[0]).clone();
        if dim < 0 || dim as usize >= first.rank() {
            return fail(
                "stablehlo.concatenate",
                format!("dimension {dim} out of range for {first}"),
            );
        }
        let mut total = 0;
        for &x in xs {
            let t = self.ty(x);
            let compatible = t.elem == first.elem
                && t.rank() == first.rank()
                && (0..t.rank()).all(|i| i == dim as usize || t.shape[i] == first.shape[i]);
            if !compatible {
                return fail(
                    "stablehlo.concatenate",
                    format!("cannot concatenate {first} and {t} along {dim}"),
                );
            }
            total += t.shape[dim as usize];
        }
        if xs.len() == 1 {
            return Ok(xs[0]);
        }
        let mut shape = first.shape.clone();
        shape[dim as usize] = total;
        Ok(self.push1(
            OpKind::Concatenate { dim },
            xs.to_vec(),
            first.with_shape(shape),
        ))
    }

    pub fn pad(
        &mut self,
        x: Value,
        value: Value,
        low: &[i64],
        high: &[i64],
        interior: &[i64],
    ) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        let vt = self.ty(value);
        if vt.rank() != 0 || vt.elem != ty.elem {
            return fail(
                "stablehlo.pad",
                format!("padding value {vt} does not fit {ty}"),
            );
        }
        if low.len() != ty.rank() || high.len() != ty.rank() || interior.len() != ty.rank() {
            return fail(
                "stablehlo.pad",
                format!("padding of the wrong rank for {ty}"),
            );
        }
        let mut shape = Vec::with_capacity(ty.rank());
        for i in 0..ty.rank() {
            let d = ty.shape[i];
            let n = low[i] + high[i] + d + (d - 1).max(0) * interior[i];
            if interior[i] < 0 || n < 0 {
                return fail(
                    "stablehlo.pad",
                    format!("invalid padding {low:?}/{high:?}/{interior:?} of {ty}"),
                );
            }
            shape.push(n);
        }
        if low.iter().chain(high).chain(interior).all(|&p| p == 0) {
            return Ok(x);
        }
        Ok(self.push1(
            OpKind::Pad {
                low: low.to_vec(),
                high: high.to_vec(),
                interior: interior.to_vec(),
            },
            vec![x, value],
            ty.with_shape(shape),
        ))
    }

    pub fn reverse(&mut self, x: Value, dims: &[i64]) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        if dims.iter().any(|&d| d < 0 || d as usize >= ty.rank()) {
            return fail(
                "stablehlo.reverse",
                format!("dimensions {dims:?} out of range for {ty}"),
            );
        }
        Ok(self.push1(
            OpKind::Reverse {
                dims: dims.to_vec(),
            },
            vec![x],
            ty,
        ))
    }

    // ----- linear algebra --------------------------------------------------------------------

    pub fn dot_general(
        &mut self,
        a: Value,
        b: Value,
        dims: DotDims,
        precision: Precision,
    ) -> BuildResult<Value> {
        const OP: &str = "stablehlo.dot_general";
        let (ta, tb) = (self.ty(a).clone(), self.ty(b).clone());
        if ta.elem != tb.elem {
            return fail(OP, format!("element types differ: {ta} and {tb}"));
        }
        let in_range =
            |ds: &[i64], t: &TensorType| ds.iter().all(|&d| d >= 0 && (d as usize) < t.rank());
        if dims.lhs_batch.len() != dims.rhs_batch.len()
            || dims.lhs_contracting.len() != dims.rhs_contracting.len()
            || !in_range(&dims.lhs_batch, &ta)
            || !in_range(&dims.lhs_contracting, &ta)
            || !in_range(&dims.rhs_batch, &tb)
            || !in_range(&dims.rhs_contracting, &tb)
        {
            return fail(
                OP,
                format!("invalid dimension numbers {dims:?} for {ta} and {tb}"),
            );
        }
        for (l, r) in dims
            .lhs_batch
            .iter()
            .zip(&dims.rhs_batch)
            .chain(dims.lhs_contracting.iter().zip(&dims.rhs_contracting))
        {
            if ta.shape[*l as usize] != tb.shape[*r as usize] {
                return fail(
                    OP,
                    format!("dimension {l} of {ta} does not match dimension {r} of {tb}"),
                );
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
        shape.extend(free(&ta, &dims.lhs_batch, &dims.lhs_contracting));
        shape.extend(free(&tb, &dims.rhs_batch, &dims.rhs_contracting));
        let ty = TensorType::new(shape, ta.elem);
        Ok(self.push1(OpKind::DotGeneral { dims, precision }, vec![a, b], ty))
    }

    pub fn convolution(&mut self, x: Value, w: Value, attrs: ConvAttrs) -> BuildResult<Value> {
        const OP: &str = "stablehlo.convolution";
        let (tx, tw) = (self.ty(x).clone(), self.ty(w).clone());
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
            return fail(
                OP,
                format!("invalid operands {tx} and {tw} or attributes {attrs:?}"),
            );
        }
        let (out_channels, in_channels, window) = attrs.kernel.split(&tw.shape);
        if tx.shape[1] != in_channels * attrs.groups || out_channels % attrs.groups != 0 {
            return fail(
                OP,
                format!(
                    "{tx} has {} channels but kernel {tw} with {} groups expects {}",
                    tx.shape[1],
                    attrs.groups,
                    in_channels * attrs.groups
                ),
            );
        }
        if tx.shape[0] % attrs.batch_groups != 0 || out_channels % attrs.batch_groups != 0 {
            return fail(
                OP,
                format!(
                    "batch {} and {} output channels do not split into {} batch groups",
                    tx.shape[0], out_channels, attrs.batch_groups
                ),
            );
        }
        let mut shape = vec![tx.shape[0] / attrs.batch_groups, out_channels];
        for (i, &size) in window.iter().enumerate() {
            let input = (tx.shape[i + 2] - 1) * attrs.lhs_dilation[i] + 1;
            let padded = input + attrs.padding[i].0 + attrs.padding[i].1;
            let kernel = (size - 1) * attrs.rhs_dilation[i] + 1;
            if padded < kernel || attrs.strides[i] < 1 {
                return fail(
                    OP,
                    format!("kernel {tw} does not fit input {tx} with {attrs:?}"),
                );
            }
            shape.push((padded - kernel) / attrs.strides[i] + 1);
        }
        let ty = TensorType::new(shape, tx.elem);
        Ok(self.push1(OpKind::Convolution(attrs), vec![x, w], ty))
    }

    // ----- reductions ------------------------------------------------------------------------

    /// Reduces `inputs` (with matching `inits`, scalars) over `dims`.
    pub fn reduce(
        &mut self,
        inputs: &[Value],
        inits: &[Value],
        dims: &[i64],
        body: ReduceBody,
    ) -> BuildResult<Vec<Value>> {
        const OP: &str = "stablehlo.reduce";
        let arity = match body {
            ReduceBody::Binary(_) => 1,
            ReduceBody::ArgMax | ReduceBody::ArgMin => 2,
        };
        if inputs.len() != arity || inits.len() != arity {
            return fail(OP, format!("{body:?} takes {arity} operands"));
        }
        let shape = self.shape(inputs[0]).to_vec();
        for (&x, &init) in inputs.iter().zip(inits) {
            let (tx, ti) = (self.ty(x), self.ty(init));
            if tx.shape != shape || ti.rank() != 0 || ti.elem != tx.elem {
                return fail(OP, format!("operand {tx} with init {ti} does not fit"));
            }
        }
        if dims.iter().any(|&d| d < 0 || d as usize >= shape.len()) {
            return fail(
                OP,
                format!("dimensions {dims:?} out of range for {shape:?}"),
            );
        }
        let out_shape: Vec<i64> = (0..shape.len())
            .filter(|d| !dims.contains(&(*d as i64)))
            .map(|d| shape[d])
            .collect();
        let types = inputs
            .iter()
            .map(|&x| TensorType::new(out_shape.clone(), self.elem(x)))
            .collect();
        let mut operands = inputs.to_vec();
        operands.extend_from_slice(inits);
        let mut sorted = dims.to_vec();
        sorted.sort_unstable();
        Ok(self.push(OpKind::Reduce { dims: sorted, body }, operands, types))
    }

    /// Reduces `x` over `dims` with `op`, starting from `op`'s identity.
    pub fn reduce_by(&mut self, x: Value, dims: &[i64], op: BinaryOp) -> BuildResult<Value> {
        let elem = self.elem(x);
        let init = self.scalar(elem, reduction_identity(op, elem));
        Ok(self.reduce(&[x], &[init], dims, ReduceBody::Binary(op))?[0])
    }

    pub fn reduce_window(
        &mut self,
        x: Value,
        init: Value,
        window: &[i64],
        strides: &[i64],
        padding: &[(i64, i64)],
        op: BinaryOp,
    ) -> BuildResult<Value> {
        const OP: &str = "stablehlo.reduce_window";
        let tx = self.ty(x).clone();
        let ti = self.ty(init);
        if ti.rank() != 0
            || ti.elem != tx.elem
            || window.len() != tx.rank()
            || strides.len() != tx.rank()
            || padding.len() != tx.rank()
        {
            return fail(OP, format!("attributes or init {ti} do not fit {tx}"));
        }
        let mut shape = Vec::with_capacity(tx.rank());
        for i in 0..tx.rank() {
            let padded = tx.shape[i] + padding[i].0 + padding[i].1;
            if window[i] < 1 || strides[i] < 1 || padded < window[i] {
                return fail(
                    OP,
                    format!("window {window:?} does not fit {tx} padded by {padding:?}"),
                );
            }
            shape.push((padded - window[i]) / strides[i] + 1);
        }
        Ok(self.push1(
            OpKind::ReduceWindow {
                window: window.to_vec(),
                strides: strides.to_vec(),
                padding: padding.to_vec(),
                body: ReduceBody::Binary(op),
            },
            vec![x, init],
            tx.with_shape(shape),
        ))
    }

    // ----- indexing --------------------------------------------------------------------------

    pub fn gather(&mut self, x: Value, indices: Value, dims: GatherDims) -> BuildResult<Value> {
        const OP: &str = "stablehlo.gather";
        let (tx, ti) = (self.ty(x).clone(), self.ty(indices).clone());
        if !ti.elem.is_integer() {
            return fail(OP, format!("indices must be integers, got {ti}"));
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
            return fail(
                OP,
                format!(
                    "invalid slice sizes {:?} or index_vector_dim for {tx} and {ti}",
                    dims.slice_sizes
                ),
            );
        }
        let index_len = if (dims.index_vector_dim as usize) < ti.rank() {
            ti.shape[dims.index_vector_dim as usize]
        } else {
            1
        };
        if dims.start_index_map.len() as i64 != index_len {
            return fail(
                OP,
                format!(
                    "start_index_map {:?} does not match index vectors of length {index_len}",
                    dims.start_index_map
                ),
            );
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
            return fail(
                OP,
                format!(
                    "offset_dims {:?} do not match the {} offset dimensions",
                    dims.offset_dims,
                    offsets.len()
                ),
            );
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
                    return fail(
                        OP,
                        format!("offset_dims {:?} out of range", dims.offset_dims),
                    );
                }
                shape.push(batch[bi]);
                bi += 1;
            }
        }
        Ok(self.push1(OpKind::Gather(dims), vec![x, indices], tx.with_shape(shape)))
    }

    pub fn scatter(
        &mut self,
        x: Value,
        indices: Value,
        updates: Value,
        dims: ScatterDims,
        mode: ScatterMode,
    ) -> BuildResult<Value> {
        const OP: &str = "stablehlo.scatter";
        let (tx, ti, tu) = (
            self.ty(x).clone(),
            self.ty(indices).clone(),
            self.ty(updates).clone(),
        );
        if !ti.elem.is_integer() || tu.elem != tx.elem {
            return fail(OP, format!("indices {ti} / updates {tu} do not fit {tx}"));
        }
        let window_rank =
            tx.rank() - dims.inserted_window_dims.len() - dims.input_batching_dims.len();
        if dims.update_window_dims.len() != window_rank
            || dims.index_vector_dim < 0
            || dims.index_vector_dim as usize > ti.rank()
        {
            return fail(
                OP,
                format!("dimension numbers {dims:?} do not fit {tx}, {ti}, {tu}"),
            );
        }
        let scatter_rank = ti.rank() - usize::from((dims.index_vector_dim as usize) < ti.rank());
        if tu.rank() != scatter_rank + window_rank {
            return fail(
                OP,
                format!("updates {tu} must have rank {}", scatter_rank + window_rank),
            );
        }
        Ok(self.push1(
            OpKind::Scatter { dims, mode },
            vec![x, indices, updates],
            tx,
        ))
    }

    /// Sorts `xs` (same shape) along `dim` by the values of `xs[0]`; stable.
    pub fn sort(&mut self, xs: &[Value], dim: i64, order: SortOrder) -> BuildResult<Vec<Value>> {
        let shape = self.shape(xs[0]).to_vec();
        if dim < 0 || dim as usize >= shape.len() || xs.iter().any(|&x| self.shape(x) != shape) {
            return fail(
                "stablehlo.sort",
                format!("operands or dimension {dim} do not fit {shape:?}"),
            );
        }
        let types = xs.iter().map(|&x| self.ty(x).clone()).collect();
        Ok(self.push(OpKind::Sort { dim, order }, xs.to_vec(), types))
    }

    // ----- complex numbers -------------------------------------------------------------------

    fn complex_operand(&self, op: &'static str, x: Value) -> BuildResult<TensorType> {
        let ty = self.ty(x).clone();
        if !ty.elem.is_complex() {
            return fail(op, format!("needs a complex operand, got {ty}"));
        }
        Ok(ty)
    }

    /// The real part of a complex tensor.
    pub fn real(&mut self, x: Value) -> BuildResult<Value> {
        let ty = self.complex_operand("stablehlo.real", x)?;
        Ok(self.push1(OpKind::Real, vec![x], ty.with_elem(ty.elem.real_part())))
    }

    /// The imaginary part of a complex tensor.
    pub fn imag(&mut self, x: Value) -> BuildResult<Value> {
        let ty = self.complex_operand("stablehlo.imag", x)?;
        Ok(self.push1(OpKind::Imag, vec![x], ty.with_elem(ty.elem.real_part())))
    }

    /// `re + i im` from float32 or float64 parts of one type.
    pub fn complex(&mut self, re: Value, im: Value) -> BuildResult<Value> {
        let ty = self.same_types("stablehlo.complex", &[re, im])?;
        let Some(elem) = ty.elem.complex_of() else {
            return fail(
                "stablehlo.complex",
                format!("needs float32 or float64 parts, got {ty}"),
            );
        };
        Ok(self.push1(OpKind::Complex, vec![re, im], ty.with_elem(elem)))
    }

    /// The discrete Fourier transform `kind` over the trailing `length.len()` (1 to 3)
    /// dimensions of `x`.
    pub fn fft(&mut self, x: Value, kind: FftKind, length: &[i64]) -> BuildResult<Value> {
        let ty = self.ty(x).clone();
        let k = length.len();
        let bad = |why: String| fail("stablehlo.fft", format!("{why} ({ty}, length {length:?})"));
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
        Ok(self.push1(
            OpKind::Fft {
                kind,
                length: length.to_vec(),
            },
            vec![x],
            TensorType::new(out_shape, out_elem),
        ))
    }

    // ----- random numbers --------------------------------------------------------------------

    /// Random bits of `shape` (u32 or u64 elements) from a THREE_FRY generator `state`
    /// (tensor<2xui64>); returns (the next state, the bits).
    pub fn rng_bit_generator(
        &mut self,
        state: Value,
        shape: &[i64],
        elem: ElemType,
    ) -> BuildResult<(Value, Value)> {
        let ts = self.ty(state).clone();
        if ts != TensorType::new(vec![2], ElemType::U64)
            || !matches!(elem, ElemType::U32 | ElemType::U64)
        {
            return fail(
                "stablehlo.rng_bit_generator",
                format!("state {ts} or bits of {elem:?} unsupported"),
            );
        }
        let out = self.push(
            OpKind::RngBitGenerator,
            vec![state],
            vec![ts, TensorType::new(shape.to_vec(), elem)],
        );
        Ok((out[0], out[1]))
    }
}

/// The reduction identity of `op` for `elem` (lowest value for max, and so on).
pub fn reduction_identity(op: BinaryOp, elem: ElemType) -> f64 {
    let (lowest, highest) = if elem.is_float() {
        (f64::NEG_INFINITY, f64::INFINITY)
    } else if elem.is_bool() {
        (0.0, 1.0)
    } else {
        let bits = (elem.byte_size() * 8) as i32;
        if elem.is_unsigned() {
            (0.0, 2f64.powi(bits) - 1.0)
        } else {
            (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1) - 1.0)
        }
    };
    match op {
        BinaryOp::Max => lowest,
        BinaryOp::Min => highest,
        BinaryOp::Mul | BinaryOp::And => 1.0,
        _ => 0.0,
    }
}

/// Little-endian bytes of one element of `elem` holding `value` (as torch would convert it).
pub fn scalar_bytes(elem: ElemType, value: f64) -> Vec<u8> {
    match elem {
        ElemType::I1 => vec![u8::from(value != 0.0)],
        ElemType::I8 => (value as i8).to_le_bytes().to_vec(),
        ElemType::I16 => (value as i16).to_le_bytes().to_vec(),
        ElemType::I32 => (value as i32).to_le_bytes().to_vec(),
        ElemType::I64 => (value as i64).to_le_bytes().to_vec(),
        ElemType::U8 => (value as u8).to_le_bytes().to_vec(),
        ElemType::U16 => (value as u16).to_le_bytes().to_vec(),
        ElemType::U32 => (value as u32).to_le_bytes().to_vec(),
        ElemType::U64 => (value as u64).to_le_bytes().to_vec(),
        ElemType::F16 => f32_to_f16_bits(value as f32).to_le_bytes().to_vec(),
        ElemType::BF16 => f32_to_bf16_bits(value as f32).to_le_bytes().to_vec(),
        ElemType::F32 => (value as f32).to_le_bytes().to_vec(),
        ElemType::F64 => value.to_le_bytes().to_vec(),
        // A real number: the imaginary part is zero.
        ElemType::C64 | ElemType::C128 => {
            let mut bytes = scalar_bytes(elem.real_part(), value);
            bytes.resize(elem.byte_size(), 0);
            bytes
        }
    }
}

/// Round-to-nearest-even conversion of an f32 to bfloat16 bits.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    ((bits + round) >> 16) as u16
}

/// Round-to-nearest-even conversion of an f32 to IEEE half bits.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = m >> shift;
        let rem = m & ((1 << shift) - 1);
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32t(shape: &[i64]) -> TensorType {
        TensorType::new(shape.to_vec(), ElemType::F32)
    }

    #[test]
    fn dot_general_computes_result_shape() {
        let mut b = Builder::new();
        let x = b.arg(f32t(&[2, 3, 4]), ArgAttrs::default());
        let y = b.arg(f32t(&[2, 4, 5]), ArgAttrs::default());
        let dims = DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contracting: vec![2],
            rhs_contracting: vec![1],
        };
        let z = b
            .dot_general(x, y, dims.clone(), Precision::Default)
            .unwrap();
        assert_eq!(b.shape(z), &[2, 3, 5]);
        let bad = b.dot_general(x, x, dims, Precision::Default).unwrap_err();
        assert!(bad.message.contains("does not match"), "{bad}");
    }

    #[test]
    fn fft_types_follow_the_transform() {
        let mut b = Builder::new();
        let x = b.arg(f32t(&[2, 8]), ArgAttrs::default());
        let half = b.fft(x, FftKind::Rfft, &[8]).unwrap();
        assert_eq!(b.ty(half), &TensorType::new(vec![2, 5], ElemType::C64));
        let back = b.fft(half, FftKind::Irfft, &[8]).unwrap();
        assert_eq!(b.ty(back), &f32t(&[2, 8]));
        let full = b.fft(half, FftKind::Fft, &[2, 5]).unwrap();
        assert_eq!(b.ty(full), b.ty(half));
        let abs = b.unary(UnaryOp::Abs, full).unwrap();
        assert_eq!(b.ty(abs), &f32t(&[2, 5]));
        for (input, kind, length, why) in [
            (x, FftKind::Fft, vec![8], "does not take"),
            (
                half,
                FftKind::Irfft,
                vec![10],
                "trailing dimensions must be [6]",
            ),
            (x, FftKind::Rfft, vec![2, 8, 1, 1], "1 to 3 trailing"),
        ] {
            let e = b.fft(input, kind, &length).unwrap_err();
            assert!(e.message.contains(why), "{e}");
        }
        let e = b.unary(UnaryOp::Exp, half).unwrap_err();
        assert!(e.message.contains("floating-point"), "{e}");
        let e = b.complex(half, half).unwrap_err();
        assert!(e.message.contains("float32 or float64"), "{e}");
    }

    #[test]
    fn rejects_ill_typed_ops() {
        let mut b = Builder::new();
        let x = b.arg(f32t(&[2, 3]), ArgAttrs::default());
        let i = b.arg(
            TensorType::new(vec![2, 3], ElemType::I32),
            ArgAttrs::default(),
        );
        assert!(b.binary(BinaryOp::Add, x, i).is_err());
        assert!(b.reshape(x, &[4]).is_err());
        assert!(b.transpose(x, &[0, 0]).is_err());
        assert!(b.unary(UnaryOp::Exp, i).is_err());
        assert!(b.slice(x, &[0, 0], &[3, 3], &[1, 1]).is_err());
        assert!(b.broadcast_in_dim(x, &[2, 4], &[0, 1]).is_err());
    }

    #[test]
    fn convolution_and_window_shapes() {
        let mut b = Builder::new();
        let x = b.arg(f32t(&[1, 4, 8, 8]), ArgAttrs::default());
        let w = b.arg(f32t(&[6, 2, 3, 3]), ArgAttrs::default());
        let attrs = ConvAttrs {
            strides: vec![2, 2],
            padding: vec![(1, 1); 2],
            lhs_dilation: vec![1, 1],
            rhs_dilation: vec![1, 1],
            groups: 2,
            batch_groups: 1,
            precision: Precision::Default,
            kernel: KernelLayout::OutInSpatial,
        };
        let y = b.convolution(x, w, attrs).unwrap();
        assert_eq!(b.shape(y), &[1, 6, 4, 4]);
        let init = b.scalar(ElemType::F32, f64::NEG_INFINITY);
        let p = b
            .reduce_window(
                y,
                init,
                &[1, 1, 3, 3],
                &[1, 1, 2, 2],
                &[(0, 0), (0, 0), (1, 1), (1, 1)],
                BinaryOp::Max,
            )
            .unwrap();
        assert_eq!(b.shape(p), &[1, 6, 2, 2]);
    }

    #[test]
    fn half_conversions_round_to_nearest_even() {
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(-2.5), 0xc100);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00);
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
    }
}
