//! The verifier: checks that a module keeps the invariants the builders promise, and names the
//! op and the invariant when it does not. Passes run it between them in debug builds and tests.
//!
//! Invariants:
//! - every value is defined once: an argument or one op's result;
//! - every operand, and every result of the function, is defined before it is used;
//! - every op's results have the types its typing rule ([`super::typing::infer`]) gives its
//!   operands, so attribute values fit their operands (permutations, dimension numbers,
//!   windows, comparison types, region arities);
//! - each argument and result has one attribute set;
//! - the function an op runs (a region) keeps these invariants itself, reads only its own
//!   arguments (a value of the enclosing function inside it is "used before it is defined"),
//!   has no argument or result attributes, and has the signature the op's rule asks;
//! - shardings of arguments and results appear only in a module with a mesh; every sharding
//!   (constraints included, once the module has a mesh) names the mesh's axes, each at most once
//!   per tensor, and has one entry per dimension (a dimension the axes do not divide is padded,
//!   as XLA lays out uneven shards);
//! - a manual module (its body runs per device) is written in Shardy, every argument and result
//!   has a sharding (any per-device size makes a whole); once a module has a mesh, collectives
//!   appear only if it is manual, their groups splitting the mesh's devices, each device in one
//!   group;
//! - an argument that gives its buffer to a result (`ArgAttrs::aliased_result`) names an
//!   existing result of its type, and no other argument names that result.

use super::attrs::{ArgAttrs, Mesh, Sharding, ShardingDialect};
use super::func::{Func, Module};
use super::ops::OpKind;
use super::typing::infer;

/// What is wrong with a module, and where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid module{}: {place}: {invariant}", .after.as_ref().map(|p| format!(" after {p}")).unwrap_or_default())]
pub struct VerifyError {
    /// The op (by index and name, with its FX node) or the part of the function at fault.
    pub place: String,
    pub invariant: String,
    /// The pass that produced the module, when known.
    pub after: Option<String>,
}

impl VerifyError {
    /// The error, saying which pass produced the module.
    pub fn after(mut self, pass: &str) -> VerifyError {
        self.after = Some(pass.to_string());
        self
    }
}

fn fail(place: impl Into<String>, invariant: impl Into<String>) -> Result<(), VerifyError> {
    Err(VerifyError {
        place: place.into(),
        invariant: invariant.into(),
        after: None,
    })
}

/// Checks every invariant of `module` (see the module's documentation).
pub fn verify(module: &Module) -> Result<(), VerifyError> {
    let f = &module.main;
    verify_func(module, f, "")?;
    let mesh = module.sharding.as_ref().map(|m| &m.mesh);
    if module.manual {
        match &module.sharding {
            Some(m) if m.dialect == ShardingDialect::Shardy => {}
            Some(_) => return fail("module", "a manual module is written in Shardy"),
            None => return fail("module", "a manual module has a mesh"),
        }
    }
    let sides = [
        ("argument", f.args(), f.arg_attrs()),
        ("result", f.results(), f.result_attrs()),
    ];
    for (what, values, attrs) in sides {
        for (i, (&v, ArgAttrs { sharding, .. })) in values.iter().zip(attrs).enumerate() {
            let place = || format!("{what} {i}");
            let shape = &f.ty(v).shape;
            let checked = match sharding {
                // A manual module's types are each device's part: any size makes a whole.
                Some(s) if module.manual => sharding_parts(mesh, s, shape.len()).map(|_| ()),
                Some(s) => check_sharding(mesh, s, shape),
                None if module.manual => {
                    Err("each argument and result of a manual module has a sharding".into())
                }
                None => Ok(()),
            };
            checked.map_err(|why| VerifyError {
                place: place(),
                invariant: why,
                after: None,
            })?;
        }
    }
    let mut taken = vec![false; f.results().len()];
    for (i, (&v, attrs)) in f.args().iter().zip(f.arg_attrs()).enumerate() {
        let Some(r) = attrs.aliased_result else {
            continue;
        };
        let fits = f.results().get(r).is_some_and(|&out| f.ty(out) == f.ty(v));
        let why = if !fits {
            Some(format!(
                "gives its buffer to result {r}, which is not one of its type"
            ))
        } else if std::mem::replace(&mut taken[r], true) {
            Some(format!(
                "gives its buffer to result {r}, which another argument has"
            ))
        } else {
            None
        };
        if let Some(invariant) = why {
            return Err(VerifyError {
                place: format!("argument {i}"),
                invariant,
                after: None,
            });
        }
    }
    Ok(())
}

