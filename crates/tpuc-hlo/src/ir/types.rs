//! StableHLO tensor types.

use std::fmt;

use tpuc_dtype::DType;

/// How StableHLO spells an element type (`f32`, `ui8`, `complex<f32>`).
pub fn element_spelling(elem: DType) -> &'static str {
    match elem {
        DType::Bool => "i1",
        DType::I8 => "i8",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 => "ui8",
        DType::U16 => "ui16",
        DType::U32 => "ui32",
        DType::U64 => "ui64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::C64 => "complex<f32>",
        DType::C128 => "complex<f64>",
        DType::F8E4M3FN => "f8E4M3FN",
        DType::F8E5M2 => "f8E5M2",
    }
}

/// A ranked tensor type with static dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub shape: Vec<i64>,
    pub elem: DType,
}

impl TensorType {
    pub fn new(shape: Vec<i64>, elem: DType) -> TensorType {
        TensorType { shape, elem }
    }

    pub fn scalar(elem: DType) -> TensorType {
        TensorType {
            shape: Vec::new(),
            elem,
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    pub fn with_elem(&self, elem: DType) -> TensorType {
        TensorType {
            shape: self.shape.clone(),
            elem,
        }
    }

    pub fn with_shape(&self, shape: Vec<i64>) -> TensorType {
        TensorType {
            shape,
            elem: self.elem,
        }
    }
}

/// StableHLO's spelling, `tensor<2x3xf32>`: what error messages and the emitter show.
impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", element_spelling(self.elem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_mlir_types() {
        assert_eq!(
            TensorType::new(vec![2, 3], DType::F32).to_string(),
            "tensor<2x3xf32>"
        );
        assert_eq!(TensorType::scalar(DType::Bool).to_string(), "tensor<i1>");
        assert_eq!(
            TensorType::new(vec![0], DType::U8).to_string(),
            "tensor<0xui8>"
        );
        assert_eq!(
            TensorType::scalar(DType::C64).to_string(),
            "tensor<complex<f32>>"
        );
    }
}
