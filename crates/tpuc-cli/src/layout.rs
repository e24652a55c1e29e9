//! `--mesh` and `--plan`: a device mesh (`fsdp=2,tp=2`) and the plan laying a model out over it
//! (ready plans `dp`, `fsdp`, `tp` combined with commas, or a plan file).
//!
//! A plan file is JSON: `{"rules": {PATTERN: SPEC, ...}, "ready": "fsdp"}`, both optional. Rules
//! are tried in the file's order, the first whose pattern (`*` matches any characters) matches
//! a weight's name decides its layout; weights no rule matches follow the ready plans. A SPEC
//! has one entry per dimension: `null` (whole), an axis name, or a list of axis names (major
//! first), as torch_xla's and JAX's partition specs: `["tp", null]`, `[["dp", "fsdp"], null]`.
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tpuc_driver::{Mesh, Plan, Rule};
use tpuc_hlo::ir::Sharding;

/// The mesh and plan of `--mesh`/`--plan` (both or neither).
pub fn parse(mesh: Option<&str>, plan: Option<&str>) -> Result<Option<(Mesh, Plan)>> {
    let (mesh, plan) = match (mesh, plan) {
        (None, None) => return Ok(None),
        (Some(mesh), Some(plan)) => (mesh, plan),
        (Some(_), None) => bail!("--mesh needs --plan (dp, fsdp, tp, a combination, or a file)"),
        (None, Some(_)) => bail!("--plan needs --mesh, e.g. --mesh fsdp=2,tp=2"),
    };
    let mesh: Mesh = mesh
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--mesh: {e}"))?;
    let path = Path::new(plan);
    let plan = if path.is_file() || plan.ends_with(".json") {
        read_plan(path)?
    } else {
        plan.parse()
            .map_err(|e: String| anyhow::anyhow!("--plan: {e}"))?
    };
    Ok(Some((mesh, plan)))
}

fn read_plan(path: &Path) -> Result<Plan> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let json: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a JSON plan", path.display()))?;
    let fail = |what: String| anyhow::anyhow!("{}: {what}", path.display());
    let Value::Object(top) = json else {
        return Err(fail(
            "a plan is an object {\"rules\": {PATTERN: SPEC}, \"ready\": \"fsdp,tp\"}".into(),
        ));
    };
    let mut plan = Plan::default();
    for (key, value) in &top {
        match (key.as_str(), value) {
            ("ready", Value::String(ready)) => {
                plan.ready = ready.parse::<Plan>().map_err(fail)?.ready;
            }
            ("rules", Value::Object(rules)) => {
                for (pattern, spec) in rules {
                    let spec = spec_of(spec).map_err(|e| fail(format!("rule {pattern:?}: {e}")))?;
                    plan.rules.push(Rule {
                        pattern: pattern.clone(),
                        spec,
                    });
                }
            }
            (other, _) => {
                return Err(fail(format!(
                    "unknown or malformed entry {other:?} (a plan has \"rules\", an object of \
                     PATTERN: SPEC, and \"ready\", a string)"
                )))
            }
        }
    }
    Ok(plan)
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
