//! Structural checks of a program: every reference resolves to a value defined before it,
//! nothing is defined twice, every value has a type, and weights match their placeholders.

use std::collections::HashSet;
use std::path::Path;

use crate::error::{FxError, Result};
use crate::graph::*;

/// `program`, read from `path`, when it passes [`validate`]; every reader ends with this.
pub fn validated(path: &Path, program: Program) -> Result<Program> {
    validate(&program).map_err(|(context, message)| FxError::Invalid {
        path: path.to_path_buf(),
        context,
        message,
    })?;
    Ok(program)
}

/// On failure: (where, what), e.g. ("node add_1 (aten.add.Tensor)", "uses undefined value x").
/// Subgraphs a node takes are checked as graphs of their own (they read only their inputs).
pub fn validate(program: &Program) -> std::result::Result<(), (String, String)> {
    crate::kernels::check(&program.kernels).map_err(|m| ("kernels".to_string(), m))?;
    validate_graph(&program.graph, Some(program), "")
}

/// `g`'s checks; its weights are `program`'s (None: a subgraph, whose inputs are all passed to
/// it); `within` prefixes every place named ("" for the program's own graph).
fn validate_graph(
    g: &Graph,
    program: Option<&Program>,
    within: &str,
) -> std::result::Result<(), (String, String)> {
    let mut defined: HashSet<&str> = HashSet::with_capacity(g.tensors.len());
    let all_defs: HashSet<&str> = g
        .inputs
        .iter()
        .map(|i| i.name.as_str())
        .chain(g.nodes.iter().flat_map(|n| n.defined_tensors()))
        .collect();

    for input in &g.inputs {
        let context = format!("{within}graph input {}", input.name);
        if !defined.insert(&input.name) {
            return Err((context, "is defined twice".into()));
        }
        let meta = g
            .tensor(&input.name)
            .ok_or_else(|| (context.clone(), "has no tensor metadata".to_string()))?;
        if input.kind != InputKind::UserInput {
            let weight = program
                .and_then(|p| p.weight_for(input))
                .ok_or_else(|| (context.clone(), "has no data in the archive".to_string()))?;
            if Some(&weight.sizes) != meta.static_sizes().as_ref() || weight.dtype != meta.dtype {
                return Err((
                    context,
                    format!(
                        "type mismatch: the graph expects {} but the stored weight is {}{:?}",
                        meta.describe(),
                        weight.dtype,
                        weight.sizes
                    ),
                ));
            }
        }
    }
    for node in &g.nodes {
        let context = || format!("{within}node {} ({})", node.name, node.target);
        for input in &node.inputs {
            if let Arg::Graph(sub) = &input.arg {
                validate_graph(
                    &sub.graph,
                    None,
                    &format!("{}, subgraph {}: ", context(), sub.name),
                )?;
            }
            for r in input.arg.tensor_refs() {
                if !defined.contains(r) {
                    let why = if all_defs.contains(r) {
                        format!("argument {} uses {r} before it is defined (the graph is out of order or has a cycle)", input.name)
                    } else {
                        format!("argument {} refers to undefined value {r}", input.name)
                    };
                    return Err((context(), why));
                }
            }
        }
        for out in node.defined_tensors() {
            if !defined.insert(out) {
                return Err((
                    context(),
                    format!("defines {out}, which is already defined"),
                ));
            }
            if g.tensor(out).is_none() {
                return Err((context(), format!("output {out} has no tensor metadata")));
            }
        }
    }
    for (i, out) in g.outputs.iter().enumerate() {
        if let OutputValue::Tensor(t) = &out.value {
            if !defined.contains(t.as_str()) {
                return Err((
                    format!("{within}graph output {i}"),
                    format!("refers to undefined value {t}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use crate::graph::*;

    use crate::testing::neg_graph as graph;

    /// A `Program` exists only once validated: the one constructor outside the readers refuses
    /// what the readers refuse.
    #[test]
    fn a_program_that_exists_passed_validation() {
        assert!(Program::new(graph("x", "y"), HashMap::new()).is_ok());
        for (g, place, why) in [
            (graph("z", "y"), "node neg", "undefined value z"),
            (graph("y", "y"), "node neg", "before it is defined"),
            (graph("x", "w"), "graph output 0", "undefined value w"),
        ] {
            let (at, what) = Program::new(g, HashMap::new()).unwrap_err();
            assert!(at.starts_with(place) && what.contains(why), "{at}: {what}");
        }
        let mut untyped = graph("x", "y");
        untyped.tensors.remove("y");
        let (_, what) = Program::new(untyped, HashMap::new()).unwrap_err();
        assert!(what.contains("no tensor metadata"), "{what}");
    }
}
