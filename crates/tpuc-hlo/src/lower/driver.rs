//! The lowering driver: a program's inputs bound to arguments, each node handed to its
//! lowering in graph order and its results checked against the types torch recorded, the
//! outputs gathered with what each stands for.

use std::sync::Arc;

use tpuc_fx::{Arg, DType, Dim, GraphInput, InputKind, Node, OutputValue, Program};

use super::composites::{composite_of, lower_as_composite};
use super::ctx::{meta_type, output_slots, Ctx, OpError, OpResult};
use super::kernels::{has_kernel, kernel_lowering, user_kernels, UserKernel};
use super::registry::{is_collective, is_pointwise, is_supported, lowering, Lowering, Variant};
use super::{in_place, padding, LowerError, LowerOptions, Lowered, Unsupported, WeightsMode};
use crate::ir::*;
use crate::signature::{ArgRole, ResultRole, Signature};

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
    let g = program.graph();
    refuse_dynamic_sizes(program)?;
    let kernels = user_kernels(program);
    refuse_unsupported(g, &kernels)?;
    let mut cx = Ctx::new(Builder::new(), opts, g);
    cx.kernels = kernels;
    let mut args = bind_inputs(&mut cx, program)?;
    args.extend(bind_sizes(&mut cx));
    let mut spread = padding::Spread::default();
    for n in g.nodes.iter().filter(|n| !computes_static_sizes(g, n)) {
        lower_node(&mut cx, n, &mut spread)?;
    }
    if cx.rng_state.is_some() {
        args.push(ArgRole::RngSeed);
    }
    let (results, roles) = gather_outputs(&cx, &spread)?;
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

/// The region of a subgraph a node runs: its inputs the region's arguments, of `arg_types`
/// (what the node passes it: each must be the type torch recorded for the input), its nodes
/// lowered as the program's are, its outputs the region's results. An error inside names the
/// subgraph and its node.
pub(super) fn lower_subgraph(
    cx: &mut Ctx<'_>,
    sub: &tpuc_fx::Subgraph,
    arg_types: &[TensorType],
) -> OpResult<Region> {
    lower_graph(cx, sub, arg_types, false)
}

/// The function of a subgraph a node calls ([`lower_subgraph`]'s region), which may draw random
/// numbers: then it takes the generator's state after its arguments and returns the state
/// after its draws after its results.
pub(super) fn lower_function(
    cx: &mut Ctx<'_>,
    sub: &tpuc_fx::Subgraph,
    arg_types: &[TensorType],
) -> OpResult<Region> {
    lower_graph(cx, sub, arg_types, true)
}

fn lower_graph(
    cx: &mut Ctx<'_>,
    sub: &tpuc_fx::Subgraph,
    arg_types: &[TensorType],
    may_draw: bool,
) -> OpResult<Region> {
    let g = &sub.graph;
    if g.inputs.len() != arg_types.len() {
        return Err(OpError(format!(
            "subgraph {} takes {} inputs, the node passes {}",
            sub.name,
            g.inputs.len(),
            arg_types.len()
        )));
    }
    // Padded to buckets: the subgraph's tensors padded as its own sizes say.
    let padded;
    let opts = match &cx.opts.padding {
        Some(p) => {
            padded = LowerOptions {
                padding: Some(Arc::new(p.subgraph(&sub.name))),
                ..cx.opts.clone()
            };
            &padded
        }
        None => cx.opts,
    };
    let mut inner = Ctx::new(cx.b.nested(), opts, g);
    inner.functions = cx.functions.clone();
    inner.kernels = cx.kernels.clone();
    let within = |e: LowerError| OpError(format!("subgraph {}: {e}", sub.name));
    for (input, ty) in g.inputs.iter().zip(arg_types) {
        let recorded = g
            .tensor(&input.name)
            .ok_or_else(|| {
                OpError(format!(
                    "subgraph {}: input {} has no type",
                    sub.name, input.name
                ))
            })
            .and_then(|m| meta_type(m).map_err(OpError))?;
        if recorded != *ty {
            return Err(OpError(format!(
                "subgraph {}: input {} is a {recorded}, the node passes a {ty}",
                sub.name, input.name
            )));
        }
        let v = inner.b.arg(ty.clone(), ArgAttrs::default());
        inner.values.insert(input.name.as_str(), Some(v));
    }
    // The program's true sizes, after the inputs (`Ctx::size_operands`).
    bind_sizes(&mut inner);
    let mut spread = padding::Spread::default();
    for n in g.nodes.iter().filter(|n| !computes_static_sizes(g, n)) {
        lower_node(&mut inner, n, &mut spread).map_err(within)?;
    }
    let (mut results, _) = gather_outputs(&inner, &spread).map_err(within)?;
    if let Some(state) = inner.rng_state {
        if !may_draw {
            return Err(OpError(format!(
                "subgraph {}: random numbers drawn inside a branch or a loop are not supported",
                sub.name
            )));
        }
        // The state argument was made at the first draw, after the inputs.
        results.push(state);
    }
    Ok(Region::new(inner.b.finish(results, Vec::new())))
}

