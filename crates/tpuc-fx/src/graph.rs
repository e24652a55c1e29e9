//! tpuc's model of an exported program: an ATen-level graph with typed values, its signature,
//! and its weights. Readers (`.pt2`, `.fx`) produce it; the lowering consumes it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::dtype::DType;
use crate::symbolic::SymbolRange;

/// One dimension of a tensor: a number, or a symbol from torch.export's dynamic shapes.
#[derive(Clone, Debug, PartialEq)]
pub enum Dim {
    Static(i64),
    /// A sympy expression (`s77`, `2*s77`) and the example value it had when exported.
    Symbolic {
        expr: String,
        hint: Option<i64>,
    },
}

impl Dim {
    pub fn as_static(&self) -> Option<i64> {
        match self {
            Dim::Static(n) => Some(*n),
            Dim::Symbolic { .. } => None,
        }
    }
}

/// A symbolic integer argument: a named SymInt value of the graph, or a plain number.
#[derive(Clone, Debug, PartialEq)]
pub enum SymIntArg {
    Name(String),
    Int(i64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorMeta {
    pub dtype: DType,
    pub sizes: Vec<Dim>,
    pub strides: Vec<Dim>,
    pub storage_offset: i64,
}

impl TensorMeta {
    /// The sizes when every dimension is static.
    pub fn static_sizes(&self) -> Option<Vec<i64>> {
        self.sizes.iter().map(Dim::as_static).collect()
    }

    /// The type: `float32[s17, 5, 16]`.
    pub fn describe(&self) -> String {
        format!("{}{}", self.dtype, self.describe_sizes())
    }

    /// The sizes, symbolic ones infix: `[s17, 2*s27, 16]`.
    pub fn describe_sizes(&self) -> String {
        let dims: Vec<String> = self
            .sizes
            .iter()
            .map(|d| match d {
                Dim::Static(n) => n.to_string(),
                Dim::Symbolic { expr, .. } => crate::symbolic::pretty(expr),
            })
            .collect();
        format!("[{}]", dims.join(", "))
    }
}

/// A call argument, mirroring the argument kinds of torch.export's schema.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    None,
    Tensor(String),
    Tensors(Vec<String>),
    OptionalTensors(Vec<Option<String>>),
    Int(i64),
    Ints(Vec<i64>),
    Float(f64),
    Floats(Vec<f64>),
    Bool(bool),
    Bools(Vec<bool>),
    Str(String),
    Strs(Vec<String>),
    SymInt(SymIntArg),
    SymInts(Vec<SymIntArg>),
    /// A SymBool value of the graph by name (a comparison of sizes, for an assertion); a
    /// constant one is read as `Bool`.
    SymBool(String),
    /// A SymFloat value of the graph by name; a constant one is read as `Float`.
    SymFloat(String),
    ScalarType(DType),
    /// torch.export's MemoryFormat code.
    MemoryFormat(i64),
    /// torch.export's Layout code.
    Layout(i64),
    Device {
        kind: String,
        index: Option<i64>,
    },
    /// A graph the operator runs (`torch.cond`'s branches, a loop's condition and body).
    Graph(Arc<Subgraph>),
    /// An operator passed as an argument (the op `auto_functionalized` runs), by its name
    /// without `torch.ops.`.
    Operator(String),
    /// An argument of a kind tpuc does not read, by what it is: one of [`OPAQUE_KINDS`].
    Opaque(&'static str),
}

pub const CUSTOM_OBJECT: &str = "custom object";
pub const COMPLEX_NUMBER: &str = "complex number";
pub const INT_LISTS: &str = "list of int lists";
pub const ARGUMENT_DICTIONARY: &str = "dictionary of arguments";

/// The kinds of argument tpuc reads as [`Arg::Opaque`].
pub const OPAQUE_KINDS: &[&str] = &[
    CUSTOM_OBJECT,
    COMPLEX_NUMBER,
    INT_LISTS,
    ARGUMENT_DICTIONARY,
];

/// A graph an operator takes as an argument: closed (it reads only its inputs, which the
/// operator passes it), its tensor names its own; its inputs are user inputs and its outputs
/// what it returns.
#[derive(Clone, Debug, PartialEq)]
pub struct Subgraph {
    /// Its name in the exported program (`true_graph_0`).
    pub name: String,
    pub graph: Graph,
}

impl Arg {
    /// Short name of the kind, for error messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Arg::None => "None",
            Arg::Tensor(_) => "tensor",
            Arg::Tensors(_) => "tensor list",
            Arg::OptionalTensors(_) => "optional tensor list",
            Arg::Int(_) => "int",
            Arg::Ints(_) => "int list",
            Arg::Float(_) => "float",
            Arg::Floats(_) => "float list",
            Arg::Bool(_) => "bool",
            Arg::Bools(_) => "bool list",
            Arg::Str(_) => "string",
            Arg::Strs(_) => "string list",
            Arg::SymInt(_) => "SymInt",
            Arg::SymInts(_) => "SymInt list",
            Arg::SymBool(_) => "SymBool",
            Arg::SymFloat(_) => "SymFloat",
            Arg::ScalarType(_) => "dtype",
            Arg::MemoryFormat(_) => "memory format",
            Arg::Layout(_) => "layout",
            Arg::Device { .. } => "device",
            Arg::Graph(_) => "graph",
            Arg::Operator(_) => "operator",
            Arg::Opaque(kind) => kind,
        }
    }

