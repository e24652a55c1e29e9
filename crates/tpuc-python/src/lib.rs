//! `tpuc._tpuc`: the compiler and the PJRT runtime, in process, for the Python package `tpuc`
//! (the torch.compile backend). Graphs arrive as torch.export's serialized `ExportedProgram`
//! JSON and go through `tpuc_driver`'s pipeline; tensors arrive as (address, size) of torch's
//! own CPU memory, which device buffers alias where the plugin allows and outputs are copied
//! into.
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tpuc_driver::{
    ArgRole, Buckets, Compiled, Hoist, LowerOptions, Mesh, Options, Plan, Precision, Source,
    Target, WeightsMode,
};
use tpuc_hlo::ir::{Sharding, TensorType};
use tpuc_hlo::plan::Rule;
use tpuc_hlo::{ResultRole, Signature};
use tpuc_pjrt::{Buffer, DType, Executable, HostBytes, HostTensor, ShardLayout};

pyo3::create_exception!(
    _tpuc,
    TpucError,
    PyRuntimeError,
    "An error from tpuc's compiler or runtime."
);

pub(crate) fn error(e: impl std::fmt::Display) -> PyErr {
    TpucError::new_err(e.to_string())
}

/// The error with its chain of causes, `outer: inner: ...`.
fn message_with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        message += &format!(": {cause}");
        source = cause.source();
    }
    message
}

/// A pipeline error; one that a node caused names it in the exception's `node` and `op`
/// attributes, so the backend can run that node in eager torch.
fn driver_error(e: tpuc_driver::Error) -> PyErr {
    let err = TpucError::new_err(message_with_causes(&e));
    if let tpuc_driver::Error::Lower { source, .. } = &e {
        let tpuc_hlo::LowerError::Node { node, target, .. } = &**source else {
            return err;
        };
        Python::attach(|py| {
            let value = err.value(py);
            // Setting attributes on a fresh exception object cannot fail in practice; if it
            // did, the error would still carry its message.
            let _ = value.setattr("node", node);
            let _ = value.setattr("op", target);
        });
    }
    err
}

/// The ATen overloads tpuc lowers, as `aten.add.Tensor`.
#[pyfunction]
fn supported_ops() -> Vec<&'static str> {
    tpuc_hlo::lower::supported_ops()
}

/// Whether tpuc lowers `op` (`aten.relu_.default`, an in-place or `out=` variant of a lowered
/// op, counts).
#[pyfunction]
fn is_supported(op: &str) -> bool {
    tpuc_hlo::lower::is_supported(op)
}

/// The names of the element types tpuc handles, as torch names them (`float32`, ...).
#[pyfunction]
fn dtype_names() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}

/// The names `matmul_precision` takes (`highest`, `high`, `default`).
#[pyfunction]
fn matmul_precisions() -> Vec<&'static str> {
    Precision::ALL.iter().map(|p| p.name()).collect()
}

/// The user's source line (`file:line`) in a stack trace torch recorded on a node: the
/// innermost frame outside installed packages.
#[pyfunction]
fn source_line(stack_trace: &str) -> Option<String> {
    tpuc_fx::source::user_frame(stack_trace).map(|s| format!("{}:{}", s.file, s.line))
}

/// A partition spec from Python: per dimension, the mesh axes that split it.
type Spec = Vec<Vec<String>>;

fn parse_mesh(mesh: &str) -> PyResult<Mesh> {
    mesh.parse()
        .map_err(|e: String| error(format!("mesh {mesh:?}: {e}")))
}

/// The axes of a mesh given as text (`fsdp=2,tp=2`), checked: `[("fsdp", 2), ("tp", 2)]`.
#[pyfunction]
fn mesh_axes(mesh: &str) -> PyResult<Vec<(String, i64)>> {
    Ok(parse_mesh(mesh)?
        .axes
        .into_iter()
        .map(|a| (a.name, a.size))
        .collect())
}

