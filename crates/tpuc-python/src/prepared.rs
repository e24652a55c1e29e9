//! The part of a graph split off by `tpuc_hlo::hoist`: an executable computing, from the
//! graph's stable arguments (a model's weights), values the graph then reads as extra
//! arguments. The Python side decides when to run it (once per set of weight buffers).
use tpuc_pjrt::Executable;

pub(crate) struct Prepared {
    pub(crate) exe: Executable,
    /// Positions, among the graph's own arguments, of the ones the values are computed from.
    pub(crate) args: Vec<usize>,
    /// How many values it computes.
    pub(crate) outputs: usize,
    pub(crate) stablehlo: String,
}
