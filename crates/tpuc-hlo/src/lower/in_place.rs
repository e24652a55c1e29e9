//! In-place ops on tensors that share storage: the lowering computes values, not storage, so it
//! refuses an in-place update that other views of the same memory would have to see.

use tpuc_fx::{Arg, Node};

/// Ops whose output may share storage with an input (views, and ops that may return their
/// input itself). An in-place op on such a tensor, or on a tensor viewed by one, would have to
/// update every alias; tpuc refuses that rather than compute a stale value.
fn may_alias(target: &str) -> bool {
    const VIEWS: &[&str] = &[
        "alias",
        "as_strided",
        "chunk",
        "contiguous",
        "detach",
        "diagonal",
        "expand",
        "expand_as",
        "flatten",
        "movedim",
        "narrow",
        "permute",
        "reshape",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "squeeze",
        "swapaxes",
        "t",
        "transpose",
        "unbind",
        "unflatten",
        "unfold",
        "unsqueeze",
        "view",
        "view_as",
        "_unsafe_view",
        "_reshape_alias",
        "unsafe_split",
    ];
    let name = target
        .strip_prefix("aten.")
        .and_then(|rest| rest.split('.').next())
        .unwrap_or("");
    VIEWS.contains(&name)
}

/// Refuses in-place ops (and `out=` variants) whose mutated argument `arg` aliases other
/// tensors of the graph (see [`may_alias`]).
pub(super) fn check_in_place(g: &tpuc_fx::Graph, node: &Node, arg: &str) -> Result<(), String> {
    let Some(Arg::Tensor(target)) = node.arg(arg) else {
        return Ok(());
    };
    let producer = g
        .nodes
        .iter()
        .find(|n| n.defined_tensors().contains(&target.as_str()));
    if let Some(p) = producer.filter(|p| may_alias(&p.target)) {
        return Err(format!(
            "not supported: in-place {} on {target}, a view made by {} (node {}); export the \
             program functionalized (ep.run_decompositions()) instead",
            node.target, p.target, p.name
        ));
    }
    let viewed_by = g.nodes.iter().find(|n| {
        may_alias(&n.target)
            && n.inputs
                .iter()
                .any(|a| matches!(&a.arg, Arg::Tensor(t) if t == target))
    });
    if let Some(v) = viewed_by {
        return Err(format!(
            "not supported: in-place {} on {target}, which {} (node {}) views; export the \
             program functionalized (ep.run_decompositions()) instead",
            node.target, v.target, v.name
        ));
    }
    Ok(())
}
