//! Tensor element types as torch names them, with the codes of torch.export's schema.

use std::fmt;

/// The element types tpuc understands (torch's names; complex32 and fp8 are not supported).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    U8,
    I8,
    I16,
    I32,
    I64,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

impl DType {
    pub const ALL: [DType; 15] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
    ];

    /// The `ScalarType` code used by torch.export's serialized schema.
    pub fn schema_code(self) -> i64 {
        match self {
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
        }
    }

    pub fn from_schema_code(code: i64) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.schema_code() == code)
    }

    /// Describes a schema code tpuc cannot use, for error messages.
    pub fn describe_unsupported_code(code: i64) -> String {
        let name = match code {
            0 => "UNKNOWN",
            9 => "complex32",
            10 => "complex64",
            11 => "complex128",
            29 => "float8_e4m3fn",
            30 => "float8_e5m2",
            31 => "float8_e4m3fnuz",
            32 => "float8_e5m2fnuz",
            33 => "float8_e8m0fnu",
            _ => "unknown",
        };
        format!("dtype code {code} ({name})")
    }

    pub fn byte_size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    pub fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }

    pub fn is_integer(self) -> bool {
        !self.is_float() && !self.is_complex() && self != DType::Bool
    }

    pub fn is_signed(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
            || self.is_float()
            || self.is_complex()
    }

    /// torch's name, e.g. `float32`.
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
        }
    }

    pub fn from_torch_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.torch_name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_schema_code(d.schema_code()), Some(d));
            assert_eq!(DType::from_torch_name(d.torch_name()), Some(d));
        }
        assert_eq!(DType::from_schema_code(9), None);
        assert!(DType::describe_unsupported_code(9).contains("complex32"));
    }
}
