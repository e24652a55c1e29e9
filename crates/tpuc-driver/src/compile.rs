//! The pipeline itself: [`emit`] (read → specialise → lower → passes → emit) and
//! [`Target::compile`] (then PJRT's compile, through both caches).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tpuc_emit::EmitFormat;
use tpuc_fx::buckets::{bucket_sizes, Padding};
use tpuc_fx::Program;
use tpuc_hlo::ir::{Mesh, Module, Sharding, ShardingDialect, TensorType};
use tpuc_hlo::passes::{HoistRequest, PipelineOptions, ShardingRequest};
use tpuc_hlo::plan::Plan;
use tpuc_hlo::{ArgRole, LowerOptions, Signature};
use tpuc_pjrt::{
    compile_with_cache, download_sharded, Buffer, CacheOutcome, CompileCache, CompileOptions,
    DType, Executable, Partitioner, ShardLayout,
};

use crate::buckets::Padded;
use crate::cache::Key;
use crate::error::{Error, Result};
use crate::source::{specialize, symbol_values, OwnedSource, Source};
use crate::target::{Target, TargetInfo};

/// What is computed once from arguments that do not change between calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Hoist {
    /// Nothing: the module computes everything on every call.
    #[default]
    Off,
    /// What the weights alone determine (weights are arguments: `WeightsMode::Args`).
    Weights,
    /// What the weights and the user inputs flagged true (one flag each, in order) determine:
    /// the torch.compile backend, whose graphs take a model's parameters as inputs.
    Inputs(Vec<bool>),
}

/// How to compile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    pub lower: LowerOptions,
    pub hoist: Hoist,
    /// The dialect of the shardings when the target has several devices.
    pub dialect: ShardingDialect,
    /// The device mesh and the plan laying the program out over it, when the target has several
    /// devices; `None` there is data parallelism over all of them (`Plan::data_parallel`).
    pub mesh: Option<(Mesh, Plan)>,
    /// The sizes of a program's symbolic dimensions (torch.export dynamic shapes), by symbol;
    /// the others come from `input_dims`, else the sizes the program was exported with. `None`
    /// refuses a program with symbolic sizes, naming them.
    pub sizes: Option<BTreeMap<String, i64>>,
    /// The shapes of the user inputs the program will run on, which fix its symbolic sizes.
    pub input_dims: Option<Vec<Vec<i64>>>,
    /// Compile a program with symbolic sizes for their buckets rather than for the sizes
    /// themselves (see `tpuc_fx::buckets`): [`Target::compile`] rounds the sizes up and the
    /// program is padded to them, or compiled per size where it cannot be made exact.
    pub buckets: Option<tpuc_fx::buckets::Buckets>,
    /// User inputs updated in place: (the input's index among the user inputs, the result
    /// holding its new value). The caller may donate such an input's buffer, which the result
    /// then takes ([`Compiled::donations`]).
    pub donate: Vec<(usize, usize)>,
    /// The on-disk cache of compiled executables: `None` for $TPUC_CACHE_DIR or the default,
    /// `off` for none (see `tpuc_pjrt::CompileCache::configured`).
    pub cache_dir: Option<String>,
}

/// A user input as the caller passes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSpec {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<i64>,
    /// The sizes the program declares when some are symbolic (`[s17, s27, 16]`), of which
    /// `dims` are the ones it was specialised to.
    pub declared: Option<String>,
}

/// Where the time of compiling went.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Reading the program and fixing its sizes.
    pub read: Duration,
    pub lower: Duration,
    pub passes: Duration,
    pub emit: Duration,
    /// The plugin's compilation, or loading the executable from the on-disk cache.
    pub compile: Duration,
}

/// A program as far as [`emit`] takes it.
pub struct Emitted {
    /// The module to run (MLIR text or bytecode), and its IR.
    pub module: Vec<u8>,
    /// The mesh the module is partitioned over (its arguments' shardings are in `ir`).
    pub mesh: Option<Mesh>,
    pub ir: Module,
    /// The module computing what is hoisted, and its IR.
    pub prepared: Option<(Vec<u8>, Module)>,
    pub signature: Signature,
    pub inputs: Vec<InputSpec>,
    /// The program (its graph and weights) after specialisation.
    pub program: Program,
    /// How a call pads its inputs, when the program was compiled for its sizes' buckets.
    pub padded: Option<Padded>,
    pub timings: Timings,
}

