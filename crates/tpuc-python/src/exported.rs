//! `tpuc.compile_exported`'s program: a `.pt2` / `.fx` archive opened by the driver as `tpuc run`
//! opens it (`tpuc_driver::model`, so its errors are the CLI's), weights uploaded once.
use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use tpuc_driver::model::OpenTimings;
use tpuc_driver::{EmitFormat, Loaded, LowerOptions, Precision, RunOptions, WeightsMode};
use tpuc_pjrt::{CacheOutcome, HostTensor};

use crate::{driver_error, dtype, error, host_bytes};

/// A result of a run as Python receives it: its dtype's name, its shape, its bytes.
type HostResult<'py> = (&'static str, Vec<i64>, Bound<'py, PyByteArray>);

/// A compiled exported program, ready to run.
#[pyclass(frozen, module = "tpuc._tpuc")]
pub struct ExportedProgram {
    loaded: Loaded,
    timings: OpenTimings,
    path: PathBuf,
    options: RunOptions,
}

#[pymethods]
impl ExportedProgram {
    /// Compiles the program at `path` for `plugin` (a name, a path; None: $TPUC_PJRT_PLUGIN or
    /// cpu) and uploads its weights. `sizes` fixes a dynamic program's symbolic sizes;
    /// `mesh` and `plan` lay it out over a mesh of devices (as `tpuc run --mesh --plan`);
    /// `search_paths`: where to look for a named plugin first (the interpreter's `sys.path`).
    #[new]
    #[pyo3(signature = (path, *, plugin=None, matmul_precision="highest", hoist_weights=true,
                        cache_dir=None, sizes=BTreeMap::new(), mesh=None, plan=None, seed=0,
                        search_paths=Vec::new(), fusion=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        plugin: Option<String>,
        matmul_precision: &str,
        hoist_weights: bool,
        cache_dir: Option<String>,
        sizes: BTreeMap<String, i64>,
        mesh: Option<String>,
        plan: Option<String>,
        seed: u64,
        search_paths: Vec<PathBuf>,
        fusion: Option<&str>,
    ) -> PyResult<ExportedProgram> {
        let precision: Precision = matmul_precision.parse().map_err(error)?;
        let fusion = crate::options::fusion_choice(fusion)?;
        let mesh =
            tpuc_driver::layout::parse(mesh.as_deref(), plan.as_deref()).map_err(driver_error)?;
        let options = RunOptions {
            plugin,
            seed,
            lower: LowerOptions {
                weights: WeightsMode::Args,
                precision,
                fusion,
                ..LowerOptions::default()
            },
            hoist_weights,
            mesh,
            cache_dir,
            sizes,
            search_paths,
            ..RunOptions::default()
        };
        let (loaded, timings) = py
            .detach(|| tpuc_driver::model::open(&path, None, &options))
            .map_err(driver_error)?;
        Ok(ExportedProgram {
            loaded,
            timings,
            path,
            options,
        })
    }

    /// Runs the program on `inputs`, each (address, bytes, dtype name, shape) of a contiguous
    /// CPU tensor the caller keeps alive; each result as (dtype name, shape, its bytes).
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<(usize, usize, String, Vec<i64>)>,
    ) -> PyResult<Vec<HostResult<'py>>> {
        let tensors = inputs
            .iter()
            .map(|(address, nbytes, name, shape)| {
                // SAFETY: the caller passes contiguous tensors it holds for this call.
                let bytes = unsafe { host_bytes(*address, *nbytes) };
                HostTensor::from_bytes(dtype(name)?, shape, bytes).map_err(error)
            })
            .collect::<PyResult<Vec<_>>>()?;
        let results = py
            .detach(|| self.loaded.run_on_host(tensors))
            .map_err(driver_error)?;
        Ok(results
            .iter()
            .map(|t| {
                (
                    t.element_type().name(),
                    t.dims().to_vec(),
                    PyByteArray::new(py, t.bytes()),
                )
            })
            .collect())
    }

    /// The StableHLO module (MLIR text) the plugin compiled.
    #[getter]
    fn stablehlo(&self) -> &str {
        &self.loaded.compiled().stablehlo
    }

    /// The program as a StableHLO module, MLIR text or (`bytecode`) MLIR bytecode, its weights
    /// arguments of `main` or (`inline_weights`) constants in it; no plugin is involved.
    fn emit(&self, py: Python<'_>, bytecode: bool, inline_weights: bool) -> PyResult<Vec<u8>> {
        // As the program was compiled, but for its weights and without hoisting (one module).
        let base = self.options.compile_options();
        let options = tpuc_driver::Options {
            lower: LowerOptions {
                weights: if inline_weights {
                    WeightsMode::Inline
                } else {
                    WeightsMode::Args
                },
                ..base.lower.clone()
            },
            hoist: tpuc_driver::Options::default().hoist,
            ..base
        };
        let format = if bytecode {
            EmitFormat::Bytecode
        } else {
            EmitFormat::Text
        };
        let emitted = py
            .detach(|| tpuc_driver::emit_file(&self.path, &options, format))
            .map_err(driver_error)?;
        Ok(emitted.module)
    }

    /// The program's inputs, in order, as (name, dtype name, shape).
    #[getter]
    fn inputs(&self) -> Vec<(String, &'static str, Vec<i64>)> {
        self.loaded
            .compiled()
            .inputs
            .iter()
            .map(|i| (i.name.clone(), i.dtype.name(), i.dims.clone()))
            .collect()
    }

    /// The program's results, in order, as (dtype name, shape).
    #[getter]
    fn outputs(&self) -> Vec<(&'static str, Vec<i64>)> {
        let compiled = self.loaded.compiled();
        compiled
            .signature
            .user_outputs()
            .into_iter()
            .filter_map(|i| compiled.result_types.get(i))
            .map(|t| (t.elem.name(), t.shape.clone()))
            .collect()
    }

    /// What the on-disk cache of compiled executables did: "hit" (loaded, not compiled),
    /// "stored", "not stored: why", or "off".
    #[getter]
    fn cache(&self) -> String {
        match &self.timings.cache {
            None => "off".into(),
            Some(CacheOutcome::Hit) => "hit".into(),
            Some(CacheOutcome::Stored) => "stored".into(),
            Some(CacheOutcome::NotStored(why)) => format!("not stored: {why}"),
        }
    }

    /// The platform the program runs on (`cpu`, `tpu`, `cuda`).
    #[getter]
    fn platform(&self) -> PyResult<String> {
        self.loaded.target().platform().map_err(driver_error)
    }
}
