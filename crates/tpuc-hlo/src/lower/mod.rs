//! Lowering of an ATen-level FX graph into the StableHLO IR. One registry maps the full ATen
//! overload name (`aten.addmm.default`) to its lowering; each op family has its own file.

mod complex;
mod conv;
mod distance;
mod elementwise;
mod fft;
mod indexing;
mod linear;
mod norm;
mod pool;
mod promote;
mod random;
mod reduction;
mod resample;
mod sort;
mod view;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use tpuc_fx::{Arg, DType, Dim, GraphInput, InputKind, Node, OutputValue, Program, SourceLoc};

use crate::builder::{Builder, TypeError};
use crate::ir::*;
use crate::types::{ElemType, TensorType};

pub use promote::{promote_types, result_type, Participant};

/// How weights (parameters, buffers, constants) reach the compiled module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightsMode {
    /// As leading function arguments, in signature order: the runtime passes them in.
    #[default]
    Args,
    /// As inline `dense` constants: a self-contained module.
    Inline,
}

#[derive(Clone, Debug)]
pub struct LowerOptions {
    pub weights: WeightsMode,
    /// Precision of f32 matmuls and convolutions. HIGHEST matches torch on every backend
    /// (XLA's default lets GPUs use TF32).
    pub precision: Precision,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            weights: WeightsMode::Args,
            precision: Precision::Highest,
        }
    }
}

/// What each argument and result of the lowered `main` stands for.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgRole {
    /// A parameter/buffer/constant with this fully qualified name.
    Weight(String),
    /// The n-th user input of the program, by its placeholder name.
    UserInput(String),
    /// The random-number generator's seed, tensor<2xui64>: the last argument of a program with
    /// random ops. Each call passes a fresh seed (the torch.compile backend draws it from
    /// torch's generator; `tpuc run` takes `--seed`). See docs/random.md.
    RngSeed,
}

#[derive(Clone, Debug)]
pub struct Lowered {
    pub module: Module,
    pub args: Vec<ArgRole>,
    /// Placeholder/tensor name of each result (user outputs and mutations, in signature order).
    pub results: Vec<String>,
}

/// One node tpuc has no lowering for.
#[derive(Clone, Debug, PartialEq)]
pub struct Unsupported {
    pub target: String,
    pub node: String,
    pub source: Option<SourceLoc>,
}

#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("{}", describe_unsupported(.0))]
    Unsupported(Vec<Unsupported>),
    #[error("node {node} ({target}){}: {message}", source_suffix(.location))]
    Node {
        node: String,
        target: String,
        location: Option<SourceLoc>,
        message: String,
    },
    #[error("{0}")]
    Program(String),
    #[error(
        "the program has symbolic sizes ({0}); tpuc compiles static shapes: specialize it \
         (`tpuc compile --specialize` for the exported sizes, `--size SYMBOL=SIZE` for others; \
         `tpuc run` takes them from its inputs)"
    )]
    Symbolic(String),
}

fn source_suffix(s: &Option<SourceLoc>) -> String {
    s.as_ref().map(|s| format!(" at {s}")).unwrap_or_default()
}

fn describe_unsupported(list: &[Unsupported]) -> String {
    let mut ops: Vec<&str> = list.iter().map(|u| u.target.as_str()).collect();
    ops.sort_unstable();
    ops.dedup();
    let mut s = format!(
        "{} unsupported op{} ({} node{}): {}",
        ops.len(),
        if ops.len() == 1 { "" } else { "s" },
        list.len(),
        if list.len() == 1 { "" } else { "s" },
        ops.join(", ")
    );
    for u in list {
        s.push_str(&format!(
            "\n  {} (node {}){}",
            u.target,
            u.node,
            source_suffix(&u.source)
        ));
    }
    s
}

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

