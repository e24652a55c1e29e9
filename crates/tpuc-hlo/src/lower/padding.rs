//! Lowering a program padded to buckets (`tpuc_fx::buckets`): the program is specialised for
//! its sizes' buckets, each padded dimension holds its true data first and padding after, and
//! the module takes each symbol's true value as an argument. Every node that touches a padded
//! dimension is checked here against what padding would change:
//!
//! - ops that keep each element's coordinates along padded dimensions (elementwise ops, views
//!   that keep a padded dimension whole, permutations, broadcasts, reductions and scans along
//!   other dimensions, gathers whose indices are padded) lower as they are;
//! - reductions, softmax and contractions over a padded dimension lower on inputs whose padding
//!   is replaced by the reduction's identity (`Fill`); means divide by the true count;
//! - attention masks the keys beyond the true length (see `linear.rs`);
//! - concatenation along a padded dimension writes each part at its true offset;
//! - anything else is refused (`Refused`): the caller compiles that program per size instead.
//!
//! Sizes used as shapes (view sizes, `arange`'s end, a slice's end) take their bucket; sizes
//! used as numbers are refused. The results keep their bucket shapes: the runtime slices them
//! to the true sizes.

use std::collections::HashMap;

use tpuc_fx::buckets::Padding;
use tpuc_fx::symbolic::SymExpr;
use tpuc_fx::{Arg, Node, SymIntArg};

use super::ctx::output_slots;
use super::prelude::*;

/// What replaces the padding of an input before an op reduces over it: the identity of the
/// reduction it performs.
pub(super) type Fill = BinaryOp;

/// How a node that touches padding lowers.
pub(super) enum Rule {
    /// As it is.
    Plain,
    /// On inputs whose padding along the given dimensions is replaced (tensor, dims, fill).
    Masked(Vec<(String, Vec<usize>, Fill)>),
    /// Concatenation along padded dimension `dim`.
    Concat(usize),
    /// Its input unchanged: a slice of a whole padded dimension (`x[..., -window:]` of a
    /// shorter `x`), which at the bucket's size could cut into the data.
    Identity,
}

/// Padded dimensions whose true data a view spread out: merged with `outer` dimensions before
/// it (`[2, s, k] -> [2*s, k]`, as a linear layer on a batch does), the dimension holds `outer`
/// runs of padded data. Only ops that keep each position of that dimension apart (elementwise
/// ops, the rows of a matrix product) and the view back are allowed on it.
#[derive(Default)]
pub(super) struct Spread(HashMap<String, Marks>);

/// A tensor's spread dimensions: (dimension, how many runs of padded data it holds).
type Marks = Vec<(usize, i64)>;

impl Spread {
    fn of(&self, name: &str) -> &[(usize, i64)] {
        self.0.get(name).map_or(&[], Vec::as_slice)
    }

    /// Whether tensor `name` holds spread data (a graph output must not: slicing cannot take
    /// it back).
    pub(super) fn holds(&self, name: &str) -> bool {
        !self.of(name).is_empty()
    }
}

