//! Running a model on a PJRT plugin: the code path of `tpuc run`.
//!
//! A model is a `.pt2` / `.fx` program, or a module compiled by `tpuc compile --weights args`
//! plus the archive it was compiled from, which supplies the weights and the signature; either
//! goes through `tpuc_driver`'s pipeline. Weights are uploaded once, sharing the archive's
//! memory-mapped data where the plugin allows (zero-copy on the CPU plugin), and what the
//! program derives from them alone is computed once, by the prepared executable.
//!
//! On several devices the program is partitioned by XLA's SPMD partitioner over a mesh, as a plan
//! lays its arguments out (data parallel over all devices unless a mesh and plan are given):
//! each device receives only its part of each weight and input; results are whole on every
//! device.
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tpuc_driver::{
    ArgRole, Buckets, CacheOutcome, Compiled, Hoist, InputSpec, LowerOptions, Mesh, Options, Plan,
    ShardingDialect, Source, Target, WeightsMode,
};
use tpuc_fx::WeightBytes;
use tpuc_pjrt::{Buffer, DType, HostBytes, HostTensor, ShardLayout};

/// How to run a model.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Plugin name or path; `None` = `$TPUC_PJRT_PLUGIN` or `cpu`.
    pub plugin: Option<String>,
    /// Devices to run on, data-parallel when more than one.
    pub devices: usize,
    /// Seed of the model's random ops.
    pub seed: u64,
    /// Lowering options for `.pt2` / `.fx` models (weights are always arguments).
    pub lower: LowerOptions,
    /// Compute what the program derives from its weights alone once, not on every run.
    pub hoist_weights: bool,
    /// The dialect of the shardings on several devices.
    pub dialect: ShardingDialect,
    /// A device mesh and the plan laying the model out over it (instead of `devices`).
    pub mesh: Option<(Mesh, Plan)>,
    /// The cache of compiled executables: `None` for $TPUC_CACHE_DIR or the default, `off`
    /// for none (see `tpuc_pjrt::CompileCache::configured`).
    pub cache_dir: Option<String>,
    /// Sizes of a program's symbolic dimensions (torch.export dynamic shapes), by symbol; the
    /// others come from `input_dims`, else the sizes the program was exported with.
    pub sizes: BTreeMap<String, i64>,
    /// The shapes of the user inputs the model will run on, which fix its symbolic sizes.
    pub input_dims: Option<Vec<Vec<i64>>>,
    /// Compile a program with symbolic sizes for their buckets (inputs padded to them).
    pub buckets: Option<Buckets>,
    /// Directories to look for a named plugin in first (a Python interpreter's `sys.path`).
    pub search_paths: Vec<PathBuf>,
}

impl RunOptions {
    /// The pipeline's options for the program these run it with (weights as arguments).
    pub fn compile_options(&self) -> Options {
        Options {
            lower: LowerOptions {
                weights: WeightsMode::Args,
                ..self.lower.clone()
            },
            hoist: if self.hoist_weights {
                Hoist::Weights
            } else {
                Hoist::Off
            },
            dialect: self.dialect,
            mesh: self.mesh.clone(),
            sizes: Some(self.sizes.clone()),
            input_dims: self.input_dims.clone(),
            cache_dir: self.cache_dir.clone(),
            buckets: self.buckets.clone(),
            donate: Vec::new(),
        }
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            plugin: None,
            devices: 1,
            seed: 0,
            lower: LowerOptions::default(),
            hoist_weights: true,
            dialect: ShardingDialect::default(),
            mesh: None,
            cache_dir: None,
            sizes: BTreeMap::new(),
            input_dims: None,
            buckets: None,
            search_paths: Vec::new(),
        }
    }
}

/// Where the time of preparing a model went.
#[derive(Clone, Debug, Default)]
pub struct PrepareTimings {
    /// Reading the program, lowering it and emitting StableHLO.
    pub lower: Duration,
    /// Loading the plugin and creating the client.
    pub client: Duration,
    /// The plugin's compilation (or loading the executables from the cache).
    pub compile: Duration,
    /// What the cache of compiled executables did with the model's executable; `None` when it
    /// is off.
    pub cache: Option<CacheOutcome>,
    /// Uploading the weights and computing what is derived from them.
    pub weights: Duration,
}