    /// Names of every tensor this argument refers to (a subgraph refers to none of the graph
    /// it is in: it is closed).
    pub fn tensor_refs(&self) -> Vec<&str> {
        match self {
            Arg::Tensor(t) => vec![t.as_str()],
            Arg::Tensors(ts) => ts.iter().map(String::as_str).collect(),
            Arg::OptionalTensors(ts) => ts.iter().flatten().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NamedArg {
    /// The parameter's name in the operator schema (`self`, `dim`, ...).
    pub name: String,
    pub arg: Arg,
    pub keyword: bool,
}

/// What a node produces: a tensor, a list of tensors, or nothing in that output slot.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeOutput {
    Tensor(String),
    Tensors(Vec<String>),
    SymInt(String),
    SymBool(String),
    SymFloat(String),
    None,
}

/// A Python source position taken from a node's stack trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceLoc {
    pub file: String,
    pub line: u32,
}

impl std::fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    /// The operator without the `torch.ops.` prefix, e.g. `aten.addmm.default`.
    pub target: String,
    pub inputs: Vec<NamedArg>,
    pub outputs: Vec<NodeOutput>,
    pub stack_trace: Option<String>,
}

impl Node {
    pub fn arg(&self, name: &str) -> Option<&Arg> {
        self.inputs.iter().find(|a| a.name == name).map(|a| &a.arg)
    }

    /// The user's source line: the innermost frame of the stack trace outside installed packages.
    pub fn source(&self) -> Option<SourceLoc> {
        self.stack_trace
            .as_deref()
            .and_then(crate::source::user_frame)
    }

