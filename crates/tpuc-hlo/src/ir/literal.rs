//! Literals: element bytes from numbers as torch converts them, half-precision rounding, the
//! identities of reductions, and the text of one element.

use tpuc_dtype::DType;

use super::ops::BinaryOp;

/// The reduction identity of `op` for `elem` (lowest value for max, and so on).
pub fn reduction_identity(op: BinaryOp, elem: DType) -> f64 {
    let (lowest, highest) = if elem.is_float() {
        (f64::NEG_INFINITY, f64::INFINITY)
    } else if elem.is_bool() {
        (0.0, 1.0)
    } else {
        let bits = (elem.byte_size() * 8) as i32;
        if elem.is_unsigned() {
            (0.0, 2f64.powi(bits) - 1.0)
        } else {
            (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1) - 1.0)
        }
    };
    match op {
        BinaryOp::Max => lowest,
        BinaryOp::Min => highest,
        BinaryOp::Mul | BinaryOp::And => 1.0,
        _ => 0.0,
    }
}

/// Little-endian bytes of one element of `elem` holding `value` (as torch would convert it).
pub fn scalar_bytes(elem: DType, value: f64) -> Vec<u8> {
    match elem {
        DType::Bool => vec![u8::from(value != 0.0)],
        DType::I8 => (value as i8).to_le_bytes().to_vec(),
        DType::I16 => (value as i16).to_le_bytes().to_vec(),
        DType::I32 => (value as i32).to_le_bytes().to_vec(),
        DType::I64 => (value as i64).to_le_bytes().to_vec(),
        DType::U8 => (value as u8).to_le_bytes().to_vec(),
        DType::U16 => (value as u16).to_le_bytes().to_vec(),
        DType::U32 => (value as u32).to_le_bytes().to_vec(),
        DType::U64 => (value as u64).to_le_bytes().to_vec(),
        DType::F16 => f32_to_f16_bits(value as f32).to_le_bytes().to_vec(),
        DType::BF16 => f32_to_bf16_bits(value as f32).to_le_bytes().to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
        DType::F8E4M3FN | DType::F8E5M2 => vec![tpuc_dtype::f8_bits(elem, value)],
        // A real number: the imaginary part is zero.
        DType::C64 | DType::C128 => {
            let mut bytes = scalar_bytes(elem.real_part(), value);
            bytes.resize(elem.byte_size(), 0);
            bytes
        }
    }
}

/// Round-to-nearest-even conversion of an f32 to bfloat16 bits.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    ((bits + round) >> 16) as u16
}

/// Round-to-nearest-even conversion of an f32 to IEEE half bits.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = m >> shift;
        let rem = m & ((1 << shift) - 1);
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// One element's text: integers in decimal, floats as their exact bit pattern (no rounding
/// through decimal text), booleans as true or false.
pub fn scalar_text(elem: DType, b: &[u8]) -> String {
    match elem {
        DType::Bool => (if b[0] != 0 { "true" } else { "false" }).into(),
        DType::I8 => (b[0] as i8).to_string(),
        DType::U8 => b[0].to_string(),
        DType::I16 => i16::from_le_bytes([b[0], b[1]]).to_string(),
        DType::U16 => u16::from_le_bytes([b[0], b[1]]).to_string(),
        DType::I32 => i32::from_le_bytes(b[..4].try_into().unwrap()).to_string(),
        DType::U32 => u32::from_le_bytes(b[..4].try_into().unwrap()).to_string(),
        DType::I64 => i64::from_le_bytes(b[..8].try_into().unwrap()).to_string(),
        DType::U64 => u64::from_le_bytes(b[..8].try_into().unwrap()).to_string(),
        // Floats as their exact bit pattern: no rounding through decimal text.
        DType::F8E4M3FN | DType::F8E5M2 => format!("0x{:02X}", b[0]),
        DType::F16 | DType::BF16 => format!("0x{:04X}", u16::from_le_bytes([b[0], b[1]])),
        DType::F32 => format!("0x{:08X}", u32::from_le_bytes(b[..4].try_into().unwrap())),
        DType::F64 => format!("0x{:016X}", u64::from_le_bytes(b[..8].try_into().unwrap())),
        DType::C64 | DType::C128 => {
            let half = elem.byte_size() / 2;
            let part = elem.real_part();
            format!(
                "({}, {})",
                scalar_text(part, &b[..half]),
                scalar_text(part, &b[half..2 * half])
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_to_nearest_even() {
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(-2.5), 0xc100);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00);
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
    }
}