/// The specs a plan gives a model's weights (`(name, shape)`, by their fully qualified names)
/// and inputs (`(name, shape)`) over `mesh` (`fsdp=2,tp=2`): the ready plans `ready` (`dp`,
/// `fsdp`, `tp`, combined with commas) after the rules (`(pattern, spec)`, the first match
/// deciding a weight). Each comes back as its spec and, where its uses see another layout (a
/// weight the plan `fsdp` gathers at use), that one; in the same order, weights then inputs.
#[pyfunction]
#[pyo3(signature = (mesh, ready, rules, weights, inputs))]
fn resolve_plan(
    mesh: &str,
    ready: Option<&str>,
    rules: Vec<(String, Spec)>,
    weights: Vec<(String, Vec<i64>)>,
    inputs: Vec<(String, Vec<i64>)>,
) -> PyResult<Vec<(Spec, Option<Spec>)>> {
    let mesh = parse_mesh(mesh)?;
    let mut plan = match ready {
        Some(ready) => ready.parse::<Plan>().map_err(error)?,
        None => Plan::default(),
    };
    plan.rules = rules
        .into_iter()
        .map(|(pattern, dims)| Rule {
            pattern,
            spec: Sharding { dims },
        })
        .collect();
    let mut args = Vec::new();
    let mut types = Vec::new();
    for (name, shape) in &weights {
        args.push(ArgRole::Weight(name.clone()));
        types.push(TensorType::new(shape.clone(), DType::F32));
    }
    for (name, shape) in &inputs {
        args.push(ArgRole::UserInput(name.clone()));
        types.push(TensorType::new(shape.clone(), DType::F32));
    }
    let signature = Signature {
        args,
        results: Vec::<ResultRole>::new(),
        prepared: None,
    };
    let shardings = tpuc_hlo::plan::resolve(&plan, &mesh, &signature, &types).map_err(error)?;
    let at_use = tpuc_hlo::plan::resolve_at_use(&plan, &signature, &shardings);
    Ok(shardings
        .into_iter()
        .zip(at_use)
        .map(|(s, used)| (s.dims, used.map(|u| u.dims)))
        .collect())
}

/// A client of one PJRT plugin: the target graphs compile for and run on, one device or a mesh
/// of them.
#[pyclass(frozen, module = "tpuc._tpuc")]
struct Runtime {
    target: Target,
    /// The mesh the devices form, when there are several.
    mesh: Option<Mesh>,
}

