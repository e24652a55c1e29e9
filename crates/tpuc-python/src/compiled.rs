//! A graph compiled and loaded on the runtime's devices (`CompiledGraph`): Python gives a call
//! its inputs (in the graph's input order) and, for random ops, a seed; the driver's `Loaded`
//! binds everything else (the values derived from the weights, a bucket's sizes) and assembles
//! the results. What comes back: DLPack capsules aliasing the plugin's memory, the devices'
//! buffers, or a `RunResult` read into tensors the caller allocates.
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use tpuc_driver::{Call, Input, Loaded, Outputs};
use tpuc_pjrt::{Buffer, DType, HostTensor};

use crate::runtime::{DeviceBuffer, DonatedBuffer, HostInput};
use crate::{dlpack, driver_error, error, host_bytes, host_bytes_mut, Spec};

/// A graph compiled on a plugin.
#[pyclass(frozen, module = "tpuc._tpuc")]
pub(crate) struct CompiledGraph {
    loaded: Arc<Loaded>,
    /// Compiled before in this process: nothing was lowered or compiled now.
    reused: bool,
}

impl CompiledGraph {
    pub(crate) fn new(loaded: Loaded, reused: bool) -> CompiledGraph {
        CompiledGraph {
            loaded: Arc::new(loaded),
            reused,
        }
    }

    /// A call of the graph on `inputs` (each a `DeviceBuffer`, a `HostInput` or a
    /// `DonatedBuffer`) with `seed`.
    fn call(
        &self,
        inputs: &[Bound<'_, PyAny>],
        seed: Option<PyRef<'_, DeviceBuffer>>,
    ) -> PyResult<Call> {
        let inputs = inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                if let Ok(buffer) = input.cast::<DeviceBuffer>() {
                    return Ok(Input::Device(buffer.get().value.clone()));
                }
                if let Ok(host) = input.cast::<HostInput>() {
                    return Ok(Input::Host(host.get().value()));
                }
                if let Ok(donated) = input.cast::<DonatedBuffer>() {
                    return Ok(Input::Donated(donated.get().take()?));
                }
                Err(error(format!(
                    "input {i} is a {}, not a DeviceBuffer, HostInput or DonatedBuffer",
                    input.get_type().name()?
                )))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Call {
            inputs,
            seed: seed.map(|s| s.value.clone()),
        })
    }

    /// Runs the graph on `inputs` with `seed`, the GIL released, and waits for its outputs.
    fn run(
        &self,
        py: Python<'_>,
        inputs: &[Bound<'_, PyAny>],
        seed: Option<PyRef<'_, DeviceBuffer>>,
    ) -> PyResult<Outputs> {
        let call = self.call(inputs, seed)?;
        py.detach(|| self.loaded.run(call)).map_err(driver_error)
    }

    fn compiled(&self) -> &tpuc_driver::Compiled {
        self.loaded.compiled()
    }
}

#[pymethods]
impl CompiledGraph {
    /// A handle to the loaded program for the native device (a capsule).
    fn native_program<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        crate::native::program_capsule(py, &self.loaded)
    }

    /// The StableHLO module (MLIR text) the plugin compiled.
    #[getter]
    fn stablehlo(&self) -> &str {
        &self.compiled().stablehlo
    }

    /// The module in tpuc's own IR after its passes, as text (for reading; the plugin compiles
    /// `stablehlo`).
    #[getter]
    fn ir_text(&self) -> String {
        tpuc_hlo::ir::print(&self.compiled().ir)
    }

    /// Whether the graph was compiled before in this process (nothing was compiled now).
    #[getter]
    fn reused(&self) -> bool {
        self.reused
    }

    /// Whether the graph was compiled ahead, in the background (a training graph's backward
    /// beside its forward, a dynamic graph's next bucket).
    #[getter]
    fn ahead(&self) -> bool {
        self.compiled().ahead
    }

    /// The StableHLO module computing what the graph derives from its stable inputs alone, when
    /// that was split off (the runtime runs it once per set of their buffers).
    #[getter]
    fn prepared_stablehlo(&self) -> Option<&str> {
        self.compiled()
            .prepared
            .as_ref()
            .map(|p| p.stablehlo.as_str())
    }

    /// How many inputs a call gives.
    #[getter]
    fn num_inputs(&self) -> usize {
        self.loaded.input_count()
    }

