//! A compiled program bound to its target's devices: the one place where a call's arguments are
//! bound by role and its results assembled. The `tpuc run` command, `tpuc.compile_exported`,
//! the compile backend's graphs and the eager device's op programs all call [`Loaded`]; none
//! arranges arguments itself.
//!
//! A call names only what the caller owns: its user inputs (on the devices already, in host
//! memory, or given up to the result that updates them in place) and, for a program with random
//! ops, a seed. [`Loaded`] adds the rest by the program's [`Signature`]: weights uploaded once
//! from the archive, the seed it was loaded with, the true values of a bucketed program's sizes,
//! and the values its prepared executable derives from the weights, computed once per set of
//! weight buffers ([`PreparedValues`], shared by every program of the target). Host inputs are
//! padded to a bucket's shape; results come back per device, read whole and cut to their true
//! shapes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use sha2::{Digest, Sha256};
use tpuc_hlo::ArgRole;
use tpuc_pjrt::{Buffer, DType, HostBytes, HostTensor, ShardLayout};

use crate::compile::Compiled;
use crate::error::{Error, Result};
use crate::target::Target;

/// A tensor on a target's devices: one buffer per device (its part, or its copy), in mesh
/// order. Cloning shares the buffers; the identity of the buffers is what the prepared values
/// are kept by.
#[derive(Clone)]
pub struct DeviceValue {
    parts: Arc<Vec<Buffer>>,
}

impl DeviceValue {
    pub fn new(parts: Vec<Buffer>) -> DeviceValue {
        DeviceValue {
            parts: Arc::new(parts),
        }
    }

    /// Each device's buffer, in mesh order.
    pub fn parts(&self) -> &[Buffer] {
        &self.parts
    }

    /// The buffer of a value on one device; an error for one spread over several.
    pub fn single(&self) -> Result<&Buffer> {
        match self.parts.as_slice() {
            [one] => Ok(one),
            parts => Err(Error::Invalid(format!(
                "a value spread over {} devices where one device's is needed",
                parts.len()
            ))),
        }
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.parts) as usize
    }
}

/// A dense, row-major tensor in host memory.
pub struct HostValue {
    pub elem: DType,
    pub dims: Vec<i64>,
    pub bytes: Arc<dyn HostBytes>,
}

impl From<HostTensor> for HostValue {
    fn from(tensor: HostTensor) -> HostValue {
        HostValue {
            elem: tensor.element_type(),
            dims: tensor.dims().to_vec(),
            bytes: Arc::new(tensor),
        }
    }
}

/// A user input of a call.
pub enum Input {
    /// On the devices already, laid out as the program takes it ([`Loaded::input_layout`]).
    Device(DeviceValue),
    /// In host memory: uploaded for this call (aliased where the plugin allows), after padding
    /// to the bucket's shape for a program compiled for buckets.
    Host(HostValue),
    /// A buffer on the one device, given up to the result holding the input's new value
    /// ([`Loaded::donations`]): on the CPU plugin the result is written into its memory.
    Donated(Buffer),
}

/// What a caller gives one call: its user inputs, in order, and the seed of the program's
/// random ops (two uint64; [`Loaded::with_seed`]'s when None).
pub struct Call {
    pub inputs: Vec<Input>,
    pub seed: Option<DeviceValue>,
}

/// A compiled program on its target's devices, ready to be called.
pub struct Loaded {
    target: Arc<Target>,
    compiled: Arc<Compiled>,
    /// How each argument is laid out over the devices.
    layouts: Vec<ShardLayout>,
    /// Arguments the same on every call: the archive's weights, the seed it was loaded with.
    fixed: Vec<Option<DeviceValue>>,
    /// The positions of the user inputs among the arguments, in order.
    inputs: Vec<usize>,
    /// The identity of the prepared executable's module, which its values are kept by.
    prepared_key: Option<[u8; 32]>,
    /// The true values of a bucketed program's sizes, uploaded once each.
    sizes: Mutex<HashMap<i64, DeviceValue>>,
}

/// Results of a call: each device's buffers, and for a bucketed program (whose results are
/// computed at the bucket's shape) each result's true shape ([`Outputs::shape`]).
pub struct Outputs {
    pub per_device: Vec<Vec<Buffer>>,
    pub true_shapes: Option<Vec<Vec<i64>>>,
    /// Whether the values derived from the weights were computed for this call (rather than
    /// found computed).
    pub prepared_now: bool,
}

