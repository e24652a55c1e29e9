//! `tpuc._tpuc`: the compiler and the PJRT runtime, in process, for the Python package `tpuc`
//! (the torch.compile backend). Graphs arrive as torch.export's serialized `ExportedProgram`
//! JSON; tensors as (address, size) of torch's own CPU memory, which device buffers alias where
//! the plugin allows and outputs are copied into.
use prepared::Prepared;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tpuc_hlo::{ArgRole, EmitFormat, KernelLayout, LowerOptions, Precision, WeightsMode};
use tpuc_pjrt::{
    compile_with_cache, Buffer, CacheOutcome, Client, ClientOptions, CompileCache, CompileOptions,
    Device, ElementType, Executable, HostBytes, Plugin,
};

pyo3::create_exception!(
    _tpuc,
    TpucError,
    PyRuntimeError,
    "An error from tpuc's compiler or runtime."
);

fn error(e: impl std::fmt::Display) -> PyErr {
    TpucError::new_err(e.to_string())
}

fn error_with_causes(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> PyErr {
    let e = e.into();
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        message += &format!(": {cause}");
        source = cause.source();
    }
    TpucError::new_err(message)
}

/// A lowering error; one that a node caused names it in the exception's `node` and `op`
/// attributes, so the backend can run that node in eager torch.
fn lowering_error(e: tpuc_hlo::LowerError) -> PyErr {
    let err = TpucError::new_err(e.to_string());
    if let tpuc_hlo::LowerError::Node { node, target, .. } = &e {
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

/// A client of one PJRT plugin.
#[pyclass(frozen, module = "tpuc._tpuc")]
struct Runtime {
    client: Client,
    /// The device graphs run on (looked up once: every input upload needs it).
    device: Device,
    plugin_path: String,
    /// The kernel layout of hoisted convolution weights: the one XLA:CPU's convolutions read on
    /// the CPU plugin; elsewhere torch's (the plugin's compiler picks its own).
    conv_kernels: KernelLayout,
}

/// Memory owned by a Python object (a torch tensor) that a device buffer aliases; holding the
/// object keeps the memory alive.
struct PythonMemory {
    address: usize,
    len: usize,
    _owner: Py<PyAny>,
}

impl HostBytes for PythonMemory {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the owner (a contiguous CPU tensor, checked by the caller) holds `len` bytes at
        // `address` and stays alive, unmodified, as long as this value.
        unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) }
    }
}

fn element_type(name: &str) -> PyResult<ElementType> {
    ElementType::from_name(name)
        .ok_or_else(|| error(format!("tpuc does not handle tensors of dtype {name}")))
}