/// Reads, specialises, lowers, runs the passes and emits `source` for `target`.
pub fn emit(
    source: Source,
    options: &Options,
    target: &TargetInfo,
    format: EmitFormat,
) -> Result<Emitted> {
    emit_read(
        source,
        source.read()?,
        Instant::now(),
        options,
        target,
        format,
    )
}

/// [`emit`] of `program`, read from `source` since `start`.
fn emit_read(
    source: Source,
    mut program: Program,
    start: Instant,
    options: &Options,
    target: &TargetInfo,
    format: EmitFormat,
) -> Result<Emitted> {
    let mut timings = Timings::default();
    let name = source.name();
    // Inputs with symbolic sizes, as declared, for messages about inputs of other shapes.
    let declared: HashMap<String, String> = program
        .graph()
        .inputs
        .iter()
        .filter_map(|i| {
            let meta = program.graph().tensor(&i.name)?;
            let symbolic = meta.static_sizes().is_none();
            symbolic.then(|| (i.name.clone(), meta.describe_sizes()))
        })
        .collect();
    // Compiled for buckets (the sizes given are the buckets): the padded dimensions are those of
    // the symbolic program.
    let padding = match &options.buckets {
        Some(_) if tpuc_fx::symbolic::is_symbolic(&program) => Some(Arc::new(
            Padding::of(&program).map_err(|e| Error::Invalid(format!("{name}: {e}")))?,
        )),
        _ => None,
    };
    if let Some(given) = &options.sizes {
        program = specialize(
            program,
            &source.error_path(),
            given,
            options.input_dims.as_deref(),
        )?;
    }
    timings.read = start.elapsed();
    refuse_newer_kernels(&program, target, &name)?;

    let start = Instant::now();
    let compiled_module = matches!(source, Source::Module { .. });
    let layout = layout(options, target, compiled_module)?;
    let mut lower_options = options.lower.clone();
    // Sharding constraints in the graph refer to the mesh the program compiles for.
    lower_options.mesh = layout.as_ref().map(|(mesh, _)| mesh.clone());
    if compiled_module {
        // The module was compiled with weights as arguments; its signature is the archive's.
        lower_options.weights = tpuc_hlo::WeightsMode::Args;
    }
    lower_options.padding = padding.clone();
    let lowered = tpuc_hlo::lower(&program, &lower_options).map_err(|source| Error::Lower {
        what: name.clone(),
        source: Box::new(source),
    })?;
    timings.lower = start.elapsed();

    let start = Instant::now();
    let mut signature = lowered.signature;
    let arg_types = lowered.module.main.arg_types();
    let inputs = input_specs(&signature, &arg_types, &declared);
    let per_device = lower_options.process_groups.is_some();
    let (layout, sharding) = match layout {
        // One rank's program: every device runs it on its own inputs; no plan lays it out.
        Some((mesh, _)) if per_device => (Some(mesh), None),
        Some((mesh, plan)) => {
            let fail = |e: String| Error::Invalid(format!("{name}: {e}"));
            tpuc_hlo::plan::check_heads(&plan, &mesh, program.graph()).map_err(fail)?;
            let args =
                tpuc_hlo::plan::resolve(&plan, &mesh, &signature, &arg_types).map_err(fail)?;
            let result_types = lowered.module.main.result_types();
            let mut results =
                tpuc_hlo::plan::resolve_results(&plan, &mesh, &result_types).map_err(fail)?;
            let mut args = args;
            let mut at_use = tpuc_hlo::plan::resolve_at_use(&plan, &signature, &args);
            if options.dialect == ShardingDialect::Shardy {
                // XLA's Shardy pipeline compiles an argument whose parts do not divide it as
                // whole on every device (measured: it keeps the global shape and slices it):
                // it is passed whole and laid out at its uses. GSPMD takes padded parts.
                for ((sharding, ty), use_layout) in args.iter_mut().zip(&arg_types).zip(&mut at_use)
                {
                    if !tpuc_hlo::plan::splits_evenly(&mesh, sharding, &ty.shape) {
                        let whole = Sharding::replicated(ty.rank());
                        let laid_out = std::mem::replace(sharding, whole);
                        use_layout.get_or_insert(laid_out);
                    }
                }
                // So are such results: they are gathered whole.
                for (sharding, ty) in results.iter_mut().zip(&result_types) {
                    if let Some(s) = sharding.as_mut() {
                        if !tpuc_hlo::plan::splits_evenly(&mesh, s, &ty.shape) {
                            *s = Sharding::replicated(ty.rank());
                        }
                    }
                }
            }
            let request = ShardingRequest {
                mesh: mesh.clone(),
                dialect: options.dialect,
                args,
                results,
                at_use,
            };
            (Some(mesh), Some(request))
        }
        None => (None, None),
    };
    let hoist = match (&options.hoist, compiled_module) {
        (Hoist::Off, _) | (_, true) => None,
        _ if per_device => None,
        (Hoist::Weights, false) => Some(signature.stable_flags(None)),
        (Hoist::Inputs(flags), false) => Some(signature.stable_flags(Some(flags))),
    }
    .transpose()
    .map_err(|e| Error::Invalid(format!("{name}: {e}")))?
    .map(|stable| HoistRequest {
        stable,
        conv_kernels: target.conv_kernels,
    });
    let donate = options
        .donate
        .iter()
        .map(|&(input, result)| {
            let position = signature.user_input_position(input).ok_or_else(|| {
                Error::Invalid(format!("{name}: no user input {input} to update in place"))
            })?;
            Ok((position, result))
        })
        .collect::<Result<Vec<_>>>()?;
    let pipeline_options = PipelineOptions {
        hoist,
        sharding,
        per_device: layout.clone().filter(|_| per_device),
        donate,
        fusion: options.lower.fusion,
        ..PipelineOptions::default()
    };
    let piped =
        tpuc_hlo::pipeline(lowered.module, &pipeline_options).map_err(|source| Error::Verify {
            what: name.clone(),
            source: Box::new(source),
        })?;
    if let Some(p) = &piped.prepared {
        signature = signature.with_prepared(p.reads.clone(), p.module.main.results().len());
    }
    timings.passes = start.elapsed();

    let start = Instant::now();
    let module = if let Source::Module { module, .. } = source {
        std::fs::read(module).map_err(|e| Error::Io {
            path: module.to_path_buf(),
            source: e,
        })?
    } else {
        tpuc_emit::emit(&piped.main, format)?
    };
    let prepared = match piped.prepared {
        Some(p) => Some((tpuc_emit::emit(&p.module, format)?, p.module)),
        None => None,
    };
    timings.emit = start.elapsed();
    let padded = match (&padding, &options.buckets, &options.sizes) {
        (Some(padding), Some(policy), Some(buckets)) => {
            Some(Padded::new(policy, padding, buckets, &signature))
        }
        _ => None,
    };
    Ok(Emitted {
        padded,
        module,
        mesh: layout,
        ir: piped.main,
        prepared,
        signature,
        inputs,
        program,
        timings,
    })
}