/// A program with symbolic sizes is specialised before lowering; one whose sizes tensor values
/// decide cannot be.
fn refuse_dynamic_sizes(program: &Program) -> Result<(), LowerError> {
    if !tpuc_fx::symbolic::is_symbolic(program) {
        return Ok(());
    }
    match tpuc_fx::symbolic::value_decided(program) {
        Ok(decided) if !decided.is_empty() => Err(LowerError::ValueDecided(
            tpuc_fx::symbolic::describe_value_decided(&decided),
        )),
        _ => Err(LowerError::Symbolic(tpuc_fx::symbolic::describe_symbols(
            program,
        ))),
    }
}

/// Every node without a lowering, in the graph and the subgraphs its nodes run, reported at
/// once.
fn refuse_unsupported(g: &tpuc_fx::Graph, kernels: &[UserKernel]) -> Result<(), LowerError> {
    let mut unsupported = Vec::new();
    find_unsupported(g, kernels, &mut unsupported);
    if unsupported.is_empty() {
        return Ok(());
    }
    unsupported.sort_by(|a, b| a.target.cmp(&b.target).then(a.node.cmp(&b.node)));
    Err(LowerError::Unsupported(unsupported))
}

fn find_unsupported(g: &tpuc_fx::Graph, kernels: &[UserKernel], found: &mut Vec<Unsupported>) {
    for n in &g.nodes {
        // Collectives lower (or say why not: outside a rank program) node by node.
        if !is_supported(&n.target)
            && !is_collective(&n.target)
            && !has_kernel(kernels, &n.target)
            && !computes_static_sizes(g, n)
        {
            // An operator that runs another (auto_functionalized of a custom op) names it.
            let runs = n.inputs.iter().find_map(|a| match &a.arg {
                Arg::Operator(op) => Some(op),
                _ => None,
            });
            found.push(Unsupported {
                target: match runs {
                    Some(op) => format!("{} of {op}", n.target),
                    None => n.target.clone(),
                },
                node: n.name.clone(),
                source: n.source(),
            });
        }
        for a in &n.inputs {
            if let Arg::Graph(sub) = &a.arg {
                find_unsupported(&sub.graph, kernels, found);
            }
        }
    }
}

/// The module's arguments for the graph's inputs: weights first (as arguments or, inline,
/// constants), then user inputs, each in signature order; what each argument stands for.
fn bind_inputs<'p>(cx: &mut Ctx<'p>, program: &'p Program) -> Result<Vec<ArgRole>, LowerError> {
    let opts = cx.opts;
    let g = program.graph();
    let mut args = Vec::new();
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
                cx.b.set_loc(Arc::new(Loc {
                    node: input.name.clone(),
                    file: None,
                }));
                cx.b.constant(weight_literal(ty, w.bytes.as_slice()))
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
    Ok(args)
}

/// A weight's bytes as a constant of type `ty` (a splat where every element is the same).
fn weight_literal(ty: TensorType, bytes: &[u8]) -> Literal {
    let esize = ty.elem.byte_size();
    let splat = !bytes.is_empty() && bytes.chunks(esize).all(|c| c == &bytes[..esize]);
    Literal {
        ty,
        bytes: if splat {
            bytes[..esize].into()
        } else {
            bytes.into()
        },
        splat,
    }
}

/// A padded program's true sizes, after the inputs (`ArgRole::Size`).
fn bind_sizes(cx: &mut Ctx<'_>) -> Vec<ArgRole> {
    let opts = cx.opts;
    let mut args = Vec::new();
    for symbol in opts.padding.iter().flat_map(|p| &p.symbols) {
        args.push(ArgRole::Size(symbol.clone()));
        let v =
            cx.b.arg(TensorType::new(vec![], DType::I64), ArgAttrs::default());
        cx.sizes.insert(symbol.clone(), v);
    }
    args
}

