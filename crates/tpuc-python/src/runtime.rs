//! The plugin's client as Python holds it (`Runtime`: the target graphs compile for and run on)
//! and tensors' data on its devices: `DeviceBuffer` (a value on the devices), `HostInput` (host
//! memory a call uploads, padded to a bucket where the graph takes one) and `DonatedBuffer`
//! (memory given up to the result that updates it in place).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use tpuc_driver::{
    DeviceValue, Hoist, HostValue, Loaded, LowerOptions, Mesh, Options, Plan, Source, Target,
    WeightsMode,
};
use tpuc_hlo::ir::Sharding;
use tpuc_pjrt::{Buffer, DType, HostBytes, ShardLayout};

use crate::compiled::CompiledGraph;
use crate::options::{CompileOptions, PyMesh};
use crate::{driver_error, dtype, error, host_bytes, Spec};

/// A client of one PJRT plugin: the target graphs compile for and run on, one device or a mesh
/// of them.
#[pyclass(frozen, module = "tpuc._tpuc")]
pub(crate) struct Runtime {
    target: Arc<Target>,
    /// The mesh the devices form, when there are several.
    mesh: Option<Mesh>,
}

/// Memory owned by a Python object (a torch tensor) that a device buffer aliases; holding the
/// object keeps the memory alive.
struct PythonMemory {
    address: usize,
    len: usize,
    _owner: Py<PyAny>,
}

impl PythonMemory {
    /// `len` bytes at `address`, which `owner` (a contiguous CPU tensor's storage) keeps alive.
    fn shared(address: usize, len: usize, owner: Py<PyAny>) -> Arc<dyn HostBytes> {
        Arc::new(PythonMemory {
            address,
            len,
            _owner: owner,
        })
    }
}

impl HostBytes for PythonMemory {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the owner (a contiguous CPU tensor, checked by the caller) holds `len` bytes at
        // `address` and stays alive, unmodified, as long as this value.
        unsafe { host_bytes(self.address, self.len) }
    }
}

#[pymethods]
impl Runtime {
    /// A client of `plugin` (a name: cpu, tpu, cuda; or a path; default $TPUC_PJRT_PLUGIN or
    /// cpu), over one device or the devices of `mesh` (`fsdp=2,tp=2`). A named plugin is looked
    /// for in `search_paths` first: the running interpreter's `sys.path`, which says where its
    /// packages are whatever the working directory or environment.
    #[new]
    #[pyo3(signature = (plugin=None, search_paths=Vec::new(), mesh=None))]
    fn new(
        py: Python<'_>,
        plugin: Option<String>,
        search_paths: Vec<String>,
        mesh: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let search_paths: Vec<PathBuf> = search_paths.into_iter().map(Into::into).collect();
        let mesh = mesh.map(|m| PyMesh::of(m).map(|m| m.mesh)).transpose()?;
        let devices = mesh.as_ref().map_or(1, |m| m.devices() as usize);
        let target = py.detach(|| {
            Target::open(plugin.as_deref(), devices, &search_paths).map_err(driver_error)
        })?;
        Ok(Runtime {
            target: Arc::new(target),
            mesh,
        })
    }

    /// A client of `plugin` for the eager device: programs for one device, which run on any of
    /// `devices` devices each on its own (`tpuc:0`, `tpuc:1`, ...; None: every device the plugin
    /// has, one for the CPU plugin, which has as many as it is asked for).
    #[staticmethod]
    #[pyo3(signature = (plugin=None, search_paths=Vec::new(), devices=None))]
    fn each(
        py: Python<'_>,
        plugin: Option<String>,
        search_paths: Vec<String>,
        devices: Option<usize>,
    ) -> PyResult<Self> {
        let search_paths: Vec<PathBuf> = search_paths.into_iter().map(Into::into).collect();
        let target = py.detach(|| {
            Target::open_each(plugin.as_deref(), devices, &search_paths).map_err(driver_error)
        })?;
        Ok(Runtime {
            target: Arc::new(target),
            mesh: None,
        })
    }

