//! Reader for torch.export archives (`torch.export.save`): zip entries stored uncompressed and
//! 64-byte aligned, so weights are views of one memory map of the file.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dtype;
use crate::error::{FxError, Result};
use crate::graph::*;
use crate::kernels::KernelsDocument;
use crate::schema;
use crate::symbolic::SymbolRange;

/// The torch.export schema major version this reader understands.
pub const SUPPORTED_SCHEMA_MAJOR: i64 = 8;

struct Archive {
    path: PathBuf,
    // Declared before `map` so that it is dropped first: it borrows the mapped bytes.
    zip: zip::ZipArchive<std::io::Cursor<&'static [u8]>>,
    map: Arc<memmap2::Mmap>,
    /// The archive's top folder, e.g. `model/`.
    prefix: String,
}

impl Archive {
    fn open(path: &Path) -> Result<Archive> {
        let file = std::fs::File::open(path).map_err(|source| FxError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: the map is read-only; tpuc never writes the archive while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| FxError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let map = Arc::new(map);
        // SAFETY: the slice points into `map`, which `Archive` keeps alive for as long as `zip`.
        let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(map.as_ptr(), map.len()) };
        let zip =
            zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| FxError::Archive {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        let model_entry = zip
            .file_names()
            .filter(|n| n.ends_with("models/model.json"))
            .min_by_key(|n| n.len())
            .map(str::to_string)
            .ok_or_else(|| FxError::Archive {
                path: path.to_path_buf(),
                message: "no models/model.json entry (is this a torch.export.save archive?)".into(),
            })?;
        let prefix = model_entry
            .trim_end_matches("models/model.json")
            .to_string();
        Ok(Archive {
            path: path.to_path_buf(),
            map,
            zip,
            prefix,
        })
    }

    fn archive_error(&self, message: String) -> FxError {
        FxError::Archive {
            path: self.path.clone(),
            message,
        }
    }

    fn has(&self, name: &str) -> bool {
        self.zip
            .index_for_name(&format!("{}{name}", self.prefix))
            .is_some()
    }

    /// The bytes of an entry: a view of the map when stored uncompressed, else decompressed.
    fn entry(&mut self, name: &str) -> Result<WeightBytes> {
        let full = format!("{}{name}", self.prefix);
        let mut file = self.zip.by_name(&full).map_err(|e| FxError::Archive {
            path: self.path.clone(),
            message: format!("entry {full}: {e}"),
        })?;
        if file.compression() == zip::CompressionMethod::Stored {
            let offset = file.data_start() as usize;
            let len = file.size() as usize;
            if offset
                .checked_add(len)
                .is_none_or(|end| end > self.map.len())
            {
                return Err(FxError::Archive {
                    path: self.path.clone(),
                    message: format!("entry {full} runs past the end of the file (truncated?)"),
                });
            }
            return Ok(WeightBytes::Mapped {
                map: self.map.clone(),
                offset,
                len,
            });
        }
        // The size the entry claims is only a hint, capped by what the file holds: a damaged
        // header claiming gigabytes allocates nothing for them (decompression still grows the
        // buffer as far as the data really goes).
        let mut data = Vec::with_capacity(file.size().min(self.map.len() as u64) as usize);
        file.read_to_end(&mut data).map_err(|e| FxError::Archive {
            path: self.path.clone(),
            message: format!("entry {full}: {e}"),
        })?;
        Ok(WeightBytes::Owned(Arc::new(data)))
    }

    fn json<T: serde::de::DeserializeOwned>(&mut self, name: &str) -> Result<T> {
        let bytes = self.entry(name)?;
        parse_json(&self.path, name, bytes.as_slice())
    }
}

/// Parses JSON fast; on failure parses again to report where in the document it went wrong.
fn parse_json<T: serde::de::DeserializeOwned>(path: &Path, entry: &str, bytes: &[u8]) -> Result<T> {
    match serde_json::from_slice(bytes) {
        Ok(v) => Ok(v),
        Err(first) => {
            let mut de = serde_json::Deserializer::from_slice(bytes);
            let (location, message) = match serde_path_to_error::deserialize::<_, T>(&mut de) {
                Err(e) => (e.path().to_string(), e.inner().to_string()),
                Ok(_) => (String::from("."), first.to_string()),
            };
            Err(FxError::Json {
                path: path.to_path_buf(),
                entry: entry.to_string(),
                location,
                message,
            })
        }
    }
}

/// Reads a `.pt2` archive into a validated [`Program`].
pub fn read_pt2(path: &Path) -> Result<Program> {
    let mut archive = Archive::open(path)?;
    if archive.has("archive_format") {
        let format = archive.entry("archive_format")?;
        if format.as_slice() != b"pt2" {
            return Err(archive.archive_error(format!(
                "archive_format is {:?}, expected \"pt2\"",
                String::from_utf8_lossy(format.as_slice())
            )));
        }
    }
    if archive.has("byteorder") && archive.entry("byteorder")?.as_slice() != b"little" {
        return Err(archive
            .archive_error("weights are big-endian; tpuc reads little-endian archives".into()));
    }
    let model = archive.entry("models/model.json")?;
    let (graph, _) = graph_from_json(path, "models/model.json", model.as_slice())?;
    let conv = Converter { path };

    let mut weights = HashMap::new();
    for (folder, config) in [
        ("data/weights", "model_weights_config.json"),
        ("data/constants", "model_constants_config.json"),
    ] {
        let config_name = format!("{folder}/{config}");
        if !archive.has(&config_name) {
            continue;
        }
        let config: schema::PayloadConfig = archive.json(&config_name)?;
        let mut entries: Vec<_> = config.config.into_iter().collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (fqn, entry) in entries {
            let context = format!("weight {fqn} ({folder}/{})", entry.path_name);
            if entry.use_pickle {
                return Err(conv.invalid(
                    &context,
                    "stored as a pickle (a tensor subclass?); tpuc reads plain tensors only".into(),
                ));
            }
            let meta = conv.tensor_meta(&context, &entry.tensor_meta)?;
            let sizes = meta
                .static_sizes()
                .ok_or_else(|| conv.invalid(&context, "has symbolic sizes".into()))?;
            let bytes = archive.entry(&format!("{folder}/{}", entry.path_name))?;
            let weight = Weight {
                dtype: meta.dtype,
                sizes,
                bytes,
            };
            check_weight_size(&weight).map_err(|m| conv.invalid(&context, m))?;
            weights.insert(fqn, weight);
        }
    }
    let kernels = if archive.has(crate::kernels::ARCHIVE_ENTRY) {
        let document: KernelsDocument = archive.json(crate::kernels::ARCHIVE_ENTRY)?;
        document
            .kernels()
            .map_err(|m| conv.invalid(crate::kernels::ARCHIVE_ENTRY, m))?
    } else {
        Vec::new()
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

/// A program from a serialized `ExportedProgram` (torch.export's `model.json`) whose graph
/// takes everything as inputs, without weights: what the torch.compile backend hands over.
/// `origin` names it in errors.
pub fn program_from_json(origin: &Path, json: &[u8]) -> Result<Program> {
    let (graph, kernels) = graph_from_json(origin, "model.json", json)?;
    let kernels = match kernels {
        Some(document) => document.kernels().map_err(|message| FxError::Invalid {
            path: origin.to_path_buf(),
            context: "tpuc_kernels".into(),
            message,
        })?,
        None => Vec::new(),
    };
    crate::validate::validated(
        origin,
        Program {
            graph,
            weights: HashMap::new(),
            kernels,
        },
    )
}

/// Parses and converts the graph of a serialized `ExportedProgram`, checking its schema version;
/// with the kernels the backend put beside it, if any.
fn graph_from_json(
    path: &Path,
    entry: &str,
    json: &[u8],
) -> Result<(Graph, Option<KernelsDocument>)> {
    let probe: schema::VersionProbe = parse_json(path, entry, json)?;
    if probe.schema_version.major != SUPPORTED_SCHEMA_MAJOR {
        return Err(FxError::SchemaVersion {
            path: path.to_path_buf(),
            major: probe.schema_version.major,
            minor: probe.schema_version.minor,
            supported: SUPPORTED_SCHEMA_MAJOR,
        });
    }
    let exported: schema::ExportedProgram = parse_json(path, entry, json)?;
    let mut graph =
        Converter { path }.graph(exported.graph_module.graph, exported.graph_module.signature)?;
    graph.symbol_ranges = exported
        .range_constraints
        .into_iter()
        .map(|(name, r)| {
            let range = SymbolRange {
                min: r.min_val.unwrap_or(0).max(0),
                max: r.max_val,
            };
            (name, range)
        })
        .collect();
    Ok((graph, exported.tpuc_kernels))
}

/// Checks that a weight's bytes hold exactly its dense row-major elements.
pub fn check_weight_size(w: &Weight) -> std::result::Result<(), String> {
    let numel = w.sizes.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    let expected = numel.and_then(|n| n.checked_mul(w.dtype.byte_size()));
    let actual = w.bytes.as_slice().len();
    match expected {
        Some(e) if e == actual => Ok(()),
        Some(e) => Err(format!(
            "holds {actual} bytes but {} {:?} needs {e} (truncated, or not a dense tensor)",
            w.dtype, w.sizes
        )),
        None => Err(format!("invalid sizes {:?}", w.sizes)),
    }
}

struct Converter<'a> {
    path: &'a Path,
}

impl Converter<'_> {
    fn invalid(&self, context: &str, message: String) -> FxError {
        FxError::Invalid {
            path: self.path.to_path_buf(),
            context: context.to_string(),
            message,
        }
    }

    fn graph(&self, g: schema::Graph, sig: schema::Signature) -> Result<Graph> {
        let (graph_inputs, graph_outputs) = (g.inputs.len(), g.outputs.len());
        let mut graph = self.body("", g)?;
        let inputs = sig
            .input_specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| self.input(i, spec))
            .collect::<Result<Vec<_>>>()?;
        let outputs = sig
            .output_specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| self.output(i, spec))
            .collect::<Result<Vec<_>>>()?;
        if inputs.len() != graph_inputs || outputs.len() != graph_outputs {
            return Err(self.invalid(
                "signature",
                format!(
                    "describes {} inputs and {} outputs but the graph has {} and {}",
                    inputs.len(),
                    outputs.len(),
                    graph_inputs,
                    graph_outputs
                ),
            ));
        }
        graph.inputs = inputs;
        graph.outputs = outputs;
        Ok(graph)
    }

    /// A graph's values and nodes (its inputs and outputs left to the caller); `within` names
    /// the subgraph it is, for errors ("" for the program's own).
    fn body(&self, within: &str, g: schema::Graph) -> Result<Graph> {
        let mut tensors = HashMap::with_capacity(g.tensor_values.len());
        for (name, meta) in &g.tensor_values {
            tensors.insert(
                name.clone(),
                self.tensor_meta(&format!("{within}tensor {name}"), meta)?,
            );
        }
        let sym_ints = g
            .sym_int_values
            .into_iter()
            .map(|(name, s)| (name, sym_int_dim(&s)))
            .collect();
        let nodes = g
            .nodes
            .into_iter()
            .enumerate()
            .map(|(i, n)| self.node(within, i, n))
            .collect::<Result<Vec<_>>>()?;
        Ok(Graph {
            inputs: Vec::new(),
            nodes,
            outputs: Vec::new(),
            tensors,
            sym_ints,
            symbol_ranges: Default::default(),
        })
    }

    /// A graph a node takes as an argument: its inputs are tensors it is passed, its outputs
    /// what it returns.
    fn subgraph(&self, context: &str, a: schema::GraphArgument) -> Result<Arg> {
        let within = format!("{context}, subgraph {}: ", a.name);
        let (inputs, outputs) = (a.graph.inputs, a.graph.outputs);
        let mut graph = self.body(
            &within,
            schema::Graph {
                inputs: Vec::new(),
                outputs: Vec::new(),
                ..a.graph
            },
        )?;
        for (i, input) in inputs.into_iter().enumerate() {
            match self.arg(&within, input)? {
                Arg::Tensor(name) => graph.inputs.push(GraphInput {
                    name,
                    kind: InputKind::UserInput,
                }),
                other => {
                    return Err(self.invalid(
                        &format!("{within}input {i}"),
                        format!(
                            "an input of kind {} is not supported (only tensors)",
                            other.kind_name()
                        ),
                    ))
                }
            }
        }
        for output in outputs {
            let value = match self.arg(&within, output)? {
                Arg::Tensor(t) => OutputValue::Tensor(t),
                other => OutputValue::Constant(other),
            };
            graph.outputs.push(GraphOutput {
                value,
                kind: OutputKind::User,
            });
        }
        Ok(Arg::Graph(Arc::new(Subgraph {
            name: a.name,
            graph,
        })))
    }

    fn tensor_meta(&self, context: &str, m: &schema::TensorMeta) -> Result<TensorMeta> {
        let dtype = dtype::from_schema_code(m.dtype).ok_or_else(|| {
            self.invalid(
                context,
                format!("unsupported {}", dtype::describe_unsupported_code(m.dtype)),
            )
        })?;
        let dims = |v: &[schema::SymInt]| v.iter().map(sym_int_dim).collect::<Vec<_>>();
        Ok(TensorMeta {
            dtype,
            sizes: dims(&m.sizes),
            strides: dims(&m.strides),
            storage_offset: n_or_zero(&m.storage_offset),
        })
    }

    fn arg(&self, context: &str, a: schema::Argument) -> Result<Arg> {
        use schema::Argument as A;
        Ok(match a {
            A::AsNone(_) => Arg::None,
            A::AsTensor(t) => Arg::Tensor(t.name),
            A::AsTensors(ts) => Arg::Tensors(ts.into_iter().map(|t| t.name).collect()),
            A::AsInt(n) => Arg::Int(n),
            A::AsInts(ns) => Arg::Ints(ns),
            A::AsFloat(f) => Arg::Float(self.float(context, f)?),
            A::AsFloats(fs) => Arg::Floats(
                fs.into_iter()
                    .map(|f| self.float(context, f))
                    .collect::<Result<_>>()?,
            ),
            A::AsString(s) => Arg::Str(s),
            A::AsStrings(s) => Arg::Strs(s),
            A::AsSymInt(s) => Arg::SymInt(sym_int_arg(s)),
            A::AsSymInts(s) => Arg::SymInts(s.into_iter().map(sym_int_arg).collect()),
            A::AsSymBool(schema::SymBoolArgument::AsName(n)) => Arg::SymBool(n),
            A::AsSymBool(schema::SymBoolArgument::AsBool(b)) => Arg::Bool(b),
            A::AsSymFloat(schema::SymFloatArgument::AsName(n)) => Arg::SymFloat(n),
            A::AsSymFloat(schema::SymFloatArgument::AsFloat(f)) => {
                Arg::Float(self.float(context, f)?)
            }
            A::AsSymBools(_) | A::AsSymFloats(_) => {
                return Err(self.invalid(
                    context,
                    "lists of SymBool or SymFloat values are not supported".into(),
                ))
            }
            A::AsScalarType(code) => {
                Arg::ScalarType(dtype::from_schema_code(code).ok_or_else(|| {
                    self.invalid(
                        context,
                        format!("unsupported {}", dtype::describe_unsupported_code(code)),
                    )
                })?)
            }
            A::AsMemoryFormat(m) => Arg::MemoryFormat(m),
            A::AsLayout(l) => Arg::Layout(l),
            A::AsDevice(d) => Arg::Device {
                kind: d.kind,
                index: d.index,
            },
            A::AsBool(b) => Arg::Bool(b),
            A::AsBools(b) => Arg::Bools(b),
            A::AsOptionalTensors(ts) => Arg::OptionalTensors(
                ts.into_iter()
                    .map(|t| match t {
                        schema::OptionalTensorArgument::AsTensor(t) => Some(t.name),
                        schema::OptionalTensorArgument::AsNone(_) => None,
                    })
                    .collect(),
            ),
            A::AsOptionalTensor(t) => match t {
                schema::OptionalTensorArgument::AsTensor(t) => Arg::Tensor(t.name),
                schema::OptionalTensorArgument::AsNone(_) => Arg::None,
            },
            A::AsGraph(g) => self.subgraph(context, *g)?,
            A::AsOperator(op) => Arg::Operator(op_name(&op).to_string()),
            A::AsCustomObj(_) => Arg::Opaque(CUSTOM_OBJECT),
            A::AsComplex(_) => Arg::Opaque(COMPLEX_NUMBER),
            A::AsIntLists(_) => Arg::Opaque(INT_LISTS),
            A::AsStringToArgument(_) => Arg::Opaque(ARGUMENT_DICTIONARY),
        })
    }

    fn float(&self, context: &str, f: schema::Float) -> Result<f64> {
        match f {
            schema::Float::Number(x) => Ok(x),
            schema::Float::Text(s) => match s.as_str() {
                "Infinity" | "inf" => Ok(f64::INFINITY),
                "-Infinity" | "-inf" => Ok(f64::NEG_INFINITY),
                "NaN" | "nan" => Ok(f64::NAN),
                _ => Err(self.invalid(context, format!("float value {s:?} is not a number"))),
            },
        }
    }

    fn node(&self, within: &str, index: usize, n: schema::Node) -> Result<Node> {
        let name = n.name.unwrap_or_else(|| format!("node{index}"));
        let context = format!("{within}node {name} ({})", n.target);
        let target = op_name(&n.target).to_string();
        let inputs = n
            .inputs
            .into_iter()
            .map(|a| {
                Ok(NamedArg {
                    name: a.name,
                    arg: self.arg(&context, a.arg)?,
                    keyword: a.kind == Some(2),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let outputs = n
            .outputs
            .into_iter()
            .map(|o| match self.arg(&context, o)? {
                Arg::Tensor(t) => Ok(NodeOutput::Tensor(t)),
                Arg::Tensors(ts) => Ok(NodeOutput::Tensors(ts)),
                Arg::None => Ok(NodeOutput::None),
                Arg::SymInt(SymIntArg::Name(s)) => Ok(NodeOutput::SymInt(s)),
                Arg::SymBool(s) => Ok(NodeOutput::SymBool(s)),
                Arg::SymFloat(s) => Ok(NodeOutput::SymFloat(s)),
                other => Err(self.invalid(
                    &context,
                    format!("output of kind {} is not supported", other.kind_name()),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut metadata = n.metadata;
        Ok(Node {
            name,
            target,
            inputs,
            outputs,
            stack_trace: metadata.remove("stack_trace"),
        })
    }

    fn input(&self, index: usize, spec: schema::InputSpec) -> Result<GraphInput> {
        use schema::InputSpec as S;
        let context = format!("input {index} of the signature");
        let need = |v: Option<String>, what: &str| {
            v.ok_or_else(|| self.invalid(&context, format!("missing {what}")))
        };
        Ok(match spec {
            S::UserInput(s) => match self.arg(&context, s.arg)? {
                Arg::Tensor(name) => GraphInput {
                    name,
                    kind: InputKind::UserInput,
                },
                other => {
                    return Err(self.invalid(
                        &context,
                        format!(
                            "a user input of kind {} is not supported (only tensors; export with the value as a tensor)",
                            other.kind_name()
                        ),
                    ))
                }
            },
            S::Parameter(s) => GraphInput {
                name: s.arg.name,
                kind: InputKind::Parameter {
                    target: need(s.parameter_name, "parameter_name")?,
                },
            },
            S::Buffer(s) => GraphInput {
                name: s.arg.name,
                kind: InputKind::Buffer {
                    target: need(s.buffer_name, "buffer_name")?,
                    persistent: s.persistent.unwrap_or(true),
                },
            },
            S::TensorConstant(s) => GraphInput {
                name: s.arg.name,
                kind: InputKind::Constant {
                    target: need(s.tensor_constant_name, "tensor_constant_name")?,
                },
            },
        })
    }

    fn output(&self, index: usize, spec: schema::OutputSpec) -> Result<GraphOutput> {
        use schema::OutputSpec as S;
        let context = format!("output {index} of the signature");
        let need = |v: Option<String>, what: &str| {
            v.ok_or_else(|| self.invalid(&context, format!("missing {what}")))
        };
        let (arg, kind) = match spec {
            S::UserOutput(s) => {
                let value = match self.arg(&context, s.arg)? {
                    Arg::Tensor(t) => OutputValue::Tensor(t),
                    other => OutputValue::Constant(other),
                };
                return Ok(GraphOutput {
                    value,
                    kind: OutputKind::User,
                });
            }
            S::LossOutput(s) => (s.arg, OutputKind::Loss),
            S::BufferMutation(s) => (
                s.arg,
                OutputKind::BufferMutation {
                    target: need(s.buffer_name, "buffer_name")?,
                },
            ),
            S::ParameterMutation(s) => (
                s.arg,
                OutputKind::ParameterMutation {
                    target: need(s.parameter_name, "parameter_name")?,
                },
            ),
            S::UserInputMutation(s) => (
                s.arg,
                OutputKind::UserInputMutation {
                    target: need(s.user_input_name, "user_input_name")?,
                },
            ),
            S::GradientToParameter(s) => (
                s.arg,
                OutputKind::GradientToParameter {
                    target: need(s.parameter_name, "parameter_name")?,
                },
            ),
            S::GradientToUserInput(s) => (
                s.arg,
                OutputKind::GradientToUserInput {
                    target: need(s.user_input_name, "user_input_name")?,
                },
            ),
        };
        Ok(GraphOutput {
            value: OutputValue::Tensor(arg.name),
            kind,
        })
    }
}

fn n_or_zero(s: &Option<schema::SymInt>) -> i64 {
    match s {
        Some(schema::SymInt::AsInt(n)) => *n,
        _ => 0,
    }
}

fn sym_int_dim(s: &schema::SymInt) -> Dim {
    match s {
        schema::SymInt::AsInt(n) => Dim::Static(*n),
        schema::SymInt::AsExpr(e) => Dim::Symbolic {
            expr: e.expr_str.clone(),
            hint: e.hint.as_ref().and_then(|h| h.as_int),
        },
    }
}

fn sym_int_arg(s: schema::SymIntArgument) -> SymIntArg {
    match s {
        schema::SymIntArgument::AsName(n) => SymIntArg::Name(n),
        schema::SymIntArgument::AsInt(n) => SymIntArg::Int(n),
    }
}

/// An operator's name as tpuc writes it: without torch's `torch.ops.` prefix.
fn op_name(target: &str) -> &str {
    target.strip_prefix("torch.ops.").unwrap_or(target)
}