/// Refuses a user kernel serialized for a newer StableHLO than the target's plugin reads.
fn refuse_newer_kernels(program: &Program, target: &TargetInfo, name: &str) -> Result<()> {
    let Some(reads) = &target.stablehlo_version else {
        return Ok(());
    };
    let version = |v: &str| -> Vec<u64> { v.split('.').filter_map(|p| p.parse().ok()).collect() };
    match program
        .kernels()
        .iter()
        .find(|k| version(&k.stablehlo_version) > version(reads))
    {
        Some(k) => Err(Error::Invalid(format!(
            "{name}: the kernel of {} was serialized for StableHLO {}, newer than the plugin \
             reads ({reads}); write it again for this plugin: tpuc.save_kernels(exported, path, \
             stablehlo_version=\"{reads}\")",
            k.describe(),
            k.stablehlo_version
        ))),
        None => Ok(()),
    }
}

/// The mesh and plan `options` ask for on `target`: data parallelism over all its devices unless
/// a mesh is given; none on one device.
fn layout(
    options: &Options,
    target: &TargetInfo,
    compiled_module: bool,
) -> Result<Option<(Mesh, Plan)>> {
    let devices = target.devices as i64;
    let (mesh, plan) = match &options.mesh {
        Some((mesh, plan)) => (mesh.clone(), plan.clone()),
        None if devices > 1 => (Mesh::line("dp", devices), Plan::data_parallel()),
        None => return Ok(None),
    };
    if mesh.devices() != devices {
        return Err(Error::Invalid(format!(
            "the mesh {mesh} has {} devices, but the target has {devices}",
            mesh.devices()
        )));
    }
    // One rank's program runs per device even on one.
    if devices == 1 && options.lower.process_groups.is_none() {
        return Ok(None);
    }
    if compiled_module {
        return Err(Error::Invalid(format!(
            "{devices} devices need a .pt2 or .fx model: tpuc adds the sharding annotations when \
             it compiles"
        )));
    }
    Ok(Some((mesh, plan)))
}

