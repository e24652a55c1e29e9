//! Raw bindings of the PJRT C API, written for tpuc from the API's definition at version 0.106.
//!
//! Only what tpuc calls is typed; the rest of the function table is kept as untyped slots so the
//! table's layout matches. Every argument struct starts with `struct_size` and
//! `extension_start`; [`Args::new`] zero-initialises one and sets its size, as the ABI requires
//! (a plugin refuses structs smaller than its own, and accepts larger ones).
//!
//! The plugin may be older or newer than 0.106: [`Functions::from_api`] checks that the plugin's
//! table is long enough to hold every function tpuc calls, and that none of them is null.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_int};

mod args;
mod functions;

pub use args::*;
pub use functions::*;

/// The API version these bindings were written for.
pub const PJRT_API_MAJOR: c_int = 0;
pub const PJRT_API_MINOR: c_int = 106;

/// Opaque objects owned by the plugin.
macro_rules! opaque {
    ($($name:ident),* $(,)?) => {
        $(
            #[repr(C)]
            pub struct $name {
                _private: [u8; 0],
            }
        )*
    };
}
opaque!(
    PJRT_Error,
    PJRT_Event,
    PJRT_Client,
    PJRT_Device,
    PJRT_DeviceDescription,
    PJRT_Memory,
    PJRT_Executable,
    PJRT_LoadedExecutable,
    PJRT_Buffer,
    PJRT_ExecuteContext,
    PJRT_SerializedExecutable,
    PJRT_SendCallbackInfo,
    PJRT_RecvCallbackInfo,
    PJRT_MultiSlice_Config,
    PJRT_Buffer_MemoryLayout,
);

pub type PJRT_Error_Code = c_int;
pub const PJRT_Error_Code_OK: PJRT_Error_Code = 0;
pub const PJRT_Error_Code_CANCELLED: PJRT_Error_Code = 1;
pub const PJRT_Error_Code_UNKNOWN: PJRT_Error_Code = 2;
pub const PJRT_Error_Code_INVALID_ARGUMENT: PJRT_Error_Code = 3;
pub const PJRT_Error_Code_DEADLINE_EXCEEDED: PJRT_Error_Code = 4;
pub const PJRT_Error_Code_NOT_FOUND: PJRT_Error_Code = 5;
pub const PJRT_Error_Code_ALREADY_EXISTS: PJRT_Error_Code = 6;
pub const PJRT_Error_Code_PERMISSION_DENIED: PJRT_Error_Code = 7;
pub const PJRT_Error_Code_RESOURCE_EXHAUSTED: PJRT_Error_Code = 8;
pub const PJRT_Error_Code_FAILED_PRECONDITION: PJRT_Error_Code = 9;
pub const PJRT_Error_Code_ABORTED: PJRT_Error_Code = 10;
pub const PJRT_Error_Code_OUT_OF_RANGE: PJRT_Error_Code = 11;
pub const PJRT_Error_Code_UNIMPLEMENTED: PJRT_Error_Code = 12;
pub const PJRT_Error_Code_INTERNAL: PJRT_Error_Code = 13;
pub const PJRT_Error_Code_UNAVAILABLE: PJRT_Error_Code = 14;
pub const PJRT_Error_Code_DATA_LOSS: PJRT_Error_Code = 15;
pub const PJRT_Error_Code_UNAUTHENTICATED: PJRT_Error_Code = 16;

pub type PJRT_NamedValue_Type = c_int;
pub const PJRT_NamedValue_kString: PJRT_NamedValue_Type = 0;
pub const PJRT_NamedValue_kInt64: PJRT_NamedValue_Type = 1;
pub const PJRT_NamedValue_kInt64List: PJRT_NamedValue_Type = 2;
pub const PJRT_NamedValue_kFloat: PJRT_NamedValue_Type = 3;
pub const PJRT_NamedValue_kBool: PJRT_NamedValue_Type = 4;

