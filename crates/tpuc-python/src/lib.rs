//! `tpuc._tpuc`: the compiler and the PJRT runtime, in process, for the Python package `tpuc`
//! (the torch.compile backend). Graphs arrive as torch.export's serialized `ExportedProgram`
//! JSON and go through `tpuc_driver`'s pipeline; tensors arrive as (address, size) of torch's
//! own CPU memory, which device buffers alias where the plugin allows and outputs are copied
//! into.
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tpuc_pjrt::DType;

pyo3::create_exception!(
    _tpuc,
    TpucError,
    PyRuntimeError,
    "An error from tpuc's compiler or runtime."
);
pyo3::create_exception!(
    _tpuc,
    LoweringError,
    TpucError,
    "A node tpuc cannot lower with its arguments: `node` (its name), `op` (the ATen overload) and \
     `source` (the user's `file:line`, or None)."
);
pyo3::create_exception!(
    _tpuc,
    UnsupportedOpsError,
    TpucError,
    "Ops tpuc has no lowering for: `ops`, their overload names."
);
pyo3::create_exception!(
    _tpuc,
    DynamicSizeError,
    TpucError,
    "A program whose sizes are not static: `value_decided` is true when tensor values decide \
     them (no size given before the run can fix them)."
);
pyo3::create_exception!(
    _tpuc,
    PluginError,
    TpucError,
    "The PJRT plugin failed to start, compile or run."
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

/// A pipeline error as the Python exception of its kind (`LoweringError` with the node, `op`
/// and source; `UnsupportedOpsError` with the ops; `DynamicSizeError`; `PluginError`), so that
/// callers tell them apart without reading their text.
pub(crate) fn driver_error(e: tpuc_driver::Error) -> PyErr {
    use tpuc_driver::Error as E;
    use tpuc_hlo::LowerError as L;
    let message = message_with_causes(&e);
    let lowering = match &e {
        E::Lower { source, .. } => Some(&**source),
        _ => None,
    };
    let err = match (&e, lowering) {
        (_, Some(L::Node { .. })) => LoweringError::new_err(message),
        (_, Some(L::Unsupported(_))) => UnsupportedOpsError::new_err(message),
        (_, Some(L::Symbolic(_) | L::ValueDecided(_))) => DynamicSizeError::new_err(message),
        (E::Start { .. } | E::Compile { .. } | E::Pjrt(_), _) => PluginError::new_err(message),
        _ => TpucError::new_err(message),
    };
    Python::attach(|py| {
        let value = err.value(py);
        // Setting attributes on a fresh exception object cannot fail in practice; if it did,
        // the error would still carry its message.
        match lowering {
            Some(L::Node {
                node,
                target,
                location,
                ..
            }) => {
                let _ = value.setattr("node", node);
                let _ = value.setattr("op", target);
                let _ = value.setattr("source", location.as_ref().map(|l| l.to_string()));
            }
            Some(L::Unsupported(list)) => {
                let mut ops: Vec<&str> = list.iter().map(|u| u.target.as_str()).collect();
                ops.dedup();
                let _ = value.setattr("ops", ops);
            }
            Some(L::Symbolic(_)) => {
                let _ = value.setattr("value_decided", false);
            }
            Some(L::ValueDecided(_)) => {
                let _ = value.setattr("value_decided", true);
            }
            _ => {}
        }
    });
    err
}

/// Bytes in binary units as tpuc's reports print them (`1.5 GiB`).
#[pyfunction]
fn human_bytes(bytes: u64) -> String {
    tpuc_driver::doctor::human_bytes(bytes)
}

/// A workload (the JSON of `tpuc doctor`'s `workload`, a model's graphs summed) projected onto
/// the accelerator `target` names: the projection's JSON and its text (docs/doctor.md).
#[pyfunction]
fn project(workload_json: &str, target: &str) -> PyResult<(String, String)> {
    use tpuc_driver::doctor;
    let workload: doctor::Workload = serde_json::from_str(workload_json).map_err(error)?;
    let chip = doctor::Accelerator::named(target).map_err(driver_error)?;
    let projection = doctor::project(&workload, chip).map_err(driver_error)?;
    let json = serde_json::to_string(&projection).map_err(error)?;
    Ok((json, doctor::projection_text(&projection)))
}

/// The self-contained HTML page of a doctor report's JSON (docs/doctor.md), titled `title`.
#[pyfunction]
fn doctor_page(title: &str, report_json: &str) -> String {
    tpuc_driver::doctor::page(title, report_json)
}

/// The name of the accelerator `target` names (an alias resolved), or an error listing those
/// tpuc knows.
#[pyfunction]
fn target_name(target: &str) -> PyResult<&'static str> {
    let chip = tpuc_driver::doctor::Accelerator::named(target).map_err(driver_error)?;
    Ok(chip.name)
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

/// The user's source line (`file:line`) in a stack trace torch recorded on a node: the
/// innermost frame outside installed packages.
#[pyfunction]
fn source_line(stack_trace: &str) -> Option<String> {
    tpuc_fx::source::user_frame(stack_trace).map(|s| format!("{}:{}", s.file, s.line))
}

/// A partition spec from Python: per dimension, the mesh axes that split it.
pub(crate) type Spec = Vec<Vec<String>>;

/// The element type torch names `name` (`float32`), or an error naming it.
pub(crate) fn dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name)
        .ok_or_else(|| error(format!("tpuc does not handle tensors of dtype {name}")))
}

