//! Tensor element types: the one model every part of tpuc uses. The reader, the IR, the
//! emitter, the runtime, `.npy` files and the Python package convert to and from it at their
//! edges (torch.export's schema codes, MLIR spellings, PJRT's codes, numpy's type characters,
//! torch's dtype objects); nothing else keeps a list of element types.

use std::fmt;

/// The element types tpuc understands (complex32 and the 8-bit floats are not among them).
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
    /// 8-bit floats (torch's float8_e4m3fn: no infinities, one NaN; float8_e5m2: IEEE-like).
    F8E4M3FN,
    F8E5M2,
}

/// What kind of number an element is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Bool,
    Signed,
    Unsigned,
    Float,
    Complex,
}

/// Each type with its name (torch's and numpy's: `float32`), kind and size in bytes. An IEEE
/// half comes before bfloat16, so that a 2-byte float without further detail (numpy's `f2`)
/// is an IEEE half.
const TABLE: [(DType, &str, Kind, usize); 17] = [
    (DType::Bool, "bool", Kind::Bool, 1),
    (DType::U8, "uint8", Kind::Unsigned, 1),
    (DType::I8, "int8", Kind::Signed, 1),
    (DType::I16, "int16", Kind::Signed, 2),
    (DType::I32, "int32", Kind::Signed, 4),
    (DType::I64, "int64", Kind::Signed, 8),
    (DType::U16, "uint16", Kind::Unsigned, 2),
    (DType::U32, "uint32", Kind::Unsigned, 4),
    (DType::U64, "uint64", Kind::Unsigned, 8),
    (DType::F16, "float16", Kind::Float, 2),
    (DType::BF16, "bfloat16", Kind::Float, 2),
    (DType::F32, "float32", Kind::Float, 4),
    (DType::F64, "float64", Kind::Float, 8),
    (DType::C64, "complex64", Kind::Complex, 8),
    (DType::C128, "complex128", Kind::Complex, 16),
    (DType::F8E4M3FN, "float8_e4m3fn", Kind::Float, 1),
    (DType::F8E5M2, "float8_e5m2", Kind::Float, 1),
];

impl DType {
    pub const ALL: [DType; 17] = {
        let mut all = [DType::Bool; 17];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].0;
            i += 1;
        }
        all
    };

    fn entry(self) -> &'static (DType, &'static str, Kind, usize) {
        &TABLE[self as usize]
    }

    /// torch's (and numpy's) name: `float32`, `int64`, `bool`, `bfloat16`.
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    pub fn from_name(name: &str) -> Option<DType> {
        TABLE.iter().find(|e| e.1 == name).map(|e| e.0)
    }

    pub fn kind(self) -> Kind {
        self.entry().2
    }

    /// The type of this kind and size (an IEEE half for a 2-byte float).
    pub fn from_kind(kind: Kind, byte_size: usize) -> Option<DType> {
        TABLE
            .iter()
            .find(|e| e.2 == kind && e.3 == byte_size)
            .map(|e| e.0)
    }

    pub fn byte_size(self) -> usize {
        self.entry().3
    }

    pub fn is_bool(self) -> bool {
        self.kind() == Kind::Bool
    }

    pub fn is_float(self) -> bool {
        self.kind() == Kind::Float
    }

    pub fn is_complex(self) -> bool {
        self.kind() == Kind::Complex
    }

    /// Signed or unsigned integers (not booleans).
    pub fn is_integer(self) -> bool {
        matches!(self.kind(), Kind::Signed | Kind::Unsigned)
    }

    pub fn is_unsigned(self) -> bool {
        self.kind() == Kind::Unsigned
    }

    /// Whether the type holds negative numbers.
    pub fn is_signed(self) -> bool {
        matches!(self.kind(), Kind::Signed | Kind::Float | Kind::Complex)
    }

    /// The type torch's CPU kernels compute in for this type: float32 for 16- and 8-bit floats
    /// (then rounded once), the type itself otherwise.
    pub fn accumulation(self) -> DType {
        match self {
            DType::F16 | DType::BF16 | DType::F8E4M3FN | DType::F8E5M2 => DType::F32,
            other => other,
        }
    }

    /// The type of a complex type's real and imaginary parts; a real type itself.
    pub fn real_part(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            other => other,
        }
    }

    /// The complex type whose parts have this (float) type.
    pub fn complex_of(self) -> Option<DType> {
        match self {
            DType::F32 => Some(DType::C64),
            DType::F64 => Some(DType::C128),
            _ => None,
        }
    }
}