    /// How many devices graphs run on.
    #[getter]
    fn devices(&self) -> usize {
        self.target.devices().len()
    }

    /// How many devices a program for one device may run on, each on its own (`Runtime.each`).
    #[getter]
    fn each_devices(&self) -> usize {
        self.target.each_device().len()
    }

    /// Waits until every graph started on the devices (`CompiledGraph.launch`) is done; raises
    /// the first error one of them ended with since the last call.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.target.client().synchronize())
            .map_err(error)
    }

    #[getter]
    fn platform(&self) -> PyResult<String> {
        self.target.platform().map_err(driver_error)
    }

    /// The StableHLO versions the plugin reads, `(current, minimum)` (`"1.16.1"`), None where
    /// it does not say.
    #[getter]
    fn stablehlo_versions(&self) -> (Option<String>, Option<String>) {
        let plugin = self.target.client().plugin();
        let version = |key| plugin.attribute(key).map(ToString::to_string);
        (
            version("stablehlo_current_version"),
            version("stablehlo_minimum_version"),
        )
    }

    /// The bytes of the buffers alive on device `index` and the most there were since the
    /// last reset: `(allocated, peak)`.
    fn memory_use(&self, index: usize) -> PyResult<(usize, usize)> {
        let used = self.device(index)?.memory_use();
        Ok((used.allocated, used.peak))
    }

    /// Starts device `index`'s peak of `memory_use` again from what is allocated now.
    fn reset_peak_memory(&self, index: usize) -> PyResult<()> {
        self.device(index)?.reset_peak_memory();
        Ok(())
    }

    /// A handle to the runtime's target for the native device (a capsule).
    fn native_target<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        crate::native::target_capsule(py, &self.target)
    }

    #[getter]
    fn plugin_path(&self) -> String {
        self.target.plugin_path().display().to_string()
    }

    /// How many sets of values derived from weights the runtime keeps (one per prepared module
    /// and set of weight buffers alive).
    #[getter]
    fn prepared_sets(&self) -> usize {
        self.target.prepared_sets()
    }

    /// Compiles a serialized ExportedProgram (all tensors as inputs) through tpuc's pipeline. A
    /// graph compiled before in this process is returned without lowering again
    /// (`CompiledGraph.reused`). `stable`: one flag per program input, true for those that stay
    /// the same from call to call (a model's weights); what the graph computes from them alone
    /// and is worth computing once is then split off into a second executable, run once per
    /// set of their buffers. `options`: the precision and cache (`CompileOptions`).
    /// On a mesh, `specs` lays out each program input and `result_specs` each output (None:
    /// whole on every device, or with `open_results` as XLA's partitioner lays it out, which
    /// `CompiledGraph.result_specs` then says; a split output is assembled from the devices'
    /// parts).
    /// `input_dims`: the shapes of the inputs (in order) of a program with symbolic sizes, which
    /// fix them (the program is compiled for those sizes).
    /// `process_groups` makes the program one rank's of a torch.distributed program, run on
    /// every device as the rank of its number, its collectives over the groups of device ids
    /// each process group name stands for; inputs and outputs are then the devices' values
    /// stacked along a new leading dimension.
    /// `bucketed` (with `input_dims`): compile for the sizes' buckets of `options.buckets`, the
    /// inputs padded to them (`HostInput`), instead of for the sizes themselves.
    /// `donate`: (input index, output index) of each input the graph updates in place, whose
    /// new value that output is (`CompiledGraph.donations`, `Runtime.donatable_buffer`).
    /// A program compiled for a bucket of sizes has its next bucket compiled in the background
    /// (`tpuc_driver::Target::compile_next_bucket`). With `background`, the program itself is
    /// compiled so and None returned: a later `compile` of it waits for it or finds it done.
    #[pyo3(signature = (program_json, name, options, *, stable=None, specs=None, process_groups=None, result_specs=None, input_dims=None, bucketed=false, donate=None, open_results=false, background=false))]
    #[allow(clippy::too_many_arguments)]
    fn compile(
        &self,
        py: Python<'_>,
        program_json: &[u8],
        name: &str,
        options: PyRef<'_, CompileOptions>,
        stable: Option<Vec<bool>>,
        specs: Option<Vec<Option<Spec>>>,
        process_groups: Option<tpuc_hlo::ProcessGroups>,
        result_specs: Option<Vec<Option<Spec>>>,
        input_dims: Option<Vec<Vec<i64>>>,
        bucketed: bool,
        donate: Option<Vec<(usize, usize)>>,
        open_results: bool,
        background: bool,
    ) -> PyResult<Option<CompiledGraph>> {
        let options = self.graph_options(
            &options,
            stable,
            specs,
            process_groups,
            result_specs,
            input_dims,
            bucketed,
            donate,
            open_results,
        );
        let source = Source::Json {
            name,
            bytes: program_json,
        };
        if background {
            self.target
                .compile_in_background(source.to_owned_source(), options)
                .map_err(driver_error)?;
            return Ok(None);
        }
        py.detach(|| {
            let (compiled, reused) = self
                .target
                .compile(source, &options)
                .map_err(driver_error)?;
            self.target
                .compile_next_bucket(source, &options, &compiled)
                .map_err(driver_error)?;
            let loaded = Loaded::new(self.target.clone(), compiled).map_err(driver_error)?;
            Ok(Some(CompiledGraph::new(loaded, reused)))
        })
    }

    /// `tpuc doctor`'s report of a graph as `compile` would compile it (the same arguments),
    /// compiled without running it and without the cache, each device holding `device_memory`
    /// bytes where given: its JSON (docs/doctor.md) and its text.
    #[pyo3(signature = (program_json, name, options, *, stable=None, specs=None, process_groups=None, result_specs=None, input_dims=None, bucketed=false, donate=None, open_results=false, device_memory=None))]
    #[allow(clippy::too_many_arguments)]
    fn examine(
        &self,
        py: Python<'_>,
        program_json: &[u8],
        name: &str,
        options: PyRef<'_, CompileOptions>,
        stable: Option<Vec<bool>>,
        specs: Option<Vec<Option<Spec>>>,
        process_groups: Option<tpuc_hlo::ProcessGroups>,
        result_specs: Option<Vec<Option<Spec>>>,
        input_dims: Option<Vec<Vec<i64>>>,
        bucketed: bool,
        donate: Option<Vec<(usize, usize)>>,
        open_results: bool,
        device_memory: Option<u64>,
    ) -> PyResult<(String, String)> {
        let options = self.graph_options(
            &options,
            stable,
            specs,
            process_groups,
            result_specs,
            input_dims,
            bucketed,
            donate,
            open_results,
        );
        let source = Source::Json {
            name,
            bytes: program_json,
        };
        let report = py
            .detach(|| {
                tpuc_driver::doctor::examine_source(&self.target, source, options, device_memory)
            })
            .map_err(driver_error)?;
        let json = serde_json::to_string(&report).map_err(error)?;
        Ok((json, tpuc_driver::doctor::text(&report)))
    }

    /// A contiguous CPU tensor's memory (`address`/`nbytes`, kept alive by `owner`) on the
    /// device, for an execution that updates it in place: on the CPU plugin (64-byte aligned
    /// memory) the result is written into the tensor itself. One device only.
    fn donatable_buffer(
        &self,
        py: Python<'_>,
        address: usize,
        nbytes: usize,
        dtype_name: &str,
        shape: Vec<i64>,
        owner: Py<PyAny>,
    ) -> PyResult<DonatedBuffer> {
        let element_type = dtype(dtype_name)?;
        let [device] = self.target.devices() else {
            return Err(error("updates in place run on one device"));
        };
        let memory = PythonMemory::shared(address, nbytes, owner);
        let buffer = py
            .detach(|| {
                self.target
                    .client()
                    .buffer_donatable(element_type, &shape, memory, device)
            })
            .map_err(error)?;
        Ok(DonatedBuffer {
            buffer: Mutex::new(Some(buffer)),
        })
    }

    /// A tensor's data on the devices: `address`/`nbytes` of a contiguous CPU tensor kept alive
    /// by `owner`, each device holding its part as `spec` lays it out (whole when None), or
    /// whole on the eager device's device `device` (`Runtime.each`). The CPU plugin aliases
    /// 64-byte aligned memory instead of copying.
    #[pyo3(signature = (address, nbytes, dtype_name, shape, owner, spec=None, device=None))]
    #[allow(clippy::too_many_arguments)]
    fn buffer(
        &self,
        py: Python<'_>,
        address: usize,
        nbytes: usize,
        dtype_name: &str,
        shape: Vec<i64>,
        owner: Py<PyAny>,
        spec: Option<Spec>,
        device: Option<usize>,
    ) -> PyResult<DeviceBuffer> {
        let element_type = dtype(dtype_name)?;
        let memory = PythonMemory::shared(address, nbytes, owner);
        let layout = self.layout(spec, shape.len())?;
        let on = match device {
            Some(index) => std::slice::from_ref(self.device(index)?),
            None => self.target.devices(),
        };
        let parts = py
            .detach(|| {
                self.target
                    .client()
                    .upload_sharded(element_type, &shape, memory, &layout, on)
            })
            .map_err(error)?;
        Ok(DeviceBuffer {
            value: DeviceValue::new(parts),
        })
    }
}

