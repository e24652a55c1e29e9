//! Building functions. [`Builder::op`] adds any op whose typing rule holds and computes its
//! result types; the named methods build one op each (returning an operand itself where the
//! op would change nothing, as a reshape to the same shape). [`Rewriter`] rebuilds a function
//! op by op, for passes that change more than one op in place.

use std::sync::Arc;

use tpuc_dtype::DType;

use super::attrs::{ArgAttrs, ConvAttrs, DotDims, GatherDims, Precision, ScatterDims};
use super::func::{Func, Op};
use super::literal::{reduction_identity, scalar_bytes};
use super::ops::*;
use super::types::TensorType;
use super::typing::infer;

/// A type error found while building an op: which op and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct TypeError {
    pub op: &'static str,
    pub message: String,
}

pub type BuildResult<T> = Result<T, TypeError>;

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
            loc: Loc::unknown(),
        }
    }

    /// Where the ops built from now on come from.
    pub fn set_loc(&mut self, loc: Arc<Loc>) {
        self.loc = loc;
    }

    pub fn ty(&self, v: Value) -> &TensorType {
        self.func.ty(v)
    }

    pub fn shape(&self, v: Value) -> &[i64] {
        &self.func.ty(v).shape
    }

    pub fn elem(&self, v: Value) -> DType {
        self.func.ty(v).elem
    }

    /// Adds `kind` applied to `operands`; its typing rule gives the results' types.
    pub fn op(&mut self, kind: OpKind, operands: &[Value]) -> BuildResult<Vec<Value>> {
        if let Some(v) = operands.iter().find(|v| !self.func.defines(**v)) {
            return Err(TypeError {
                op: kind.name(),
                message: format!(
                    "operand %{} is not a value of this function (a region reads only its arguments)",
                    v.index()
                ),
            });
        }
        let types: Vec<&TensorType> = operands.iter().map(|&v| self.func.ty(v)).collect();
        let result_types = infer(&kind, &types).map_err(|message| TypeError {
            op: kind.name(),
            message,
        })?;
        let results: Vec<Value> = result_types
            .into_iter()
            .map(|t| self.func.add_value(t))
            .collect();
        self.func.ops.push(Op {
            kind,
            operands: operands.to_vec(),
            results: results.clone(),
            loc: self.loc.clone(),
        });
        Ok(results)
    }

    /// [`Builder::op`] for an op with one result.
    pub fn op1(&mut self, kind: OpKind, operands: &[Value]) -> BuildResult<Value> {
        let name = kind.name();
        match self.op(kind, operands)?[..] {
            [v] => Ok(v),
            _ => Err(TypeError {
                op: name,
                message: "has more than one result".into(),
            }),
        }
    }

    pub fn arg(&mut self, ty: TensorType, attrs: ArgAttrs) -> Value {
        self.func.add_arg(ty, attrs)
    }

    /// A builder of a region of an op of this function: its values are numbered after this
    /// function's, so that one of them used inside the region (regions are closed) is caught
    /// by the verifier rather than read as another value.
    pub fn nested(&self) -> Builder {
        Builder {
            func: Func::numbered_from(self.func.value_count() as u32),
            loc: self.loc.clone(),
        }
    }

    /// A region taking arguments of `args`' types, whose ops and results `build` makes (on a
    /// builder of its own, from the region's arguments).
    pub fn region(
        &self,
        args: &[TensorType],
        build: impl FnOnce(&mut Builder, &[Value]) -> BuildResult<Vec<Value>>,
    ) -> BuildResult<Region> {
        let mut inner = self.nested();
        let values: Vec<Value> = args
            .iter()
            .map(|t| inner.arg(t.clone(), ArgAttrs::default()))
            .collect();
        let results = build(&mut inner, &values)?;
        Ok(Region::new(inner.finish(results, vec![])))
    }

    /// The ops of `f` appended here, its arguments standing for `args`: what it returns.
    pub fn inline(&mut self, f: &Func, args: &[Value]) -> BuildResult<Vec<Value>> {
        if args.len() != f.args().len() {
            return Err(TypeError {
                op: "inline",
                message: format!(
                    "{} arguments for a function of {}",
                    args.len(),
                    f.args().len()
                ),
            });
        }
        let mut map: Vec<Option<Value>> = vec![None; f.value_count()];
        for (&a, &v) in f.args().iter().zip(args) {
            map[a.index()] = Some(v);
        }
        let lookup = |map: &[Option<Value>], v: Value| {
            map[v.index()].ok_or_else(|| TypeError {
                op: "inline",
                message: format!("%{} is used before it is defined", v.index()),
            })
        };
        for op in f.ops() {
            let operands = op
                .operands()
                .iter()
                .map(|&v| lookup(&map, v))
                .collect::<BuildResult<Vec<_>>>()?;
            let saved = std::mem::replace(&mut self.loc, op.loc().clone());
            let results = self.op(op.kind().clone(), &operands);
            self.loc = saved;
            for (&old, new) in op.results().iter().zip(results?) {
                map[old.index()] = Some(new);
            }
        }
        f.results().iter().map(|&r| lookup(&map, r)).collect()
    }

    /// `stablehlo.while` from the values `init`: `cond` builds the condition (a boolean scalar)
    /// and `body` the next values, each from the values of the current iteration, on builders
    /// of their own. Values of this function a region needs are carried through it.
    pub fn while_loop(
        &mut self,
        init: &[Value],
        cond: impl FnOnce(&mut Builder, &[Value]) -> BuildResult<Value>,
        body: impl FnOnce(&mut Builder, &[Value]) -> BuildResult<Vec<Value>>,
    ) -> BuildResult<Vec<Value>> {
        let types: Vec<TensorType> = init.iter().map(|&v| self.ty(v).clone()).collect();
        let cond = self.region(&types, |b, values| Ok(vec![cond(b, values)?]))?;
        let body = self.region(&types, body)?;
        self.op(OpKind::While { cond, body }, init)
    }

    /// `stablehlo.case`: `index` (an i32 scalar) picks one of `branches`, each taking
    /// `operands`.
    pub fn case(
        &mut self,
        index: Value,
        operands: &[Value],
        branches: Vec<Region>,
    ) -> BuildResult<Vec<Value>> {
        let mut all = vec![index];
        all.extend_from_slice(operands);
        self.op(OpKind::Case { branches }, &all)
    }

    /// A call of `callee`, a function named `name` in the module, on `args`: its results.
    pub fn call(&mut self, name: &str, callee: Region, args: &[Value]) -> BuildResult<Vec<Value>> {
        self.op(
            OpKind::Call {
                name: name.to_string(),
                callee,
            },
            args,
        )
    }

    /// `stablehlo.composite` `name` (with its attributes and version) of `args`, computed as
    /// `decomposition` computes it: its results.
    pub fn composite(
        &mut self,
        name: &str,
        attributes: Vec<(String, AttrValue)>,
        version: i32,
        decomposition: Region,
        args: &[Value],
    ) -> BuildResult<Vec<Value>> {
        self.op(
            OpKind::Composite {
                name: name.to_string(),
                attributes,
                version,
                decomposition,
            },
            args,
        )
    }

    /// The function returning `results` (their attributes default when fewer are given).
    pub fn finish(mut self, results: Vec<Value>, mut result_attrs: Vec<ArgAttrs>) -> Func {
        result_attrs.resize(results.len(), ArgAttrs::default());
        self.func.result_attrs = result_attrs;
        self.func.results = results;
        self.func
    }

    // ----- constants -------------------------------------------------------------------------

    pub fn constant(&mut self, lit: Literal) -> BuildResult<Value> {
        self.op1(OpKind::Constant(lit), &[])
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

    pub fn scalar(&mut self, elem: DType, value: f64) -> Value {
        self.splat(&TensorType::scalar(elem), value)
    }

    pub fn iota(&mut self, ty: TensorType, dim: i64) -> BuildResult<Value> {
        self.op1(OpKind::Iota { dim, ty }, &[])
    }

    // ----- element-wise ----------------------------------------------------------------------

    pub fn unary(&mut self, op: UnaryOp, x: Value) -> BuildResult<Value> {
        self.op1(OpKind::Unary(op), &[x])
    }

    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> BuildResult<Value> {
        self.op1(OpKind::Binary(op), &[a, b])
    }

    /// Compares as the operands' element type orders them (IEEE for floats).
    pub fn compare(&mut self, dir: CompareDir, a: Value, b: Value) -> BuildResult<Value> {
        let compare = CompareType::of(self.elem(a));
        self.op1(OpKind::Compare { dir, compare }, &[a, b])
    }

    pub fn select(&mut self, pred: Value, on_true: Value, on_false: Value) -> BuildResult<Value> {
        self.op1(OpKind::Select, &[pred, on_true, on_false])
    }

    pub fn clamp(&mut self, min: Value, x: Value, max: Value) -> BuildResult<Value> {
        self.op1(OpKind::Clamp, &[min, x, max])
    }

    /// Converts element type; returns `x` itself when it already has that type.
    /// A complex value converted to a real type keeps its real part, as in torch.
    pub fn convert(&mut self, x: Value, elem: DType) -> Value {
        if self.elem(x) == elem {
            return x;
        }
        if elem == DType::F8E4M3FN && !self.elem(x).is_complex() && self.elem(x).byte_size() > 1 {
            // torch saturates at float8_e4m3fn's largest value (infinities too), where XLA's
            // conversion gives NaN: clamp first (NaN stays NaN).
            let from = self.elem(x);
            let ty = self.ty(x).clone();
            let hi = self.splat(&ty, tpuc_dtype::F8E4M3FN_MAX);
            let lo = self.splat(&ty, -tpuc_dtype::F8E4M3FN_MAX);
            let x = self.binary(BinaryOp::Max, x, lo).expect("same type");
            let x = self.binary(BinaryOp::Min, x, hi).expect("same type");
            debug_assert_eq!(self.elem(x), from);
            return self
                .op1(OpKind::Convert { to: elem }, &[x])
                .expect("any real type converts to any other");
        }
        let x = if self.elem(x).is_complex() && !elem.is_complex() {
            self.real(x).expect("complex operand")
        } else {
            x
        };
        if self.elem(x) == elem {
            return x;
        }
        self.op1(OpKind::Convert { to: elem }, &[x])
            .expect("any real type converts to any other")
    }

    /// `x`'s bits read as `elem` (see [`OpKind::BitcastConvert`]).
    pub fn bitcast(&mut self, x: Value, elem: DType) -> BuildResult<Value> {
        if self.elem(x) == elem {
            return Ok(x);
        }
        self.op1(OpKind::BitcastConvert { to: elem }, &[x])
    }

    pub fn is_finite(&mut self, x: Value) -> BuildResult<Value> {
        self.op1(OpKind::IsFinite, &[x])
    }

    // ----- shapes ----------------------------------------------------------------------------

    pub fn broadcast_in_dim(
        &mut self,
        x: Value,
        shape: &[i64],
        dims: &[i64],
    ) -> BuildResult<Value> {
        let kind = OpKind::BroadcastInDim {
            dims: dims.to_vec(),
            shape: shape.to_vec(),
        };
        if self.shape(x) == shape {
            // Checked all the same: the dimensions must fit.
            infer(&kind, &[self.ty(x)]).map_err(|message| TypeError {
                op: kind.name(),
                message,
            })?;
            return Ok(x);
        }
        self.op1(kind, &[x])
    }

    /// Broadcasts to `shape` with numpy's rule (trailing dimensions aligned).
    pub fn broadcast_to(&mut self, x: Value, shape: &[i64]) -> BuildResult<Value> {
        let rank = self.ty(x).rank();
        if rank > shape.len() {
            return Err(TypeError {
                op: "stablehlo.broadcast_in_dim",
                message: format!("cannot broadcast {} to {shape:?}", self.ty(x)),
            });
        }
        let offset = (shape.len() - rank) as i64;
        let dims: Vec<i64> = (0..rank as i64).map(|i| i + offset).collect();
        self.broadcast_in_dim(x, shape, &dims)
    }

    pub fn reshape(&mut self, x: Value, shape: &[i64]) -> BuildResult<Value> {
        let kind = OpKind::Reshape {
            shape: shape.to_vec(),
        };
        if self.shape(x) == shape {
            return Ok(x);
        }
        self.op1(kind, &[x])
    }

    pub fn transpose(&mut self, x: Value, perm: &[i64]) -> BuildResult<Value> {
        let identity = perm.iter().enumerate().all(|(i, &p)| i as i64 == p);
        if identity && perm.len() == self.ty(x).rank() {
            return Ok(x);
        }
        self.op1(
            OpKind::Transpose {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    pub fn slice(
        &mut self,
        x: Value,
        start: &[i64],
        limit: &[i64],
        strides: &[i64],
    ) -> BuildResult<Value> {
        let kind = OpKind::Slice {
            start: start.to_vec(),
            limit: limit.to_vec(),
            strides: strides.to_vec(),
        };
        let ty = infer(&kind, &[self.ty(x)]).map_err(|message| TypeError {
            op: kind.name(),
            message,
        })?;
        if ty[0] == *self.ty(x) {
            return Ok(x);
        }
        self.op1(kind, &[x])
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
        if dim >= shape.len() {
            return Err(TypeError {
                op: "stablehlo.slice",
                message: format!("dimension {dim} out of range for {}", self.ty(x)),
            });
        }
        let mut s = vec![0; shape.len()];
        let mut l = shape.clone();
        let mut st = vec![1; shape.len()];
        s[dim] = start;
        l[dim] = limit;
        st[dim] = step;
        self.slice(x, &s, &l, &st)
    }

    pub fn concatenate(&mut self, xs: &[Value], dim: i64) -> BuildResult<Value> {
        if xs.len() == 1 {
            let kind = OpKind::Concatenate { dim };
            infer(&kind, &[self.ty(xs[0])]).map_err(|message| TypeError {
                op: kind.name(),
                message,
            })?;
            return Ok(xs[0]);
        }
        self.op1(OpKind::Concatenate { dim }, xs)
    }

    pub fn pad(
        &mut self,
        x: Value,
        value: Value,
        low: &[i64],
        high: &[i64],
        interior: &[i64],
    ) -> BuildResult<Value> {
        let kind = OpKind::Pad {
            low: low.to_vec(),
            high: high.to_vec(),
            interior: interior.to_vec(),
        };
        let zero = low.iter().chain(high).chain(interior).all(|&p| p == 0);
        if zero && low.len() == self.ty(x).rank() {
            infer(&kind, &[self.ty(x), self.ty(value)]).map_err(|message| TypeError {
                op: kind.name(),
                message,
            })?;
            return Ok(x);
        }
        self.op1(kind, &[x, value])
    }

    pub fn reverse(&mut self, x: Value, dims: &[i64]) -> BuildResult<Value> {
        self.op1(
            OpKind::Reverse {
                dims: dims.to_vec(),
            },
            &[x],
        )
    }

    /// `x` with `update` written from `starts` (one integer scalar per dimension) on.
    pub fn dynamic_update_slice(
        &mut self,
        x: Value,
        update: Value,
        starts: &[Value],
    ) -> BuildResult<Value> {
        let operands: Vec<Value> = [x, update]
            .into_iter()
            .chain(starts.iter().copied())
            .collect();
        self.op1(OpKind::DynamicUpdateSlice, &operands)
    }

    /// The part of `x` of `sizes` starting at `starts` (integer scalars, one per dimension).
    pub fn dynamic_slice(
        &mut self,
        x: Value,
        starts: &[Value],
        sizes: &[i64],
    ) -> BuildResult<Value> {
        let operands: Vec<Value> = std::iter::once(x).chain(starts.iter().copied()).collect();
        self.op1(
            OpKind::DynamicSlice {
                sizes: sizes.to_vec(),
            },
            &operands,
        )
    }

    // ----- linear algebra --------------------------------------------------------------------

    pub fn dot_general(
        &mut self,
        a: Value,
        b: Value,
        dims: DotDims,
        precision: Precision,
    ) -> BuildResult<Value> {
        self.op1(OpKind::DotGeneral { dims, precision }, &[a, b])
    }

    pub fn convolution(&mut self, x: Value, w: Value, attrs: ConvAttrs) -> BuildResult<Value> {
        self.op1(OpKind::Convolution(attrs), &[x, w])
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
        let mut sorted = dims.to_vec();
        sorted.sort_unstable();
        let mut operands = inputs.to_vec();
        operands.extend_from_slice(inits);
        self.op(OpKind::Reduce { dims: sorted, body }, &operands)
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
        self.op1(
            OpKind::ReduceWindow {
                window: window.to_vec(),
                strides: strides.to_vec(),
                padding: padding.to_vec(),
                body: ReduceBody::Binary(op),
            },
            &[x, init],
        )
    }

    // ----- indexing --------------------------------------------------------------------------

    pub fn gather(&mut self, x: Value, indices: Value, dims: GatherDims) -> BuildResult<Value> {
        self.op1(OpKind::Gather(dims), &[x, indices])
    }

    pub fn scatter(
        &mut self,
        x: Value,
        indices: Value,
        updates: Value,
        dims: ScatterDims,
        mode: ScatterMode,
    ) -> BuildResult<Value> {
        self.op1(OpKind::Scatter { dims, mode }, &[x, indices, updates])
    }

    /// Sorts `xs` (same shape) along `dim` by the values of `xs[0]`; stable. Floats are
    /// compared in their total order, which puts NaN after every number, as torch does.
    pub fn sort(&mut self, xs: &[Value], dim: i64, order: SortOrder) -> BuildResult<Vec<Value>> {
        let key = xs.first().map(|&x| self.elem(x));
        let compare = match key {
            Some(e) if e.is_float() => CompareType::TotalOrder,
            Some(e) => CompareType::of(e),
            None => CompareType::Signed,
        };
        self.op(
            OpKind::Sort {
                dim,
                order,
                compare,
            },
            xs,
        )
    }

    // ----- complex numbers -------------------------------------------------------------------

    /// The real part of a complex tensor.
    pub fn real(&mut self, x: Value) -> BuildResult<Value> {
        self.op1(OpKind::Real, &[x])
    }

    /// The imaginary part of a complex tensor.
    pub fn imag(&mut self, x: Value) -> BuildResult<Value> {
        self.op1(OpKind::Imag, &[x])
    }

    /// `re + i im` from float32 or float64 parts of one type.
    pub fn complex(&mut self, re: Value, im: Value) -> BuildResult<Value> {
        self.op1(OpKind::Complex, &[re, im])
    }

    /// The discrete Fourier transform `kind` over the trailing `length.len()` (1 to 3)
    /// dimensions of `x`.
    pub fn fft(&mut self, x: Value, kind: FftKind, length: &[i64]) -> BuildResult<Value> {
        self.op1(
            OpKind::Fft {
                kind,
                length: length.to_vec(),
            },
            &[x],
        )
    }

    // ----- random numbers --------------------------------------------------------------------

    /// Random bits of `shape` (u32 or u64 elements) from a THREE_FRY generator `state`
    /// (tensor<2xui64>); returns (the next state, the bits).
    pub fn rng_bit_generator(
        &mut self,
        state: Value,
        shape: &[i64],
        bits: DType,
    ) -> BuildResult<(Value, Value)> {
        let out = self.op(
            OpKind::RngBitGenerator {
                shape: shape.to_vec(),
                bits,
            },
            &[state],
        )?;
        Ok((out[0], out[1]))
    }
}

/// Rebuilds a function op by op: the arguments as they were, then whatever ops the pass adds
/// through [`Rewriter::builder`], values of the old function mapped to the new one's.
pub struct Rewriter<'f> {
    old: &'f Func,
    b: Builder,
    map: Vec<Option<Value>>,
}

impl<'f> Rewriter<'f> {
    pub fn new(old: &'f Func) -> Rewriter<'f> {
        Rewriter::with_args(old, |b, ty, attrs| Ok(b.arg(ty.clone(), attrs.clone())))
            .expect("copying arguments cannot fail")
    }

    /// A rewriter whose function's arguments `arg` makes: given the builder and an old
    /// argument's type and attributes, it adds arguments and returns the value (of the old
    /// type) standing for the old one.
    pub fn with_args<F>(old: &'f Func, mut arg: F) -> BuildResult<Rewriter<'f>>
    where
        F: FnMut(&mut Builder, &TensorType, &ArgAttrs) -> BuildResult<Value>,
    {
        let mut rewriter = Rewriter {
            old,
            b: Builder::new(),
            map: vec![None; old.value_count()],
        };
        for (&a, attrs) in old.args().iter().zip(old.arg_attrs()) {
            let new = arg(&mut rewriter.b, old.ty(a), attrs)?;
            rewriter.bind(a, new)?;
        }
        Ok(rewriter)
    }

    /// The function being rewritten.
    pub fn old(&self) -> &'f Func {
        self.old
    }

    /// The builder of the new function (its location is the op being rewritten's after
    /// [`Rewriter::at`]).
    pub fn builder(&mut self) -> &mut Builder {
        &mut self.b
    }

    /// Ops built from now on come from where `op` came from.
    pub fn at(&mut self, op: &Op) {
        self.b.set_loc(op.loc.clone());
    }

    /// The new value standing for `old`, a value of the old function already rewritten.
    pub fn value(&self, old: Value) -> Value {
        self.map[old.index()].expect("values are rewritten before their uses")
    }

    /// `op` as it was, reading the new values of its operands.
    pub fn copy(&mut self, op: &Op) -> BuildResult<()> {
        self.at(op);
        let operands: Vec<Value> = op.operands.iter().map(|&o| self.value(o)).collect();
        let results = self.b.op(op.kind.clone(), &operands)?;
        for (&old, new) in op.results.iter().zip(results) {
            self.map[old.index()] = Some(new);
        }
        Ok(())
    }

    /// Makes `new` (a value of the new function, of the same type) stand for `old`.
    pub fn bind(&mut self, old: Value, new: Value) -> BuildResult<()> {
        if self.old.ty(old) != self.b.ty(new) {
            return Err(TypeError {
                op: "rewrite",
                message: format!(
                    "a {} cannot stand for a {}",
                    self.b.ty(new),
                    self.old.ty(old)
                ),
            });
        }
        self.map[old.index()] = Some(new);
        Ok(())
    }

    /// The new function, returning what stands for the old results, with their attributes.
    pub fn finish(self) -> Func {
        let results = self.old.results().iter().map(|&r| self.value(r)).collect();
        self.b.finish(results, self.old.result_attrs().to_vec())
    }

    /// The new function, returning `results` (values of the new function) with `attrs`.
    pub fn finish_returning(self, results: Vec<Value>, attrs: Vec<ArgAttrs>) -> Func {
        self.b.finish(results, attrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ConvAttrs, KernelLayout};

    fn f32t(shape: &[i64]) -> TensorType {
        TensorType::new(shape.to_vec(), DType::F32)
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
        assert_eq!(b.ty(half), &TensorType::new(vec![2, 5], DType::C64));
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
        let i = b.arg(TensorType::new(vec![2, 3], DType::I32), ArgAttrs::default());
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
        let init = b.scalar(DType::F32, f64::NEG_INFINITY);
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
}
