//! tpuc's `.fx` interchange: the magic `TPUCFX1\n` followed by a protobuf `tpuc.fx.Program`
//! (proto/tpuc/fx.proto). Weights are inline or in a 64-byte aligned side file.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message;

use crate::dtype;
use crate::error::{FxError, Result};
use crate::graph::*;
use crate::kernels::KernelsDocument;
use crate::symbolic::SymbolRange;

#[allow(clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/tpuc.fx.rs"));
}

pub const MAGIC: &[u8; 8] = b"TPUCFX1\n";
/// The newest format version: 2 carries subgraph arguments, 3 user kernels. A program is
/// written with the oldest version that holds it (1 when it has neither); all are read.
pub const FORMAT_VERSION: u32 = 3;
const FIRST_FORMAT_VERSION: u32 = 1;
const SUBGRAPHS_FORMAT_VERSION: u32 = 2;
/// Alignment of each weight in a side file: what memory maps and zero-copy buffers need.
pub const WEIGHT_ALIGNMENT: usize = 64;

/// Where `write_fx` puts weight bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightStorage {
    /// Inside the `.fx` file.
    Inline,
    /// In `<file>.weights` beside it, each weight 64-byte aligned.
    SideFile,
}

/// Writes `program` to `path` (and its side file), atomically: readers never see a half file.
pub fn write_fx(program: &Program, path: &Path, storage: WeightStorage) -> Result<()> {
    let io = |source| FxError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut names: Vec<&String> = program.weights.keys().collect();
    names.sort();
    let mut side = Vec::new();
    let side_path = side_file_path(path);
    let side_name = side_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let weights = names
        .into_iter()
        .map(|name| {
            let w = &program.weights[name];
            let bytes = w.bytes.as_slice();
            let data = match storage {
                WeightStorage::Inline => proto::weight::Data::InlineData(bytes.to_vec()),
                WeightStorage::SideFile => {
                    side.resize(side.len().next_multiple_of(WEIGHT_ALIGNMENT), 0);
                    let offset = side.len() as u64;
                    side.extend_from_slice(bytes);
                    proto::weight::Data::External(proto::ExternalData {
                        file: side_name.clone(),
                        offset,
                        length: bytes.len() as u64,
                    })
                }
            };
            proto::Weight {
                name: name.clone(),
                dtype: dtype::schema_code(w.dtype) as i32,
                sizes: w.sizes.clone(),
                data: Some(data),
            }
        })
        .collect();
    let message = proto::Program {
        format_version: if !program.kernels.is_empty() {
            FORMAT_VERSION
        } else if has_subgraphs(&program.graph) {
            SUBGRAPHS_FORMAT_VERSION
        } else {
            FIRST_FORMAT_VERSION
        },
        graph: Some(graph_to_proto(&program.graph)),
        weights,
        kernels: if program.kernels.is_empty() {
            Vec::new()
        } else {
            serde_json::to_vec(&KernelsDocument::of(&program.kernels))
                .expect("a kernels document serializes")
        },
    };
    if storage == WeightStorage::SideFile {
        write_atomically(&side_path, &[&side]).map_err(|source| FxError::Io {
            path: side_path.clone(),
            source,
        })?;
    }
    write_atomically(path, &[MAGIC, &message.encode_to_vec()]).map_err(io)
}

pub fn side_file_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".weights");
    path.with_file_name(name)
}