mod compiled;
mod dlpack;
mod exported;
mod native;
mod options;
mod runtime;

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

/// The `len` values at `address` (none when `len` is 0, whatever the address).
///
/// # Safety
/// `address` must hold `len` readable values, unchanged while the slice is used.
pub(crate) unsafe fn host_slice<'a, T>(address: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts(address, len) }
}

/// The `nbytes` writable bytes at `address` (none when `nbytes` is 0, whatever the address).
///
/// # Safety
/// `address` must hold `nbytes` writable bytes nothing else reads or writes while the slice is
/// used.
pub(crate) unsafe fn host_bytes_mut<'a>(address: usize, nbytes: usize) -> &'a mut [u8] {
    if nbytes == 0 {
        return &mut [];
    }
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts_mut(address as *mut u8, nbytes) }
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

/// The directory of the eager device's plans in the cache of `cache_dir` (None:
/// $TPUC_CACHE_DIR or the default) and the cache's size limit in bytes; None when the cache is
/// off.
#[pyfunction]
#[pyo3(signature = (cache_dir=None))]
fn device_plans_dir(cache_dir: Option<String>) -> PyResult<Option<(std::path::PathBuf, u64)>> {
    let cache = tpuc_pjrt::CompileCache::configured(cache_dir.as_deref()).map_err(error)?;
    Ok(cache.map(|cache| (cache.device_plans_dir(), cache.max_bytes())))
}

#[pymodule]
fn _tpuc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(device_plans_dir, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(supported_ops, m)?)?;
    m.add_function(wrap_pyfunction!(human_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(project, m)?)?;
    m.add_function(wrap_pyfunction!(target_name, m)?)?;
    m.add_function(wrap_pyfunction!(doctor_page, m)?)?;
    m.add_function(wrap_pyfunction!(is_supported, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(source_line, m)?)?;
    m.add_function(wrap_pyfunction!(native::native_api, m)?)?;
    m.add_function(wrap_pyfunction!(native::element_types, m)?)?;
    m.add_class::<options::PyMesh>()?;
    m.add_class::<options::PyPlan>()?;
    m.add_class::<options::CompileOptions>()?;
    // The fusion choice the API uses unless told (`Fusion::RECOMMENDED`).
    m.add(
        "DEFAULT_FUSION",
        tpuc_hlo::passes::Fusion::RECOMMENDED.name(),
    )?;
    m.add_class::<runtime::Runtime>()?;
    m.add_class::<exported::ExportedProgram>()?;
    m.add_class::<runtime::DeviceBuffer>()?;
    m.add_class::<runtime::DonatedBuffer>()?;
    m.add_class::<runtime::HostInput>()?;
    m.add_class::<compiled::CompiledGraph>()?;
    m.add_class::<compiled::RunResult>()?;
    m.add("TpucError", m.py().get_type::<TpucError>())?;
    m.add("LoweringError", m.py().get_type::<LoweringError>())?;
    m.add(
        "UnsupportedOpsError",
        m.py().get_type::<UnsupportedOpsError>(),
    )?;
    m.add("DynamicSizeError", m.py().get_type::<DynamicSizeError>())?;
    m.add("PluginError", m.py().get_type::<PluginError>())?;
    Ok(())
}