    /// Per input, its partition spec over the mesh (None when whole on every device): how the
    /// caller lays each input's `DeviceBuffer` out (`Runtime.buffer(..., spec)`).
    #[getter]
    fn input_specs(&self) -> Vec<Option<Spec>> {
        (0..self.loaded.input_count())
            .map(|i| self.loaded.input_spec(i))
            .collect()
    }

    /// Per input, the shape the graph takes it at (a padded input at its bucket's).
    #[getter]
    fn input_shapes(&self) -> Vec<Vec<i64>> {
        (0..self.loaded.input_count())
            .filter_map(|i| self.loaded.input_shape(i).map(<[i64]>::to_vec))
            .collect()
    }

    /// Per output, its partition spec over the mesh (None when the graph runs on one device),
    /// as XLA's partitioner chose it for outputs left to it: split outputs are assembled from
    /// the devices' parts (`RunResult.copy_to`).
    #[getter]
    fn result_specs(&self) -> Vec<Option<Spec>> {
        self.compiled()
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
        self.compiled().results_whole()
    }

    /// (dtype name, shape) of each output (at its bucket's shape for a padded graph).
    #[getter]
    fn output_specs(&self) -> Vec<(&'static str, Vec<i64>)> {
        self.compiled()
            .result_types
            .iter()
            .map(|t| (t.elem.name(), t.shape.clone()))
            .collect()
    }

    /// The buckets the graph was compiled for (`s0=16, s1=32`), None when compiled for its
    /// sizes.
    #[getter]
    fn bucket(&self) -> Option<String> {
        self.compiled().padded.as_ref().map(|p| p.describe())
    }

    /// Why the graph was compiled for its sizes although buckets were asked for.
    #[getter]
    fn not_padded(&self) -> Option<&str> {
        self.compiled().not_padded.as_deref()
    }

