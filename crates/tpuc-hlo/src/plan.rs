//! Sharding plans: how each argument of a program is laid out over a device mesh, decided from
//! the program's signature (weights by their names, user inputs by their role) and types.
//!
//! A plan is a list of rules (a name pattern and a spec, the first matching rule wins), then the
//! ready plans, each of which works over the mesh axis of its own name:
//! - `dp`: user inputs split along their first (batch) dimension over `dp`; weights whole.
//! - `fsdp`: user inputs' batches split over `fsdp` too, and each weight split along its first
//!   dimension not split already that the axis size divides (whole when none does).
//! - `tp`: Megatron's column and row parallel layers, recognised by the names of the modules
//!   that own the weights (`q`, `wq`, `q_proj`, `gate`, `w1`, ... column; `o`, `wo`, `o_proj`,
//!   `down`, `w2`, ... row; `embed`, `tok_embeddings`, `wte`, ... by vocabulary); norms and
//!   everything else whole.
//!
//! Whatever a plan says, XLA computes the same results: a layout changes where data lives and
//! which collectives run, never what is computed.

use std::fmt;
use std::str::FromStr;

use crate::ir::{Mesh, Sharding, TensorType};
use crate::signature::{ArgRole, Signature};

/// A ready plan, named for the mesh axis it works over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadyPlan {
    Dp,
    Fsdp,
    Tp,
}

impl ReadyPlan {
    pub const ALL: [ReadyPlan; 3] = [ReadyPlan::Dp, ReadyPlan::Fsdp, ReadyPlan::Tp];

    /// Its name, which is also the axis it works over.
    pub fn axis(self) -> &'static str {
        match self {
            ReadyPlan::Dp => "dp",
            ReadyPlan::Fsdp => "fsdp",
            ReadyPlan::Tp => "tp",
        }
    }

    /// Whether it splits batches (user inputs' first dimension) over its axis.
    fn splits_batches(self) -> bool {
        matches!(self, ReadyPlan::Dp | ReadyPlan::Fsdp)
    }
}

/// A user's rule: weights whose names match `pattern` (`*` matches any characters) take `spec`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub pattern: String,
    pub spec: Sharding,
}

/// Rules first (the first that matches a weight decides it), then ready plans. `inputs` lays
/// out user inputs by position (the torch.compile backend, whose graphs take a model's
/// parameters as inputs, decides each one's layout itself); an input without one follows the
/// ready plans. `results` lays out results by position (the backend's gradients as their
/// parameters, an optimizer step's updated values as their inputs); the others are whole on
/// every device, or, with `open_results`, laid out by XLA's partitioner as what computes them
/// leaves them (read back from the compiled program).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Plan {
    pub rules: Vec<Rule>,
    pub ready: Vec<ReadyPlan>,
    pub inputs: Vec<Option<Sharding>>,
    pub results: Vec<Option<Sharding>>,
    pub open_results: bool,
}

impl Plan {
    /// Data parallelism: the plan `--devices N` stands for.
    pub fn data_parallel() -> Plan {
        Plan {
            ready: vec![ReadyPlan::Dp],
            ..Plan::default()
        }
    }
}

/// `dp`, `fsdp`, `tp`, or a comma-separated combination (`fsdp,tp`).
impl FromStr for Plan {
    type Err = String;

