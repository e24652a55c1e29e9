//! What the Python package configures, as extension classes built once: `Mesh`, `Plan` and
//! `CompileOptions`. Each checks what it is given in its constructor, through the
//! driver's own parsers (the ones `tpuc compile --mesh --plan` uses), and raises `ValueError` or
//! `TypeError` there; what crosses the boundary afterwards is the checked value, never text
//! parsed again.
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use tpuc_driver::{ArgRole, Buckets, Fusion, Mesh, Plan, Precision};
use tpuc_hlo::ir::{Sharding, TensorType};

use crate::{dtype, Spec};

/// Devices in a grid of named axes, numbered row-major: `Mesh((2, 2), ("fsdp", "tp"))`, or
/// `Mesh.parse("fsdp=2,tp=2")`.
#[pyclass(frozen, eq, hash, module = "tpuc", name = "Mesh")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMesh {
    pub(crate) mesh: Mesh,
}

#[pymethods]
impl PyMesh {
    #[new]
    fn new(mesh_shape: Vec<i64>, axis_names: Vec<String>) -> PyResult<Self> {
        if mesh_shape.len() != axis_names.len() {
            return Err(PyValueError::new_err(format!(
                "a mesh of shape {mesh_shape:?} needs {} axis names, got {axis_names:?}",
                mesh_shape.len()
            )));
        }
        let text: Vec<String> = axis_names
            .iter()
            .zip(&mesh_shape)
            .map(|(name, size)| format!("{name}={size}"))
            .collect();
        Self::parse(&text.join(","))
    }

    /// A mesh from its text form, `fsdp=2,tp=2`, as `--mesh` takes it.
    #[staticmethod]
    pub(crate) fn parse(text: &str) -> PyResult<Self> {
        let mesh = text
            .parse()
            .map_err(|e: String| PyValueError::new_err(format!("mesh {text:?}: {e}")))?;
        Ok(PyMesh { mesh })
    }

    /// `mesh` as a `Mesh`: itself, or its text form parsed.
    #[staticmethod]
    pub(crate) fn of(mesh: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(given) = mesh.cast::<PyMesh>() {
            return Ok(given.get().clone());
        }
        match mesh.cast::<PyString>() {
            Ok(text) => Self::parse(text.to_str()?),
            Err(_) => Err(PyTypeError::new_err(format!(
                "a mesh is a tpuc.Mesh or its text (\"fsdp=2,tp=2\"), not {}",
                mesh.repr()?
            ))),
        }
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.mesh.axes.iter().map(|a| a.size))
    }

    #[getter]
    fn axis_names<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.mesh.axes.iter().map(|a| a.name.as_str()))
    }

    /// How many devices the mesh has.
    #[getter]
    fn size(&self) -> i64 {
        self.mesh.devices()
    }

    fn __str__(&self) -> String {
        self.mesh.to_string()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Mesh({}, {})",
            self.shape(py)?.repr()?,
            self.axis_names(py)?.repr()?
        ))
    }
}

/// A Python value (dicts, lists, tuples, strings, None) in JSON, as the driver's parsers read it.
fn json(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let dumps = value.py().import("json")?.getattr("dumps")?;
    dumps.call1((value,))?.extract()
}

/// How a model's weights and inputs are laid out over a mesh where they are not marked: ready
/// plans (`"dp"`, `"fsdp"`, `"tp"`, combined with commas), a dict of rules `{pattern: spec}`,
/// or both, `{"rules": {pattern: spec}, "ready": "dp"}` (see docs/sharding.md).
#[pyclass(frozen, module = "tpuc", name = "Plan")]
#[derive(Clone)]
pub(crate) struct PyPlan {
    pub(crate) plan: Plan,
}

#[pymethods]
impl PyPlan {
    #[new]
    fn new(plan: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(given) = plan.cast::<PyPlan>() {
            return Ok(given.get().clone());
        }
        if let Ok(text) = plan.cast::<PyString>() {
            let plan = text.to_str()?.parse().map_err(PyValueError::new_err)?;
            return Ok(PyPlan { plan });
        }
        let Ok(dict) = plan.cast::<PyDict>() else {
            return Err(PyTypeError::new_err(format!(
                "a plan is a string (dp, fsdp, tp, combined with commas) or a dict of rules, not {}",
                plan.repr()?
            )));
        };
        // A dict of rules alone, or the plan file's form with "rules" and "ready".
        let structured = !dict.is_empty()
            && dict.keys().iter().all(|k| {
                k.extract::<String>()
                    .is_ok_and(|k| k == "rules" || k == "ready")
            });
        let text = if structured {
            json(plan)?
        } else {
            let wrapped = PyDict::new(plan.py());
            wrapped.set_item("rules", dict)?;
            json(wrapped.as_any())?
        };
        let plan = tpuc_driver::layout::plan_from_json(&text).map_err(PyValueError::new_err)?;
        Ok(PyPlan { plan })
    }