fn input_specs(
    signature: &Signature,
    arg_types: &[TensorType],
    declared: &HashMap<String, String>,
) -> Vec<InputSpec> {
    signature
        .args
        .iter()
        .zip(arg_types)
        .filter_map(|(role, ty)| match role {
            ArgRole::UserInput(name) => Some(InputSpec {
                name: name.clone(),
                dtype: ty.elem,
                dims: ty.shape.clone(),
                declared: declared.get(name).cloned(),
            }),
            _ => None,
        })
        .collect()
}

/// The executable computing what a program derives from its stable arguments.
pub struct PreparedExecutable {
    pub executable: Executable,
    /// Positions, among the program's own arguments, of those it reads.
    pub reads: Vec<usize>,
    pub stablehlo: String,
}

/// What the caches did for one compilation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheReport {
    /// The on-disk cache was off.
    pub off: bool,
    /// The on-disk cache's outcome for each executable (the program's, then the prepared one).
    pub outcomes: Vec<CacheOutcome>,
}

impl CacheReport {
    /// One phrase for what the on-disk cache did: "hit" when every executable was loaded,
    /// "stored" when one was compiled, "not stored: why", or "off".
    pub fn summary(&self) -> String {
        if self.off {
            return "off".into();
        }
        if let Some(CacheOutcome::NotStored(reason)) = self
            .outcomes
            .iter()
            .find(|o| matches!(o, CacheOutcome::NotStored(_)))
        {
            return format!("not stored: {reason}");
        }
        if self.outcomes.iter().all(|o| *o == CacheOutcome::Hit) {
            "hit".into()
        } else {
            "stored".into()
        }
    }
}

/// A program compiled for a target, ready to run.
pub struct Compiled {
    pub executable: Executable,
    pub prepared: Option<PreparedExecutable>,
    pub signature: Signature,
    pub arg_types: Vec<TensorType>,
    pub result_types: Vec<TensorType>,
    pub inputs: Vec<InputSpec>,
    /// The module the plugin compiled (MLIR text, or what the module file held).
    pub stablehlo: String,
    /// The program after specialisation: its weights feed the weight arguments.
    pub program: Program,
    /// The module's IR after the passes (`tpuc_hlo::ir::print` shows it).
    pub ir: Module,
    /// The mesh the program is partitioned over, when it is.
    pub mesh: Option<Mesh>,
    /// How each result is laid out over the target's devices (whole on one device), decided
    /// once: every run reads its results through them.
    pub result_layouts: Vec<ShardLayout>,
    /// How a call pads its inputs and slices its results, when compiled for buckets.
    pub padded: Option<Padded>,
    /// Why a program that asked for buckets was compiled for its sizes instead.
    pub not_padded: Option<String>,
    /// It was compiled ahead, in the background ([`Target::compile_in_background`]).
    pub ahead: bool,
    /// Compiled ahead and not yet handed to a caller that asked for it ([`claim`]).
    unclaimed: AtomicBool,
    /// (argument position, result index) of each argument whose buffer the result takes when
    /// the caller donates it.
    pub donations: Vec<(usize, usize)>,
    pub timings: Timings,
    pub cache: CacheReport,
}

