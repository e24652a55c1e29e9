//! A PJRT client: devices, host-to-device transfers, compilation.
use crate::buffer::Buffer;
use crate::compile_options::CompileOptions;
use crate::device::{Device, Memory};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::executable::Executable;
use crate::host::{element_count, HostBytes};
use crate::plugin::{pjrt_call, raw_slice, string_from, Plugin};
use crate::DType;
use pjrt_sys::*;
use std::collections::VecDeque;
use std::ffi::{c_char, CString};
use std::sync::{Arc, Mutex};

/// Options for creating a client. The CPU plugin ignores names it does not know; others (libtpu)
/// refuse them, so pass only what the plugin takes.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Number of devices of the CPU plugin (default 4 on the project's machines). Only the CPU
    /// plugin takes this option.
    pub cpu_device_count: Option<i64>,
    /// Further plugin-specific options.
    pub extra: Vec<(String, OptionValue)>,
}

#[derive(Debug, Clone)]
pub enum OptionValue {
    String(String),
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
    Bool(bool),
}

/// The PJRT client and the plugin that made it; buffers and executables hold it alive.
pub(crate) struct ClientInner {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) raw: *mut PJRT_Client,
    /// Executions started and not seen done ([`crate::Executable::launch_on_one_device`]).
    pub(crate) launched: Mutex<Launched>,
    /// The bytes of the buffers alive on each device.
    pub(crate) memory: crate::memory_use::MemoryCounters,
}

/// The completion events of the executions a client started without waiting, oldest first,
/// and the first error one of them ended with that nobody was told of yet.
#[derive(Default)]
pub(crate) struct Launched {
    events: VecDeque<RawEvent>,
    error: Option<Error>,
}

/// An event owned by a client's [`Launched`] list (destroyed by it).
struct RawEvent(*mut PJRT_Event);

// The most executions left running before starting one more waits for the oldest: the queue
// of work (and what it holds) stays bounded.
const MAX_LAUNCHED: usize = 1024;

impl ClientInner {
    /// Records a started execution's completion event; forgets those of executions done.
    pub(crate) fn launched(&self, event: Event<'_>) {
        let mut launched = self.launched.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(oldest) = launched.events.front() {
            let oldest = Event::new(&self.plugin, oldest.0);
            let done = launched.events.len() >= MAX_LAUNCHED || oldest.is_ready().unwrap_or(true);
            if !done {
                std::mem::forget(oldest);
                break;
            }
            launched.events.pop_front();
            if let Err(err) = oldest.wait() {
                launched.error.get_or_insert(err);
            }
        }
        launched.events.push_back(RawEvent(event.into_raw()));
    }

