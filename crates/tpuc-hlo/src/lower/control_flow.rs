//! torch's control-flow operators, whose arguments are graphs: `torch.cond` as a `case` of two
//! branches, `while_loop` as a `while`. Each subgraph is lowered as a region by the same driver
//! as the program (`driver::lower_subgraph`): closed, its inputs passed as the op's operands.

use tpuc_fx::{Arg, Node, Subgraph};

use super::ctx::{err, Ctx, OpResult};
use super::driver::lower_subgraph;
use super::registry::Registry;
use crate::ir::*;

/// The node's positional argument `i` (torch.export writes a higher-order operator's
/// arguments without names).
fn positional<'n>(n: &'n Node, i: usize, what: &str) -> OpResult<&'n Arg> {
    match n.inputs.get(i) {
        Some(a) => Ok(&a.arg),
        None => err(format!("{} has no argument {i} ({what})", n.target)),
    }
}

fn subgraph<'n>(n: &'n Node, i: usize, what: &str) -> OpResult<&'n Subgraph> {
    match positional(n, i, what)? {
        Arg::Graph(g) => Ok(g),
        other => err(format!(
            "its {what} (argument {i}) is a {}, not a graph",
            other.kind_name()
        )),
    }
}

/// The tensors of a tensor-list argument.
fn tensors(cx: &mut Ctx, n: &Node, i: usize, what: &str) -> OpResult<Vec<Value>> {
    match positional(n, i, what)? {
        Arg::Tensors(names) => names.iter().map(|t| cx.value(t)).collect(),
        Arg::None => Ok(Vec::new()),
        other => err(format!(
            "its {what} (argument {i}) is a {}, not a tensor list",
            other.kind_name()
        )),
    }
}

/// `torch.cond(pred, true_fn, false_fn, operands)`: both branches take the operands; the
/// predicate, a boolean scalar tensor (or a Python bool), picks one: `case` with index
/// `pred` as an integer over the branches [false, true].
fn cond(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (on_true, on_false) = (
        subgraph(n, 1, "true branch")?,
        subgraph(n, 2, "false branch")?,
    );
    let operands = tensors(cx, n, 3, "operands")?;
    let index = match positional(n, 0, "predicate")? {
        Arg::Tensor(t) => {
            let pred = cx.value(t)?;
            let ty = cx.b.ty(pred).clone();
            if ty.numel() != 1 {
                return err(format!("its predicate is a {ty}, not a single value"));
            }
            let one = cx.b.reshape(pred, &[])?;
            let truth = if ty.elem == DType::Bool {
                one
            } else {
                let zero = cx.b.splat(&TensorType::scalar(ty.elem), 0.0);
                cx.b.compare(CompareDir::Ne, one, zero)?
            };
            cx.b.convert(truth, DType::I32)
        }
        Arg::Bool(b) => cx.b.scalar(DType::I32, f64::from(u8::from(*b))),
        other => {
            return err(format!(
                "its predicate is a {}, not a boolean",
                other.kind_name()
            ))
        }
    };
    let types: Vec<TensorType> = operands.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let branches = vec![
        lower_subgraph(cx, on_false, &types)?,
        lower_subgraph(cx, on_true, &types)?,
    ];
    let (false_results, true_results) = (
        branches[0].func().result_types(),
        branches[1].func().result_types(),
    );
    if false_results != true_results {
        return err(format!(
            "its branches return different types: {} ({}) and {} ({})",
            on_true.name,
            listed(&true_results),
            on_false.name,
            listed(&false_results)
        ));
    }
    Ok(cx
        .b
        .case(index, &operands, branches)?
        .into_iter()
        .map(Some)
        .collect())
}

/// `while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)`: while `cond_fn` of the
/// carried values and the additional inputs is true, `body_fn` of them gives the next carried
/// values. The additional inputs ride along as carried values the body returns unchanged.
fn while_loop(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let (condition, body) = (subgraph(n, 0, "condition")?, subgraph(n, 1, "body")?);
    let carried = tensors(cx, n, 2, "carried values")?;
    let extra = tensors(cx, n, 3, "additional inputs")?;
    let all: Vec<Value> = carried.iter().chain(&extra).copied().collect();
    let types: Vec<TensorType> = all.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let cond = lower_subgraph(cx, condition, &types)?;
    let returns = cond.func().result_types();
    if returns != [TensorType::scalar(DType::Bool)] {
        return err(format!(
            "its condition {} returns {}, not one boolean",
            condition.name,
            listed(&returns)
        ));
    }
    let step = lower_subgraph(cx, body, &types)?;
    let next = step.func().result_types();
    if next.len() != carried.len() {
        return err(format!(
            "its body {} returns {} values for {} carried ones",
            body.name,
            next.len(),
            carried.len()
        ));
    }
    for (k, (new, old)) in next.iter().zip(&types).enumerate() {
        if new != old {
            return err(format!(
                "its body {} changes carried value {k} from {old} to {new}: a loop's values keep \
                 their shapes and dtypes",
                body.name
            ));
        }
    }
    // The body, returning the additional inputs after the carried values.
    let passing = cx.b.region(&types, |b, args| {
        let mut results = b.inline(step.func(), args)?;
        results.extend_from_slice(&args[carried.len()..]);
        Ok(results)
    })?;
    let results = cx.b.op(
        OpKind::While {
            cond,
            body: passing,
        },
        &all,
    )?;
    Ok(results[..carried.len()].iter().copied().map(Some).collect())
}

fn listed(types: &[TensorType]) -> String {
    let each: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("({})", each.join(", "))
}

pub fn register(r: &mut Registry) {
    r.add(&["higher_order.cond"], cond);
    r.add(&["higher_order.while_loop"], while_loop);
}
