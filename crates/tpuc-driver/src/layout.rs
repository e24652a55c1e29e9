//! `--mesh` and `--plan`: a device mesh (`fsdp=2,tp=2`) and the plan laying a model out over it
//! (ready plans `dp`, `fsdp`, `tp` combined with commas, or a plan file).
//!
//! A plan file is JSON: `{"rules": {PATTERN: SPEC, ...}, "ready": "fsdp"}`, both optional. Rules
//! are tried in the file's order, the first whose pattern (`*` matches any characters) matches
//! a weight's name decides its layout; weights no rule matches follow the ready plans. A SPEC
//! has one entry per dimension: `null` (whole), an axis name, or a list of axis names (major
//! first), as torch_xla's and JAX's partition specs: `["tp", null]`, `[["dp", "fsdp"], null]`.
use std::path::Path;

use serde_json::Value;
use tpuc_hlo::ir::{Mesh, Sharding, TensorType};
use tpuc_hlo::plan::{Plan, Rule};
use tpuc_hlo::{ArgRole, Signature};

use crate::error::{Error, Result};

/// The mesh and plan of `--mesh`/`--plan` (both or neither).
pub fn parse(mesh: Option<&str>, plan: Option<&str>) -> Result<Option<(Mesh, Plan)>> {
    let (mesh, plan) = match (mesh, plan) {
        (None, None) => return Ok(None),
        (Some(mesh), Some(plan)) => (mesh, plan),
        (Some(_), None) => {
            return Err(Error::Invalid(
                "--mesh needs --plan (dp, fsdp, tp, a combination, or a file)".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(Error::Invalid(
                "--plan needs --mesh, e.g. --mesh fsdp=2,tp=2".into(),
            ))
        }
    };
    let mesh: Mesh = mesh
        .parse()
        .map_err(|e: String| Error::Invalid(format!("--mesh: {e}")))?;
    let path = Path::new(plan);
    let plan = if path.is_file() || plan.ends_with(".json") {
        read_plan(path)?
    } else {
        plan.parse()
            .map_err(|e: String| Error::Invalid(format!("--plan: {e}")))?
    };
    Ok(Some((mesh, plan)))
}

fn read_plan(path: &Path) -> Result<Plan> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    plan_from_json(&text).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
}

/// A plan from its JSON form, `{"rules": {PATTERN: SPEC, ...}, "ready": "fsdp,tp"}` (a plan
/// file's, or a plan Python gives as a dict).
pub fn plan_from_json(text: &str) -> std::result::Result<Plan, String> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("not a JSON plan: {e}"))?;
    let Value::Object(top) = json else {
        return Err(
            "a plan is an object {\"rules\": {PATTERN: SPEC}, \"ready\": \"fsdp,tp\"}".into(),
        );
    };
    let mut plan = Plan::default();
    for (key, value) in &top {
        match (key.as_str(), value) {
            ("ready", Value::String(ready)) => {
                plan.ready = ready.parse::<Plan>()?.ready;
            }
            ("rules", Value::Object(rules)) => {
                for (pattern, spec) in rules {
                    let spec = spec_of(spec).map_err(|e| format!("rule {pattern:?}: {e}"))?;
                    plan.rules.push(Rule {
                        pattern: pattern.clone(),
                        spec,
                    });
                }
            }
            (other, _) => {
                return Err(format!(
                    "unknown or malformed entry {other:?} (a plan has \"rules\", an object of \
                     PATTERN: SPEC, and \"ready\", a string)"
                ))
            }
        }
    }
    Ok(plan)
}

/// The layout `plan` gives each argument (its role and type) over `mesh`, and, where its uses
/// see another (a weight the plan `fsdp` gathers at use), that one: for callers that lay a
/// program's inputs out before it is traced (the Python package's graphs).
pub fn resolve_args(
    plan: &Plan,
    mesh: &Mesh,
    args: Vec<(ArgRole, TensorType)>,
) -> std::result::Result<Vec<(Sharding, Option<Sharding>)>, String> {
    let (roles, types): (Vec<ArgRole>, Vec<TensorType>) = args.into_iter().unzip();
    let signature = Signature {
        args: roles,
        results: Vec::new(),
        prepared: None,
    };
    let shardings =
        tpuc_hlo::plan::resolve(plan, mesh, &signature, &types).map_err(|e| e.to_string())?;
    let at_use = tpuc_hlo::plan::resolve_at_use(plan, &signature, &shardings);
    Ok(shardings.into_iter().zip(at_use).collect())
}

/// A partition spec: one entry per dimension, `null`, an axis, or a list of axes.
fn spec_of(value: &Value) -> Result<Sharding, String> {
    let Value::Array(entries) = value else {
        return Err(format!(
            "a spec is a list with one entry per dimension (null, an axis, or a list of axes), not {value}"
        ));
    };
    let dims = entries
        .iter()
        .map(|entry| match entry {
            Value::Null => Ok(Vec::new()),
            Value::String(axis) => Ok(vec![axis.clone()]),
            Value::Array(axes) => axes
                .iter()
                .map(|a| match a {
                    Value::String(axis) => Ok(axis.clone()),
                    other => Err(format!("an axis is a name, not {other}")),
                })
                .collect(),
            other => Err(format!(
                "a spec entry is null, an axis or a list of axes, not {other}"
            )),
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Sharding { dims })
}