/// The invariants of one function, `main` or a region of an op (`within` says which, for
/// errors: empty for `main`), and of the regions of its ops.
fn verify_func(module: &Module, f: &Func, within: &str) -> Result<(), VerifyError> {
    let name = if within.is_empty() { "main" } else { within };
    let mut defined = vec![false; f.value_count()];
    if f.arg_attrs().len() != f.args().len() || f.result_attrs().len() != f.results().len() {
        return fail(name, "one attribute set per argument and per result");
    }
    for (i, &a) in f.args().iter().enumerate() {
        if std::mem::replace(&mut defined[a.index()], true) {
            return fail(format!("{within}argument {i}"), "a value is defined once");
        }
    }
    for (index, op) in f.ops().iter().enumerate() {
        let place = || {
            let node = &op.loc().node;
            if node.is_empty() {
                format!("{within}op {index} ({})", op.kind().name())
            } else {
                format!("{within}op {index} ({}, node {node})", op.kind().name())
            }
        };
        // A region is checked first: the op's typing rule reads its signature.
        for (k, region) in op.kind().regions().into_iter().enumerate() {
            let inner = region.func();
            if inner
                .arg_attrs()
                .iter()
                .chain(inner.result_attrs())
                .any(|a| *a != ArgAttrs::default())
            {
                return fail(
                    place(),
                    "a region's arguments and results have no attributes",
                );
            }
            verify_func(module, inner, &format!("{} region {k}: ", place()))?;
        }
        for o in op.operands() {
            if !defined.get(o.index()).copied().unwrap_or(false) {
                return fail(
                    place(),
                    format!("operand %{} is used before it is defined", o.index()),
                );
            }
        }
        let operand_types: Vec<_> = op.operands().iter().map(|&o| f.ty(o)).collect();
        let expected = infer(op.kind(), &operand_types).map_err(|e| VerifyError {
            place: place(),
            invariant: format!("its typing rule fails: {e}"),
            after: None,
        })?;
        let actual: Vec<_> = op.results().iter().map(|&r| f.ty(r).clone()).collect();
        if expected != actual {
            return fail(
                place(),
                format!(
                    "results must have the types its rule gives: {} (the rule) against {}",
                    list(&expected),
                    list(&actual)
                ),
            );
        }
        // A constraint is checked against the mesh once the module has one (the sharding pass
        // gives it); the emitter refuses one in a module that never gets a mesh.
        if let (OpKind::ShardingConstraint(s), Some(m)) = (op.kind(), &module.sharding) {
            check_sharding(Some(&m.mesh), s, &actual[0].shape).map_err(|why| VerifyError {
                place: place(),
                invariant: why,
                after: None,
            })?;
        }
        // Like constraints, collectives are checked once the module has its mesh (a rank's
        // program is lowered first, then made per device); the emitter refuses them elsewhere.
        if let (Some(groups), Some(m)) = (collective_groups(op.kind()), &module.sharding) {
            if !module.manual {
                return fail(
                    place(),
                    "collectives appear only in a module whose body runs per device (manual)",
                );
            }
            check_groups(groups, m.mesh.devices()).map_err(|why| VerifyError {
                place: place(),
                invariant: why,
                after: None,
            })?;
        }
        for r in op.results() {
            if std::mem::replace(&mut defined[r.index()], true) {
                return fail(place(), format!("%{} is defined once", r.index()));
            }
        }
    }
    for (i, r) in f.results().iter().enumerate() {
        if !defined.get(r.index()).copied().unwrap_or(false) {
            return fail(format!("{within}result {i}"), "returned values are defined");
        }
    }
    Ok(())
}

fn list(types: &[super::types::TensorType]) -> String {
    let parts: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("({})", parts.join(", "))
}

/// Whether `sharding` lays out a tensor of `shape` over `mesh`.
pub fn check_sharding(
    mesh: Option<&Mesh>,
    sharding: &Sharding,
    shape: &[i64],
) -> Result<(), String> {
    // A dimension the parts do not divide is padded to a multiple of them (XLA's layout of
    // uneven shards): only the axes are checked.
    sharding_parts(mesh, sharding, shape.len()).map(|_| ())
}