impl Runtime {
    /// How a tensor laid out as `spec` (whole when None) spreads over the devices.
    fn layout(&self, spec: Option<Spec>, rank: usize) -> PyResult<ShardLayout> {
        tpuc_driver::shard_layout(self.mesh.as_ref(), spec.as_deref(), rank).map_err(error)
    }
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

pub(crate) fn dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name)
        .ok_or_else(|| error(format!("tpuc does not handle tensors of dtype {name}")))
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
        mesh: Option<&str>,
    ) -> PyResult<Self> {
        let search_paths: Vec<PathBuf> = search_paths.into_iter().map(Into::into).collect();
        let mesh = mesh.map(parse_mesh).transpose()?;
        let devices = mesh.as_ref().map_or(1, |m| m.devices() as usize);
        let target = py.detach(|| {
            Target::open(plugin.as_deref(), devices, &search_paths).map_err(driver_error)
        })?;
        Ok(Runtime { target, mesh })
    }

    /// How many devices graphs run on.
    #[getter]
    fn devices(&self) -> usize {
        self.target.devices().len()
    }

    /// Waits until every graph started on the devices (`CompiledGraph.run_on_device`) is done;
    /// raises the first error one of them ended with since the last call.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.target.client().synchronize())
            .map_err(error)
    }

    #[getter]
    fn platform(&self) -> PyResult<String> {
        self.target.platform().map_err(driver_error)
    }

    #[getter]
    fn plugin_path(&self) -> String {
        self.target.plugin_path().display().to_string()
    }

    /// Compiles a serialized ExportedProgram (all tensors as inputs) through tpuc's pipeline. A
    /// graph compiled before in this process is returned without lowering again
    /// (`CompiledGraph.reused`). `stable`: one flag per program input, true for those that stay
    /// the same from call to call (a model's weights); what the graph computes from them alone
    /// and is worth computing once is then split off into a second executable. `cache_dir`: the
    /// cache of compiled executables on disk; `None` for $TPUC_CACHE_DIR or the default,
    /// `"off"` for none.
    /// On a mesh, `specs` lays out each program input and `result_specs` each output (None:
    /// whole on every device, or with `open_results` as XLA's partitioner lays it out, which
    /// `CompiledGraph.result_specs` then says; a split output is assembled from the devices'
    /// parts by `run`).
    /// `input_dims`: the shapes of the inputs (in order) of a program with symbolic sizes, which
    /// fix them (the program is compiled for those sizes).
    /// `process_groups` makes the program one rank's of a torch.distributed program, run on
    /// every device as the rank of its number, its collectives over the groups of device ids
    /// each process group name stands for; inputs and outputs are then the devices' values
    /// stacked along a new leading dimension.
    /// `buckets` (with `input_dims`): compile for the sizes' buckets (`pow2`, `pow2:MIN` or a
    /// list of sizes), the inputs padded to them (`CompiledGraph.call_sizes`), instead of for
    /// the sizes themselves.
    /// `donate`: (input index, output index) of each input the graph updates in place, whose
    /// new value that output is (`CompiledGraph.donations`, `Runtime.donatable_buffer`).
    #[pyo3(signature = (program_json, name, matmul_precision="highest", stable=None, cache_dir=None, specs=None, process_groups=None, result_specs=None, input_dims=None, buckets=None, donate=None, open_results=false))]
    #[allow(clippy::too_many_arguments)]
    fn compile(
        &self,
        py: Python<'_>,
        program_json: &[u8],
        name: &str,
        matmul_precision: &str,
        stable: Option<Vec<bool>>,
        cache_dir: Option<String>,
        specs: Option<Vec<Option<Spec>>>,
        process_groups: Option<tpuc_hlo::ProcessGroups>,
        result_specs: Option<Vec<Option<Spec>>>,
        input_dims: Option<Vec<Vec<i64>>>,
        buckets: Option<&str>,
        donate: Option<Vec<(usize, usize)>>,
        open_results: bool,
    ) -> PyResult<CompiledGraph> {
        let precision: Precision = matmul_precision.parse().map_err(error)?;
        let buckets = buckets.map(Buckets::parse).transpose().map_err(error)?;
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
        let options = Options {
            lower: LowerOptions {
                weights: WeightsMode::Args,
                precision,
                process_groups,
                ..LowerOptions::default()
            },
            hoist: stable.map_or(Hoist::Off, Hoist::Inputs),
            cache_dir,
            mesh,
            // A program with symbolic sizes, compiled for inputs of these shapes.
            sizes: input_dims.as_ref().map(|_| BTreeMap::new()),
            input_dims,
            buckets,
            donate: donate.unwrap_or_default(),
            ..Options::default()
        };
        py.detach(|| {
            let source = Source::Json {
                name,
                bytes: program_json,
            };
            let (compiled, reused) = self
                .target
                .compile(source, &options)
                .map_err(driver_error)?;
            Ok(CompiledGraph { compiled, reused })
        })
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
    /// by `owner`, each device holding its part as `spec` lays it out (whole when None). The CPU
    /// plugin aliases 64-byte aligned memory instead of copying.
    #[pyo3(signature = (address, nbytes, dtype_name, shape, owner, spec=None))]
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
    ) -> PyResult<DeviceBuffer> {
        let memory = PythonMemory::shared(address, nbytes, owner);
        self.upload(py, dtype(dtype_name)?, &shape, memory, spec)
    }

    /// A contiguous CPU tensor (`address`/`nbytes`, of `shape`) padded with zeros at the end of
    /// each dimension to `padded_shape` (a bucket's), on the devices as `spec` lays it out. The
    /// padded copy is made here, in aligned memory the CPU plugin aliases: the caller's tensor is
    /// read during the call only.
    #[pyo3(signature = (address, nbytes, dtype_name, shape, padded_shape, spec=None))]
    #[allow(clippy::too_many_arguments)]
    fn padded_buffer(
        &self,
        py: Python<'_>,
        address: usize,
        nbytes: usize,
        dtype_name: &str,
        shape: Vec<i64>,
        padded_shape: Vec<i64>,
        spec: Option<Spec>,
    ) -> PyResult<DeviceBuffer> {
        let element_type = dtype(dtype_name)?;
        // SAFETY: the caller passes a live, contiguous tensor of `nbytes` bytes, read here only,
        // while the caller holds it.
        let bytes = unsafe { host_bytes(address, nbytes) };
        let padded =
            HostTensor::resized_from(element_type, &shape, bytes, &padded_shape).map_err(error)?;
        self.upload(py, element_type, &padded_shape, Arc::new(padded), spec)
    }
}

impl Runtime {
    /// `memory` (a dense tensor of `shape`) on the devices, each holding its part as `spec` lays
    /// it out (whole when None), the GIL released.
    fn upload(
        &self,
        py: Python<'_>,
        element_type: DType,
        shape: &[i64],
        memory: Arc<dyn HostBytes>,
        spec: Option<Spec>,
    ) -> PyResult<DeviceBuffer> {
        let layout = self.layout(spec, shape.len())?;
        let buffers = py
            .detach(|| {
                self.target.client().upload_sharded(
                    element_type,
                    shape,
                    memory,
                    &layout,
                    self.target.devices(),
                )
            })
            .map_err(error)?;
        Ok(DeviceBuffer { buffers })
    }
}

/// A tensor's memory on the (one) device, to be given up to an execution that updates it in
/// place (`CompiledGraph.run_dlpack(..., donated=...)`); usable once.
#[pyclass(frozen, module = "tpuc._tpuc")]
struct DonatedBuffer {
    buffer: Mutex<Option<Buffer>>,
}