impl Runtime {
    /// Device `index` of the runtime's target, or an IndexError naming the ones there are.
    fn device(&self, index: usize) -> PyResult<&tpuc_pjrt::Device> {
        let devices = self.target.each_device();
        devices.get(index).ok_or_else(|| {
            pyo3::exceptions::PyIndexError::new_err(format!(
                "no device {index}: the runtime has {} device(s)",
                devices.len()
            ))
        })
    }

    /// How a tensor laid out as `spec` (whole when None) spreads over the devices.
    fn layout(&self, spec: Option<Spec>, rank: usize) -> PyResult<ShardLayout> {
        tpuc_driver::shard_layout(self.mesh.as_ref(), spec.as_deref(), rank).map_err(error)
    }
}

/// A tensor's memory on the (one) device, to be given up to an execution that updates it in
/// place (an input of `CompiledGraph.run_dlpack` at a position of `donations`); usable once.
#[pyclass(frozen, module = "tpuc._tpuc")]
pub(crate) struct DonatedBuffer {
    buffer: Mutex<Option<Buffer>>,
}

impl DonatedBuffer {
    /// The buffer, given up (an error the second time).
    pub(crate) fn take(&self) -> PyResult<Buffer> {
        self.buffer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| error("a donated buffer was given up already"))
    }
}

