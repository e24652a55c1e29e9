//! The optimized program XLA compiled ([`crate::Executable::optimized_program`]), read for what
//! it moves between devices (each collective with its kind, bytes and the source it came from)
//! and what its products compute.

use std::collections::HashMap;

use prost::Message;
use tpuc_dtype::DType;

use crate::error::{Error, Result};
use crate::proto::{
    HloComputationProto, HloInstructionProto, HloModuleProto, HloModuleProtoWithConfig, ShapeProto,
};

/// An optimized program as a plugin returns it: `format` says what `bytes` hold (`hlo`: an
/// `HloModuleProto`; `hlo_with_config`: one inside an `HloModuleProtoWithConfig`).
#[derive(Clone, Debug)]
pub struct Serialized {
    pub format: String,
    pub bytes: Vec<u8>,
}

/// The kinds of collectives, by the opcode XLA gives them (an asynchronous pair's start stands
/// for the pair).
pub const COLLECTIVE_KINDS: [&str; 6] = [
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
];

/// One collective of the program (per device).
#[derive(Clone, Debug, PartialEq)]
pub struct Collective {
    /// One of [`COLLECTIVE_KINDS`].
    pub kind: &'static str,
    /// What one device sends or receives: the larger of the collective's operands and its
    /// result (all-gather: the gathered result; reduce-scatter: its whole input); None when a
    /// type has no known size.
    pub bytes: Option<u64>,
    /// Inside a loop or another called computation, not the entry: run as often as that is.
    pub nested: bool,
    /// XLA's name of the op it was made for (the StableHLO op's location name).
    pub op_name: String,
    /// The source line the op carries (file, line), where the program recorded one.
    pub source: Option<(String, i32)>,
    /// The entry computation's parameter the collective moves, where its operand is one (seen
    /// through copies, bitcasts, reshapes, transposes and sharding annotations): a weight
    /// gathered under a plan that shards it, say.
    pub parameter: Option<i64>,
}

/// What tpuc reads of an optimized program.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizedProgram {
    /// Its collectives, in program order.
    pub collectives: Vec<Collective>,
    /// The floating-point operations of its products (`dot` and `convolution`, inside fusions
    /// too; a multiply-add counts two), a loop's body once.
    pub product_flops: f64,
    /// The bytes its ops read and write as XLA compiled them ([`bytes_accessed`]).
    pub bytes_accessed: f64,
}

/// Reads an optimized program.
pub fn read(serialized: &Serialized) -> Result<OptimizedProgram> {
    let broken = |e: prost::DecodeError| {
        Error::Invalid(format!(
            "the plugin's optimized program ({}) does not decode: {e}",
            serialized.format
        ))
    };
    let module = match serialized.format.as_str() {
        "hlo" => HloModuleProto::decode(serialized.bytes.as_slice()).map_err(broken)?,
        "hlo_with_config" => HloModuleProtoWithConfig::decode(serialized.bytes.as_slice())
            .map_err(broken)?
            .hlo_module
            .unwrap_or_default(),
        other => {
            return Err(Error::Invalid(format!(
                "the plugin's optimized program is in a format tpuc does not read: {other}"
            )))
        }
    };
    Ok(OptimizedProgram {
        collectives: collectives(&module),
        product_flops: product_flops(&module),
        bytes_accessed: bytes_accessed(&module),
    })
}

/// The bytes the program's ops read and write: each op of the entry computation (and of those
/// loops, conditionals and calls run, a loop's body once, a conditional's costliest branch)
/// reads its operands and writes its result. A fusion counts as one op at its boundary: what it
/// keeps inside never reaches memory. Ops that only name or regroup buffers move nothing. XLA's
/// own cost analysis counts the same way (it also sees which part of an operand a fusion reads,
/// so it can be lower).
fn bytes_accessed(module: &HloModuleProto) -> f64 {
    let computations: HashMap<i64, &HloComputationProto> =
        module.computations.iter().map(|c| (c.id, c)).collect();
    computation_bytes(&computations, module.entry_computation_id, 0)
}

