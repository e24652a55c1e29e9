//! tpuc's PJRT runtime: a safe layer over the PJRT C API ([`pjrt_sys`]).
//!
//! Ownership follows PJRT's: a [`Client`] owns devices and memories; [`Buffer`]s and
//! [`Executable`]s keep their client alive, and each PJRT object is destroyed exactly once, when
//! its Rust owner drops. Errors from the plugin become [`Error::Pjrt`] with the plugin's code and
//! message.
//!
//! ```no_run
//! use tpuc_pjrt::{Client, ClientOptions, CompileOptions, DType, HostTensor, Plugin};
//! let plugin = Plugin::load(&tpuc_pjrt::discover::resolve(Some("cpu"))?)?;
//! let client = Client::new(&plugin, &ClientOptions::default())?;
//! let exe = client.compile_mlir(b"module { func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
//!     return %a : tensor<2xf32> } }", &CompileOptions::single_device())?;
//! let x = HostTensor::from_slice(DType::F32, &[2], &[1.0f32, 2.0])?;
//! let input = client.buffer_from_host(&x, &client.addressable_devices()?[0])?;
//! let out = exe.execute_on_one_device(&[&input])?;
//! assert_eq!(out[0].to_host()?.to_vec::<f32>()?, vec![1.0, 2.0]);
//! # Ok::<(), tpuc_pjrt::Error>(())
//! ```

mod buffer;
mod client;
mod compile_cache;
mod compile_options;
mod device;
pub mod discover;
mod element_type;
mod error;
mod event;
mod executable;
pub mod hlo;
mod host;
mod host_cpu;
mod memory_use;
mod plugin;
mod sharded;
mod stderr_filter;
mod tiling;

/// The XLA protos tpuc writes (compile options) and reads (shardings, optimized programs), from
/// proto/xla.
mod proto {
    include!(concat!(env!("OUT_DIR"), "/tpuc.xla.rs"));
}

pub use buffer::Buffer;
pub use client::{Client, ClientOptions, OptionValue};
pub use compile_cache::{compile_with_cache, CacheOutcome, CacheStats, CompileCache};
pub use compile_options::{CompileOptions, Partitioner};
pub use device::{Device, Memory};
pub use error::{Error, ErrorCode, Result};
pub use executable::{CompiledMemory, Executable};
pub use host::{HostBytes, HostTensor, Scalar};
pub use memory_use::MemoryUse;
pub use plugin::{AttributeValue, Plugin};
pub use sharded::{download_sharded, ShardLayout};
pub use tiling::Tiling;
pub use tpuc_dtype::DType;