    /// Waits for every execution started; the first error one of them ended with since the
    /// last call, if any.
    pub(crate) fn wait_for_launched(&self) -> Result<()> {
        let (events, error) = {
            let mut launched = self.launched.lock().unwrap_or_else(|p| p.into_inner());
            (std::mem::take(&mut launched.events), launched.error.take())
        };
        let mut first = error;
        for raw in events {
            if let Err(err) = Event::new(&self.plugin, raw.0).wait() {
                first.get_or_insert(err);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

// SAFETY: PJRT clients are thread-safe.
unsafe impl Send for ClientInner {}
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Executions end before their client goes.
        let _ = self.wait_for_launched();
        let mut args = PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        let _ = pjrt_call!(self.plugin, PJRT_Client_Destroy, &mut args);
    }
}

/// A PJRT client. Cloning shares the same client.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl Client {
    pub fn new(plugin: &Arc<Plugin>, options: &ClientOptions) -> Result<Client> {
        if options
            .extra
            .iter()
            .any(|(name, _)| name == "cpu_device_count")
        {
            // A wrongly typed value aborts the CPU plugin's process; the typed field cannot be.
            return Err(Error::Invalid(
                "set cpu_device_count through ClientOptions::cpu_device_count".into(),
            ));
        }
        let mut entries: Vec<(String, OptionValue)> = options.extra.clone();
        if let Some(count) = options.cpu_device_count {
            if count < 1 {
                return Err(Error::Invalid(format!(
                    "cpu_device_count must be at least 1, not {count}"
                )));
            }
            entries.push(("cpu_device_count".into(), OptionValue::Int(count)));
        }
        let names: Vec<CString> = entries
            .iter()
            .map(|(name, _)| CString::new(name.as_str()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| Error::Invalid("client option names must not contain NUL".into()))?;
        let strings: Vec<Vec<u8>> = entries
            .iter()
            .map(|(_, v)| match v {
                OptionValue::String(s) => s.as_bytes().to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let values: Vec<PJRT_NamedValue> = entries
            .iter()
            .enumerate()
            .map(|(i, (name, value))| {
                let mut named = PJRT_NamedValue::new();
                named.name = names[i].as_ptr();
                named.name_size = name.len();
                named.value_size = 1;
                match value {
                    OptionValue::String(_) => {
                        named.type_ = PJRT_NamedValue_kString;
                        named.value.string_value = strings[i].as_ptr().cast::<c_char>();
                        named.value_size = strings[i].len();
                    }
                    OptionValue::Int(v) => {
                        named.type_ = PJRT_NamedValue_kInt64;
                        named.value.int64_value = *v;
                    }
                    OptionValue::Ints(v) => {
                        named.type_ = PJRT_NamedValue_kInt64List;
                        named.value.int64_array_value = v.as_ptr();
                        named.value_size = v.len();
                    }
                    OptionValue::Float(v) => {
                        named.type_ = PJRT_NamedValue_kFloat;
                        named.value.float_value = *v;
                    }
                    OptionValue::Bool(v) => {
                        named.type_ = PJRT_NamedValue_kBool;
                        named.value.bool_value = *v;
                    }
                }
                named
            })
            .collect();
        let mut args = PJRT_Client_Create_Args::new();
        args.create_options = values.as_ptr();
        args.num_options = values.len();
        pjrt_call!(plugin, PJRT_Client_Create, &mut args)?;
        Ok(Client {
            inner: Arc::new(ClientInner {
                plugin: plugin.clone(),
                raw: args.client,
                launched: Mutex::default(),
                memory: Default::default(),
            }),
        })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.inner.plugin
    }

    /// Waits until every execution started without waiting
    /// ([`crate::Executable::launch_on_one_device`]) is done; the first error one of them ended
    /// with since the last call (its outputs carry it too), if any.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.wait_for_launched()
    }

    /// The platform's name (`cpu`, `tpu`, `cuda`).
    pub fn platform_name(&self) -> Result<String> {
        let mut args = PJRT_Client_PlatformName_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.plugin, PJRT_Client_PlatformName, &mut args)?;
        // SAFETY: the string lives as long as the client.
        Ok(unsafe { string_from(args.platform_name, args.platform_name_size) })
    }

    pub fn platform_version(&self) -> Result<String> {
        let mut args = PJRT_Client_PlatformVersion_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.plugin, PJRT_Client_PlatformVersion, &mut args)?;
        // SAFETY: the string lives as long as the client.
        Ok(unsafe { string_from(args.platform_version, args.platform_version_size) })
    }

    fn device_list(&self, raws: &[*mut PJRT_Device]) -> Vec<Device> {
        raws.iter()
            .map(|&raw| Device {
                raw,
                client: self.inner.clone(),
            })
            .collect()
    }

    /// All devices, including those of other processes.
    pub fn devices(&self) -> Result<Vec<Device>> {
        let mut args = PJRT_Client_Devices_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.plugin, PJRT_Client_Devices, &mut args)?;
        // SAFETY: the array is owned by the client.
        Ok(self.device_list(unsafe { raw_slice(args.devices, args.num_devices) }))
    }

