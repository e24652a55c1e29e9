//! `tpuc doctor`: what a program needs and does, found before anything runs. It reads the
//! program, lowers it, and has the plugin compile it without executing it; the report says which
//! ops do not lower (with the user's source line), the program's symbolic sizes and the buckets
//! they compile for, each device's memory as XLA's buffer assignment computed it, the
//! collectives the partitioned program runs (from XLA's optimized program) and what it computes
//! (FLOPs and bytes counted from tpuc's IR, beside XLA's own cost analysis). docs/doctor.md
//! describes the report and its JSON schema.

mod page;
mod projection;
mod targets;
mod text;

pub use page::page;
pub use projection::{project, CollectiveLoad, Projection, Workload};
pub use targets::{Accelerator, ACCELERATORS};
pub use text::{projection_text, text};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tpuc_fx::InputKind;
use tpuc_hlo::LowerError;

use crate::compile::{Hoist, Options};
use crate::error::{Error, Result};
use crate::model::RunOptions;
use crate::source::Source;
use crate::target::Target;

/// The version of the report's JSON layout (docs/doctor.md).
pub const SCHEMA: u32 = 1;

/// The sizes a symbol's range without an end is counted up to.
const UNBOUNDED_LIMIT: i64 = 4096;

/// How to examine a program.
#[derive(Clone, Debug, Default)]
pub struct DoctorOptions {
    /// The plugin, mesh and plan, sizes, buckets and lowering choices, as `tpuc run` takes
    /// them (its cache is not used: the compile is timed).
    pub run: RunOptions,
    /// Each device's memory, in bytes: a device needing more is a problem.
    pub device_memory: Option<u64>,
    /// The accelerator to project the program onto (`--target`).
    pub target: Option<&'static Accelerator>,
}

