//! Running a model on a PJRT plugin: the code path of `tpuc run`.
//!
//! A model is a `.pt2` / `.fx` program (lowered here, its weights read from the archive) or a
//! module compiled by `tpuc compile --weights args` plus the archive it was compiled from, which
//! supplies the weights and the signature. Weights are uploaded once, sharing the archive's
//! memory-mapped data where the plugin allows (zero-copy on the CPU plugin).
//!
//! With several devices the program runs data-parallel through XLA's SPMD partitioner: each user
//! input is split along its first dimension, weights are replicated, results are replicated.
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tpuc_fx::{OutputKind, Program, WeightBytes};
use tpuc_hlo::{ArgAttrs, ArgRole, ElemType, EmitFormat, LowerOptions, Lowered, WeightsMode};
use tpuc_pjrt::{
    compile_with_cache, Buffer, CacheOutcome, Client, ClientOptions, CompileCache, CompileOptions,
    ElementType, Executable, HostBytes, HostTensor, Partitioner, Plugin,
};

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
            cache_dir: None,
            sizes: BTreeMap::new(),
            input_dims: None,
        }
    }
}

/// A user input the model expects.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    pub name: String,
    pub element_type: ElementType,
    pub dims: Vec<i64>,
    /// The sizes the program declares when some are symbolic (`[s17, s27, 16]`), of which
    /// `dims` are the ones it was specialised to.
    pub declared: Option<String>,
}

/// Where the time of preparing a model went.
#[derive(Clone, Debug, Default)]
pub struct PrepareTimings {
    /// Reading the program and lowering it to StableHLO.
    pub lower: Duration,
    /// Loading the plugin and creating the client.
    pub client: Duration,
    /// The plugin's compilation (or loading the executable from the cache).
    pub compile: Duration,
    /// What the cache of compiled executables did; `None` when it is off.
    pub cache: Option<CacheOutcome>,
    /// Uploading the weights.
    pub weights: Duration,
}

/// A model compiled and loaded on a plugin, its weights on the devices, ready to run.
pub struct Runner {
    client: Client,
    executable: Executable,
    /// Per argument of `main`: a weight (index into `weights[device]`) or a user input.
    slots: Vec<Slot>,
    /// `weights[device][i]`.
    weights: Vec<Vec<Buffer>>,
    /// Per device, the seed of the random ops, when the model has any.
    seeds: Vec<Buffer>,
    inputs: Vec<InputSpec>,
    /// Indices of the results that are user outputs (not buffer mutations).
    user_outputs: Vec<usize>,
    pub timings: PrepareTimings,
}

#[derive(Clone, Copy, Debug)]
enum Slot {
    Weight(usize),
    Input(usize),
    Seed,
}

/// Weight bytes of the archive, shared with device buffers.
struct WeightData(WeightBytes);