/// Why a node cannot be made exact under padding.
pub(super) struct Refused(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, Refused> {
    Err(Refused(why.into()))
}

/// Arguments whose sizes may be symbolic because they are shapes (or a range's end), not
/// numbers the op computes with.
const SHAPE_ARGS: &[&str] = &["size", "shape", "stride", "end"];

const REMAPS: &[&str] = &[
    "aten.permute.default",
    "aten.movedim.int",
    "aten.movedim.intlist",
    "aten.moveaxis.int",
    "aten.moveaxis.intlist",
    "aten.transpose.int",
    "aten.t.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze.default",
    "aten.expand.default",
    "aten.expand_as.default",
    "aten.broadcast_to.default",
    "aten.embedding.default",
    "aten.index_select.default",
    "aten.gather.default",
    "aten.index.Tensor",
    "aten.cumsum.default",
    "aten.cumprod.default",
];

/// Operators whose subgraphs are lowered under the padding rules themselves (each subgraph's
/// tensors padded as its sizes say, the program's true sizes passed in), and whose loops over
/// a padded leading dimension stop at its true length.
const CONTROL_FLOW: &[&str] = &[
    "higher_order.cond",
    "higher_order.while_loop",
    "higher_order.scan",
    "higher_order.map_impl",
    "higher_order.associative_scan",
    "higher_order.invoke_subgraph",
];

const RESHAPES: &[&str] = &[
    "aten.view.default",
    "aten.reshape.default",
    "aten._unsafe_view.default",
];

/// Reductions over `dim` (None: every dimension) and the fill that leaves them unchanged.
fn reduction(target: &str) -> Option<Fill> {
    Some(match target {
        "aten.sum.default" | "aten.sum.dim_IntList" | "aten.mean.default" | "aten.mean.dim" => {
            BinaryOp::Add
        }
        "aten.any.default" | "aten.any.dim" | "aten.any.dims" => BinaryOp::Add,
        "aten.prod.default" | "aten.prod.dim_int" => BinaryOp::Mul,
        "aten.all.default" | "aten.all.dim" | "aten.all.dims" => BinaryOp::Mul,
        "aten.amax.default"
        | "aten.max.default"
        | "aten.max.dim"
        | "aten.argmax.default"
        | "aten.softmax.int"
        | "aten._softmax.default"
        | "aten.log_softmax.int"
        | "aten._log_softmax.default"
        | "aten.logsumexp.default" => BinaryOp::Max,
        "aten.amin.default" | "aten.min.default" | "aten.min.dim" | "aten.argmin.default" => {
            BinaryOp::Min
        }
        _ => return None,
    })
}

/// Contractions: (argument, contracted dimension from the end) for each operand.
fn contraction(target: &str) -> Option<&'static [(&'static str, usize)]> {
    Some(match target {
        "aten.mm.default" | "aten.bmm.default" | "aten.matmul.default" => {
            &[("self", 1), ("mat2", 2), ("other", 2)]
        }
        "aten.addmm.default" | "aten.baddbmm.default" => {
            &[("mat1", 1), ("mat2", 2), ("batch1", 1), ("batch2", 2)]
        }
        "aten.linear.default" => &[("input", 1), ("weight", 1)],
        _ => return None,
    })
}

/// The dimensions `n` contracts: (operand, dimension) for each operand it has.
fn contracted<'n>(g: &tpuc_fx::Graph, n: &'n Node) -> Vec<(&'n str, usize)> {
    let Some(operands) = contraction(&n.target) else {
        return Vec::new();
    };
    operands
        .iter()
        .filter_map(|&(arg, from_end)| match n.arg(arg) {
            Some(Arg::Tensor(x)) => {
                let r = rank(g, x);
                // A vector operand of matmul contracts its only dimension.
                Some((x.as_str(), if r == 1 { 0 } else { r - from_end }))
            }
            _ => None,
        })
        .collect()
}

fn rank(g: &tpuc_fx::Graph, name: &str) -> usize {
    g.tensor(name).map_or(0, |m| m.sizes.len())
}

const ATTENTION: &[&str] = &[
    "aten.scaled_dot_product_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
];

/// Ops that compute each example of a batch (dimension 0) on its own: a padded batch is exact.
const PER_EXAMPLE: &[&str] = &[
    "aten.convolution.default",
    "aten.max_pool2d_with_indices.default",
    "aten.avg_pool2d.default",
    "aten._adaptive_avg_pool2d.default",
    "aten._native_batch_norm_legit_no_training.default",
    "aten.upsample_nearest2d.default",
    "aten.upsample_nearest2d.vec",
    "aten.upsample_bilinear2d.default",
    "aten.upsample_bilinear2d.vec",
];

/// Normalisations over the trailing `normalized_shape` dimensions.
const LAYER_NORMS: &[&str] = &["aten.native_layer_norm.default", "aten.layer_norm.default"];