impl Target {
    /// `source` compiled for this target. A program compiled before in this process (the same
    /// program, options and target) is returned as it was, without lowering or emitting again;
    /// the flag says so (not for the first caller of one compiled ahead for it, in the
    /// background: see [`Compiled::ahead`]).
    ///
    /// With `options.buckets`, a program with symbolic sizes is compiled for its sizes' buckets
    /// (one executable per bucket, shared by the sizes in it); one that cannot be made exact
    /// under padding is compiled for its sizes, and [`Compiled::not_padded`] says why.
    pub fn compile(&self, source: Source, options: &Options) -> Result<(Arc<Compiled>, bool)> {
        let identity = program_key(&source)?;
        self.compile_holding(source, &identity, options, None)
    }

    /// [`Target::compile`] of the program `identity` ([`program_key`]), by a caller holding the
    /// right to compile the program of `held` (a background compilation's reservation).
    fn compile_holding(
        &self,
        source: Source,
        identity: &[u8; 32],
        options: &Options,
        held: Option<Key>,
    ) -> Result<(Arc<Compiled>, bool)> {
        let identity = *identity;
        let key = cache_key(&identity, options);
        // Waits while another compiles the program of `key`, unless that is this caller.
        let compiling = |key: Key| (held != Some(key)).then(|| self.compiling(key));
        let ahead = held.is_some();
        if let Some(found) = self.executables.get(&key) {
            return Ok(claim(found));
        }
        let start = Instant::now();
        let read = source.read()?;
        let bucketed = self.bucketed(&source, &identity, &read, options)?;
        let Some(bucketed) = bucketed else {
            let _compiling = compiling(key);
            if let Some(found) = self.executables.get(&key) {
                return Ok(claim(found));
            }
            let exact = Options {
                buckets: None,
                ..options.clone()
            };
            let compiled = self.compile_new(source, read, start, &exact, None, ahead)?;
            self.executables.insert(key, compiled.clone());
            return Ok((compiled, false));
        };
        let bucket_key = cache_key(&identity, &bucketed);
        if let Some(found) = self.executables.get(&bucket_key) {
            self.executables.insert(key, found.clone());
            return Ok(claim(found));
        }
        // Compiled once: a caller asking while another compiles it (ahead, in the background)
        // waits and finds it done.
        let _compiling = compiling(bucket_key);
        if let Some(found) = self.executables.get(&bucket_key) {
            self.executables.insert(key, found.clone());
            return Ok(claim(found));
        }
        let compiled = match self.compile_new(source, read, start, &bucketed, None, ahead) {
            Err(Error::Lower { source: why, .. })
                if matches!(*why, tpuc_hlo::LowerError::NotPaddable { .. }) =>
            {
                // Compiled per size from now on, said once (by the first compilation's report).
                let why = why.to_string();
                self.not_paddable
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(identity);
                let mut exact = options.clone();
                exact.buckets = None;
                let compiled =
                    self.compile_new(source, source.read()?, start, &exact, Some(why), ahead)?;
                self.executables.insert(key, compiled.clone());
                return Ok((compiled, false));
            }
            other => other?,
        };
        self.executables.insert(bucket_key, compiled.clone());
        self.executables.insert(key, compiled.clone());
        Ok((compiled, false))
    }

