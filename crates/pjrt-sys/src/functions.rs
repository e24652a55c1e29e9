//! The PJRT function table (`PJRT_Api`) and the typed subset tpuc calls.
use crate::*;

macro_rules! api_table {
    ($($slot:ident),* $(,)?) => {
        /// The table `GetPjrtApi` returns, slot for slot as in API 0.106. A plugin built against
        /// an older API has a shorter table: read a slot only below `struct_size`.
        #[repr(C)]
        pub struct PJRT_Api {
            pub struct_size: usize,
            pub extension_start: *mut PJRT_Extension_Base,
            pub pjrt_api_version: PJRT_Api_Version,
            $(pub $slot: Unused,)*
        }

        impl Layout for PJRT_Api {
            const NAME: &'static str = "PJRT_Api";
            const SIZE: usize = std::mem::size_of::<PJRT_Api>();
            const FIELDS: &'static [(&'static str, usize)] = &[
                ("struct_size", std::mem::offset_of!(PJRT_Api, struct_size)),
                ("extension_start", std::mem::offset_of!(PJRT_Api, extension_start)),
                ("pjrt_api_version", std::mem::offset_of!(PJRT_Api, pjrt_api_version)),
                $((stringify!($slot), std::mem::offset_of!(PJRT_Api, $slot)),)*
            ];
        }
    };
}