/// A lowering: returns one value per node output (`None` for an output it does not compute).
pub type LowerFn = Arc<dyn Fn(&mut Ctx, &Node) -> OpResult<Vec<Option<Value>>> + Send + Sync>;

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let mut r = Registry::default();
    elementwise::register(&mut r);
    view::register(&mut r);
    linear::register(&mut r);
    reduction::register(&mut r);
    conv::register(&mut r);
    distance::register(&mut r);
    norm::register(&mut r);
    pool::register(&mut r);
    indexing::register(&mut r);
    sort::register(&mut r);
    resample::register(&mut r);
    random::register(&mut r);
    complex::register(&mut r);
    fft::register(&mut r);
    r
});

#[derive(Default)]
pub struct Registry {
    lowerings: HashMap<&'static str, LowerFn>,
    /// Ops whose lowerings handle complex tensors. Every other lowering assumes real numbers,
    /// so a complex operand or result refuses the op rather than compute wrong numbers.
    complex: HashSet<&'static str>,
}

impl Registry {
    pub fn add<F>(&mut self, names: &[&'static str], f: F)
    where
        F: Fn(&mut Ctx, &Node) -> OpResult<Vec<Option<Value>>> + Send + Sync + 'static,
    {
        let f: LowerFn = Arc::new(f);
        for n in names {
            let previous = self.lowerings.insert(n, f.clone());
            assert!(previous.is_none(), "{n} registered twice");
        }
    }

    /// Registers a lowering that also handles complex tensors.
    pub fn add_complex<F>(&mut self, names: &[&'static str], f: F)
    where
        F: Fn(&mut Ctx, &Node) -> OpResult<Vec<Option<Value>>> + Send + Sync + 'static,
    {
        self.add(names, f);
        self.complex.extend(names);
    }
}

/// Every ATen overload tpuc lowers, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut v: Vec<&str> = REGISTRY.lowerings.keys().copied().collect();
    v.sort_unstable();
    v
}

/// How tpuc handles a core ATen overload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// tpuc lowers it.
    Lowered,
    /// torch's core-ATen decompositions rewrite it into other ops (the torch.compile path).
    Decomposed,
    NotSupported,
}

impl Coverage {
    pub fn name(self) -> &'static str {
        match self {
            Coverage::Lowered => "lowered",
            Coverage::Decomposed => "decomposed",
            Coverage::NotSupported => "not supported",
        }
    }
}

/// torch's core ATen opset (as `tools/gen_ops_doc.py` lists it from torch), with tpuc's
/// coverage of each overload.
pub fn core_aten_coverage() -> Vec<(&'static str, Coverage)> {
    include_str!("core_aten_ops.txt")
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(op, recorded)| {
            let coverage = if is_supported(op) {
                Coverage::Lowered
            } else if recorded == "decomposed" {
                Coverage::Decomposed
            } else {
                Coverage::NotSupported
            };
            (op, coverage)
        })
        .collect()
}

pub fn is_supported(target: &str) -> bool {
    lowering(target).is_some()
}

/// Ops whose output may share storage with an input (views, and ops that may return their
/// input itself). An in-place op on such a tensor, or on a tensor viewed by one, would have to
/// update every alias; tpuc refuses that rather than compute a stale value.
fn may_alias(target: &str) -> bool {
    const VIEWS: &[&str] = &[
        "alias",
        "as_strided",
        "chunk",
        "contiguous",
        "detach",
        "diagonal",
        "expand",
        "expand_as",
        "flatten",
        "movedim",
        "narrow",
        "permute",
        "reshape",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "squeeze",
        "swapaxes",
        "t",
        "transpose",
        "unbind",
        "unflatten",
        "unfold",
        "unsqueeze",
        "view",
        "view_as",
        "_unsafe_view",
        "_reshape_alias",
        "unsafe_split",
    ];
    let name = target
        .strip_prefix("aten.")
        .and_then(|rest| rest.split('.').next())
        .unwrap_or("");
    VIEWS.contains(&name)
}

