//! Running a model on a PJRT plugin: the code path of `tpuc run`.
//!
//! A model is a `.pt2` / `.fx` program, or a module compiled by `tpuc compile --weights args`
//! plus the archive it was compiled from, which supplies the weights and the signature; either
//! goes through `tpuc_driver`'s pipeline. Weights are uploaded once, sharing the archive's
//! memory-mapped data where the plugin allows (zero-copy on the CPU plugin), and what the
//! program derives from them alone is computed once, by the prepared executable.
//!
//! With several devices the program runs data-parallel through XLA's SPMD partitioner: each user
//! input is split along its first dimension, weights are replicated, results are replicated.
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tpuc_driver::{
    ArgRole, CacheOutcome, Compiled, Hoist, InputSpec, LowerOptions, Options, ShardingDialect,
    Source, Target, WeightsMode,
};
use tpuc_fx::WeightBytes;
use tpuc_pjrt::{Buffer, DType, HostBytes, HostTensor};

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
    /// The cache of compiled executables: `None` for $TPUC_CACHE_DIR or the default, `off`
    /// for none (see `tpuc_pjrt::CompileCache::configured`).
    pub cache_dir: Option<String>,
    /// Sizes of a program's symbolic dimensions (torch.export dynamic shapes), by symbol; the
    /// others come from `input_dims`, else the sizes the program was exported with.
    pub sizes: BTreeMap<String, i64>,
    /// The shapes of the user inputs the model will run on, which fix its symbolic sizes.
    pub input_dims: Option<Vec<Vec<i64>>>,
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
            cache_dir: None,
            sizes: BTreeMap::new(),
            input_dims: None,
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
    /// `weights[device][i]`, for the weight at argument `weight_args[i]`.
    weights: Vec<Vec<Buffer>>,
    /// `derived[device][i]`: what the prepared executable computed from the weights.
    derived: Vec<Vec<Buffer>>,
    /// Per device, the seed of the random ops, when the model has any.
    seeds: Vec<Buffer>,
    /// Where each argument of the executable comes from, by its role in the signature.
    slots: Vec<Slot>,
    pub timings: PrepareTimings,
}

/// An argument's buffer: the i-th weight, user input or derived value, or the seed.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Weight(usize),
    Input(usize),
    Seed,
    Derived(usize),
}