api_table!(
    PJRT_Error_Destroy,
    PJRT_Error_Message,
    PJRT_Error_GetCode,
    PJRT_Plugin_Initialize,
    PJRT_Plugin_Attributes,
    PJRT_Event_Destroy,
    PJRT_Event_IsReady,
    PJRT_Event_Error,
    PJRT_Event_Await,
    PJRT_Event_OnReady,
    PJRT_Client_Create,
    PJRT_Client_Destroy,
    PJRT_Client_PlatformName,
    PJRT_Client_ProcessIndex,
    PJRT_Client_PlatformVersion,
    PJRT_Client_Devices,
    PJRT_Client_AddressableDevices,
    PJRT_Client_LookupDevice,
    PJRT_Client_LookupAddressableDevice,
    PJRT_Client_AddressableMemories,
    PJRT_Client_Compile,
    PJRT_Client_DefaultDeviceAssignment,
    PJRT_Client_BufferFromHostBuffer,
    PJRT_DeviceDescription_Id,
    PJRT_DeviceDescription_ProcessIndex,
    PJRT_DeviceDescription_Attributes,
    PJRT_DeviceDescription_Kind,
    PJRT_DeviceDescription_DebugString,
    PJRT_DeviceDescription_ToString,
    PJRT_Device_GetDescription,
    PJRT_Device_IsAddressable,
    PJRT_Device_LocalHardwareId,
    PJRT_Device_AddressableMemories,
    PJRT_Device_DefaultMemory,
    PJRT_Device_MemoryStats,
    PJRT_Memory_Id,
    PJRT_Memory_Kind,
    PJRT_Memory_DebugString,
    PJRT_Memory_ToString,
    PJRT_Memory_AddressableByDevices,
    PJRT_Executable_Destroy,
    PJRT_Executable_Name,
    PJRT_Executable_NumReplicas,
    PJRT_Executable_NumPartitions,
    PJRT_Executable_NumOutputs,
    PJRT_Executable_SizeOfGeneratedCodeInBytes,
    PJRT_Executable_GetCostAnalysis,
    PJRT_Executable_OutputMemoryKinds,
    PJRT_Executable_OptimizedProgram,
    PJRT_Executable_Serialize,
    PJRT_LoadedExecutable_Destroy,
    PJRT_LoadedExecutable_GetExecutable,
    PJRT_LoadedExecutable_AddressableDevices,
    PJRT_LoadedExecutable_Delete,
    PJRT_LoadedExecutable_IsDeleted,
    PJRT_LoadedExecutable_Execute,
    PJRT_Executable_DeserializeAndLoad,
    PJRT_LoadedExecutable_Fingerprint,
    PJRT_Buffer_Destroy,
    PJRT_Buffer_ElementType,
    PJRT_Buffer_Dimensions,
    PJRT_Buffer_UnpaddedDimensions,
    PJRT_Buffer_DynamicDimensionIndices,
    PJRT_Buffer_GetMemoryLayout,
    PJRT_Buffer_OnDeviceSizeInBytes,
    PJRT_Buffer_Device,
    PJRT_Buffer_Memory,
    PJRT_Buffer_Delete,
    PJRT_Buffer_IsDeleted,
    PJRT_Buffer_CopyToDevice,
    PJRT_Buffer_ToHostBuffer,
    PJRT_Buffer_IsOnCpu,
    PJRT_Buffer_ReadyEvent,
    PJRT_Buffer_UnsafePointer,
    PJRT_Buffer_IncreaseExternalReferenceCount,
    PJRT_Buffer_DecreaseExternalReferenceCount,
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer,
    PJRT_CopyToDeviceStream_Destroy,
    PJRT_CopyToDeviceStream_AddChunk,
    PJRT_CopyToDeviceStream_TotalBytes,
    PJRT_CopyToDeviceStream_GranuleSize,
    PJRT_CopyToDeviceStream_CurrentBytes,
    PJRT_TopologyDescription_Create,
    PJRT_TopologyDescription_Destroy,
    PJRT_TopologyDescription_PlatformName,
    PJRT_TopologyDescription_PlatformVersion,
    PJRT_TopologyDescription_GetDeviceDescriptions,
    PJRT_TopologyDescription_Serialize,
    PJRT_TopologyDescription_Attributes,
    PJRT_Compile,
    PJRT_Executable_OutputElementTypes,
    PJRT_Executable_OutputDimensions,
    PJRT_Buffer_CopyToMemory,
    PJRT_Client_CreateViewOfDeviceBuffer,
    PJRT_Executable_Fingerprint,
    PJRT_Client_TopologyDescription,
    PJRT_Executable_GetCompiledMemoryStats,
    PJRT_Memory_Kind_Id,
    PJRT_ExecuteContext_Create,
    PJRT_ExecuteContext_Destroy,
    PJRT_Buffer_CopyRawToHost,
    PJRT_AsyncHostToDeviceTransferManager_Destroy,
    PJRT_AsyncHostToDeviceTransferManager_TransferData,
    PJRT_Client_CreateBuffersForAsyncHostToDevice,
    PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer,
    PJRT_AsyncHostToDeviceTransferManager_Device,
    PJRT_AsyncHostToDeviceTransferManager_BufferCount,
    PJRT_AsyncHostToDeviceTransferManager_BufferSize,
    PJRT_AsyncHostToDeviceTransferManager_SetBufferError,
    PJRT_AsyncHostToDeviceTransferManager_AddMetadata,
    PJRT_Client_DmaMap,
    PJRT_Client_DmaUnmap,
    PJRT_Client_CreateUninitializedBuffer,
    PJRT_Client_UpdateGlobalProcessInfo,
    PJRT_TopologyDescription_Deserialize,
    PJRT_Client_CreateAliasBuffer,
    PJRT_Client_FulfillAliasBuffer,
    PJRT_LoadedExecutable_GetDeviceAssignment,
    PJRT_Client_CreateErrorBuffer,
    PJRT_AsyncHostToDeviceTransferManager_TransferLiteral,
    PJRT_Buffer_CopyRawToHostFuture,
    PJRT_Device_PoisonExecution,
    PJRT_Device_CreateAsyncTrackingEvent,
    PJRT_AsyncTrackingEvent_Destroy,
    PJRT_Executable_GetCompileOptions,
    PJRT_Buffer_DonateWithControlDependency,
    PJRT_Event_Create,
    PJRT_Event_Set,
    PJRT_Device_GetAttributes,
    PJRT_Client_Load,
    PJRT_LoadedExecutable_AddressableDeviceLogicalIds,
    PJRT_Buffer_Bitcast,
    PJRT_Error_ForEachPayload,
    PJRT_TopologyDescription_Fingerprint,
    PJRT_Executable_ParameterMemoryKinds,
    PJRT_Device_ClearMemoryStats,
);