/// Refuses in-place ops (and `out=` variants) whose mutated argument `arg` aliases other
/// tensors of the graph (see [`may_alias`]).
fn check_in_place(g: &tpuc_fx::Graph, node: &Node, arg: &str) -> Result<(), String> {
    let Some(Arg::Tensor(target)) = node.arg(arg) else {
        return Ok(());
    };
    let producer = g
        .nodes
        .iter()
        .find(|n| n.defined_tensors().contains(&target.as_str()));
    if let Some(p) = producer.filter(|p| may_alias(&p.target)) {
        return Err(format!(
            "not supported: in-place {} on {target}, a view made by {} (node {}); export the \
             program functionalized (ep.run_decompositions()) instead",
            node.target, p.target, p.name
        ));
    }
    let viewed_by = g.nodes.iter().find(|n| {
        may_alias(&n.target)
            && n.inputs
                .iter()
                .any(|a| matches!(&a.arg, Arg::Tensor(t) if t == target))
    });
    if let Some(v) = viewed_by {
        return Err(format!(
            "not supported: in-place {} on {target}, which {} (node {}) views; export the \
             program functionalized (ep.run_decompositions()) instead",
            node.target, v.target, v.name
        ));
    }
    Ok(())
}

/// How a node's op relates to the lowering that computes it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The op itself.
    Functional,
    /// `aten.relu_.default` of `aten.relu.default`: the result then stands for `self`.
    InPlace,
    /// `aten.atan2.out` of `aten.atan2.default` (or `.Tensor`): the result then stands for the
    /// `out` argument.
    Out,
}

/// The lowering that computes an op.
struct Lowering {
    f: &'static LowerFn,
    variant: Variant,
    handles_complex: bool,
}

/// The lowering of `target`: its own, or that of the functional op it is a variant of.
fn lowering(target: &str) -> Option<Lowering> {
    let find = |name: &str, variant| {
        REGISTRY
            .lowerings
            .get_key_value(name)
            .map(|(key, f)| Lowering {
                f,
                variant,
                handles_complex: REGISTRY.complex.contains(key),
            })
    };
    if let Some(found) = find(target, Variant::Functional) {
        return Some(found);
    }
    let (name, overload) = target.strip_prefix("aten.")?.split_once('.')?;
    if overload == "out" {
        return ["default", "Tensor"]
            .iter()
            .find_map(|o| find(&format!("aten.{name}.{o}"), Variant::Out));
    }
    // `aten.view_copy.default` and the other `_copy` forms of views compute what the view does.
    if let Some(found) = name
        .strip_suffix("_copy")
        .and_then(|view| find(&format!("aten.{view}.{overload}"), Variant::Functional))
    {
        return Some(found);
    }
    let functional = name.strip_suffix('_').filter(|f| !f.ends_with('_'))?;
    find(&format!("aten.{functional}.{overload}"), Variant::InPlace)
}

/// The first complex tensor a node reads or produces, if any, with its type.
fn complex_tensor<'n>(
    g: &'n tpuc_fx::Graph,
    n: &'n Node,
    recorded: &[Option<TensorType>],
) -> Option<(&'n str, ElemType)> {
    n.inputs
        .iter()
        .flat_map(|a| a.arg.tensor_refs())
        .filter_map(|t| {
            let elem = ElemType::from_dtype(g.tensor(t)?.dtype);
            elem.is_complex().then_some((t, elem))
        })
        .chain(
            output_slots(n)
                .into_iter()
                .zip(recorded)
                .filter_map(|(name, ty)| Some((name?, ty.as_ref()?.elem)))
                .filter(|(_, elem)| elem.is_complex()),
        )
        .next()
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
    program: &'p Program,
    values: HashMap<&'p str, Option<Value>>,
    /// The generator state after the last random op; the seed argument is made at the first.
    rng_state: Option<Value>,
}

