//! A program's step projected onto an accelerator it has not run on (`tpuc doctor --target`):
//! a roofline estimate from what the examination counted. Each chip's step takes the longest
//! of its products at the chip's peak and its memory traffic at the chip's bandwidth, plus its
//! collectives over the interconnect (not overlapped: `overlapped_seconds` is the bound if
//! they were). Scaling is weak: each added chip runs another copy of the examined step (data
//! parallel: the batch grows with the chips), its model state whole (dp) or split over the
//! chips and gathered as used (fsdp). Estimates, not measurements: docs/doctor.md says what
//! each term leaves out.

use serde::{Deserialize, Serialize};
use tpuc_hlo::ir::Precision;
use tpuc_hlo::DType;

use super::targets::Accelerator;
use crate::error::{Error, Result};

/// What one chip's step computes, moves and holds, as the examination counted it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Workload {
    /// FLOPs of products (matmuls, convolutions), of everything, per chip.
    pub product_flops: f64,
    pub flops: f64,
    /// Bytes read and written per chip as XLA fused the program.
    pub bytes: f64,
    /// The products' element type (`bfloat16`) and matmul precision (`highest`).
    pub dtype: String,
    pub precision: String,
    /// The whole model's parameters, their gradients and the optimizer's state, bytes (zero
    /// gradients: inference).
    pub parameters: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    /// State every chip holds whole under any plan (buffers, constants).
    pub replicated: u64,
    /// The largest parameter: what fsdp holds gathered at a time.
    pub largest_parameter: u64,
    /// What a step holds besides the state (inputs, activations, outputs, temporaries), per
    /// chip.
    pub activations: u64,
    /// The program as examined: its devices, each device's memory and its collectives.
    pub devices: usize,
    pub device_memory: u64,
    pub collectives: Vec<CollectiveLoad>,
}

/// Bytes one device moves through collectives of one kind per step.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CollectiveLoad {
    pub kind: String,
    pub bytes: u64,
}