    /// The devices this process can use.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args = PJRT_Client_AddressableDevices_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.plugin, PJRT_Client_AddressableDevices, &mut args)?;
        // SAFETY: the array is owned by the client.
        Ok(self.device_list(unsafe {
            raw_slice(args.addressable_devices, args.num_addressable_devices)
        }))
    }

    /// The memories this process can address.
    pub fn addressable_memories(&self) -> Result<Vec<Memory>> {
        let mut args = PJRT_Client_AddressableMemories_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(
            self.inner.plugin,
            PJRT_Client_AddressableMemories,
            &mut args
        )?;
        // SAFETY: the array is owned by the client.
        let raws = unsafe { raw_slice(args.addressable_memories, args.num_addressable_memories) };
        Ok(raws
            .iter()
            .map(|&raw| Memory::new(raw, &self.inner))
            .collect())
    }

    /// Compiles an MLIR module (StableHLO as text, generic form or bytecode; entry `main`).
    pub fn compile_mlir(&self, module: &[u8], options: &CompileOptions) -> Result<Executable> {
        let options = options.encode()?;
        let format = "mlir";
        let mut program = PJRT_Program::new();
        // The plugin only reads the code when compiling.
        program.code = module.as_ptr().cast_mut().cast::<c_char>();
        program.code_size = module.len();
        program.format = format.as_ptr().cast::<c_char>();
        program.format_size = format.len();
        let mut args = PJRT_Client_Compile_Args::new();
        args.client = self.inner.raw;
        args.program = &program;
        args.compile_options = options.as_ptr().cast::<c_char>();
        args.compile_options_size = options.len();
        pjrt_call!(self.inner.plugin, PJRT_Client_Compile, &mut args)?;
        Executable::new(args.executable, &self.inner)
    }

    /// Loads an executable serialized by [`Executable::serialize`] (same plugin and version).
    pub fn load_executable(&self, serialized: &[u8]) -> Result<Executable> {
        let mut args = PJRT_Executable_DeserializeAndLoad_Args::new();
        args.client = self.inner.raw;
        args.serialized_executable = serialized.as_ptr().cast::<c_char>();
        args.serialized_executable_size = serialized.len();
        pjrt_call!(
            self.inner.plugin,
            PJRT_Executable_DeserializeAndLoad,
            &mut args
        )?;
        Executable::new(args.loaded_executable, &self.inner)
    }

    /// Copies host data to a new buffer on `device`.
    pub fn buffer_from_host(&self, tensor: &crate::HostTensor, device: &Device) -> Result<Buffer> {
        self.buffer_from_bytes(tensor.element_type(), tensor.dims(), tensor.bytes(), device)
    }

    /// Copies `bytes` (dense, row-major) to a new buffer of the given type and shape on `device`.
    pub fn buffer_from_bytes(
        &self,
        element_type: DType,
        dims: &[i64],
        bytes: &[u8],
        device: &Device,
    ) -> Result<Buffer> {
        check_size(element_type, dims, bytes.len())?;
        let (raw, done) = self.transfer(
            element_type,
            dims,
            bytes,
            device,
            PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
        )?;
        Event::new(&self.inner.plugin, done).wait()?;
        Ok(Buffer::new(raw, &self.inner, None))
    }

    /// A buffer on `device` that aliases `data` where the plugin can (the CPU plugin does for
    /// 64-byte aligned memory) and copies it otherwise. `data` stays alive as long as the
    /// buffer and must not change meanwhile.
    pub fn buffer_sharing(
        &self,
        element_type: DType,
        dims: &[i64],
        data: Arc<dyn HostBytes>,
        device: &Device,
    ) -> Result<Buffer> {
        self.buffer_over(
            element_type,
            dims,
            data,
            device,
            PJRT_HostBufferSemantics_kImmutableZeroCopy,
        )
    }

    /// A buffer on `device` over `data` that an execution may update in place: given to it
    /// as a donated argument ([`crate::Executable::execute_donating`]), the result aliased to
    /// that argument is written into `data` itself, where the plugin aliases host memory (the
    /// CPU plugin, for 64-byte aligned memory; otherwise the plugin copies and the result is a
    /// buffer of its own). `data` must not be read or written meanwhile by anyone else.
    pub fn buffer_donatable(
        &self,
        element_type: DType,
        dims: &[i64],
        data: Arc<dyn HostBytes>,
        device: &Device,
    ) -> Result<Buffer> {
        self.buffer_over(
            element_type,
            dims,
            data,
            device,
            PJRT_HostBufferSemantics_kMutableZeroCopy,
        )
    }

    /// A buffer over host memory `data`, kept alive until the plugin is done with it.
    fn buffer_over(
        &self,
        element_type: DType,
        dims: &[i64],
        data: Arc<dyn HostBytes>,
        device: &Device,
        semantics: PJRT_HostBufferSemantics,
    ) -> Result<Buffer> {
        check_size(element_type, dims, data.bytes().len())?;
        let (raw, done) = self.transfer(element_type, dims, data.bytes(), device, semantics)?;
        Ok(Buffer::new(raw, &self.inner, Some((data, done))))
    }

    fn transfer(
        &self,
        element_type: DType,
        dims: &[i64],
        bytes: &[u8],
        device: &Device,
        semantics: PJRT_HostBufferSemantics,
    ) -> Result<(*mut PJRT_Buffer, *mut PJRT_Event)> {
        if !Arc::ptr_eq(&device.client, &self.inner) {
            return Err(Error::Invalid(
                "the device belongs to another client".into(),
            ));
        }
        let mut args = PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.inner.raw;
        args.data = bytes.as_ptr().cast();
        args.type_ = crate::element_type::to_raw(element_type);
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = semantics;
        args.device = device.raw;
        pjrt_call!(
            self.inner.plugin,
            PJRT_Client_BufferFromHostBuffer,
            &mut args
        )?;
        Ok((args.buffer, args.done_with_host_buffer))
    }
}

fn check_size(element_type: DType, dims: &[i64], len: usize) -> Result<()> {
    let expected = element_count(dims)?.saturating_mul(element_type.byte_size());
    if expected != len {
        return Err(Error::Invalid(format!(
            "{len} bytes given for a {element_type} buffer of shape {dims:?}, which needs {expected}"
        )));
    }
    Ok(())
}