impl<'p> Ctx<'p> {
    fn named<'n>(&self, n: &'n Node, name: &str) -> Option<&'n Arg> {
        n.arg(name)
    }

    /// Random bits of `shape` (u32 or u64): the next draw from the program's generator, whose
    /// state threads through the random ops in graph order.
    pub fn random_bits(&mut self, shape: &[i64], elem: ElemType) -> OpResult<Value> {
        let state = match self.rng_state {
            Some(s) => s,
            None => self
                .b
                .arg(TensorType::new(vec![2], ElemType::U64), ArgAttrs::default()),
        };
        let (next, bits) = self.b.rng_bit_generator(state, shape, elem)?;
        self.rng_state = Some(next);
        Ok(bits)
    }

    /// Whether a node reads tensor `name` or the graph returns it.
    pub fn is_used(&self, name: &str) -> bool {
        let g = &self.program.graph;
        g.outputs
            .iter()
            .any(|o| matches!(&o.value, OutputValue::Tensor(t) if t == name))
            || g.nodes.iter().any(|n| {
                n.inputs.iter().any(|a| match &a.arg {
                    Arg::Tensor(t) => t == name,
                    Arg::Tensors(ts) => ts.iter().any(|t| t == name),
                    Arg::OptionalTensors(ts) => ts.iter().flatten().any(|t| t == name),
                    _ => false,
                })
            })
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
            tpuc_fx::SymIntArg::Name(name) => match self.program.graph.sym_ints.get(name) {
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
            .program
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
                    Participant::ZeroDim(t.elem.to_dtype())
                } else {
                    Participant::Dim(t.elem.to_dtype())
                }
            }
            Operand::Number(_, d) => Participant::Scalar(d),
        }
    }

    /// The operand as a tensor of `elem` (a number becomes a scalar constant).
    pub fn materialize(&mut self, o: Operand, elem: ElemType) -> Value {
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
    pub fn full_like(&mut self, like: Value, value: f64, elem: Option<ElemType>) -> Value {
        let ty = self.b.ty(like).clone();
        let ty = elem.map_or(ty.clone(), |e| ty.with_elem(e));
        self.b.splat(&ty, value)
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

/// The common shape of two shapes under numpy broadcasting.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            _ if da == db => da,
            (1, d) | (d, 1) => d,
            _ => return None,
        };
    }
    Some(out)
}

/// When every output a node defines (`recorded`: its types per output position) has no
/// elements: an empty constant for each. Such nodes need no lowering, and empty shapes trip up
/// some StableHLO ops.
fn empty_outputs(b: &mut Builder, recorded: &[Option<TensorType>]) -> Option<Vec<Option<Value>>> {
    let mut used = recorded.iter().flatten().peekable();
    if used.peek().is_none() || used.any(|t| t.numel() != 0) {
        return None;
    }
    Some(
        recorded
            .iter()
            .map(|t| t.as_ref().map(|t| b.splat(t, 0.0)))
            .collect(),
    )
}

/// The tensor each output position of `n` defines (a tensor list counts one position per
/// tensor), or None where the graph does not use the output.
/// A node that computes only sizes (`aten.sym_size.int`, `operator.mul` of sizes, ...) whose
/// values are all known: nothing to compute at run time; ops read them as numbers.
fn computes_static_sizes(g: &tpuc_fx::Graph, n: &Node) -> bool {
    !n.outputs.is_empty()
        && n.outputs.iter().all(|o| {
            matches!(o, tpuc_fx::NodeOutput::SymInt(name)
                if matches!(g.sym_ints.get(name), Some(Dim::Static(_))))
        })
}

fn output_slots(n: &Node) -> Vec<Option<&str>> {
    let mut slots = Vec::new();
    for o in &n.outputs {
        match o {
            tpuc_fx::NodeOutput::Tensor(t) => slots.push(Some(t.as_str())),
            tpuc_fx::NodeOutput::Tensors(ts) => slots.extend(ts.iter().map(|t| Some(t.as_str()))),
            tpuc_fx::NodeOutput::SymInt(_) | tpuc_fx::NodeOutput::None => slots.push(None),
        }
    }
    slots
}

/// Normalises a possibly negative dimension index.
pub fn norm_dim(dim: i64, rank: usize) -> OpResult<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return err(format!(
            "dimension {dim} is out of range for a tensor of rank {rank}"
        ));
    }
    Ok(d as usize)
}