/// A tensor on the devices: one buffer per device (its part of the tensor), in mesh order.
#[pyclass(frozen, weakref, module = "tpuc._tpuc")]
struct DeviceBuffer {
    buffers: Vec<Buffer>,
}

#[pymethods]
impl DeviceBuffer {
    /// Copies the tensor (whole on one device) into `address`/`nbytes`, a contiguous CPU tensor
    /// of its dtype and shape, waiting for the computation that produces it.
    fn copy_to_host(&self, py: Python<'_>, address: usize, nbytes: usize) -> PyResult<()> {
        let [buffer] = self.buffers.as_slice() else {
            return Err(error(format!(
                "the tensor is split over {} devices: it has no one copy to read",
                self.buffers.len()
            )));
        };
        // SAFETY: the caller passes a live, contiguous tensor of `nbytes` bytes it does not touch
        // during the call.
        let dst = unsafe { host_bytes_mut(address, nbytes) };
        py.detach(|| buffer.copy_to_host(dst)).map_err(error)
    }
}

mod dlpack;
mod exported;

/// A graph compiled on a plugin.
#[pyclass(frozen, module = "tpuc._tpuc")]
struct CompiledGraph {
    compiled: Arc<Compiled>,
    /// Compiled before in this process: nothing was lowered or compiled now.
    reused: bool,
}

