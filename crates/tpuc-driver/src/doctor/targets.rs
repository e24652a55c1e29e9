//! The accelerators `tpuc doctor --target` projects a program onto, from their public
//! specifications (docs/doctor.md cites each). Figures are peaks: what a chip can do at best,
//! not what a program gets.

use tpuc_hlo::ir::Precision;
use tpuc_hlo::DType;

use crate::error::{Error, Result};

const GIB: u64 = 1 << 30;

/// One accelerator chip and the machines it is built into.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Accelerator {
    /// The name `--target` takes.
    pub name: &'static str,
    pub description: &'static str,
    /// Peak FLOP/s of products in bf16 or f16 (the matrix units, dense).
    pub peak_16bit: f64,
    /// Peak of products in 8-bit types (fp8 or int8).
    pub peak_8bit: f64,
    /// Peak of f32 products at each matmul precision: highest (full f32: six bf16 passes on a
    /// TPU, the CUDA cores on a GPU), high (three bf16 passes, TF32), default (one bf16 pass,
    /// TF32).
    pub peak_f32: [f64; 3],
    /// Memory per chip, bytes.
    pub memory: u64,
    /// Memory bandwidth per chip, bytes per second.
    pub memory_bandwidth: f64,
    /// The interconnect among the chips of one domain (a TPU pod's ICI, a node's NVLink).
    pub link: Link,
    /// The network between domains (the data-centre network, InfiniBand).
    pub network: Link,
    /// The public specification the figures come from.
    pub source: &'static str,
}

/// An interconnect as one chip sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub name: &'static str,
    /// Bytes per second one chip sends (one direction: half the bidirectional figure).
    pub bandwidth: f64,
    /// How many chips it joins (for the network: the most the scaling table goes to).
    pub chips: usize,
    /// Its topology, in words.
    pub topology: &'static str,
}

/// Every accelerator `--target` knows.
pub const ACCELERATORS: [Accelerator; 4] = [
    Accelerator {
        name: "v5e",
        description: "Cloud TPU v5e (pods of 256 chips, 16 GiB each)",
        peak_16bit: 197e12,
        peak_8bit: 393e12,
        peak_f32: [197e12 / 6.0, 197e12 / 3.0, 197e12],
        memory: 16 * GIB,
        memory_bandwidth: 819e9,
        link: Link {
            name: "ICI",
            bandwidth: 200e9,
            chips: 256,
            topology: "2D torus",
        },
        // 6.4 Tbit/s of data-centre network per 256-chip pod.
        network: Link {
            name: "DCN",
            bandwidth: 3.125e9,
            chips: 16384,
            topology: "data-centre network between pods",
        },
        source: "https://cloud.google.com/tpu/docs/v5e",
    },
    Accelerator {
        name: "v6e",
        description: "Cloud TPU v6e, Trillium (pods of 256 chips, 32 GiB each)",
        peak_16bit: 918e12,
        peak_8bit: 1836e12,
        peak_f32: [918e12 / 6.0, 918e12 / 3.0, 918e12],
        memory: 32 * GIB,
        memory_bandwidth: 1640e9,
        link: Link {
            name: "ICI",
            bandwidth: 400e9,
            chips: 256,
            topology: "2D torus",
        },
        network: Link {
            name: "DCN",
            bandwidth: 12.5e9,
            chips: 16384,
            topology: "data-centre network between pods",
        },
        source: "https://cloud.google.com/tpu/docs/v6e",
    },
    Accelerator {
        name: "v7x",
        description: "Cloud TPU7x, Ironwood (pods of 9216 chips, 192 GiB each)",
        peak_16bit: 2307e12,
        peak_8bit: 4614e12,
        peak_f32: [2307e12 / 6.0, 2307e12 / 3.0, 2307e12],
        memory: 192 * GIB,
        memory_bandwidth: 7380e9,
        link: Link {
            name: "ICI",
            bandwidth: 600e9,
            chips: 9216,
            topology: "3D torus",
        },
        network: Link {
            name: "DCN",
            bandwidth: 12.5e9,
            chips: 16384,
            topology: "data-centre network between pods",
        },
        source: "https://cloud.google.com/tpu/docs/tpu7x",
    },
    Accelerator {
        name: "h100x8",
        description: "NVIDIA H100 SXM, 8 per node on NVLink (80 GB each), nodes on InfiniBand",
        peak_16bit: 989e12,
        peak_8bit: 1979e12,
        peak_f32: [67e12, 494.7e12, 494.7e12],
        memory: 80_000_000_000,
        memory_bandwidth: 3.35e12,
        link: Link {
            name: "NVLink",
            bandwidth: 450e9,
            chips: 8,
            topology: "NVSwitch, all to all within a node",
        },
        // One 400 Gbit/s InfiniBand port per GPU.
        network: Link {
            name: "InfiniBand",
            bandwidth: 50e9,
            chips: 16384,
            topology: "InfiniBand between nodes",
        },
        source: "https://www.nvidia.com/en-us/data-center/h100/",
    },
];

impl Accelerator {
    /// The accelerator `name` names (`v5e`, `tpu-v6e`, `TPU7x`, `h100x8`, `8xh100`).
    pub fn named(name: &str) -> Result<&'static Accelerator> {
        let wanted = name.trim().to_ascii_lowercase();
        let wanted = wanted
            .strip_prefix("tpu-")
            .or_else(|| wanted.strip_prefix("tpu"))
            .unwrap_or(&wanted);
        let wanted = match wanted {
            "7x" | "ironwood" => "v7x",
            "trillium" => "v6e",
            "8xh100" | "h100" | "dgx-h100" => "h100x8",
            other => other,
        };
        ACCELERATORS
            .iter()
            .find(|a| a.name == wanted)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown target {name:?}: tpuc knows {}",
                    ACCELERATORS
                        .iter()
                        .map(|a| format!("{} ({})", a.name, a.description))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// The peak FLOP/s of products of `dtype` at `precision`.
    pub fn peak(&self, dtype: DType, precision: Precision) -> f64 {
        match dtype {
            DType::F32 | DType::F64 | DType::C64 | DType::C128 => match precision {
                Precision::Highest => self.peak_f32[0],
                Precision::High => self.peak_f32[1],
                Precision::Default => self.peak_f32[2],
            },
            d if d.byte_size() == 1 => self.peak_8bit,
            _ => self.peak_16bit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_found_by_their_names_and_aliases() {
        for name in ["v5e", "TPU-v5e", "tpuv5e"] {
            assert_eq!(Accelerator::named(name).unwrap().name, "v5e");
        }
        assert_eq!(Accelerator::named("TPU7x").unwrap().name, "v7x");
        assert_eq!(Accelerator::named("8xH100").unwrap().name, "h100x8");
        let e = Accelerator::named("v9z").unwrap_err().to_string();
        assert!(
            e.contains("unknown target \"v9z\"") && e.contains("v6e ("),
            "{e}"
        );
    }

    #[test]
    fn the_peak_follows_the_products_type_and_precision() {
        let v6e = Accelerator::named("v6e").unwrap();
        assert_eq!(v6e.peak(DType::BF16, Precision::Highest), 918e12);
        assert_eq!(v6e.peak(DType::F8E4M3FN, Precision::Highest), 1836e12);
        assert_eq!(v6e.peak(DType::F32, Precision::Highest), 918e12 / 6.0);
        assert_eq!(v6e.peak(DType::F32, Precision::Default), 918e12);
        let h100 = Accelerator::named("h100x8").unwrap();
        assert_eq!(h100.peak(DType::F32, Precision::High), 494.7e12);
    }
}
