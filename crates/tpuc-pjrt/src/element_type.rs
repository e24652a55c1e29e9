//! Element types of buffers, with their PJRT codes and sizes.
use pjrt_sys::*;
use std::fmt;

/// The element types tpuc moves between host and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    Pred,
    S8,
    S16,
    S32,
    S64,
    U8,
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

const TABLE: [(ElementType, PJRT_Buffer_Type, usize, &str); 15] = [
    (ElementType::Pred, PJRT_Buffer_Type_PRED, 1, "bool"),
    (ElementType::S8, PJRT_Buffer_Type_S8, 1, "int8"),
    (ElementType::S16, PJRT_Buffer_Type_S16, 2, "int16"),
    (ElementType::S32, PJRT_Buffer_Type_S32, 4, "int32"),
    (ElementType::S64, PJRT_Buffer_Type_S64, 8, "int64"),
    (ElementType::U8, PJRT_Buffer_Type_U8, 1, "uint8"),
    (ElementType::U16, PJRT_Buffer_Type_U16, 2, "uint16"),
    (ElementType::U32, PJRT_Buffer_Type_U32, 4, "uint32"),
    (ElementType::U64, PJRT_Buffer_Type_U64, 8, "uint64"),
    (ElementType::F16, PJRT_Buffer_Type_F16, 2, "float16"),
    (ElementType::BF16, PJRT_Buffer_Type_BF16, 2, "bfloat16"),
    (ElementType::F32, PJRT_Buffer_Type_F32, 4, "float32"),
    (ElementType::F64, PJRT_Buffer_Type_F64, 8, "float64"),
    (ElementType::C64, PJRT_Buffer_Type_C64, 8, "complex64"),
    (ElementType::C128, PJRT_Buffer_Type_C128, 16, "complex128"),
];

impl ElementType {
    fn entry(self) -> &'static (ElementType, PJRT_Buffer_Type, usize, &'static str) {
        TABLE
            .iter()
            .find(|e| e.0 == self)
            .expect("every element type is in the table")
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.entry().2
    }

    /// The numpy-style name (`float32`, `int64`, `bool`, `bfloat16`).
    pub fn name(self) -> &'static str {
        self.entry().3
    }

    pub fn to_raw(self) -> PJRT_Buffer_Type {
        self.entry().1
    }

    /// `None` for types tpuc does not handle (4-bit, 8-bit floats, tokens).
    pub fn from_raw(raw: PJRT_Buffer_Type) -> Option<Self> {
        TABLE.iter().find(|e| e.1 == raw).map(|e| e.0)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        TABLE.iter().find(|e| e.3 == name).map(|e| e.0)
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            ElementType::F16 | ElementType::BF16 | ElementType::F32 | ElementType::F64
        )
    }

    pub fn is_complex(self) -> bool {
        matches!(self, ElementType::C64 | ElementType::C128)
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
