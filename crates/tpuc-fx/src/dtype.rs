//! Element types in torch.export's serialized schema: the `ScalarType` codes `.pt2` archives
//! and `.fx` files store. The types themselves are [`tpuc_dtype::DType`].

pub use tpuc_dtype::DType;

/// The `ScalarType` code used by torch.export's serialized schema.
pub fn schema_code(d: DType) -> i64 {
    match d {
        DType::U8 => 1,
        DType::I8 => 2,
        DType::I16 => 3,
        DType::I32 => 4,
        DType::I64 => 5,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::C64 => 10,
        DType::C128 => 11,
        DType::Bool => 12,
        DType::BF16 => 13,
        DType::U16 => 28,
        DType::U32 => 34,
        DType::U64 => 35,
        DType::F8E4M3FN => 29,
        DType::F8E5M2 => 30,
    }
}

pub fn from_schema_code(code: i64) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| schema_code(d) == code)
}

/// Describes a schema code tpuc cannot use, for error messages.
pub fn describe_unsupported_code(code: i64) -> String {
    let name = match code {
        0 => "UNKNOWN",
        9 => "complex32",
        31 => "float8_e4m3fnuz",
        32 => "float8_e5m2fnuz",
        33 => "float8_e8m0fnu",
        _ => "unknown",
    };
    format!("dtype code {code} ({name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(from_schema_code(schema_code(d)), Some(d));
        }
        assert_eq!(from_schema_code(9), None);
        assert!(describe_unsupported_code(9).contains("complex32"));
    }
}
