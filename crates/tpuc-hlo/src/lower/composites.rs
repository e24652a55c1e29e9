//! Ops that are whole patterns as torch hands them over (attention, layer norm, softmax),
//! lowered as `stablehlo.composite` ops `tpuc.<pattern>` when the fusion stage is on: the
//! lowering runs as it always does, inside the composite's decomposition, on the node's tensor
//! inputs as the decomposition's arguments. (Patterns torch hands over as several ops are
//! recognised in the IR instead: `passes::fusion`.)

use tpuc_fx::{Arg, Node};

use super::ctx::{Ctx, OpResult};
use super::linear::attention_scale;
use super::semantics::norm_dim;
use super::LowerFn;
use crate::ir::{AttrValue, Attributes, TensorType, Value};

/// The composite an op is lowered as, with its attributes read off the node; None for an op
/// that is no pattern.
pub(super) fn composite_of(cx: &Ctx, n: &Node) -> OpResult<Option<(&'static str, Attributes)>> {
    let float = |name: &str, value: f64| (name.to_string(), AttrValue::f32(value as f32));
    Ok(Some(match n.target.as_str() {
        "aten.scaled_dot_product_attention.default"
        | "aten._scaled_dot_product_flash_attention_for_cpu.default" => {
            let scale = attention_scale(cx, n)?;
            let causal = cx.bool(n, "is_causal", false)?;
            (
                "tpuc.attention",
                vec![
                    float("scale", scale),
                    ("causal".to_string(), AttrValue::Bool(causal)),
                ],
            )
        }
        "aten.native_layer_norm.default" | "aten.layer_norm.default" => (
            "tpuc.layer_norm",
            vec![float("epsilon", cx.float(n, "eps", Some(1e-5))?)],
        ),
        "aten._softmax.default"
        | "aten._log_softmax.default"
        | "aten.softmax.int"
        | "aten.log_softmax.int" => {
            let name = if n.target.contains("log") {
                "tpuc.log_softmax"
            } else {
                "tpuc.softmax"
            };
            let rank = cx.b.ty(cx.tensor(n, "self")?).rank();
            let dim = norm_dim(cx.int(n, "dim", None)?, rank)? as i64;
            (name, vec![("dim".to_string(), AttrValue::I64(dim))])
        }
        _ => return Ok(None),
    }))
}

/// `n` lowered by `lower` inside a composite `name`: its tensor inputs (each once, in order)
/// the operands, the outputs it computes the results.
pub(super) fn lower_as_composite<'p>(
    cx: &mut Ctx<'p>,
    n: &'p Node,
    lower: &LowerFn,
    name: &str,
    attributes: Attributes,
) -> OpResult<Vec<Option<Value>>> {
    let mut names: Vec<&'p str> = Vec::new();
    for a in &n.inputs {
        let refs: Vec<&'p str> = match &a.arg {
            Arg::Tensor(t) => vec![t.as_str()],
            Arg::Tensors(ts) => ts.iter().map(String::as_str).collect(),
            Arg::OptionalTensors(ts) => ts.iter().flatten().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        for t in refs {
            if !names.contains(&t) {
                names.push(t);
            }
        }
    }
    let inputs = names
        .iter()
        .map(|t| cx.value(t))
        .collect::<OpResult<Vec<Value>>>()?;
    let types: Vec<TensorType> = inputs.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let mut computed = Vec::new();
    let decomposition = cx.region(&types, |cx, args| {
        // The node reads the decomposition's arguments where it read the tensors.
        for (t, &arg) in names.iter().zip(args) {
            cx.rebind(t, arg);
        }
        let outs = lower(cx, n);
        for (t, &v) in names.iter().zip(&inputs) {
            cx.rebind(t, v);
        }
        let outs = outs?;
        computed = outs.iter().map(Option::is_some).collect();
        Ok(outs.into_iter().flatten().collect())
    })?;
    let mut results =
        cx.b.composite(name, attributes, 1, decomposition, &inputs)?
            .into_iter();
    Ok(computed
        .into_iter()
        .map(|c| if c { results.next() } else { None })
        .collect())
}