fn write_atomically(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        for p in parts {
            f.write_all(p)?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Reads a `.fx` file (and its side file, memory-mapped) into a validated [`Program`].
pub fn read_fx(path: &Path) -> Result<Program> {
    let bad = |message: String| FxError::FxFormat {
        path: path.to_path_buf(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|source| FxError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let body = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| bad("missing the TPUCFX1 header".into()))?;
    let message = proto::Program::decode(body)
        .map_err(|e| bad(format!("corrupt or truncated protobuf: {e}")))?;
    if !(FIRST_FORMAT_VERSION..=FORMAT_VERSION).contains(&message.format_version) {
        return Err(bad(format!(
            "format version {} is not supported (this tpuc reads versions {FIRST_FORMAT_VERSION} to {FORMAT_VERSION})",
            message.format_version
        )));
    }
    let graph = graph_from_proto(message.graph.ok_or_else(|| bad("no graph".into()))?).map_err(
        |(context, message)| FxError::Invalid {
            path: path.to_path_buf(),
            context,
            message,
        },
    )?;
    let mut maps: HashMap<String, Arc<memmap2::Mmap>> = HashMap::new();
    let mut weights = HashMap::with_capacity(message.weights.len());
    for w in message.weights {
        let context = format!("weight {}", w.name);
        let invalid = |message: String| FxError::Invalid {
            path: path.to_path_buf(),
            context: context.clone(),
            message,
        };
        let dtype = dtype::from_schema_code(w.dtype.into()).ok_or_else(|| {
            invalid(format!(
                "unsupported {}",
                dtype::describe_unsupported_code(w.dtype.into())
            ))
        })?;
        let bytes = match w.data {
            Some(proto::weight::Data::InlineData(b)) => WeightBytes::Owned(Arc::new(b)),
            Some(proto::weight::Data::External(ext)) => {
                if ext.file.contains('/') || ext.file.contains('\\') || ext.file.is_empty() {
                    return Err(invalid(format!(
                        "side file name {:?} must be a plain file name",
                        ext.file
                    )));
                }
                let side = path.with_file_name(&ext.file);
                let map = match maps.get(&ext.file) {
                    Some(m) => m.clone(),
                    None => {
                        let io = |source| FxError::Io {
                            path: side.clone(),
                            source,
                        };
                        let f = std::fs::File::open(&side).map_err(io)?;
                        // SAFETY: read-only map of a file tpuc does not modify while mapped.
                        let m = Arc::new(unsafe { memmap2::Mmap::map(&f) }.map_err(io)?);
                        maps.insert(ext.file.clone(), m.clone());
                        m
                    }
                };
                let end = ext.offset.checked_add(ext.length);
                if end.is_none_or(|e| e > map.len() as u64) {
                    return Err(invalid(format!(
                        "bytes {}..{} lie outside {} ({} bytes; truncated?)",
                        ext.offset,
                        ext.offset.saturating_add(ext.length),
                        side.display(),
                        map.len()
                    )));
                }
                WeightBytes::Mapped {
                    map,
                    offset: ext.offset as usize,
                    len: ext.length as usize,
                }
            }
            None => return Err(invalid("has no data".into())),
        };
        let weight = Weight {
            dtype,
            sizes: w.sizes,
            bytes,
        };
        crate::pt2::check_weight_size(&weight).map_err(invalid)?;
        weights.insert(w.name, weight);
    }
    let kernels = if message.kernels.is_empty() {
        Vec::new()
    } else {
        serde_json::from_slice::<KernelsDocument>(&message.kernels)
            .map_err(|e| e.to_string())
            .and_then(KernelsDocument::kernels)
            .map_err(|message| FxError::Invalid {
                path: path.to_path_buf(),
                context: "kernels".into(),
                message,
            })?
    };
    crate::validate::validated(
        path,
        Program {
            graph,
            weights,
            kernels,
        },
    )
}

fn dim_to_proto(d: &Dim) -> proto::Dim {
    proto::Dim {
        kind: Some(match d {
            Dim::Static(n) => proto::dim::Kind::StaticSize(*n),
            Dim::Symbolic { expr, hint } => proto::dim::Kind::Symbolic(proto::Symbolic {
                expr: expr.clone(),
                hint: *hint,
            }),
        }),
    }
}

fn dim_from_proto(d: proto::Dim) -> Result<Dim, String> {
    match d.kind {
        Some(proto::dim::Kind::StaticSize(n)) => Ok(Dim::Static(n)),
        Some(proto::dim::Kind::Symbolic(s)) => Ok(Dim::Symbolic {
            expr: s.expr,
            hint: s.hint,
        }),
        None => Err("a dimension has no value".into()),
    }
}

fn meta_to_proto(m: &TensorMeta) -> proto::TensorMeta {
    proto::TensorMeta {
        dtype: dtype::schema_code(m.dtype) as i32,
        sizes: m.sizes.iter().map(dim_to_proto).collect(),
        strides: m.strides.iter().map(dim_to_proto).collect(),
        storage_offset: m.storage_offset,
    }
}

fn meta_from_proto(m: proto::TensorMeta) -> Result<TensorMeta, String> {
    Ok(TensorMeta {
        dtype: dtype::from_schema_code(m.dtype.into()).ok_or_else(|| {
            format!(
                "unsupported {}",
                dtype::describe_unsupported_code(m.dtype.into())
            )
        })?,
        sizes: m
            .sizes
            .into_iter()
            .map(dim_from_proto)
            .collect::<Result<_, _>>()?,
        strides: m
            .strides
            .into_iter()
            .map(dim_from_proto)
            .collect::<Result<_, _>>()?,
        storage_offset: m.storage_offset,
    })
}

fn sym_to_proto(s: &SymIntArg) -> proto::SymIntArg {
    proto::SymIntArg {
        kind: Some(match s {
            SymIntArg::Name(n) => proto::sym_int_arg::Kind::Name(n.clone()),
            SymIntArg::Int(v) => proto::sym_int_arg::Kind::Value(*v),
        }),
    }
}

fn sym_from_proto(s: proto::SymIntArg) -> Result<SymIntArg, String> {
    match s.kind {
        Some(proto::sym_int_arg::Kind::Name(n)) => Ok(SymIntArg::Name(n)),
        Some(proto::sym_int_arg::Kind::Value(v)) => Ok(SymIntArg::Int(v)),
        None => Err("a SymInt argument has no value".into()),
    }
}

fn arg_to_proto(a: &Arg) -> proto::Arg {
    use proto::arg::Kind as K;
    let strings = |v: &[String]| proto::StringList { values: v.to_vec() };
    let kind = match a {
        Arg::None => K::NoneValue(true),
        Arg::Tensor(t) => K::Tensor(t.clone()),
        Arg::Tensors(ts) => K::Tensors(strings(ts)),
        Arg::OptionalTensors(ts) => K::OptionalTensors(proto::OptionalTensorList {
            values: ts
                .iter()
                .map(|t| proto::OptionalTensor { name: t.clone() })
                .collect(),
        }),
        Arg::Int(n) => K::IntValue(*n),
        Arg::Ints(v) => K::Ints(proto::IntList { values: v.clone() }),
        Arg::Float(f) => K::FloatValue(*f),
        Arg::Floats(v) => K::Floats(proto::FloatList { values: v.clone() }),
        Arg::Bool(b) => K::BoolValue(*b),
        Arg::Bools(v) => K::Bools(proto::BoolList { values: v.clone() }),
        Arg::Str(s) => K::StringValue(s.clone()),
        Arg::Strs(v) => K::Strings(strings(v)),
        Arg::SymInt(s) => K::SymInt(sym_to_proto(s)),
        Arg::SymInts(v) => K::SymInts(proto::SymIntList {
            values: v.iter().map(sym_to_proto).collect(),
        }),
        Arg::SymBool(s) => K::SymBool(s.clone()),
        Arg::SymFloat(s) => K::SymFloat(s.clone()),
        Arg::ScalarType(d) => K::ScalarType(dtype::schema_code(*d) as i32),
        Arg::MemoryFormat(m) => K::MemoryFormat(*m),
        Arg::Layout(l) => K::Layout(*l),
        Arg::Device { kind, index } => K::Device(proto::Device {
            kind: kind.clone(),
            index: *index,
        }),
        Arg::Graph(sub) => K::Subgraph(proto::Subgraph {
            name: sub.name.clone(),
            graph: Some(graph_to_proto(&sub.graph)),
        }),
        Arg::Operator(op) => K::Operator(op.clone()),
        Arg::Opaque(kind) => K::Opaque(kind.to_string()),
    };
    proto::Arg { kind: Some(kind) }
}

fn arg_from_proto(a: proto::Arg) -> Result<Arg, String> {
    use proto::arg::Kind as K;
    Ok(match a.kind.ok_or("an argument has no value")? {
        K::NoneValue(_) => Arg::None,
        K::Tensor(t) => Arg::Tensor(t),
        K::Tensors(ts) => Arg::Tensors(ts.values),
        K::OptionalTensors(ts) => {
            Arg::OptionalTensors(ts.values.into_iter().map(|t| t.name).collect())
        }
        K::IntValue(n) => Arg::Int(n),
        K::Ints(v) => Arg::Ints(v.values),
        K::FloatValue(f) => Arg::Float(f),
        K::Floats(v) => Arg::Floats(v.values),
        K::BoolValue(b) => Arg::Bool(b),
        K::Bools(v) => Arg::Bools(v.values),
        K::StringValue(s) => Arg::Str(s),
        K::Strings(v) => Arg::Strs(v.values),
        K::SymInt(s) => Arg::SymInt(sym_from_proto(s)?),
        K::SymInts(v) => Arg::SymInts(
            v.values
                .into_iter()
                .map(sym_from_proto)
                .collect::<Result<_, _>>()?,
        ),
        K::SymBool(s) => Arg::SymBool(s),
        K::SymFloat(s) => Arg::SymFloat(s),
        K::ScalarType(code) => {
            Arg::ScalarType(dtype::from_schema_code(code.into()).ok_or_else(|| {
                format!(
                    "unsupported {}",
                    dtype::describe_unsupported_code(code.into())
                )
            })?)
        }
        K::MemoryFormat(m) => Arg::MemoryFormat(m),
        K::Layout(l) => Arg::Layout(l),
        K::Device(d) => Arg::Device {
            kind: d.kind,
            index: d.index,
        },
        K::Subgraph(sub) => {
            let graph = sub
                .graph
                .ok_or_else(|| format!("subgraph {} has no graph", sub.name))?;
            let graph = graph_from_proto(graph).map_err(|(context, message)| {
                format!("subgraph {}: {context}: {message}", sub.name)
            })?;
            Arg::Graph(Arc::new(Subgraph {
                name: sub.name,
                graph,
            }))
        }
        K::Operator(op) => Arg::Operator(op),
        K::Opaque(kind) => Arg::Opaque(
            OPAQUE_KINDS
                .iter()
                .find(|k| **k == kind)
                .ok_or_else(|| format!("an argument of an unknown kind {kind:?}"))?,
        ),
    })
}

/// Whether a node of `g` takes a subgraph, an operator or an opaque argument (which only
/// format version 2 carries).
fn has_subgraphs(g: &Graph) -> bool {
    g.nodes.iter().any(|n| {
        n.inputs
            .iter()
            .any(|a| matches!(a.arg, Arg::Graph(_) | Arg::Operator(_) | Arg::Opaque(_)))
    })
}

fn graph_to_proto(g: &Graph) -> proto::Graph {
    let mut tensors: Vec<_> = g
        .tensors
        .iter()
        .map(|(name, m)| proto::NamedTensorMeta {
            name: name.clone(),
            meta: Some(meta_to_proto(m)),
        })
        .collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut sym_ints: Vec<_> = g
        .sym_ints
        .iter()
        .map(|(name, d)| proto::NamedDim {
            name: name.clone(),
            dim: Some(dim_to_proto(d)),
        })
        .collect();
    sym_ints.sort_by(|a, b| a.name.cmp(&b.name));
    // A BTreeMap: already sorted.
    let symbol_ranges = g
        .symbol_ranges
        .iter()
        .map(|(name, r)| proto::SymbolRange {
            name: name.clone(),
            min: r.min,
            max: r.max,
        })
        .collect();
    proto::Graph {
        symbol_ranges,
        inputs: g
            .inputs
            .iter()
            .map(|i| {
                let (kind, target, persistent) = match &i.kind {
                    InputKind::UserInput => (proto::InputKind::UserInput, String::new(), false),
                    InputKind::Parameter { target } => {
                        (proto::InputKind::Parameter, target.clone(), false)
                    }
                    InputKind::Buffer { target, persistent } => {
                        (proto::InputKind::Buffer, target.clone(), *persistent)
                    }
                    InputKind::Constant { target } => {
                        (proto::InputKind::Constant, target.clone(), false)
                    }
                };
                proto::Input {
                    name: i.name.clone(),
                    kind: kind as i32,
                    target,
                    persistent,
                }
            })
            .collect(),
        nodes: g
            .nodes
            .iter()
            .map(|n| proto::Node {
                name: n.name.clone(),
                target: n.target.clone(),
                inputs: n
                    .inputs
                    .iter()
                    .map(|a| proto::NamedArg {
                        name: a.name.clone(),
                        arg: Some(arg_to_proto(&a.arg)),
                        keyword: a.keyword,
                    })
                    .collect(),
                outputs: n
                    .outputs
                    .iter()
                    .map(|o| proto::NodeOutput {
                        kind: Some(match o {
                            NodeOutput::Tensor(t) => proto::node_output::Kind::Tensor(t.clone()),
                            NodeOutput::Tensors(ts) => {
                                proto::node_output::Kind::Tensors(proto::StringList {
                                    values: ts.clone(),
                                })
                            }
                            NodeOutput::SymInt(s) => proto::node_output::Kind::SymInt(s.clone()),
                            NodeOutput::SymBool(s) => proto::node_output::Kind::SymBool(s.clone()),
                            NodeOutput::SymFloat(s) => {
                                proto::node_output::Kind::SymFloat(s.clone())
                            }
                            NodeOutput::None => proto::node_output::Kind::NoneValue(true),
                        }),
                    })
                    .collect(),
                stack_trace: n.stack_trace.clone(),
            })
            .collect(),
        outputs: g
            .outputs
            .iter()
            .map(|o| {
                use proto::OutputKind as P;
                let (kind, target) = match &o.kind {
                    OutputKind::User => (P::User, ""),
                    OutputKind::Loss => (P::Loss, ""),
                    OutputKind::BufferMutation { target } => (P::BufferMutation, target.as_str()),
                    OutputKind::ParameterMutation { target } => {
                        (P::ParameterMutation, target.as_str())
                    }
                    OutputKind::UserInputMutation { target } => {
                        (P::UserInputMutation, target.as_str())
                    }
                    OutputKind::GradientToParameter { target } => {
                        (P::GradientToParameter, target.as_str())
                    }
                    OutputKind::GradientToUserInput { target } => {
                        (P::GradientToUserInput, target.as_str())
                    }
                };
                proto::Output {
                    kind: kind as i32,
                    target: target.to_string(),
                    value: Some(match &o.value {
                        OutputValue::Tensor(t) => proto::output::Value::Tensor(t.clone()),
                        OutputValue::Constant(a) => proto::output::Value::Constant(arg_to_proto(a)),
                    }),
                }
            })
            .collect(),
        tensors,
        sym_ints,
    }
}

fn graph_from_proto(g: proto::Graph) -> Result<Graph, (String, String)> {
    let inputs = g
        .inputs
        .into_iter()
        .map(|i| {
            let kind = match proto::InputKind::try_from(i.kind) {
                Ok(proto::InputKind::UserInput) => InputKind::UserInput,
                Ok(proto::InputKind::Parameter) => InputKind::Parameter { target: i.target },
                Ok(proto::InputKind::Buffer) => InputKind::Buffer {
                    target: i.target,
                    persistent: i.persistent,
                },
                Ok(proto::InputKind::Constant) => InputKind::Constant { target: i.target },
                Err(_) => {
                    return Err((
                        format!("graph input {}", i.name),
                        format!("unknown input kind {}", i.kind),
                    ))
                }
            };
            Ok(GraphInput { name: i.name, kind })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let nodes = g
        .nodes
        .into_iter()
        .map(|n| {
            let context = format!("node {} ({})", n.name, n.target);
            let inputs = n
                .inputs
                .into_iter()
                .map(|a| {
                    Ok(NamedArg {
                        arg: arg_from_proto(
                            a.arg.ok_or(format!("argument {} has no value", a.name))?,
                        )?,
                        name: a.name,
                        keyword: a.keyword,
                    })
                })
                .collect::<Result<Vec<_>, String>>()
                .map_err(|m| (context.clone(), m))?;
            let outputs = n
                .outputs
                .into_iter()
                .map(|o| match o.kind {
                    Some(proto::node_output::Kind::Tensor(t)) => Ok(NodeOutput::Tensor(t)),
                    Some(proto::node_output::Kind::Tensors(ts)) => {
                        Ok(NodeOutput::Tensors(ts.values))
                    }
                    Some(proto::node_output::Kind::SymInt(s)) => Ok(NodeOutput::SymInt(s)),
                    Some(proto::node_output::Kind::SymBool(s)) => Ok(NodeOutput::SymBool(s)),
                    Some(proto::node_output::Kind::SymFloat(s)) => Ok(NodeOutput::SymFloat(s)),
                    Some(proto::node_output::Kind::NoneValue(_)) => Ok(NodeOutput::None),
                    None => Err((context.clone(), "an output has no value".to_string())),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Node {
                name: n.name,
                target: n.target,
                inputs,
                outputs,
                stack_trace: n.stack_trace,
            })
        })
        .collect::<Result<Vec<_>, (String, String)>>()?;
    let outputs = g
        .outputs
        .into_iter()
        .enumerate()
        .map(|(idx, o)| {
            use proto::OutputKind as P;
            let context = format!("graph output {idx}");
            let target = o.target;
            let kind = match P::try_from(o.kind) {
                Ok(P::User) => OutputKind::User,
                Ok(P::Loss) => OutputKind::Loss,
                Ok(P::BufferMutation) => OutputKind::BufferMutation { target },
                Ok(P::ParameterMutation) => OutputKind::ParameterMutation { target },
                Ok(P::UserInputMutation) => OutputKind::UserInputMutation { target },
                Ok(P::GradientToParameter) => OutputKind::GradientToParameter { target },
                Ok(P::GradientToUserInput) => OutputKind::GradientToUserInput { target },
                Err(_) => return Err((context, format!("unknown output kind {}", o.kind))),
            };
            let value = match o.value {
                Some(proto::output::Value::Tensor(t)) => OutputValue::Tensor(t),
                Some(proto::output::Value::Constant(a)) => {
                    OutputValue::Constant(arg_from_proto(a).map_err(|m| (context.clone(), m))?)
                }
                None => return Err((context, "has no value".into())),
            };
            Ok(GraphOutput { value, kind })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tensors = g
        .tensors
        .into_iter()
        .map(|t| {
            let context = format!("tensor {}", t.name);
            let meta = meta_from_proto(
                t.meta
                    .ok_or((context.clone(), "has no metadata".to_string()))?,
            )
            .map_err(|m| (context, m))?;
            Ok((t.name, meta))
        })
        .collect::<Result<HashMap<_, _>, (String, String)>>()?;
    let sym_ints = g
        .sym_ints
        .into_iter()
        .map(|s| {
            let context = format!("SymInt {}", s.name);
            let dim = dim_from_proto(s.dim.ok_or((context.clone(), "has no value".to_string()))?)
                .map_err(|m| (context, m))?;
            Ok((s.name, dim))
        })
        .collect::<Result<HashMap<_, _>, (String, String)>>()?;
    let symbol_ranges = g
        .symbol_ranges
        .into_iter()
        .map(|r| {
            (
                r.name,
                SymbolRange {
                    min: r.min,
                    max: r.max,
                },
            )
        })
        .collect();
    Ok(Graph {
        inputs,
        nodes,
        outputs,
        tensors,
        sym_ints,
        symbol_ranges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph() -> Graph {
        crate::testing::neg_graph("x", "y")
    }

    fn written(program: &Program, name: &str) -> (PathBuf, u32) {
        let path = std::env::temp_dir().join(format!("tpuc-fx-{}-{name}.fx", std::process::id()));
        write_fx(program, &path, WeightStorage::Inline).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let message = proto::Program::decode(&bytes[MAGIC.len()..]).unwrap();
        (path, message.format_version)
    }

    #[test]
    fn subgraphs_need_version_2_kernels_3_and_every_version_reads_back() {
        let plain = Program::new(graph(), HashMap::new()).unwrap();
        let mut nested = graph();
        nested.nodes[0].inputs.push(NamedArg {
            name: String::new(),
            arg: Arg::Graph(Arc::new(Subgraph {
                name: "body".into(),
                graph: graph(),
            })),
            keyword: false,
        });
        let nested = Program::new(nested, HashMap::new()).unwrap();
        // Operators and arguments tpuc does not read travel in version 2 too.
        let mut functionalized = graph();
        for arg in [
            Arg::Operator("mylib.bump.default".into()),
            Arg::Opaque(INT_LISTS),
        ] {
            functionalized.nodes[0].inputs.push(NamedArg {
                name: String::new(),
                arg,
                keyword: false,
            });
        }
        let functionalized = Program::new(functionalized, HashMap::new()).unwrap();
        let with_kernels = Program::new(graph(), HashMap::new())
            .unwrap()
            .with_kernels(vec![crate::kernels::example()])
            .unwrap();
        for (program, name, version) in [
            (&plain, "plain", 1),
            (&nested, "nested", 2),
            (&functionalized, "functionalized", 2),
            (&with_kernels, "kernels", 3),
        ] {
            let (path, written_version) = written(program, name);
            assert_eq!(written_version, version, "{name}");
            assert_eq!(&read_fx(&path).unwrap(), program, "{name}");
            std::fs::remove_file(path).unwrap();
        }
        // A version from the future is refused by name.
        let future = proto::Program {
            format_version: FORMAT_VERSION + 1,
            graph: Some(graph_to_proto(&plain.graph)),
            weights: Vec::new(),
            kernels: Vec::new(),
        };
        let path = std::env::temp_dir().join(format!("tpuc-fx-{}-future.fx", std::process::id()));
        std::fs::write(&path, [MAGIC.as_slice(), &future.encode_to_vec()].concat()).unwrap();
        let message = read_fx(&path).unwrap_err().to_string();
        std::fs::remove_file(path).unwrap();
        assert!(
            message.contains("format version 4 is not supported"),
            "{message}"
        );
    }

    #[test]
    fn a_subgraph_is_validated_as_a_graph_of_its_own() {
        let mut broken = graph();
        broken.nodes[0].inputs[0].arg = Arg::Tensor("z".into());
        let mut outer = graph();
        outer.nodes[0].inputs.push(NamedArg {
            name: String::new(),
            arg: Arg::Graph(Arc::new(Subgraph {
                name: "body".into(),
                graph: broken,
            })),
            keyword: false,
        });
        let (at, what) = Program::new(outer, HashMap::new()).unwrap_err();
        assert_eq!(
            at,
            "node neg (aten.neg.default), subgraph body: node neg (aten.neg.default)"
        );
        assert!(what.contains("undefined value z"), "{what}");
    }
}