impl HostBytes for WeightData {
    fn bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Whether `path` holds a program (`.pt2` zip or `.fx`) rather than a compiled module.
fn is_program(path: &Path) -> Result<bool> {
    use std::io::Read;
    let mut head = [0u8; 8];
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let n = file
        .read(&mut head)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(head[..n].starts_with(b"PK") || head[..n].starts_with(tpuc_fx::fxfile::MAGIC.as_slice()))
}

pub fn element_type(elem: ElemType) -> ElementType {
    match elem {
        ElemType::I1 => ElementType::Pred,
        ElemType::I8 => ElementType::S8,
        ElemType::I16 => ElementType::S16,
        ElemType::I32 => ElementType::S32,
        ElemType::I64 => ElementType::S64,
        ElemType::U8 => ElementType::U8,
        ElemType::U16 => ElementType::U16,
        ElemType::U32 => ElementType::U32,
        ElemType::U64 => ElementType::U64,
        ElemType::F16 => ElementType::F16,
        ElemType::BF16 => ElementType::BF16,
        ElemType::F32 => ElementType::F32,
        ElemType::F64 => ElementType::F64,
        ElemType::C64 => ElementType::C64,
        ElemType::C128 => ElementType::C128,
    }
}

/// GSPMD annotations for data parallelism over `devices`: user inputs split along their first
/// dimension, weights and results replicated.
fn annotate_data_parallel(lowered: &mut Lowered, devices: usize) {
    let replicated = || ArgAttrs {
        attrs: vec![("mhlo.sharding".into(), "\"{replicated}\"".into())],
    };
    let main = &mut lowered.module.main;
    let arg_types = main.arg_types();
    for (i, role) in lowered.args.iter().enumerate() {
        main.arg_attrs[i] = match role {
            ArgRole::UserInput(_) if !arg_types[i].shape.is_empty() => {
                let mut tiles = vec!["1".to_string(); arg_types[i].shape.len()];
                tiles[0] = devices.to_string();
                ArgAttrs {
                    attrs: vec![(
                        "mhlo.sharding".into(),
                        format!("\"{{devices=[{}]<=[{devices}]}}\"", tiles.join(",")),
                    )],
                }
            }
            _ => replicated(),
        };
    }
    main.result_attrs = vec![replicated(); main.results.len()];
}

impl Runner {
    /// Prepares `model` (a `.pt2` / `.fx` program, or a compiled module with `weights`, the
    /// archive it was compiled from).
    pub fn new(model: &Path, weights: Option<&Path>, options: &RunOptions) -> Result<Runner> {
        let mut timings = PrepareTimings::default();
        let start = Instant::now();
        let model_is_program = is_program(model)?;
        let archive = match (model_is_program, weights) {
            (true, None) => model,
            (true, Some(_)) => bail!(
                "--weights is for compiled modules; {} carries its own weights",
                model.display()
            ),
            (false, Some(archive)) => archive,
            (false, None) => bail!(
                "{} is not a .pt2 or .fx program; to run a compiled module, pass --weights with the \
                 archive it was compiled from (it supplies the weights and the signature)",
                model.display()
            ),
        };
        if options.devices < 1 {
            bail!("--devices must be at least 1");
        }
        if options.devices > 1 && !model_is_program {
            bail!("--devices {} needs a .pt2 or .fx model: tpuc adds the sharding annotations when it compiles", options.devices);
        }
        let program = tpuc_fx::read_program(archive)?;
        // Inputs with symbolic sizes, as declared, for messages about inputs of other shapes.
        let declared: HashMap<String, String> = program
            .graph
            .inputs
            .iter()
            .filter_map(|i| {
                let meta = program.graph.tensor(&i.name)?;
                let symbolic = meta.static_sizes().is_none();
                symbolic.then(|| (i.name.clone(), meta.describe_sizes()))
            })
            .collect();
        let program = crate::specialize(
            program,
            archive,
            &options.sizes,
            options.input_dims.as_deref(),
        )?;
        let lower_options = LowerOptions {
            weights: WeightsMode::Args,
            ..options.lower.clone()
        };
        let mut lowered = tpuc_hlo::lower(&program, &lower_options)
            .with_context(|| format!("cannot compile {}", archive.display()))?;
        let arg_types = lowered.module.main.arg_types();
        let mut slots = Vec::new();
        let mut inputs = Vec::new();
        let mut weight_names = Vec::new();
        for (role, ty) in lowered.args.iter().zip(&arg_types) {
            match role {
                ArgRole::Weight(name) => {
                    slots.push(Slot::Weight(weight_names.len()));
                    weight_names.push(name.clone());
                }
                ArgRole::RngSeed => slots.push(Slot::Seed),
                ArgRole::UserInput(name) => {
                    slots.push(Slot::Input(inputs.len()));
                    inputs.push(InputSpec {
                        name: name.clone(),
                        element_type: element_type(ty.elem),
                        dims: ty.shape.clone(),
                        declared: declared.get(name).cloned(),
                    });
                }
            }
        }
        if options.devices > 1 {
            for input in &inputs {
                match input.dims.first() {
                    Some(&d) if d % options.devices as i64 != 0 => bail!(
                        "input {} has first dimension {d}, which {} devices cannot split evenly",
                        input.name,
                        options.devices
                    ),
                    _ => {}
                }
            }
            annotate_data_parallel(&mut lowered, options.devices);
        }
        let module = if model_is_program {
            tpuc_hlo::emit(&lowered.module, EmitFormat::Text)?
        } else {
            std::fs::read(model).with_context(|| format!("cannot read {}", model.display()))?
        };
        let user_outputs = user_output_indices(&program);
        timings.lower = start.elapsed();

        let start = Instant::now();
        let plugin_path = tpuc_pjrt::discover::resolve(options.plugin.as_deref())?;
        let plugin = Plugin::load(&plugin_path)?;
        // Other plugins refuse options they do not know (libtpu does), so the CPU plugin's
        // device count is only passed to it.
        let cpu_device_count = (options.devices > 1
            && tpuc_pjrt::discover::is_cpu_plugin(&plugin_path))
        .then_some(options.devices as i64);
        let client = Client::new(
            &plugin,
            &ClientOptions {
                cpu_device_count,
                ..Default::default()
            },
        )
        .with_context(|| format!("the PJRT plugin {} cannot start", plugin_path.display()))?;
        let available = client.addressable_devices()?.len();
        if available < options.devices {
            bail!(
                "{} devices requested, but the {} plugin has {available}",
                options.devices,
                client.platform_name()?
            );
        }
        timings.client = start.elapsed();

        let start = Instant::now();
        let compile_options = if options.devices > 1 {
            CompileOptions::spmd(options.devices, Partitioner::Gspmd)
        } else {
            CompileOptions::single_device()
        };
        let cache = CompileCache::configured(options.cache_dir.as_deref())?;
        let (executable, cache_outcome) =
            compile_with_cache(&client, &module, &compile_options, cache.as_ref())
                .with_context(|| format!("the plugin cannot compile {}", model.display()))?;
        timings.cache = cache_outcome;
        timings.compile = start.elapsed();

        let start = Instant::now();
        let weight_args: Vec<(&String, &tpuc_hlo::TensorType)> = lowered
            .args
            .iter()
            .zip(&arg_types)
            .filter_map(|(role, ty)| match role {
                ArgRole::Weight(name) => Some((name, ty)),
                ArgRole::UserInput(_) | ArgRole::RngSeed => None,
            })
            .collect();
        let mut weights = Vec::new();
        for device in executable.devices() {
            let mut on_device = Vec::new();
            for (name, ty) in &weight_args {
                let weight = program
                    .weights
                    .get(name.as_str())
                    .ok_or_else(|| anyhow!("the archive has no data for weight {name}"))?;
                let data: Arc<dyn HostBytes> = Arc::new(WeightData(weight.bytes.clone()));
                let buffer = client
                    .buffer_sharing(element_type(ty.elem), &ty.shape, data, device)
                    .with_context(|| format!("uploading weight {name}"))?;
                on_device.push(buffer);
            }
            weights.push(on_device);
        }
        let mut seeds = Vec::new();
        if slots.iter().any(|s| matches!(s, Slot::Seed)) {
            let seed = HostTensor::from_bytes(
                ElementType::U64,
                &[2],
                &[options.seed.to_le_bytes(), 0u64.to_le_bytes()].concat(),
            )?;
            for device in executable.devices() {
                seeds.push(client.buffer_from_host(&seed, device)?);
            }
        }
        timings.weights = start.elapsed();
        Ok(Runner {
            client,
            executable,
            slots,
            weights,
            seeds,
            inputs,
            user_outputs,
            timings,
        })
    }