/// A model compiled and loaded on a plugin, its weights on the devices, ready to run.
pub struct Runner {
    target: Target,
    compiled: Arc<Compiled>,
    /// Per argument of the executable, its buffers on each device when they are the same on
    /// every run (weights, the seed, values derived from the weights); `None` for user inputs,
    /// uploaded per run.
    fixed: Vec<Option<Vec<Buffer>>>,
    /// Per argument, how it is laid out over the devices.
    layouts: Vec<ShardLayout>,
    /// The positions of the user inputs among the arguments, in order.
    inputs: Vec<usize>,
    pub timings: PrepareTimings,
}

/// Weight bytes of the archive, shared with device buffers.
struct WeightData(WeightBytes);

impl HostBytes for WeightData {
    fn bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl Runner {
    /// Prepares `model` (a `.pt2` / `.fx` program, or a compiled module with `weights`, the
    /// archive it was compiled from).
    pub fn new(model: &Path, weights: Option<&Path>, options: &RunOptions) -> Result<Runner> {
        let mut timings = PrepareTimings::default();
        let is_program = tpuc_fx::program_format(model)?.is_some();
        let source = match (is_program, weights) {
            (true, None) => Source::File(model),
            (true, Some(_)) => bail!(
                "--weights is for compiled modules; {} carries its own weights",
                model.display()
            ),
            (false, Some(archive)) => Source::Module {
                module: model,
                archive,
            },
            (false, None) => bail!(
                "{} is not a .pt2 or .fx program; to run a compiled module, pass --weights with the \
                 archive it was compiled from (it supplies the weights and the signature)",
                model.display()
            ),
        };
        let devices = match &options.mesh {
            Some((mesh, _)) => mesh.devices() as usize,
            None => options.devices,
        };
        if devices < 1 {
            bail!("--devices must be at least 1");
        }
        let start = Instant::now();
        let target = Target::open(options.plugin.as_deref(), devices, &options.search_paths)?;
        timings.client = start.elapsed();

        let (compiled, _) = target.compile(source, &options.compile_options())?;
        if !is_program && devices == 1 {
            check_module_results(&compiled, model)?;
        }
        let t = &compiled.timings;
        timings.lower = t.read + t.lower + t.passes + t.emit;
        timings.compile = t.compile;
        timings.cache = compiled.cache.outcomes.first().cloned();

        let start = Instant::now();
        let roles = &compiled.signature.args;
        let layouts = (0..roles.len())
            .map(|i| compiled.arg_layout(i))
            .collect::<tpuc_driver::Result<Vec<_>>>()?;
        let inputs = (0..roles.len())
            .filter(|&i| matches!(roles[i], ArgRole::UserInput(_)))
            .collect();
        let mut runner = Runner {
            fixed: (0..roles.len()).map(|_| None).collect(),
            target,
            compiled,
            layouts,
            inputs,
            timings,
        };
        runner.upload_weights()?;
        runner.upload_seed(options.seed)?;
        runner.prepare()?;
        runner.timings.weights = start.elapsed();
        Ok(runner)
    }

    /// Each device receives its part of each weight.
    fn upload_weights(&mut self) -> Result<()> {
        let c = self.compiled.clone();
        for (position, (role, ty)) in c.signature.args.iter().zip(&c.arg_types).enumerate() {
            let ArgRole::Weight(name) = role else {
                continue;
            };
            let weight = c
                .program
                .weights
                .get(name.as_str())
                .ok_or_else(|| anyhow!("the archive has no data for weight {name}"))?;
            let data: Arc<dyn HostBytes> = Arc::new(WeightData(weight.bytes.clone()));
            let buffers = self
                .target
                .client()
                .upload_sharded(
                    ty.elem,
                    &ty.shape,
                    data,
                    &self.layouts[position],
                    self.target.devices(),
                )
                .with_context(|| format!("uploading weight {name}"))?;
            self.fixed[position] = Some(buffers);
        }
        Ok(())
    }

    fn upload_seed(&mut self, seed: u64) -> Result<()> {
        let Some(position) = self
            .compiled
            .signature
            .args
            .iter()
            .position(|r| *r == ArgRole::RngSeed)
        else {
            return Ok(());
        };
        let seed = HostTensor::from_bytes(
            DType::U64,
            &[2],
            &[seed.to_le_bytes(), 0u64.to_le_bytes()].concat(),
        )?;
        let buffers = self.target.client().upload_sharded(
            DType::U64,
            &[2],
            Arc::new(seed),
            &self.layouts[position],
            self.target.devices(),
        )?;
        self.fixed[position] = Some(buffers);
        Ok(())
    }

    /// Computes, once, what the program derives from its weights alone.
    fn prepare(&mut self) -> Result<()> {
        let Some(prepared) = &self.compiled.prepared else {
            return Ok(());
        };
        let args: Vec<Vec<&Buffer>> = (0..self.devices())
            .map(|d| {
                prepared
                    .reads
                    .iter()
                    .map(|&position| {
                        self.fixed[position]
                            .as_ref()
                            .map(|buffers| &buffers[d])
                            .ok_or_else(|| {
                                anyhow!("internal error: argument {position} is not fixed")
                            })
                    })
                    .collect::<Result<_>>()
            })
            .collect::<Result<_>>()?;
        let values = prepared
            .executable
            .execute(&args)
            .context("computing the values derived from the weights")?;
        // values[device][i], regrouped as each value's buffers on the devices.
        let mut per_value: Vec<Vec<Buffer>> = Vec::new();
        for on_device in values {
            for (i, buffer) in on_device.into_iter().enumerate() {
                if per_value.len() <= i {
                    per_value.resize_with(i + 1, Vec::new);
                }
                per_value[i].push(buffer);
            }
        }
        for (position, role) in self.compiled.signature.args.iter().enumerate() {
            if let ArgRole::Derived(i) = role {
                let buffers = per_value
                    .get_mut(*i)
                    .map(std::mem::take)
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| anyhow!("internal error: no derived value {i}"))?;
                self.fixed[position] = Some(buffers);
            }
        }
        Ok(())
    }

