//! The registry: one table from the full ATen overload name (`aten.addmm.default`) to its
//! lowering, filled by the op families, and how a node's op finds its lowering (in-place,
//! `out=` and `_copy` variants reach the functional op's).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use tpuc_fx::Node;

use super::ctx::{Ctx, OpResult};
use crate::ir::Value;

/// A lowering: returns one value per node output (`None` for an output it does not compute).
pub type LowerFn = Arc<dyn Fn(&mut Ctx, &Node) -> OpResult<Vec<Option<Value>>> + Send + Sync>;

pub(super) static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let mut r = Registry::default();
    super::elementwise::register(&mut r);
    // Elementwise ops keep each element where it is: padding passes through them.
    r.pointwise = r.lowerings.keys().copied().collect();
    super::view::register(&mut r);
    super::linear::register(&mut r);
    super::linalg::register(&mut r);
    super::reduction::register(&mut r);
    super::conv::register(&mut r);
    super::distance::register(&mut r);
    super::norm::register(&mut r);
    super::pool::register(&mut r);
    super::indexing::register(&mut r);
    super::sort::register(&mut r);
    super::resample::register(&mut r);
    super::random::register(&mut r);
    super::complex::register(&mut r);
    super::fft::register(&mut r);
    super::quant::register(&mut r);
    super::special::register(&mut r);
    super::bessel::register(&mut r);
    super::polynomials::register(&mut r);
    super::recurrences::register(&mut r);
    super::sharding::register(&mut r);
    super::collectives::register(&mut r);
    super::control_flow::register(&mut r);
    r
});

#[derive(Default)]
pub struct Registry {
    pub(super) lowerings: HashMap<&'static str, LowerFn>,
    /// Ops whose lowerings handle complex tensors. Every other lowering assumes real numbers,
    /// so a complex operand or result refuses the op rather than compute wrong numbers.
    pub(super) complex: HashSet<&'static str>,
    /// Collectives: lowered only in a program run one rank per device (see `collectives.rs`),
    /// so not among the ops a graph can be compiled with on its own.
    pub(super) collectives: HashSet<&'static str>,
    /// The elementwise family's ops (`padding.rs`).
    pub(super) pointwise: HashSet<&'static str>,
}

impl Registry {
    pub fn add<F>(&mut self, names: &[&'static str], f: F)
    where
        F: Fn(&mut Ctx, &Node) -> OpResult<Vec<Option<Value>>> + Send + Sync + 'static,
    {
        let f: LowerFn = Arc::new(f);
        for n in names {
            let previous = self.lowerings.insert(n, f.clone());
            assert!(previous.is_none(), "{n} registered twice");
        }
    }

    /// Registers a lowering that also handles complex tensors.
    pub fn add_complex<F>(&mut self, names: &[&'static str], f: F)
    where
        F: Fn(&mut Ctx, &Node) -> OpResult<Vec<Option<Value>>> + Send + Sync + 'static,
    {
        self.add(names, f);
        self.complex.extend(names);
    }

    /// Registers the lowering of a collective.
    pub fn add_collective<F>(&mut self, names: &[&'static str], f: F)
    where
        F: Fn(&mut Ctx, &Node) -> OpResult<Vec<Option<Value>>> + Send + Sync + 'static,
    {
        self.add(names, f);
        self.collectives.extend(names);
    }
}

/// Whether `target` is one of the elementwise family's ops.
pub(super) fn is_pointwise(target: &str) -> bool {
    REGISTRY.pointwise.contains(target)
}

/// Every ATen overload tpuc lowers in any graph, sorted (collectives are [`collective_ops`]).
pub fn supported_ops() -> Vec<&'static str> {
    let mut v: Vec<&str> = REGISTRY
        .lowerings
        .keys()
        .copied()
        .filter(|op| !REGISTRY.collectives.contains(op))
        .collect();
    v.sort_unstable();
    v
}

/// The collectives tpuc lowers in a program run one rank per device, sorted.
pub fn collective_ops() -> Vec<&'static str> {
    let mut v: Vec<&str> = REGISTRY.collectives.iter().copied().collect();
    v.sort_unstable();
    v
}

/// Whether `target` is a collective tpuc lowers in a program run one rank per device.
pub fn is_collective(target: &str) -> bool {
    REGISTRY.collectives.contains(target)
}

/// How tpuc handles a core ATen overload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// tpuc lowers it.
    Lowered,
    /// torch's core-ATen decompositions rewrite it into other ops (the torch.compile path).
    Decomposed,
    NotSupported,
}

impl Coverage {
    pub fn name(self) -> &'static str {
        match self {
            Coverage::Lowered => "lowered",
            Coverage::Decomposed => "decomposed",
            Coverage::NotSupported => "not supported",
        }
    }
}

/// torch's core ATen opset (as `tools/gen_ops_doc.py` lists it from torch), with tpuc's
/// coverage of each overload.
pub fn core_aten_coverage() -> Vec<(&'static str, Coverage)> {
    include_str!("core_aten_ops.txt")
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(op, recorded)| {
            let coverage = if is_supported(op) {
                Coverage::Lowered
            } else if recorded == "decomposed" {
                Coverage::Decomposed
            } else {
                Coverage::NotSupported
            };
            (op, coverage)
        })
        .collect()
}

/// Whether tpuc lowers `target` in any graph (collectives only in rank programs: see
/// [`is_collective`]).
pub fn is_supported(target: &str) -> bool {
    lowering(target).is_some() && !is_collective(target)
}

/// How a node's op relates to the lowering that computes it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// The op itself.
    Functional,
    /// `aten.relu_.default` of `aten.relu.default`: the result then stands for `self`.
    InPlace,
    /// `aten.atan2.out` of `aten.atan2.default` (or `.Tensor`): the result then stands for the
    /// `out` argument.
    Out,
}

/// The lowering that computes an op.
pub(super) struct Lowering {
    pub(super) f: &'static LowerFn,
    pub(super) variant: Variant,
    pub(super) handles_complex: bool,
}

/// The lowering of `target`: its own, or that of the functional op it is a variant of.
pub(super) fn lowering(target: &str) -> Option<Lowering> {
    let find = |name: &str, variant| {
        REGISTRY
            .lowerings
            .get_key_value(name)
            .map(|(key, f)| Lowering {
                f,
                variant,
                handles_complex: REGISTRY.complex.contains(key),
            })
    };
    if let Some(found) = find(target, Variant::Functional) {
        return Some(found);
    }
    let (name, overload) = target.strip_prefix("aten.")?.split_once('.')?;
    if overload == "out" {
        return ["default", "Tensor"]
            .iter()
            .find_map(|o| find(&format!("aten.{name}.{o}"), Variant::Out));
    }
    // `aten.view_copy.default` and the other `_copy` forms of views compute what the view does.
    if let Some(found) = name
        .strip_suffix("_copy")
        .and_then(|view| find(&format!("aten.{view}.{overload}"), Variant::Functional))
    {
        return Some(found);
    }
    let functional = name.strip_suffix('_').filter(|f| !f.ends_with('_'))?;
    find(&format!("aten.{functional}.{overload}"), Variant::InPlace)
}

/// A special polynomial's op names, of a tensor degree and argument or either a Python number
/// (`.default`, `.x_scalar`, `.n_scalar`).
macro_rules! scalar_overloads {
    ($op:literal) => {
        [
            concat!("aten.", $op, ".default"),
            concat!("aten.", $op, ".x_scalar"),
            concat!("aten.", $op, ".n_scalar"),
        ]
    };
}
pub(super) use scalar_overloads;
