//! torch's functional collectives (`_c10d_functional`), in the graph of one rank of a
//! torch.distributed program (DTensor, tensor parallel, SimpleFSDP), lowered to StableHLO
//! collectives over the devices that run the program, device d as rank d (the module runs per
//! device: `passes::sharding::per_device`). A process group, named as the graph names it, stands
//! for the groups of ranks it is one of across the devices (`ProcessGroups`); the graph is the
//! traced rank's, so every rank must run the same graph (DTensor's collectives do; a graph with
//! the rank's own number baked in does not).
//!
//! The collectives complete at once: `wait_tensor` is the value itself. Point-to-point sends
//! and receives are refused by name.

use std::collections::BTreeMap;

use tpuc_fx::Node;

use super::prelude::*;

/// Each process group the graph names, by name: the groups of device ids (ranks) it stands for,
/// one per set of ranks that communicate together (a mesh dimension's groups, say), every
/// device in one of them.
pub type ProcessGroups = BTreeMap<String, Vec<Vec<i64>>>;

/// The groups the node's `group_name` argument names, checked against `group_size` when the op
/// states one.
fn groups<'o>(cx: &Ctx<'o>, n: &Node) -> OpResult<&'o [Vec<i64>]> {
    let Some(table) = &cx.opts.process_groups else {
        return err(
            "a collective: tpuc lowers collectives in a program that runs one rank per device \
             (tpuc.spmd); otherwise torch runs it",
        );
    };
    let name = cx
        .opt_str(n, "group_name")?
        .ok_or_else(|| OpError("missing argument group_name".into()))?;
    let Some(found) = table.get(name) else {
        let known: Vec<&str> = table.keys().map(String::as_str).collect();
        return err(format!(
            "process group {name:?} is not one the program was given (it has {known:?})"
        ));
    };
    if let Some(stated) = cx.opt_int(n, "group_size")? {
        let size = found.first().map_or(0, Vec::len) as i64;
        if stated != size {
            return err(format!(
                "the op says group {name:?} has {stated} ranks, but its groups have {size}"
            ));
        }
    }
    Ok(found)
}

/// torch's reduction of a collective: the binary op, and whether the sum is then averaged.
fn reduction(cx: &Ctx, n: &Node, elem: DType) -> OpResult<(BinaryOp, bool)> {
    let op = cx
        .opt_str(n, "reduce_op")?
        .ok_or_else(|| OpError("missing argument reduce_op".into()))?;
    Ok(match op.to_ascii_lowercase().as_str() {
        "sum" => (BinaryOp::Add, false),
        "avg" if elem.is_float() => (BinaryOp::Add, true),
        "avg" => return err(format!("reduce_op avg of a {} tensor", elem.name())),
        "product" => (BinaryOp::Mul, false),
        "min" => (BinaryOp::Min, false),
        "max" => (BinaryOp::Max, false),
        other => {
            return err(format!(
                "reduce_op {other:?}: tpuc lowers sum, avg, product, min and max"
            ))
        }
    })
}

fn size_of(groups: &[Vec<i64>]) -> i64 {
    groups.first().map_or(1, Vec::len) as i64
}

/// Lowers one tensor of a collective node over the node's groups.
type LowerOne = fn(&mut Ctx, &Node, Value, &[Vec<i64>]) -> OpResult<Value>;

/// The tensor a collective takes (`input`), or each of those its coalesced form takes
/// (`inputs`), lowered alike over the node's groups.
fn each_input(
    cx: &mut Ctx,
    n: &Node,
    coalesced: bool,
    lower_one: LowerOne,
) -> OpResult<Vec<Option<Value>>> {
    let xs = if coalesced {
        cx.tensors(n, "inputs")?
    } else {
        vec![cx.tensor(n, "input")?]
    };
    let groups = groups(cx, n)?;
    xs.into_iter()
        .map(|x| Ok(Some(lower_one(cx, n, x, groups)?)))
        .collect()
}

/// An average is the sum divided by the group's size.
fn averaged(cx: &mut Ctx, sum: Value, average: bool, groups: &[Vec<i64>]) -> OpResult<Value> {
    if !average {
        return Ok(sum);
    }
    let count = cx.full_like(sum, size_of(groups) as f64, None);
    Ok(cx.b.binary(BinaryOp::Div, sum, count)?)
}

