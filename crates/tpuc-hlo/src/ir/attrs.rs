//! Attributes of ops, arguments and modules as Rust values. Only the emitter spells them in
//! MLIR; everything else (builders, the verifier, passes, tests) reads these types.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DotDims {
    pub lhs_batch: Vec<i64>,
    pub rhs_batch: Vec<i64>,
    pub lhs_contracting: Vec<i64>,
    pub rhs_contracting: Vec<i64>,
}

/// The precision of float matmuls and convolutions on accelerators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// The backend's default (may use TF32 or bf16 for f32 on accelerators).
    Default,
    /// The backend's choice between DEFAULT and HIGHEST (bf16x3 on TPU, say).
    High,
    /// Full f32 precision, as torch computes on CPU.
    #[default]
    Highest,
}

impl Precision {
    pub const ALL: [Precision; 3] = [Precision::Highest, Precision::High, Precision::Default];

    pub fn mnemonic(self) -> &'static str {
        match self {
            Precision::Default => "DEFAULT",
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        }
    }

    /// What it means, for help texts.
    pub fn description(self) -> &'static str {
        match self {
            Precision::Highest => "Full f32 precision, as torch computes on CPU",
            Precision::High => "The backend's choice between default and highest (bf16x3 on TPU)",
            Precision::Default => {
                "The backend's default (may use TF32 or bf16 for f32 matmuls on accelerators)"
            }
        }
    }

    /// The name users write: `highest`, `high`, `default`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Default => "default",
            Precision::High => "high",
            Precision::Highest => "highest",
        }
    }
}

impl FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Precision, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("matmul precision must be highest, high or default, not {s:?}"))
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a convolution's kernel is laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelLayout {
    /// [O, I/groups, spatial...], torch's layout.
    #[default]
    OutInSpatial,
    /// [spatial..., I/groups, O], the layout XLA:CPU's convolutions read; a kernel given in
    /// torch's layout is transposed to it on every execution.
    SpatialInOut,
}

impl KernelLayout {
    /// The kernel's (output channels, input channels per group, spatial sizes) from its shape.
    pub fn split(self, shape: &[i64]) -> (i64, i64, Vec<i64>) {
        let rank = shape.len();
        match self {
            KernelLayout::OutInSpatial => (shape[0], shape[1], shape[2..].to_vec()),
            KernelLayout::SpatialInOut => {
                (shape[rank - 1], shape[rank - 2], shape[..rank - 2].to_vec())
            }
        }
    }

    /// The permutation that takes a kernel in torch's layout to this one.
    pub fn from_torch(self, rank: usize) -> Vec<i64> {
        let rank = rank as i64;
        match self {
            KernelLayout::OutInSpatial => (0..rank).collect(),
            KernelLayout::SpatialInOut => (2..rank).chain([1, 0]).collect(),
        }
    }
}

/// Convolution with input [N, C, spatial...] and output [N, O, spatial...], as in torch; the
/// kernel in `kernel` layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvAttrs {
    pub strides: Vec<i64>,
    pub padding: Vec<(i64, i64)>,
    pub lhs_dilation: Vec<i64>,
    pub rhs_dilation: Vec<i64>,
    /// feature_group_count: input channels split into groups, each with its own kernels.
    pub groups: i64,
    /// batch_group_count: the input batch split into groups, each producing its share of the
    /// output channels (how a grouped convolution's kernel gradient is computed).
    pub batch_groups: i64,
    pub precision: Precision,
    pub kernel: KernelLayout,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GatherDims {
    pub offset_dims: Vec<i64>,
    pub collapsed_slice_dims: Vec<i64>,
    pub operand_batching_dims: Vec<i64>,
    pub start_indices_batching_dims: Vec<i64>,
    pub start_index_map: Vec<i64>,
    pub index_vector_dim: i64,
    pub slice_sizes: Vec<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScatterDims {
    pub update_window_dims: Vec<i64>,
    pub inserted_window_dims: Vec<i64>,
    pub input_batching_dims: Vec<i64>,
    pub scatter_indices_batching_dims: Vec<i64>,
    pub scatter_dims_to_operand_dims: Vec<i64>,
    pub index_vector_dim: i64,
}

/// One named axis of a device mesh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeshAxis {
    pub name: String,
    pub size: i64,
}