#[pymethods]
impl Runtime {
    /// A client of `plugin` (a name: cpu, tpu, cuda; or a path; default $TPUC_PJRT_PLUGIN or
    /// cpu). A named plugin is looked for in `search_paths` first: the running interpreter's
    /// `sys.path`, which says where its packages are whatever the working directory or
    /// environment.
    #[new]
    #[pyo3(signature = (plugin=None, search_paths=Vec::new()))]
    fn new(py: Python<'_>, plugin: Option<String>, search_paths: Vec<String>) -> PyResult<Self> {
        let search_paths: Vec<std::path::PathBuf> =
            search_paths.into_iter().map(Into::into).collect();
        py.detach(|| {
            let path =
                tpuc_pjrt::discover::resolve_in(plugin.as_deref(), &search_paths).map_err(error)?;
            let loaded = Plugin::load(&path).map_err(error)?;
            // The backend runs each graph on one device; the CPU plugin otherwise makes four.
            let options = ClientOptions {
                cpu_device_count: tpuc_pjrt::discover::is_cpu_plugin(&path).then_some(1),
                ..ClientOptions::default()
            };
            let client = Client::new(&loaded, &options).map_err(|e| {
                error(format!(
                    "the PJRT plugin {} cannot start: {e}",
                    path.display()
                ))
            })?;
            let device = client
                .addressable_devices()
                .map_err(error)?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    error(format!("the PJRT plugin {} has no device", path.display()))
                })?;
            let conv_kernels = if tpuc_pjrt::discover::is_cpu_plugin(&path) {
                KernelLayout::SpatialInOut
            } else {
                KernelLayout::OutInSpatial
            };
            Ok(Runtime {
                client,
                device,
                plugin_path: path.display().to_string(),
                conv_kernels,
            })
        })
    }

    #[getter]
    fn platform(&self) -> PyResult<String> {
        self.client.platform_name().map_err(error)
    }

    #[getter]
    fn plugin_path(&self) -> &str {
        &self.plugin_path
    }

    /// Lowers a serialized ExportedProgram (all tensors as inputs) and compiles it on the plugin.
    /// `stable`: one flag per program input, true for those that stay the same from call to
    /// call (a model's weights); what the graph computes from them alone and is worth
    /// computing once is then split off into a second executable (`tpuc_hlo::hoist`).
    /// `cache_dir`: the cache of compiled executables (`tpuc_pjrt::CompileCache`); `None` for
    /// $TPUC_CACHE_DIR or the default, `"off"` for none.
    #[pyo3(signature = (program_json, name, matmul_precision="highest", stable=None, cache_dir=None))]
    fn compile(
        &self,
        py: Python<'_>,
        program_json: &[u8],
        name: &str,
        matmul_precision: &str,
        stable: Option<Vec<bool>>,
        cache_dir: Option<&str>,
    ) -> PyResult<CompiledGraph> {
        let precision = match matmul_precision {
            "highest" => Precision::Highest,
            "high" => Precision::High,
            "default" => Precision::Default,
            other => {
                return Err(error(format!(
                    "matmul_precision must be highest, high or default, not {other:?}"
                )))
            }
        };
        py.detach(|| {
            let start = Instant::now();
            let program = tpuc_fx::program_from_json(Path::new(name), program_json)
                .map_err(error_with_causes)?;
            let options = LowerOptions {
                weights: WeightsMode::Args,
                precision,
            };
            let lowered = tpuc_hlo::lower(&program, &options).map_err(lowering_error)?;
            let hoisted = match &stable {
                Some(flags) => {
                    let flags = stable_arguments(&lowered.args, flags)?;
                    tpuc_hlo::hoist::hoist(&lowered.module, &flags, self.conv_kernels)
                }
                None => None,
            };
            let emit = |module: &tpuc_hlo::Module| {
                tpuc_hlo::emit(module, EmitFormat::Text).map_err(error_with_causes)
            };
            let module = emit(hoisted.as_ref().map_or(&lowered.module, |h| &h.main))?;
            let hoisted = match hoisted {
                Some(h) => Some((emit(&h.prep)?, h)),
                None => None,
            };
            let lower_seconds = start.elapsed().as_secs_f64();
            let start = Instant::now();
            let cache = CompileCache::configured(cache_dir).map_err(error)?;
            let mut cache_outcomes = Vec::new();
            let mut compile = |module: &[u8]| {
                let options = CompileOptions::single_device();
                let (exe, outcome) =
                    compile_with_cache(&self.client, module, &options, cache.as_ref()).map_err(
                        |e| error(format!("{name}: the plugin cannot compile the module: {e}")),
                    )?;
                cache_outcomes.extend(outcome);
                Ok::<_, PyErr>(exe)
            };
            let exe = compile(&module)?;
            let prepared = match hoisted {
                Some((text, h)) => Some(Prepared {
                    exe: compile(&text)?,
                    args: h.args,
                    outputs: h.prep.main.results.len(),
                    stablehlo: String::from_utf8_lossy(&text).into_owned(),
                }),
                None => None,
            };
            let outputs = lowered
                .module
                .main
                .result_types()
                .iter()
                .map(|t| (tpuc_cli::run::element_type(t.elem), t.shape.clone()))
                .collect();
            Ok(CompiledGraph {
                exe,
                stablehlo: String::from_utf8_lossy(&module).into_owned(),
                outputs,
                num_args: lowered.args.len(),
                random: lowered.args.last() == Some(&ArgRole::RngSeed),
                prepared,
                lower_seconds,
                compile_seconds: start.elapsed().as_secs_f64(),
                cache: match cache {
                    None => "off".into(),
                    Some(_) => cache_summary(&cache_outcomes),
                },
            })
        })
    }

    /// A device buffer holding a tensor's data: `address`/`nbytes` of a contiguous CPU tensor
    /// kept alive by `owner`. The CPU plugin aliases 64-byte aligned memory instead of copying.
    fn buffer(
        &self,
        py: Python<'_>,
        address: usize,
        nbytes: usize,
        dtype: &str,
        shape: Vec<i64>,
        owner: Py<PyAny>,
    ) -> PyResult<DeviceBuffer> {
        let element_type = element_type(dtype)?;
        let memory: Arc<dyn HostBytes> = Arc::new(PythonMemory {
            address,
            len: nbytes,
            _owner: owner,
        });
        let buffer = py
            .detach(|| {
                self.client
                    .buffer_sharing(element_type, &shape, memory, &self.device)
            })
            .map_err(error)?;
        Ok(DeviceBuffer { buffer })
    }
}

