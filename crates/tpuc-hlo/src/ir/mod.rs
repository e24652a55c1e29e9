//! tpuc's StableHLO IR: one `main` function of ops in SSA form, its types and attributes as Rust
//! values. Builders compute every result type from the op's typing rule and refuse ill-typed
//! ops; functions change only through builders and checked edits; the verifier checks the
//! invariants between passes.

mod attrs;
mod builder;
mod func;
mod literal;
mod ops;
mod print;
#[cfg(test)]
mod region_tests;
mod types;
mod typing;
mod verify;

pub use attrs::*;
pub use builder::{BuildResult, Builder, Rewriter, TypeError};
pub use func::{Callees, Func, Module, Op};
pub use literal::{
    f32_to_bf16_bits, f32_to_f16_bits, reduction_identity, scalar_bytes, scalar_text,
};
pub use ops::*;
pub use print::print;
pub use types::{element_spelling, TensorType};
pub use typing::infer;
pub use verify::{check_sharding, verify, VerifyError};

pub use tpuc_dtype::DType;
