//! Compile options: always a valid, non-empty CompileOptionsProto (an empty one, or zero
//! replicas or partitions, aborts the CPU plugin's process).
use crate::error::{Error, Result};
use crate::proto;
use prost::Message;

/// How XLA partitions an SPMD program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitioner {
    /// Shardy (`sdy.sharding` annotations); XLA's preferred partitioner.
    Shardy,
    /// GSPMD (`mhlo.sharding` annotations).
    Gspmd,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    pub num_replicas: usize,
    pub num_partitions: usize,
    /// `Some` for SPMD programs, which are partitioned over `num_partitions` devices.
    pub partitioner: Option<Partitioner>,
    /// Device ids, one per partition (replica-major); `None` lets the plugin choose.
    pub device_assignment: Option<Vec<i64>>,
    /// Let the partitioner choose the shardings of results (SPMD only). When false, results
    /// keep the shardings the module gives them.
    pub propagate_to_outputs: bool,
    /// A single-device program that runs on any device of the client
    /// ([`crate::Executable::launch_on`]), not only the one the plugin chose.
    pub portable: bool,
}

impl CompileOptions {
    /// A program for one device.
    pub fn single_device() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            partitioner: None,
            device_assignment: None,
            propagate_to_outputs: false,
            portable: false,
        }
    }

    /// A program for one device that runs on any device of the client.
    pub fn portable() -> Self {
        CompileOptions {
            portable: true,
            ..Self::single_device()
        }
    }

    /// An SPMD program partitioned over `partitions` devices.
    pub fn spmd(partitions: usize, partitioner: Partitioner) -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: partitions,
            partitioner: Some(partitioner),
            device_assignment: None,
            propagate_to_outputs: false,
            portable: false,
        }
    }

    /// A program replicated over `replicas` devices (collectives across replicas).
    pub fn replicated(replicas: usize) -> Self {
        CompileOptions {
            num_replicas: replicas,
            ..Self::single_device()
        }
    }

    /// Number of devices the program runs on.
    pub fn device_count(&self) -> usize {
        self.num_replicas * self.num_partitions
    }

    /// The serialized CompileOptionsProto.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.num_replicas < 1 || self.num_partitions < 1 {
            return Err(Error::Invalid(format!(
                "compile options need at least one replica and one partition, not {} and {}",
                self.num_replicas, self.num_partitions
            )));
        }
        if self.portable && (self.device_count() != 1 || self.device_assignment.is_some()) {
            return Err(Error::Invalid(
                "a portable program runs on one device, which no assignment fixes".into(),
            ));
        }
        let device_assignment = match &self.device_assignment {
            None => None,
            Some(ids) if ids.len() != self.device_count() => {
                return Err(Error::Invalid(format!(
                    "device assignment lists {} devices for {} replicas x {} partitions",
                    ids.len(),
                    self.num_replicas,
                    self.num_partitions
                )))
            }
            Some(ids) => Some(proto::DeviceAssignmentProto {
                replica_count: self.num_replicas as i32,
                computation_count: self.num_partitions as i32,
                computation_devices: (0..self.num_partitions)
                    .map(
                        |partition| proto::device_assignment_proto::ComputationDevice {
                            replica_device_ids: (0..self.num_replicas)
                                .map(|replica| ids[replica * self.num_partitions + partition])
                                .collect(),
                        },
                    )
                    .collect(),
            }),
        };
        let spmd = self.partitioner.is_some();
        let build = proto::ExecutableBuildOptionsProto {
            device_ordinal: -1,
            num_replicas: self.num_replicas as i64,
            num_partitions: self.num_partitions as i64,
            use_spmd_partitioning: spmd,
            device_assignment,
            allow_spmd_sharding_propagation_to_output: if spmd {
                vec![self.propagate_to_outputs]
            } else {
                vec![]
            },
            allow_spmd_sharding_propagation_to_parameters: vec![],
            use_shardy_partitioner: self.partitioner == Some(Partitioner::Shardy),
        };
        Ok(proto::CompileOptionsProto {
            executable_build_options: Some(build),
            compile_portable_executable: self.portable,
        }
        .encode_to_vec())
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self::single_device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_device_options_are_never_empty() {
        let bytes = CompileOptions::single_device().encode().unwrap();
        // executable_build_options { device_ordinal: -1, num_replicas: 1, num_partitions: 1 }
        assert_eq!(bytes[0], 0x1a);
        assert!(bytes.windows(4).any(|w| w == [0x20, 0x01, 0x28, 0x01]));
    }

    #[test]
    fn zero_partitions_are_refused() {
        let options = CompileOptions {
            num_partitions: 0,
            ..CompileOptions::single_device()
        };
        assert!(options
            .encode()
            .unwrap_err()
            .to_string()
            .contains("at least one"));
    }

    #[test]
    fn device_assignment_must_cover_every_device() {
        let mut options = CompileOptions::spmd(4, Partitioner::Gspmd);
        options.device_assignment = Some(vec![0, 1]);
        assert!(options.encode().is_err());
        options.device_assignment = Some(vec![3, 2, 1, 0]);
        assert!(options.encode().is_ok());
    }
}
