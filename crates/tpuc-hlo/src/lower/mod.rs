//! Lowering of an ATen-level FX graph into the StableHLO IR: this driver walks the graph in
//! order and hands each node to its lowering in the registry (`registry.rs`, keyed by the full
//! ATen overload name), checking every result against the type torch recorded. Each op family
//! has its own file; `ctx.rs` reads a node's arguments; `semantics.rs` holds what torch's
//! semantics the families share; `promote.rs` is torch's type promotion.
//!
//! The lowering produces the module as the graph says it; the passes (`crate::passes`) clean it
//! up afterwards.

mod bessel;
mod collectives;
mod complex;
mod conv;
mod ctx;
mod distance;
mod elementwise;
mod fft;
mod in_place;
mod indexing;
mod linalg;
mod linear;
mod norm;
mod padding;
mod polynomials;
mod pool;
mod promote;
mod quant;
mod random;
mod reduction;
mod registry;
mod resample;
mod semantics;
mod sharding;
mod sort;
mod special;
#[cfg(test)]
mod testing;
mod view;

use std::collections::HashMap;
use std::sync::Arc;

use tpuc_fx::{Arg, DType, Dim, GraphInput, InputKind, Node, OutputValue, Program, SourceLoc};

use crate::ir::*;
use crate::signature::{ArgRole, ResultRole, Signature};

pub use collectives::ProcessGroups;
pub use ctx::{err, meta_type, Ctx, OpError, OpResult, Operand};
pub use promote::{promote_types, result_type, Participant};
use registry::is_pointwise;
pub use registry::{
    collective_ops, core_aten_coverage, is_collective, is_supported, supported_ops, Coverage,
    LowerFn, Registry,
};
pub use semantics::{broadcast_shapes, norm_dim};
// The op families share these (`use super::*`).
use semantics::*;

use ctx::output_slots;
use registry::{lowering, Lowering, Variant};

/// How weights (parameters, buffers, constants) reach the compiled module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightsMode {
    /// As leading function arguments, in signature order: the runtime passes them in.
    #[default]
    Args,
    /// As inline `dense` constants: a self-contained module.
    Inline,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LowerOptions {
    pub weights: WeightsMode,
    /// Precision of f32 matmuls and convolutions. HIGHEST matches torch on every backend
    /// (XLA's default lets GPUs use TF32).
    pub precision: Precision,
    /// The mesh the program will be partitioned over, which sharding constraints in the graph
    /// refer to; without one they change nothing.
    pub mesh: Option<Mesh>,
    /// The process groups of a program that runs one rank per device, by the names its
    /// collectives give them; `None` refuses collectives.
    pub process_groups: Option<ProcessGroups>,
    /// The program was specialised for its sizes' buckets: its padded dimensions, whose true
    /// lengths the module takes as arguments (`ArgRole::Size`) and makes exact (`padding.rs`).
    pub padding: Option<Arc<tpuc_fx::buckets::Padding>>,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            weights: WeightsMode::Args,
            precision: Precision::Highest,
            mesh: None,
            process_groups: None,
            padding: None,
        }
    }
}

/// A lowered program: the module as the graph says it (before any pass) and what its
/// arguments and results stand for.
#[derive(Clone, Debug)]
pub struct Lowered {
    pub module: Module,
    pub signature: Signature,
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
    /// A node padding would change and tpuc cannot make exact: the program is compiled per
    /// size instead.
    #[error("node {node} ({target}){} cannot be padded to a bucket: {message}", source_suffix(.location))]
    NotPaddable {
        node: String,
        target: String,
        location: Option<SourceLoc>,
        message: String,
    },
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

/// The first complex tensor a node reads or produces, if any, with its type.
fn complex_tensor<'n>(
    g: &'n tpuc_fx::Graph,
    n: &'n Node,
    recorded: &[Option<TensorType>],
) -> Option<(&'n str, DType)> {
    n.inputs
        .iter()
        .flat_map(|a| a.arg.tensor_refs())
        .filter_map(|t| {
            let elem = g.tensor(t)?.dtype;
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

/// A node that computes only sizes (`aten.sym_size.int`, `operator.mul` of sizes, ...) whose
/// values are all known: nothing to compute at run time; ops read them as numbers.
fn computes_static_sizes(g: &tpuc_fx::Graph, n: &Node) -> bool {
    !n.outputs.is_empty()
        && n.outputs.iter().all(|o| {
            matches!(o, tpuc_fx::NodeOutput::SymInt(name)
                if matches!(g.sym_ints.get(name), Some(Dim::Static(_))))
        })
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
        match tpuc_fx::symbolic::value_decided(program) {
            Ok(decided) if !decided.is_empty() => {
                return Err(LowerError::Program(
                    tpuc_fx::symbolic::describe_value_decided(&decided),
                ))
            }
            _ => {}
        }
        return Err(LowerError::Symbolic(tpuc_fx::symbolic::describe_symbols(
            program,
        )));
    }
    let mut unsupported: Vec<Unsupported> = g
        .nodes
        .iter()
        // Collectives lower (or say why not: outside a rank program) node by node.
        .filter(|n| {
            !is_supported(&n.target) && !is_collective(&n.target) && !computes_static_sizes(g, n)
        })
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
        sizes: HashMap::new(),
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
    // A padded program's true sizes, after the inputs (`ArgRole::Size`).
    for symbol in opts.padding.iter().flat_map(|p| &p.symbols) {
        args.push(ArgRole::Size(symbol.clone()));
        let v =
            cx.b.arg(TensorType::new(vec![], DType::I64), ArgAttrs::default());
        cx.sizes.insert(symbol.clone(), v);
    }
    let mut spread = padding::Spread::default();
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
            in_place::check_in_place(g, n, arg).map_err(node_err)?;
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
                    n.target, elem
                )));
            }
        }
        let rule = match &opts.padding {
            None => padding::Rule::Plain,
            Some(p) => {
                padding::rule(g, p, &mut spread, is_pointwise(&n.target), n).map_err(|why| {
                    LowerError::NotPaddable {
                        node: n.name.clone(),
                        target: n.target.clone(),
                        location: n.source(),
                        message: why.0,
                    }
                })?
            }
        };
        let outs = match empty_outputs(&mut cx.b, &recorded) {
            // Every output is empty: nothing to compute, whatever the op.
            Some(empty) => empty,
            None => {
                let lower_fn = |cx: &mut Ctx, n: &Node| match &rule {
                    padding::Rule::Plain => lower_fn(cx, n),
                    padding::Rule::Masked(masks) => cx.lower_masked(n, masks, lower_fn),
                    padding::Rule::Concat(dim) => cx.concat_padded(n, *dim),
                    padding::Rule::Identity => Ok(vec![Some(cx.tensor(n, "self")?)]),
                };
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
    let mut roles = Vec::new();
    for (i, out) in g.outputs.iter().enumerate() {
        match &out.value {
            OutputValue::Tensor(t) if spread.holds(t) => {
                return Err(LowerError::NotPaddable {
                    node: t.clone(),
                    target: "output".into(),
                    location: None,
                    message: format!(
                        "graph output {i} holds a padded dimension merged with dimensions before it"
                    ),
                })
            }
            OutputValue::Tensor(t) => {
                let v = cx
                    .value(t)
                    .map_err(|e| LowerError::Program(format!("graph output {i}: {}", e.0)))?;
                results.push(v);
                roles.push(ResultRole {
                    name: t.clone(),
                    kind: out.kind.clone(),
                });
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
    Ok(Lowered {
        module: Module::new(main),
        signature: Signature {
            args,
            results: roles,
            prepared: None,
        },
    })
}