fn slots(roles: &[ArgRole]) -> Vec<Slot> {
    let (mut weights, mut inputs) = (0, 0);
    roles
        .iter()
        .map(|role| match role {
            ArgRole::Weight(_) => {
                weights += 1;
                Slot::Weight(weights - 1)
            }
            ArgRole::UserInput(_) => {
                inputs += 1;
                Slot::Input(inputs - 1)
            }
            ArgRole::RngSeed => Slot::Seed,
            ArgRole::Derived(i) => Slot::Derived(*i),
        })
        .collect()
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
        if options.devices < 1 {
            bail!("--devices must be at least 1");
        }
        let start = Instant::now();
        let target = Target::open(options.plugin.as_deref(), options.devices, &[])?;
        timings.client = start.elapsed();

        let compile_options = Options {
            lower: LowerOptions {
                weights: WeightsMode::Args,
                ..options.lower.clone()
            },
            hoist: if options.hoist_weights {
                Hoist::Weights
            } else {
                Hoist::Off
            },
            dialect: options.dialect,
            sizes: Some(options.sizes.clone()),
            input_dims: options.input_dims.clone(),
            cache_dir: options.cache_dir.clone(),
        };
        let (compiled, _) = target.compile(source, &compile_options)?;
        let t = &compiled.timings;
        timings.lower = t.read + t.lower + t.passes + t.emit;
        timings.compile = t.compile;
        timings.cache = compiled.cache.outcomes.first().cloned();

        let start = Instant::now();
        let mut runner = Runner {
            target,
            slots: slots(&compiled.signature.args),
            compiled,
            weights: Vec::new(),
            derived: Vec::new(),
            seeds: Vec::new(),
            timings,
        };
        runner.upload_weights()?;
        runner.upload_seeds(options.seed)?;
        runner.prepare()?;
        runner.timings.weights = start.elapsed();
        Ok(runner)
    }

    fn upload_weights(&mut self) -> Result<()> {
        let c = &self.compiled;
        for device in self.target.devices() {
            let mut on_device = Vec::new();
            for (role, ty) in c.signature.args.iter().zip(&c.arg_types) {
                let ArgRole::Weight(name) = role else {
                    continue;
                };
                let weight = c
                    .program
                    .weights
                    .get(name.as_str())
                    .ok_or_else(|| anyhow!("the archive has no data for weight {name}"))?;
                let data: Arc<dyn HostBytes> = Arc::new(WeightData(weight.bytes.clone()));
                let buffer = self
                    .target
                    .client()
                    .buffer_sharing(ty.elem, &ty.shape, data, device)
                    .with_context(|| format!("uploading weight {name}"))?;
                on_device.push(buffer);
            }
            self.weights.push(on_device);
        }
        Ok(())
    }

    fn upload_seeds(&mut self, seed: u64) -> Result<()> {
        if !self.compiled.signature.takes_seed() {
            return Ok(());
        }
        let seed = HostTensor::from_bytes(
            DType::U64,
            &[2],
            &[seed.to_le_bytes(), 0u64.to_le_bytes()].concat(),
        )?;
        for device in self.target.devices() {
            self.seeds
                .push(self.target.client().buffer_from_host(&seed, device)?);
        }
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
                    .map(|&position| self.own_arg(d, position, &[]))
                    .collect::<Result<_>>()
            })
            .collect::<Result<_>>()?;
        self.derived = prepared
            .executable
            .execute(&args)
            .context("computing the values derived from the weights")?;
        Ok(())
    }

    /// The buffer for argument `position` on device `d` (`inputs`: that device's user inputs).
    fn own_arg<'a>(
        &'a self,
        d: usize,
        position: usize,
        inputs: &'a [Buffer],
    ) -> Result<&'a Buffer> {
        let buffer = match self.slots[position] {
            Slot::Weight(i) => self.weights[d].get(i),
            Slot::Input(i) => inputs.get(i),
            Slot::Seed => self.seeds.get(d),
            Slot::Derived(i) => self.derived.get(d).and_then(|values| values.get(i)),
        };
        buffer.ok_or_else(|| anyhow!("internal error: no buffer for argument {position}"))
    }

    /// The user inputs the model expects, in order.
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
                if tensor.element_type() != spec.dtype || tensor.dims() != spec.dims {
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
        let inputs: Vec<Arc<HostTensor>> = self
            .check_inputs(inputs)?
            .into_iter()
            .map(Arc::new)
            .collect();
        let devices = self.target.devices();
        // Per device, its part of each input (all of it on one device).
        let mut input_buffers: Vec<Vec<Buffer>> = Vec::with_capacity(devices.len());
        for (d, device) in devices.iter().enumerate() {
            let mut on_device = Vec::with_capacity(inputs.len());
            for tensor in &inputs {
                // Device buffers alias the host tensors (zero-copy where the plugin allows).
                let part = shard(tensor, d, devices.len())?;
                let (element_type, dims) = (part.element_type(), part.dims().to_vec());
                let data: Arc<dyn HostBytes> = part;
                on_device.push(
                    self.client()
                        .buffer_sharing(element_type, &dims, data, device)?,
                );
            }
            input_buffers.push(on_device);
        }
        let args: Vec<Vec<&Buffer>> = (0..devices.len())
            .map(|d| {
                (0..self.compiled.signature.args.len())
                    .map(|position| self.own_arg(d, position, &input_buffers[d]))
                    .collect::<Result<_>>()
            })
            .collect::<Result<_>>()?;
        let mut outputs = self.compiled.executable.execute(&args)?;
        // Results are replicated: the first device's are the whole outputs.
        let first = outputs.swap_remove(0);
        self.compiled
            .signature
            .user_outputs()
            .into_iter()
            .map(|i| {
                first
                    .get(i)
                    .ok_or_else(|| {
                        anyhow!("the module returned {} results, expected more", first.len())
                    })?
                    .to_host()
                    .map_err(Into::into)
            })
            .collect()
    }
}

fn describe(spec: &InputSpec) -> String {
    match &spec.declared {
        Some(sizes) => format!("{} {sizes} ({:?} here)", spec.dtype, spec.dims),
        None => format!("{} {:?}", spec.dtype, spec.dims),
    }
}

/// The `index`-th of `parts` equal slices of `tensor` along its first dimension.
fn shard(tensor: &Arc<HostTensor>, index: usize, parts: usize) -> Result<Arc<HostTensor>> {
    if parts == 1 || tensor.dims().is_empty() {
        return Ok(tensor.clone());
    }
    let mut dims = tensor.dims().to_vec();
    dims[0] /= parts as i64;
    let len = tensor.bytes().len() / parts;
    let bytes = &tensor.bytes()[index * len..(index + 1) * len];
    Ok(Arc::new(HostTensor::from_bytes(
        tensor.element_type(),
        &dims,
        bytes,
    )?))
}