/// A tensor on a device.
#[pyclass(frozen, weakref, module = "tpuc._tpuc")]
struct DeviceBuffer {
    buffer: Buffer,
}

mod dlpack;
mod prepared;

/// One flag per argument of the lowered module from one per program input: weights of the
/// program are stable, the random seed is not.
fn stable_arguments(roles: &[ArgRole], inputs: &[bool]) -> PyResult<Vec<bool>> {
    let mut given = inputs.iter();
    let flags: Vec<bool> = roles
        .iter()
        .map(|role| match role {
            ArgRole::Weight(_) => Some(true),
            ArgRole::UserInput(_) => given.next().copied(),
            ArgRole::RngSeed => Some(false),
        })
        .collect::<Option<_>>()
        .ok_or_else(|| {
            error(format!(
                "{} stable flags given for more program inputs",
                inputs.len()
            ))
        })?;
    if given.next().is_some() {
        return Err(error(format!(
            "{} stable flags given for fewer program inputs",
            inputs.len()
        )));
    }
    Ok(flags)
}

/// A graph compiled on a plugin.
#[pyclass(frozen, module = "tpuc._tpuc")]
struct CompiledGraph {
    exe: Executable,
    stablehlo: String,
    /// Element type and shape of each output, known from the lowering.
    outputs: Vec<(ElementType, Vec<i64>)>,
    num_args: usize,
    /// The last argument is the seed of the graph's random ops.
    random: bool,
    /// What the graph computes from its stable arguments alone, split off; its results are
    /// passed after the graph's own arguments.
    prepared: Option<Prepared>,
    lower_seconds: f64,
    compile_seconds: f64,
    /// What the cache of compiled executables did: see `CompiledGraph.cache`.
    cache: String,
}

/// One word for what the cache did with a graph's executables (the graph's own and the prepared
/// one): "hit" when both were loaded, "stored" when one was compiled, "not stored: why".
fn cache_summary(outcomes: &[CacheOutcome]) -> String {
    if let Some(CacheOutcome::NotStored(reason)) = outcomes
        .iter()
        .find(|o| matches!(o, CacheOutcome::NotStored(_)))
    {
        return format!("not stored: {reason}");
    }
    if outcomes.iter().all(|o| *o == CacheOutcome::Hit) {
        "hit".into()
    } else {
        "stored".into()
    }
}

impl CompiledGraph {
    /// Executes the graph on `args`: its own arguments, then the prepared values, if any.
    fn execute(&self, py: Python<'_>, args: &[PyRef<'_, DeviceBuffer>]) -> PyResult<Vec<Buffer>> {
        let expected = self.num_args + self.prepared.as_ref().map_or(0, |p| p.outputs);
        if args.len() != expected {
            return Err(error(format!(
                "the graph takes {expected} arguments, {} given",
                args.len()
            )));
        }
        execute_on(py, &self.exe, args).map_err(error)
    }
}