    /// Compiles `source` with `options` on a thread of its own: a [`Target::compile`] of the
    /// same program and options from now on waits for it or finds it done; whether it started
    /// (not when the program is compiled or compiling already). What fails is not reported here: the compilation that
    /// needs the program reports it. (Not on rayon's pool: a compilation may wait for another
    /// of the same program, and a pool thread waiting inside `join` may be handed that other
    /// one, which would then wait for itself.)
    pub fn compile_in_background(
        self: &Arc<Self>,
        source: OwnedSource,
        options: Options,
    ) -> Result<bool> {
        let identity = program_key(&source.source())?;
        let key = cache_key(&identity, &options);
        if self.executables.get(&key).is_some() {
            return Ok(false);
        }
        let Some(reserved) = self.reserve(key) else {
            return Ok(false);
        };
        let target = self.clone();
        let spawned = std::thread::Builder::new()
            .name("tpuc-compile-ahead".into())
            .spawn(move || {
                let held = Some(reserved.key);
                let _ = target.compile_holding(source.source(), &identity, &options, held);
                drop(reserved);
            });
        // Without a thread (the reservation then given back), the program is compiled when it
        // is needed.
        match spawned {
            Ok(thread) => {
                waited_for_at_exit(thread);
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// After `compiled`, a program compiled for a bucket of sizes: when a call has just moved it
    /// into a larger bucket, the bucket after it (the sizes that grew growing together, as a
    /// decoder's cache and mask do, within their ranges) is compiled in the background, so that
    /// the sequence finds it ready; whether it started that. Nothing for a program not compiled
    /// for buckets, before a size has grown, or for a bucket compiled or compiling already.
    /// (One bucket ahead, not more: XLA:CPU compiles one program at a time per client, and a
    /// second bucket compiling ahead would delay the one the sequence needs first.)
    pub fn compile_next_bucket(
        self: &Arc<Self>,
        source: Source<'_>,
        options: &Options,
        compiled: &Compiled,
    ) -> Result<bool> {
        let Some(padded) = &compiled.padded else {
            return Ok(false);
        };
        let identity = program_key(&source)?;
        let current: BTreeMap<String, i64> = padded.buckets.iter().cloned().collect();
        let previous = self
            .last_buckets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(identity, current.clone());
        let Some(previous) = previous else {
            return Ok(false);
        };
        let grown: Vec<&String> = current
            .iter()
            .filter(|(s, b)| previous.get(*s).is_some_and(|p| p < b))
            .map(|(s, _)| s)
            .collect();
        let mut sizes = current.clone();
        let mut moved = false;
        for symbol in grown {
            let bucket = sizes[symbol];
            let next = match (padded.policy.next_bucket(bucket), padded.limits.get(symbol)) {
                (Some(next), Some(&max)) if max > bucket => next.min(max),
                (Some(next), None) => next,
                _ => continue,
            };
            sizes.insert(symbol.clone(), next);
            moved = true;
        }
        if !moved {
            return Ok(false);
        }
        // The options the program's bucketed compilation for these sizes has (see `bucketed`),
        // so that its cache key is the one a later call looks up.
        let ahead = Options {
            sizes: Some(sizes),
            input_dims: None,
            ..options.clone()
        };
        self.compile_in_background(source.to_owned_source(), ahead)
    }

    /// `options` with the sizes set to their buckets, when they ask for buckets, the program
    /// has symbolic sizes and it has not been found to need compiling per size.
    fn bucketed(
        &self,
        source: &Source,
        identity: &[u8; 32],
        program: &Program,
        options: &Options,
    ) -> Result<Option<Options>> {
        let Some(policy) = &options.buckets else {
            return Ok(None);
        };
        let given = options.sizes.clone().unwrap_or_default();
        let Some(values) = symbol_values(
            program,
            &source.error_path(),
            &given,
            options.input_dims.as_deref(),
        )?
        else {
            return Ok(None);
        };
        let refused = self.not_paddable.lock().unwrap_or_else(|p| p.into_inner());
        if refused.contains(identity) {
            return Ok(None);
        }
        Ok(Some(Options {
            sizes: Some(bucket_sizes(program, &values, policy)),
            input_dims: None,
            ..options.clone()
        }))
    }

    fn compile_new(
        &self,
        source: Source,
        program: Program,
        start: Instant,
        options: &Options,
        not_padded: Option<String>,
        ahead: bool,
    ) -> Result<Arc<Compiled>> {
        let mut emitted = emit_read(
            source,
            program,
            start,
            options,
            self.info(),
            EmitFormat::Text,
        )?;
        let start = Instant::now();
        let compile_options = match self.info().devices {
            // Runs on any of the eager device's devices when it has several.
            1 if self.each_device().len() > 1 => CompileOptions::portable(),
            1 => CompileOptions::single_device(),
            n => {
                let mut spmd = CompileOptions::spmd(
                    n,
                    match options.dialect {
                        ShardingDialect::Shardy => Partitioner::Shardy,
                        ShardingDialect::Gspmd => Partitioner::Gspmd,
                    },
                );
                // Partition i runs on the target's device i, the mesh's device i.
                let ids = self
                    .devices()
                    .iter()
                    .map(|d| d.id().map(i64::from))
                    .collect::<tpuc_pjrt::Result<Vec<i64>>>()?;
                spmd.device_assignment = Some(ids);
                spmd
            }
        };
        let disk = CompileCache::configured(options.cache_dir.as_deref())?;
        // What the on-disk cache did, per executable: (0 for the program's, 1 for the prepared
        // one, the outcome).
        let outcomes = std::sync::Mutex::new(Vec::new());
        let what = source.name();
        // The program's executables, each named for the cache's record: the program, its
        // prepared part.
        let compile =
            |module: &[u8], compile_options: &CompileOptions, part: &str| -> Result<Executable> {
                let graph = format!("{what}{part}");
                let (exe, outcome) = compile_with_cache(
                    self.client(),
                    module,
                    compile_options,
                    disk.as_ref(),
                    &graph,
                )
                .map_err(|source| match source {
                    // Refused by the cache (it must not compile), not failed by the plugin.
                    tpuc_pjrt::Error::NotCached(why) => Error::Invalid(why),
                    source => Error::Compile {
                        what: what.clone(),
                        source,
                    },
                })?;
                let order = usize::from(!part.is_empty());
                let mut outcomes = outcomes.lock().unwrap_or_else(|p| p.into_inner());
                outcomes.extend(outcome.map(|o| (order, o)));
                Ok(exe)
            };
        // The program's executable and the one computing what it derives from its weights are
        // independent: compiled side by side.
        let (main, prepared) = rayon::join(
            || {
                crate::result_layouts::compile_laid_out(
                    &mut emitted.module,
                    &mut emitted.ir,
                    emitted.mesh.as_ref(),
                    &compile_options,
                    |module, options| compile(module, options, ""),
                )
            },
            || {
                let Some((module, _)) = &emitted.prepared else {
                    return Ok(None);
                };
                Ok::<_, Error>(Some(PreparedExecutable {
                    executable: compile(module, &compile_options, " (prepared)")?,
                    reads: emitted
                        .signature
                        .prepared
                        .as_ref()
                        .map(|p| p.reads.clone())
                        .unwrap_or_default(),
                    stablehlo: String::from_utf8_lossy(module).into_owned(),
                }))
            },
        );
        let (executable, prepared) = (main?, prepared?);
        let mut outcomes = outcomes.into_inner().unwrap_or_else(|p| p.into_inner());
        outcomes.sort_by_key(|(order, _)| *order);
        let cache = CacheReport {
            off: disk.is_none(),
            outcomes: outcomes.into_iter().map(|(_, o)| o).collect(),
        };
        let mut timings = emitted.timings;
        timings.compile = start.elapsed();
        let result_types = emitted.ir.outer_result_types();
        let result_layouts = emitted
            .ir
            .main
            .result_attrs()
            .iter()
            .zip(&result_types)
            .map(|(attrs, ty)| {
                let dims = attrs.sharding.as_ref().map(|s| s.dims.as_slice());
                shard_layout(emitted.mesh.as_ref(), dims, ty.rank())
            })
            .collect::<Result<Vec<_>>>()?;
        let donations = emitted
            .ir
            .main
            .arg_attrs()
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.aliased_result.map(|r| (i, r)))
            .collect();
        let compiled = Arc::new(Compiled {
            executable,
            prepared,
            arg_types: emitted.ir.outer_arg_types(),
            result_types,
            result_layouts,
            mesh: emitted.mesh,
            ir: emitted.ir,
            signature: emitted.signature,
            inputs: emitted.inputs,
            stablehlo: String::from_utf8_lossy(&emitted.module).into_owned(),
            program: emitted.program,
            donations,
            padded: emitted.padded,
            not_padded,
            ahead,
            unclaimed: AtomicBool::new(ahead),
            timings,
            cache,
        });
        Ok(compiled)
    }
}

/// A compiled program found in the cache, and whether it counts as reused: not when it was
/// compiled ahead and this is the first caller asking for it (it was compiled for that caller,
/// only earlier).
fn claim(found: Arc<Compiled>) -> (Arc<Compiled>, bool) {
    let first = found.unclaimed.swap(false, Ordering::AcqRel);
    (found, !first)
}

/// The in-process cache's key of the program `identity` ([`program_key`]) compiled with
/// `options`.
fn cache_key(identity: &[u8; 32], options: &Options) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(identity);
    hash.update(format!("{options:?}").as_bytes());
    hash.finalize().into()
}

/// What identifies the program alone, whatever the options.
fn program_key(source: &Source) -> Result<[u8; 32]> {
    let mut hash = Sha256::new();
    source.identity(&mut hash)?;
    Ok(hash.finalize().into())
}

impl Compiled {
    /// How argument `index` is laid out over the target's devices (whole on one device).
    pub fn arg_layout(&self, index: usize) -> Result<ShardLayout> {
        let sharding = self.ir.main.arg_attrs()[index].sharding.as_ref();
        shard_layout(
            self.mesh.as_ref(),
            sharding.map(|s| s.dims.as_slice()),
            self.arg_types[index].rank(),
        )
    }