/// How many parts `sharding` splits each dimension of a tensor of `rank` into, once it names
/// only `mesh`'s axes, each at most once.
fn sharding_parts(
    mesh: Option<&Mesh>,
    sharding: &Sharding,
    rank: usize,
) -> Result<Vec<i64>, String> {
    let Some(mesh) = mesh else {
        return Err("a sharding needs a module with a mesh".into());
    };
    if sharding.dims.len() != rank {
        return Err(format!(
            "a sharding of {} dimensions for a tensor of {rank}",
            sharding.dims.len(),
        ));
    }
    let mut used: Vec<&str> = Vec::new();
    sharding
        .dims
        .iter()
        .map(|axes| {
            let mut parts = 1;
            for axis in axes {
                let Some((_, a)) = mesh.axis(axis) else {
                    return Err(format!("the mesh has no axis {axis:?}"));
                };
                if used.contains(&axis.as_str()) {
                    return Err(format!("axis {axis:?} splits a tensor once"));
                }
                used.push(axis);
                parts *= a.size;
            }
            Ok(parts)
        })
        .collect()
}

/// Whether a collective's `groups` split the `devices` of the module's mesh: every device in
/// exactly one group.
fn check_groups(groups: &[Vec<i64>], devices: i64) -> Result<(), String> {
    let mut seen = vec![false; devices as usize];
    for &id in groups.iter().flatten() {
        if id < 0 || id >= devices {
            return Err(format!(
                "groups {groups:?} name device {id}, but the mesh has {devices}"
            ));
        }
        seen[id as usize] = true;
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(format!(
            "groups {groups:?} leave out device {missing}: each of the mesh's {devices} devices \
             belongs to one group"
        ));
    }
    Ok(())
}