    /// The user inputs the model expects, in order.
    pub fn inputs(&self) -> &[InputSpec] {
        &self.inputs
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn devices(&self) -> usize {
        self.executable.devices().len()
    }

    /// Checks `inputs` against the model's signature (count, dtype, shape), converting float32
    /// given for bfloat16.
    pub fn check_inputs(&self, inputs: Vec<HostTensor>) -> Result<Vec<HostTensor>> {
        if inputs.len() != self.inputs.len() {
            let expected: Vec<String> = self.inputs.iter().map(describe).collect();
            bail!(
                "the model takes {} input(s) ({}), {} given",
                self.inputs.len(),
                expected.join(", "),
                inputs.len()
            );
        }
        inputs
            .into_iter()
            .zip(&self.inputs)
            .enumerate()
            .map(|(i, (tensor, spec))| {
                let tensor = match crate::npy::adapt_to(&tensor, spec.element_type)? {
                    Some(converted) => converted,
                    None => tensor,
                };
                if tensor.element_type() != spec.element_type || tensor.dims() != spec.dims {
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
        let devices = self.executable.devices();
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
                    self.client
                        .buffer_sharing(element_type, &dims, data, device)?,
                );
            }
            input_buffers.push(on_device);
        }
        let args: Vec<Vec<&Buffer>> = (0..devices.len())
            .map(|d| {
                self.slots
                    .iter()
                    .map(|slot| match *slot {
                        Slot::Weight(i) => &self.weights[d][i],
                        Slot::Input(i) => &input_buffers[d][i],
                        Slot::Seed => &self.seeds[d],
                    })
                    .collect()
            })
            .collect();
        let mut outputs = self.executable.execute(&args)?;
        // Results are replicated: the first device's are the whole outputs.
        let first = outputs.swap_remove(0);
        self.user_outputs
            .iter()
            .map(|&i| {
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
        Some(sizes) => format!("{} {sizes} ({:?} here)", spec.element_type, spec.dims),
        None => format!("{} {:?}", spec.element_type, spec.dims),
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

fn user_output_indices(program: &Program) -> Vec<usize> {
    program
        .graph
        .outputs
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o.kind, OutputKind::User | OutputKind::Loss))
        .map(|(i, _)| i)
        .collect()
}
