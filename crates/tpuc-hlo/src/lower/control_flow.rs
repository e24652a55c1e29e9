//! torch's control-flow operators, whose arguments are graphs: `torch.cond` as a `case` of two
//! branches, `while_loop` as a `while`, `scan` and `map` as a `while` over the leading
//! dimension of their inputs, `associative_scan` as a `while` combining row after row,
//! `invoke_subgraph` as calls of one private function. Each
//! subgraph is lowered as a region by the same driver as the program
//! (`driver::lower_subgraph`): closed, its inputs passed as the op's operands.

use tpuc_fx::{Arg, Node, Subgraph};

use super::ctx::{err, Ctx, OpResult};
use super::driver::{lower_function, lower_subgraph};
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
            "its {what} (argument {i}) is of kind {}, not a graph",
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
            "its {what} (argument {i}) is of kind {}, not a tensor list",
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
                "its predicate is of kind {}, not a boolean",
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
    let passed = [operands, cx.size_operands()].concat();
    Ok(cx
        .b
        .case(index, &passed, branches)?
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
    let given: Vec<Value> = carried.iter().chain(&extra).copied().collect();
    let types: Vec<TensorType> = given.iter().map(|&v| cx.b.ty(v).clone()).collect();
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
    // The body, returning the additional inputs (and a padded program's true sizes, which
    // every region takes after its inputs) after the carried values.
    let all = [given, cx.size_operands()].concat();
    let all_types: Vec<TensorType> = all.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let passing = cx.b.region(&all_types, |b, args| {
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

/// `scan(combine_fn, init, xs, additional_inputs)`: along the leading dimension of the inputs
/// `xs`, `combine_fn(carries, x slices, additional)` gives the next carries and one slice of
/// each output; the results are the last carries and the outputs stacked. (torch.export writes
/// a reverse scan as flips around a forward one.)
fn scan(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let combine = subgraph(n, 0, "combine function")?;
    let init = tensors(cx, n, 1, "initial carries")?;
    let xs = tensors(cx, n, 2, "scanned inputs")?;
    let extra = tensors(cx, n, 3, "additional inputs")?;
    let end = loop_end(cx, n, 2)?;
    along_leading_dimension(cx, combine, &init, &xs, &extra, end)
}

/// `map(f, xs, additional_inputs)`: `f` of each slice of the inputs along their leading
/// dimension (and the additional inputs), the results stacked: a scan without carries.
fn map(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let body = subgraph(n, 0, "body")?;
    let xs = tensors(cx, n, 1, "mapped inputs")?;
    let extra = tensors(cx, n, 2, "additional inputs")?;
    let end = loop_end(cx, n, 1)?;
    along_leading_dimension(cx, body, &[], &xs, &extra, end)
}

/// Where a loop over the leading dimension of the tensors of argument `i` stops when that
/// dimension is padded to a bucket: its true length (None when not padded).
fn loop_end(cx: &mut Ctx, n: &Node, i: usize) -> OpResult<Option<Value>> {
    match positional(n, i, "inputs")? {
        Arg::Tensors(names) => match names.first() {
            Some(first) => cx.true_leading_length(first),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// `step(carries, slice i of each of xs, extra)` for i along the inputs' leading dimension (up
/// to `end` when given: a padded dimension's true length), as one `while`: the last carries,
/// then each of the step's other results stacked.
fn along_leading_dimension(
    cx: &mut Ctx,
    step: &Subgraph,
    init: &[Value],
    xs: &[Value],
    extra: &[Value],
    end: Option<Value>,
) -> OpResult<Vec<Option<Value>>> {
    let (length, slice_types) = leading_rows(cx, xs, "it has no input to go along", "go along")?;
    let carried_types: Vec<TensorType> = init.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let extra_types: Vec<TensorType> = extra.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let arg_types: Vec<TensorType> = [&carried_types[..], &slice_types, &extra_types].concat();
    let body = lower_subgraph(cx, step, &arg_types)?;
    let results = body.func().result_types();
    if results.len() < init.len() || results[..init.len()] != carried_types[..] {
        return err(format!(
            "its step {} returns {}, which must begin with the carries {}: a loop's values keep \
             their shapes and dtypes",
            step.name,
            listed(&results),
            listed(&carried_types)
        ));
    }
    // Each output stacked: zeros to write the slices into.
    let stacked: Vec<Value> = results[init.len()..]
        .iter()
        .map(|t| {
            let whole = t.with_shape([&[length][..], &t.shape].concat());
            cx.b.splat(&whole, 0.0)
        })
        .collect();
    let (c, s, x) = (init.len(), stacked.len(), xs.len());
    let values: Vec<Value> = [init, &stacked, xs, extra, &cx.size_operands()].concat();
    let end = match end {
        Some(end) => end,
        None => cx.b.scalar(DType::I64, length as f64),
    };
    let results = cx.counted_loop(0, end, &values, |cx, i, v| {
        let b = &mut cx.b;
        let (carries, outputs) = (&v[..c], &v[c..c + s]);
        let (inputs, extra) = (&v[c + s..c + s + x], &v[c + s + x..]);
        let mut args = carries.to_vec();
        for &input in inputs {
            args.push(row(b, input, i)?);
        }
        args.extend_from_slice(extra);
        let results = b.inline(body.func(), &args)?;
        let mut next = results[..c].to_vec();
        for (&whole, &slice) in outputs.iter().zip(&results[c..]) {
            next.push(with_row(b, whole, slice, i)?);
        }
        next.extend_from_slice(&v[c + s..]);
        Ok(next)
    })?;
    Ok(results[..c + s].iter().copied().map(Some).collect())
}

/// `associative_scan(combine_fn, xs, additional_inputs)`: the inclusive scan of the inputs
/// along their leading dimension under the associative `combine_fn(left slices, right slices,
/// additional)`: row i of each result combines rows 0..=i. As one `while` from row 1 on, each
/// step combining the previous result row with the input row it overwrites (the results start
/// as the inputs). Sequential: the combine function is recorded for single rows, so the
/// logarithmic-depth form (the combine over whole shifted tensors) is not available.
fn associative_scan(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let combine = subgraph(n, 0, "combine function")?;
    let xs = tensors(cx, n, 1, "scanned inputs")?;
    let extra = tensors(cx, n, 2, "additional inputs")?;
    let (length, row_types) = leading_rows(cx, &xs, "it has no input to scan", "scan along")?;
    let extra_types: Vec<TensorType> = extra.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let arg_types = [&row_types[..], &row_types, &extra_types].concat();
    let step = lower_subgraph(cx, combine, &arg_types)?;
    let returns = step.func().result_types();
    if returns != row_types {
        return err(format!(
            "its combine function {} returns {} for rows {}",
            combine.name,
            listed(&returns),
            listed(&row_types)
        ));
    }
    let x = xs.len();
    let values: Vec<Value> = [&xs[..], &extra, &cx.size_operands()].concat();
    let end = match loop_end(cx, n, 1)? {
        Some(end) => end,
        None => cx.b.scalar(DType::I64, length as f64),
    };
    let results = cx.counted_loop(1, end, &values, |cx, i, v| {
        let b = &mut cx.b;
        let one = b.scalar(DType::I64, 1.0);
        let before = b.binary(BinaryOp::Sub, i, one)?;
        let mut args = Vec::with_capacity(2 * x + v.len() - x);
        for &at in &[before, i] {
            for &whole in &v[..x] {
                args.push(row(b, whole, at)?);
            }
        }
        args.extend_from_slice(&v[x..]);
        let combined = b.inline(step.func(), &args)?;
        let mut next = Vec::with_capacity(v.len());
        for (&whole, &r) in v[..x].iter().zip(&combined) {
            next.push(with_row(b, whole, r, i)?);
        }
        next.extend_from_slice(&v[x..]);
        Ok(next)
    })?;
    Ok(results[..x].iter().copied().map(Some).collect())
}

/// `invoke_subgraph(subgraph, identifier, *operands)`: a block the program repeats, captured
/// once (`torch.compiler.nested_compile_region`): lowered once per identifier and operand
/// types, as a function every site calls, so that a model repeating a block compiles one body.
fn invoke_subgraph(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let body = subgraph(n, 0, "block")?;
    let identifier = match positional(n, 1, "identifier")? {
        Arg::Str(s) => s.clone(),
        other => {
            return err(format!(
                "its identifier (argument 1) is of kind {}, not a string",
                other.kind_name()
            ))
        }
    };
    let operands = tensors_from(cx, n, 2)?;
    let types: Vec<TensorType> = operands.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let key = (identifier, types);
    let known = cx.functions.borrow().get(&key).cloned();
    let callee = match known {
        Some(callee) => callee,
        None => {
            let callee = lower_function(cx, body, &key.1)?;
            cx.functions
                .borrow_mut()
                .insert(key.clone(), callee.clone());
            callee
        }
    };
    run_body(cx, &callee, operands, Some(&key.0))
}

/// The node's tensors from argument `from` on (each a tensor or a list of them).
fn tensors_from(cx: &mut Ctx, n: &Node, from: usize) -> OpResult<Vec<Value>> {
    let mut operands = Vec::new();
    for (i, input) in n.inputs.iter().enumerate().skip(from) {
        match &input.arg {
            Arg::Tensor(t) => operands.push(cx.value(t)?),
            Arg::Tensors(ts) => {
                for t in ts {
                    operands.push(cx.value(t)?);
                }
            }
            other => {
                return err(format!(
                    "its argument {i} is of kind {}: only tensors are passed to its graph",
                    other.kind_name()
                ))
            }
        }
    }
    Ok(operands)
}

/// `callee` (a [`lower_function`] of a node's graph) run over `operands` and the program's
/// sizes: called as `symbol`, or inlined without one. A graph drawing random numbers (dropout)
/// takes the generator's state and returns it.
fn run_body(
    cx: &mut Ctx,
    callee: &Region,
    mut operands: Vec<Value>,
    symbol: Option<&str>,
) -> OpResult<Vec<Option<Value>>> {
    operands.extend(cx.size_operands());
    let draws = callee.func().args().len() > operands.len();
    if draws {
        let state = cx.rng_state()?;
        operands.push(state);
    }
    let mut results = match symbol {
        Some(symbol) => cx.b.call(symbol, callee.clone(), &operands)?,
        None => cx.b.inline(callee.func(), &operands)?,
    };
    if draws {
        cx.rng_state = results.pop();
    }
    Ok(results.into_iter().map(Some).collect())
}

/// The length of `xs`' common leading dimension and the type of one row of each; `none` the
/// error without inputs, `along` what the dimension is for (in the error without one).
fn leading_rows(
    cx: &Ctx,
    xs: &[Value],
    none: &str,
    along: &str,
) -> OpResult<(i64, Vec<TensorType>)> {
    let Some(&first) = xs.first() else {
        return err(none);
    };
    let Some(&length) = cx.b.shape(first).first() else {
        return err(format!(
            "its input is a {}, which has no dimension to {along}",
            cx.b.ty(first)
        ));
    };
    let mut rows = Vec::with_capacity(xs.len());
    for &x in xs {
        let ty = cx.b.ty(x).clone();
        if ty.shape.first() != Some(&length) {
            return err(format!(
                "its inputs differ in length: {} and {ty}",
                cx.b.ty(first)
            ));
        }
        rows.push(ty.with_shape(ty.shape[1..].to_vec()));
    }
    Ok((length, rows))
}

/// Row `i` (an i64 scalar) of `whole` along its leading dimension.
fn row(b: &mut Builder, whole: Value, i: Value) -> OpResult<Value> {
    let shape = b.shape(whole).to_vec();
    let zero = b.scalar(DType::I64, 0.0);
    let mut starts = vec![zero; shape.len()];
    starts[0] = i;
    let mut sizes = shape.clone();
    sizes[0] = 1;
    let part = b.dynamic_slice(whole, &starts, &sizes)?;
    Ok(b.reshape(part, &shape[1..])?)
}

/// `whole` with row `i` (an i64 scalar) along its leading dimension replaced by `value`.
fn with_row(b: &mut Builder, whole: Value, value: Value, i: Value) -> OpResult<Value> {
    let shape = b.shape(whole).to_vec();
    let zero = b.scalar(DType::I64, 0.0);
    let mut starts = vec![zero; shape.len()];
    starts[0] = i;
    let one_row = b.reshape(value, &[&[1][..], &shape[1..]].concat())?;
    Ok(b.dynamic_update_slice(whole, one_row, &starts)?)
}

fn listed(types: &[TensorType]) -> String {
    let each: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("({})", each.join(", "))
}

/// A region of the program run under another grad mode (`torch.no_grad()` in a model's
/// forward, as Hugging Face's rotary embeddings do), as `torch.export` keeps it:
/// `wrap_with_set_grad_enabled(enabled, body, *args)`. The grad mode changes nothing the
/// program computes: the body, inlined.
fn with_grad_mode(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    inline_body(cx, n, 1)
}

/// A region under `torch.autocast`, as `torch.export` keeps it: `wrap_with_autocast(device,
/// dtype, enabled, cache_enabled, body, *args)`. A disabled one (a model turning autocast off
/// around a numerically sensitive part) is its body; an enabled one would change the body's
/// dtypes, which the exported graph does not say.
fn with_autocast(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    match positional(n, 2, "enabled")? {
        Arg::Bool(false) => inline_body(cx, n, 4),
        Arg::Bool(true) => err(
            "an enabled torch.autocast region is not supported in an exported program: its \
             dtypes are decided when it runs; export the model with autocast's dtype applied \
             (model.to(dtype)), or call ep.run_decompositions() first",
        ),
        other => err(format!(
            "its `enabled` (argument 2) is of kind {}, not a boolean",
            other.kind_name()
        )),
    }
}

/// The graph of argument `at` inlined over the node's tensors after it, its results the node's.
fn inline_body(cx: &mut Ctx, n: &Node, at: usize) -> OpResult<Vec<Option<Value>>> {
    let body = subgraph(n, at, "body")?;
    let operands = tensors_from(cx, n, at + 1)?;
    let types: Vec<TensorType> = operands.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let callee = lower_function(cx, body, &types)?;
    run_body(cx, &callee, operands, None)
}

pub fn register(r: &mut Registry) {
    r.add(&["higher_order.wrap_with_set_grad_enabled"], with_grad_mode);
    r.add(&["higher_order.wrap_with_autocast"], with_autocast);
    r.add(&["higher_order.cond"], cond);
    r.add(&["higher_order.while_loop"], while_loop);
    r.add(&["higher_order.scan"], scan);
    r.add(&["higher_order.map_impl"], map);
    r.add(&["higher_order.associative_scan"], associative_scan);
    r.add(&["higher_order.invoke_subgraph"], invoke_subgraph);
}