    fn from_str(s: &str) -> Result<Plan, String> {
        let mut ready = Vec::new();
        for name in s.split(',').map(str::trim) {
            let Some(plan) = ReadyPlan::ALL.into_iter().find(|p| p.axis() == name) else {
                return Err(format!(
                    "unknown plan {name:?}: the ready plans are dp, fsdp and tp (combined with \
                     commas, e.g. fsdp,tp)"
                ));
            };
            if ready.contains(&plan) {
                return Err(format!("plan {name} is given twice"));
            }
            ready.push(plan);
        }
        Ok(Plan {
            ready,
            ..Plan::default()
        })
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self
            .rules
            .iter()
            .map(|r| format!("{} -> {:?}", r.pattern, r.spec.dims))
            .collect();
        parts.extend(self.ready.iter().map(|p| p.axis().to_string()));
        f.write_str(&parts.join(", "))
    }
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters.
pub fn matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Module names (the last component before `weight` or `bias`) of Megatron's column-parallel
/// layers: their outputs are split, so their weights [out, in] and biases split dimension 0.
const COLUMN: &[&str] = &[
    "q",
    "k",
    "v",
    "wq",
    "wk",
    "wv",
    "q_proj",
    "k_proj",
    "v_proj",
    "query",
    "key",
    "value",
    "qkv",
    "c_attn",
    "gate",
    "up",
    "w1",
    "w3",
    "gate_proj",
    "up_proj",
    "fc1",
    "c_fc",
    "head",
    "lm_head",
    "output",
];
/// Row-parallel layers: their inputs are split, so their weights split dimension 1 (biases
/// stay whole: they are added after the reduction).
const ROW: &[&str] = &[
    "o",
    "wo",
    "o_proj",
    "out_proj",
    "proj",
    "c_proj",
    "down",
    "w2",
    "down_proj",
    "fc2",
];
/// Embeddings, split by vocabulary (dimension 0).
const EMBEDDING: &[&str] = &["embed", "embed_tokens", "tok_embeddings", "wte", "tok"];

/// Megatron's layout for the weight `name` of `shape` over the axis `tp`; None: whole.
fn tensor_parallel(name: &str, shape: &[i64]) -> Option<(usize, &'static str)> {
    let mut parts = name.rsplit('.');
    let leaf = parts.next()?;
    let module = parts.next()?;
    let axis = ReadyPlan::Tp.axis();
    match (leaf, shape.len()) {
        ("weight", 2) if COLUMN.contains(&module) || EMBEDDING.contains(&module) => Some((0, axis)),
        ("weight", 2) if ROW.contains(&module) => Some((1, axis)),
        ("bias", 1) if COLUMN.contains(&module) => Some((0, axis)),
        _ => None,
    }
}

/// What is wrong with a plan for a mesh and a program, naming what and where.
pub type PlanError = String;

/// One sharding per argument of a program with this signature and these argument types: the
/// plan's rules for the weights they match, then its ready plans. Derived values (computed
/// from the weights) and the random seed are whole on every device.
pub fn resolve(
    plan: &Plan,
    mesh: &Mesh,
    signature: &Signature,
    arg_types: &[TensorType],
) -> Result<Vec<Sharding>, PlanError> {
    let axes: Vec<&str> = mesh.axes.iter().map(|a| a.name.as_str()).collect();
    for ready in &plan.ready {
        if mesh.axis(ready.axis()).is_none() {
            return Err(format!(
                "the plan {} works over a mesh axis named {0}, but the mesh has {}",
                ready.axis(),
                axes.join(", ")
            ));
        }
    }
    let batch_axes: Vec<String> = plan
        .ready
        .iter()
        .filter(|p| p.splits_batches())
        .map(|p| p.axis().to_string())
        .collect();
    let mut shardings = Vec::with_capacity(arg_types.len());
    let mut user_inputs = 0;
    for (role, ty) in signature.args.iter().zip(arg_types) {
        let rank = ty.rank();
        let explicit = match role {
            ArgRole::UserInput(_) => {
                user_inputs += 1;
                plan.inputs.get(user_inputs - 1).cloned().flatten()
            }
            _ => None,
        };
        let sharding = match role {
            ArgRole::UserInput(name) if explicit.is_some() => {
                let spec = explicit.expect("checked");
                fit(&spec, mesh, &ty.shape, &format!("input {name}"))?
            }
            ArgRole::UserInput(_) if rank > 0 && !batch_axes.is_empty() => {
                // A batch the axes do not divide (an epoch's last) is padded across them.
                let mut s = Sharding::replicated(rank);
                s.dims[0] = batch_axes.clone();
                s
            }
            ArgRole::Weight(name) => weight(plan, mesh, name, &ty.shape)?,
            _ => Sharding::replicated(rank),
        };
        shardings.push(sharding);
    }
    Ok(shardings)
}

/// The layout of the weight `name` of `shape` under `plan`.
fn weight(plan: &Plan, mesh: &Mesh, name: &str, shape: &[i64]) -> Result<Sharding, PlanError> {
    if let Some(rule) = plan.rules.iter().find(|r| matches(&r.pattern, name)) {
        return fit(
            &rule.spec,
            mesh,
            shape,
            &format!("the rule {} for weight {name}", rule.pattern),
        );
    }
    let mut s = Sharding::replicated(shape.len());
    if plan.ready.contains(&ReadyPlan::Tp) {
        let tp = mesh.axis(ReadyPlan::Tp.axis()).map_or(1, |(_, a)| a.size);
        if let Some((dim, axis)) = tensor_parallel(name, shape) {
            if shape[dim] % tp != 0 {
                return Err(format!(
                    "the plan tp splits dimension {dim} of weight {name} ({shape:?}) over an \
                     axis of {tp}, which does not divide it"
                ));
            }
            s.dims[dim].push(axis.to_string());
        }
    }
    if plan.ready.contains(&ReadyPlan::Fsdp) {
        let fsdp = mesh.axis(ReadyPlan::Fsdp.axis()).map_or(1, |(_, a)| a.size);
        // The first dimension the axis divides; else the first free one larger than one,
        // padded across the axis.
        let free = |d: &usize| s.dims[*d].is_empty();
        let dim = (0..shape.len())
            .filter(free)
            .find(|&d| shape[d] % fsdp == 0)
            .or_else(|| (0..shape.len()).filter(free).find(|&d| shape[d] > 1));
        if let Some(dim) = dim {
            s.dims[dim].push(ReadyPlan::Fsdp.axis().to_string());
        }
    }
    Ok(s)
}

/// Where a weight laid out as `stored` is used, when that differs from `stored`: the plan
/// `fsdp` gathers its axis at every use of a weight, as FSDP does, so the partitioner moves the
/// weight and never the activations it meets (it would otherwise reshard an embedding's
/// batch-split ids against a vocabulary split over `tp`, with an all-to-all each way).
pub fn at_use(plan: &Plan, stored: &Sharding) -> Option<Sharding> {
    let axis = ReadyPlan::Fsdp.axis();
    let gathers =
        plan.ready.contains(&ReadyPlan::Fsdp) && stored.dims.iter().flatten().any(|a| a == axis);
    gathers.then(|| Sharding {
        dims: stored
            .dims
            .iter()
            .map(|d| d.iter().filter(|a| *a != axis).cloned().collect())
            .collect(),
    })
}

/// Whether `sharding` splits every dimension of a tensor of `shape` over `mesh` into equal
/// parts (otherwise the last parts are padded).
pub fn splits_evenly(mesh: &Mesh, sharding: &Sharding, shape: &[i64]) -> bool {
    sharding.dims.iter().zip(shape).all(|(axes, &size)| {
        let parts: i64 = axes
            .iter()
            .map(|a| mesh.axis(a).map_or(1, |(_, axis)| axis.size))
            .product();
        size % parts == 0
    })
}

/// Per argument laid out as `shardings` says, where its uses see it when that differs ([`at_use`]
/// for the weights; user inputs are used as they are laid out).
pub fn resolve_at_use(
    plan: &Plan,
    signature: &Signature,
    shardings: &[Sharding],
) -> Vec<Option<Sharding>> {
    signature
        .args
        .iter()
        .zip(shardings)
        .map(|(role, s)| match role {
            ArgRole::Weight(_) => at_use(plan, s),
            _ => None,
        })
        .collect()
}

/// `spec` for a tensor of `shape` (trailing dimensions it does not name whole), when it fits
/// `mesh`: no more entries than dimensions, axes the mesh has (parts that do not divide a
/// dimension pad it).
/// The sharding of each result of types `result_types`: as the plan lays it out by position,
/// else whole on every device, or None (left to the partitioner) when the plan leaves results
/// open.
pub fn resolve_results(
    plan: &Plan,
    mesh: &Mesh,
    result_types: &[TensorType],
) -> Result<Vec<Option<Sharding>>, PlanError> {
    result_types
        .iter()
        .enumerate()
        .map(|(i, ty)| match plan.results.get(i).cloned().flatten() {
            Some(spec) => fit(&spec, mesh, &ty.shape, &format!("result {i}")).map(Some),
            None if plan.open_results => Ok(None),
            None => Ok(Some(Sharding::replicated(ty.rank()))),
        })
        .collect()
}

fn fit(spec: &Sharding, mesh: &Mesh, shape: &[i64], what: &str) -> Result<Sharding, PlanError> {
    if spec.dims.len() > shape.len() {
        return Err(format!(
            "{what}: the spec gives {} dimensions, but the tensor has {} ({shape:?})",
            spec.dims.len(),
            shape.len()
        ));
    }
    // Parts that do not divide a dimension are padded (XLA lays uneven shards out so).
    let mut s = Sharding::replicated(shape.len());
    for (dim, axes) in spec.dims.iter().enumerate() {
        if let Some(axis) = axes.iter().find(|a| mesh.axis(a).is_none()) {
            return Err(format!(
                "{what}: the spec splits over {axis:?}, which the mesh does not have"
            ));
        }
        s.dims[dim] = axes.clone();
    }
    Ok(s)
}

/// Under the plan `tp`, every attention of `graph` must have query and key/value heads the axis
/// divides: each device computes whole heads.
pub fn check_heads(plan: &Plan, mesh: &Mesh, graph: &tpuc_fx::Graph) -> Result<(), PlanError> {
    if !plan.ready.contains(&ReadyPlan::Tp) {
        return Ok(());
    }
    let tp = mesh.axis(ReadyPlan::Tp.axis()).map_or(1, |(_, a)| a.size);
    let heads = |node: &tpuc_fx::Node, arg: &str| -> Option<i64> {
        let tpuc_fx::Arg::Tensor(t) = node.arg(arg)? else {
            return None;
        };
        let sizes = graph.tensor(t)?.static_sizes()?;
        (sizes.len() >= 3).then(|| sizes[sizes.len() - 3])
    };
    for node in &graph.nodes {
        if !node.target.contains("scaled_dot_product") {
            continue;
        }
        for (arg, what) in [("query", "query"), ("key", "key/value")] {
            if let Some(h) = heads(node, arg) {
                if h % tp != 0 {
                    return Err(format!(
                        "attention node {} has {h} {what} heads, which the tp axis of {tp} does \
                         not divide: each device computes whole heads",
                        node.name
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, MeshAxis};
    use crate::signature::ResultRole;

    fn mesh(axes: &[(&str, i64)]) -> Mesh {
        Mesh {
            axes: axes
                .iter()
                .map(|&(name, size)| MeshAxis {
                    name: name.into(),
                    size,
                })
                .collect(),
        }
    }

    fn program(weights: &[(&str, &[i64])], input: &[i64]) -> (Signature, Vec<TensorType>) {
        let mut args: Vec<ArgRole> = weights
            .iter()
            .map(|(n, _)| ArgRole::Weight(n.to_string()))
            .collect();
        let mut types: Vec<TensorType> = weights
            .iter()
            .map(|(_, s)| TensorType::new(s.to_vec(), DType::F32))
            .collect();
        args.push(ArgRole::UserInput("x".into()));
        types.push(TensorType::new(input.to_vec(), DType::F32));
        let signature = Signature {
            args,
            results: Vec::<ResultRole>::new(),
            prepared: None,
        };
        (signature, types)
    }

    fn dims(s: &Sharding) -> Vec<Vec<&str>> {
        s.dims
            .iter()
            .map(|d| d.iter().map(String::as_str).collect())
            .collect()
    }

    #[test]
    fn ready_plans_parse_and_combine() {
        assert_eq!(
            "fsdp,tp".parse::<Plan>().unwrap().ready,
            [ReadyPlan::Fsdp, ReadyPlan::Tp]
        );
        assert!("zero3"
            .parse::<Plan>()
            .unwrap_err()
            .contains("dp, fsdp and tp"));
        assert!("tp,tp".parse::<Plan>().unwrap_err().contains("twice"));
    }

    #[test]
    fn patterns_match_any_run_of_characters() {
        assert!(matches("layers.*.wq.weight", "layers.3.wq.weight"));
        assert!(matches("*norm*", "blocks.0.attn_norm.weight"));
        assert!(!matches("*.wq.weight", "wq.weight"));
        assert!(matches("embed.weight", "embed.weight"));
        assert!(!matches("a*b*c", "acb"));
    }

    #[test]
    fn fsdp_and_tp_lay_out_a_llama_block() {
        let (signature, types) = program(
            &[
                ("blocks.0.attn.q.weight", &[64, 32]),
                ("blocks.0.attn.o.weight", &[32, 64]),
                ("blocks.0.mlp.up.weight", &[128, 32]),
                ("blocks.0.attn_norm.weight", &[32]),
                ("embed.weight", &[100, 32]),
                ("odd.weight", &[3, 5]),
            ],
            &[4, 8],
        );
        let mesh = mesh(&[("fsdp", 2), ("tp", 2)]);
        let plan: Plan = "fsdp,tp".parse().unwrap();
        let s = resolve(&plan, &mesh, &signature, &types).unwrap();
        let got: Vec<_> = s.iter().map(dims).collect();
        assert_eq!(
            got,
            vec![
                vec![vec!["tp"], vec!["fsdp"]], // column: outputs over tp, then fsdp
                vec![vec!["fsdp"], vec!["tp"]], // row: inputs over tp
                vec![vec!["tp"], vec!["fsdp"]],
                vec![vec!["fsdp"]],             // a norm: fsdp only
                vec![vec!["tp"], vec!["fsdp"]], // the embedding by vocabulary
                vec![vec!["fsdp"], vec![]],     // nothing divides it: its rows padded
                vec![vec!["fsdp"], vec![]],     // the batch over fsdp (tp splits none)
            ]
        );
        // A rule decides before the ready plans.
        let ruled = Plan {
            rules: vec![Rule {
                pattern: "*attn_norm*".into(),
                spec: Sharding::replicated(1),
            }],
            ..plan
        };
        let s = resolve(&ruled, &mesh, &signature, &types).unwrap();
        assert!(s[3].is_replicated());
    }

    #[test]
    fn fsdp_gathers_weights_at_use_and_leaves_inputs_split() {
        let (signature, types) = program(
            &[("embed.weight", &[100, 32]), ("odd.weight", &[3, 5])],
            &[4, 8],
        );
        let mesh = mesh(&[("fsdp", 2), ("tp", 2)]);
        let plan: Plan = "fsdp,tp".parse().unwrap();
        let s = resolve(&plan, &mesh, &signature, &types).unwrap();
        let used = resolve_at_use(&plan, &signature, &s);
        // The embedding keeps its vocabulary split over tp where it is used; the odd weight
        // (its rows padded over fsdp) is gathered whole; the batch is used as it is laid out.
        assert_eq!(
            used.iter()
                .map(|u| u.as_ref().map(dims))
                .collect::<Vec<_>>(),
            vec![
                Some(vec![vec!["tp"], vec![]]),
                Some(vec![vec![], vec![]]),
                None
            ]
        );
        // Without the plan fsdp, nothing is gathered: tp's splits are the layout computed on.
        let tp: Plan = "tp".parse().unwrap();
        assert_eq!(at_use(&tp, &Sharding::split(2, 0, "tp")), None);
        assert_eq!(at_use(&plan, &Sharding::split(2, 0, "tp")), None);
    }

    #[test]
    fn plans_that_do_not_fit_are_refused_by_name() {
        let (signature, types) = program(&[("fc.weight", &[6, 4])], &[3, 4]);
        let cases = [(
            "tp",
            mesh(&[("dp", 2)]),
            "works over a mesh axis named tp, but the mesh has dp",
        )];
        for (plan, mesh, why) in cases {
            let e = resolve(&plan.parse().unwrap(), &mesh, &signature, &types).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let rule = |dims: Vec<Vec<String>>| Plan {
            rules: vec![Rule {
                pattern: "fc.*".into(),
                spec: Sharding { dims },
            }],
            ..Plan::default()
        };
        let m = mesh(&[("dp", 4)]);
        let too_many = rule(vec![vec![], vec![], vec![]]);
        let e = resolve(&too_many, &m, &signature, &types).unwrap_err();
        assert!(
            e.contains(
                "the rule fc.* for weight fc.weight: the spec gives 3 dimensions, but the tensor \
                 has 2"
            ),
            "{e}"
        );
        // Parts that do not divide a dimension pad it: the rule stands.
        let uneven = rule(vec![vec!["dp".into()]]);
        let laid_out = resolve(&uneven, &m, &signature, &types).unwrap();
        assert_eq!(dims(&laid_out[0]), vec![vec!["dp"], vec![]]);
        assert!(!splits_evenly(&m, &laid_out[0], &[6, 4]));
        // So does a batch of 3 over dp=2.
        let two = mesh(&[("dp", 2)]);
        let batch = resolve(&"dp".parse().unwrap(), &two, &signature, &types).unwrap();
        assert_eq!(dims(&batch[1]), vec![vec!["dp"], vec![]]);
        assert!(!splits_evenly(&two, &batch[1], &[3, 4]));
        let unknown = rule(vec![vec!["tp".into()]]);
        let e = resolve(&unknown, &m, &signature, &types).unwrap_err();
        assert!(
            e.contains("over \"tp\", which the mesh does not have"),
            "{e}"
        );
    }
}
