//! The lowering context: the builder, the values of the graph's tensors so far, and the
//! readers of a node's arguments that lowerings use (each argument checked for its kind, with
//! an error naming it).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use tpuc_fx::{Arg, DType, Dim, Graph, Node, OutputValue};

use super::promote::Participant;
use super::semantics::broadcast_shapes;
use super::LowerOptions;
use crate::ir::*;

/// An error inside one lowering, before the node is attached to it.
#[derive(Debug)]
pub struct OpError(pub String);

impl From<TypeError> for OpError {
    fn from(e: TypeError) -> Self {
        OpError(e.to_string())
    }
}

pub type OpResult<T> = Result<T, OpError>;

pub fn err<T>(message: impl Into<String>) -> OpResult<T> {
    Err(OpError(message.into()))
}

/// A call operand that is either a tensor or a Python number.
#[derive(Clone, Copy, Debug)]
pub enum Operand {
    Tensor(Value),
    Number(f64, DType),
}

pub struct Ctx<'p> {
    pub b: Builder,
    pub opts: &'p LowerOptions,
    /// The graph being lowered: the program's, or a subgraph a node runs (a region).
    pub(super) graph: &'p Graph,
    pub(super) values: HashMap<&'p str, Option<Value>>,
    /// The generator state after the last random op; the seed argument is made at the first.
    pub(super) rng_state: Option<Value>,
    /// A padded program's true sizes by symbol: the module's size arguments.
    pub(super) sizes: HashMap<String, Value>,
    /// The tensors a node reads or the graph returns (`used_tensors`).
    pub(super) used: HashSet<&'p str>,
    /// The functions lowered for repeated blocks so far, by torch's name for the block and the
    /// types it is called with: shared by the program and every subgraph in it.
    pub(super) functions: Rc<RefCell<Functions>>,
    /// The program's user kernels (`kernels.rs`), shared by every subgraph in it.
    pub(super) kernels: Rc<[super::kernels::UserKernel]>,
}

/// Functions lowered for blocks, by the block's name and the types it is called with.
pub(super) type Functions = HashMap<(String, Vec<TensorType>), Region>;

/// The tensors of `g` that a node reads or the graph returns, found in one pass.
pub(super) fn used_tensors(g: &Graph) -> HashSet<&str> {
    let returned = g.outputs.iter().filter_map(|o| match &o.value {
        OutputValue::Tensor(t) => Some(t.as_str()),
        OutputValue::Constant(_) => None,
    });
    let read = g
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter().flat_map(|a| a.arg.tensor_refs()));
    returned.chain(read).collect()
}