fn computation_bytes(
    computations: &HashMap<i64, &HloComputationProto>,
    id: i64,
    depth: usize,
) -> f64 {
    const MOVES_NOTHING: [&str; 9] = [
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
    ];
    let Some(computation) = computations.get(&id) else {
        return 0.0;
    };
    if depth > 64 {
        return 0.0;
    }
    let shapes = shapes_of(computation);
    let mut bytes = 0.0;
    for i in &computation.instructions {
        let called = |id: &i64| computation_bytes(computations, *id, depth + 1);
        match i.opcode.as_str() {
            "while" | "call" => bytes += i.called_computation_ids.iter().map(called).sum::<f64>(),
            "conditional" => {
                bytes += i
                    .called_computation_ids
                    .iter()
                    .map(called)
                    .fold(0.0, f64::max)
            }
            op if MOVES_NOTHING.contains(&op) || op.ends_with("-done") => {}
            _ => {
                let operands: u64 = i
                    .operand_ids
                    .iter()
                    .filter_map(|id| all_bytes(shapes.get(id)?))
                    .sum();
                let result = i.shape.as_ref().and_then(all_bytes).unwrap_or(0);
                bytes += (operands + result) as f64;
            }
        }
    }
    bytes
}

/// The bytes of every array in a shape (a tuple's elements summed, those of no known size as
/// none).
fn all_bytes(shape: &ShapeProto) -> Option<u64> {
    if shape.tuple_shapes.is_empty() {
        return array_bytes(shape);
    }
    Some(
        shape
            .tuple_shapes
            .iter()
            .map(|s| all_bytes(s).unwrap_or(0))
            .sum(),
    )
}

fn product_flops(module: &HloModuleProto) -> f64 {
    let mut flops = 0.0;
    for computation in &module.computations {
        let shapes = shapes_of(computation);
        for i in &computation.instructions {
            let outputs: i64 = match i.shape.as_ref() {
                Some(result) => result.dimensions.iter().product(),
                None => continue,
            };
            // Multiply-adds per output element: the contracted length of a product; a
            // convolution's window times its input features per group (the kernel's size over
            // its output features).
            let depth: Option<i64> = match i.opcode.as_str() {
                "dot" => (|| {
                    let lhs = shapes.get(i.operand_ids.first()?)?;
                    let dims = i.dot_dimension_numbers.as_ref()?;
                    Some(
                        dims.lhs_contracting_dimensions
                            .iter()
                            .filter_map(|&d| lhs.dimensions.get(d as usize))
                            .product(),
                    )
                })(),
                "convolution" => (|| {
                    let kernel = shapes.get(i.operand_ids.get(1)?)?;
                    let dims = i.convolution_dimension_numbers.as_ref()?;
                    let out_features = *kernel
                        .dimensions
                        .get(dims.kernel_output_feature_dimension as usize)?;
                    let size: i64 = kernel.dimensions.iter().product();
                    (out_features > 0).then(|| size / out_features)
                })(),
                _ => None,
            };
            if let Some(depth) = depth {
                flops += 2.0 * outputs as f64 * depth as f64;
            }
        }
    }
    flops
}

/// Each instruction's shape, by its id.
fn shapes_of(computation: &HloComputationProto) -> HashMap<i64, &ShapeProto> {
    computation
        .instructions
        .iter()
        .filter_map(|i| Some((i.id, i.shape.as_ref()?)))
        .collect()
}

/// The collectives of a module, in program order.
fn collectives(module: &HloModuleProto) -> Vec<Collective> {
    let mut found = Vec::new();
    for computation in &module.computations {
        let shapes = shapes_of(computation);
        let by_id: HashMap<i64, &HloInstructionProto> =
            computation.instructions.iter().map(|i| (i.id, i)).collect();
        let entry = computation.id == module.entry_computation_id;
        for instruction in &computation.instructions {
            let Some(kind) = kind_of(&instruction.opcode) else {
                continue;
            };
            found.push(Collective {
                kind,
                bytes: moved_bytes(instruction, &shapes),
                nested: computation.id != module.entry_computation_id,
                op_name: instruction
                    .metadata
                    .as_ref()
                    .map(|m| m.op_name.clone())
                    .unwrap_or_default(),
                source: instruction
                    .metadata
                    .as_ref()
                    .filter(|m| !m.source_file.is_empty())
                    .map(|m| (m.source_file.clone(), m.source_line)),
                parameter: entry
                    .then(|| parameter_moved(instruction, &by_id))
                    .flatten(),
            });
        }
    }
    found
}

