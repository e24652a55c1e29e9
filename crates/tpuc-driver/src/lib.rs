//! tpuc's compile pipeline, the one path from a program to an executable that the CLI and the
//! Python extension both take:
//!
//! ```text
//! Source ─ read ─ specialise ─ lower ─ passes::pipeline() ─ emit ─ PJRT compile
//!   (.pt2 / .fx / JSON)          (tpuc-hlo)               (tpuc-emit) (tpuc-pjrt, on-disk cache)
//! ```
//!
//! A [`Target`] is a plugin's client, described once ([`TargetInfo`]: platform, devices, what
//! the plugin needs). [`Target::compile`] keeps what it compiled in an in-process cache keyed
//! before lowering, so compiling the same graph again costs neither lowering nor emission;
//! beneath it, the on-disk cache of `tpuc-pjrt` spares later processes XLA's compilation.
//! [`emit`] stops after emission, for `tpuc compile`, which needs no plugin.
//!
//! What a compiled module's arguments and results stand for is its
//! [`tpuc_hlo::Signature`]; [`InputSpec`] describes each user input as the caller must pass it.

mod buckets;
mod cache;
mod compile;
pub mod doctor;
mod error;
pub mod layout;
mod loaded;
pub mod model;
mod result_layouts;
mod source;
mod target;

pub use buckets::{CallSizes, Padded};
pub use compile::{
    emit, shard_layout, CacheReport, Compiled, Emitted, Hoist, InputSpec, Options,
    PreparedExecutable, Timings,
};
pub use error::{Error, Result};
pub use loaded::{Call, DeviceValue, HostValue, Input, Loaded, Outputs};
pub use model::{emit_file, RunOptions};
pub use source::{OwnedSource, Source};
pub use target::{Target, TargetInfo};
pub use tpuc_fx::buckets::Buckets;

pub use tpuc_emit::EmitFormat;
pub use tpuc_hlo::ir::{KernelLayout, Mesh, Precision, ShardingDialect};
pub use tpuc_hlo::passes::Fusion;
pub use tpuc_hlo::plan::{Plan, ReadyPlan, Rule};
pub use tpuc_hlo::{ArgRole, LowerOptions, ResultRole, Signature, WeightsMode};
pub use tpuc_pjrt::{CacheOutcome, DType};