fn all_reduce_one(cx: &mut Ctx, n: &Node, x: Value, groups: &[Vec<i64>]) -> OpResult<Value> {
    let (op, average) = reduction(cx, n, cx.b.elem(x))?;
    let all = groups.to_vec();
    let sum = cx.b.op1(OpKind::AllReduce { op, groups: all }, &[x])?;
    averaged(cx, sum, average, groups)
}

/// A tensor as a leading-dimension-of-`n` gather needs it: rank 0 tensors gather as vectors.
fn gather_dim0(cx: &mut Ctx, x: Value, groups: &[Vec<i64>]) -> OpResult<Value> {
    let scalar = cx.b.ty(x).rank() == 0;
    let x = if scalar { cx.b.reshape(x, &[1])? } else { x };
    let groups = groups.to_vec();
    Ok(cx.b.op1(OpKind::AllGather { dim: 0, groups }, &[x])?)
}

fn reduce_scatter_one(cx: &mut Ctx, n: &Node, x: Value, groups: &[Vec<i64>]) -> OpResult<Value> {
    let (op, average) = reduction(cx, n, cx.b.elem(x))?;
    let size = size_of(groups);
    if cx.b.ty(x).rank() == 0 || cx.b.shape(x)[0] % size != 0 {
        return err(format!(
            "reduce_scatter_tensor of a {}: its first dimension must split into {size} equal \
             parts",
            cx.b.ty(x)
        ));
    }
    let all = groups.to_vec();
    let part = cx.b.op1(
        OpKind::ReduceScatter {
            dim: 0,
            op,
            groups: all,
        },
        &[x],
    )?;
    averaged(cx, part, average, groups)
}

/// Even splits only: every rank sends and receives equal parts of its first dimension.
fn all_to_all_single(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input")?;
    let groups = groups(cx, n)?;
    let size = size_of(groups);
    let shape = cx.b.shape(x).to_vec();
    if shape.is_empty() || shape[0] % size != 0 {
        return err(format!(
            "all_to_all_single of a {}: its first dimension must split into {size} equal parts",
            cx.b.ty(x)
        ));
    }
    let even = shape[0] / size;
    for name in ["output_split_sizes", "input_split_sizes"] {
        if let Some(splits) = cx.opt_ints(n, name)? {
            if !splits.is_empty() && splits.iter().any(|&s| s != even) {
                return err(format!(
                    "all_to_all_single with {name} {splits:?}: tpuc lowers even splits only \
                     ({size} parts of {even})"
                ));
            }
        }
    }
    let groups = groups.to_vec();
    Ok(vec![Some(cx.b.op1(
        OpKind::AllToAll {
            split_dim: 0,
            concat_dim: 0,
            groups,
        },
        &[x],
    )?)])
}

/// `src` (a global rank) sends its tensor to its group: every member gathers the group's
/// tensors and keeps the one at `src`'s place in its group.
fn broadcast(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input")?;
    let src = cx.int(n, "src", None)?;
    let groups = groups(cx, n)?;
    let Some(place) = groups.iter().find_map(|g| g.iter().position(|&r| r == src)) else {
        return err(format!("broadcast from rank {src}, which no group holds"));
    };
    let shape = cx.b.shape(x).to_vec();
    let gathered = gather_dim0(cx, x, groups)?;
    let rows = shape.first().copied().unwrap_or(1);
    let start = place as i64 * rows;
    let part = cx.b.slice_dim(gathered, 0, start, start + rows, 1)?;
    Ok(vec![Some(cx.b.reshape(part, &shape)?)])
}

/// The collectives complete when issued: waiting is the value itself.
fn wait_tensor(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    Ok(vec![Some(cx.tensor(n, "tensor")?)])
}

fn wait_tensors(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    Ok(cx.tensors(n, "tensors")?.into_iter().map(Some).collect())
}

/// Sends and receives between two ranks: not collectives, and refused as such.
fn point_to_point(_: &mut Ctx, _: &Node) -> OpResult<Vec<Option<Value>>> {
    err("point-to-point communication (isend, irecv): tpuc lowers collectives only")
}