macro_rules! functions {
    ($($name:ident($args:ty) $(-> $ret:ty)?;)*) => {
        /// The functions tpuc calls, typed, read from a plugin's table after checking that each
        /// one is present.
        #[derive(Clone, Copy)]
        pub struct Functions {
            $(pub $name: unsafe extern "C" fn(*mut $args) $(-> $ret)?,)*
        }

        impl Functions {
            /// Reads the functions tpuc calls from a plugin's table. Returns the names of those
            /// the table lacks (beyond its `struct_size`, or null).
            ///
            /// # Safety
            /// `api` must point to a live `PJRT_Api` whose `struct_size` is truthful.
            pub unsafe fn from_api(api: *const PJRT_Api) -> Result<Self, Vec<&'static str>> {
                let table_size = unsafe { (*api).struct_size };
                let mut missing = Vec::new();
                $(
                    let end = std::mem::offset_of!(PJRT_Api, $name) + std::mem::size_of::<Unused>();
                    let $name = if end <= table_size { unsafe { (*api).$name } } else { None };
                    if $name.is_none() {
                        missing.push(stringify!($name));
                    }
                )*
                $(let Some($name) = $name else { return Err(missing) };)*
                Ok(Functions {$(
                    // SAFETY: the slot holds this function, whose signature is the header's.
                    $name: unsafe {
                        std::mem::transmute::<
                            unsafe extern "C" fn(),
                            unsafe extern "C" fn(*mut $args) $(-> $ret)?,
                        >($name)
                    },
                )*})
            }
        }
    };
}