    /// Whether every result is whole on every device (the first device's are then the results).
    pub fn results_whole(&self) -> bool {
        self.result_layouts.iter().all(ShardLayout::is_replicated)
    }

    /// Result `index` of a run (`per_device[d]`: device d's results), whole, into `dst`: its
    /// row-major bytes, read from the devices' parts as the result is laid out.
    pub fn result_to_host(
        &self,
        per_device: &[Vec<Buffer>],
        index: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let parts = per_device
            .iter()
            .map(|results| results.get(index))
            .collect::<Option<Vec<&Buffer>>>()
            .ok_or_else(|| {
                Error::Invalid(format!("the run returned fewer than {} results", index + 1))
            })?;
        let layout = &self.result_layouts[index];
        if layout.is_replicated() {
            return Ok(parts[0].copy_to_host(dst)?);
        }
        let ty = &self.result_types[index];
        Ok(download_sharded(&parts, layout, ty.elem, &ty.shape, dst)?)
    }
}

/// How a tensor of `rank` dimensions, split per dimension over the axes `dims` names (whole when
/// `None`), spreads over the devices of `mesh` (one device when there is none).
pub fn shard_layout(
    mesh: Option<&Mesh>,
    dims: Option<&[Vec<String>]>,
    rank: usize,
) -> Result<ShardLayout> {
    let Some(mesh) = mesh else {
        return Ok(ShardLayout::replicated(vec![1], rank));
    };
    let sizes: Vec<i64> = mesh.axes.iter().map(|a| a.size).collect();
    let dims = match dims {
        None => vec![Vec::new(); rank],
        Some(dims) => dims
            .iter()
            .map(|axes| {
                axes.iter()
                    .map(|a| {
                        mesh.axis(a).map(|(i, _)| i).ok_or_else(|| {
                            Error::Invalid(format!("the mesh {mesh} has no axis {a:?}"))
                        })
                    })
                    .collect::<Result<Vec<usize>>>()
            })
            .collect::<Result<Vec<_>>>()?,
    };
    Ok(ShardLayout::new(sizes, dims)?)
}

/// Compilations running ahead on threads of their own, which the process waits for when it
/// exits: the plugin's own teardown at exit would otherwise pull XLA from under a compilation
/// still running (a crash as a program that compiled a bucket ahead ends).
static AHEAD: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

fn waited_for_at_exit(thread: JoinHandle<()>) {
    static REGISTERED: Once = Once::new();
    // Registered after the plugin loaded (it compiled this program's first bucket), so run
    // before its teardown: exit handlers run in the reverse order of registration.
    REGISTERED.call_once(|| {
        // SAFETY: `wait_for_compiles_ahead` is an `extern "C" fn()` that never unwinds.
        unsafe { libc::atexit(wait_for_compiles_ahead) };
    });
    let mut ahead = AHEAD.lock().unwrap_or_else(|p| p.into_inner());
    ahead.retain(|t| !t.is_finished());
    ahead.push(thread);
}

extern "C" fn wait_for_compiles_ahead() {
    let threads = std::mem::take(&mut *AHEAD.lock().unwrap_or_else(|p| p.into_inner()));
    for thread in threads {
        // A compilation that failed is reported by the one that needed it, if any did.
        let _ = thread.join();
    }
}
