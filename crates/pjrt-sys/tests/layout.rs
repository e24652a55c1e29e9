//! The layouts of our bindings against the C header of PJRT API 0.106.
//!
//! `layout_0_106.txt` holds, for each struct we define, its size and the offset of each field as
//! a C compiler computed them from the header (`tools/pjrt_layout.py` regenerates it).
use pjrt_sys::*;

fn rust_layout<T: Layout>() -> String {
    let mut line = format!("{} size={}", T::NAME, T::SIZE);
    for (field, offset) in T::FIELDS {
        line += &format!(" {}={offset}", c_field_name(field));
    }
    line
}

/// The header's name for a field: `type` is a Rust keyword, and the anonymous union of
/// `PJRT_NamedValue` is named `value` here (its members all sit at the union's offset).
fn c_field_name(field: &str) -> &str {
    match field {
        "type_" => "type",
        "value" => "string_value",
        other => other,
    }
}

macro_rules! layouts {
    ($($ty:ty),* $(,)?) => { vec![$(rust_layout::<$ty>()),*] };
}

#[test]
fn layouts_match_the_c_header() {
    let ours = layouts![
        PJRT_Api,
        PJRT_Api_Version,
        PJRT_NamedValue,
        PJRT_Error_Destroy_Args,
        PJRT_Error_Message_Args,
        PJRT_Error_GetCode_Args,
        PJRT_Plugin_Initialize_Args,
        PJRT_Plugin_Attributes_Args,
        PJRT_Event_Destroy_Args,
        PJRT_Event_IsReady_Args,
        PJRT_Event_Error_Args,
        PJRT_Event_Await_Args,
        PJRT_Client_Create_Args,
        PJRT_Client_Destroy_Args,
        PJRT_Client_PlatformName_Args,
        PJRT_Client_ProcessIndex_Args,
        PJRT_Client_PlatformVersion_Args,
        PJRT_Client_Devices_Args,
        PJRT_Client_AddressableDevices_Args,
        PJRT_Client_AddressableMemories_Args,
        PJRT_Program,
        PJRT_Client_Compile_Args,
        PJRT_Client_BufferFromHostBuffer_Args,
        PJRT_DeviceDescription_Id_Args,
        PJRT_DeviceDescription_ProcessIndex_Args,
        PJRT_DeviceDescription_Kind_Args,
        PJRT_DeviceDescription_DebugString_Args,
        PJRT_Device_GetDescription_Args,
        PJRT_Device_IsAddressable_Args,
        PJRT_Device_LocalHardwareId_Args,
        PJRT_Device_AddressableMemories_Args,
        PJRT_Device_DefaultMemory_Args,
        PJRT_Memory_Id_Args,
        PJRT_Memory_Kind_Args,
        PJRT_Memory_DebugString_Args,
        PJRT_Executable_Destroy_Args,
        PJRT_LoadedExecutable_Destroy_Args,
        PJRT_LoadedExecutable_GetExecutable_Args,
        PJRT_Executable_Name_Args,
        PJRT_Executable_NumReplicas_Args,
        PJRT_Executable_NumPartitions_Args,
        PJRT_Executable_NumOutputs_Args,
        PJRT_Executable_OutputElementTypes_Args,
        PJRT_Executable_OutputDimensions_Args,
        PJRT_Executable_OptimizedProgram_Args,
        PJRT_Executable_GetCostAnalysis_Args,
        PJRT_Executable_GetCompiledMemoryStats_Args,
        PJRT_Device_MemoryStats_Args,
        PJRT_Shardings_Extension,
        PJRT_Shardings_PJRT_Executable_OutputShardings_Args,
        PJRT_Executable_Serialize_Args,
        PJRT_Executable_DeserializeAndLoad_Args,
        PJRT_LoadedExecutable_AddressableDevices_Args,
        PJRT_ExecuteOptions,
        PJRT_LoadedExecutable_Execute_Args,
        PJRT_Buffer_Destroy_Args,
        PJRT_Buffer_ElementType_Args,
        PJRT_Buffer_Dimensions_Args,
        PJRT_Buffer_ToHostBuffer_Args,
        PJRT_Buffer_OnDeviceSizeInBytes_Args,
        PJRT_Buffer_Device_Args,
        PJRT_Buffer_ReadyEvent_Args,
        PJRT_Buffer_UnsafePointer_Args,
    ];
    if let Ok(path) = std::env::var("PJRT_LAYOUT_DUMP") {
        std::fs::write(path, ours.join("\n") + "\n").expect("write the layout dump");
    }
    let expected: Vec<&str> = include_str!("layout_0_106.txt").lines().collect();
    let mismatches: Vec<String> = ours
        .iter()
        .filter(|line| !expected.contains(&line.as_str()))
        .cloned()
        .collect();
    assert!(
        mismatches.is_empty() && ours.len() == expected.len(),
        "{} of {} structs differ from the C header ({} recorded); ours:\n{}",
        mismatches.len(),
        ours.len(),
        expected.len(),
        mismatches.join("\n")
    );
}