fn collective_groups(kind: &OpKind) -> Option<&[Vec<i64>]> {
    match kind {
        OpKind::AllReduce { groups, .. }
        | OpKind::AllGather { groups, .. }
        | OpKind::ReduceScatter { groups, .. }
        | OpKind::AllToAll { groups, .. } => Some(groups),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{
        ArgAttrs, BinaryOp, Builder, DType, Func, Loc, MeshSharding, Op, OpKind, ShardingDialect,
        TensorType, UnaryOp,
    };

    fn f32s(shape: &[i64]) -> TensorType {
        TensorType::new(shape.to_vec(), DType::F32)
    }

    /// x -> exp -> neg, returned.
    fn chain() -> Func {
        let mut b = Builder::new();
        let x = b.arg(f32s(&[4]), ArgAttrs::default());
        let e = b.unary(UnaryOp::Exp, x).unwrap();
        let n = b.unary(UnaryOp::Neg, e).unwrap();
        b.finish(vec![n], vec![])
    }

    #[test]
    fn a_built_function_verifies() {
        verify(&Module::new(chain())).unwrap();
    }

    #[test]
    fn a_use_before_its_definition_is_named() {
        let mut f = chain();
        // The exp now reads the neg's result, defined after it: well typed, out of order.
        let later = f.ops()[1].results()[0];
        f.replace_op(0, OpKind::Unary(UnaryOp::Exp), vec![later])
            .unwrap();
        let e = verify(&Module::new(f)).unwrap_err();
        assert_eq!(e.place, "op 0 (stablehlo.exponential)");
        assert!(e.invariant.contains("used before it is defined"), "{e}");
    }

    #[test]
    fn results_the_typing_rule_does_not_give_are_named() {
        let mut f = chain();
        // What no builder would make: an add whose result is narrower than its operands.
        let x = f.args()[0];
        let wrong = f.add_value(f32s(&[2]));
        f.ops.push(Op {
            kind: OpKind::Binary(BinaryOp::Add),
            operands: vec![x, x],
            results: vec![wrong],
            loc: std::sync::Arc::new(Loc {
                node: "add_1".into(),
                file: None,
            }),
        });
        let e = verify(&Module::new(f.clone())).unwrap_err();
        assert_eq!(e.place, "op 2 (stablehlo.add, node add_1)");
        assert!(
            e.invariant
                .contains("(tensor<4xf32>) (the rule) against (tensor<2xf32>)"),
            "{e}"
        );
        // And an op whose attributes do not fit its operand.
        f.ops.pop();
        f.ops.push(Op {
            kind: OpKind::Transpose { perm: vec![0, 0] },
            operands: vec![x],
            results: vec![wrong],
            loc: Loc::unknown(),
        });
        let e = verify(&Module::new(f)).unwrap_err().to_string();
        assert!(e.contains("not a permutation"), "{e}");
    }

    #[test]
    fn shardings_must_fit_the_module_mesh() {
        let sharded = |mesh: Option<Mesh>, sharding: Sharding| {
            let mut f = chain();
            f.set_arg_attrs(
                0,
                ArgAttrs {
                    sharding: Some(sharding),
                    ..ArgAttrs::default()
                },
            );
            let module = Module {
                main: f,
                sharding: mesh.map(|mesh| MeshSharding {
                    mesh,
                    dialect: ShardingDialect::Shardy,
                }),
                manual: false,
            };
            verify(&module).map_err(|e| e.to_string())
        };
        let dp = || Some(Mesh::line("dp", 2));
        assert_eq!(sharded(dp(), Sharding::split(1, 0, "dp")), Ok(()));
        for (mesh, sharding, why) in [
            (
                None,
                Sharding::split(1, 0, "dp"),
                "needs a module with a mesh",
            ),
            (dp(), Sharding::split(1, 0, "tp"), "no axis \"tp\""),
            (
                dp(),
                Sharding::replicated(2),
                "2 dimensions for a tensor of 1",
            ),
            (
                dp(),
                Sharding {
                    dims: vec![vec!["dp".into(), "dp".into()]],
                },
                "splits a tensor once",
            ),
        ] {
            let e = sharded(mesh, sharding).unwrap_err();
            assert!(e.contains("argument 0") && e.contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn an_argument_gives_its_buffer_only_to_a_result_of_its_type() {
        let aliased = |results: &[usize]| {
            let mut f = chain();
            // Each a new argument of the result's type, giving its buffer to result `r`.
            for &r in results {
                f.add_arg(f32s(&[4]), ArgAttrs::default());
                let index = f.args().len() - 1;
                f.set_arg_attrs(
                    index,
                    ArgAttrs {
                        aliased_result: Some(r),
                        ..ArgAttrs::default()
                    },
                );
            }
            verify(&Module::new(f)).map_err(|e| e.to_string())
        };
        assert_eq!(aliased(&[0]), Ok(()));
        let e = aliased(&[1]).unwrap_err();
        assert!(e.contains("result 1, which is not one of its type"), "{e}");
        let e = aliased(&[0, 0]).unwrap_err();
        assert!(e.contains("which another argument has"), "{e}");
    }

    #[test]
    fn collectives_run_only_per_device_over_groups_of_the_mesh() {
        let module = |groups: Vec<Vec<i64>>, manual: bool, sharded: bool| {
            let mut b = Builder::new();
            let attrs = || ArgAttrs {
                sharding: sharded.then(|| Sharding::replicated(1)),
                ..ArgAttrs::default()
            };
            let x = b.arg(TensorType::new(vec![4], DType::F32), attrs());
            let y = b
                .op1(
                    OpKind::AllReduce {
                        op: BinaryOp::Add,
                        groups,
                    },
                    &[x],
                )
                .unwrap();
            let module = Module {
                main: b.finish(vec![y], vec![attrs()]),
                sharding: Some(MeshSharding {
                    mesh: Mesh::line("ranks", 4),
                    dialect: ShardingDialect::Shardy,
                }),
                manual,
            };
            verify(&module).map_err(|e| e.to_string())
        };
        let pairs = vec![vec![0, 1], vec![2, 3]];
        assert_eq!(module(pairs.clone(), true, true), Ok(()));
        for (groups, manual, sharded, why) in [
            (
                pairs.clone(),
                false,
                true,
                "only in a module whose body runs per device",
            ),
            (vec![vec![0, 1]], true, true, "leave out device 2"),
            (vec![vec![0, 4], vec![1, 2]], true, true, "name device 4"),
            (pairs, true, false, "has a sharding"),
        ] {
            let e = module(groups, manual, sharded).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