/// Lowers one node: its lowering (or, with every output empty, empty constants) run under the
/// checks that concern it, and its results bound to its outputs.
fn lower_node<'p>(
    cx: &mut Ctx<'p>,
    n: &'p Node,
    spread: &mut padding::Spread,
) -> Result<(), LowerError> {
    let g = cx.graph;
    cx.b.set_loc(node_loc(n));
    let node_err = |message: String| node_error(n, message);
    let Lowering {
        f: lower_fn,
        variant,
        handles_complex,
    } = lowering(&n.target)
        .or_else(|| has_kernel(&cx.kernels, &n.target).then(kernel_lowering))
        .ok_or_else(|| node_err("internal error: no lowering".into()))?;
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
    let rule = match &cx.opts.padding {
        None => padding::Rule::Plain,
        Some(p) => padding::rule(g, p, spread, is_pointwise(&n.target), n).map_err(|why| {
            LowerError::NotPaddable {
                node: n.name.clone(),
                target: n.target.clone(),
                location: n.source(),
                message: why.0,
            }
        })?,
    };
    let outs = match empty_outputs(&mut cx.b, &recorded) {
        // Every output is empty: nothing to compute, whatever the op.
        Some(empty) => empty,
        None => run_lowering(cx, n, lower_fn, &rule)?,
    };
    if let Some(arg) = mutated {
        // Later nodes that read the mutated tensor read the result.
        if let (Some(Arg::Tensor(target)), Some(&Some(v))) = (n.arg(arg), outs.first()) {
            cx.rebind(target, v);
        }
    }
    bind_outputs(cx, n, &recorded, outs)
}

fn node_error(n: &Node, message: String) -> LowerError {
    LowerError::Node {
        node: n.name.clone(),
        target: n.target.clone(),
        location: n.source(),
        message,
    }
}

/// Runs a node's lowering as the padding rule says. A lowering that panics is a bug in tpuc; it
/// must not take the caller (a Python process, say) down with it: it becomes an error naming
/// the node.
fn run_lowering<'p>(
    cx: &mut Ctx<'p>,
    n: &'p Node,
    lower_fn: &super::LowerFn,
    rule: &padding::Rule,
) -> Result<Vec<Option<Value>>, LowerError> {
    let lower_fn = |cx: &mut Ctx<'p>, n: &'p Node| match rule {
        // With the fusion stage on, a whole pattern becomes a composite (not under padding:
        // its rules read the program's true sizes).
        padding::Rule::Plain if cx.opts.fusion.patterns() && cx.opts.padding.is_none() => {
            match composite_of(cx, n)? {
                Some((name, attributes)) => lower_as_composite(cx, n, lower_fn, name, attributes),
                None => lower_fn(cx, n),
            }
        }
        padding::Rule::Plain => lower_fn(cx, n),
        padding::Rule::Masked(masks) => cx.lower_masked(n, masks, lower_fn),
        padding::Rule::Concat(dim) => cx.concat_padded(n, *dim),
        padding::Rule::Identity => Ok(vec![Some(cx.tensor(n, "self")?)]),
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lower_fn(cx, n)))
        .map_err(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            node_error(n, format!("internal error in the lowering: {what}"))
        })?
        .map_err(|e| node_error(n, e.0))
}

/// Binds a lowering's results to the node's outputs: one value per output position (None
/// where the graph does not use the output), each with exactly the type torch recorded: a
/// mismatch would mean silently wrong output, so it is an error.
fn bind_outputs<'p>(
    cx: &mut Ctx<'p>,
    n: &'p Node,
    recorded: &[Option<TensorType>],
    outs: Vec<Option<Value>>,
) -> Result<(), LowerError> {
    let slots = output_slots(n);
    if outs.len() != slots.len() {
        return Err(node_error(
            n,
            format!(
                "internal error: the lowering produced {} outputs for the node's {}",
                outs.len(),
                slots.len()
            ),
        ));
    }
    for ((name, v), expected) in slots.into_iter().zip(outs).zip(recorded) {
        let Some(name) = name else {
            continue;
        };
        if let Some(v) = v {
            let expected = expected
                .as_ref()
                .ok_or_else(|| node_error(n, format!("output {name} has no recorded type")))?;
            if cx.b.ty(v) != expected {
                return Err(node_error(
                    n,
                    format!(
                        "internal error: lowered output {name} has type {} but torch recorded {expected}",
                        cx.b.ty(v)
                    ),
                ));
            }
        }
        cx.values.insert(name, v);
    }
    Ok(())
}

/// The module's results, the graph's outputs, with what each stands for.
fn gather_outputs(
    cx: &Ctx<'_>,
    spread: &padding::Spread,
) -> Result<(Vec<Value>, Vec<ResultRole>), LowerError> {
    let mut results = Vec::new();
    let mut roles = Vec::new();
    for (i, out) in cx.graph.outputs.iter().enumerate() {
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
    Ok((results, roles))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{t, TestGraph};
    use tpuc_fx::DType;

    /// A lowering whose result is not of the type torch recorded is an error naming the node,
    /// never a module computing something else.
    #[test]
    fn an_output_of_another_type_than_torch_recorded_is_an_error() {
        for (dtype, sizes) in [(DType::F32, &[4][..]), (DType::F64, &[3][..])] {
            let mut g = TestGraph::default();
            let x = g.input("x", DType::F32, &[3]);
            let y = g.node1("aten.relu.default", vec![("self", t(&x))], dtype, sizes);
            let e = g.lower(&[&y]).unwrap_err().to_string();
            assert!(e.contains("node0") && e.contains("torch recorded"), "{e}");
        }
    }
}
