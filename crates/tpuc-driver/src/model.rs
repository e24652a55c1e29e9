//! A model file opened for running: a `.pt2` / `.fx` program, or a module compiled by `tpuc
//! compile --weights args` with the archive it was compiled from (which supplies the weights
//! and the signature), compiled through the pipeline and loaded on a plugin's devices, its
//! weights uploaded and its seed set. `tpuc run` and `tpuc.compile_exported` both open models
//! here.
//!
//! On several devices the program is partitioned by XLA's SPMD partitioner over a mesh, as a
//! plan lays its arguments out (data parallel over all devices unless a mesh and plan are
//! given): each device receives only its part of each weight and input.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tpuc_emit::EmitFormat;
use tpuc_hlo::ir::{Mesh, ShardingDialect};
use tpuc_hlo::plan::Plan;
use tpuc_hlo::{LowerOptions, WeightsMode};
use tpuc_pjrt::CacheOutcome;

use crate::compile::{emit, Compiled, Emitted, Hoist, Options};
use crate::error::{Error, Result};
use crate::loaded::Loaded;
use crate::source::Source;
use crate::target::{Target, TargetInfo};
use crate::Buckets;

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

/// Where the time of opening a model went.
#[derive(Clone, Debug, Default)]
pub struct OpenTimings {
    /// Reading the program, lowering it and emitting StableHLO.
    pub lower: Duration,
    /// Loading the plugin and creating the client.
    pub client: Duration,
    /// The plugin's compilation (or loading the executables from the cache).
    pub compile: Duration,
    /// What the cache of compiled executables did with the model's executable; `None` when it
    /// is off.
    pub cache: Option<CacheOutcome>,
    /// Uploading the weights, setting the seed and computing what is derived from the weights.
    pub weights: Duration,
}

/// Opens `model` (a `.pt2` / `.fx` program, or a compiled module with `weights`, the archive it
/// was compiled from) for running as `options` say.
pub fn open(
    model: &Path,
    weights: Option<&Path>,
    options: &RunOptions,
) -> Result<(Loaded, OpenTimings)> {
    let mut timings = OpenTimings::default();
    let is_program = tpuc_fx::program_format(model)?.is_some();
    let source = match (is_program, weights) {
        (true, None) => Source::File(model),
        (true, Some(_)) => {
            return Err(Error::Invalid(format!(
                "--weights is for compiled modules; {} carries its own weights",
                model.display()
            )))
        }
        (false, Some(archive)) => Source::Module {
            module: model,
            archive,
        },
        (false, None) => {
            return Err(Error::Invalid(format!(
                "{} is not a .pt2 or .fx program; to run a compiled module, pass --weights with \
                 the archive it was compiled from (it supplies the weights and the signature)",
                model.display()
            )))
        }
    };
    let devices = match &options.mesh {
        Some((mesh, _)) => mesh.devices() as usize,
        None => options.devices,
    };
    if devices < 1 {
        return Err(Error::Invalid("--devices must be at least 1".into()));
    }
    let start = Instant::now();
    let target = Arc::new(Target::open(
        options.plugin.as_deref(),
        devices,
        &options.search_paths,
    )?);
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
    let loaded = Loaded::new(target, compiled)?.with_seed(options.seed)?;
    loaded.prepare()?;
    timings.weights = start.elapsed();
    Ok((loaded, timings))
}

/// Compiles a `.pt2` or `.fx` file to StableHLO as `options` say, for as many devices as their
/// mesh has (no plugin is needed).
pub fn emit_file(input: &Path, options: &Options, format: EmitFormat) -> Result<Emitted> {
    let devices = options
        .mesh
        .as_ref()
        .map_or(1, |(m, _)| m.devices() as usize);
    let target = TargetInfo::new(tpuc_pjrt::discover::PluginKind::Other, devices);
    emit(Source::File(input), options, &target, format)
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
        return Err(Error::Invalid(format!(
            "{} returns results of shapes {module_results:?}, but the archive's program returns \
             {archive_results:?}: the archive is not the one the module was compiled from (or it \
             changed since); compile the module again",
            module.display()
        )));
    }
    Ok(())
}
