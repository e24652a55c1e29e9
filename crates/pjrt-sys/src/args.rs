//! Argument structs of the PJRT C API (layouts of API 0.106), in the header's field order.
use crate::*;
use std::ffi::{c_char, c_int, c_void};

/// Structs that begin with `struct_size` and `extension_start`.
pub trait Args: Sized {
    /// A zeroed struct with `struct_size` set; zero is a valid value for every field.
    fn new() -> Self;
}

macro_rules! pjrt_structs {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident { $(pub $field:ident : $ty:ty,)* }
    )*) => {$(
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *mut PJRT_Extension_Base,
            $(pub $field: $ty,)*
        }

        impl Args for $name {
            fn new() -> Self {
                // SAFETY: every field is an integer, a raw pointer, a bool, an Option of a
                // function pointer or a union of those; all-zero bytes are valid for each.
                let mut value: Self = unsafe { std::mem::zeroed() };
                value.struct_size = std::mem::size_of::<Self>();
                value
            }
        }

        impl Layout for $name {
            const NAME: &'static str = stringify!($name);
            const SIZE: usize = std::mem::size_of::<$name>();
            const FIELDS: &'static [(&'static str, usize)] = &[
                ("struct_size", std::mem::offset_of!($name, struct_size)),
                ("extension_start", std::mem::offset_of!($name, extension_start)),
                $((stringify!($field), std::mem::offset_of!($name, $field)),)*
            ];
        }
    )*};
}