    /// The layout this plan gives each weight (`(name, dtype, shape)`, by its fully qualified
    /// name) and input (`(name, dtype, shape)`) over `mesh`, in that order: its spec and, where
    /// its uses see another layout (a weight the plan `fsdp` gathers at use), that one.
    fn resolve(
        &self,
        mesh: &Bound<'_, PyAny>,
        weights: Vec<(String, String, Vec<i64>)>,
        inputs: Vec<(String, String, Vec<i64>)>,
    ) -> PyResult<Vec<(Spec, Option<Spec>)>> {
        let mesh = PyMesh::of(mesh)?.mesh;
        type Described = (String, String, Vec<i64>);
        let typed = |role: fn(String) -> ArgRole, (name, dtype_name, shape): Described| {
            Ok((role(name), TensorType::new(shape, dtype(&dtype_name)?)))
        };
        let args = weights
            .into_iter()
            .map(|w| typed(ArgRole::Weight, w))
            .chain(inputs.into_iter().map(|i| typed(ArgRole::UserInput, i)))
            .collect::<PyResult<Vec<_>>>()?;
        let resolved = tpuc_driver::layout::resolve_args(&self.plan, &mesh, args)
            .map_err(PyValueError::new_err)?;
        Ok(resolved
            .into_iter()
            .map(|(stored, used)| (stored.dims, used.map(|u: Sharding| u.dims)))
            .collect())
    }

    fn __repr__(&self) -> String {
        format!("Plan({:?})", self.plan)
    }
}

/// How the Python package's graphs compile, checked once: `matmul_precision` (highest, high,
/// default), `cache_dir` (the cache of compiled executables on disk; None for $TPUC_CACHE_DIR
/// or the default, "off" for none), `buckets` (how graphs with dynamic sizes are compiled:
/// "pow2", "pow2:MIN", a list of sizes or their text, "off" or None for one executable per size)
/// and `fusion` (none, patterns, kernels; None for the recommended one, `DEFAULT_FUSION`).
#[pyclass(frozen, module = "tpuc", name = "CompileOptions")]
pub(crate) struct CompileOptions {
    pub(crate) precision: Precision,
    pub(crate) cache_dir: Option<String>,
    pub(crate) buckets: Option<Buckets>,
    pub(crate) fusion: Fusion,
}

/// The fusion choice named (`none`, `patterns`, `kernels`), or the recommended one when None.
pub(crate) fn fusion_choice(given: Option<&str>) -> PyResult<Fusion> {
    match given {
        Some(name) => name.parse().map_err(PyValueError::new_err),
        None => Ok(Fusion::RECOMMENDED),
    }
}

#[pymethods]
impl CompileOptions {
    #[new]
    #[pyo3(signature = (*, matmul_precision="highest", cache_dir=None, buckets=None, fusion=None))]
    fn new(
        matmul_precision: &str,
        cache_dir: Option<String>,
        buckets: Option<&Bound<'_, PyAny>>,
        fusion: Option<&str>,
    ) -> PyResult<Self> {
        let precision = matmul_precision.parse().map_err(|_| {
            let names: Vec<&str> = Precision::ALL.iter().map(|p| p.name()).collect();
            PyValueError::new_err(format!(
                "matmul_precision must be one of {names:?}, not {matmul_precision:?}"
            ))
        })?;
        Ok(CompileOptions {
            precision,
            cache_dir,
            buckets: buckets.map(bucket_policy).transpose()?.flatten(),
            fusion: fusion_choice(fusion)?,
        })
    }

    #[getter]
    fn fusion(&self) -> &'static str {
        self.fusion.name()
    }

    #[getter]
    fn matmul_precision(&self) -> &'static str {
        self.precision.name()
    }

    #[getter]
    fn cache_dir(&self) -> Option<&str> {
        self.cache_dir.as_deref()
    }

    /// The bucket policy in its canonical text, None when off.
    #[getter]
    fn buckets(&self) -> Option<String> {
        self.buckets.as_ref().map(ToString::to_string)
    }
}

/// A bucket policy from Python: None, False or "off" for none; a list of sizes; or text.
fn bucket_policy(given: &Bound<'_, PyAny>) -> PyResult<Option<Buckets>> {
    let fail = |why: String| PyValueError::new_err(format!("buckets: {why}"));
    if given.is_none() || given.is(pyo3::types::PyBool::new(given.py(), false)) {
        return Ok(None);
    }
    let text = if let Ok(text) = given.cast::<PyString>() {
        text.to_str()?.to_string()
    } else if let Ok(sizes) = given.extract::<Vec<Bound<'_, PyAny>>>() {
        let sizes = sizes
            .iter()
            .map(|s| match s.extract::<i64>() {
                Ok(size) if !s.is_instance_of::<pyo3::types::PyBool>() => Ok(size.to_string()),
                _ => Err(fail(format!(
                    "a list of integer sizes, not {}",
                    given.repr()?
                ))),
            })
            .collect::<PyResult<Vec<_>>>()?;
        sizes.join(",")
    } else {
        return Err(fail(format!(
            "'pow2', 'pow2:MIN', a list of sizes or 'off', not {}",
            given.repr()?
        )));
    };
    if text == "off" {
        return Ok(None);
    }
    Buckets::parse(&text).map(Some).map_err(fail)
}