impl Ctx<'_> {
    /// The true lengths of tensor `name`'s dimensions (None where not padded), or None when it
    /// has no padded dimension.
    fn padded_dims(&self, name: &str) -> Option<&[Option<SymExpr>]> {
        self.opts.padding.as_deref().and_then(|p| p.dims(name))
    }

    /// The true sizes of a padded program, in the order of its symbols: what each region of a
    /// subgraph takes after its inputs (`driver::lower_subgraph`). None when not padded.
    pub(super) fn size_operands(&self) -> Vec<Value> {
        let symbols = self.opts.padding.iter().flat_map(|p| &p.symbols);
        symbols.filter_map(|s| self.sizes.get(s).copied()).collect()
    }

    /// The true length of the leading dimension of tensor `name` where it is padded.
    pub(super) fn true_leading_length(&mut self, name: &str) -> OpResult<Option<Value>> {
        let leading = self
            .padded_dims(name)
            .and_then(|d| d.first().cloned().flatten());
        leading.map(|expr| self.true_length(&expr)).transpose()
    }

    /// The true length `expr` (an i64 scalar) from the sizes the module takes.
    pub(super) fn true_length(&mut self, expr: &SymExpr) -> OpResult<Value> {
        match expr {
            SymExpr::Int(v) => Ok(self.b.scalar(DType::I64, *v as f64)),
            SymExpr::Symbol(name) => self
                .sizes
                .get(name)
                .copied()
                .ok_or_else(|| OpError(format!("internal error: no size argument for {name}"))),
            SymExpr::Call(f, args) if f == "Add" || f == "Mul" => {
                let op = if f == "Add" {
                    BinaryOp::Add
                } else {
                    BinaryOp::Mul
                };
                let mut acc: Option<Value> = None;
                for a in args {
                    let v = self.true_length(a)?;
                    acc = Some(match acc {
                        None => v,
                        Some(acc) => self.b.binary(op, acc, v)?,
                    });
                }
                acc.ok_or_else(|| OpError(format!("an empty {f} in a size")))
            }
            other => err(format!("the size {other} cannot be computed on the device")),
        }
    }

    /// A boolean tensor of `shape`: whether each position along `dim` is before `length`, the
    /// true data.
    fn valid(&mut self, shape: &[i64], dim: usize, length: &SymExpr) -> OpResult<Value> {
        let ty = TensorType::new(shape.to_vec(), DType::I64);
        let positions = self.b.iota(ty, dim as i64)?;
        let length = self.true_length(length)?;
        let length = self.b.broadcast_in_dim(length, shape, &[])?;
        Ok(self.b.compare(CompareDir::Lt, positions, length)?)
    }

    /// `x` (tensor `name`) with its padding along `dims` replaced by `fill`.
    fn masked(&mut self, name: &str, x: Value, dims: &[usize], fill: Fill) -> OpResult<Value> {
        let Some(lengths) = self.padded_dims(name).map(<[_]>::to_vec) else {
            return Ok(x);
        };
        let value = crate::ir::reduction_identity(fill, self.b.elem(x));
        let filler = self.full_like(x, value, None);
        let shape = self.b.shape(x).to_vec();
        let mut out = x;
        for &d in dims {
            if let Some(Some(length)) = lengths.get(d) {
                let keep = self.valid(&shape, d, length)?;
                out = self.b.select(keep, out, filler)?;
            }
        }
        Ok(out)
    }

    /// A mask of `shape` (attention scores, keys last) keeping the keys of tensor `key` (keys
    /// along its dimension `dim`) before their true length; None when they are not padded.
    pub(super) fn padded_keys(
        &mut self,
        n: &Node,
        dim: usize,
        shape: &[i64],
    ) -> OpResult<Option<Value>> {
        let Some(Arg::Tensor(key)) = n.arg("key") else {
            return Ok(None);
        };
        let Some(Some(length)) = self.padded_dims(key).and_then(|d| d.get(dim)).cloned() else {
            return Ok(None);
        };
        self.valid(shape, shape.len() - 1, &length).map(Some)
    }

    /// The number of elements `dims` of `x` (tensor argument `arg` of `n`) hold, as a tensor
    /// like `like`: their true count where they are padded.
    pub(super) fn reduced_count(
        &mut self,
        n: &Node,
        arg: &str,
        x: Value,
        dims: &[i64],
        like: Value,
    ) -> OpResult<Value> {
        let shape = self.b.shape(x).to_vec();
        let lengths = match n.arg(arg) {
            Some(Arg::Tensor(t)) => self.padded_dims(t).map(<[_]>::to_vec),
            _ => None,
        };
        let mut fixed = 1i64;
        let mut runtime: Vec<SymExpr> = Vec::new();
        for &d in dims {
            match lengths.as_ref().and_then(|l| l[d as usize].clone()) {
                Some(e) => runtime.push(e),
                None => fixed *= shape[d as usize],
            }
        }
        if runtime.is_empty() {
            return Ok(self.full_like(like, fixed as f64, None));
        }
        runtime.push(SymExpr::Int(fixed));
        let count = self.true_length(&SymExpr::Call("Mul".into(), runtime))?;
        let count = self.b.convert(count, self.b.elem(like));
        let shape = self.b.shape(like).to_vec();
        Ok(self.b.broadcast_in_dim(count, &shape, &[])?)
    }

    /// The concatenation of `n`'s tensors along padded dimension `dim`: each part written at
    /// the true length of those before it, so the true data stays first.
    pub(super) fn concat_padded(&mut self, n: &Node, dim: usize) -> OpResult<Vec<Option<Value>>> {
        let Some(Arg::Tensors(names)) = n.arg("tensors") else {
            return err("argument tensors should be a tensor list");
        };
        let out = self.out_type(n, 0)?;
        let mut result = self.b.splat(&out, 0.0);
        let zero = self.b.scalar(DType::I64, 0.0);
        let mut offset = zero;
        for name in names {
            let part = self.value(name)?;
            let part = self.b.convert(part, out.elem);
            let mut starts = vec![zero; out.rank()];
            starts[dim] = offset;
            result = self.b.dynamic_update_slice(result, part, &starts)?;
            let length = match self.padded_dims(name).and_then(|d| d[dim].clone()) {
                Some(e) => e,
                None => SymExpr::Int(self.b.shape(part)[dim]),
            };
            let length = self.true_length(&length)?;
            offset = self.b.binary(BinaryOp::Add, offset, length)?;
        }
        Ok(vec![Some(result)])
    }

    /// Lowers `n` on inputs with their padding replaced as `masks` says, then puts the inputs
    /// back for the nodes after it.
    pub(super) fn lower_masked(
        &mut self,
        n: &Node,
        masks: &[(String, Vec<usize>, Fill)],
        lower: &LowerFn,
    ) -> OpResult<Vec<Option<Value>>> {
        let mut saved = Vec::new();
        for (name, dims, fill) in masks {
            let x = self.value(name)?;
            let m = self.masked(name, x, dims, *fill)?;
            saved.push((name.as_str(), x));
            self.rebind(name, m);
        }
        let result = lower(self, n);
        for (name, x) in saved {
            self.rebind(name, x);
        }
        result
    }
}