pjrt_structs! {
    pub struct PJRT_Api_Version {
        pub major_version: c_int,
        pub minor_version: c_int,
    }

    pub struct PJRT_NamedValue {
        pub name: *const c_char,
        pub name_size: usize,
        pub type_: PJRT_NamedValue_Type,
        pub value: PJRT_NamedValue_Value,
        pub value_size: usize,
    }

    pub struct PJRT_Error_Destroy_Args {
        pub error: *mut PJRT_Error,
    }

    pub struct PJRT_Error_Message_Args {
        pub error: *const PJRT_Error,
        pub message: *const c_char,
        pub message_size: usize,
    }

    pub struct PJRT_Error_GetCode_Args {
        pub error: *const PJRT_Error,
        pub code: PJRT_Error_Code,
    }

    pub struct PJRT_Plugin_Initialize_Args {
    }

    pub struct PJRT_Plugin_Attributes_Args {
        pub attributes: *const PJRT_NamedValue,
        pub num_attributes: usize,
    }

    pub struct PJRT_Event_Destroy_Args {
        pub event: *mut PJRT_Event,
    }

    pub struct PJRT_Event_IsReady_Args {
        pub event: *mut PJRT_Event,
        pub is_ready: bool,
    }

    pub struct PJRT_Event_Error_Args {
        pub event: *mut PJRT_Event,
    }

    pub struct PJRT_Event_Await_Args {
        pub event: *mut PJRT_Event,
    }


    pub struct PJRT_Client_Create_Args {
        pub create_options: *const PJRT_NamedValue,
        pub num_options: usize,
        pub kv_get_callback: Unused,
        pub kv_get_user_arg: *mut c_void,
        pub kv_put_callback: Unused,
        pub kv_put_user_arg: *mut c_void,
        pub client: *mut PJRT_Client,
        pub kv_try_get_callback: Unused,
        pub kv_try_get_user_arg: *mut c_void,
    }

    pub struct PJRT_Client_Destroy_Args {
        pub client: *mut PJRT_Client,
    }

    pub struct PJRT_Client_PlatformName_Args {
        pub client: *mut PJRT_Client,
        pub platform_name: *const c_char,
        pub platform_name_size: usize,
    }

    pub struct PJRT_Client_ProcessIndex_Args {
        pub client: *mut PJRT_Client,
        pub process_index: c_int,
    }

    pub struct PJRT_Client_PlatformVersion_Args {
        pub client: *mut PJRT_Client,
        pub platform_version: *const c_char,
        pub platform_version_size: usize,
    }

    pub struct PJRT_Client_Devices_Args {
        pub client: *mut PJRT_Client,
        pub devices: *const *mut PJRT_Device,
        pub num_devices: usize,
    }

    pub struct PJRT_Client_AddressableDevices_Args {
        pub client: *mut PJRT_Client,
        pub addressable_devices: *const *mut PJRT_Device,
        pub num_addressable_devices: usize,
    }

    pub struct PJRT_Client_AddressableMemories_Args {
        pub client: *mut PJRT_Client,
        pub addressable_memories: *const *mut PJRT_Memory,
        pub num_addressable_memories: usize,
    }

    pub struct PJRT_Program {
        pub code: *mut c_char,
        pub code_size: usize,
        pub format: *const c_char,
        pub format_size: usize,
    }

    pub struct PJRT_Client_Compile_Args {
        pub client: *mut PJRT_Client,
        pub program: *const PJRT_Program,
        pub compile_options: *const c_char,
        pub compile_options_size: usize,
        pub executable: *mut PJRT_LoadedExecutable,
    }

    pub struct PJRT_Client_BufferFromHostBuffer_Args {
        pub client: *mut PJRT_Client,
        pub data: *const c_void,
        pub type_: PJRT_Buffer_Type,
        pub dims: *const i64,
        pub num_dims: usize,
        pub byte_strides: *const i64,
        pub num_byte_strides: usize,
        pub host_buffer_semantics: PJRT_HostBufferSemantics,
        pub device: *mut PJRT_Device,
        pub memory: *mut PJRT_Memory,
        pub device_layout: *mut PJRT_Buffer_MemoryLayout,
        pub done_with_host_buffer: *mut PJRT_Event,
        pub buffer: *mut PJRT_Buffer,
    }

    pub struct PJRT_DeviceDescription_Id_Args {
        pub device_description: *mut PJRT_DeviceDescription,
        pub id: c_int,
    }

    pub struct PJRT_DeviceDescription_ProcessIndex_Args {
        pub device_description: *mut PJRT_DeviceDescription,
        pub process_index: c_int,
    }

    pub struct PJRT_DeviceDescription_Kind_Args {
        pub device_description: *mut PJRT_DeviceDescription,
        pub device_kind: *const c_char,
        pub device_kind_size: usize,
    }

    pub struct PJRT_DeviceDescription_DebugString_Args {
        pub device_description: *mut PJRT_DeviceDescription,
        pub debug_string: *const c_char,
        pub debug_string_size: usize,
    }

    pub struct PJRT_Device_GetDescription_Args {
        pub device: *mut PJRT_Device,
        pub device_description: *mut PJRT_DeviceDescription,
    }

    pub struct PJRT_Device_IsAddressable_Args {
        pub device: *mut PJRT_Device,
        pub is_addressable: bool,
    }

    pub struct PJRT_Device_LocalHardwareId_Args {
        pub device: *mut PJRT_Device,
        pub local_hardware_id: c_int,
    }

    pub struct PJRT_Device_AddressableMemories_Args {
        pub device: *mut PJRT_Device,
        pub memories: *const *mut PJRT_Memory,
        pub num_memories: usize,
    }

    pub struct PJRT_Device_DefaultMemory_Args {
        pub device: *mut PJRT_Device,
        pub memory: *mut PJRT_Memory,
    }

    /// A device's memory as its allocator sees it; each `_is_set` says whether the plugin
    /// reports the field before it (`bytes_in_use` always).
    pub struct PJRT_Device_MemoryStats_Args {
        pub device: *mut PJRT_Device,
        pub bytes_in_use: i64,
        pub peak_bytes_in_use: i64,
        pub peak_bytes_in_use_is_set: bool,
        pub num_allocs: i64,
        pub num_allocs_is_set: bool,
        pub largest_alloc_size: i64,
        pub largest_alloc_size_is_set: bool,
        pub bytes_limit: i64,
        pub bytes_limit_is_set: bool,
        pub bytes_reserved: i64,
        pub bytes_reserved_is_set: bool,
        pub peak_bytes_reserved: i64,
        pub peak_bytes_reserved_is_set: bool,
        pub bytes_reservable_limit: i64,
        pub bytes_reservable_limit_is_set: bool,
        pub largest_free_block_bytes: i64,
        pub largest_free_block_bytes_is_set: bool,
        pub pool_bytes: i64,
        pub pool_bytes_is_set: bool,
        pub peak_pool_bytes: i64,
        pub peak_pool_bytes_is_set: bool,
    }

    pub struct PJRT_Memory_Id_Args {
        pub memory: *mut PJRT_Memory,
        pub id: c_int,
    }

    pub struct PJRT_Memory_Kind_Args {
        pub memory: *mut PJRT_Memory,
        pub kind: *const c_char,
        pub kind_size: usize,
    }

    pub struct PJRT_Memory_DebugString_Args {
        pub memory: *mut PJRT_Memory,
        pub debug_string: *const c_char,
        pub debug_string_size: usize,
    }

    pub struct PJRT_Executable_Destroy_Args {
        pub executable: *mut PJRT_Executable,
    }

    pub struct PJRT_LoadedExecutable_Destroy_Args {
        pub executable: *mut PJRT_LoadedExecutable,
    }

    pub struct PJRT_LoadedExecutable_GetExecutable_Args {
        pub loaded_executable: *mut PJRT_LoadedExecutable,
        pub executable: *mut PJRT_Executable,
    }

    pub struct PJRT_Executable_Name_Args {
        pub executable: *mut PJRT_Executable,
        pub executable_name: *const c_char,
        pub executable_name_size: usize,
    }

    pub struct PJRT_Executable_NumReplicas_Args {
        pub executable: *mut PJRT_Executable,
        pub num_replicas: usize,
    }

    pub struct PJRT_Executable_NumPartitions_Args {
        pub executable: *mut PJRT_Executable,
        pub num_partitions: usize,
    }

    pub struct PJRT_Executable_NumOutputs_Args {
        pub executable: *mut PJRT_Executable,
        pub num_outputs: usize,
    }

    pub struct PJRT_Executable_OutputElementTypes_Args {
        pub executable: *mut PJRT_Executable,
        pub output_types: *mut PJRT_Buffer_Type,
        pub num_output_types: usize,
    }

    /// What XLA's compiled program needs of each device's memory (sizes in bytes), and of the
    /// host's.
    pub struct PJRT_Executable_OptimizedProgram_Args {
        pub executable: *mut PJRT_Executable,
        pub program: *mut PJRT_Program,
    }

    pub struct PJRT_Executable_GetCostAnalysis_Args {
        pub executable: *mut PJRT_Executable,
        pub num_properties: usize,
        pub properties: *const PJRT_NamedValue,
    }

    pub struct PJRT_Executable_GetCompiledMemoryStats_Args {
        pub executable: *mut PJRT_Executable,
        pub generated_code_size_in_bytes: i64,
        pub argument_size_in_bytes: i64,
        pub output_size_in_bytes: i64,
        pub alias_size_in_bytes: i64,
        pub temp_size_in_bytes: i64,
        pub host_generated_code_size_in_bytes: i64,
        pub host_argument_size_in_bytes: i64,
        pub host_output_size_in_bytes: i64,
        pub host_alias_size_in_bytes: i64,
        pub host_temp_size_in_bytes: i64,
        pub peak_memory_in_bytes: i64,
        pub total_size_in_bytes: i64,
    }

    /// The shardings extension's (`pjrt_c_api_shardings_extension.h`) query of an executable's
    /// output shardings: serialized `xla.OpSharding` protos, owned by the executable; both
    /// arrays null when the plugin does not know them.
    pub struct PJRT_Shardings_PJRT_Executable_OutputShardings_Args {
        pub executable: *mut PJRT_Executable,
        pub num_outputs: usize,
        pub shardings: *const *const c_char,
        pub sharding_sizes: *const usize,
    }

    pub struct PJRT_Executable_OutputDimensions_Args {
        pub executable: *mut PJRT_Executable,
        pub num_outputs: usize,
        pub dims: *const i64,
        pub dim_sizes: *const usize,
    }

    pub struct PJRT_Executable_Serialize_Args {
        pub executable: *const PJRT_Executable,
        pub serialized_bytes: *const c_char,
        pub serialized_bytes_size: usize,
        pub serialized_executable: *mut PJRT_SerializedExecutable,
        pub serialized_executable_deleter: PJRT_SerializedExecutable_Deleter,
    }

    pub struct PJRT_Executable_DeserializeAndLoad_Args {
        pub client: *mut PJRT_Client,
        pub serialized_executable: *const c_char,
        pub serialized_executable_size: usize,
        pub loaded_executable: *mut PJRT_LoadedExecutable,
        pub overridden_serialized_compile_options: *const c_char,
        pub overridden_serialized_compile_options_size: usize,
    }

    pub struct PJRT_LoadedExecutable_AddressableDevices_Args {
        pub executable: *mut PJRT_LoadedExecutable,
        pub addressable_devices: *const *mut PJRT_Device,
        pub num_addressable_devices: usize,
    }

    pub struct PJRT_ExecuteOptions {
        pub send_callbacks: *mut *mut PJRT_SendCallbackInfo,
        pub recv_callbacks: *mut *mut PJRT_RecvCallbackInfo,
        pub num_send_ops: usize,
        pub num_recv_ops: usize,
        pub launch_id: c_int,
        pub non_donatable_input_indices: *const i64,
        pub num_non_donatable_input_indices: usize,
        pub context: *mut PJRT_ExecuteContext,
        pub call_location: *const c_char,
        pub num_tasks: usize,
        pub task_ids: *mut c_int,
        pub incarnation_ids: *mut i64,
        pub multi_slice_config: *mut PJRT_MultiSlice_Config,
    }

    pub struct PJRT_LoadedExecutable_Execute_Args {
        pub executable: *mut PJRT_LoadedExecutable,
        pub options: *mut PJRT_ExecuteOptions,
        pub argument_lists: *const *const *mut PJRT_Buffer,
        pub num_devices: usize,
        pub num_args: usize,
        pub output_lists: *const *mut *mut PJRT_Buffer,
        pub device_complete_events: *mut *mut PJRT_Event,
        pub execute_device: *mut PJRT_Device,
    }

    pub struct PJRT_Buffer_Destroy_Args {
        pub buffer: *mut PJRT_Buffer,
    }

    pub struct PJRT_Buffer_ElementType_Args {
        pub buffer: *mut PJRT_Buffer,
        pub type_: PJRT_Buffer_Type,
    }

    pub struct PJRT_Buffer_Dimensions_Args {
        pub buffer: *mut PJRT_Buffer,
        pub dims: *const i64,
        pub num_dims: usize,
    }

    pub struct PJRT_Buffer_ToHostBuffer_Args {
        pub src: *mut PJRT_Buffer,
        pub host_layout: *mut PJRT_Buffer_MemoryLayout,
        pub dst: *mut c_void,
        pub dst_size: usize,
        pub event: *mut PJRT_Event,
    }

    pub struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
        pub buffer: *mut PJRT_Buffer,
        pub on_device_size_in_bytes: usize,
    }

    pub struct PJRT_Buffer_Device_Args {
        pub buffer: *mut PJRT_Buffer,
        pub device: *mut PJRT_Device,
    }

    pub struct PJRT_Buffer_ReadyEvent_Args {
        pub buffer: *mut PJRT_Buffer,
        pub event: *mut PJRT_Event,
    }

    pub struct PJRT_Buffer_UnsafePointer_Args {
        pub buffer: *mut PJRT_Buffer,
        pub buffer_pointer: usize,
    }
}