#[test]
fn api_table_is_the_size_of_api_0_106() {
    // The size the CPU plugin reports for its table at 0.106.
    assert_eq!(std::mem::size_of::<PJRT_Api>(), 1128);
}

#[test]
fn args_carry_their_size() {
    let args = PJRT_Client_Create_Args::new();
    assert_eq!(
        args.struct_size,
        std::mem::size_of::<PJRT_Client_Create_Args>()
    );
    assert!(args.client.is_null());
}

unsafe extern "C" fn placeholder() {}

/// A table that ends before `PJRT_Client_Create` (as an older plugin's would) is refused, and
/// the functions it lacks are named; a null slot counts as missing too.
#[test]
fn short_or_incomplete_tables_name_the_missing_functions() {
    // SAFETY: all-zero is a valid PJRT_Api (null slots).
    let mut api: PJRT_Api = unsafe { std::mem::zeroed() };
    api.PJRT_Error_Destroy = Some(placeholder);
    api.PJRT_Error_Message = Some(placeholder);
    api.PJRT_Error_GetCode = Some(placeholder);
    api.PJRT_Plugin_Initialize = Some(placeholder);
    api.PJRT_Plugin_Attributes = Some(placeholder);
    api.PJRT_Event_Destroy = Some(placeholder);
    api.PJRT_Event_IsReady = Some(placeholder);
    api.PJRT_Event_Error = Some(placeholder);
    api.PJRT_Event_Await = Some(placeholder);
    api.struct_size = std::mem::offset_of!(PJRT_Api, PJRT_Client_Create);
    // SAFETY: `api` is live and its struct_size bounds what is read.
    let missing = unsafe { Functions::from_api(&api) }
        .err()
        .expect("an incomplete table");
    assert_eq!(missing[0], "PJRT_Client_Create");
    assert!(missing.contains(&"PJRT_LoadedExecutable_Execute"));
    assert!(!missing.contains(&"PJRT_Event_Await"));

    api.struct_size = std::mem::size_of::<PJRT_Api>();
    api.PJRT_Event_Await = None;
    let missing = unsafe { Functions::from_api(&api) }
        .err()
        .expect("a null slot");
    assert!(missing.contains(&"PJRT_Event_Await"));
}

/// A plugin refuses structs smaller than its own, and reads fields a caller did not set: every
/// argument struct starts with its own size and all else zero.
#[test]
fn argument_structs_start_zeroed_with_their_size() {
    let args = PJRT_Client_Create_Args::new();
    assert_eq!(
        args.struct_size,
        std::mem::size_of::<PJRT_Client_Create_Args>()
    );
    assert!(args.extension_start.is_null());
    assert_eq!(args.num_options, 0);
    assert!(args.client.is_null());
    let named = PJRT_NamedValue::new();
    assert_eq!(named.struct_size, std::mem::size_of::<PJRT_NamedValue>());
    assert_eq!((named.name_size, named.value_size), (0, 0));
}