functions! {
    PJRT_Error_Destroy(PJRT_Error_Destroy_Args);
    PJRT_Error_Message(PJRT_Error_Message_Args);
    PJRT_Error_GetCode(PJRT_Error_GetCode_Args) -> *mut PJRT_Error;
    PJRT_Plugin_Initialize(PJRT_Plugin_Initialize_Args) -> *mut PJRT_Error;
    PJRT_Plugin_Attributes(PJRT_Plugin_Attributes_Args) -> *mut PJRT_Error;
    PJRT_Event_Destroy(PJRT_Event_Destroy_Args) -> *mut PJRT_Error;
    PJRT_Event_IsReady(PJRT_Event_IsReady_Args) -> *mut PJRT_Error;
    PJRT_Event_Error(PJRT_Event_Error_Args) -> *mut PJRT_Error;
    PJRT_Event_Await(PJRT_Event_Await_Args) -> *mut PJRT_Error;
    PJRT_Client_Create(PJRT_Client_Create_Args) -> *mut PJRT_Error;
    PJRT_Client_Destroy(PJRT_Client_Destroy_Args) -> *mut PJRT_Error;
    PJRT_Client_PlatformName(PJRT_Client_PlatformName_Args) -> *mut PJRT_Error;
    PJRT_Client_PlatformVersion(PJRT_Client_PlatformVersion_Args) -> *mut PJRT_Error;
    PJRT_Client_Devices(PJRT_Client_Devices_Args) -> *mut PJRT_Error;
    PJRT_Client_AddressableDevices(PJRT_Client_AddressableDevices_Args) -> *mut PJRT_Error;
    PJRT_Client_AddressableMemories(PJRT_Client_AddressableMemories_Args) -> *mut PJRT_Error;
    PJRT_Client_Compile(PJRT_Client_Compile_Args) -> *mut PJRT_Error;
    PJRT_Client_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args) -> *mut PJRT_Error;
    PJRT_DeviceDescription_Id(PJRT_DeviceDescription_Id_Args) -> *mut PJRT_Error;
    PJRT_DeviceDescription_ProcessIndex(PJRT_DeviceDescription_ProcessIndex_Args) -> *mut PJRT_Error;
    PJRT_DeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args) -> *mut PJRT_Error;
    PJRT_DeviceDescription_DebugString(PJRT_DeviceDescription_DebugString_Args) -> *mut PJRT_Error;
    PJRT_Device_GetDescription(PJRT_Device_GetDescription_Args) -> *mut PJRT_Error;
    PJRT_Device_IsAddressable(PJRT_Device_IsAddressable_Args) -> *mut PJRT_Error;
    PJRT_Device_LocalHardwareId(PJRT_Device_LocalHardwareId_Args) -> *mut PJRT_Error;
    PJRT_Device_AddressableMemories(PJRT_Device_AddressableMemories_Args) -> *mut PJRT_Error;
    PJRT_Device_DefaultMemory(PJRT_Device_DefaultMemory_Args) -> *mut PJRT_Error;
    PJRT_Device_MemoryStats(PJRT_Device_MemoryStats_Args) -> *mut PJRT_Error;
    PJRT_Memory_Id(PJRT_Memory_Id_Args) -> *mut PJRT_Error;
    PJRT_Memory_Kind(PJRT_Memory_Kind_Args) -> *mut PJRT_Error;
    PJRT_Memory_DebugString(PJRT_Memory_DebugString_Args) -> *mut PJRT_Error;
    PJRT_Executable_Destroy(PJRT_Executable_Destroy_Args) -> *mut PJRT_Error;
    PJRT_Executable_Name(PJRT_Executable_Name_Args) -> *mut PJRT_Error;
    PJRT_Executable_NumReplicas(PJRT_Executable_NumReplicas_Args) -> *mut PJRT_Error;
    PJRT_Executable_NumPartitions(PJRT_Executable_NumPartitions_Args) -> *mut PJRT_Error;
    PJRT_Executable_NumOutputs(PJRT_Executable_NumOutputs_Args) -> *mut PJRT_Error;
    PJRT_Executable_Serialize(PJRT_Executable_Serialize_Args) -> *mut PJRT_Error;
    PJRT_Executable_OutputElementTypes(PJRT_Executable_OutputElementTypes_Args) -> *mut PJRT_Error;
    PJRT_Executable_OutputDimensions(PJRT_Executable_OutputDimensions_Args) -> *mut PJRT_Error;
    PJRT_Executable_GetCompiledMemoryStats(PJRT_Executable_GetCompiledMemoryStats_Args) -> *mut PJRT_Error;
    PJRT_Executable_OptimizedProgram(PJRT_Executable_OptimizedProgram_Args) -> *mut PJRT_Error;
    PJRT_Executable_GetCostAnalysis(PJRT_Executable_GetCostAnalysis_Args) -> *mut PJRT_Error;
    PJRT_LoadedExecutable_Destroy(PJRT_LoadedExecutable_Destroy_Args) -> *mut PJRT_Error;
    PJRT_LoadedExecutable_GetExecutable(PJRT_LoadedExecutable_GetExecutable_Args) -> *mut PJRT_Error;
    PJRT_LoadedExecutable_AddressableDevices(PJRT_LoadedExecutable_AddressableDevices_Args) -> *mut PJRT_Error;
    PJRT_LoadedExecutable_Execute(PJRT_LoadedExecutable_Execute_Args) -> *mut PJRT_Error;
    PJRT_Executable_DeserializeAndLoad(PJRT_Executable_DeserializeAndLoad_Args) -> *mut PJRT_Error;
    PJRT_Buffer_Destroy(PJRT_Buffer_Destroy_Args) -> *mut PJRT_Error;
    PJRT_Buffer_ElementType(PJRT_Buffer_ElementType_Args) -> *mut PJRT_Error;
    PJRT_Buffer_Dimensions(PJRT_Buffer_Dimensions_Args) -> *mut PJRT_Error;
    PJRT_Buffer_OnDeviceSizeInBytes(PJRT_Buffer_OnDeviceSizeInBytes_Args) -> *mut PJRT_Error;
    PJRT_Buffer_Device(PJRT_Buffer_Device_Args) -> *mut PJRT_Error;
    PJRT_Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args) -> *mut PJRT_Error;
    PJRT_Buffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args) -> *mut PJRT_Error;
    PJRT_Buffer_UnsafePointer(PJRT_Buffer_UnsafePointer_Args) -> *mut PJRT_Error;
}