/// The largest finite float8_e4m3fn: torch's conversions saturate to it (the type has no
/// infinity), infinities included.
pub const F8E4M3FN_MAX: f64 = 448.0;

/// The bits of the 8-bit float `elem` nearest `value` (ties to even), as torch converts:
/// float8_e4m3fn saturates at +-448, float8_e5m2 overflows to infinity (from 61440, halfway to
/// the next power of two past its largest value, 57344).
pub fn f8_bits(elem: DType, value: f64) -> u8 {
    match elem {
        DType::F8E4M3FN => float8::F8E4M3::from_f64(value).to_bits(),
        DType::F8E5M2 if !value.is_nan() && value.abs() >= 61440.0 => {
            0x7C | if value < 0.0 { 0x80 } else { 0 }
        }
        DType::F8E5M2 => float8::F8E5M2::from_f64(value).to_bits(),
        other => panic!("{other} is not an 8-bit float"),
    }
}

/// The value of the 8-bit float `elem` with these bits.
pub fn f8_value(elem: DType, bits: u8) -> f64 {
    match elem {
        DType::F8E4M3FN => float8::F8E4M3::from_bits(bits).to_f64(),
        DType::F8E5M2 => float8::F8E5M2::from_bits(bits).to_f64(),
        other => panic!("{other} is not an 8-bit float"),
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_bit_floats_round_and_overflow_as_torch_converts() {
        for elem in [DType::F8E4M3FN, DType::F8E5M2] {
            for v in [0.0, 1.0, -2.5, 0.125, 3.0] {
                assert_eq!(f8_value(elem, f8_bits(elem, v)), v, "{elem} {v}");
            }
        }
        // 1.0625 lies halfway between 1.0 and 1.125 in float8_e4m3fn: to even (1.0).
        assert_eq!(
            f8_value(DType::F8E4M3FN, f8_bits(DType::F8E4M3FN, 1.0625)),
            1.0
        );
        assert_eq!(
            f8_value(DType::F8E4M3FN, f8_bits(DType::F8E4M3FN, 448.0)),
            448.0
        );
        assert_eq!(
            f8_value(DType::F8E4M3FN, f8_bits(DType::F8E4M3FN, 1000.0)),
            448.0
        );
        assert_eq!(
            f8_value(DType::F8E4M3FN, f8_bits(DType::F8E4M3FN, f64::NEG_INFINITY)),
            -448.0
        );
        assert!(f8_value(DType::F8E4M3FN, f8_bits(DType::F8E4M3FN, f64::NAN)).is_nan());
        assert_eq!(
            f8_value(DType::F8E5M2, f8_bits(DType::F8E5M2, -1e6)),
            f64::NEG_INFINITY
        );
        assert_eq!(
            f8_value(DType::F8E5M2, f8_bits(DType::F8E5M2, 57344.0)),
            57344.0
        );
    }

    #[test]
    fn the_table_is_in_declaration_order() {
        for (i, entry) in TABLE.iter().enumerate() {
            assert_eq!(entry.0 as usize, i, "{:?}", entry.0);
            assert_eq!(DType::ALL[i], entry.0);
        }
    }

    #[test]
    fn names_and_kinds_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            if !matches!(d, DType::BF16 | DType::F8E5M2) {
                assert_eq!(DType::from_kind(d.kind(), d.byte_size()), Some(d));
            }
        }
        assert_eq!(DType::from_kind(Kind::Float, 2), Some(DType::F16));
        assert_eq!(DType::from_name("float8_e4m3fn"), Some(DType::F8E4M3FN));
        assert_eq!(DType::from_name("float8_e4m3fnuz"), None);
        assert!(DType::I8.is_signed() && !DType::U8.is_signed() && !DType::Bool.is_integer());
        assert_eq!(DType::BF16.accumulation(), DType::F32);
        assert_eq!(DType::C64.real_part(), DType::F32);
        assert_eq!(DType::F8E5M2.accumulation(), DType::F32);
        assert_eq!(DType::F64.complex_of(), Some(DType::C128));
    }
}