impl<'p> Ctx<'p> {
    /// A context lowering `graph` (a program's, or a subgraph a node runs) onto `b`.
    pub(super) fn new(b: Builder, opts: &'p LowerOptions, graph: &'p Graph) -> Ctx<'p> {
        Ctx {
            b,
            opts,
            graph,
            values: HashMap::with_capacity(graph.tensors.len()),
            rng_state: None,
            sizes: HashMap::new(),
            used: used_tensors(graph),
            functions: Rc::default(),
            kernels: Rc::from([]),
        }
    }

    fn named<'n>(&self, n: &'n Node, name: &str) -> Option<&'n Arg> {
        n.arg(name)
    }

    /// Random bits of `shape` (u32 or u64): the next draw from the program's generator, whose
    /// state threads through the random ops in graph order.
    pub fn random_bits(&mut self, shape: &[i64], elem: DType) -> OpResult<Value> {
        let state = self.rng_state()?;
        let (next, bits) = self.b.rng_bit_generator(state, shape, elem)?;
        self.rng_state = Some(next);
        Ok(bits)
    }

    /// The generator's state now: made an argument (the seed) at the first draw.
    pub fn rng_state(&mut self) -> OpResult<Value> {
        Ok(match self.rng_state {
            Some(s) => s,
            None => {
                let seed = self
                    .b
                    .arg(TensorType::new(vec![2], DType::U64), ArgAttrs::default());
                self.rng_state = Some(seed);
                seed
            }
        })
    }

    /// Whether a node reads tensor `name` or the graph returns it.
    pub fn is_used(&self, name: &str) -> bool {
        self.used.contains(name)
    }

    /// Makes `name` stand for `v` in later nodes: how a lowering reports an in-place update of
    /// one of its arguments.
    pub fn rebind(&mut self, name: &str, v: Value) {
        if let Some((&key, _)) = self.values.get_key_value(name) {
            self.values.insert(key, Some(v));
        }
    }

    pub fn value(&self, name: &str) -> OpResult<Value> {
        match self.values.get(name) {
            Some(Some(v)) => Ok(*v),
            Some(None) => err(format!("uses {name}, an output tpuc does not compute")),
            None => err(format!("uses unknown value {name}")),
        }
    }

    pub fn tensor(&self, n: &Node, name: &str) -> OpResult<Value> {
        match self.named(n, name) {
            Some(Arg::Tensor(t)) => self.value(t),
            Some(other) => err(format!(
                "argument {name} should be a tensor, got {}",
                other.kind_name()
            )),
            None => err(format!("missing argument {name}")),
        }
    }

    pub fn opt_tensor(&self, n: &Node, name: &str) -> OpResult<Option<Value>> {
        match self.named(n, name) {
            Some(Arg::Tensor(t)) => Ok(Some(self.value(t)?)),
            Some(Arg::None) | None => Ok(None),
            Some(other) => err(format!(
                "argument {name} should be a tensor or None, got {}",
                other.kind_name()
            )),
        }
    }

    pub fn tensors(&self, n: &Node, name: &str) -> OpResult<Vec<Value>> {
        match self.named(n, name) {
            Some(Arg::Tensors(ts)) => ts.iter().map(|t| self.value(t)).collect(),
            Some(other) => err(format!(
                "argument {name} should be a tensor list, got {}",
                other.kind_name()
            )),
            None => err(format!("missing argument {name}")),
        }
    }

    pub fn opt_tensors(&self, n: &Node, name: &str) -> OpResult<Vec<Option<Value>>> {
        match self.named(n, name) {
            Some(Arg::OptionalTensors(ts)) => ts
                .iter()
                .map(|t| t.as_ref().map(|t| self.value(t)).transpose())
                .collect(),
            Some(Arg::Tensors(ts)) => ts.iter().map(|t| self.value(t).map(Some)).collect(),
            Some(other) => err(format!(
                "argument {name} should be a list of optional tensors, got {}",
                other.kind_name()
            )),
            None => err(format!("missing argument {name}")),
        }
    }

    fn sym_int(&self, s: &tpuc_fx::SymIntArg) -> OpResult<i64> {
        match s {
            tpuc_fx::SymIntArg::Int(v) => Ok(*v),
            tpuc_fx::SymIntArg::Name(name) => match self.graph.sym_ints.get(name) {
                Some(Dim::Static(v)) => Ok(*v),
                _ => err(format!(
                    "symbolic size {name} is not supported (export with static shapes)"
                )),
            },
        }
    }

    pub fn opt_int(&self, n: &Node, name: &str) -> OpResult<Option<i64>> {
        match self.named(n, name) {
            Some(Arg::Int(v)) => Ok(Some(*v)),
            Some(Arg::SymInt(s)) => Ok(Some(self.sym_int(s)?)),
            Some(Arg::None) | None => Ok(None),
            Some(other) => err(format!(
                "argument {name} should be an int, got {}",
                other.kind_name()
            )),
        }
    }

    pub fn int(&self, n: &Node, name: &str, default: Option<i64>) -> OpResult<i64> {
        match (self.opt_int(n, name)?, default) {
            (Some(v), _) | (None, Some(v)) => Ok(v),
            (None, None) => err(format!("missing argument {name}")),
        }
    }

    pub fn opt_ints(&self, n: &Node, name: &str) -> OpResult<Option<Vec<i64>>> {
        match self.named(n, name) {
            Some(Arg::Ints(v)) => Ok(Some(v.clone())),
            Some(Arg::Int(v)) => Ok(Some(vec![*v])),
            Some(Arg::SymInts(v)) => Ok(Some(
                v.iter().map(|s| self.sym_int(s)).collect::<OpResult<_>>()?,
            )),
            Some(Arg::None) | None => Ok(None),
            Some(other) => err(format!(
                "argument {name} should be an int list, got {}",
                other.kind_name()
            )),
        }
    }

    pub fn ints(&self, n: &Node, name: &str, default: Option<&[i64]>) -> OpResult<Vec<i64>> {
        match (self.opt_ints(n, name)?, default) {
            (Some(v), _) => Ok(v),
            (None, Some(d)) => Ok(d.to_vec()),
            (None, None) => err(format!("missing argument {name}")),
        }
    }

    pub fn opt_float(&self, n: &Node, name: &str) -> OpResult<Option<f64>> {
        match self.named(n, name) {
            Some(Arg::Float(v)) => Ok(Some(*v)),
            Some(Arg::Int(v)) => Ok(Some(*v as f64)),
            Some(Arg::Bool(v)) => Ok(Some(f64::from(u8::from(*v)))),
            Some(Arg::None) | None => Ok(None),
            Some(other) => err(format!(
                "argument {name} should be a number, got {}",
                other.kind_name()
            )),
        }
    }

    pub fn float(&self, n: &Node, name: &str, default: Option<f64>) -> OpResult<f64> {
        match (self.opt_float(n, name)?, default) {
            (Some(v), _) | (None, Some(v)) => Ok(v),
            (None, None) => err(format!("missing argument {name}")),
        }
    }

    pub fn bool(&self, n: &Node, name: &str, default: bool) -> OpResult<bool> {
        match self.named(n, name) {
            Some(Arg::Bool(v)) => Ok(*v),
            Some(Arg::None) | None => Ok(default),
            Some(other) => err(format!(
                "argument {name} should be a bool, got {}",
                other.kind_name()
            )),
        }
    }

    pub fn opt_str<'n>(&self, n: &'n Node, name: &str) -> OpResult<Option<&'n str>> {
        match self.named(n, name) {
            Some(Arg::Str(s)) => Ok(Some(s.as_str())),
            Some(Arg::None) | None => Ok(None),
            Some(other) => err(format!(
                "argument {name} should be a string, got {}",
                other.kind_name()
            )),
        }
    }

    pub fn opt_dtype(&self, n: &Node, name: &str) -> OpResult<Option<DType>> {
        match self.named(n, name) {
            Some(Arg::ScalarType(d)) => Ok(Some(*d)),
            Some(Arg::None) | None => Ok(None),
            Some(other) => err(format!(
                "argument {name} should be a dtype, got {}",
                other.kind_name()
            )),
        }
    }

    /// A tensor or Python-number operand.
    pub fn operand(&self, n: &Node, name: &str) -> OpResult<Operand> {
        self.opt_operand(n, name)?
            .ok_or_else(|| OpError(format!("missing argument {name}")))
    }

    /// A tensor or Python-number operand that may be absent or None.
    pub fn opt_operand(&self, n: &Node, name: &str) -> OpResult<Option<Operand>> {
        match self.named(n, name) {
            Some(Arg::Tensor(t)) => Ok(Some(Operand::Tensor(self.value(t)?))),
            Some(Arg::Int(v)) => Ok(Some(Operand::Number(*v as f64, DType::I64))),
            // A size, known once the program is specialised.
            Some(Arg::SymInt(s)) => Ok(Some(Operand::Number(self.sym_int(s)? as f64, DType::I64))),
            Some(Arg::Float(v)) => Ok(Some(Operand::Number(*v, DType::F64))),
            Some(Arg::Bool(v)) => Ok(Some(Operand::Number(f64::from(u8::from(*v)), DType::Bool))),
            Some(Arg::None) | None => Ok(None),
            Some(other) => err(format!(
                "argument {name} should be a tensor or number, got {}",
                other.kind_name()
            )),
        }
    }

    /// The type torch recorded for output `i` of the node (by its position in the op's
    /// returns); an error when the graph does not use that output.
    pub fn out_type(&self, n: &Node, i: usize) -> OpResult<TensorType> {
        self.opt_out_type(n, i)?.ok_or_else(|| {
            OpError(if i < output_slots(n).len() {
                format!("output {i} is not used by the graph")
            } else {
                format!("has no output {i}")
            })
        })
    }

    /// The type of output `i`, or None when the op has no such output or the graph does not
    /// use it.
    pub fn opt_out_type(&self, n: &Node, i: usize) -> OpResult<Option<TensorType>> {
        let Some(&Some(name)) = output_slots(n).get(i) else {
            return Ok(None);
        };
        let meta = self
            .graph
            .tensor(name)
            .ok_or_else(|| OpError(format!("output {name} has no type")))?;
        meta_type(meta).map(Some).map_err(OpError)
    }

    pub fn participant(&self, o: Operand) -> Participant {
        match o {
            Operand::Tensor(v) => {
                let t = self.b.ty(v);
                if t.rank() == 0 {
                    Participant::ZeroDim(t.elem)
                } else {
                    Participant::Dim(t.elem)
                }
            }
            Operand::Number(_, d) => Participant::Scalar(d),
        }
    }

    /// The operand as a tensor of `elem` (a number becomes a scalar constant).
    pub fn materialize(&mut self, o: Operand, elem: DType) -> Value {
        match o {
            Operand::Tensor(v) => self.b.convert(v, elem),
            Operand::Number(x, _) => self.b.scalar(elem, x),
        }
    }

    /// Broadcasts values to their common shape (numpy rules).
    pub fn broadcast_all(&mut self, vs: &[Value]) -> OpResult<Vec<Value>> {
        let mut shape: Vec<i64> = Vec::new();
        for &v in vs {
            shape = broadcast_shapes(&shape, self.b.shape(v)).ok_or_else(|| {
                OpError(format!(
                    "shapes {shape:?} and {:?} do not broadcast",
                    self.b.shape(v)
                ))
            })?;
        }
        vs.iter()
            .map(|&v| Ok(self.b.broadcast_to(v, &shape)?))
            .collect()
    }

    /// A constant tensor shaped like `like` (its element type unless `elem` is given).
    pub fn full_like(&mut self, like: Value, value: f64, elem: Option<DType>) -> Value {
        let ty = self.b.ty(like).clone();
        let ty = elem.map_or(ty.clone(), |e| ty.with_elem(e));
        self.b.splat(&ty, value)
    }

    /// Where `v` compares with the constant `c` as `dir` says.
    pub fn compared(&mut self, v: Value, dir: CompareDir, c: f64) -> OpResult<Value> {
        let c = self.full_like(v, c, None);
        Ok(self.b.compare(dir, v, c)?)
    }

    /// The constant `value` where `at` holds, `v` elsewhere.
    pub fn value_where(&mut self, at: Value, value: f64, v: Value) -> OpResult<Value> {
        let c = self.full_like(v, value, None);
        Ok(self.b.select(at, c, v)?)
    }

    /// `v` rounded to `elem` and widened back: a value torch stores in `elem` between two steps
    /// it computes wider (a no-op when `elem` is `v`'s type).
    pub fn rounded_to(&mut self, v: Value, elem: DType) -> Value {
        let wide = self.b.elem(v);
        let narrow = self.b.convert(v, elem);
        self.b.convert(narrow, wide)
    }

    /// A loop of a lowering's own (a series summed to a fixed number of terms): from the
    /// values `init`, `cond` builds the condition and `body` the next values, each on this
    /// context with its builder swapped for the region's (the lowering's helpers work
    /// unchanged). Values of the enclosing function a region needs are carried in `init`.
    pub fn while_loop(
        &mut self,
        init: &[Value],
        cond: impl FnOnce(&mut Ctx<'p>, &[Value]) -> OpResult<Value>,
        body: impl FnOnce(&mut Ctx<'p>, &[Value]) -> OpResult<Vec<Value>>,
    ) -> OpResult<Vec<Value>> {
        let types: Vec<TensorType> = init.iter().map(|&v| self.b.ty(v).clone()).collect();
        let cond = self.region(&types, |cx, values| Ok(vec![cond(cx, values)?]))?;
        let body = self.region(&types, body)?;
        Ok(self.b.op(OpKind::While { cond, body }, init)?)
    }

    /// `count` steps of `step` over the values `init` as one loop: `step` gets the step's
    /// number (a float64 scalar: 0, 1, ..., `count` - 1) and the values, and returns their next
    /// ones. The loop's body is compiled once, however many the steps.
    pub fn repeated(
        &mut self,
        count: u32,
        init: &[Value],
        step: impl FnOnce(&mut Ctx<'p>, Value, &[Value]) -> OpResult<Vec<Value>>,
    ) -> OpResult<Vec<Value>> {
        let end = self.b.scalar(DType::I64, f64::from(count));
        self.counted_loop(0, end, init, |cx, i, values| {
            let number = cx.b.convert(i, DType::F64);
            step(cx, number, values)
        })
    }

    /// A loop over the values `init` for i = `start`, `start` + 1, ... while i < `end` (an i64
    /// scalar of this function): `step` gets i (an i64 scalar) and the values and returns their
    /// next ones; the results are the values after the last step.
    pub fn counted_loop(
        &mut self,
        start: i64,
        end: Value,
        init: &[Value],
        step: impl FnOnce(&mut Ctx<'p>, Value, &[Value]) -> OpResult<Vec<Value>>,
    ) -> OpResult<Vec<Value>> {
        let first = self.b.scalar(DType::I64, start as f64);
        let carried: Vec<Value> = [&[first, end][..], init].concat();
        let results = self.while_loop(
            &carried,
            |cx, values| Ok(cx.b.compare(CompareDir::Lt, values[0], values[1])?),
            |cx, values| {
                let next = step(cx, values[0], &values[2..])?;
                let one = cx.b.scalar(DType::I64, 1.0);
                let i = cx.b.binary(BinaryOp::Add, values[0], one)?;
                Ok([&[i, values[1]][..], &next].concat())
            },
        )?;
        Ok(results[2..].to_vec())
    }

    /// A region taking arguments of `args`' types, whose results `build` makes on this context
    /// with its builder swapped for the region's. Random draws inside one are refused: the
    /// generator's state is a value of the enclosing function.
    pub fn region(
        &mut self,
        args: &[TensorType],
        build: impl FnOnce(&mut Ctx<'p>, &[Value]) -> OpResult<Vec<Value>>,
    ) -> OpResult<Region> {
        let nested = self.b.nested();
        let outer = std::mem::replace(&mut self.b, nested);
        let rng_state = self.rng_state;
        let values: Vec<Value> = args
            .iter()
            .map(|t| self.b.arg(t.clone(), ArgAttrs::default()))
            .collect();
        let results = build(self, &values);
        let inner = std::mem::replace(&mut self.b, outer);
        let drew = self.rng_state != rng_state;
        self.rng_state = rng_state;
        let results = results?;
        if drew {
            return err("random numbers drawn inside a loop or a branch are not supported");
        }
        Ok(Region::new(inner.finish(results, vec![])))
    }

    /// `v * factor` (`v` itself when the factor is 1).
    pub fn scaled(&mut self, v: Value, factor: f64) -> OpResult<Value> {
        if factor == 1.0 {
            return Ok(v);
        }
        let f = self.full_like(v, factor, None);
        Ok(self.b.binary(BinaryOp::Mul, v, f)?)
    }
}

/// The tensor each output position of `n` defines (a tensor list counts one position per
/// tensor), or None where the graph does not use the output.
pub(super) fn output_slots(n: &Node) -> Vec<Option<&str>> {
    let mut slots = Vec::new();
    for o in &n.outputs {
        match o {
            tpuc_fx::NodeOutput::Tensor(t) => slots.push(Some(t.as_str())),
            tpuc_fx::NodeOutput::Tensors(ts) => slots.extend(ts.iter().map(|t| Some(t.as_str()))),
            tpuc_fx::NodeOutput::SymInt(_)
            | tpuc_fx::NodeOutput::SymBool(_)
            | tpuc_fx::NodeOutput::SymFloat(_)
            | tpuc_fx::NodeOutput::None => slots.push(None),
        }
    }
    slots
}

pub fn meta_type(meta: &tpuc_fx::TensorMeta) -> Result<TensorType, String> {
    let shape = meta.static_sizes().ok_or_else(|| {
        format!(
            "has symbolic shape {} (tpuc compiles static shapes; specialize the program)",
            meta.describe()
        )
    })?;
    Ok(TensorType::new(shape, meta.dtype))
}