/// How `n` lowers when the program is padded (`padding`): its rule, or why it cannot be exact.
pub(super) fn rule(
    g: &tpuc_fx::Graph,
    padding: &Padding,
    spread: &mut Spread,
    pointwise: bool,
    n: &Node,
) -> Result<Rule, Refused> {
    let dims = |name: &str| padding.dims(name);
    let inputs: Vec<&str> = n.inputs.iter().flat_map(|a| a.arg.tensor_refs()).collect();
    let outputs: Vec<&str> = output_slots(n).into_iter().flatten().collect();
    for a in &n.inputs {
        let symbolic = match &a.arg {
            Arg::SymInt(SymIntArg::Name(s)) => padding.sym_ints.get(s),
            Arg::SymInts(list) => list.iter().find_map(|s| match s {
                SymIntArg::Name(s) => padding.sym_ints.get(s),
                SymIntArg::Int(_) => None,
            }),
            _ => None,
        };
        if let Some(expr) = symbolic {
            if !SHAPE_ARGS.contains(&a.name.as_str()) {
                return refuse(format!(
                    "its argument {} is the size {expr}, a number that differs within a bucket",
                    a.name
                ));
            }
        }
    }
    let touches = inputs.iter().chain(&outputs).any(|t| padding.is_padded(t));
    if !touches {
        return Ok(Rule::Plain);
    }
    let rank = |name: &str| rank(g, name);
    let padded_at =
        |name: &str, d: usize| dims(name).is_some_and(|l| l.get(d).is_some_and(Option::is_some));
    let dim_arg = |name: &str, rank: usize| -> Result<Option<usize>, Refused> {
        match n.arg(name) {
            Some(Arg::Int(d)) => Ok(Some(norm_dim(*d, rank.max(1)).map_err(|e| Refused(e.0))?)),
            Some(Arg::None) | None => Ok(None),
            Some(_) => refuse(format!("its argument {name} is not a number")),
        }
    };
    let self_name = match n.arg("self").or_else(|| n.arg("input")) {
        Some(Arg::Tensor(t)) => Some(t.as_str()),
        _ => None,
    };
    let t = n.target.as_str();

    if RESHAPES.contains(&t) {
        let (Some(x), Some(out)) = (self_name, outputs.first()) else {
            return refuse("a view without its input");
        };
        let marks = view_layout(g, padding, spread.of(x), x, out)?;
        if !marks.is_empty() {
            spread.0.insert(out.to_string(), marks);
        }
        return Ok(Rule::Plain);
    }
    if CONTROL_FLOW.contains(&t) {
        if let Some(x) = inputs.iter().find(|x| spread.holds(x)) {
            return refuse(format!(
                "{x} holds padded data merged with another dimension, which its subgraphs \
                 cannot see"
            ));
        }
        return Ok(Rule::Plain);
    }
    if inputs.iter().any(|x| spread.holds(x)) {
        let marks = spread_through(g, padding, spread, pointwise, n, &inputs, &outputs)?;
        for (out, dims) in marks {
            spread.0.insert(out, dims);
        }
        return Ok(Rule::Plain);
    }

    if let Some(fill) = reduction(t) {
        let Some(x) = self_name else {
            return refuse("a reduction without its input");
        };
        let r = rank(x);
        let reduced: Vec<usize> = match n.arg("dim") {
            Some(Arg::Int(d)) => vec![norm_dim(*d, r.max(1)).map_err(|e| Refused(e.0))?],
            Some(Arg::Ints(ds)) if !ds.is_empty() => ds
                .iter()
                .map(|&d| norm_dim(d, r.max(1)))
                .collect::<OpResult<_>>()
                .map_err(|e| Refused(e.0))?,
            _ => (0..r).collect(),
        };
        let padded: Vec<usize> = reduced.into_iter().filter(|&d| padded_at(x, d)).collect();
        if padded.is_empty() {
            return Ok(Rule::Plain);
        }
        if t.starts_with("aten.arg") && n.arg("dim").is_none_or(|d| *d == Arg::None) && r > 1 {
            return refuse("it returns a position in the flattened tensor, which padding moves");
        }
        return Ok(Rule::Masked(vec![(x.to_string(), padded, fill)]));
    }
    if contraction(t).is_some() {
        let masks: Vec<_> = contracted(g, n)
            .into_iter()
            .filter(|&(x, d)| padded_at(x, d))
            .map(|(x, d)| (x.to_string(), vec![d], BinaryOp::Add))
            .collect();
        return Ok(if masks.is_empty() {
            Rule::Plain
        } else {
            Rule::Masked(masks)
        });
    }
    if ATTENTION.contains(&t) {
        // Keys beyond the true length are masked by the attention lowering itself; the head
        // dimension must be whole.
        for arg in ["query", "key", "value"] {
            if let Some(Arg::Tensor(x)) = n.arg(arg) {
                let r = rank(x);
                if r > 0 && padded_at(x, r - 1) {
                    return refuse(format!("the head dimension of its {arg} is padded"));
                }
            }
        }
        return Ok(Rule::Plain);
    }
    if t == "aten.cat.default" || t == "aten.concat.default" {
        let Some(out) = outputs.first() else {
            return Ok(Rule::Plain);
        };
        let r = rank(out);
        let d = dim_arg("dim", r)?.unwrap_or(0);
        if padded_at(out, d) {
            return Ok(Rule::Concat(d));
        }
        return same_coordinates(g, padding, &inputs, out).map(|()| Rule::Plain);
    }
    if t == "aten.slice.Tensor" {
        let Some(x) = self_name else {
            return refuse("a slice without its input");
        };
        let d = dim_arg("dim", rank(x))?.unwrap_or(0);
        if !padded_at(x, d) {
            return Ok(Rule::Plain);
        }
        let start = match n.arg("start") {
            Some(Arg::Int(v)) => *v,
            Some(Arg::None) | None => 0,
            _ => return refuse("it slices a padded dimension from a size"),
        };
        let step = match n.arg("step") {
            Some(Arg::Int(v)) => *v,
            Some(Arg::None) | None => 1,
            _ => return refuse("it slices a padded dimension with a step that is a size"),
        };
        // The whole dimension whatever its size (torch's shape says so): the input itself.
        let whole = outputs
            .first()
            .and_then(|out| dims(out))
            .and_then(|o| o.get(d).cloned().flatten());
        if step == 1
            && whole.is_some()
            && whole == dims(x).and_then(|i| i.get(d).cloned().flatten())
        {
            return Ok(Rule::Identity);
        }
        if start != 0 || step != 1 {
            return refuse(format!(
                "it slices a padded dimension from {start} in steps of {step} (only prefixes \
                 keep the true data where it is)"
            ));
        }
        return Ok(Rule::Plain);
    }
    if t == "aten.select.int" {
        let Some(x) = self_name else {
            return refuse("a select without its input");
        };
        let d = dim_arg("dim", rank(x))?.unwrap_or(0);
        if padded_at(x, d) {
            return refuse("it selects an index of a padded dimension");
        }
        return Ok(Rule::Plain);
    }
    if LAYER_NORMS.contains(&t) {
        let Some(x) = self_name else {
            return refuse("a normalisation without its input");
        };
        let r = rank(x);
        let normalized = match n.arg("normalized_shape") {
            Some(Arg::Ints(s)) => s.len(),
            Some(Arg::SymInts(s)) => s.len(),
            _ => r,
        };
        if (r.saturating_sub(normalized)..r).any(|d| padded_at(x, d)) {
            return refuse("it normalises over a padded dimension");
        }
        return Ok(Rule::Plain);
    }
    if REMAPS.contains(&t) {
        return Ok(Rule::Plain);
    }
    if PER_EXAMPLE.contains(&t) {
        let other = inputs.iter().chain(&outputs).find_map(|x| {
            let dims = dims(x)?;
            dims.iter()
                .skip(1)
                .position(Option::is_some)
                .map(|d| (x, d + 1))
        });
        return match other {
            Some((x, d)) => refuse(format!(
                "dimension {d} of {x} is padded, not only the batch"
            )),
            None => Ok(Rule::Plain),
        };
    }
    if pointwise {
        let Some(out) = outputs.first() else {
            return Ok(Rule::Plain);
        };
        return same_coordinates(g, padding, &inputs, out).map(|()| Rule::Plain);
    }
    refuse("tpuc does not know how to make it exact under padding")
}

