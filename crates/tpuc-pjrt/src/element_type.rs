//! Element types of buffers as PJRT codes them. The types themselves are
//! [`tpuc_dtype::DType`].
use pjrt_sys::*;
use tpuc_dtype::DType;

/// PJRT's code for each type tpuc moves between host and device.
const CODES: [(DType, PJRT_Buffer_Type); 17] = [
    (DType::Bool, PJRT_Buffer_Type_PRED),
    (DType::I8, PJRT_Buffer_Type_S8),
    (DType::I16, PJRT_Buffer_Type_S16),
    (DType::I32, PJRT_Buffer_Type_S32),
    (DType::I64, PJRT_Buffer_Type_S64),
    (DType::U8, PJRT_Buffer_Type_U8),
    (DType::U16, PJRT_Buffer_Type_U16),
    (DType::U32, PJRT_Buffer_Type_U32),
    (DType::U64, PJRT_Buffer_Type_U64),
    (DType::F16, PJRT_Buffer_Type_F16),
    (DType::BF16, PJRT_Buffer_Type_BF16),
    (DType::F32, PJRT_Buffer_Type_F32),
    (DType::F64, PJRT_Buffer_Type_F64),
    (DType::C64, PJRT_Buffer_Type_C64),
    (DType::C128, PJRT_Buffer_Type_C128),
    (DType::F8E4M3FN, PJRT_Buffer_Type_F8E4M3FN),
    (DType::F8E5M2, PJRT_Buffer_Type_F8E5M2),
];

pub(crate) fn to_raw(d: DType) -> PJRT_Buffer_Type {
    CODES
        .iter()
        .find(|e| e.0 == d)
        .expect("every element type has a PJRT code")
        .1
}

/// `None` for types tpuc does not handle (4-bit, other 8-bit floats, tokens).
pub(crate) fn from_raw(raw: PJRT_Buffer_Type) -> Option<DType> {
    CODES.iter().find(|e| e.1 == raw).map(|e| e.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_a_code_and_back() {
        for d in DType::ALL {
            assert_eq!(from_raw(to_raw(d)), Some(d));
        }
    }
}