    /// The buckets the program was compiled for (`s0=16`), when it was.
    pub fn bucket(&self) -> Option<String> {
        self.compiled.padded.as_ref().map(|p| p.describe())
    }

    /// Why a program that asked for buckets was compiled for its sizes instead.
    pub fn not_padded(&self) -> Option<&str> {
        self.compiled.not_padded.as_deref()
    }

    /// The user inputs the model expects, in order.
    /// The compiled program: its signature, result types and StableHLO.
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    pub fn inputs(&self) -> &[InputSpec] {
        &self.compiled.inputs
    }

    pub fn client(&self) -> &tpuc_pjrt::Client {
        self.target.client()
    }

    pub fn devices(&self) -> usize {
        self.target.devices().len()
    }

    /// Whether part of the program was computed once from the weights.
    pub fn is_prepared(&self) -> bool {
        self.compiled.prepared.is_some()
    }

    /// What XLA's compiled program needs of each device's memory.
    pub fn compiled_memory(&self) -> Result<tpuc_pjrt::CompiledMemory> {
        Ok(self.compiled.executable.compiled_memory()?)
    }

    /// The bytes of weights each device holds.
    pub fn weight_bytes_per_device(&self) -> Result<Vec<usize>> {
        let mut bytes = vec![0; self.devices()];
        for (buffers, role) in self.fixed.iter().zip(&self.compiled.signature.args) {
            if let (Some(buffers), ArgRole::Weight(_)) = (buffers, role) {
                for (d, b) in buffers.iter().enumerate() {
                    bytes[d] += b.on_device_size()?;
                }
            }
        }
        Ok(bytes)
    }

    /// Checks `inputs` against the model's signature (count, dtype, shape), converting float32
    /// given for bfloat16.
    pub fn check_inputs(&self, inputs: Vec<HostTensor>) -> Result<Vec<HostTensor>> {
        let specs = self.inputs();
        if inputs.len() != specs.len() {
            let expected: Vec<String> = specs.iter().map(describe).collect();
            bail!(
                "the model takes {} input(s) ({}), {} given",
                specs.len(),
                expected.join(", "),
                inputs.len()
            );
        }
        inputs
            .into_iter()
            .zip(specs)
            .enumerate()
            .map(|(i, (tensor, spec))| {
                let tensor = match crate::npy::adapt_to(&tensor, spec.dtype)? {
                    Some(converted) => converted,
                    None => tensor,
                };
                // Compiled for a bucket: an input no larger than the bucket, padded to it.
                let fits = match &self.compiled.padded {
                    Some(_) => {
                        tensor.dims().len() == spec.dims.len()
                            && tensor.dims().iter().zip(&spec.dims).all(|(a, b)| a <= b)
                    }
                    None => tensor.dims() == spec.dims,
                };
                if tensor.element_type() != spec.dtype || !fits {
                    bail!(
                        "input {i} ({}) must be {}, but {} {:?} was given",
                        spec.name,
                        describe(spec),
                        tensor.element_type(),
                        tensor.dims()
                    );
                }
                Ok(tensor)
            })
            .collect()
    }