/// What `tpuc doctor` found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub schema: u32,
    pub program: String,
    pub platform: String,
    pub devices: usize,
    /// The mesh (`dp=2,tp=2`), where the program is laid out over one.
    pub mesh: Option<String>,
    pub plan: Option<String>,
    pub inputs: Vec<TensorReport>,
    pub weights: WeightsReport,
    pub symbols: Vec<SymbolReport>,
    pub coverage: CoverageReport,
    /// What compiling found; None when the program did not lower.
    pub compiled: Option<CompiledReport>,
    /// What one device's step computes, moves and holds, for projections (`--target`; the
    /// Python report sums its graphs'); None when the program did not lower.
    pub workload: Option<Workload>,
    /// The program projected onto `--target`'s accelerator.
    pub projection: Option<Projection>,
    /// Everything that makes the program fail here, in words (empty: it lowers and fits).
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TensorReport {
    pub name: String,
    pub dtype: String,
    /// Sizes, a symbol's name where one is symbolic.
    pub shape: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct WeightsReport {
    /// Parameters, buffers and constants of the program.
    pub count: usize,
    /// Their bytes, whole (each device holds its part under a plan that shards them).
    pub bytes: u64,
    pub parameters: u64,
    pub buffers: u64,
    pub constants: u64,
    /// The largest parameter's bytes (what fsdp holds gathered at a time).
    pub largest_parameter: u64,
    /// The floating-point type of most of their bytes; None without floating-point weights.
    pub dtype: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SymbolReport {
    pub name: String,
    pub min: i64,
    pub max: Option<i64>,
    /// The size it was exported with.
    pub example: Option<i64>,
    /// The buckets its range compiles for (one executable each): the sizes a call pads to.
    pub buckets: Vec<i64>,
    /// Whether `buckets` stops at `unbounded_limit` because the range has no end.
    pub truncated: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CoverageReport {
    /// Each node no lowering takes, or whose lowering refused its arguments.
    pub failures: Vec<FailureReport>,
    /// Why a program with symbolic sizes compiles per size instead of per bucket.
    pub per_size: Option<String>,
    /// Why the program does not lower, where no node is to blame.
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailureReport {
    pub op: String,
    pub node: String,
    /// The user's source line (`file:line`), where the program recorded one.
    pub source: Option<String>,
    /// Why the node did not lower (empty: no lowering exists for the op).
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompiledReport {
    /// Each device's memory as XLA's buffer assignment computed it (every device runs the same
    /// partitioned program: one row serves all).
    pub memory: MemoryReport,
    pub cost: CostReport,
    pub collectives: Vec<CollectiveReport>,
    /// The collectives in the order the program runs them (kind, bytes one device moves).
    pub sequence: Vec<SequenceItem>,
    /// How many of each op the module holds after tpuc's passes (its main function; a
    /// composite by its pattern's name).
    pub ops: BTreeMap<String, usize>,
    pub lower_seconds: f64,
    pub compile_seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    /// Weights, inputs and the seed as one device receives them.
    pub arguments: u64,
    pub outputs: u64,
    /// Of the outputs, those written in place of donated arguments.
    pub aliased: u64,
    pub temporaries: u64,
    pub code: u64,
    /// arguments + outputs - aliased + temporaries.
    pub total: u64,
    /// Each device's memory: `--device-memory`, else the plugin's limit where it reports one.
    pub capacity: Option<u64>,
    /// Whether `capacity` is the plugin's figure.
    pub capacity_from_plugin: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct CostReport {
    /// Counted from tpuc's IR (whole program, every device together): floating-point
    /// operations, transcendental functions, bytes read and written if nothing were fused.
    pub flops: f64,
    pub transcendentals: f64,
    pub bytes: f64,
    /// Loops whose body was counted once.
    pub loops: usize,
    /// Of `flops`, those of products (dot_general and convolution).
    pub product_flops: f64,
    /// The FLOPs of the products in XLA's optimized program of one device (the check of
    /// `product_flops`: equal on one device, its share under a plan that splits them).
    pub xla_product_flops: f64,
    /// The bytes the ops of XLA's optimized program of one device read and write, fusions at
    /// their boundary.
    pub xla_bytes: f64,
    /// XLA's cost analysis of one device's compiled program, by its names (`flops`, `bytes
    /// accessed`, ...); empty where the plugin does not implement it (XLA's CPU plugin).
    pub xla: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CollectiveReport {
    pub kind: String,
    /// How many the program runs (one device's program; inside loops counted once).
    pub count: usize,
    /// What one device moves through them, in bytes.
    pub bytes: u64,
    /// Of `count`, those inside a loop or another called computation.
    pub nested: usize,
    /// Where they come from: the op (its location name) and source line, with counts.
    pub sites: Vec<SiteReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SequenceItem {
    pub kind: String,
    pub bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteReport {
    /// What it moves or serves: `weight NAME` / `input NAME` where it moves one of the
    /// program's arguments (a weight gathered under a plan that shards it), else the op it
    /// was made for (`aten.linear.default (node linear_3)`), else XLA's name for it.
    pub op: String,
    /// The user's source line of that op, where the program recorded one.
    pub source: Option<String>,
    pub count: usize,
}

impl Report {
    /// Whether the program lowers and fits: the exit status's 0.
    pub fn healthy(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Examines `model` (a `.pt2` or `.fx` program) as `options` say. Errors are what stops the
/// examination itself (an unreadable program, a plugin that does not start); what the program
/// gets wrong is in the report.
pub fn examine(model: &Path, options: &DoctorOptions) -> Result<Report> {
    // Read first: a broken program is named before a plugin starts.
    tpuc_fx::read_program(model)?;
    let devices = match &options.run.mesh {
        Some((mesh, _)) => mesh.devices() as usize,
        None => options.run.devices,
    };
    if devices < 1 {
        return Err(Error::Invalid(
            "a program runs on at least one device".into(),
        ));
    }
    let target = Arc::new(Target::open(
        options.run.plugin.as_deref(),
        devices,
        &options.run.search_paths,
    )?);
    let mut report = examine_source(
        &target,
        Source::File(model),
        options.run.compile_options(),
        options.device_memory,
    )?;
    if let (Some(chip), Some(workload)) = (options.target, &report.workload) {
        let projection = project(workload, chip)?;
        report.problems.extend(projection.problem.clone());
        report.projection = Some(projection);
    }
    Ok(report)
}

/// What one device's step computes, moves and holds, read off the examination: the products'
/// type is that of most of the weights' bytes (else of the first floating-point input); the
/// activations are the device's memory less its weights.
fn workload_of(
    report: &Report,
    memory: &MemoryReport,
    cost: &CostReport,
    collectives: &[CollectiveReport],
    precision: tpuc_hlo::ir::Precision,
) -> Workload {
    let devices = report.devices.max(1);
    let dtype = report
        .weights
        .dtype
        .clone()
        .or_else(|| {
            report
                .inputs
                .iter()
                .find(|i| tpuc_hlo::DType::from_name(&i.dtype).is_some_and(|d| d.is_float()))
                .map(|i| i.dtype.clone())
        })
        .unwrap_or_else(|| "float32".into());
    let weights = report.weights.bytes;
    Workload {
        product_flops: cost.product_flops / devices as f64,
        flops: cost.flops / devices as f64,
        bytes: cost.xla_bytes,
        dtype,
        precision: precision.name().into(),
        parameters: report.weights.parameters,
        gradients: 0,
        optimizer_state: 0,
        replicated: report.weights.buffers + report.weights.constants,
        largest_parameter: report.weights.largest_parameter,
        activations: memory.total.saturating_sub(memory.arguments.min(weights)),
        devices,
        device_memory: memory.total,
        collectives: collectives
            .iter()
            .map(|c| CollectiveLoad {
                kind: c.kind.clone(),
                bytes: c.bytes,
            })
            .collect(),
    }
}

/// Examines the program of `source` compiled for `target` as `compile_options` say (the cache
/// and hoisting off, so that the compile is timed and the program is one executable), each
/// device holding `device_memory` bytes where given. The torch.compile backend's graphs come
/// here too (`Runtime.examine`).
pub fn examine_source(
    target: &Arc<Target>,
    source: Source,
    mut compile_options: Options,
    device_memory: Option<u64>,
) -> Result<Report> {
    let program = source.read()?;
    let graph = program.graph();
    let symbols = symbols_of(&program, compile_options.buckets.as_ref())?;
    let mut report = Report {
        schema: SCHEMA,
        program: source.name(),
        platform: target.platform()?,
        devices: target.devices().len(),
        mesh: compile_options.mesh.as_ref().map(|(m, _)| m.to_string()),
        plan: compile_options
            .mesh
            .as_ref()
            .map(|(_, p)| p.to_string())
            .filter(|p| !p.is_empty()),
        inputs: inputs_of(graph),
        weights: weights_of(&program),
        symbols,
        coverage: CoverageReport::default(),
        compiled: None,
        workload: None,
        projection: None,
        problems: Vec::new(),
    };
    compile_options.hoist = Hoist::Off;
    compile_options.cache_dir = Some("off".into());
    if report.symbols.is_empty() {
        compile_options.buckets = None;
    }
    let start = Instant::now();
    let compiled = match target.compile(source, &compile_options) {
        Ok((compiled, _)) => compiled,
        Err(Error::Lower { source, .. }) => {
            report.coverage.failures = match *source {
                LowerError::ValueDecided(_) => value_decided(&program)?,
                _ => failures_of(&source),
            };
            if report.coverage.failures.is_empty() {
                report.coverage.error = Some(source.to_string());
                report.problems.push(source.to_string());
            } else {
                report.problems.push(format!(
                    "{} node(s) do not lower: {}",
                    report.coverage.failures.len(),
                    distinct_ops(&report.coverage.failures)
                ));
            }
            return Ok(report);
        }
        Err(e) => return Err(e),
    };
    let total = start.elapsed();
    report.coverage.per_size = compiled.not_padded.clone();
    if report.coverage.per_size.is_some() {
        // Buckets do not apply: every size in a symbol's range is an executable of its own.
        report.symbols = symbols_of(&program, None)?;
    }
    let executable = &compiled.executable;
    let memory = executable.compiled_memory()?;
    // Without a given capacity, the plugin's own limit where its allocator reports one.
    let plugin_limit = target.devices().first().and_then(|d| d.memory_limit());
    let bytes = |n: usize| n as u64;
    let memory = MemoryReport {
        arguments: bytes(memory.arguments),
        outputs: bytes(memory.outputs),
        aliased: bytes(memory.aliased),
        temporaries: bytes(memory.temporaries),
        code: bytes(memory.code),
        total: bytes(memory.arguments + memory.outputs + memory.temporaries)
            .saturating_sub(bytes(memory.aliased)),
        capacity: device_memory.or(plugin_limit),
        capacity_from_plugin: device_memory.is_none() && plugin_limit.is_some(),
    };
    if let Some(capacity) = memory.capacity {
        if memory.total > capacity {
            report.problems.push(format!(
                "each device needs {} but has {}{}",
                human_bytes(memory.total),
                human_bytes(capacity),
                if memory.capacity_from_plugin {
                    " (the plugin's limit)"
                } else {
                    ""
                }
            ));
        }
    }
    let ir_cost = tpuc_hlo::cost::count(&compiled.ir);
    let optimized = tpuc_pjrt::hlo::read(&executable.optimized_program()?)?;
    let cost = CostReport {
        flops: ir_cost.flops,
        transcendentals: ir_cost.transcendentals,
        bytes: ir_cost.bytes,
        loops: ir_cost.loops,
        product_flops: ir_cost.product_flops,
        xla_product_flops: optimized.product_flops,
        xla_bytes: optimized.bytes_accessed,
        xla: executable
            .cost_analysis()?
            .unwrap_or_default()
            .into_iter()
            .collect(),
    };
    let collectives = collectives_of(&optimized.collectives, &compiled);
    let sequence = optimized
        .collectives
        .iter()
        .map(|c| SequenceItem {
            kind: c.kind.to_string(),
            bytes: c.bytes,
        })
        .collect();
    report.workload = Some(workload_of(
        &report,
        &memory,
        &cost,
        &collectives,
        compile_options.lower.precision,
    ));
    let t = &compiled.timings;
    report.compiled = Some(CompiledReport {
        memory,
        cost,
        collectives,
        sequence,
        ops: op_counts(&compiled.ir),
        lower_seconds: (t.read + t.lower + t.passes + t.emit).as_secs_f64(),
        compile_seconds: t.compile.as_secs_f64().min(total.as_secs_f64()),
    });
    Ok(report)
}

/// How many of each op `module`'s main function holds (a composite by its pattern's name).
fn op_counts(module: &tpuc_hlo::ir::Module) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for op in module.main.ops() {
        let name = match op.kind().composite() {
            Some((pattern, _, _)) => pattern.to_string(),
            None => op.kind().name().to_string(),
        };
        *counts.entry(name).or_default() += 1;
    }
    counts
}

fn inputs_of(graph: &tpuc_fx::Graph) -> Vec<TensorReport> {
    graph
        .inputs
        .iter()
        .filter(|i| matches!(i.kind, InputKind::UserInput))
        .filter_map(|i| {
            let meta = graph.tensor(&i.name)?;
            Some(TensorReport {
                name: i.name.clone(),
                dtype: meta.dtype.name().to_string(),
                shape: meta.sizes.iter().map(dim_text).collect(),
            })
        })
        .collect()
}

fn dim_text(d: &tpuc_fx::Dim) -> String {
    match d {
        tpuc_fx::Dim::Static(n) => n.to_string(),
        tpuc_fx::Dim::Symbolic { expr, .. } => tpuc_fx::symbolic::pretty(expr),
    }
}

fn weights_of(program: &tpuc_fx::Program) -> WeightsReport {
    let mut report = WeightsReport {
        count: 0,
        bytes: 0,
        parameters: 0,
        buffers: 0,
        constants: 0,
        largest_parameter: 0,
        dtype: None,
    };
    let mut by_dtype: BTreeMap<&'static str, u64> = BTreeMap::new();
    for input in &program.graph().inputs {
        let Some(weight) = program.weight_for(input) else {
            continue;
        };
        let n: i64 = weight.sizes.iter().product();
        let bytes = n.max(0) as u64 * weight.dtype.byte_size() as u64;
        report.count += 1;
        report.bytes += bytes;
        if weight.dtype.is_float() {
            *by_dtype.entry(weight.dtype.name()).or_default() += bytes;
        }
        match input.kind {
            InputKind::Parameter { .. } => {
                report.parameters += bytes;
                report.largest_parameter = report.largest_parameter.max(bytes);
            }
            InputKind::Buffer { .. } => report.buffers += bytes,
            _ => report.constants += bytes,
        }
    }
    report.dtype = by_dtype
        .into_iter()
        .max_by_key(|(_, bytes)| *bytes)
        .map(|(name, _)| name.to_string());
    report
}

/// Each symbol the inputs' sizes mention, with its range and the buckets the range compiles
/// for under the run's policy (every size its own executable when buckets are off). Symbols
/// tensor values decide are coverage failures instead ([`value_decided`]).
fn symbols_of(
    program: &tpuc_fx::Program,
    policy: Option<&tpuc_fx::buckets::Buckets>,
) -> Result<Vec<SymbolReport>> {
    let limit = UNBOUNDED_LIMIT;
    let decided: Vec<String> = tpuc_fx::symbolic::value_decided(program)
        .map_err(Error::Invalid)?
        .into_iter()
        .map(|v| v.symbol)
        .collect();
    let symbols = tpuc_fx::symbolic::symbols(program).map_err(Error::Invalid)?;
    Ok(symbols
        .into_iter()
        .filter(|s| !decided.contains(&s.name))
        .map(|symbol| {
            let (min, max) = symbol.range.map_or((1, None), |r| (r.min, r.max));
            let end = max.unwrap_or(limit.max(min));
            let mut buckets = Vec::new();
            let mut size = min.max(1);
            while size <= end && buckets.len() < 4096 {
                let bucket = match policy {
                    Some(policy) => policy.bucket(size).min(max.unwrap_or(i64::MAX)),
                    None => size,
                };
                buckets.push(bucket);
                size = bucket.max(size) + 1;
            }
            SymbolReport {
                name: symbol.name,
                min,
                max,
                example: symbol.example,
                truncated: max.is_none() || size <= end,
                buckets,
            }
        })
        .collect())
}

/// The sizes tensor values decide when the program runs, as coverage failures: the node that
/// makes each.
fn value_decided(program: &tpuc_fx::Program) -> Result<Vec<FailureReport>> {
    Ok(tpuc_fx::symbolic::value_decided(program)
        .map_err(Error::Invalid)?
        .into_iter()
        .map(|v| FailureReport {
            op: v.target,
            node: v.node,
            source: v.source.map(|s| s.to_string()),
            reason: format!(
                "tensor values decide the size {} when the program runs; tpuc compiles static \
                 sizes (torch.compile(backend=\"tpuc\") runs such ops in eager torch)",
                v.symbol
            ),
        })
        .collect())
}

fn failures_of(error: &LowerError) -> Vec<FailureReport> {
    match error {
        LowerError::Unsupported(list) => list
            .iter()
            .map(|u| FailureReport {
                op: u.target.clone(),
                node: u.node.clone(),
                source: u.source.as_ref().map(ToString::to_string),
                reason: String::new(),
            })
            .collect(),
        LowerError::Node {
            node,
            target,
            location,
            message,
        } => vec![FailureReport {
            op: target.clone(),
            node: node.clone(),
            source: location.as_ref().map(ToString::to_string),
            reason: message.clone(),
        }],
        _ => Vec::new(),
    }
}

fn distinct_ops(failures: &[FailureReport]) -> String {
    let mut ops: Vec<&str> = failures.iter().map(|f| f.op.as_str()).collect();
    ops.sort_unstable();
    ops.dedup();
    ops.join(", ")
}

/// The optimized program's collectives grouped by kind, their sites named after the program's
/// arguments and nodes.
fn collectives_of(
    found: &[tpuc_pjrt::hlo::Collective],
    compiled: &crate::compile::Compiled,
) -> Vec<CollectiveReport> {
    let nodes: std::collections::HashMap<&str, &tpuc_fx::Node> = compiled
        .program
        .graph()
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n))
        .collect();
    let site_of = |c: &tpuc_pjrt::hlo::Collective| -> (String, Option<String>) {
        let argument = c
            .parameter
            .and_then(|p| compiled.signature.args.get(usize::try_from(p).ok()?));
        match argument {
            Some(tpuc_hlo::ArgRole::Weight(name)) => return (format!("weight {name}"), None),
            Some(tpuc_hlo::ArgRole::UserInput(name)) => return (format!("input {name}"), None),
            _ => {}
        }
        // XLA names an op after its location: a node's name, or several joined by ':' (in
        // parentheses where fused).
        let node = c
            .op_name
            .split(|ch: char| !(ch.is_alphanumeric() || ch == '_' || ch == '.'))
            .find_map(|part| nodes.get(part));
        match node {
            Some(n) => (
                format!("{} (node {})", n.target, n.name),
                n.source().map(|s| s.to_string()),
            ),
            None => (
                c.op_name.clone(),
                c.source
                    .as_ref()
                    .map(|(file, line)| format!("{file}:{line}")),
            ),
        }
    };
    let mut reports = Vec::new();
    for kind in tpuc_pjrt::hlo::COLLECTIVE_KINDS {
        let of_kind: Vec<_> = found.iter().filter(|c| c.kind == kind).collect();
        if of_kind.is_empty() {
            continue;
        }
        let mut sites: BTreeMap<(String, Option<String>), usize> = BTreeMap::new();
        for c in &of_kind {
            *sites.entry(site_of(c)).or_default() += 1;
        }
        reports.push(CollectiveReport {
            kind: kind.to_string(),
            count: of_kind.len(),
            bytes: of_kind.iter().filter_map(|c| c.bytes).sum(),
            nested: of_kind.iter().filter(|c| c.nested).count(),
            sites: sites
                .into_iter()
                .map(|((op, source), count)| SiteReport { op, source, count })
                .collect(),
        });
    }
    reports
}

/// Bytes in binary units, as the report prints them (`1.5 GiB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
