//! The `tpuc` command: its arguments and what each subcommand does (the binary and the Python
//! package's `tpuc` entry point both call [`main`]).
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use std::time::Instant;

use crate::{npy, plugins};
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use tpuc_driver::{
    Buckets, CacheOutcome, EmitFormat, Fusion, LowerOptions, Precision, RunOptions,
    ShardingDialect, WeightsMode,
};
use tpuc_pjrt::CompileCache;

/// tpuc compiles PyTorch programs (torch.export archives) into StableHLO and runs them on PJRT
/// plugins (XLA CPU, TPU, GPU).
#[derive(Parser)]
#[command(name = "tpuc", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Emit {
    /// MLIR text, StableHLO ops in generic form, with source locations.
    Text,
    /// MLIR bytecode.
    Bytecode,
    /// tpuc's own IR after its passes, as text: for reading (the plugin takes MLIR).
    Ir,
}

#[derive(Clone, Copy, ValueEnum)]
enum Weights {
    /// Parameters, buffers and constants become the leading arguments of `main`, in the
    /// order of the program's signature; the runtime passes them in.
    Args,
    /// Weights become inline constants: a self-contained module (large for big models).
    Inline,
}

/// `--matmul-precision`: one of [`Precision`]'s names, each with its description.
fn precision_parser() -> impl clap::builder::TypedValueParser<Value = Precision> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        Precision::ALL.map(|p| PossibleValue::new(p.name()).help(p.description())),
    )
    .map(|name| name.parse().expect("a listed precision"))
}

fn fusion_parser() -> impl clap::builder::TypedValueParser<Value = Fusion> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        Fusion::ALL.map(|f| PossibleValue::new(f.name()).help(f.description())),
    )
    .map(|name| name.parse().expect("a listed fusion"))
}

#[derive(Clone, Copy, ValueEnum)]
enum Partitioner {
    /// Shardy (`sdy.sharding`), XLA's current partitioner.
    Shardy,
    /// GSPMD (`mhlo.sharding`), whose propagation XLA deprecates.
    Gspmd,
}