/// The parameter an instruction's first operand is, seen through ops that only move or
/// annotate it.
fn parameter_moved(
    instruction: &HloInstructionProto,
    by_id: &HashMap<i64, &HloInstructionProto>,
) -> Option<i64> {
    let mut at = by_id.get(instruction.operand_ids.first()?)?;
    for _ in 0..16 {
        match at.opcode.as_str() {
            "parameter" => return Some(at.parameter_number),
            "copy" | "bitcast" | "reshape" | "transpose" | "custom-call" => {
                at = by_id.get(at.operand_ids.first()?)?;
            }
            _ => return None,
        }
    }
    None
}

/// The collective kind of an opcode (`all-gather-start` is an all-gather); None for other ops
/// and for the `-done` halves of asynchronous pairs.
fn kind_of(opcode: &str) -> Option<&'static str> {
    let base = opcode.strip_suffix("-start").unwrap_or(opcode);
    COLLECTIVE_KINDS.iter().copied().find(|&k| k == base)
}

fn moved_bytes(
    instruction: &HloInstructionProto,
    shapes: &HashMap<i64, &ShapeProto>,
) -> Option<u64> {
    let mut sizes = vec![shape_bytes(instruction.shape.as_ref()?)?];
    for id in &instruction.operand_ids {
        sizes.push(shape_bytes(shapes.get(id)?)?);
    }
    // An asynchronous start's result holds its operands and results together (a tuple): the
    // largest array in it is what moves.
    sizes.into_iter().max()
}

/// The bytes of the largest array in a shape (a tuple's largest element).
fn shape_bytes(shape: &ShapeProto) -> Option<u64> {
    if !shape.tuple_shapes.is_empty() {
        return shape
            .tuple_shapes
            .iter()
            .map(shape_bytes)
            .try_fold(0, |m, b| Some(m.max(b?)));
    }
    array_bytes(shape)
}

/// The bytes of an array shape; None for a type of no known size.
fn array_bytes(shape: &ShapeProto) -> Option<u64> {
    let elem = dtype_of(shape.element_type)?;
    let count: i64 = shape.dimensions.iter().product();
    Some(count.max(0) as u64 * elem.byte_size() as u64)
}