impl Loaded {
    /// `compiled` bound to `target`'s devices, the weights its signature takes from the archive
    /// uploaded (each device receiving its part, sharing the archive's mapped memory where the
    /// plugin allows).
    pub fn new(target: Arc<Target>, compiled: Arc<Compiled>) -> Result<Loaded> {
        let roles = &compiled.signature.args;
        let layouts = (0..roles.len())
            .map(|i| compiled.arg_layout(i))
            .collect::<Result<Vec<_>>>()?;
        let inputs = compiled.signature.user_input_positions();
        let prepared_key = compiled
            .prepared
            .as_ref()
            .map(|p| Sha256::digest(p.stablehlo.as_bytes()).into());
        let mut loaded = Loaded {
            fixed: (0..roles.len()).map(|_| None).collect(),
            target,
            compiled,
            layouts,
            inputs,
            prepared_key,
            sizes: Mutex::default(),
        };
        loaded.upload_weights()?;
        Ok(loaded)
    }

    /// The program given `seed` whenever a call brings none.
    pub fn with_seed(mut self, seed: u64) -> Result<Loaded> {
        if let Some(position) = self.position(&ArgRole::RngSeed) {
            let bytes = [seed.to_le_bytes(), 0u64.to_le_bytes()].concat();
            let tensor = HostTensor::from_bytes(DType::U64, &[2], &bytes)?;
            self.fixed[position] = Some(self.upload(position, tensor.into())?);
        }
        Ok(self)
    }

    pub fn compiled(&self) -> &Arc<Compiled> {
        &self.compiled
    }

    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// How user input `index` is laid out over the devices.
    pub fn input_layout(&self, index: usize) -> Option<&ShardLayout> {
        self.inputs.get(index).map(|&p| &self.layouts[p])
    }

    /// The partition spec of user input `index` (per dimension, the mesh axes splitting it),
    /// None where it is whole on every device.
    pub fn input_spec(&self, index: usize) -> Option<Vec<Vec<String>>> {
        let position = *self.inputs.get(index)?;
        self.compiled.ir.main.arg_attrs()[position]
            .sharding
            .as_ref()
            .map(|s| s.dims.clone())
    }

    /// The shape user input `index` is taken at (a padded input at its bucket's).
    pub fn input_shape(&self, index: usize) -> Option<&[i64]> {
        let position = *self.inputs.get(index)?;
        Some(&self.compiled.arg_types[position].shape)
    }

    /// How many user inputs a call gives.
    pub fn input_count(&self) -> usize {
        self.inputs.len()
    }

    /// (user input, result) of each input the program updates in place: a caller may give it
    /// up ([`Input::Donated`]) to the result holding its new value.
    pub fn donations(&self) -> Vec<(usize, usize)> {
        if self.target.each_device().len() > 1 {
            // A portable program runs where it is told, which the plugin's donating call is not.
            return Vec::new();
        }
        self.compiled
            .donations
            .iter()
            .filter_map(|&(position, result)| {
                let input = self.inputs.iter().position(|&p| p == position)?;
                Some((input, result))
            })
            .collect()
    }

    /// Whether the program has random ops, and so uses a seed.
    pub fn takes_seed(&self) -> bool {
        self.compiled.signature.takes_seed()
    }

    /// The bytes of the archive's weights each device holds.
    pub fn weight_bytes_per_device(&self) -> Result<Vec<usize>> {
        let mut bytes = vec![0; self.target.devices().len()];
        for (value, role) in self.fixed.iter().zip(&self.compiled.signature.args) {
            if let (Some(value), ArgRole::Weight(_)) = (value, role) {
                for (d, buffer) in value.parts().iter().enumerate() {
                    bytes[d] += buffer.on_device_size()?;
                }
            }
        }
        Ok(bytes)
    }