impl From<Partitioner> for ShardingDialect {
    fn from(p: Partitioner) -> Self {
        match p {
            Partitioner::Shardy => ShardingDialect::Shardy,
            Partitioner::Gspmd => ShardingDialect::Gspmd,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum FxWeights {
    /// Inside the .fx file.
    Inline,
    /// In OUT.weights beside it, each weight 64-byte aligned for memory mapping.
    SideFile,
}

#[derive(Subcommand)]
enum Command {
    /// Compile torch.export archives (.pt2) or tpuc .fx files to StableHLO.
    ///
    /// Several programs compile side by side, one per core; each goes to DIR/NAME.mlir
    /// (.mlirbc for bytecode, .ir for tpuc's IR) in the directory -o names, and every one that
    /// fails is reported.
    Compile {
        /// Input programs: .pt2 archives from torch.export.save, or .fx files.
        #[arg(required = true, num_args = 1..)]
        inputs: Vec<PathBuf>,
        /// Output file (`-`: standard output); with several inputs, the directory the modules
        /// go to (created if missing).
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Emit::Text)]
        emit: Emit,
        /// How weights reach the module.
        #[arg(long, value_enum, default_value_t = Weights::Args)]
        weights: Weights,
        /// Precision of f32 matmuls and convolutions.
        #[arg(long, value_parser = precision_parser(), default_value = "highest")]
        matmul_precision: Precision,
        /// Named patterns as stablehlo.composite ops (`--emit ir` shows them).
        #[arg(long, value_parser = fusion_parser(), default_value = Fusion::RECOMMENDED.name())]
        fusion: Fusion,
        /// Print node/op counts and the time of each stage to standard error.
        #[arg(long)]
        stats: bool,
        /// Compile a program exported with dynamic shapes for the sizes it was exported with
        /// (those not set by --size).
        #[arg(long)]
        specialize: bool,
        /// Compile a program exported with dynamic shapes for this size of a symbol, e.g.
        /// --size s0=8 (repeatable; implies --specialize). Sizes are checked against the ranges
        /// the program was exported for.
        #[arg(long = "size", value_name = "SYMBOL=SIZE", value_delimiter = ',')]
        sizes: Vec<String>,
        #[command(flatten)]
        layout: LayoutArgs,
    },
    /// Convert a .pt2 archive to tpuc's .fx interchange (or re-write a .fx file).
    Convert {
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Where the weights go.
        #[arg(long, value_enum, default_value_t = FxWeights::Inline)]
        weights: FxWeights,
    },
    /// Coverage of torch's core ATen opset: each overload with its status (lowered, decomposed
    /// by torch into ops tpuc lowers, not supported), then the other overloads tpuc lowers.
    Ops {
        /// Print only the overloads tpuc lowers, one per line.
        #[arg(long)]
        lowered: bool,
    },
    /// Show the cache of compiled executables (`tpuc run` and the torch.compile backend load
    /// from it what they compiled before): its directory, how many executables it holds, their
    /// size and the limit, and the eager device's op plans kept beside them; `--stats` what it
    /// did; `--clear` empties it. TPUC_CACHE_MODE=require
    /// makes a miss an error (a deployment that must never compile), TPUC_CACHE_DUMP_MISSES=DIR
    /// writes the module of each miss there, TPUC_CACHE_SHARED=DIR[:DIR...] reads caches filled
    /// elsewhere (never writing them).
    Cache {
        /// The cache's directory, or `off`.
        /// [default: $TPUC_CACHE_DIR, else $XDG_CACHE_HOME/tpuc or ~/.cache/tpuc]
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<String>,
        /// What the cache did, from its record: requests, hits, misses by reason (new graph,
        /// entry gone, or which part of the key changed: plugin, XLA flags, host CPU, options,
        /// the module or its sizes) and the seconds spent compiling.
        #[arg(long, conflicts_with = "clear")]
        stats: bool,
        /// Remove every compiled executable (and the record, and the eager device's op plans)
        /// from it.
        #[arg(long)]
        clear: bool,
    },
    /// Examine a program before running it: which ops do not lower (with their source lines),
    /// its symbolic sizes and the buckets they compile for, each device's memory (XLA's figures
    /// from compiling without running), the collectives a plan makes and where they come from,
    /// and what it computes (FLOPs and bytes); with --target, the same projected onto an
    /// accelerator, from one chip to thousands. Nothing runs on a device.
    ///
    /// Exit status: 0 when the program lowers and fits, 1 when something does not (with
    /// --strict also when it compiles per size instead of per bucket), 2 when the program or
    /// the plugin cannot be read. docs/doctor.md describes the report and its --json schema.
    Doctor {
        /// The program: a .pt2 archive from torch.export.save, or a .fx file.
        model: PathBuf,
        #[command(flatten)]
        execution: ExecutionArgs,
        /// Each device's memory (e.g. 16GiB, 512MiB, or bytes): a device needing more makes
        /// the exit status 1. Without it, the plugin's own limit where it reports one (GPU and
        /// TPU plugins; not XLA's CPU plugin).
        #[arg(long, value_name = "SIZE", value_parser = parse_byte_size)]
        device_memory: Option<u64>,
        /// The report as JSON (docs/doctor.md) on standard output instead of text.
        #[arg(long)]
        json: bool,
        /// Also write the report as one self-contained HTML page (memory as a stacked bar, the
        /// collectives along the program, the op histogram), viewable without a server.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Also fail (exit status 1) when a program with symbolic sizes compiles per size
        /// instead of per bucket.
        #[arg(long)]
        strict: bool,
        /// Project the program onto an accelerator it has not run on (v5e, v6e, v7x, h100x8):
        /// each chip's memory, a roofline step time (compute, memory traffic, each
        /// collective), its model FLOP utilisation, and dp and fsdp from one chip to 16384.
        /// Estimates from public peak figures (docs/doctor.md); the examined program not
        /// fitting a chip makes the exit status 1.
        #[arg(long, value_name = "NAME", value_parser = parse_target)]
        target: Option<&'static tpuc_driver::doctor::Accelerator>,
    },
    /// List the PJRT plugins found on this machine: path, API version, platform, StableHLO
    /// versions and devices.
    Plugins {
        /// Show only this plugin (a name: cpu, tpu, cuda; or a path).
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Compile a model and run it on a PJRT plugin; writes out0.npy, out1.npy, ... (one per user
    /// output) to the output directory.
    ///
    /// MODEL is a .pt2 / .fx program (compiled on the fly, weights from the archive), or a module
    /// from `tpuc compile --weights args` together with `--weights ARCHIVE`, the archive it was
    /// compiled from. Inputs are .npy files in the order of the program's inputs; a .npz file
    /// (np.savez(f, *arrays)) supplies several. numpy has no bfloat16: give float32 for a
    /// bfloat16 input; bfloat16 outputs are written as float32.
    Run {
        /// The model: .pt2, .fx, or a compiled module (then --weights is needed).
        model: PathBuf,
        /// An input array (.npy), or several (.npz); repeat for each input, in order.
        #[arg(short, long = "input", value_name = "FILE")]
        inputs: Vec<PathBuf>,
        /// Directory for the outputs (created if missing).
        #[arg(short, long, value_name = "DIR")]
        out: PathBuf,
        /// The archive a compiled module was compiled from (weights and signature).
        #[arg(long, value_name = "ARCHIVE")]
        weights: Option<PathBuf>,
        #[command(flatten)]
        execution: ExecutionArgs,
        /// Compute everything on every run, instead of computing what the weights alone
        /// determine (convolution kernels relaid out for the plugin, batch norm scales) once.
        #[arg(long)]
        no_hoist: bool,
        /// Seed of the model's random ops (rand, dropout, ...): the same seed gives the same
        /// numbers (see docs/random.md).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Reference outputs (.npz, e.g. torch eager results) to compare with; exit status 1
        /// when an output is outside the tolerance.
        #[arg(long, value_name = "NPZ")]
        expect: Option<PathBuf>,
        /// Where compiled executables are kept, so that a model compiled once is loaded
        /// afterwards instead of compiled; `off` for no cache. Kept under $TPUC_CACHE_MAX_MB
        /// megabytes (default 1024), least recently used first.
        /// [default: $TPUC_CACHE_DIR, else $XDG_CACHE_HOME/tpuc or ~/.cache/tpuc]
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<String>,
        /// Run the model this many more times after the first and report the median and
        /// fastest of those runs (the steady state: inputs uploaded and outputs read back
        /// each time).
        #[arg(long, value_name = "N", default_value_t = 0)]
        repeat: usize,
        /// Relative tolerance of --expect.
        #[arg(long, default_value_t = 1e-5)]
        rtol: f64,
        /// Absolute tolerance of --expect.
        #[arg(long, default_value_t = 1e-5)]
        atol: f64,
    },
}

/// `--target`: an accelerator of `tpuc_driver::doctor::ACCELERATORS`, by name or alias.
fn parse_target(
    name: &str,
) -> std::result::Result<&'static tpuc_driver::doctor::Accelerator, String> {
    tpuc_driver::doctor::Accelerator::named(name).map_err(|e| e.to_string())
}

/// How a program runs, for `tpuc run` and `tpuc doctor` alike: on which plugin and devices,
/// laid out how, lowered how, at which sizes.
#[derive(clap::Args)]
struct ExecutionArgs {
    /// PJRT plugin: cpu, tpu, cuda, or a path to a plugin library.
    /// [default: $TPUC_PJRT_PLUGIN, else cpu]
    #[arg(long)]
    plugin: Option<String>,
    /// Run data-parallel on this many devices (inputs split along their first dimension); the
    /// same as --mesh dp=N --plan dp.
    #[arg(long, default_value_t = 1)]
    devices: usize,
    #[command(flatten)]
    layout: LayoutArgs,
    /// Precision of f32 matmuls and convolutions.
    #[arg(long, value_parser = precision_parser(), default_value = "highest")]
    matmul_precision: Precision,
    /// Named patterns as stablehlo.composite ops (`tpuc compile --emit ir` shows them).
    #[arg(long, value_parser = fusion_parser(), default_value = Fusion::RECOMMENDED.name())]
    fusion: Fusion,
    /// The size of a symbol of a program exported with dynamic shapes, e.g. --size s0=8
    /// (repeatable). Symbols not set take their sizes from the inputs' shapes where there are
    /// inputs, else the sizes the program was exported with.
    #[arg(long = "size", value_name = "SYMBOL=SIZE", value_delimiter = ',')]
    sizes: Vec<String>,
    /// How a program exported with dynamic shapes is compiled: for each size's bucket, the
    /// inputs padded to it and the results sliced back, so that one executable (in the cache)
    /// serves every size of a bucket: pow2 (powers of two from 16), pow2:MIN, a list of sizes
    /// (64,128,256), or off (for the sizes themselves). See docs/buckets.md.
    #[arg(long, value_name = "POLICY", default_value = "pow2", value_parser = parse_buckets)]
    buckets: BucketPolicy,
}

impl ExecutionArgs {
    /// The driver's options for running as these say (weights as arguments).
    fn run_options(self, search_paths: &[PathBuf]) -> Result<RunOptions> {
        let options = RunOptions {
            sizes: crate::parse_sizes(&self.sizes)?,
            buckets: self.buckets.0,
            plugin: self.plugin,
            devices: self.devices,
            lower: LowerOptions {
                weights: WeightsMode::Args,
                precision: self.matmul_precision,
                fusion: self.fusion,
                ..LowerOptions::default()
            },
            dialect: self.layout.partitioner.into(),
            mesh: self.layout.mesh_and_plan()?,
            search_paths: search_paths.to_vec(),
            ..RunOptions::default()
        };
        if options.mesh.is_some() && self.devices != 1 {
            bail!("--devices N is the same as --mesh dp=N --plan dp: give one or the other");
        }
        Ok(options)
    }
}

/// `--buckets`: a policy, or `off` (None).
#[derive(Clone)]
struct BucketPolicy(Option<Buckets>);

/// `--device-memory`: bytes, or a number with a binary or decimal unit (`16GiB`, `512MB`).
fn parse_byte_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a size such as 16GiB, 512MB or 1000000"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    Ok((number * scale as f64) as u64)
}

fn parse_buckets(text: &str) -> Result<BucketPolicy, String> {
    if text == "off" {
        return Ok(BucketPolicy(None));
    }
    Buckets::parse(text).map(|b| BucketPolicy(Some(b)))
}

/// How `tpuc compile` and `tpuc run` lay a program out over devices.
#[derive(clap::Args)]
struct LayoutArgs {
    /// Partition over a device mesh of named axes, e.g. --mesh fsdp=2,tp=2 (with --plan).
    #[arg(long, value_name = "AXIS=SIZE,...")]
    mesh: Option<String>,
    /// How weights and inputs are laid out over the mesh: dp, fsdp, tp, a comma-separated
    /// combination (each works over the mesh axis of its name), or a JSON plan file
    /// (docs/sharding.md).
    #[arg(long, value_name = "PLAN")]
    plan: Option<String>,
    /// Which of XLA's SPMD partitioners lays the program out over several devices.
    #[arg(long, value_enum, default_value_t = Partitioner::Shardy)]
    partitioner: Partitioner,
}

impl LayoutArgs {
    fn mesh_and_plan(&self) -> Result<Option<(tpuc_driver::Mesh, tpuc_driver::Plan)>> {
        Ok(tpuc_driver::layout::parse(
            self.mesh.as_deref(),
            self.plan.as_deref(),
        )?)
    }
}

fn run(args: Vec<OsString>, search_paths: &[PathBuf]) -> Result<()> {
    match Cli::try_parse_from(args).map_err(Usage)?.command {
        Command::Compile {
            inputs,
            output,
            emit,
            weights,
            matmul_precision,
            fusion,
            stats,
            specialize,
            sizes,
            layout,
        } => {
            let opts = LowerOptions {
                weights: match weights {
                    Weights::Args => WeightsMode::Args,
                    Weights::Inline => WeightsMode::Inline,
                },
                precision: matmul_precision,
                fusion,
                ..LowerOptions::default()
            };
            let sizes = (specialize || !sizes.is_empty())
                .then(|| crate::parse_sizes(&sizes))
                .transpose()?;
            let options = tpuc_driver::Options {
                lower: opts,
                sizes,
                mesh: layout.mesh_and_plan()?,
                dialect: layout.partitioner.into(),
                ..tpuc_driver::Options::default()
            };
            let jobs = compile_jobs(&inputs, &output, emit)?;
            if matches!(emit, Emit::Bytecode) && output.as_os_str() == "-" && is_terminal() {
                bail!("refusing to write bytecode to a terminal; pass -o FILE");
            }
            let mut failed = compile_all(&jobs, &options, emit, stats);
            if jobs.len() == 1 {
                if let Some((_, e)) = failed.pop() {
                    return Err(e);
                }
            }
            if !failed.is_empty() {
                for (input, e) in &failed {
                    let message = format!("{e:#}");
                    let named = input.display().to_string();
                    if message.contains(&named) {
                        eprintln!("error: {message}");
                    } else {
                        eprintln!("error: {named}: {message}");
                    }
                }
                bail!(
                    "{} of {} programs failed to compile",
                    failed.len(),
                    jobs.len()
                );
            }
        }
        Command::Convert {
            input,
            output,
            weights,
        } => {
            let program = tpuc_fx::read_program(&input)?;
            let storage = match weights {
                FxWeights::Inline => tpuc_fx::fxfile::WeightStorage::Inline,
                FxWeights::SideFile => tpuc_fx::fxfile::WeightStorage::SideFile,
            };
            tpuc_fx::fxfile::write_fx(&program, &output, storage)?;
        }
        Command::Ops { lowered } => {
            let supported = tpuc_hlo::lower::supported_ops();
            if lowered {
                for op in supported {
                    say!("{op}")?;
                }
                return Ok(());
            }
            let core = tpuc_hlo::lower::core_aten_coverage();
            let count = |c: tpuc_hlo::lower::Coverage| core.iter().filter(|(_, s)| *s == c).count();
            use tpuc_hlo::lower::Coverage::*;
            say!(
                "# core ATen: {} overloads, {} lowered, {} decomposed, {} not supported",
                core.len(),
                count(Lowered),
                count(Decomposed),
                count(NotSupported)
            )?;
            for (op, coverage) in &core {
                say!("{:<14}{op}", coverage.name())?;
            }
            say!("# other overloads tpuc lowers")?;
            for op in supported
                .iter()
                .filter(|op| !core.iter().any(|(c, _)| c == *op))
            {
                say!("{:<14}{op}", "lowered")?;
            }
        }
        Command::Plugins { plugin } => return plugins::list(plugin.as_deref(), search_paths),
        Command::Doctor {
            model,
            execution,
            device_memory,
            json,
            html,
            strict,
            target,
        } => {
            let run = execution.run_options(search_paths)?;
            let options = tpuc_driver::doctor::DoctorOptions {
                run,
                device_memory,
                target,
            };
            let output = crate::doctor::Output { json, html, strict };
            return crate::doctor::doctor(&model, &options, &output);
        }
        Command::Cache {
            cache_dir,
            stats,
            clear,
        } => return show_cache(cache_dir.as_deref(), stats, clear),
        Command::Run {
            model,
            inputs,
            out,
            weights,
            execution,
            no_hoist,
            seed,
            expect,
            repeat,
            rtol,
            atol,
            cache_dir,
        } => {
            let options = RunOptions {
                seed,
                cache_dir,
                hoist_weights: !no_hoist,
                ..execution.run_options(search_paths)?
            };
            let request = RunRequest {
                model,
                weights,
                inputs,
                out,
                expect,
                repeat,
                rtol,
                atol,
            };
            return run_model(&request, &options);
        }
    }
    Ok(())
}

fn show_cache(dir: Option<&str>, stats: bool, clear: bool) -> Result<()> {
    let Some(cache) = CompileCache::configured(dir)? else {
        say!("the cache of compiled executables is off")?;
        return Ok(());
    };
    let shown = cache.dir().display();
    if clear {
        let removed = cache
            .clear()
            .with_context(|| format!("cannot clear the cache in {shown}"))?;
        say!("{shown}: removed {removed} compiled executable(s) and the eager device's op plans")?;
        return Ok(());
    }
    let (count, bytes) = cache
        .usage()
        .with_context(|| format!("cannot read the cache in {shown}"))?;
    let (plans, plan_bytes) = cache
        .device_plans_usage()
        .with_context(|| format!("cannot read the eager device's plans in {shown}"))?;
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    say!(
        "{shown}: {count} compiled executable(s), {:.1} MB of {:.0} MB; {plans} eager device op plan(s), {:.1} MB",
        mb(bytes),
        mb(cache.max_bytes()),
        mb(plan_bytes)
    )?;
    if stats {
        let s = cache.stats();
        say!(
            "requests {}, hits {}, misses {} ({} refused), {:.2} s compiling",
            s.requests,
            s.hits,
            s.misses,
            s.refused,
            s.compile_seconds
        )?;
        for (why, n) in &s.reasons {
            say!("  {n:>6}  {why}")?;
        }
    }
    Ok(())
}

struct RunRequest {
    model: PathBuf,
    weights: Option<PathBuf>,
    inputs: Vec<PathBuf>,
    out: PathBuf,
    expect: Option<PathBuf>,
    repeat: usize,
    rtol: f64,
    atol: f64,
}

fn run_model(request: &RunRequest, options: &RunOptions) -> Result<()> {
    let mut inputs = Vec::new();
    for path in &request.inputs {
        if path.extension().is_some_and(|e| e == "npz") {
            inputs.extend(npy::read_npz(path)?);
        } else {
            inputs.push(npy::read_npy(path)?);
        }
    }
    let expected = match &request.expect {
        Some(path) => Some(npy::read_npz(path)?),
        None => None,
    };
    // The inputs' shapes fix a dynamic-shape program's sizes.
    let options = RunOptions {
        input_dims: Some(inputs.iter().map(|t| t.dims().to_vec()).collect()),
        ..options.clone()
    };
    let (loaded, timings) =
        tpuc_driver::model::open(&request.model, request.weights.as_deref(), &options)?;
    let compiled = loaded.compiled();
    if let Some(why) = &compiled.not_padded {
        eprintln!("note: compiled for these sizes, not per bucket of sizes: {why}");
    }
    let again = (request.repeat > 0).then(|| inputs.clone());
    let start = Instant::now();
    let outputs = crate::run::run(&loaded, inputs)?;
    let elapsed = start.elapsed();
    let mut steady = String::new();
    if let Some(inputs) = again {
        let mut times = Vec::with_capacity(request.repeat);
        for _ in 0..request.repeat {
            let start = Instant::now();
            crate::run::run(&loaded, inputs.clone())?;
            times.push(start.elapsed());
        }
        times.sort();
        steady = format!(
            " (then {} more: median {:.3} ms, fastest {:.3} ms)",
            times.len(),
            ms(times[times.len() / 2]),
            ms(times[0])
        );
    }
    std::fs::create_dir_all(&request.out)
        .with_context(|| format!("cannot create {}", request.out.display()))?;
    let t = &timings;
    let cached = match &t.cache {
        Some(CacheOutcome::Hit) => " (from the cache)".to_string(),
        Some(CacheOutcome::NotStored(why)) => format!(" (not cached: {why})"),
        Some(CacheOutcome::Stored) | None => String::new(),
    };
    let bucket = compiled.padded.as_ref().map_or_else(String::new, |p| {
        format!(" (compiled for the bucket {})", p.describe())
    });
    let memory = compiled.executable.compiled_memory()?;
    let devices = loaded.target().devices().len();
    eprintln!(
        "{}{bucket} on {} device(s): lower {:.1} ms, plugin {:.1} ms, compile {:.1} ms{cached}, weights {:.1} ms ({} per device; the program: {} of arguments, {} of temporaries), run {:.2} ms{steady}",
        request.model.display(),
        devices,
        ms(t.lower),
        ms(t.client),
        ms(t.compile),
        ms(t.weights),
        size(loaded.weight_bytes_per_device()?.into_iter().max().unwrap_or(0)),
        size(memory.arguments),
        size(memory.temporaries),
        ms(elapsed)
    );
    let mut failed = 0;
    for (i, output) in outputs.iter().enumerate() {
        let path = request.out.join(format!("out{i}.npy"));
        npy::write_npy(&path, output)?;
        let mut line = format!(
            "{}  {} {:?}",
            path.display(),
            output.element_type(),
            output.dims()
        );
        if let Some(expected) = &expected {
            match expected.get(i) {
                Some(reference) => {
                    let diff =
                        npy::compare::compare(output, reference, request.rtol, request.atol)?;
                    failed += usize::from(!diff.ok());
                    line += &format!("  {}: {diff}", if diff.ok() { "ok" } else { "MISMATCH" });
                }
                None => {
                    failed += 1;
                    line += "  MISMATCH: no reference output";
                }
            }
        }
        say!("{line}")?;
    }
    if let Some(expected) = &expected {
        if expected.len() != outputs.len() {
            bail!(
                "{} outputs, but {} reference outputs",
                outputs.len(),
                expected.len()
            );
        }
        if failed > 0 {
            bail!(
                "{failed} of {} outputs differ from the reference beyond rtol {} / atol {}",
                outputs.len(),
                request.rtol,
                request.atol
            );
        }
        say!(
            "all {} outputs match the reference (rtol {}, atol {})",
            outputs.len(),
            request.rtol,
            request.atol
        )?;
    }
    Ok(())
}

/// Bytes as B, KiB, MiB, GiB or TiB.
fn size(bytes: usize) -> String {
    tpuc_driver::doctor::human_bytes(bytes as u64)
}

/// Where each input's module goes: `output` itself for one input; with several, `output` is a
/// directory (created if missing) holding one module per input, named for it.
fn compile_jobs(inputs: &[PathBuf], output: &Path, emit: Emit) -> Result<Vec<(PathBuf, PathBuf)>> {
    if let [input] = inputs {
        return Ok(vec![(input.clone(), output.to_path_buf())]);
    }
    if output.as_os_str() == "-" {
        bail!(
            "{} programs need -o DIRECTORY (one module each), not standard output",
            inputs.len()
        );
    }
    if output.is_file() {
        bail!(
            "-o {}: with several programs -o names a directory, and this is a file",
            output.display()
        );
    }
    std::fs::create_dir_all(output).with_context(|| format!("creating {}", output.display()))?;
    let extension = match emit {
        Emit::Text => "mlir",
        Emit::Bytecode => "mlirbc",
        Emit::Ir => "ir",
    };
    let mut taken = std::collections::HashMap::new();
    inputs
        .iter()
        .map(|input| {
            let stem = input.file_stem().unwrap_or(input.as_os_str());
            let module = output.join(stem).with_extension(extension);
            if let Some(other) = taken.insert(module.clone(), input) {
                bail!(
                    "{} and {} would both be written to {}: give programs distinct names",
                    other.display(),
                    input.display(),
                    module.display()
                );
            }
            Ok((input.clone(), module))
        })
        .collect()
}

/// Compiles each (input, output) of `jobs` side by side (rayon's pool, one per core); the inputs
/// that failed, with why.
fn compile_all(
    jobs: &[(PathBuf, PathBuf)],
    options: &tpuc_driver::Options,
    emit: Emit,
    stats: bool,
) -> Vec<(PathBuf, anyhow::Error)> {
    use rayon::prelude::*;
    let format = match emit {
        Emit::Text | Emit::Ir => EmitFormat::Text,
        Emit::Bytecode => EmitFormat::Bytecode,
    };
    let named = jobs.len() > 1;
    jobs.par_iter()
        .filter_map(|(input, output)| {
            compile_one(input, output, options, format, emit, stats, named)
                .err()
                .map(|e| (input.clone(), e))
        })
        .collect()
}

/// Compiles `input` into `output` (`-`: standard output); with `stats`, says how long each stage
/// took (naming the input when `named`).
fn compile_one(
    input: &Path,
    output: &Path,
    options: &tpuc_driver::Options,
    format: EmitFormat,
    emit: Emit,
    stats: bool,
    named: bool,
) -> Result<()> {
    let c = tpuc_driver::emit_file(input, options, format)?;
    let written = match emit {
        Emit::Ir => tpuc_hlo::ir::print(&c.ir).into_bytes(),
        Emit::Text | Emit::Bytecode => c.module.clone(),
    };
    if output.as_os_str() == "-" {
        use std::io::Write;
        std::io::stdout()
            .write_all(&written)
            .context("writing to standard output")?;
    } else {
        std::fs::write(output, &written)
            .with_context(|| format!("writing {}", output.display()))?;
    }
    if stats {
        let t = &c.timings;
        let name = if named {
            format!("{}: ", input.display())
        } else {
            String::new()
        };
        eprintln!(
            "{name}{} nodes -> {} StableHLO ops; read {:.1} ms, lower {:.1} ms, passes {:.1} ms, \
             emit {:.1} ms",
            c.program.graph().nodes.len(),
            c.ir.main.ops().len(),
            ms(t.read),
            ms(t.lower),
            ms(t.passes),
            ms(t.emit)
        );
    }
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal()
}

/// A command line clap refused (or `--help`, `--version`: clap's own "errors").
#[derive(Debug)]
struct Usage(clap::Error);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Usage {}

/// Runs the command line `args` (the program's name first); its exit status. `search_paths`:
/// directories to look for PJRT plugins in before the usual places (a Python interpreter's
/// `sys.path`, where the command runs from a Python package).
pub fn main(args: impl IntoIterator<Item = OsString>, search_paths: &[PathBuf]) -> u8 {
    match run(args.into_iter().collect(), search_paths) {
        Ok(()) => 0,
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => match e.downcast::<Usage>() {
            // Help and version go to stdout with status 0; usage errors to stderr with 2.
            Ok(Usage(usage)) => {
                let _ = usage.print();
                usage.exit_code() as u8
            }
            Err(e) => match e.downcast::<crate::doctor::Verdict>() {
                Ok(verdict) => verdict.exit_status(),
                Err(e) => {
                    eprintln!("error: {e:#}");
                    1
                }
            },
        },
    }
}