    /// Names of the tensors this node defines, in output order.
    pub fn defined_tensors(&self) -> Vec<&str> {
        let mut out = Vec::new();
        for o in &self.outputs {
            match o {
                NodeOutput::Tensor(t) => out.push(t.as_str()),
                NodeOutput::Tensors(ts) => out.extend(ts.iter().map(String::as_str)),
                NodeOutput::SymInt(_)
                | NodeOutput::SymBool(_)
                | NodeOutput::SymFloat(_)
                | NodeOutput::None => {}
            }
        }
        out
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum InputKind {
    /// A model parameter; `target` is its fully qualified name (`fc1.weight`).
    Parameter {
        target: String,
    },
    Buffer {
        target: String,
        persistent: bool,
    },
    /// A lifted tensor constant.
    Constant {
        target: String,
    },
    UserInput,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GraphInput {
    /// The placeholder name in the graph.
    pub name: String,
    pub kind: InputKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum OutputKind {
    User,
    Loss,
    BufferMutation { target: String },
    ParameterMutation { target: String },
    UserInputMutation { target: String },
    GradientToParameter { target: String },
    GradientToUserInput { target: String },
}

#[derive(Clone, Debug, PartialEq)]
pub enum OutputValue {
    Tensor(String),
    /// A user output that is a constant (None, an int, ...), kept for the signature.
    Constant(Arg),
}

#[derive(Clone, Debug, PartialEq)]
pub struct GraphOutput {
    pub value: OutputValue,
    pub kind: OutputKind,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub inputs: Vec<GraphInput>,
    pub nodes: Vec<Node>,
    pub outputs: Vec<GraphOutput>,
    pub tensors: HashMap<String, TensorMeta>,
    /// SymInt values of the graph: expression and example value.
    pub sym_ints: HashMap<String, Dim>,
    /// The sizes each symbol of a dynamic-shape export may take.
    pub symbol_ranges: BTreeMap<String, SymbolRange>,
}

impl Graph {
    pub fn tensor(&self, name: &str) -> Option<&TensorMeta> {
        self.tensors.get(name)
    }

    /// The subgraphs its nodes run (not those within them), in node order.
    pub fn subgraphs(&self) -> impl Iterator<Item = &Subgraph> {
        self.nodes.iter().flat_map(|n| {
            n.inputs.iter().filter_map(|a| match &a.arg {
                Arg::Graph(g) => Some(g.as_ref()),
                _ => None,
            })
        })
    }

    /// The subgraphs its nodes run, to change: each copied first where another node or
    /// program shares it.
    pub fn subgraphs_mut(&mut self) -> impl Iterator<Item = &mut Subgraph> {
        self.nodes.iter_mut().flat_map(|n| {
            n.inputs.iter_mut().filter_map(|a| match &mut a.arg {
                Arg::Graph(g) => Some(Arc::make_mut(g)),
                _ => None,
            })
        })
    }
}

/// The bytes of a weight: a view into a memory-mapped archive, or owned memory.
#[derive(Clone)]
pub enum WeightBytes {
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    },
    Owned(Arc<Vec<u8>>),
}

impl WeightBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            WeightBytes::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            WeightBytes::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            WeightBytes::Mapped { .. } => "mapped",
            WeightBytes::Owned(_) => "owned",
        };
        write!(f, "WeightBytes({kind}, {} bytes)", self.as_slice().len())
    }
}

impl PartialEq for WeightBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

/// A parameter, buffer or constant with its data (dense, row-major, little-endian).
#[derive(Clone, Debug, PartialEq)]
pub struct Weight {
    pub dtype: DType,
    pub sizes: Vec<i64>,
    pub bytes: WeightBytes,
}

/// An exported program: the graph plus the data of its parameters, buffers and constants,
/// keyed by fully qualified name (the `target` of the graph inputs).
#[derive(Clone, Debug, Default, PartialEq)]
/// A validated program: every reader ends with `validate::validated`, and [`Program::new`]
/// validates too, so a `Program` that exists passed validation (its fields are this crate's).
pub struct Program {
    pub(crate) graph: Graph,
    pub(crate) weights: HashMap<String, Weight>,
    /// User kernels of the custom ops the graph calls (`crate::kernels`).
    pub(crate) kernels: Vec<crate::kernels::Kernel>,
}

impl Program {
    /// The program of `graph` and `weights`, or what is wrong with it: (where, what).
    pub fn new(
        graph: Graph,
        weights: HashMap<String, Weight>,
    ) -> std::result::Result<Program, (String, String)> {
        let program = Program {
            graph,
            weights,
            kernels: Vec::new(),
        };
        crate::validate::validate(&program)?;
        Ok(program)
    }

    /// The program with `kernels` for its custom ops, or what is wrong with them.
    pub fn with_kernels(
        mut self,
        kernels: Vec<crate::kernels::Kernel>,
    ) -> std::result::Result<Program, (String, String)> {
        crate::kernels::check(&kernels).map_err(|m| ("kernels".to_string(), m))?;
        self.kernels = kernels;
        Ok(self)
    }

    /// The user kernels the program carries.
    pub fn kernels(&self) -> &[crate::kernels::Kernel] {
        &self.kernels
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The weights by fully qualified name.
    pub fn weights(&self) -> &HashMap<String, Weight> {
        &self.weights
    }

    /// The weight bound to a graph input, if it is a parameter, buffer or constant.
    pub fn weight_for(&self, input: &GraphInput) -> Option<&Weight> {
        match &input.kind {
            InputKind::Parameter { target }
            | InputKind::Buffer { target, .. }
            | InputKind::Constant { target } => self.weights.get(target),
            InputKind::UserInput => None,
        }
    }
}
