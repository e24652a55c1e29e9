//! Compiled, loaded executables: execution on one or many devices, serialization.
use crate::buffer::Buffer;
use crate::client::ClientInner;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::plugin::{named_value, pjrt_call, raw_slice, string_from, AttributeValue};
use crate::tiling::Tiling;
use crate::DType;
use pjrt_sys::*;
use std::sync::Arc;

/// Bytes of one device's memory a compiled program uses ([`Executable::compiled_memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompiledMemory {
    pub arguments: usize,
    pub outputs: usize,
    /// Of the outputs, those written in place of arguments.
    pub aliased: usize,
    pub temporaries: usize,
    pub code: usize,
}

/// A loaded executable. Execution is thread-safe: several threads may run it at once.
pub struct Executable {
    loaded: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
    client: Arc<ClientInner>,
    devices: Vec<Device>,
    num_outputs: usize,
}

// SAFETY: PJRT loaded executables may be executed concurrently from several threads and freed
// from any thread.
unsafe impl Send for Executable {}
unsafe impl Sync for Executable {}

impl Executable {
    pub(crate) fn new(
        loaded: *mut PJRT_LoadedExecutable,
        client: &Arc<ClientInner>,
    ) -> Result<Self> {
        let plugin = &client.plugin;
        let mut get = PJRT_LoadedExecutable_GetExecutable_Args::new();
        get.loaded_executable = loaded;
        let got = pjrt_call!(plugin, PJRT_LoadedExecutable_GetExecutable, &mut get);
        // Own both handles before anything else can fail, so each is destroyed exactly once.
        let mut exe = Executable {
            loaded,
            executable: get.executable,
            client: client.clone(),
            devices: Vec::new(),
            num_outputs: 0,
        };
        got?;
        let mut outputs = PJRT_Executable_NumOutputs_Args::new();
        outputs.executable = exe.executable;
        pjrt_call!(plugin, PJRT_Executable_NumOutputs, &mut outputs)?;
        exe.num_outputs = outputs.num_outputs;
        let mut devices = PJRT_LoadedExecutable_AddressableDevices_Args::new();
        devices.executable = loaded;
        pjrt_call!(
            plugin,
            PJRT_LoadedExecutable_AddressableDevices,
            &mut devices
        )?;
        // SAFETY: the array is owned by the executable.
        exe.devices =
            unsafe { raw_slice(devices.addressable_devices, devices.num_addressable_devices) }
                .iter()
                .map(|&raw| Device {
                    raw,
                    client: client.clone(),
                })
                .collect();
        Ok(exe)
    }

    /// The PJRT handle, for calling the C API directly (the executable still owns it).
    pub fn raw(&self) -> *mut PJRT_LoadedExecutable {
        self.loaded
    }