/// A tensor on the devices: one buffer per device (its part of the tensor), in mesh order.
#[pyclass(frozen, weakref, module = "tpuc._tpuc")]
pub(crate) struct DeviceBuffer {
    pub(crate) value: DeviceValue,
}

#[pymethods]
impl DeviceBuffer {
    /// A handle to the buffer's value for the native device (a capsule).
    fn native_value<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        crate::native::value_capsule(py, &self.value)
    }

    /// The buffer a native device's handle (`native_value`, or the device's own) stands for.
    #[staticmethod]
    fn from_native(capsule: &Bound<'_, PyAny>) -> PyResult<DeviceBuffer> {
        Ok(DeviceBuffer {
            value: crate::native::value_of_capsule(capsule)?,
        })
    }

    /// Copies the tensor (whole on one device) into `address`/`nbytes`, a contiguous CPU tensor
    /// of its dtype and shape, waiting for the computation that produces it.
    fn copy_to_host(&self, py: Python<'_>, address: usize, nbytes: usize) -> PyResult<()> {
        let buffer = self.value.single().map_err(|_| {
            error(format!(
                "the tensor is split over {} devices: it has no one copy to read",
                self.value.parts().len()
            ))
        })?;
        // SAFETY: the caller passes a live, contiguous tensor of `nbytes` bytes it does not touch
        // during the call.
        let dst = unsafe { crate::host_bytes_mut(address, nbytes) };
        py.detach(|| buffer.copy_to_host(dst)).map_err(error)
    }
}