/// Runs `exe` on one device with `args`, the GIL released.
fn execute_on(
    py: Python<'_>,
    exe: &Executable,
    args: &[PyRef<'_, DeviceBuffer>],
) -> tpuc_pjrt::Result<Vec<Buffer>> {
    let buffers: Vec<&Buffer> = args.iter().map(|a| &a.buffer).collect();
    py.detach(|| exe.execute_on_one_device(&buffers))
}

#[pymethods]
impl CompiledGraph {
    /// The StableHLO module (MLIR text) the plugin compiled.
    #[getter]
    fn stablehlo(&self) -> &str {
        &self.stablehlo
    }

    /// The StableHLO module computing what the graph derives from its stable arguments alone,
    /// when that was split off (its results are passed after the graph's own arguments).
    #[getter]
    fn prepared_stablehlo(&self) -> Option<&str> {
        self.prepared.as_ref().map(|p| p.stablehlo.as_str())
    }

    /// Positions, among the graph's own arguments, of those the prepared values are computed
    /// from; None when nothing was split off.
    #[getter]
    fn prepared_args(&self) -> Option<Vec<usize>> {
        self.prepared.as_ref().map(|p| p.args.clone())
    }

    /// Computes the prepared values from `args`, the arguments at `prepared_args`.
    fn prepare(
        &self,
        py: Python<'_>,
        args: Vec<PyRef<'_, DeviceBuffer>>,
    ) -> PyResult<Vec<DeviceBuffer>> {
        let prepared = self
            .prepared
            .as_ref()
            .ok_or_else(|| error("the graph has no prepared values"))?;
        if args.len() != prepared.args.len() {
            return Err(error(format!(
                "the prepared values are computed from {} arguments, {} given",
                prepared.args.len(),
                args.len()
            )));
        }
        let values = execute_on(py, &prepared.exe, &args).map_err(|e| {
            error(format!(
                "computing the values derived from the weights: {e}"
            ))
        })?;
        Ok(values
            .into_iter()
            .map(|buffer| DeviceBuffer { buffer })
            .collect())
    }

    /// (dtype name, shape) of each output.
    #[getter]
    fn output_specs(&self) -> Vec<(&'static str, Vec<i64>)> {
        self.outputs
            .iter()
            .map(|(t, shape)| (t.name(), shape.clone()))
            .collect()
    }

    #[getter]
    fn num_args(&self) -> usize {
        self.num_args
    }

    /// Whether the graph has random ops: its last argument is then their seed, two uint64.
    #[getter]
    fn random(&self) -> bool {
        self.random
    }

    /// What the cache of compiled executables did: "hit" (loaded, not compiled), "stored"
    /// (compiled and stored), "not stored: <why>" (compiled; the cache could not store it) or
    /// "off".
    #[getter]
    fn cache(&self) -> &str {
        &self.cache
    }

    /// Seconds spent lowering to StableHLO and in the plugin's compiler (or loading from the
    /// cache).
    #[getter]
    fn timings(&self) -> (f64, f64) {
        (self.lower_seconds, self.compile_seconds)
    }

    /// Runs the graph on `args` and returns its outputs as DLPack capsules that alias the
    /// plugin's output memory (for plugins whose device memory is host memory: the CPU
    /// plugin). `torch.from_dlpack` turns each into a tensor without a copy.
    fn run_dlpack<'py>(
        &self,
        py: Python<'py>,
        args: Vec<PyRef<'py, DeviceBuffer>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.execute(py, &args)?
            .into_iter()
            .zip(&self.outputs)
            .map(|(b, (element_type, shape))| dlpack::capsule(py, b, *element_type, shape))
            .collect()
    }

    /// Runs the graph on `args` and copies output `i` to `outputs[i]` = (address, nbytes) of a
    /// contiguous CPU tensor of that output's dtype and shape.
    fn run(
        &self,
        py: Python<'_>,
        args: Vec<PyRef<'_, DeviceBuffer>>,
        outputs: Vec<(usize, usize)>,
    ) -> PyResult<()> {
        if outputs.len() != self.outputs.len() {
            return Err(error(format!(
                "the graph has {} outputs, {} destinations given",
                self.outputs.len(),
                outputs.len()
            )));
        }
        let results = self.execute(py, &args)?;
        py.detach(|| {
            for (i, (result, &(address, nbytes))) in results.iter().zip(&outputs).enumerate() {
                let dst: &mut [u8] = if nbytes == 0 {
                    &mut []
                } else {
                    // SAFETY: the caller passes a live, contiguous tensor of `nbytes` bytes it
                    // does not touch while the graph runs.
                    unsafe { std::slice::from_raw_parts_mut(address as *mut u8, nbytes) }
                };
                result
                    .copy_to_host(dst)
                    .map_err(|e| error(format!("output {i}: {e}")))?;
            }
            Ok(())
        })
    }
}

#[pymodule]
fn _tpuc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(supported_ops, m)?)?;
    m.add_function(wrap_pyfunction!(is_supported, m)?)?;
    m.add_class::<Runtime>()?;
    m.add_class::<DeviceBuffer>()?;
    m.add_class::<CompiledGraph>()?;
    m.add("TpucError", m.py().get_type::<TpucError>())?;
    Ok(())
}