    /// Computes now, when the program has any, the values it derives from its fixed arguments
    /// (the archive's weights) alone, so that the first call does not; whether it did.
    pub fn prepare(&self) -> Result<bool> {
        let (Some(prepared), Some(key)) = (&self.compiled.prepared, &self.prepared_key) else {
            return Ok(false);
        };
        let Some(sources) = prepared
            .reads
            .iter()
            .map(|&p| self.fixed[p].clone())
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(false);
        };
        let (_, computed) = self
            .target
            .prepared
            .values(key, &sources, |s| self.compute_prepared(s))?;
        Ok(computed)
    }

    /// Runs the program on host tensors (the user inputs, in order) and returns its user
    /// outputs, whole, at their true shapes.
    pub fn run_on_host(&self, inputs: Vec<HostTensor>) -> Result<Vec<HostTensor>> {
        let call = Call {
            inputs: inputs.into_iter().map(|t| Input::Host(t.into())).collect(),
            seed: None,
        };
        let outputs = self.run(call)?;
        self.compiled
            .signature
            .user_outputs()
            .into_iter()
            .map(|i| outputs.host_tensor(self, i))
            .collect()
    }

    /// Runs the program and waits for it: the results of every device.
    pub fn run(&self, call: Call) -> Result<Outputs> {
        let devices = self.target.devices().len();
        let mut bound = self.bind(call)?;
        let executable = &self.compiled.executable;
        let per_device = if !bound.donated.is_empty() {
            if devices != 1 {
                return Err(Error::Invalid(
                    "inputs given up to their results run on one device".into(),
                ));
            }
            let donated = std::mem::take(&mut bound.donated);
            let given_up: Vec<usize> = donated.iter().map(|(p, _, _)| *p).collect();
            let args = bound.arguments_on(0, &given_up)?;
            vec![executable.execute_donating(&args, donated)?]
        } else if devices == 1 {
            let arguments = bound.arguments_on(0, &[])?;
            match self.target.each_device() {
                // A portable program (the target's devices are each their own) runs on the first.
                [first, _, ..] => vec![executable.execute_on(first, &arguments)?],
                _ => vec![executable.execute_on_one_device(&arguments)?],
            }
        } else {
            let args = (0..devices)
                .map(|d| bound.arguments_on(d, &[]))
                .collect::<Result<Vec<_>>>()?;
            executable.execute(&args)?
        };
        Ok(Outputs {
            per_device,
            true_shapes: bound.true_shapes,
            prepared_now: bound.prepared_now,
        })
    }

    /// Starts the program on its one device and returns its results at once, each becoming
    /// ready when the program is done (what reads one waits for it, and an error of the run is
    /// that reader's).
    pub fn launch(&self, call: Call) -> Result<Vec<DeviceValue>> {
        self.start(None, call)
    }

    /// Starts the program (for one device) on device `device` of the target's
    /// [`Target::each_device`], as [`Loaded::launch`] does on its own; its inputs must be there.
    pub fn launch_on(&self, device: usize, call: Call) -> Result<Vec<DeviceValue>> {
        let each = self.target.each_device();
        let on = each.get(device).ok_or_else(|| {
            Error::Invalid(format!(
                "no device {device}: the target has {} device(s) of its own",
                each.len()
            ))
        })?;
        self.start(Some(on), call)
    }

    /// Starts the program on its device, or on `on` (a portable program), without waiting.
    fn start(&self, on: Option<&tpuc_pjrt::Device>, call: Call) -> Result<Vec<DeviceValue>> {
        if self.target.devices().len() != 1 || self.compiled.padded.is_some() {
            return Err(Error::Invalid(
                "a program started without waiting runs on one device, at its own sizes".into(),
            ));
        }
        let bound = self.bind(call)?;
        if !bound.donated.is_empty() {
            return Err(Error::Invalid(
                "a program started without waiting takes no inputs given up".into(),
            ));
        }
        let arguments = bound.arguments_on(0, &[])?;
        let executable = &self.compiled.executable;
        // A portable program (the target's devices are each its own) has no device of its own.
        let each = self.target.each_device();
        let on = on.or_else(|| (each.len() > 1).then(|| &each[0]));
        let results = match on {
            Some(device) => executable.launch_on(device, &arguments)?,
            None => executable.launch_on_one_device(&arguments)?,
        };
        Ok(results
            .into_iter()
            .map(|b| DeviceValue::new(vec![b]))
            .collect())
    }

    /// Every argument of a call, by role.
    fn bind(&self, call: Call) -> Result<Bound> {
        let signature = &self.compiled.signature;
        if call.inputs.len() != self.inputs.len() {
            let expected: Vec<String> = self.compiled.inputs.iter().map(describe).collect();
            return Err(Error::Invalid(format!(
                "the model takes {} input(s) ({}), {} given",
                self.inputs.len(),
                expected.join(", "),
                call.inputs.len()
            )));
        }
        let mut values: Vec<Option<DeviceValue>> = self.fixed.clone();
        let mut donated = Vec::new();
        // A bucketed call's sizes come from its inputs' true shapes.
        let padded = self.compiled.padded.is_some();
        let mut input_dims = Vec::with_capacity(if padded { self.inputs.len() } else { 0 });
        for (index, (input, &position)) in call.inputs.into_iter().zip(&self.inputs).enumerate() {
            let taken = &self.compiled.arg_types[position].shape;
            match input {
                Input::Device(value) => {
                    if value.parts().len() != self.target.devices().len() {
                        return Err(Error::Invalid(format!(
                            "input {index} is on {} device(s), the program runs on {}",
                            value.parts().len(),
                            self.target.devices().len()
                        )));
                    }
                    if padded {
                        input_dims.push(taken.clone());
                    }
                    values[position] = Some(value);
                }
                Input::Host(host) => {
                    self.check_host_input(index, &host)?;
                    if padded {
                        input_dims.push(host.dims.clone());
                    }
                    let host = if host.dims == *taken {
                        host
                    } else {
                        let padded = HostTensor::resized_from(
                            host.elem,
                            &host.dims,
                            host.bytes.bytes(),
                            taken,
                        )?;
                        padded.into()
                    };
                    values[position] = Some(self.upload(position, host)?);
                }
                Input::Donated(buffer) => {
                    let result = self
                        .compiled
                        .donations
                        .iter()
                        .find(|(p, _)| *p == position)
                        .map(|&(_, r)| r)
                        .ok_or_else(|| {
                            Error::Invalid(format!("input {index} is not updated in place"))
                        })?;
                    if padded {
                        input_dims.push(taken.clone());
                    }
                    donated.push((position, result, buffer));
                }
            }
        }
        if let Some(position) = self.position(&ArgRole::RngSeed) {
            match call.seed {
                Some(seed) => values[position] = Some(seed),
                None if values[position].is_some() => {}
                None => {
                    return Err(Error::Invalid(
                        "the program has random ops and no seed was given".into(),
                    ))
                }
            }
        }
        let mut true_shapes = None;
        if let Some(padded) = &self.compiled.padded {
            let result_shapes: Vec<Vec<i64>> = self
                .compiled
                .result_types
                .iter()
                .map(|t| t.shape.clone())
                .collect();
            let sizes = padded.call_sizes(&input_dims, &result_shapes)?;
            let size_positions = signature
                .args
                .iter()
                .enumerate()
                .filter(|(_, r)| matches!(r, ArgRole::Size(_)))
                .map(|(p, _)| p);
            for (position, value) in size_positions.zip(sizes.values) {
                values[position] = Some(self.size(position, value)?);
            }
            true_shapes = Some(sizes.results);
        }
        let mut prepared_now = false;
        if let (Some(prepared), Some(key)) = (&self.compiled.prepared, &self.prepared_key) {
            let sources = prepared
                .reads
                .iter()
                .map(|&p| {
                    values[p].clone().ok_or_else(|| {
                        Error::Invalid(format!(
                            "the values derived from the weights read argument {p}, which was \
                             given up"
                        ))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let (derived, computed) = self
                .target
                .prepared
                .values(key, &sources, |sources| self.compute_prepared(sources))?;
            prepared_now = computed;
            for (position, role) in signature.args.iter().enumerate() {
                if let ArgRole::Derived(i) = role {
                    values[position] = Some(derived.get(*i).cloned().ok_or_else(|| {
                        Error::Invalid(format!("internal error: no derived value {i}"))
                    })?);
                }
            }
        }
        Ok(Bound {
            values,
            donated,
            true_shapes,
            prepared_now,
        })
    }

    /// A host input's dtype and shape against the program's (no larger than the bucket's, for
    /// a padded input).
    fn check_host_input(&self, index: usize, host: &HostValue) -> Result<()> {
        let spec = &self.compiled.inputs[index];
        let fits = match &self.compiled.padded {
            Some(_) => {
                host.dims.len() == spec.dims.len()
                    && host.dims.iter().zip(&spec.dims).all(|(a, b)| a <= b)
            }
            None => host.dims == spec.dims,
        };
        if host.elem != spec.dtype || !fits {
            return Err(Error::Invalid(format!(
                "input {index} ({}) must be {}, but {} {:?} was given",
                spec.name,
                describe(spec),
                host.elem,
                host.dims
            )));
        }
        let expected = host.dims.iter().product::<i64>().max(0) as usize * host.elem.byte_size();
        if host.bytes.bytes().len() != expected {
            return Err(Error::Invalid(format!(
                "input {index} ({}) holds {} bytes for {} {:?} ({expected} bytes)",
                spec.name,
                host.bytes.bytes().len(),
                host.elem,
                host.dims
            )));
        }
        Ok(())
    }

    /// The values the prepared executable derives from `sources` (its arguments), per value.
    fn compute_prepared(&self, sources: &[DeviceValue]) -> Result<Vec<DeviceValue>> {
        let prepared = self
            .compiled
            .prepared
            .as_ref()
            .ok_or_else(|| Error::Invalid("internal error: no prepared executable".into()))?;
        let devices = self.target.devices().len();
        let args: Vec<Vec<&Buffer>> = (0..devices)
            .map(|d| sources.iter().map(|s| &s.parts()[d]).collect())
            .collect();
        let per_device = prepared.executable.execute(&args).map_err(|e| {
            Error::Invalid(format!(
                "computing the values derived from the weights: {e}"
            ))
        })?;
        // per_device[d][i], regrouped as each value's buffers on the devices.
        let mut values: Vec<Vec<Buffer>> = Vec::new();
        for on_device in per_device {
            for (i, buffer) in on_device.into_iter().enumerate() {
                if values.len() <= i {
                    values.resize_with(i + 1, Vec::new);
                }
                values[i].push(buffer);
            }
        }
        Ok(values.into_iter().map(DeviceValue::new).collect())
    }

    fn position(&self, role: &ArgRole) -> Option<usize> {
        self.compiled.signature.args.iter().position(|r| r == role)
    }

    /// `host` on the devices as argument `position` is laid out.
    fn upload(&self, position: usize, host: HostValue) -> Result<DeviceValue> {
        let parts = self.target.client().upload_sharded(
            host.elem,
            &host.dims,
            host.bytes,
            &self.layouts[position],
            self.target.devices(),
        )?;
        Ok(DeviceValue::new(parts))
    }

    /// The int64 scalar `value` on the devices, as size argument `position` takes it.
    fn size(&self, position: usize, value: i64) -> Result<DeviceValue> {
        let mut sizes = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = sizes.get(&value) {
            return Ok(found.clone());
        }
        let scalar = HostTensor::from_slice(DType::I64, &[], &[value])?;
        let uploaded = self.upload(position, scalar.into())?;
        // A decoding loop passes each size once: keep a bounded number.
        if sizes.len() >= 4096 {
            sizes.clear();
        }
        sizes.insert(value, uploaded.clone());
        Ok(uploaded)
    }

    /// Each device receives its part of each of the archive's weights.
    fn upload_weights(&mut self) -> Result<()> {
        let compiled = self.compiled.clone();
        let roles = compiled.signature.args.iter().zip(&compiled.arg_types);
        for (position, (role, ty)) in roles.enumerate() {
            let ArgRole::Weight(name) = role else {
                continue;
            };
            let weight = compiled
                .program
                .weights()
                .get(name.as_str())
                .ok_or_else(|| {
                    Error::Invalid(format!("the archive has no data for weight {name}"))
                })?;
            let host = HostValue {
                elem: ty.elem,
                dims: ty.shape.clone(),
                bytes: Arc::new(WeightData(weight.bytes.clone())),
            };
            let value = self
                .upload(position, host)
                .map_err(|e| Error::Invalid(format!("uploading weight {name}: {e}")))?;
            self.fixed[position] = Some(value);
        }
        Ok(())
    }
}

/// A call's arguments, bound.
struct Bound {
    values: Vec<Option<DeviceValue>>,
    donated: Vec<(usize, usize, Buffer)>,
    true_shapes: Option<Vec<Vec<i64>>>,
    prepared_now: bool,
}

impl Bound {
    /// The arguments device `d` receives, but for those at `given_up` (donated).
    fn arguments_on(&self, d: usize, given_up: &[usize]) -> Result<Vec<&Buffer>> {
        self.values
            .iter()
            .enumerate()
            .filter(|(position, _)| !given_up.contains(position))
            .map(|(position, value)| {
                value.as_ref().map(|v| &v.parts()[d]).ok_or_else(|| {
                    Error::Invalid(format!("internal error: no argument {position}"))
                })
            })
            .collect()
    }
}

impl Outputs {
    /// Result `index`'s true shape (its computed shape but for a bucketed program's).
    pub fn shape<'a>(&'a self, loaded: &'a Loaded, index: usize) -> &'a [i64] {
        match &self.true_shapes {
            Some(shapes) => &shapes[index],
            None => &loaded.compiled.result_types[index].shape,
        }
    }

    /// Every result's true shape.
    pub fn shapes(&self, loaded: &Loaded) -> Vec<Vec<i64>> {
        (0..loaded.compiled.result_types.len())
            .map(|i| self.shape(loaded, i).to_vec())
            .collect()
    }

    /// Result `index`, whole, into `dst`: its row-major bytes at its true shape, read from the
    /// devices' parts as `loaded` lays it out.
    pub fn to_host(&self, loaded: &Loaded, index: usize, dst: &mut [u8]) -> Result<()> {
        let compiled = &loaded.compiled;
        let ty = compiled
            .result_types
            .get(index)
            .ok_or_else(|| Error::Invalid(format!("the program has no result {index}")))?;
        let shape = self.shape(loaded, index);
        if shape == ty.shape.as_slice() {
            return compiled.result_to_host(&self.per_device, index, dst);
        }
        let mut whole = HostTensor::zeros(ty.elem, &ty.shape)?;
        compiled.result_to_host(&self.per_device, index, whole.bytes_mut())?;
        let part = whole.resized(shape)?;
        if part.bytes().len() != dst.len() {
            return Err(Error::Invalid(format!(
                "result {index}: {} bytes of destination for {} bytes",
                dst.len(),
                part.bytes().len()
            )));
        }
        dst.copy_from_slice(part.bytes());
        Ok(())
    }

    /// Result `index`, whole, at its true shape, as a host tensor.
    pub fn host_tensor(&self, loaded: &Loaded, index: usize) -> Result<HostTensor> {
        let elem = loaded
            .compiled
            .result_types
            .get(index)
            .ok_or_else(|| Error::Invalid(format!("the program has no result {index}")))?
            .elem;
        let mut host = HostTensor::zeros(elem, self.shape(loaded, index))?;
        self.to_host(loaded, index, host.bytes_mut())?;
        Ok(host)
    }
}

/// Values derived from weights, per prepared module and set of weight buffers: the same
/// buffers mean the same weights (a caller gives a tensor a new buffer after any change), so a
/// block compiled once and called with each layer's weights keeps one entry per layer, and
/// every program with the same prepared module (the variants of a graph compiled per input
/// size) shares them. An entry goes when one of its buffers does.
#[derive(Default)]
pub(crate) struct PreparedValues {
    entries: Mutex<HashMap<PreparedKey, PreparedEntry>>,
}

type PreparedKey = ([u8; 32], Vec<usize>);

struct PreparedEntry {
    sources: Vec<Weak<Vec<Buffer>>>,
    values: Vec<DeviceValue>,
}

impl PreparedValues {
    /// How many sets are kept whose buffers are all alive.
    pub(crate) fn len(&self) -> usize {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .values()
            .filter(|e| e.sources.iter().all(|s| s.strong_count() > 0))
            .count()
    }

    /// The values derived from `sources` by the module `key`, computed by `compute` when not
    /// kept; and whether they were computed now.
    fn values(
        &self,
        key: &[u8; 32],
        sources: &[DeviceValue],
        compute: impl FnOnce(&[DeviceValue]) -> Result<Vec<DeviceValue>>,
    ) -> Result<(Vec<DeviceValue>, bool)> {
        let key = (*key, sources.iter().map(DeviceValue::identity).collect());
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        // Entries whose buffers are gone hold device memory nothing can use again.
        entries.retain(|_, e| e.sources.iter().all(|s| s.strong_count() > 0));
        if let Some(entry) = entries.get(&key) {
            return Ok((entry.values.clone(), false));
        }
        drop(entries);
        let values = compute(sources)?;
        let entry = PreparedEntry {
            sources: sources.iter().map(|s| Arc::downgrade(&s.parts)).collect(),
            values: values.clone(),
        };
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, entry);
        Ok((values, true))
    }
}

/// Weight bytes of the archive, shared with device buffers.
struct WeightData(tpuc_fx::WeightBytes);

impl HostBytes for WeightData {
    fn bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
}

fn describe(spec: &crate::InputSpec) -> String {
    match &spec.declared {
        Some(sizes) => format!("{} {sizes} ({:?} here)", spec.dtype, spec.dims),
        None => format!("{} {:?}", spec.dtype, spec.dims),
    }
}
