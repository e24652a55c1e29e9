//! tpuc's middle: a typed StableHLO IR, the lowering of ATen graphs into it, passes over it,
//! and its emission as MLIR (the only part that uses melior).

pub mod builder;
pub mod emit;
pub mod fold;
pub mod hoist;
pub mod ir;
pub mod lower;
pub mod passes;
pub mod types;

pub use builder::{Builder, TypeError};
pub use emit::{emit, emit_text, EmitError, EmitFormat};
pub use ir::*;
pub use lower::{lower, ArgRole, LowerError, LowerOptions, Lowered, WeightsMode};
pub use types::{ElemType, TensorType};
