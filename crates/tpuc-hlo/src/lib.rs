//! tpuc's middle: a typed StableHLO IR (`ir`), the lowering of ATen graphs into it (`lower`),
//! the passes over it (`passes`), the signature a compiled module presents to whoever runs it,
//! and sharding plans (`plan`). Nothing here links MLIR: `tpuc-emit` spells the IR as MLIR.

pub mod cost;
pub mod ir;
pub mod lower;
pub mod passes;
pub mod plan;
pub mod signature;

pub use ir::{DType, Module, TensorType};
pub use lower::{lower, LowerError, LowerOptions, Lowered, ProcessGroups, WeightsMode};
pub use passes::{pipeline, PipelineOptions, Pipelined};
pub use signature::{ArgRole, ResultRole, Signature};