/// Devices arranged in a grid with named axes (`dp=2, tp=2`), numbered row-major.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    pub axes: Vec<MeshAxis>,
}

impl Mesh {
    /// A mesh of one axis.
    pub fn line(name: &str, size: i64) -> Mesh {
        Mesh {
            axes: vec![MeshAxis {
                name: name.into(),
                size,
            }],
        }
    }

    pub fn devices(&self) -> i64 {
        self.axes.iter().map(|a| a.size).product()
    }

    pub fn axis(&self, name: &str) -> Option<(usize, &MeshAxis)> {
        self.axes.iter().enumerate().find(|(_, a)| a.name == name)
    }
}

/// `dp=2,tp=2`: axes in order, each `name=size`.
impl FromStr for Mesh {
    type Err = String;

    fn from_str(s: &str) -> Result<Mesh, String> {
        let mut axes: Vec<MeshAxis> = Vec::new();
        for part in s.split(',').map(str::trim) {
            let parsed = part.split_once('=').and_then(|(name, size)| {
                let name = name.trim();
                let valid =
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                Some((valid.then_some(name)?, size.trim().parse::<i64>().ok()?))
            });
            let Some((name, size)) = parsed else {
                return Err(format!(
                    "mesh axis {part:?}: expected NAME=SIZE (a name of letters, digits and _), \
                     e.g. dp=2,tp=2"
                ));
            };
            if size < 1 {
                return Err(format!(
                    "mesh axis {name} has size {size}; sizes are at least 1"
                ));
            }
            if axes.iter().any(|a| a.name == name) {
                return Err(format!("mesh axis {name} is given twice"));
            }
            axes.push(MeshAxis {
                name: name.into(),
                size,
            });
        }
        Ok(Mesh { axes })
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self
            .axes
            .iter()
            .map(|a| format!("{}={}", a.name, a.size))
            .collect();
        f.write_str(&axes.join(","))
    }
}

/// How a tensor is laid out over the module's mesh: per dimension, the mesh axes it is split
/// over (major first; none: whole on every device). Axes no dimension names replicate it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sharding {
    pub dims: Vec<Vec<String>>,
}

impl Sharding {
    /// Whole on every device, for a tensor of `rank` dimensions.
    pub fn replicated(rank: usize) -> Sharding {
        Sharding {
            dims: vec![Vec::new(); rank],
        }
    }

    /// Dimension `dim` of a tensor of `rank` split over `axis`.
    pub fn split(rank: usize, dim: usize, axis: &str) -> Sharding {
        let mut s = Sharding::replicated(rank);
        s.dims[dim].push(axis.to_string());
        s
    }

    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(Vec::is_empty)
    }
}

/// Which of XLA's partitioners reads a module's shardings; one module never mixes the two.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ShardingDialect {
    /// Shardy (`sdy.mesh`, `sdy.sharding`): XLA's current partitioner.
    #[default]
    Shardy,
    /// GSPMD (`mhlo.sharding` strings), whose propagation XLA deprecates.
    Gspmd,
}

/// The mesh a module's shardings refer to, and the dialect they are written in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeshSharding {
    pub mesh: Mesh,
    pub dialect: ShardingDialect,
}

/// Attributes of a function argument or result beyond its type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArgAttrs {
    /// Its layout over the module's mesh; the module must have one.
    pub sharding: Option<Sharding>,
    /// For an argument: the result that takes its buffer (the caller donates the argument and
    /// the result is written in its place: an update in place). That result has its type.
    pub aliased_result: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meshes_parse_and_refuse_what_is_not_one() {
        let m: Mesh = "fsdp=2, tp=4".parse().unwrap();
        assert_eq!((m.devices(), m.to_string()), (8, "fsdp=2,tp=4".to_string()));
        for (bad, why) in [
            ("dp", "expected NAME=SIZE"),
            ("dp=x", "expected NAME=SIZE"),
            ("d p=2", "expected NAME=SIZE"),
            ("dp=0", "at least 1"),
            ("dp=2,dp=2", "given twice"),
        ] {
            let e = bad.parse::<Mesh>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn precision_is_parsed_by_name() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>(), Ok(p));
        }
        let e = "fast".parse::<Precision>().unwrap_err();
        assert!(
            e.contains("highest, high or default") && e.contains("fast"),
            "{e}"
        );
    }
}