    /// The devices the executable runs on, in the order of `execute`'s argument lists.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Number of outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    pub fn name(&self) -> Result<String> {
        let mut args = PJRT_Executable_Name_Args::new();
        args.executable = self.executable;
        pjrt_call!(self.client.plugin, PJRT_Executable_Name, &mut args)?;
        // SAFETY: the string lives as long as the executable.
        Ok(unsafe { string_from(args.executable_name, args.executable_name_size) })
    }

    pub fn num_replicas(&self) -> Result<usize> {
        let mut args = PJRT_Executable_NumReplicas_Args::new();
        args.executable = self.executable;
        pjrt_call!(self.client.plugin, PJRT_Executable_NumReplicas, &mut args)?;
        Ok(args.num_replicas)
    }

    pub fn num_partitions(&self) -> Result<usize> {
        let mut args = PJRT_Executable_NumPartitions_Args::new();
        args.executable = self.executable;
        pjrt_call!(self.client.plugin, PJRT_Executable_NumPartitions, &mut args)?;
        Ok(args.num_partitions)
    }

    /// What the compiled program needs of each device's memory, as XLA's buffer assignment
    /// computed it (for an SPMD program, one device's part).
    pub fn compiled_memory(&self) -> Result<CompiledMemory> {
        let mut args = PJRT_Executable_GetCompiledMemoryStats_Args::new();
        args.executable = self.executable;
        pjrt_call!(
            self.client.plugin,
            PJRT_Executable_GetCompiledMemoryStats,
            &mut args
        )?;
        let bytes = |n: i64| usize::try_from(n).unwrap_or(0);
        Ok(CompiledMemory {
            arguments: bytes(args.argument_size_in_bytes),
            outputs: bytes(args.output_size_in_bytes),
            aliased: bytes(args.alias_size_in_bytes),
            temporaries: bytes(args.temp_size_in_bytes),
            code: bytes(args.generated_code_size_in_bytes),
        })
    }

    /// The program XLA compiled, after its optimizations (for an SPMD program, one device's
    /// part, its collectives included), as the plugin serializes it: an `HloModuleProto`, bare
    /// or with its configuration (`crate::hlo` reads both).
    pub fn optimized_program(&self) -> Result<crate::hlo::Serialized> {
        let format = "hlo";
        let mut program = PJRT_Program::new();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();
        let fill = |program: &mut PJRT_Program| -> Result<()> {
            let mut args = PJRT_Executable_OptimizedProgram_Args::new();
            args.executable = self.executable;
            args.program = program;
            pjrt_call!(
                self.client.plugin,
                PJRT_Executable_OptimizedProgram,
                &mut args
            )
        };
        // A first call with no buffer says how large the program is; the second writes it.
        fill(&mut program)?;
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        fill(&mut program)?;
        code.truncate(program.code_size);
        // SAFETY: the plugin set the format it wrote, a string it owns.
        let written = unsafe { string_from(program.format, program.format_size) };
        Ok(crate::hlo::Serialized {
            format: written,
            bytes: code,
        })
    }

    /// XLA's cost analysis of the compiled program (one device's part): its figures by name,
    /// e.g. `flops`, `transcendentals`, `bytes accessed`; None where the plugin does not
    /// implement it (XLA's CPU plugin).
    pub fn cost_analysis(&self) -> Result<Option<Vec<(String, f64)>>> {
        let mut args = PJRT_Executable_GetCostAnalysis_Args::new();
        args.executable = self.executable;
        let called = pjrt_call!(
            self.client.plugin,
            PJRT_Executable_GetCostAnalysis,
            &mut args
        );
        match called {
            Err(Error::Pjrt {
                code: crate::ErrorCode::Unimplemented,
                ..
            }) => return Ok(None),
            other => other?,
        }
        // SAFETY: the properties live as long as the executable.
        let properties = unsafe { raw_slice(args.properties, args.num_properties) };
        Ok(Some(
            properties
                .iter()
                // SAFETY: the plugin filled each value in.
                .map(|p| unsafe { named_value(p) })
                .filter_map(|(name, value)| {
                    let number = match value {
                        AttributeValue::Int(i) => i as f64,
                        AttributeValue::Float(f) => f64::from(f),
                        _ => return None,
                    };
                    Some((name, number))
                })
                .collect(),
        ))
    }

    /// How the program lays each output out over its devices, as XLA compiled it (what its
    /// partitioner chose for outputs it was left to lay out); None when the plugin cannot say.
    pub fn output_tilings(&self) -> Result<Option<Vec<Tiling>>> {
        let Some(read) = self.client.plugin.output_shardings else {
            return Ok(None);
        };
        let mut args = PJRT_Shardings_PJRT_Executable_OutputShardings_Args::new();
        args.executable = self.executable;
        // SAFETY: the function comes from the plugin's shardings extension and `args` is a
        // zero-initialised struct of its type with its size set.
        let error = unsafe { read(&mut args) };
        self.client
            .plugin
            .check("PJRT_Shardings_PJRT_Executable_OutputShardings", error)?;
        if args.shardings.is_null() || args.sharding_sizes.is_null() {
            return Ok(None);
        }
        // SAFETY: both arrays hold `num_outputs` entries owned by the executable.
        let (protos, sizes) = unsafe {
            (
                raw_slice(args.shardings, args.num_outputs),
                raw_slice(args.sharding_sizes, args.num_outputs),
            )
        };
        protos
            .iter()
            .zip(sizes)
            .map(|(&proto, &size)| {
                // SAFETY: each proto is `size` bytes owned by the executable.
                let bytes = unsafe { raw_slice(proto as *const u8, size) };
                Tiling::decode(bytes)
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Element types of the outputs (per device).
    pub fn output_element_types(&self) -> Result<Vec<DType>> {
        let mut args = PJRT_Executable_OutputElementTypes_Args::new();
        args.executable = self.executable;
        pjrt_call!(
            self.client.plugin,
            PJRT_Executable_OutputElementTypes,
            &mut args
        )?;
        // SAFETY: the array lives as long as the executable.
        unsafe { raw_slice(args.output_types, args.num_output_types) }
            .iter()
            .map(|&raw| {
                crate::element_type::from_raw(raw)
                    .ok_or_else(|| Error::Invalid(format!("output of unhandled PJRT type {raw}")))
            })
            .collect()
    }

    /// Shapes of the outputs (per device).
    pub fn output_dims(&self) -> Result<Vec<Vec<i64>>> {
        let mut args = PJRT_Executable_OutputDimensions_Args::new();
        args.executable = self.executable;
        pjrt_call!(
            self.client.plugin,
            PJRT_Executable_OutputDimensions,
            &mut args
        )?;
        // SAFETY: both arrays live as long as the executable; `dim_sizes` has one entry per output.
        let sizes = unsafe { raw_slice(args.dim_sizes, args.num_outputs) };
        let total = sizes.iter().sum();
        let dims = unsafe { raw_slice(args.dims, total) };
        let mut start = 0;
        Ok(sizes
            .iter()
            .map(|&n| {
                let shape = dims[start..start + n].to_vec();
                start += n;
                shape
            })
            .collect())
    }

    /// Runs the executable on its single device.
    pub fn execute_on_one_device(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        let mut outputs = self.execute(&[args.to_vec()])?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Runs the executable on its single device with `args`, in which each of `donated` (its
    /// argument position, the result aliased to it, the buffer) is given up: where the plugin
    /// writes that result into the donated buffer's memory, the result takes over the host
    /// memory the buffer aliased ([`crate::Client::buffer_donatable`]), which then holds the
    /// new value. `args` has no entry at donated positions.
    pub fn execute_donating(
        &self,
        args: &[&Buffer],
        mut donated: Vec<(usize, usize, Buffer)>,
    ) -> Result<Vec<Buffer>> {
        donated.sort_by_key(|(position, _, _)| *position);
        let mut slots: Vec<Option<&Buffer>> = args.iter().map(|&b| Some(b)).collect();
        for (position, _, buffer) in &donated {
            if *position > slots.len() {
                return Err(Error::Invalid(format!(
                    "donated argument {position} is beyond the {} arguments",
                    slots.len()
                )));
            }
            slots.insert(*position, Some(buffer));
        }
        let list: Vec<&Buffer> = slots.into_iter().flatten().collect();
        let addresses: Vec<Option<usize>> = donated
            .iter()
            .map(|(_, _, b)| b.device_address().ok())
            .collect();
        let mut outputs = self.execute_on_one_device(&list)?;
        for ((_, result, buffer), address) in donated.into_iter().zip(addresses) {
            let out = outputs.get_mut(result).ok_or_else(|| {
                Error::Invalid(format!("no result {result} to take a donated argument"))
            })?;
            let written_in_place = address.is_some() && out.device_address().ok() == address;
            if written_in_place {
                buffer.hand_host_to(out);
            }
        }
        Ok(outputs)
    }

    /// Runs the executable on every device: `args[device][arg]`, devices in the order of
    /// [`Executable::devices`]. Returns the outputs per device, once all devices are done.
    pub fn execute(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        self.start(args, true, None)
    }

    /// Starts the executable on its single device and returns its outputs at once, before it is
    /// done: each output becomes ready when it is, so what reads one (a copy to the host, the
    /// next execution) waits for it, and an error of the execution is that reader's error.
    pub fn launch_on_one_device(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        let mut outputs = self.start(&[args.to_vec()], false, None)?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Runs a portable executable ([`crate::CompileOptions::portable`]) on `device` and waits
    /// for it.
    pub fn execute_on(&self, device: &Device, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        let mut outputs = self.start(&[args.to_vec()], true, Some(device))?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Starts a portable executable ([`crate::CompileOptions::portable`]) on `device`, any
    /// device of its client, as [`Executable::launch_on_one_device`] does on its own.
    pub fn launch_on(&self, device: &Device, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        let mut outputs = self.start(&[args.to_vec()], false, Some(device))?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Starts the executable with `args` per device; returns the outputs, once every device is
    /// done when `wait`, else at once.
    /// `on`: the device a portable executable runs on (its one argument list).
    fn start(
        &self,
        args: &[Vec<&Buffer>],
        wait: bool,
        on: Option<&Device>,
    ) -> Result<Vec<Vec<Buffer>>> {
        // A portable executable has no devices of its own: it runs on the one it is given.
        let devices = if on.is_some() { 1 } else { self.devices.len() };
        if args.len() != devices {
            return Err(Error::Invalid(format!(
                "the executable runs on {devices} device(s), but arguments were given for {}",
                args.len()
            )));
        }
        let num_args = args.first().map_or(0, Vec::len);
        if let Some((device, list)) = args.iter().enumerate().find(|(_, l)| l.len() != num_args) {
            return Err(Error::Invalid(format!(
                "device {device} was given {} arguments, device 0 {num_args}",
                list.len()
            )));
        }
        if args.iter().flatten().any(|b| !b.belongs_to(&self.client)) {
            return Err(Error::Invalid(
                "an argument buffer belongs to another client".into(),
            ));
        }
        let raw_args: Vec<Vec<*mut PJRT_Buffer>> = args
            .iter()
            .map(|list| list.iter().map(|b| b.raw).collect())
            .collect();
        let arg_ptrs: Vec<*const *mut PJRT_Buffer> = raw_args.iter().map(|l| l.as_ptr()).collect();
        let mut raw_outputs: Vec<Vec<*mut PJRT_Buffer>> =
            vec![vec![std::ptr::null_mut(); self.num_outputs]; args.len()];
        let output_ptrs: Vec<*mut *mut PJRT_Buffer> =
            raw_outputs.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: Vec<*mut PJRT_Event> = vec![std::ptr::null_mut(); args.len()];
        let mut options = PJRT_ExecuteOptions::new();
        let mut call = PJRT_LoadedExecutable_Execute_Args::new();
        call.executable = self.loaded;
        call.options = &mut options;
        call.argument_lists = arg_ptrs.as_ptr();
        call.num_devices = args.len();
        call.num_args = num_args;
        call.output_lists = output_ptrs.as_ptr();
        call.device_complete_events = events.as_mut_ptr();
        if let Some(device) = on {
            call.execute_device = device.raw;
        }
        let result = pjrt_call!(self.client.plugin, PJRT_LoadedExecutable_Execute, &mut call);
        // Take ownership of whatever the plugin handed out, even on error, so nothing leaks.
        let outputs: Vec<Vec<Buffer>> = raw_outputs
            .iter()
            .map(|list| {
                list.iter()
                    .filter(|raw| !raw.is_null())
                    .map(|&raw| Buffer::new(raw, &self.client, None))
                    .collect()
            })
            .collect();
        let events: Vec<Event> = events
            .into_iter()
            .map(|raw| Event::new(&self.client.plugin, raw))
            .collect();
        result?;
        for event in events {
            if wait {
                event.wait()?;
            } else {
                self.client.launched(event);
            }
        }
        Ok(outputs)
    }

    /// The executable in the plugin's serialized form, for [`crate::Client::load_executable`].
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let mut args = PJRT_Executable_Serialize_Args::new();
        args.executable = self.executable;
        pjrt_call!(self.client.plugin, PJRT_Executable_Serialize, &mut args)?;
        // SAFETY: the bytes live until the deleter runs, which happens right after the copy.
        let bytes = unsafe {
            raw_slice(
                args.serialized_bytes.cast::<u8>(),
                args.serialized_bytes_size,
            )
        }
        .to_vec();
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: the plugin's deleter for the storage it returned, called once.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        if !self.executable.is_null() {
            let mut args = PJRT_Executable_Destroy_Args::new();
            args.executable = self.executable;
            let _ = pjrt_call!(self.client.plugin, PJRT_Executable_Destroy, &mut args);
        }
        let mut args = PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.loaded;
        let _ = pjrt_call!(self.client.plugin, PJRT_LoadedExecutable_Destroy, &mut args);
    }
}
