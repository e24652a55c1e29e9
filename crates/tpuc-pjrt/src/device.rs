//! Devices and memories of a client. Both are owned by the client and stay valid while it lives.
use crate::client::ClientInner;
use crate::error::Result;
use crate::plugin::{pjrt_call, raw_slice, string_from};
use pjrt_sys::*;
use std::fmt;
use std::sync::Arc;

/// A device of a client.
#[derive(Clone)]
pub struct Device {
    pub(crate) raw: *mut PJRT_Device,
    pub(crate) client: Arc<ClientInner>,
}

// SAFETY: a device handle is an immutable pointer into the client, which is thread-safe.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    /// The bytes of the buffers alive on this device, and the most there were (see
    /// [`crate::MemoryUse`]).
    pub fn memory_use(&self) -> crate::MemoryUse {
        self.client.memory.get(self.raw as usize)
    }

    /// Starts the peak of [`Device::memory_use`] again from what is allocated now.
    pub fn reset_peak_memory(&self) {
        self.client.memory.reset_peak(self.raw as usize)
    }

    fn description(&self) -> Result<*mut PJRT_DeviceDescription> {
        let mut args = PJRT_Device_GetDescription_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Device_GetDescription, &mut args)?;
        Ok(args.device_description)
    }

    /// The device's global id.
    pub fn id(&self) -> Result<i32> {
        let mut args = PJRT_DeviceDescription_Id_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(self.client.plugin, PJRT_DeviceDescription_Id, &mut args)?;
        Ok(args.id)
    }

    /// The index of the process that owns the device.
    pub fn process_index(&self) -> Result<i32> {
        let mut args = PJRT_DeviceDescription_ProcessIndex_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(
            self.client.plugin,
            PJRT_DeviceDescription_ProcessIndex,
            &mut args
        )?;
        Ok(args.process_index)
    }

    /// The kind of device (`cpu`, a TPU generation, a GPU model).
    pub fn kind(&self) -> Result<String> {
        let mut args = PJRT_DeviceDescription_Kind_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(self.client.plugin, PJRT_DeviceDescription_Kind, &mut args)?;
        // SAFETY: the string lives as long as the description.
        Ok(unsafe { string_from(args.device_kind, args.device_kind_size) })
    }

    /// A short description of the device for logs.
    pub fn debug_string(&self) -> Result<String> {
        let mut args = PJRT_DeviceDescription_DebugString_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(
            self.client.plugin,
            PJRT_DeviceDescription_DebugString,
            &mut args
        )?;
        // SAFETY: the string lives as long as the description.
        Ok(unsafe { string_from(args.debug_string, args.debug_string_size) })
    }

    pub fn is_addressable(&self) -> Result<bool> {
        let mut args = PJRT_Device_IsAddressable_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Device_IsAddressable, &mut args)?;
        Ok(args.is_addressable)
    }

    pub fn local_hardware_id(&self) -> Result<i32> {
        let mut args = PJRT_Device_LocalHardwareId_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Device_LocalHardwareId, &mut args)?;
        Ok(args.local_hardware_id)
    }

    /// The memories this device can address.
    pub fn memories(&self) -> Result<Vec<Memory>> {
        let mut args = PJRT_Device_AddressableMemories_Args::new();
        args.device = self.raw;
        pjrt_call!(
            self.client.plugin,
            PJRT_Device_AddressableMemories,
            &mut args
        )?;
        // SAFETY: the array is owned by the client.
        let raws = unsafe { raw_slice(args.memories, args.num_memories) };
        Ok(raws
            .iter()
            .map(|&raw| Memory::new(raw, &self.client))
            .collect())
    }

    /// The most memory the plugin lets a program allocate on the device, in bytes, where its
    /// allocator reports a limit (accelerators do; XLA's CPU plugin does not: None).
    pub fn memory_limit(&self) -> Option<u64> {
        let mut args = PJRT_Device_MemoryStats_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Device_MemoryStats, &mut args).ok()?;
        if !args.bytes_limit_is_set {
            return None;
        }
        u64::try_from(args.bytes_limit).ok().filter(|&b| b > 0)
    }

    /// The memory buffers go to by default.
    pub fn default_memory(&self) -> Result<Memory> {
        let mut args = PJRT_Device_DefaultMemory_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Device_DefaultMemory, &mut args)?;
        Ok(Memory::new(args.memory, &self.client))
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.debug_string() {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "Device({:p})", self.raw),
        }
    }
}

/// A memory space (device memory, pinned host memory, ...).
#[derive(Clone)]
pub struct Memory {
    pub(crate) raw: *mut PJRT_Memory,
    client: Arc<ClientInner>,
}

// SAFETY: as for `Device`.
unsafe impl Send for Memory {}
unsafe impl Sync for Memory {}

impl Memory {
    pub(crate) fn new(raw: *mut PJRT_Memory, client: &Arc<ClientInner>) -> Self {
        Memory {
            raw,
            client: client.clone(),
        }
    }

    pub fn id(&self) -> Result<i32> {
        let mut args = PJRT_Memory_Id_Args::new();
        args.memory = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Memory_Id, &mut args)?;
        Ok(args.id)
    }

    /// The kind of memory (`device`, `pinned_host`, `unpinned_host`).
    pub fn kind(&self) -> Result<String> {
        let mut args = PJRT_Memory_Kind_Args::new();
        args.memory = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Memory_Kind, &mut args)?;
        // SAFETY: the string lives as long as the memory.
        Ok(unsafe { string_from(args.kind, args.kind_size) })
    }

    pub fn debug_string(&self) -> Result<String> {
        let mut args = PJRT_Memory_DebugString_Args::new();
        args.memory = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Memory_DebugString, &mut args)?;
        // SAFETY: the string lives as long as the memory.
        Ok(unsafe { string_from(args.debug_string, args.debug_string_size) })
    }
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.debug_string() {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "Memory({:p})", self.raw),
        }
    }
}