pub type PJRT_Buffer_Type = c_int;
pub const PJRT_Buffer_Type_INVALID: PJRT_Buffer_Type = 0;
pub const PJRT_Buffer_Type_PRED: PJRT_Buffer_Type = 1;
pub const PJRT_Buffer_Type_S8: PJRT_Buffer_Type = 2;
pub const PJRT_Buffer_Type_S16: PJRT_Buffer_Type = 3;
pub const PJRT_Buffer_Type_S32: PJRT_Buffer_Type = 4;
pub const PJRT_Buffer_Type_S64: PJRT_Buffer_Type = 5;
pub const PJRT_Buffer_Type_U8: PJRT_Buffer_Type = 6;
pub const PJRT_Buffer_Type_U16: PJRT_Buffer_Type = 7;
pub const PJRT_Buffer_Type_U32: PJRT_Buffer_Type = 8;
pub const PJRT_Buffer_Type_U64: PJRT_Buffer_Type = 9;
pub const PJRT_Buffer_Type_F16: PJRT_Buffer_Type = 10;
pub const PJRT_Buffer_Type_F32: PJRT_Buffer_Type = 11;
pub const PJRT_Buffer_Type_F64: PJRT_Buffer_Type = 12;
pub const PJRT_Buffer_Type_BF16: PJRT_Buffer_Type = 13;
pub const PJRT_Buffer_Type_C64: PJRT_Buffer_Type = 14;
pub const PJRT_Buffer_Type_C128: PJRT_Buffer_Type = 15;
pub const PJRT_Buffer_Type_F8E5M2: PJRT_Buffer_Type = 16;
pub const PJRT_Buffer_Type_F8E4M3FN: PJRT_Buffer_Type = 17;

pub type PJRT_HostBufferSemantics = c_int;
pub const PJRT_HostBufferSemantics_kImmutableOnlyDuringCall: PJRT_HostBufferSemantics = 0;
pub const PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes: PJRT_HostBufferSemantics = 1;
pub const PJRT_HostBufferSemantics_kImmutableZeroCopy: PJRT_HostBufferSemantics = 2;
pub const PJRT_HostBufferSemantics_kMutableZeroCopy: PJRT_HostBufferSemantics = 3;

pub type PJRT_Extension_Type = c_int;
pub const PJRT_Extension_Type_Shardings: PJRT_Extension_Type = 19;

/// Head of the chain of extensions a plugin advertises in `PJRT_Api.extension_start`.
#[repr(C)]
#[derive(Debug)]
pub struct PJRT_Extension_Base {
    pub struct_size: usize,
    pub type_: PJRT_Extension_Type,
    pub next: *mut PJRT_Extension_Base,
}

/// The shardings extension: an executable's parameter and output shardings. Either function may
/// be null.
#[repr(C)]
pub struct PJRT_Shardings_Extension {
    pub base: PJRT_Extension_Base,
    pub PJRT_Shardings_PJRT_Executable_ParameterShardings: Unused,
    pub PJRT_Shardings_PJRT_Executable_OutputShardings: Option<
        unsafe extern "C" fn(
            args: *mut PJRT_Shardings_PJRT_Executable_OutputShardings_Args,
        ) -> *mut PJRT_Error,
    >,
}

impl Layout for PJRT_Shardings_Extension {
    const NAME: &'static str = "PJRT_Shardings_Extension";
    const SIZE: usize = std::mem::size_of::<PJRT_Shardings_Extension>();
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("base", std::mem::offset_of!(PJRT_Shardings_Extension, base)),
        (
            "PJRT_Shardings_PJRT_Executable_ParameterShardings",
            std::mem::offset_of!(
                PJRT_Shardings_Extension,
                PJRT_Shardings_PJRT_Executable_ParameterShardings
            ),
        ),
        (
            "PJRT_Shardings_PJRT_Executable_OutputShardings",
            std::mem::offset_of!(
                PJRT_Shardings_Extension,
                PJRT_Shardings_PJRT_Executable_OutputShardings
            ),
        ),
    ];
}

/// The value of a [`PJRT_NamedValue`]; which member is live is given by its `type_`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

/// Frees the storage behind a serialized executable.
pub type PJRT_SerializedExecutable_Deleter =
    Option<unsafe extern "C" fn(exec: *mut PJRT_SerializedExecutable)>;

/// A function-table slot tpuc does not call.
pub type Unused = Option<unsafe extern "C" fn()>;

/// Signature of `GetPjrtApi`, the one symbol a plugin exports.
pub type GetPjrtApiFn = unsafe extern "C" fn() -> *const PJRT_Api;

/// Field names and byte offsets of a `#[repr(C)]` struct, for layout tests.
pub trait Layout {
    const NAME: &'static str;
    const SIZE: usize;
    const FIELDS: &'static [(&'static str, usize)];
}
