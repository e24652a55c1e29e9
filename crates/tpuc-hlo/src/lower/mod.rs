//! Lowering of an ATen-level FX graph into the StableHLO IR: the driver (`driver.rs`) walks the
//! graph in order and hands each node to its lowering in the registry (`registry.rs`, keyed by
//! the full ATen overload name), checking every result against the type torch recorded. Each op
//! family has its own file and imports what the families share from `prelude.rs`; `ctx.rs`
//! reads a node's arguments; `semantics.rs` holds what torch's semantics the families share;
//! `promote.rs` is torch's type promotion. This file holds the options and errors of lowering.
//!
//! The lowering produces the module as the graph says it; the passes (`crate::passes`) clean it
//! up afterwards.

mod bessel;
mod collectives;
mod complex;
mod composites;
mod control_flow;
mod conv;
mod ctx;
mod distance;
mod driver;
mod elementwise;
mod fft;
mod in_place;
mod indexing;
mod kernels;
mod linalg;
mod linear;
mod norm;
mod padding;
mod polynomials;
mod pool;
mod prelude;
mod promote;
mod quant;
mod random;
mod recurrences;
mod reduction;
mod registry;
mod resample;
mod semantics;
mod sharding;
mod sort;
mod special;
#[cfg(test)]
mod testing;
mod view;

use std::sync::Arc;

use tpuc_fx::SourceLoc;

use crate::ir::*;
use crate::signature::Signature;

pub use collectives::ProcessGroups;
pub use ctx::{err, meta_type, Ctx, OpError, OpResult, Operand};
pub use driver::lower;
pub use promote::{promote_types, result_type, Participant};
pub use registry::{
    collective_ops, core_aten_coverage, is_collective, is_supported, supported_ops, Coverage,
    LowerFn, Registry,
};
pub use semantics::{broadcast_shapes, norm_dim};

/// How weights (parameters, buffers, constants) reach the compiled module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightsMode {
    /// As leading function arguments, in signature order: the runtime passes them in.
    #[default]
    Args,
    /// As inline `dense` constants: a self-contained module.
    Inline,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LowerOptions {
    pub weights: WeightsMode,
    /// Precision of f32 matmuls and convolutions. HIGHEST matches torch on every backend
    /// (XLA's default lets GPUs use TF32).
    pub precision: Precision,
    /// The mesh the program will be partitioned over, which sharding constraints in the graph
    /// refer to; without one they change nothing.
    pub mesh: Option<Mesh>,
    /// The process groups of a program that runs one rank per device, by the names its
    /// collectives give them; `None` refuses collectives.
    pub process_groups: Option<ProcessGroups>,
    /// The program was specialised for its sizes' buckets: its padded dimensions, whose true
    /// lengths the module takes as arguments (`ArgRole::Size`) and makes exact (`padding.rs`).
    pub padding: Option<Arc<tpuc_fx::buckets::Padding>>,
    /// The fusion stage: with patterns on, lowerings of whole patterns (attention) make
    /// composites themselves, and the pipeline recognises the others (`passes::fusion`).
    pub fusion: crate::passes::Fusion,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            weights: WeightsMode::Args,
            precision: Precision::Highest,
            mesh: None,
            process_groups: None,
            padding: None,
            fusion: crate::passes::Fusion::None,
        }
    }
}

/// A lowered program: the module as the graph says it (before any pass) and what its
/// arguments and results stand for.
#[derive(Clone, Debug)]
pub struct Lowered {
    pub module: Module,
    pub signature: Signature,
}

/// One node tpuc has no lowering for.
#[derive(Clone, Debug, PartialEq)]
pub struct Unsupported {
    pub target: String,
    pub node: String,
    pub source: Option<SourceLoc>,
}

#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("{}", describe_unsupported(.0))]
    Unsupported(Vec<Unsupported>),
    #[error("node {node} ({target}){}: {message}", source_suffix(.location))]
    Node {
        node: String,
        target: String,
        location: Option<SourceLoc>,
        message: String,
    },
    #[error("{0}")]
    Program(String),
    /// Sizes tensor values decide when the program runs (`tpuc_fx::symbolic::value_decided`).
    #[error("{0}")]
    ValueDecided(String),
    /// A node padding would change and tpuc cannot make exact: the program is compiled per
    /// size instead.
    #[error("node {node} ({target}){} cannot be padded to a bucket: {message}", source_suffix(.location))]
    NotPaddable {
        node: String,
        target: String,
        location: Option<SourceLoc>,
        message: String,
    },
    #[error(
        "the program has symbolic sizes ({0}); tpuc compiles static shapes: specialize it \
         (`tpuc compile --specialize` for the exported sizes, `--size SYMBOL=SIZE` for others; \
         `tpuc run` takes them from its inputs)"
    )]
    Symbolic(String),
}

fn source_suffix(s: &Option<SourceLoc>) -> String {
    s.as_ref().map(|s| format!(" at {s}")).unwrap_or_default()
}

fn describe_unsupported(list: &[Unsupported]) -> String {
    let mut ops: Vec<&str> = list.iter().map(|u| u.target.as_str()).collect();
    ops.sort_unstable();
    ops.dedup();
    let mut s = format!(
        "{} unsupported op{} ({} node{}): {}",
        ops.len(),
        if ops.len() == 1 { "" } else { "s" },
        list.len(),
        if list.len() == 1 { "" } else { "s" },
        ops.join(", ")
    );
    for u in list {
        s.push_str(&format!(
            "\n  {} (node {}){}",
            u.target,
            u.node,
            source_suffix(&u.source)
        ));
    }
    // A custom op of the user's own namespace may be a JAX kernel whose StableHLO the program
    // does not carry.
    let torch_namespaces = ["aten.", "prims.", "higher_order.", "quantized_decomposed."];
    if ops
        .iter()
        .any(|op| !torch_namespaces.iter().any(|ns| op.starts_with(ns)))
    {
        s.push_str(
            "\n(a custom op registered with tpuc.jax_op runs when its kernels travel with the \
             program: tpuc.save_kernels(exported_program, path) writes them into the archive)",
        );
    }
    s
}