/// XLA's PrimitiveType numbers of the types tpuc handles.
fn dtype_of(code: i32) -> Option<DType> {
    const CODES: [(i32, DType); 17] = [
        (1, DType::Bool),
        (2, DType::I8),
        (3, DType::I16),
        (4, DType::I32),
        (5, DType::I64),
        (6, DType::U8),
        (7, DType::U16),
        (8, DType::U32),
        (9, DType::U64),
        (10, DType::F16),
        (11, DType::F32),
        (12, DType::F64),
        (15, DType::C64),
        (16, DType::BF16),
        (18, DType::C128),
        (19, DType::F8E5M2),
        (20, DType::F8E4M3FN),
    ];
    CODES.iter().find(|(c, _)| *c == code).map(|(_, d)| *d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::OpMetadata;

    fn array(element_type: i32, dims: &[i64]) -> Option<ShapeProto> {
        Some(ShapeProto {
            element_type,
            dimensions: dims.to_vec(),
            tuple_shapes: vec![],
        })
    }

    fn instruction(
        id: i64,
        opcode: &str,
        shape: Option<ShapeProto>,
        operands: &[i64],
    ) -> HloInstructionProto {
        HloInstructionProto {
            name: format!("{opcode}.{id}"),
            opcode: opcode.into(),
            shape,
            metadata: Some(OpMetadata {
                op_name: format!("op{id}"),
                source_file: "model.py".into(),
                source_line: 7,
                ..Default::default()
            }),
            id,
            operand_ids: operands.to_vec(),
            called_computation_ids: vec![],
            dot_dimension_numbers: None,
            convolution_dimension_numbers: None,
            parameter_number: if opcode == "parameter" { 3 } else { 0 },
        }
    }

    fn computation(
        name: &str,
        id: i64,
        is_fusion_computation: bool,
        instructions: Vec<HloInstructionProto>,
    ) -> HloComputationProto {
        HloComputationProto {
            name: name.into(),
            id,
            is_fusion_computation,
            instructions,
        }
    }

    #[test]
    fn collectives_are_found_with_their_bytes_and_source() {
        let entry = computation(
            "main",
            1,
            false,
            vec![
                instruction(1, "parameter", array(11, &[4, 8]), &[]),
                instruction(2, "all-gather", array(11, &[8, 8]), &[1]),
                instruction(3, "reduce-scatter", array(11, &[2, 8]), &[1]),
                instruction(4, "all-reduce-start", array(16, &[4, 8]), &[1]),
                instruction(5, "all-reduce-done", array(16, &[4, 8]), &[4]),
                instruction(6, "add", array(11, &[4, 8]), &[1, 1]),
            ],
        );
        let body = computation(
            "body",
            2,
            false,
            vec![instruction(7, "collective-permute", array(5, &[3]), &[])],
        );
        let module = HloModuleProto {
            name: "m".into(),
            computations: vec![body, entry],
            entry_computation_id: 1,
        };
        let bare = Serialized {
            format: "hlo".into(),
            bytes: module.encode_to_vec(),
        };
        let found = read(&bare).unwrap().collectives;
        let wrapped = Serialized {
            format: "hlo_with_config".into(),
            bytes: HloModuleProtoWithConfig {
                hlo_module: Some(module),
            }
            .encode_to_vec(),
        };
        assert_eq!(read(&wrapped).unwrap().collectives, found);
        let summary: Vec<(&str, Option<u64>, bool)> =
            found.iter().map(|c| (c.kind, c.bytes, c.nested)).collect();
        assert_eq!(
            summary,
            [
                ("collective-permute", Some(24), true),
                ("all-gather", Some(256), false),
                ("reduce-scatter", Some(128), false),
                ("all-reduce", Some(128), false),
            ]
        );
        assert_eq!(found[1].source, Some(("model.py".into(), 7)));
        // The entry's collectives of its parameter 3 say so; the loop's has no operand.
        let moved: Vec<Option<i64>> = found.iter().map(|c| c.parameter).collect();
        assert_eq!(moved, [None, Some(3), Some(3), Some(3)]);
        assert_eq!(found[1].op_name, "op2");
    }

    #[test]
    fn bytes_accessed_count_each_op_at_its_boundary_and_a_loop_body_once() {
        let call = |mut i: HloInstructionProto, called: &[i64]| {
            i.called_computation_ids = called.to_vec();
            i
        };
        let entry = computation(
            "main",
            1,
            false,
            vec![
                // 128 bytes of f32[4, 8].
                instruction(1, "parameter", array(11, &[4, 8]), &[]),
                // Reads 128, writes 128; its body (computation 2) is not memory traffic.
                call(instruction(2, "fusion", array(11, &[4, 8]), &[1]), &[2]),
                instruction(3, "bitcast", array(11, &[32]), &[2]),
                call(instruction(4, "while", array(11, &[4, 8]), &[2]), &[3]),
            ],
        );
        let fused = computation(
            "fused",
            2,
            true,
            vec![
                instruction(5, "parameter", array(11, &[4, 8]), &[]),
                instruction(6, "exponential", array(11, &[4, 8]), &[5]),
            ],
        );
        let body = computation(
            "body",
            3,
            false,
            vec![
                instruction(7, "parameter", array(11, &[4, 8]), &[]),
                // Reads 2 x 128, writes 128.
                instruction(8, "add", array(11, &[4, 8]), &[7, 7]),
            ],
        );
        let module = HloModuleProto {
            name: "m".into(),
            computations: vec![entry, fused, body],
            entry_computation_id: 1,
        };
        let program = read(&Serialized {
            format: "hlo".into(),
            bytes: module.encode_to_vec(),
        })
        .unwrap();
        assert_eq!(program.bytes_accessed, 256.0 + 384.0);
    }

    #[test]
    fn a_broken_program_is_an_error_naming_it() {
        let garbage = Serialized {
            format: "hlo".into(),
            bytes: vec![0xff, 0xff, 0xff],
        };
        let e = read(&garbage).unwrap_err();
        assert!(
            e.to_string()
                .contains("optimized program (hlo) does not decode"),
            "{e}"
        );
        let other = Serialized {
            format: "mlir".into(),
            bytes: vec![],
        };
        assert!(read(&other)
            .unwrap_err()
            .to_string()
            .contains("format tpuc does not read: mlir"));
    }
}