    /// Positions, among the graph's inputs, of those with a padded dimension (a graph compiled
    /// for buckets; none otherwise): a call gives them as `HostInput`s, which it pads.
    #[getter]
    fn padded_inputs(&self) -> Vec<usize> {
        self.compiled().padded.as_ref().map_or_else(Vec::new, |p| {
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

    /// (input index, output index) of each input the graph updates in place: given up as a
    /// `DonatedBuffer`, the output takes its memory.
    #[getter]
    fn donations(&self) -> Vec<(usize, usize)> {
        self.loaded.donations()
    }

    /// Whether the graph has random ops: a call then gives their seed, two uint64.
    #[getter]
    fn random(&self) -> bool {
        self.loaded.takes_seed()
    }

    /// What the cache of compiled executables on disk did: "hit" (loaded, not compiled),
    /// "stored" (compiled and stored), "not stored: <why>" (compiled; the cache could not store
    /// it) or "off".
    #[getter]
    fn cache(&self) -> String {
        self.compiled().cache.summary()
    }

    /// Seconds spent in tpuc's pipeline (reading, lowering, passes, emission) and in the
    /// plugin's compiler (or loading from the cache).
    #[getter]
    fn timings(&self) -> (f64, f64) {
        let t = &self.compiled().timings;
        (
            (t.read + t.lower + t.passes + t.emit).as_secs_f64(),
            t.compile.as_secs_f64(),
        )
    }

    /// Runs the graph on `inputs` (in order; see `execute`) and returns its outputs as DLPack
    /// capsules that alias the plugin's output memory (for plugins whose device memory is host
    /// memory: the CPU plugin), with whether the values derived from the stable inputs were
    /// computed for this run; `torch.from_dlpack` turns each capsule into a tensor without a
    /// copy. A padded graph's outputs come at their true shapes (a copy of the leading part).
    #[pyo3(signature = (inputs, seed=None))]
    fn run_dlpack<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Bound<'py, PyAny>>,
        seed: Option<PyRef<'py, DeviceBuffer>>,
    ) -> PyResult<(Vec<Bound<'py, PyAny>>, bool)> {
        if !self.compiled().results_whole() {
            return Err(error(
                "the graph's results are split over the devices: run it with execute",
            ));
        }
        let outputs = self.run(py, &inputs, seed)?;
        let prepared_now = outputs.prepared_now;
        Ok((capsules(py, &self.loaded, outputs)?, prepared_now))
    }

    /// Runs the graph on `inputs`, one per graph input in order: a `DeviceBuffer` (laid out as
    /// `input_specs` says), a `HostInput` (uploaded for this call; padded inputs must be) or a
    /// `DonatedBuffer` (at an input of `donations`); and `seed`, the seed of its random ops.
    /// The values the graph derives from its stable inputs are computed when their buffers are
    /// new. Waits for the results.
    #[pyo3(signature = (inputs, seed=None))]
    fn execute(
        &self,
        py: Python<'_>,
        inputs: Vec<Bound<'_, PyAny>>,
        seed: Option<PyRef<'_, DeviceBuffer>>,
    ) -> PyResult<RunResult> {
        let outputs = self.run(py, &inputs, seed)?;
        Ok(RunResult {
            loaded: self.loaded.clone(),
            prepared_now: outputs.prepared_now,
            shapes: outputs.shapes(&self.loaded),
            outputs: Mutex::new(Some(outputs)),
        })
    }

    /// Starts the graph on `inputs` (on one device: `device` of the eager device's, else the
    /// program's own) and returns its outputs where they are, on the device, without waiting
    /// for it to finish: the next execution (or a copy to the host) reading them waits, and an
    /// error of this one is that reader's.
    #[pyo3(signature = (inputs, seed=None, device=None))]
    fn launch(
        &self,
        py: Python<'_>,
        inputs: Vec<Bound<'_, PyAny>>,
        seed: Option<PyRef<'_, DeviceBuffer>>,
        device: Option<usize>,
    ) -> PyResult<Vec<DeviceBuffer>> {
        let call = self.call(&inputs, seed)?;
        let values = py
            .detach(|| match device {
                Some(index) => self.loaded.launch_on(index, call),
                None => self.loaded.launch(call),
            })
            .map_err(driver_error)?;
        Ok(values
            .into_iter()
            .map(|value| DeviceBuffer { value })
            .collect())
    }
}

/// The outputs of one `CompiledGraph.execute`, read as the caller chooses.
#[pyclass(frozen, module = "tpuc._tpuc")]
pub(crate) struct RunResult {
    loaded: Arc<Loaded>,
    outputs: Mutex<Option<Outputs>>,
    shapes: Vec<Vec<i64>>,
    prepared_now: bool,
}

#[pymethods]
impl RunResult {
    /// Each output's true shape.
    #[getter]
    fn shapes(&self) -> Vec<Vec<i64>> {
        self.shapes.clone()
    }

    /// Whether the values derived from the stable inputs were computed for this run.
    #[getter]
    fn prepared_now(&self) -> bool {
        self.prepared_now
    }

    /// Copies output `i`, whole (from the devices' parts where it is split), at its true shape,
    /// into each `destinations[i]` = (address, nbytes) of a contiguous CPU tensor of its dtype
    /// and true shape.
    fn copy_to(&self, py: Python<'_>, destinations: Vec<(usize, usize)>) -> PyResult<()> {
        let guard = self.outputs.lock().unwrap_or_else(|p| p.into_inner());
        let outputs = guard
            .as_ref()
            .ok_or_else(|| error("the results were handed over already"))?;
        if destinations.len() != self.shapes.len() {
            return Err(error(format!(
                "the graph has {} outputs, {} destinations given",
                self.shapes.len(),
                destinations.len()
            )));
        }
        py.detach(|| {
            for (i, &(address, nbytes)) in destinations.iter().enumerate() {
                // SAFETY: the caller passes a live, contiguous tensor of `nbytes` bytes it does
                // not touch during the call.
                let dst = unsafe { host_bytes_mut(address, nbytes) };
                outputs
                    .to_host(&self.loaded, i, dst)
                    .map_err(|e| error(format!("output {i}: {e}")))?;
            }
            Ok(())
        })
    }

    /// The outputs as DLPack capsules aliasing the first device's memory (the results must be
    /// whole on every device, on a plugin whose device memory is host memory); once.
    fn dlpack<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let outputs = self
            .outputs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| error("the results were handed over already"))?;
        capsules(py, &self.loaded, outputs)
    }
}

/// Each output of a run (whole on every device) as a capsule over the first device's buffer,
/// or over a copy of its leading part where its true shape is smaller.
fn capsules<'py>(
    py: Python<'py>,
    loaded: &Loaded,
    outputs: Outputs,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let compiled = loaded.compiled();
    let Outputs {
        per_device,
        true_shapes,
        ..
    } = outputs;
    let first = per_device.into_iter().next().unwrap_or_default();
    first
        .into_iter()
        .zip(&compiled.result_types)
        .enumerate()
        .map(|(i, (buffer, ty))| {
            let wanted = true_shapes.as_ref().map_or(&ty.shape, |s| &s[i]);
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
