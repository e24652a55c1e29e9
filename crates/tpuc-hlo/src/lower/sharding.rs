//! Sharding constraints a model states itself (`tpuc.sharding_constraint`, the torch custom op
//! `tpuc::sharding_constraint(Tensor x, str mesh, str spec)`): the value laid out over the mesh as
//! the spec says. The spec's text gives each dimension's axes separated by commas, several axes
//! of one dimension joined by `+` (`tp+fsdp,,dp`). Without a mesh the constraint changes nothing.

use tpuc_fx::Node;

use super::prelude::*;

/// The spec's axes per dimension, from its text.
fn parse_spec(text: &str) -> Vec<Vec<String>> {
    text.split(',')
        .map(|dim| {
            dim.split('+')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

fn constraint(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "x")?;
    let mesh_text = cx
        .opt_str(n, "mesh")?
        .ok_or_else(|| OpError("missing argument mesh".into()))?;
    let spec_text = cx
        .opt_str(n, "spec")?
        .ok_or_else(|| OpError("missing argument spec".into()))?;
    let Some(mesh) = cx.opts.mesh.clone() else {
        // One device: nothing to lay out.
        return Ok(vec![Some(x)]);
    };
    let stated: Mesh = mesh_text
        .parse()
        .map_err(|e: String| OpError(format!("mesh {mesh_text:?}: {e}")))?;
    if stated != mesh {
        return err(format!(
            "the constraint is for the mesh {stated}, but the program compiles for {mesh}"
        ));
    }
    let rank = cx.b.ty(x).rank();
    let mut dims = parse_spec(spec_text);
    if dims.len() > rank {
        return err(format!(
            "the spec {spec_text:?} gives {} dimensions for a tensor of {rank}",
            dims.len()
        ));
    }
    dims.resize(rank, Vec::new());
    let sharding = Sharding { dims };
    crate::ir::check_sharding(Some(&mesh), &sharding, cx.b.shape(x))
        .map_err(|e| OpError(format!("the spec {spec_text:?}: {e}")))?;
    Ok(vec![Some(
        cx.b.op1(OpKind::ShardingConstraint(sharding), &[x])?,
    )])
}

pub fn register(r: &mut Registry) {
    r.add(&["tpuc.sharding_constraint.default"], constraint);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use super::*;
    use tpuc_fx::Arg;

    #[test]
    fn specs_read_axes_per_dimension() {
        assert_eq!(
            parse_spec("tp+fsdp,,dp"),
            vec![
                vec!["tp".to_string(), "fsdp".into()],
                vec![],
                vec!["dp".into()]
            ]
        );
    }

    #[test]
    fn without_a_mesh_a_constraint_changes_nothing() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[4, 2]);
        let y = g.node1(
            "tpuc.sharding_constraint.default",
            vec![
                ("x", t(&x)),
                ("mesh", Arg::Str("dp=2".into())),
                ("spec", Arg::Str("dp".into())),
            ],
            DType::F32,
            &[4, 2],
        );
        assert_checks(&g.text(&[&y]), &["return %0"]);
    }
}