/// The estimates `--target` adds to the report.
#[derive(Clone, Debug, Serialize)]
pub struct Projection {
    pub target: TargetReport,
    /// The product type and precision the peak is taken at.
    pub dtype: String,
    pub precision: String,
    pub peak_flops: f64,
    /// The program as examined (its devices, plan and collectives) on as many chips.
    pub as_examined: StepEstimate,
    /// dp and fsdp from one chip to thousands.
    pub scaling: Vec<ScalingRow>,
    /// Where a plan stops fitting or scaling, in words.
    pub findings: Vec<String>,
    /// Why the program as examined does not fit the chip; None when it does.
    pub problem: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TargetReport {
    pub name: String,
    pub description: String,
    pub memory: u64,
    pub memory_bandwidth: f64,
    pub link: String,
    pub link_bandwidth: f64,
    pub link_chips: usize,
    pub network: String,
    pub network_bandwidth: f64,
    pub source: String,
}

/// One chip's step on the target.
#[derive(Clone, Debug, Serialize)]
pub struct StepEstimate {
    pub chips: usize,
    /// Bytes each chip holds, and whether that fits its memory.
    pub memory: u64,
    pub fits: bool,
    pub compute_seconds: f64,
    pub memory_seconds: f64,
    pub collectives: Vec<CollectiveTime>,
    /// max(compute, memory) + collectives; with perfect overlap, the largest of the three.
    pub step_seconds: f64,
    pub overlapped_seconds: f64,
    /// Model FLOP utilisation: the products' FLOPs per step over the step at the peak.
    pub mfu: f64,
    /// What bounds the step: `compute`, `memory` or `communication`.
    pub bound: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct CollectiveTime {
    pub kind: String,
    pub bytes: u64,
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScalingRow {
    pub plan: String,
    #[serde(flatten)]
    pub step: StepEstimate,
    /// One chip's step time over this one's: 1 scales perfectly.
    pub efficiency: f64,
    /// Steps of the one-chip program per unit time, relative to one chip.
    pub throughput: f64,
}

/// Chip counts of the scaling table: powers of two up to the network's reach.
fn chip_counts(target: &Accelerator) -> Vec<usize> {
    let mut counts = vec![1];
    while counts[counts.len() - 1] * 2 <= target.network.chips {
        counts.push(counts[counts.len() - 1] * 2);
    }
    counts
}

/// Projects `workload` onto `target`.
pub fn project(workload: &Workload, target: &Accelerator) -> Result<Projection> {
    let dtype = DType::from_name(&workload.dtype)
        .ok_or_else(|| Error::Invalid(format!("unknown product type {:?}", workload.dtype)))?;
    let precision: Precision = workload.precision.parse().map_err(Error::Invalid)?;
    let peak = target.peak(dtype, precision);
    let devices = workload.devices.max(1);
    let as_examined = estimate(
        target,
        peak,
        workload.product_flops,
        workload.bytes,
        workload.device_memory,
        workload
            .collectives
            .iter()
            .map(|c| (c.kind.clone(), c.bytes, devices))
            .collect(),
        devices,
    );
    let mut scaling = Vec::new();
    for plan in ["dp", "fsdp"] {
        let mut first: Option<f64> = None;
        for chips in chip_counts(target) {
            let step = scaled(workload, target, peak, plan, chips);
            let one = *first.get_or_insert(step.step_seconds);
            let efficiency = if step.step_seconds > 0.0 {
                one / step.step_seconds
            } else {
                1.0
            };
            scaling.push(ScalingRow {
                plan: plan.into(),
                throughput: chips as f64 * efficiency,
                efficiency,
                step,
            });
        }
    }
    let findings = findings(&scaling, target);
    let problem = (!as_examined.fits).then(|| {
        format!(
            "on {} each chip would need {} but has {}",
            target.name,
            super::human_bytes(as_examined.memory),
            super::human_bytes(target.memory)
        )
    });
    Ok(Projection {
        target: TargetReport {
            name: target.name.into(),
            description: target.description.into(),
            memory: target.memory,
            memory_bandwidth: target.memory_bandwidth,
            link: target.link.name.into(),
            link_bandwidth: target.link.bandwidth,
            link_chips: target.link.chips,
            network: target.network.name.into(),
            network_bandwidth: target.network.bandwidth,
            source: target.source.into(),
        },
        dtype: dtype.name().into(),
        precision: precision.name().into(),
        peak_flops: peak,
        as_examined,
        scaling,
        findings,
        problem,
    })
}

/// One chip's step under `plan` over `chips` chips, each running the examined step.
fn scaled(
    workload: &Workload,
    target: &Accelerator,
    peak: f64,
    plan: &str,
    chips: usize,
) -> StepEstimate {
    let state = workload.parameters + workload.gradients + workload.optimizer_state;
    let training = workload.gradients > 0;
    let n = chips as u64;
    let (memory, collectives) = match plan {
        "dp" => {
            let gradients = (training && chips > 1)
                .then(|| ("all-reduce".to_string(), workload.gradients, chips));
            (state, gradients.into_iter().collect::<Vec<_>>())
        }
        _ if chips == 1 => (state, Vec::new()),
        _ => {
            // Parameters gathered for the forward (and again for the backward), gradients
            // reduced to each chip's part.
            let mut c = vec![("all-gather".to_string(), workload.parameters, chips)];
            if training {
                c.push(("all-gather".to_string(), workload.parameters, chips));
                c.push(("reduce-scatter".to_string(), workload.gradients, chips));
            }
            (state.div_ceil(n) + workload.largest_parameter, c)
        }
    };
    estimate(
        target,
        peak,
        workload.product_flops,
        workload.bytes,
        memory + workload.replicated + workload.activations,
        collectives,
        chips,
    )
}

fn estimate(
    target: &Accelerator,
    peak: f64,
    product_flops: f64,
    bytes: f64,
    memory: u64,
    collectives: Vec<(String, u64, usize)>,
    chips: usize,
) -> StepEstimate {
    let compute_seconds = product_flops / peak;
    let memory_seconds = bytes / target.memory_bandwidth;
    let mut times: Vec<CollectiveTime> = Vec::new();
    for (kind, bytes, group) in collectives {
        let seconds = collective_seconds(&kind, bytes as f64, group, target);
        match times.iter_mut().find(|t| t.kind == kind) {
            Some(t) => {
                t.bytes += bytes;
                t.seconds += seconds;
            }
            None => times.push(CollectiveTime {
                kind,
                bytes,
                seconds,
            }),
        }
    }
    let communication: f64 = times.iter().map(|t| t.seconds).sum();
    let local = compute_seconds.max(memory_seconds);
    let step_seconds = local + communication;
    let bound = if communication > local {
        "communication"
    } else if compute_seconds >= memory_seconds {
        "compute"
    } else {
        "memory"
    };
    StepEstimate {
        chips,
        memory,
        fits: memory <= target.memory,
        compute_seconds,
        memory_seconds,
        collectives: times,
        step_seconds,
        overlapped_seconds: local.max(communication),
        mfu: if step_seconds > 0.0 {
            product_flops / (step_seconds * peak)
        } else {
            0.0
        },
        bound: bound.into(),
    }
}

/// A collective of `bytes` (its whole gathered or reduced size) among `group` chips, by ring:
/// each chip sends (n-1)/n of it (an all-reduce twice that: a reduce-scatter then an
/// all-gather), over the domain's link within it and, beyond one domain, each chip's 1/k
/// share among the k chips of its domain over the network as well.
pub fn collective_seconds(kind: &str, bytes: f64, group: usize, target: &Accelerator) -> f64 {
    let passes = match kind {
        // Point to point: the bytes once, over the network once the group leaves the domain.
        "collective-permute" | "collective-broadcast" => {
            let link = if group <= target.link.chips {
                &target.link
            } else {
                &target.network
            };
            return bytes / link.bandwidth;
        }
        "all-reduce" => 2.0,
        _ => 1.0,
    };
    let within = group.min(target.link.chips).max(1) as f64;
    let domains = group.div_ceil(target.link.chips).max(1) as f64;
    let ring = |n: f64| (n - 1.0) / n;
    passes * ring(within) * bytes / target.link.bandwidth
        + passes * ring(domains) * (bytes / within) / target.network.bandwidth
}

/// Where each plan stops fitting or scaling.
fn findings(rows: &[ScalingRow], target: &Accelerator) -> Vec<String> {
    let mut found = Vec::new();
    for plan in ["dp", "fsdp"] {
        let of_plan: Vec<&ScalingRow> = rows.iter().filter(|r| r.plan == plan).collect();
        let fitting: Vec<usize> = of_plan
            .iter()
            .filter(|r| r.step.fits)
            .map(|r| r.step.chips)
            .collect();
        match (fitting.first(), plan) {
            (None, _) => found.push(format!(
                "{plan} does not fit a {} chip's {} at any size up to {} chips",
                target.name,
                super::human_bytes(target.memory),
                of_plan.last().map_or(1, |r| r.step.chips)
            )),
            (Some(1), _) => {}
            (Some(&from), _) => found.push(format!("{plan} fits from {from} chips")),
        }
        if let Some(r) = of_plan.iter().find(|r| r.step.fits && r.efficiency < 0.8) {
            let over = if r.step.chips > target.link.chips {
                format!(
                    " (beyond one {}-chip {} domain)",
                    target.link.chips, target.link.name
                )
            } else {
                String::new()
            };
            found.push(format!(
                "{plan} scales below 80% from {} chips{over}: {:.0}% efficiency, {}",
                r.step.chips,
                r.efficiency * 100.0,
                r.step.bound
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Workload {
        Workload {
            product_flops: 2e12,
            flops: 2.1e12,
            bytes: 4e9,
            dtype: "bfloat16".into(),
            precision: "highest".into(),
            parameters: 8 << 30,
            gradients: 8 << 30,
            optimizer_state: 16 << 30,
            replicated: 0,
            largest_parameter: 256 << 20,
            activations: 4 << 30,
            devices: 1,
            device_memory: 36 << 30,
            collectives: vec![],
        }
    }

    #[test]
    fn a_ring_all_reduce_sends_twice_the_bytes_times_n_minus_one_over_n() {
        let v5e = Accelerator::named("v5e").unwrap();
        let t = collective_seconds("all-reduce", 1e9, 4, v5e);
        assert!((t - 2.0 * 0.75 * 1e9 / 200e9).abs() < 1e-12, "{t}");
        // Beyond the pod, each chip's 1/256 crosses the data-centre network too.
        let t = collective_seconds("all-reduce", 1e9, 512, v5e);
        let within = 2.0 * (255.0 / 256.0) * 1e9 / 200e9;
        let across = 2.0 * 0.5 * (1e9 / 256.0) / 3.125e9;
        assert!((t - (within + across)).abs() < 1e-12, "{t}");
        assert_eq!(collective_seconds("all-gather", 1e9, 1, v5e), 0.0);
    }

    #[test]
    fn fsdp_divides_the_state_and_dp_keeps_it_whole() {
        let v6e = Accelerator::named("v6e").unwrap();
        let p = project(&model(), v6e).unwrap();
        let row = |plan: &str, chips: usize| {
            p.scaling
                .iter()
                .find(|r| r.plan == plan && r.step.chips == chips)
                .unwrap()
        };
        // 32 GiB of state and 4 GiB of activations: over a 32 GiB chip, whole or split.
        assert!(!row("dp", 1).step.fits && !row("dp", 1024).step.fits);
        assert_eq!(
            row("fsdp", 8).step.memory,
            (4 << 30) + (256 << 20) + (4 << 30)
        );
        assert!(row("fsdp", 2).step.fits);
        assert!(
            p.findings.iter().any(|f| f == "fsdp fits from 2 chips"),
            "{:?}",
            p.findings
        );
        assert!(
            p.findings.iter().any(|f| f.starts_with("dp does not fit")),
            "{:?}",
            p.findings
        );
        // 36 GiB as examined on one 32 GiB chip.
        assert_eq!(
            p.problem.as_deref(),
            Some("on v6e each chip would need 36.0 GiB but has 32.0 GiB")
        );
        // One chip: 2 TFLOP at 918 TFLOP/s against 4 GB at 1.64 TB/s.
        let one = &row("dp", 1).step;
        assert!((one.compute_seconds - 2e12 / 918e12).abs() < 1e-12);
        assert_eq!(one.bound, "memory");
        assert!((one.mfu - one.compute_seconds / one.step_seconds).abs() < 1e-12);
        // Gradients all-reduced: efficiency falls, and falls again past the pod.
        assert!(row("dp", 2).efficiency < 1.0);
        assert!(row("dp", 512).efficiency < row("dp", 256).efficiency);
        assert!(row("fsdp", 512).step.collectives.len() == 2);
    }

    #[test]
    fn inference_data_parallel_has_no_collectives() {
        let mut w = model();
        w.gradients = 0;
        w.optimizer_state = 0;
        let p = project(&w, Accelerator::named("v7x").unwrap()).unwrap();
        for r in p.scaling.iter().filter(|r| r.plan == "dp") {
            assert!(r.step.collectives.is_empty());
            assert_eq!(r.efficiency, 1.0);
        }
        assert_eq!(p.scaling.last().unwrap().step.chips, 16384);
    }

    #[test]
    fn a_bad_product_type_is_named() {
        let mut w = model();
        w.dtype = "float3".into();
        let e = project(&w, Accelerator::named("v5e").unwrap()).unwrap_err();
        assert!(e.to_string().contains("float3"), "{e}");
    }
}