    /// Runs the model; returns its user outputs.
    pub fn run(&self, inputs: Vec<HostTensor>) -> Result<Vec<HostTensor>> {
        let mut inputs = self.check_inputs(inputs)?;
        let devices = self.target.devices();
        // A program compiled for a bucket takes its inputs padded to it and the true sizes;
        // its results are sliced to their true shapes.
        let mut uploaded: Vec<Option<Vec<Buffer>>> = (0..self.fixed.len()).map(|_| None).collect();
        let mut true_shapes = None;
        if let Some(padded) = &self.compiled.padded {
            let dims: Vec<Vec<i64>> = inputs.iter().map(|t| t.dims().to_vec()).collect();
            let result_shapes: Vec<Vec<i64>> = self
                .compiled
                .result_types
                .iter()
                .map(|t| t.shape.clone())
                .collect();
            let sizes = padded.call_sizes(&dims, &result_shapes)?;
            inputs = inputs
                .iter()
                .zip(self.inputs())
                .map(|(t, spec)| Ok(t.resized(&spec.dims)?))
                .collect::<Result<_>>()?;
            let positions = self.compiled.signature.args.iter().enumerate();
            let size_args = positions.filter(|(_, r)| matches!(r, ArgRole::Size(_)));
            for ((position, _), value) in size_args.zip(sizes.values) {
                let scalar = HostTensor::from_slice(DType::I64, &[], &[value])?;
                uploaded[position] = Some(self.client().upload_sharded(
                    DType::I64,
                    &[],
                    Arc::new(scalar),
                    &self.layouts[position],
                    devices,
                )?);
            }
            true_shapes = Some(sizes.results);
        }
        // Each device receives its part of each input; device buffers alias the host tensors
        // (zero-copy where the plugin allows).
        for (tensor, &position) in inputs.into_iter().zip(&self.inputs) {
            let (element_type, dims) = (tensor.element_type(), tensor.dims().to_vec());
            let data: Arc<dyn HostBytes> = Arc::new(tensor);
            uploaded[position] = Some(self.client().upload_sharded(
                element_type,
                &dims,
                data,
                &self.layouts[position],
                devices,
            )?);
        }
        let args: Vec<Vec<&Buffer>> = (0..devices.len())
            .map(|d| {
                self.fixed
                    .iter()
                    .zip(&uploaded)
                    .enumerate()
                    .map(|(position, (fixed, input))| {
                        fixed
                            .as_ref()
                            .or(input.as_ref())
                            .map(|buffers| &buffers[d])
                            .ok_or_else(|| {
                                anyhow!("internal error: no buffer for argument {position}")
                            })
                    })
                    .collect::<Result<_>>()
            })
            .collect::<Result<_>>()?;
        let per_device = self.compiled.executable.execute(&args)?;
        self.compiled
            .signature
            .user_outputs()
            .into_iter()
            .map(|i| {
                let ty = self
                    .compiled
                    .result_types
                    .get(i)
                    .ok_or_else(|| anyhow!("internal error: the module has no result {i}"))?;
                let mut host = HostTensor::zeros(ty.elem, &ty.shape)?;
                self.compiled
                    .result_to_host(&per_device, i, host.bytes_mut())?;
                match true_shapes.as_ref().and_then(|shapes| shapes.get(i)) {
                    Some(shape) if *shape != ty.shape => Ok(host.resized(shape)?),
                    _ => Ok(host),
                }
            })
            .collect()
    }
}

/// A compiled module's results are those of the archive's program: else the archive is not the
/// one the module was compiled from (or it changed since), which the plugin would only notice,
/// if at all, as a mismatch of buffer sizes.
fn check_module_results(compiled: &Compiled, module: &Path) -> Result<()> {
    let module_results: Vec<Vec<i64>> = compiled.executable.output_dims()?;
    let archive_results: Vec<Vec<i64>> = compiled
        .result_types
        .iter()
        .map(|t| t.shape.clone())
        .collect();
    if module_results != archive_results {
        bail!(
            "{} returns results of shapes {module_results:?}, but the archive's program returns \
             {archive_results:?}: the archive is not the one the module was compiled from (or it \
             changed since); compile the module again",
            module.display()
        );
    }
    Ok(())
}

fn describe(spec: &InputSpec) -> String {
    match &spec.declared {
        Some(sizes) => format!("{} {sizes} ({:?} here)", spec.dtype, spec.dims),
        None => format!("{} {:?}", spec.dtype, spec.dims),
    }
}
