//! serde mirror of the parts of torch.export's serialized schema (version 8) that tpuc reads.
//! Unions are single-key objects, which serde's externally tagged enums match directly.

use std::collections::HashMap;

use serde::Deserialize;

#[derive(Deserialize)]
pub struct ExportedProgram {
    pub graph_module: GraphModule,
    #[serde(default)]
    pub range_constraints: HashMap<String, RangeConstraint>,
    /// Not torch's: the user kernels the backend hands over with a graph (`crate::kernels`).
    #[serde(default)]
    pub tpuc_kernels: Option<crate::kernels::KernelsDocument>,
}

/// The sizes a symbol may take; None: unbounded on that side.
#[derive(Deserialize)]
pub struct RangeConstraint {
    pub min_val: Option<i64>,
    pub max_val: Option<i64>,
}

#[derive(Deserialize)]
pub struct SchemaVersion {
    pub major: i64,
    pub minor: i64,
}

/// Only the version, so a newer schema is reported as such rather than as a parse error.
#[derive(Deserialize)]
pub struct VersionProbe {
    pub schema_version: SchemaVersion,
}

#[derive(Deserialize)]
pub struct GraphModule {
    pub graph: Graph,
    pub signature: Signature,
}

#[derive(Deserialize)]
pub struct Graph {
    pub inputs: Vec<Argument>,
    pub outputs: Vec<Argument>,
    pub nodes: Vec<Node>,
    pub tensor_values: HashMap<String, TensorMeta>,
    #[serde(default)]
    pub sym_int_values: HashMap<String, SymInt>,
}

#[derive(Deserialize)]
pub struct Node {
    pub target: String,
    pub inputs: Vec<NamedArgument>,
    pub outputs: Vec<Argument>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Deserialize)]
pub struct NamedArgument {
    pub name: String,
    pub arg: Argument,
    #[serde(default)]
    pub kind: Option<i64>,
}

#[derive(Deserialize)]
pub struct TensorArgument {
    pub name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymIntArgument {
    AsName(String),
    AsInt(i64),
}

/// A SymBool argument: a named value of the graph or a constant.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymBoolArgument {
    AsName(String),
    AsBool(bool),
}

/// A SymFloat argument: a named value of the graph or a constant.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymFloatArgument {
    AsName(String),
    AsFloat(Float),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionalTensorArgument {
    AsTensor(TensorArgument),
    AsNone(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
pub struct Device {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub index: Option<i64>,
}

/// A float as torch writes it: a number, or a string for non-finite values.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Float {
    Number(f64),
    Text(String),
}

// Variant names follow the schema's `as_*` keys.
#[allow(clippy::enum_variant_names)]
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Argument {
    AsNone(serde::de::IgnoredAny),
    AsTensor(TensorArgument),
    AsTensors(Vec<TensorArgument>),
    AsInt(i64),
    AsInts(Vec<i64>),
    AsFloat(Float),
    AsFloats(Vec<Float>),
    AsString(String),
    AsStrings(Vec<String>),
    AsSymInt(SymIntArgument),
    AsSymInts(Vec<SymIntArgument>),
    AsSymBool(SymBoolArgument),
    AsSymBools(serde::de::IgnoredAny),
    AsSymFloat(SymFloatArgument),
    AsSymFloats(serde::de::IgnoredAny),
    AsScalarType(i64),
    AsMemoryFormat(i64),
    AsLayout(i64),
    AsDevice(Device),
    AsBool(bool),
    AsBools(Vec<bool>),
    AsOptionalTensors(Vec<OptionalTensorArgument>),
    AsOptionalTensor(OptionalTensorArgument),
    AsGraph(Box<GraphArgument>),
    AsOperator(String),
    // Read as what they are, not by their content: no lowering takes them.
    AsCustomObj(serde::de::IgnoredAny),
    AsComplex(serde::de::IgnoredAny),
    AsIntLists(serde::de::IgnoredAny),
    AsStringToArgument(serde::de::IgnoredAny),
}

/// A graph a higher-order operator takes (its branches, its body), with its own namespace of
/// values.
#[derive(Deserialize)]
pub struct GraphArgument {
    pub name: String,
    pub graph: Graph,
}

#[derive(Deserialize)]
pub struct SymExprHint {
    #[serde(default)]
    pub as_int: Option<i64>,
}

#[derive(Deserialize)]
pub struct SymExpr {
    pub expr_str: String,
    #[serde(default)]
    pub hint: Option<SymExprHint>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymInt {
    AsExpr(SymExpr),
    AsInt(i64),
}

#[derive(Deserialize)]
pub struct TensorMeta {
    pub dtype: i64,
    pub sizes: Vec<SymInt>,
    #[serde(default)]
    pub strides: Vec<SymInt>,
    #[serde(default)]
    pub storage_offset: Option<SymInt>,
}

#[derive(Deserialize)]
pub struct Signature {
    pub input_specs: Vec<InputSpec>,
    pub output_specs: Vec<OutputSpec>,
}

#[derive(Deserialize)]
pub struct ArgSpec<A> {
    pub arg: A,
    #[serde(default)]
    pub parameter_name: Option<String>,
    #[serde(default)]
    pub buffer_name: Option<String>,
    #[serde(default)]
    pub persistent: Option<bool>,
    #[serde(default)]
    pub tensor_constant_name: Option<String>,
    #[serde(default)]
    pub user_input_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputSpec {
    UserInput(ArgSpec<Argument>),
    Parameter(ArgSpec<TensorArgument>),
    Buffer(ArgSpec<TensorArgument>),
    TensorConstant(ArgSpec<TensorArgument>),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputSpec {
    UserOutput(ArgSpec<Argument>),
    LossOutput(ArgSpec<TensorArgument>),
    BufferMutation(ArgSpec<TensorArgument>),
    GradientToParameter(ArgSpec<TensorArgument>),
    GradientToUserInput(ArgSpec<TensorArgument>),
    UserInputMutation(ArgSpec<TensorArgument>),
    ParameterMutation(ArgSpec<TensorArgument>),
}

/// `data/weights/model_weights_config.json` and `data/constants/model_constants_config.json`.
#[derive(Deserialize)]
pub struct PayloadConfig {
    pub config: HashMap<String, PayloadEntry>,
}

#[derive(Deserialize)]
pub struct PayloadEntry {
    pub path_name: String,
    #[serde(default)]
    pub use_pickle: bool,
    pub tensor_meta: TensorMeta,
}