pub fn meta_type(meta: &tpuc_fx::TensorMeta) -> Result<TensorType, String> {
    let shape = meta.static_sizes().ok_or_else(|| {
        format!(
            "has symbolic shape {} (tpuc compiles static shapes; specialize the program)",
            meta.describe()
        )
    })?;
    Ok(TensorType::new(shape, ElemType::from_dtype(meta.dtype)))
}

fn node_loc(n: &Node) -> Arc<Loc> {
    Arc::new(Loc {
        node: n.name.clone(),
        file: n.source().map(|s| (s.file, s.line)),
    })
}

/// Lowers a validated program to a StableHLO module. Reports every unsupported op at once.
pub fn lower(program: &Program, opts: &LowerOptions) -> Result<Lowered, LowerError> {
    let g = &program.graph;
    if tpuc_fx::symbolic::is_symbolic(program) {
        return Err(LowerError::Symbolic(tpuc_fx::symbolic::describe_symbols(
            program,
        )));
    }
    let mut unsupported: Vec<Unsupported> = g
        .nodes
        .iter()
        .filter(|n| !is_supported(&n.target) && !computes_static_sizes(g, n))
        .map(|n| Unsupported {
            target: n.target.clone(),
            node: n.name.clone(),
            source: n.source(),
        })
        .collect();
    if !unsupported.is_empty() {
        unsupported.sort_by(|a, b| a.target.cmp(&b.target).then(a.node.cmp(&b.node)));
        return Err(LowerError::Unsupported(unsupported));
    }
    let mut cx = Ctx {
        b: Builder::new(),
        opts,
        program,
        values: HashMap::with_capacity(g.tensors.len()),
        rng_state: None,
    };
    let mut args = Vec::new();
    // Weights first (as arguments or constants), then user inputs, each in signature order.
    let (weights, users): (Vec<&GraphInput>, Vec<&GraphInput>) = g
        .inputs
        .iter()
        .partition(|i| i.kind != InputKind::UserInput);
    for input in weights.into_iter().chain(users) {
        let meta = g
            .tensor(&input.name)
            .ok_or_else(|| LowerError::Program(format!("input {} has no type", input.name)))?;
        let ty = meta_type(meta)
            .map_err(|m| LowerError::Program(format!("input {} {m}", input.name)))?;
        let v = match (&input.kind, opts.weights, program.weight_for(input)) {
            (InputKind::UserInput, _, _) => {
                args.push(ArgRole::UserInput(input.name.clone()));
                cx.b.arg(ty, ArgAttrs::default())
            }
            (_, WeightsMode::Inline, Some(w)) => {
                let bytes = w.bytes.as_slice();
                let esize = ty.elem.byte_size();
                let splat = !bytes.is_empty() && bytes.chunks(esize).all(|c| c == &bytes[..esize]);
                let lit = Literal {
                    ty,
                    bytes: if splat {
                        bytes[..esize].into()
                    } else {
                        bytes.into()
                    },
                    splat,
                };
                cx.b.set_loc(Arc::new(Loc {
                    node: input.name.clone(),
                    file: None,
                }));
                cx.b.constant(lit)
                    .map_err(|e| LowerError::Program(format!("weight {}: {e}", input.name)))?
            }
            (kind, _, _) => {
                let target = match kind {
                    InputKind::Parameter { target }
                    | InputKind::Buffer { target, .. }
                    | InputKind::Constant { target } => target.clone(),
                    InputKind::UserInput => unreachable!("handled above"),
                };
                args.push(ArgRole::Weight(target));
                cx.b.arg(ty, ArgAttrs::default())
            }
        };
        cx.values.insert(input.name.as_str(), Some(v));
    }
    for n in g.nodes.iter().filter(|n| !computes_static_sizes(g, n)) {
        cx.b.set_loc(node_loc(n));
        let node_err = |message: String| LowerError::Node {
            node: n.name.clone(),
            target: n.target.clone(),
            location: n.source(),
            message,
        };
        let Lowering {
            f: lower_fn,
            variant,
            handles_complex,
        } = lowering(&n.target).ok_or_else(|| node_err("internal error: no lowering".into()))?;
        let mutated = match variant {
            Variant::Functional => None,
            Variant::InPlace => Some("self"),
            Variant::Out => Some("out"),
        };
        if let Some(arg) = mutated {
            check_in_place(g, n, arg).map_err(node_err)?;
        }
        // The types torch recorded, per output position (None where the graph does not use it).
        let recorded = (0..output_slots(n).len())
            .map(|i| cx.opt_out_type(n, i))
            .collect::<OpResult<Vec<_>>>()
            .map_err(|e| node_err(e.0))?;
        if !handles_complex {
            if let Some((tensor, elem)) = complex_tensor(g, n, &recorded) {
                return Err(node_err(format!(
                    "not supported: {} on complex tensors ({tensor} is {}); tpuc computes complex \
                     numbers in FFTs, arithmetic, conversions and data movement (docs/ops.md)",
                    n.target,
                    elem.to_dtype()
                )));
            }
        }
        let outs = match empty_outputs(&mut cx.b, &recorded) {
            // Every output is empty: nothing to compute, whatever the op.
            Some(empty) => empty,
            None => {
                // A lowering that panics is a bug in tpuc; it must not take the caller (a
                // Python process, say) down with it: it becomes an error naming the node.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lower_fn(&mut cx, n)))
                    .map_err(|panic| {
                        let what = panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("unknown panic");
                        node_err(format!("internal error in the lowering: {what}"))
                    })?
                    .map_err(|e| node_err(e.0))?
            }
        };
        if let Some(arg) = mutated {
            // Later nodes that read the mutated tensor read the result.
            if let (Some(Arg::Tensor(target)), Some(&Some(v))) = (n.arg(arg), outs.first()) {
                cx.rebind(target, v);
            }
        }
        // A lowering returns either one value per output position (None where the graph does
        // not use an output) or one per output the graph uses.
        let slots = output_slots(n);
        let used: Vec<(usize, &str)> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|name| (i, name)))
            .collect();
        let assigned: Vec<((usize, &str), Option<Value>)> = if outs.len() == slots.len() {
            slots
                .iter()
                .enumerate()
                .zip(outs)
                .filter_map(|((i, s), v)| s.map(|name| ((i, name), v)))
                .collect()
        } else if outs.len() == used.len() {
            used.into_iter().zip(outs).collect()
        } else {
            return Err(node_err(format!(
                "lowering produced {} outputs, the graph expects {}",
                outs.len(),
                used.len()
            )));
        };
        for ((i, name), v) in assigned {
            if let Some(v) = v {
                // The result must have exactly the type torch recorded: a mismatch would mean
                // silently wrong output, so it is an error.
                let expected = recorded[i]
                    .as_ref()
                    .ok_or_else(|| node_err(format!("output {name} has no recorded type")))?;
                if cx.b.ty(v) != expected {
                    return Err(node_err(format!(
                        "internal error: lowered output {name} has type {} but torch recorded {expected}",
                        cx.b.ty(v)
                    )));
                }
            }
            cx.values.insert(name, v);
        }
    }
    if cx.rng_state.is_some() {
        args.push(ArgRole::RngSeed);
    }
    let mut results = Vec::new();
    let mut names = Vec::new();
    for (i, out) in g.outputs.iter().enumerate() {
        match &out.value {
            OutputValue::Tensor(t) => {
                let v = cx
                    .value(t)
                    .map_err(|e| LowerError::Program(format!("graph output {i}: {}", e.0)))?;
                results.push(v);
                names.push(t.clone());
            }
            OutputValue::Constant(a) => {
                return Err(LowerError::Program(format!(
                    "graph output {i} is a constant {} (tpuc compiles tensor outputs only)",
                    a.kind_name()
                )))
            }
        }
    }
    let main = cx.b.finish(results, Vec::new());
    let module = crate::passes::cleanup(Module {
        main,
        attrs: Vec::new(),
    });
    Ok(Lowered {
        module,
        args,
        results: names,
    })
}