/// A contiguous CPU tensor's memory (`address`/`nbytes` of `dtype_name` and `shape`, kept alive
/// by `owner`) that a call uploads, padded with zeros at the end of each dimension to the shape
/// the graph takes (a bucket's) where it is smaller: the padded copy is made in aligned memory
/// the CPU plugin aliases.
#[pyclass(frozen, module = "tpuc._tpuc")]
pub(crate) struct HostInput {
    elem: DType,
    dims: Vec<i64>,
    memory: Arc<dyn HostBytes>,
}

#[pymethods]
impl HostInput {
    #[new]
    fn new(
        address: usize,
        nbytes: usize,
        dtype_name: &str,
        shape: Vec<i64>,
        owner: Py<PyAny>,
    ) -> PyResult<HostInput> {
        let elem = dtype(dtype_name)?;
        let needed = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
            .and_then(|n| n.checked_mul(elem.byte_size()));
        if needed != Some(nbytes) {
            return Err(error(format!(
                "{nbytes} bytes given for a {elem} tensor of shape {shape:?}, which needs {}",
                needed.map_or("more than can be addressed".into(), |n| n.to_string())
            )));
        }
        Ok(HostInput {
            elem,
            dims: shape,
            memory: PythonMemory::shared(address, nbytes, owner),
        })
    }
}

impl HostInput {
    pub(crate) fn value(&self) -> HostValue {
        HostValue {
            elem: self.elem,
            dims: self.dims.clone(),
            bytes: self.memory.clone(),
        }
    }
}

impl Runtime {
    /// The pipeline's options for a graph the backend hands over (`Runtime.compile`'s
    /// arguments, which `Runtime.examine` takes too).
    #[allow(clippy::too_many_arguments)]
    fn graph_options(
        &self,
        options: &CompileOptions,
        stable: Option<Vec<bool>>,
        specs: Option<Vec<Option<Spec>>>,
        process_groups: Option<tpuc_hlo::ProcessGroups>,
        result_specs: Option<Vec<Option<Spec>>>,
        input_dims: Option<Vec<Vec<i64>>>,
        bucketed: bool,
        donate: Option<Vec<(usize, usize)>>,
        open_results: bool,
    ) -> Options {
        let shardings = |specs: Option<Vec<Option<Spec>>>| -> Vec<Option<Sharding>> {
            specs
                .unwrap_or_default()
                .into_iter()
                .map(|s| s.map(|dims| Sharding { dims }))
                .collect()
        };
        let mesh = self.mesh.clone().map(|mesh| {
            let plan = Plan {
                inputs: shardings(specs),
                results: shardings(result_specs),
                open_results,
                ..Plan::default()
            };
            (mesh, plan)
        });
        Options {
            lower: LowerOptions {
                weights: WeightsMode::Args,
                precision: options.precision,
                process_groups,
                fusion: options.fusion,
                ..LowerOptions::default()
            },
            hoist: stable.map_or(Hoist::Off, Hoist::Inputs),
            cache_dir: options.cache_dir.clone(),
            mesh,
            // A program with symbolic sizes, compiled for inputs of these shapes.
            sizes: input_dims.as_ref().map(|_| BTreeMap::new()),
            input_dims,
            buckets: options.buckets.clone().filter(|_| bucketed),
            donate: donate.unwrap_or_default(),
            ..Options::default()
        }
    }
}