/// Broadcasting, elementwise: each input dimension (aligned from the end) is the output's
/// padded dimension, or size 1, or neither padded.
fn same_coordinates(
    g: &tpuc_fx::Graph,
    padding: &Padding,
    inputs: &[&str],
    out: &str,
) -> Result<(), Refused> {
    let out_dims = padding.dims(out).unwrap_or_default();
    let out_rank = g.tensor(out).map_or(0, |m| m.sizes.len());
    for x in inputs {
        let Some(meta) = g.tensor(x) else { continue };
        let in_dims = padding.dims(x).unwrap_or_default();
        let in_rank = meta.sizes.len();
        for k in 0..in_rank {
            let Some(od) = (out_rank + k).checked_sub(in_rank) else {
                continue;
            };
            let here = in_dims.get(k).cloned().flatten();
            let there = out_dims.get(od).cloned().flatten();
            match (&here, &there) {
                (Some(a), Some(b)) if a == b => {}
                (None, None) => {}
                (None, Some(_)) if meta.sizes[k].as_static() == Some(1) => {}
                _ => {
                    let show = |e: &Option<SymExpr>| {
                        e.as_ref().map_or("static".to_string(), SymExpr::to_string)
                    };
                    return refuse(format!(
                        "dimension {k} of {x} ({}) meets dimension {od} of {out} ({})",
                        show(&here),
                        show(&there)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Where a view puts each padded dimension of `x` (spread as `spread_x` says): outermost in a
/// dimension of `out` (the same product of sizes before it, the same number of elements from
/// it on: merged with or split into whole dimensions after it, `[s, 4] <-> [4*s]`), which keeps
/// its true data first; or merged with dimensions before it (`[2, s] -> [2*s]`), spread, which
/// the marks returned for `out` record (and a view back undoes).
fn view_layout(
    g: &tpuc_fx::Graph,
    padding: &Padding,
    spread_x: &[(usize, i64)],
    x: &str,
    out: &str,
) -> Result<Marks, Refused> {
    let sizes = |name: &str| -> Vec<i64> {
        g.tensor(name)
            .map(|m| {
                m.sizes
                    .iter()
                    .map(|d| d.as_static().unwrap_or(-1))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (xs, os) = (sizes(x), sizes(out));
    let before = |s: &[i64], d: usize| -> i64 { s[..d].iter().product() };
    let from = |s: &[i64], d: usize| -> i64 { s[d..].iter().product() };
    let padded = |name: &str| -> Vec<usize> {
        padding
            .dims(name)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|_| i))
            .collect()
    };
    let (pin, pout) = (padded(x), padded(out));
    if pin.len() != pout.len() {
        return refuse(format!(
            "the view of {x} as {out} merges or splits a padded dimension"
        ));
    }
    let mut marks = Vec::new();
    for (&i, &j) in pin.iter().zip(&pout) {
        let outer = spread_x
            .iter()
            .find(|(d, _)| *d == i)
            .map_or(1, |&(_, o)| o);
        // The padded run in the flat layout: the elements before it, the elements from it on.
        let (ahead, rest) = (before(&xs, i) * outer, from(&xs, i) / outer);
        let (ahead_out, rest_out) = (before(&os, j), from(&os, j));
        if (ahead_out, rest_out) == (ahead, rest) {
            continue;
        }
        let merged =
            ahead_out > 0 && ahead % ahead_out == 0 && rest_out == rest * (ahead / ahead_out);
        if !merged {
            return refuse(format!(
                "the view of {x} as {out} moves padded dimension {i}"
            ));
        }
        marks.push((j, ahead / ahead_out));
    }
    Ok(marks)
}

/// The spread marks of `n`'s outputs, when `n` reads spread data: elementwise ops keep each
/// position (their inputs spread alike), matrix products keep their rows; anything else is
/// refused.
fn spread_through(
    g: &tpuc_fx::Graph,
    padding: &Padding,
    spread: &Spread,
    pointwise: bool,
    n: &Node,
    inputs: &[&str],
    outputs: &[&str],
) -> Result<Vec<(String, Marks)>, Refused> {
    let rank = |name: &str| rank(g, name);
    let why = || {
        Refused(
            "it reads a padded dimension that a view merged with dimensions before it (only \
             elementwise ops and the rows of a matrix product may, until a view splits it again)"
                .to_string(),
        )
    };
    let Some(&out) = outputs.first() else {
        return Err(why());
    };
    let out_rank = rank(out);
    let mut marks: Vec<(usize, i64)> = Vec::new();
    if pointwise {
        same_coordinates(g, padding, inputs, out)?;
        for &x in inputs {
            let offset = out_rank - rank(x).min(out_rank);
            for &(d, o) in spread.of(x) {
                let at = d + offset;
                match marks.iter().find(|(m, _)| *m == at) {
                    Some(&(_, seen)) if seen != o => return Err(why()),
                    Some(_) => {}
                    None => marks.push((at, o)),
                }
            }
        }
        // An input padded where another is spread would mix layouts.
        for &x in inputs {
            let offset = out_rank - rank(x).min(out_rank);
            let dims = padding.dims(x).unwrap_or_default();
            for (d, e) in dims.iter().enumerate() {
                let spread_here = spread.of(x).iter().any(|(s, _)| *s == d);
                if e.is_some() && !spread_here && marks.iter().any(|(m, _)| *m == d + offset) {
                    return Err(why());
                }
            }
        }
    } else {
        let rows_arg = match n.target.as_str() {
            "aten.mm.default" => Some("self"),
            "aten.addmm.default" => Some("mat1"),
            "aten.linear.default" => Some("input"),
            _ => None,
        };
        let rows = rows_arg.and_then(|a| match n.arg(a) {
            Some(Arg::Tensor(t)) => Some(t.as_str()),
            _ => None,
        });
        let Some(rows) = rows else {
            return Err(why());
        };
        // Only the rows operand is spread, and not along what the product contracts, which no
        // operand has padded.
        if inputs.iter().any(|&x| x != rows && spread.holds(x)) {
            return Err(why());
        }
        let padded = |(x, d): &(&str, usize)| {
            padding
                .dims(x)
                .and_then(|dims| dims.get(*d))
                .is_some_and(Option::is_some)
        };
        if contracted(g, n).iter().any(padded) {
            return Err(why());
        }
        let r = rank(rows);
        for &(d, o) in spread.of(rows) {
            if d + 1 == r {
                return Err(why());
            }
            marks.push((d, o));
        }
    }
    Ok(outputs
        .iter()
        .map(|o| (o.to_string(), marks.clone()))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::testing::{t, TestGraph};
    use tpuc_fx::buckets::Padding;
    use tpuc_fx::symbolic::SymExpr;
    use tpuc_fx::{Arg, DType};

    use crate::ir::print;

    /// `s0` padded to 16: tensors named here have it in the dimensions given.
    fn padding(tensors: &[(&str, Vec<Option<SymExpr>>)]) -> Padding {
        Padding {
            symbols: vec!["s0".into()],
            tensors: tensors
                .iter()
                .map(|(n, d)| (n.to_string(), d.clone()))
                .collect::<BTreeMap<_, _>>(),
            ..Padding::default()
        }
    }

    fn s0() -> Option<SymExpr> {
        Some(SymExpr::Symbol("s0".into()))
    }

    fn s0_plus(n: i64) -> Option<SymExpr> {
        Some(SymExpr::Call(
            "Add".into(),
            vec![SymExpr::Symbol("s0".into()), SymExpr::Int(n)],
        ))
    }

    #[test]
    fn concatenation_writes_each_part_at_the_true_offset() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[16, 4]);
        let y = g.input("y", DType::F32, &[1, 4]);
        let c = g.node1(
            "aten.cat.default",
            vec![
                ("tensors", Arg::Tensors(vec![x.clone(), y])),
                ("dim", Arg::Int(0)),
            ],
            DType::F32,
            &[17, 4],
        );
        let text = print(
            &g.lower_padded(
                &[&c],
                padding(&[("x", vec![s0(), None]), (&c, vec![s0_plus(1), None])]),
            )
            .unwrap(),
        );
        // The size argument after the inputs; two writes, the second at the true length of x.
        assert!(text.contains("tensor<i64>"), "{text}");
        assert_eq!(
            text.matches("stablehlo.dynamic_update_slice").count(),
            2,
            "{text}"
        );
    }

    #[test]
    fn reductions_over_padding_see_their_identity() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[16, 3]);
        let m = g.node1(
            "aten.amax.default",
            vec![("self", t(&x)), ("dim", Arg::Ints(vec![0]))],
            DType::F32,
            &[3],
        );
        let text = print(
            &g.lower_padded(&[&m], padding(&[("x", vec![s0(), None])]))
                .unwrap(),
        );
        for wanted in ["stablehlo.iota", "dir=LT", "stablehlo.select", "0xFF800000"] {
            assert!(text.contains(wanted), "no {wanted} in\n{text}");
        }
    }

    #[test]
    fn views_keep_a_padded_dimension_outermost_or_are_refused() {
        let view =
            |from: &[i64], to: &[i64], dims: Vec<Option<SymExpr>>, out: Vec<Option<SymExpr>>| {
                let mut g = TestGraph::default();
                let x = g.input("x", DType::F32, from);
                let v = g.node1(
                    "aten.view.default",
                    vec![("self", t(&x)), ("size", Arg::Ints(to.to_vec()))],
                    DType::F32,
                    to,
                );
                g.lower_padded(&[&v], padding(&[("x", dims), (&v, out)]))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            };
        let times = |n: i64| {
            Some(SymExpr::Call(
                "Mul".into(),
                vec![SymExpr::Int(n), SymExpr::Symbol("s0".into())],
            ))
        };
        // [s, 4] -> [4*s] and back, [1, s, 4] -> [s, 4]: the true data stays first.
        assert_eq!(
            view(&[16, 4], &[64], vec![s0(), None], vec![times(4)]),
            Ok(())
        );
        assert_eq!(
            view(&[64], &[16, 4], vec![times(4)], vec![s0(), None]),
            Ok(())
        );
        assert_eq!(
            view(
                &[1, 16, 4],
                &[16, 4],
                vec![None, s0(), None],
                vec![s0(), None]
            ),
            Ok(())
        );
        // [2, s] -> [2*s] spreads it.
        let e = view(&[2, 16], &[32], vec![None, s0()], vec![times(2)]).unwrap_err();
        assert!(e.contains("with dimensions before it"), "{e}");
    }

    #[test]
    fn what_padding_would_change_is_refused_naming_the_node() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[16, 3]);
        let v = g.node1(
            "aten.view.default",
            vec![("self", t(&x)), ("size", Arg::Ints(vec![48]))],
            DType::F32,
            &[48],
        );
        let e = g
            .lower_padded(&[&v], padding(&[("x", vec![s0(), None]), (&v, vec![None])]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("node0 (aten.view.default) cannot be padded"),
            "{e}"
        );
        assert!(e.contains("merges or splits a padded dimension"), "{e}");
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[16, 3]);
        let f = g.node1(
            "aten.flip.default",
            vec![("self", t(&x)), ("dims", Arg::Ints(vec![0]))],
            DType::F32,
            &[16, 3],
        );
        let e = g
            .lower_padded(
                &[&f],
                padding(&[("x", vec![s0(), None]), (&f, vec![s0(), None])]),
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("aten.flip.default") && e.contains("exact under padding"),
            "{e}"
        );
    }
}
