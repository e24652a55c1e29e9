//! Results whose layout XLA decides. A plan may leave a result's layout open
//! ([`tpuc_hlo::plan::Plan::open_results`]): XLA's partitioner lays it out as what computes it,
//! and tpuc must know that layout to read the result back. This is the one place that reads it
//! from the plugin and writes it into the module:
//!
//! 1. the module is compiled with the open results propagated to the outputs;
//! 2. each open result's tiling is read from the executable and written into the IR as a sharding
//!    over whole mesh axes;
//! 3. where a tiling is no whole mesh axes per dimension (or the plugin cannot say), that result
//!    is made whole instead and the module is emitted and compiled once more.
//!
//! The module every later step sees (its IR, its text, its executable) is the one that ran.

use tpuc_emit::EmitFormat;
use tpuc_hlo::ir::{verify, Mesh, Module, Sharding};
use tpuc_pjrt::{CompileOptions, Executable, ShardLayout};

use crate::error::{Error, Result};

/// `module` (its emitted text and IR) compiled by `compile` with `options`, its open results'
/// layouts read back into `ir` (see the module's documentation).
pub(crate) fn compile_laid_out(
    module: &mut Vec<u8>,
    ir: &mut Module,
    mesh: Option<&Mesh>,
    options: &CompileOptions,
    mut compile: impl FnMut(&[u8], &CompileOptions) -> Result<Executable>,
) -> Result<Executable> {
    let open = open_results(ir);
    let Some(mesh) = mesh.filter(|_| !open.is_empty()) else {
        return compile(module, options);
    };
    let propagating = CompileOptions {
        propagate_to_outputs: true,
        ..options.clone()
    };
    let executable = compile(module, &propagating)?;
    if read_layouts(&executable, ir, mesh, &open)? {
        return Ok(executable);
    }
    *module = tpuc_emit::emit(ir, EmitFormat::Text)?;
    compile(module, options)
}

/// The results of a module laid out over a mesh that it leaves to XLA's partitioner (no
/// sharding; [`tpuc_hlo::plan::Plan::open_results`]).
fn open_results(module: &Module) -> Vec<usize> {
    if module.sharding.is_none() || module.manual {
        return Vec::new();
    }
    let attrs = module.main.result_attrs();
    (0..attrs.len())
        .filter(|&i| attrs[i].sharding.is_none())
        .collect()
}

/// Writes into `module` the layout XLA's partitioner gave each result at `open` in
/// `executable`, over `mesh`. False when some layout is no whole mesh axes per dimension (or
/// the plugin cannot say): those results are then made whole in `module`.
fn read_layouts(
    executable: &Executable,
    module: &mut Module,
    mesh: &Mesh,
    open: &[usize],
) -> Result<bool> {
    let tilings = executable.output_tilings()?;
    let sizes: Vec<i64> = mesh.axes.iter().map(|a| a.size).collect();
    let result_types = module.main.result_types();
    let mut all_read = true;
    for &i in open {
        let rank = result_types[i].rank();
        let layout = tilings
            .as_ref()
            .and_then(|t| t.get(i))
            .and_then(|tiling| ShardLayout::from_tiling(&sizes, rank, tiling));
        let sharding = match layout {
            Some(layout) => Sharding {
                dims: layout
                    .dims()
                    .iter()
                    .map(|axes| axes.iter().map(|&a| mesh.axes[a].name.clone()).collect())
                    .collect(),
            },
            None => {
                all_read = false;
                Sharding::replicated(rank)
            }
        };
        let mut attrs = module.main.result_attrs()[i].clone();
        attrs.sharding = Some(sharding);
        module.main.set_result_attrs(i, attrs);
    }
    verify(module).map_err(|e| Error::Invalid(format!("the result layouts XLA chose: {e}")))?;
    Ok(all_read)
}