impl CompiledGraph {
    /// Executes the graph on `args`: its own arguments, then the prepared values, if any; the
    /// results per device.
    fn execute(
        &self,
        py: Python<'_>,
        args: &[PyRef<'_, DeviceBuffer>],
    ) -> PyResult<Vec<Vec<Buffer>>> {
        let expected = self.compiled.signature.args.len();
        if args.len() != expected {
            return Err(error(format!(
                "the graph takes {expected} arguments, {} given",
                args.len()
            )));
        }
        execute_on(py, &self.compiled.executable, args).map_err(error)
    }
}

impl CompiledGraph {
    /// Executes the graph on one device with `args` and the `donated` buffers at their
    /// positions, each given up to the result the graph aliases it to.
    fn execute_donating(
        &self,
        py: Python<'_>,
        args: &[PyRef<'_, DeviceBuffer>],
        donated: &[(usize, PyRef<'_, DonatedBuffer>)],
    ) -> PyResult<Vec<Buffer>> {
        let expected = self.compiled.signature.args.len();
        if args.len() + donated.len() != expected {
            return Err(error(format!(
                "the graph takes {expected} arguments, {} given",
                args.len() + donated.len()
            )));
        }
        let mut given = Vec::with_capacity(donated.len());
        for (position, buffer) in donated {
            let result = self
                .compiled
                .donations
                .iter()
                .find(|(p, _)| p == position)
                .map(|&(_, r)| r)
                .ok_or_else(|| error(format!("argument {position} is not updated in place")))?;
            let buffer = buffer
                .buffer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .ok_or_else(|| error("a donated buffer was given up already"))?;
            given.push((*position, result, buffer));
        }
        let list: Vec<&Buffer> = args
            .iter()
            .map(|a| {
                a.buffers
                    .first()
                    .ok_or_else(|| error("an argument has no buffer"))
            })
            .collect::<PyResult<_>>()?;
        py.detach(|| self.compiled.executable.execute_donating(&list, given))
            .map_err(error)
    }
}

/// Runs `exe` with `args` on every device that holds a part of them, the GIL released; the
/// results per device.
fn execute_on(
    py: Python<'_>,
    exe: &Executable,
    args: &[PyRef<'_, DeviceBuffer>],
) -> tpuc_pjrt::Result<Vec<Vec<Buffer>>> {
    let devices = args.first().map_or(1, |a| a.buffers.len());
    if args.iter().any(|a| a.buffers.len() != devices) {
        return Err(tpuc_pjrt::Error::Invalid(
            "the arguments are spread over different numbers of devices".into(),
        ));
    }
    let per_device: Vec<Vec<&Buffer>> = (0..devices)
        .map(|d| args.iter().map(|a| &a.buffers[d]).collect())
        .collect();
    py.detach(|| {
        if devices == 1 {
            return exe.execute_on_one_device(&per_device[0]).map(|r| vec![r]);
        }
        exe.execute(&per_device)
    })
}

#[pymethods]
impl CompiledGraph {
    /// The StableHLO module (MLIR text) the plugin compiled.
    #[getter]
    fn stablehlo(&self) -> &str {
        &self.compiled.stablehlo
    }

    /// The module in tpuc's own IR after its passes, as text (for reading; the plugin compiles
    /// `stablehlo`).
    #[getter]
    fn ir_text(&self) -> String {
        tpuc_hlo::ir::print(&self.compiled.ir)
    }

    /// Whether the graph was compiled before in this process (nothing was compiled now).
    #[getter]
    fn reused(&self) -> bool {
        self.reused
    }

    /// The StableHLO module computing what the graph derives from its stable arguments alone,
    /// when that was split off (its results are passed after the graph's own arguments).
    #[getter]
    fn prepared_stablehlo(&self) -> Option<&str> {
        self.compiled
            .prepared
            .as_ref()
            .map(|p| p.stablehlo.as_str())
    }

    /// Positions, among the graph's own arguments, of those the prepared values are computed
    /// from; None when nothing was split off.
    #[getter]
    fn prepared_args(&self) -> Option<Vec<usize>> {
        self.compiled.prepared.as_ref().map(|p| p.reads.clone())
    }

    /// Computes the prepared values from `args`, the arguments at `prepared_args`.
    fn prepare(
        &self,
        py: Python<'_>,
        args: Vec<PyRef<'_, DeviceBuffer>>,
    ) -> PyResult<Vec<DeviceBuffer>> {
        let prepared = self
            .compiled
            .prepared
            .as_ref()
            .ok_or_else(|| error("the graph has no prepared values"))?;
        if args.len() != prepared.reads.len() {
            return Err(error(format!(
                "the prepared values are computed from {} arguments, {} given",
                prepared.reads.len(),
                args.len()
            )));
        }
        let per_device = execute_on(py, &prepared.executable, &args).map_err(|e| {
            error(format!(
                "computing the values derived from the weights: {e}"
            ))
        })?;
        // per_device[d][i] regrouped as value i on every device.
        let mut values: Vec<Vec<Buffer>> = Vec::new();
        for on_device in per_device {
            for (i, buffer) in on_device.into_iter().enumerate() {
                if values.len() <= i {
                    values.resize_with(i + 1, Vec::new);
                }
                values[i].push(buffer);
            }
        }
        Ok(values
            .into_iter()
            .map(|buffers| DeviceBuffer { buffers })
            .collect())
    }

    /// Per own argument, its partition spec over the mesh (None when the graph runs on one
    /// device): how the caller must lay each argument out (`Runtime.buffer(..., spec)`).
    #[getter]
    fn arg_specs(&self) -> Vec<Option<Spec>> {
        let own = self.compiled.signature.own_args();
        self.compiled.ir.main.arg_attrs()[..own]
            .iter()
            .map(|a| a.sharding.as_ref().map(|s| s.dims.clone()))
            .collect()
    }

    /// Per output, its partition spec over the mesh (None when the graph runs on one device),
    /// as XLA's partitioner chose it for outputs left to it: split outputs are assembled from
    /// the devices' parts by `run`.
    #[getter]
    fn result_specs(&self) -> Vec<Option<Spec>> {
        self.compiled
            .ir
            .main
            .result_attrs()
            .iter()
            .map(|a| a.sharding.as_ref().map(|s| s.dims.clone()))
            .collect()
    }

    /// Whether every output is whole on every device, so that `run_dlpack` can alias the first
    /// device's.
    #[getter]
    fn outputs_whole(&self) -> bool {
        self.compiled.results_whole()
    }

    /// (dtype name, shape) of each output.
    #[getter]
    fn output_specs(&self) -> Vec<(&'static str, Vec<i64>)> {
        self.compiled
            .result_types
            .iter()
            .map(|t| (t.elem.name(), t.shape.clone()))
            .collect()
    }

    /// What each argument stands for, in order: `("input", i)` the graph's i-th input,
    /// `("seed", 0)` the seed of its random ops (two uint64), `("size", i)` the true value of
    /// the i-th symbolic size (an int64 scalar; `call_sizes`), `("derived", i)` the i-th value
    /// `prepare` computes. The one statement of the order the graph takes its arguments in.
    #[getter]
    fn arg_roles(&self) -> PyResult<Vec<(&'static str, usize)>> {
        let (mut inputs, mut sizes) = (0, 0);
        self.compiled
            .signature
            .args
            .iter()
            .map(|role| match role {
                ArgRole::UserInput(_) => {
                    inputs += 1;
                    Ok(("input", inputs - 1))
                }
                ArgRole::RngSeed => Ok(("seed", 0)),
                ArgRole::Derived(i) => Ok(("derived", *i)),
                ArgRole::Size(_) => {
                    sizes += 1;
                    Ok(("size", sizes - 1))
                }
                // The backend's graphs take everything as inputs.
                ArgRole::Weight(name) => Err(error(format!(
                    "internal error: the graph takes weight {name} from its archive"
                ))),
            })
            .collect()
    }

    /// The buckets the graph was compiled for (`s0=16, s1=32`), None when compiled for its
    /// sizes.
    #[getter]
    fn bucket(&self) -> Option<String> {
        self.compiled.padded.as_ref().map(|p| p.describe())
    }

    /// Why the graph was compiled for its sizes although buckets were asked for.
    #[getter]
    fn not_padded(&self) -> Option<&str> {
        self.compiled.not_padded.as_deref()
    }

    /// For a graph compiled for buckets: the call on inputs of shapes `input_shapes` (true
    /// sizes) as (the true value of each symbolic size, the true shape of each output). The
    /// caller pads each input to the graph's input shape with zeros and slices each output.
    fn call_sizes(&self, input_shapes: Vec<Vec<i64>>) -> PyResult<(Vec<i64>, Vec<Vec<i64>>)> {
        let padded = self
            .compiled
            .padded
            .as_ref()
            .ok_or_else(|| error("the graph was not compiled for buckets"))?;
        let shapes: Vec<Vec<i64>> = self
            .compiled
            .result_types
            .iter()
            .map(|t| t.shape.clone())
            .collect();
        let sizes = padded
            .call_sizes(&input_shapes, &shapes)
            .map_err(driver_error)?;
        Ok((sizes.values, sizes.results))
    }

    /// Positions, among the graph's inputs, of those with a padded dimension (a graph compiled
    /// for buckets; none otherwise).
    #[getter]
    fn padded_inputs(&self) -> Vec<usize> {
        self.compiled.padded.as_ref().map_or_else(Vec::new, |p| {
            let padded = p
                .inputs
                .iter()
                .map(|(_, dims)| dims.iter().any(Option::is_some));
            padded
                .enumerate()
                .filter(|(_, p)| *p)
                .map(|(i, _)| i)
                .collect()
        })
    }

    /// The shape of each argument the graph itself takes, in order (padded inputs at their
    /// buckets).
    #[getter]
    fn arg_shapes(&self) -> Vec<Vec<i64>> {
        let own = self.compiled.signature.own_args();
        self.compiled.arg_types[..own]
            .iter()
            .map(|t| t.shape.clone())
            .collect()
    }

    /// (argument position, output index) of each argument the graph updates in place: given
    /// up as a donated buffer, the output takes its memory.
    #[getter]
    fn donations(&self) -> Vec<(usize, usize)> {
        self.compiled.donations.clone()
    }

    /// How many arguments the graph itself takes (the prepared values come after them).
    #[getter]
    fn num_args(&self) -> usize {
        self.compiled.signature.own_args()
    }

    /// Whether the graph has random ops: its last own argument is then their seed, two uint64.
    #[getter]
    fn random(&self) -> bool {
        self.compiled.signature.args.contains(&ArgRole::RngSeed)
    }

    /// What the cache of compiled executables on disk did: "hit" (loaded, not compiled),
    /// "stored" (compiled and stored), "not stored: <why>" (compiled; the cache could not store
    /// it) or "off".
    #[getter]
    fn cache(&self) -> String {
        self.compiled.cache.summary()
    }

    /// Seconds spent in tpuc's pipeline (reading, lowering, passes, emission) and in the
    /// plugin's compiler (or loading from the cache).
    #[getter]
    fn timings(&self) -> (f64, f64) {
        let t = &self.compiled.timings;
        (
            (t.read + t.lower + t.passes + t.emit).as_secs_f64(),
            t.compile.as_secs_f64(),
        )
    }

    /// Runs the graph on `args` and returns its outputs as DLPack capsules that alias the
    /// plugin's output memory (for plugins whose device memory is host memory: the CPU
    /// plugin). `torch.from_dlpack` turns each into a tensor without a copy.
    ///
    /// `donated`: (argument position, buffer) of arguments given up to results that take their
    /// memory (`donations`); `args` then lacks those positions. `shapes`: the shape each result
    /// is wanted at (a graph compiled for buckets: the true sizes, from `call_sizes`); a result
    /// computed at a larger shape is handed over as a copy of its leading part.
    #[pyo3(signature = (args, donated=None, shapes=None))]
    fn run_dlpack<'py>(
        &self,
        py: Python<'py>,
        args: Vec<PyRef<'py, DeviceBuffer>>,
        donated: Option<Vec<(usize, PyRef<'py, DonatedBuffer>)>>,
        shapes: Option<Vec<Vec<i64>>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        if !self.compiled.results_whole() {
            return Err(error(
                "the graph's results are split over the devices: run it with destinations (run)",
            ));
        }
        self.check_shapes(shapes.as_ref())?;
        let results = match donated {
            None => self.execute(py, &args)?.swap_remove(0),
            Some(donated) => self.execute_donating(py, &args, &donated)?,
        };
        results
            .into_iter()
            .zip(&self.compiled.result_types)
            .enumerate()
            .map(|(i, (buffer, ty))| {
                let wanted = self.wanted(shapes.as_ref(), i);
                if *wanted == ty.shape {
                    return dlpack::capsule(py, dlpack::Memory::Device(buffer), ty.elem, wanted);
                }
                let part = py
                    .detach(|| leading_part(&buffer, ty.elem, &ty.shape, wanted))
                    .map_err(|e| error(format!("output {i}: {e}")))?;
                dlpack::capsule(py, dlpack::Memory::Host(part), ty.elem, wanted)
            })
            .collect()
    }

    /// Starts the graph on `args` (on one device) and returns its outputs where they are, on
    /// the device, without waiting for it to finish: the next execution (or a copy to the host)
    /// reading them waits, and an error of this one is that reader's.
    fn run_on_device(
        &self,
        py: Python<'_>,
        args: Vec<PyRef<'_, DeviceBuffer>>,
    ) -> PyResult<Vec<DeviceBuffer>> {
        let expected = self.compiled.signature.args.len();
        if args.len() != expected {
            return Err(error(format!(
                "the graph takes {expected} arguments, {} given",
                args.len()
            )));
        }
        let list: Vec<&Buffer> = args
            .iter()
            .map(|a| match a.buffers.as_slice() {
                [one] => Ok(one),
                parts => Err(error(format!(
                    "an argument is spread over {} devices; run_on_device runs on one",
                    parts.len()
                ))),
            })
            .collect::<PyResult<_>>()?;
        let outputs = py
            .detach(|| self.compiled.executable.launch_on_one_device(&list))
            .map_err(error)?;
        Ok(outputs
            .into_iter()
            .map(|buffer| DeviceBuffer {
                buffers: vec![buffer],
            })
            .collect())
    }

    /// Runs the graph on `args` and copies output `i` to `outputs[i]` = (address, nbytes) of a
    /// contiguous CPU tensor of that output's dtype and of its shape in `shapes` (as in
    /// `run_dlpack`; the output's own shape when None).
    #[pyo3(signature = (args, outputs, shapes=None))]
    fn run(
        &self,
        py: Python<'_>,
        args: Vec<PyRef<'_, DeviceBuffer>>,
        outputs: Vec<(usize, usize)>,
        shapes: Option<Vec<Vec<i64>>>,
    ) -> PyResult<()> {
        let count = self.compiled.result_types.len();
        if outputs.len() != count {
            return Err(error(format!(
                "the graph has {count} outputs, {} destinations given",
                outputs.len()
            )));
        }
        self.check_shapes(shapes.as_ref())?;
        let per_device = self.execute(py, &args)?;
        py.detach(|| {
            for (i, &(address, nbytes)) in outputs.iter().enumerate() {
                // SAFETY: the caller passes a live, contiguous tensor of `nbytes` bytes it does
                // not touch while the graph runs.
                let dst = unsafe { host_bytes_mut(address, nbytes) };
                let (ty, wanted) = (
                    &self.compiled.result_types[i],
                    self.wanted(shapes.as_ref(), i),
                );
                let fail = |e: &dyn std::fmt::Display| error(format!("output {i}: {e}"));
                // Each result whole, from the devices' parts where it is split over them.
                if *wanted == ty.shape {
                    self.compiled
                        .result_to_host(&per_device, i, dst)
                        .map_err(|e| fail(&e))?;
                    continue;
                }
                let mut whole = HostTensor::zeros(ty.elem, &ty.shape).map_err(|e| fail(&e))?;
                self.compiled
                    .result_to_host(&per_device, i, whole.bytes_mut())
                    .map_err(|e| fail(&e))?;
                let part = whole.resized(wanted).map_err(|e| fail(&e))?;
                if part.bytes().len() != dst.len() {
                    return Err(fail(&format!(
                        "{} bytes of destination for {} bytes",
                        dst.len(),
                        part.bytes().len()
                    )));
                }
                dst.copy_from_slice(part.bytes());
            }
            Ok(())
        })
    }
}

impl CompiledGraph {
    /// Checks that `shapes`, when given, has one shape per result.
    fn check_shapes(&self, shapes: Option<&Vec<Vec<i64>>>) -> PyResult<()> {
        let count = self.compiled.result_types.len();
        match shapes {
            Some(shapes) if shapes.len() != count => Err(error(format!(
                "the graph has {count} outputs, {} shapes given",
                shapes.len()
            ))),
            _ => Ok(()),
        }
    }

    /// The shape result `i` is wanted at: its entry in `shapes` (checked) or its own.
    fn wanted<'a>(&'a self, shapes: Option<&'a Vec<Vec<i64>>>, i: usize) -> &'a Vec<i64> {
        shapes.map_or(&self.compiled.result_types[i].shape, |s| &s[i])
    }
}

/// The `nbytes` bytes at `address` (none when `nbytes` is 0, whatever the address).
///
/// # Safety
/// `address` must hold `nbytes` readable bytes, unchanged while the slice is used.
pub(crate) unsafe fn host_bytes<'a>(address: usize, nbytes: usize) -> &'a [u8] {
    if nbytes == 0 {
        return &[];
    }
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts(address as *const u8, nbytes) }
}

/// The `nbytes` writable bytes at `address` (none when `nbytes` is 0, whatever the address).
///
/// # Safety
/// `address` must hold `nbytes` writable bytes nothing else reads or writes while the slice is
/// used.
unsafe fn host_bytes_mut<'a>(address: usize, nbytes: usize) -> &'a mut [u8] {
    if nbytes == 0 {
        return &mut [];
    }
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts_mut(address as *mut u8, nbytes) }
}

/// The leading `shape` part of `buffer`, a dense `element_type` tensor of shape `dims` in
/// host-addressable memory.
fn leading_part(
    buffer: &Buffer,
    element_type: DType,
    dims: &[i64],
    shape: &[i64],
) -> tpuc_pjrt::Result<HostTensor> {
    let address = buffer.device_address()?;
    let nbytes = dims.iter().product::<i64>() as usize * element_type.byte_size();
    // SAFETY: the executable finished writing the buffer (execution waits for it), which holds
    // a dense tensor of `dims` in host memory and lives for this call.
    let bytes = unsafe { host_bytes(address, nbytes) };
    HostTensor::resized_from(element_type, dims, bytes, shape)
}

/// The bucket policy `text` (`pow2`, `pow2:MIN`, `64,128,256`) in its canonical form; an error
/// naming what is wrong with it.
#[pyfunction]
fn parse_buckets(text: &str) -> PyResult<String> {
    Buckets::parse(text).map(|b| b.to_string()).map_err(error)
}

/// Runs the `tpuc` command line `argv` (the program's name first) as the `tpuc` binary does,
/// looking for PJRT plugins in `search_paths` (the interpreter's `sys.path`) first; its exit
/// status.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>, search_paths: Vec<std::path::PathBuf>) -> u8 {
    py.detach(|| tpuc_cli::cli::main(argv.into_iter().map(Into::into), &search_paths))
}

/// What the cache of compiled executables in `cache_dir` (None: $TPUC_CACHE_DIR or the default)
/// did, from its record: requests, hits, misses, refused, compile_seconds and the misses by
/// reason; None when the cache is off.
#[pyfunction]
#[pyo3(signature = (cache_dir=None))]
fn cache_stats(
    py: Python<'_>,
    cache_dir: Option<String>,
) -> PyResult<Option<Py<pyo3::types::PyDict>>> {
    let Some(cache) = tpuc_pjrt::CompileCache::configured(cache_dir.as_deref()).map_err(error)?
    else {
        return Ok(None);
    };
    let stats = py.detach(|| cache.stats());
    let dict = pyo3::types::PyDict::new(py);
    dict.set_item("directory", cache.dir())?;
    dict.set_item("requests", stats.requests)?;
    dict.set_item("hits", stats.hits)?;
    dict.set_item("misses", stats.misses)?;
    dict.set_item("refused", stats.refused)?;
    dict.set_item("compile_seconds", stats.compile_seconds)?;
    dict.set_item("miss_reasons", stats.reasons)?;
    Ok(Some(dict.unbind()))
}

#[pymodule]
fn _tpuc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(supported_ops, m)?)?;
    m.add_function(wrap_pyfunction!(is_supported, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(matmul_precisions, m)?)?;
    m.add_function(wrap_pyfunction!(source_line, m)?)?;
    m.add_function(wrap_pyfunction!(resolve_plan, m)?)?;
    m.add_function(wrap_pyfunction!(mesh_axes, m)?)?;
    m.add_function(wrap_pyfunction!(parse_buckets, m)?)?;
    m.add_class::<Runtime>()?;
    m.add_class::<exported::ExportedProgram>()?;
    m.add_class::<DeviceBuffer>()?;
    m.add_class::<DonatedBuffer>()?;
    m.add_class::<CompiledGraph>()?;
    m.add("TpucError", m.py().get_type::<TpucError>())?;
    Ok(())
}