pub fn register(r: &mut Registry) {
    r.add_collective(&["_c10d_functional.all_reduce.default"], |cx, n| {
        each_input(cx, n, false, all_reduce_one)
    });
    r.add_collective(
        &["_c10d_functional.all_reduce_coalesced.default"],
        |cx, n| each_input(cx, n, true, all_reduce_one),
    );
    r.add_collective(
        &["_c10d_functional.all_gather_into_tensor.default"],
        |cx, n| each_input(cx, n, false, |cx, _, x, groups| gather_dim0(cx, x, groups)),
    );
    r.add_collective(
        &["_c10d_functional.all_gather_into_tensor_coalesced.default"],
        |cx, n| each_input(cx, n, true, |cx, _, x, groups| gather_dim0(cx, x, groups)),
    );
    r.add_collective(
        &["_c10d_functional.reduce_scatter_tensor.default"],
        |cx, n| each_input(cx, n, false, reduce_scatter_one),
    );
    r.add_collective(
        &["_c10d_functional.reduce_scatter_tensor_coalesced.default"],
        |cx, n| each_input(cx, n, true, reduce_scatter_one),
    );
    r.add_collective(
        &["_c10d_functional.all_to_all_single.default"],
        all_to_all_single,
    );
    r.add_collective(&["_c10d_functional.broadcast.default"], broadcast);
    r.add_collective(&["_c10d_functional.wait_tensor.default"], wait_tensor);
    r.add_collective(&["_c10d_functional.wait_tensors.default"], wait_tensors);
    r.add_collective(
        &[
            "_c10d_functional.isend.default",
            "_c10d_functional.irecv.default",
            "_c10d_functional.batch_p2p_ops.default",
        ],
        point_to_point,
    );
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use super::*;
    use crate::ir::print;
    use tpuc_fx::Arg;

    fn world(n: i64) -> ProcessGroups {
        ProcessGroups::from([("0".to_string(), vec![(0..n).collect()])])
    }

    fn s(text: &str) -> Arg {
        Arg::Str(text.into())
    }

    #[test]
    fn collectives_lower_per_device() {
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[4, 3]);
        let avg = g.node1(
            "_c10d_functional.all_reduce.default",
            vec![
                ("input", t(&x)),
                ("reduce_op", s("avg")),
                ("group_name", s("0")),
            ],
            DType::F32,
            &[4, 3],
        );
        let waited = g.node1(
            "_c10d_functional.wait_tensor.default",
            vec![("tensor", t(&avg))],
            DType::F32,
            &[4, 3],
        );
        let gathered = g.node1(
            "_c10d_functional.all_gather_into_tensor.default",
            vec![
                ("input", t(&x)),
                ("group_size", Arg::Int(2)),
                ("group_name", s("0")),
            ],
            DType::F32,
            &[8, 3],
        );
        let scattered = g.node1(
            "_c10d_functional.reduce_scatter_tensor.default",
            vec![
                ("input", t(&x)),
                ("reduce_op", s("sum")),
                ("group_size", Arg::Int(2)),
                ("group_name", s("0")),
            ],
            DType::F32,
            &[2, 3],
        );
        let exchanged = g.node1(
            "_c10d_functional.all_to_all_single.default",
            vec![
                ("input", t(&x)),
                ("output_split_sizes", Arg::Ints(vec![2, 2])),
                ("input_split_sizes", Arg::Ints(vec![2, 2])),
                ("group_name", s("0")),
            ],
            DType::F32,
            &[4, 3],
        );
        let sent = g.node1(
            "_c10d_functional.broadcast.default",
            vec![
                ("input", t(&x)),
                ("src", Arg::Int(1)),
                ("group_name", s("0")),
            ],
            DType::F32,
            &[4, 3],
        );
        let m = g
            .lower_per_device(
                &[&waited, &gathered, &scattered, &exchanged, &sent],
                world(2),
                2,
            )
            .unwrap();
        assert!(m.manual);
        // Callers pass and receive the devices' values stacked.
        assert_eq!(m.outer_arg_types()[0].shape, vec![2, 4, 3]);
        let outer: Vec<Vec<i64>> = m
            .outer_result_types()
            .iter()
            .map(|t| t.shape.clone())
            .collect();
        assert_eq!(
            outer,
            vec![
                vec![2, 4, 3],
                vec![2, 8, 3],
                vec![2, 2, 3],
                vec![2, 4, 3],
                vec![2, 4, 3]
            ]
        );
        let text = print(&m);
        assert_checks(
            &text,
            &[
                "mesh [ranks=2] (shardy, per device)",
                "tensor<1x4x3xf32> sharding [{ranks}, {}, {}]",
                "stablehlo.all_reduce %1 op=stablehlo.add groups=[[0, 1]]",
                "stablehlo.divide",
                "stablehlo.all_gather",
                "stablehlo.reduce_scatter",
                "stablehlo.all_to_all",
                // broadcast: everyone gathers and keeps rank 1's rows.
                "stablehlo.all_gather",
                "stablehlo.slice",
            ],
        );
    }

    #[test]
    fn collectives_are_refused_where_they_cannot_run() {
        let graph = |target: &str, args: Vec<(&str, Arg)>, out: &[i64]| {
            let mut g = TestGraph::default();
            let x = g.input("x", DType::F32, &[3, 2]);
            let mut all = vec![("input", t(&x))];
            all.extend(args);
            let y = g.node1(target, all, DType::F32, out);
            (g, y)
        };
        let reduce = |op: &str, group: &str| {
            graph(
                "_c10d_functional.all_reduce.default",
                vec![("reduce_op", s(op)), ("group_name", s(group))],
                &[3, 2],
            )
        };
        // Outside a rank program: collectives are torch's to run.
        let (g, y) = reduce("sum", "0");
        let e = g.lower(&[&y]).unwrap_err().to_string();
        assert!(e.contains("one rank per device"), "{e}");
        for ((g, y), why) in [
            (reduce("sum", "7"), "process group \"7\" is not one"),
            (reduce("bxor", "0"), "reduce_op \"bxor\""),
            (
                graph(
                    "_c10d_functional.all_to_all_single.default",
                    vec![
                        ("output_split_sizes", Arg::Ints(vec![1, 1])),
                        ("input_split_sizes", Arg::Ints(vec![1, 1])),
                        ("group_name", s("0")),
                    ],
                    &[2, 2],
                ),
                "first dimension must split into 2",
            ),
            (
                graph(
                    "_c10d_functional.all_gather_into_tensor.default",
                    vec![("group_size", Arg::Int(4)), ("group_name", s("0"))],
                    &[12, 2],
                ),
                "has 4 ranks, but its groups have 2",
            ),
        ] {
            let e = g
                .lower_per_device(&[&y], world(2), 2)
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{e}");
        }
        // Uneven splits are refused by name.
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[4, 2]);
        let y = g.node1(
            "_c10d_functional.all_to_all_single.default",
            vec![
                ("input", t(&x)),
                ("output_split_sizes", Arg::Ints(vec![1, 3])),
                ("input_split_sizes", Arg::Ints(vec![2, 2])),
                ("group_name", s("0")),
            ],
            DType::F32,
            &[4, 2],
        );
        let e = g
            .lower_per_device(&[&y], world(2), 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("even splits only"), "{e}");
        // So are sends and receives.
        let mut g = TestGraph::default();
        let x = g.input("x", DType::F32, &[4, 2]);
        let y = g.node1(
            "_c10d_functional.isend.default",
            vec![
                ("input", t(&x)),
                ("dst", Arg::Int(1)),
                ("group_name", s("0")),
            ],
            DType::F32,
            &[4, 2],
        );
        let e = g
            .lower_per_device(&[&y], world(2), 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("point-to-point"), "{e}");
    }

    #[test]
    fn collectives_are_not_ops_of_ordinary_graphs() {
        use crate::lower::{collective_ops, is_collective, is_supported, supported_ops};
        assert!(!is_supported("_c10d_functional.all_reduce.default"));
        assert!(is_collective("_c10d_functional.all_reduce.default"));
        assert!(collective_ops().contains(&"_c10d_functional.wait_tensor.default"));
        assert!(!supported_ops().contains(&"_c10d_functional.wait_tensor.default"));
    }
}
