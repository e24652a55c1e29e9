//! StableHLO tensor types.

use std::fmt;

use tpuc_fx::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemType {
    I1,
    I8,
    I16,
    I32,
    I64,
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

impl ElemType {
    pub fn from_dtype(d: DType) -> ElemType {
        match d {
            DType::Bool => ElemType::I1,
            DType::U8 => ElemType::U8,
            DType::I8 => ElemType::I8,
            DType::I16 => ElemType::I16,
            DType::I32 => ElemType::I32,
            DType::I64 => ElemType::I64,
            DType::U16 => ElemType::U16,
            DType::U32 => ElemType::U32,
            DType::U64 => ElemType::U64,
            DType::F16 => ElemType::F16,
            DType::BF16 => ElemType::BF16,
            DType::F32 => ElemType::F32,
            DType::F64 => ElemType::F64,
            DType::C64 => ElemType::C64,
            DType::C128 => ElemType::C128,
        }
    }

    pub fn to_dtype(self) -> DType {
        match self {
            ElemType::I1 => DType::Bool,
            ElemType::U8 => DType::U8,
            ElemType::I8 => DType::I8,
            ElemType::I16 => DType::I16,
            ElemType::I32 => DType::I32,
            ElemType::I64 => DType::I64,
            ElemType::U16 => DType::U16,
            ElemType::U32 => DType::U32,
            ElemType::U64 => DType::U64,
            ElemType::F16 => DType::F16,
            ElemType::BF16 => DType::BF16,
            ElemType::F32 => DType::F32,
            ElemType::F64 => DType::F64,
            ElemType::C64 => DType::C64,
            ElemType::C128 => DType::C128,
        }
    }

    pub fn mlir_name(self) -> &'static str {
        match self {
            ElemType::I1 => "i1",
            ElemType::I8 => "i8",
            ElemType::I16 => "i16",
            ElemType::I32 => "i32",
            ElemType::I64 => "i64",
            ElemType::U8 => "ui8",
            ElemType::U16 => "ui16",
            ElemType::U32 => "ui32",
            ElemType::U64 => "ui64",
            ElemType::F16 => "f16",
            ElemType::BF16 => "bf16",
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
            ElemType::C64 => "complex<f32>",
            ElemType::C128 => "complex<f64>",
        }
    }

    pub fn is_float(self) -> bool {
        self.to_dtype().is_float()
    }

    /// The type torch's CPU kernels compute in for this type: float32 for 16-bit floats (then
    /// rounded once), the type itself otherwise.
    pub fn accumulation(self) -> ElemType {
        if matches!(self, ElemType::F16 | ElemType::BF16) {
            ElemType::F32
        } else {
            self
        }
    }

    pub fn is_complex(self) -> bool {
        self.to_dtype().is_complex()
    }

    /// The type of a complex type's real and imaginary parts; a real type itself.
    pub fn real_part(self) -> ElemType {
        match self {
            ElemType::C64 => ElemType::F32,
            ElemType::C128 => ElemType::F64,
            other => other,
        }
    }

    /// The complex type whose parts have this (float) type.
    pub fn complex_of(self) -> Option<ElemType> {
        match self {
            ElemType::F32 => Some(ElemType::C64),
            ElemType::F64 => Some(ElemType::C128),
            _ => None,
        }
    }

    pub fn is_bool(self) -> bool {
        self == ElemType::I1
    }

    pub fn is_integer(self) -> bool {
        self.to_dtype().is_integer()
    }

    pub fn is_unsigned(self) -> bool {
        matches!(
            self,
            ElemType::U8 | ElemType::U16 | ElemType::U32 | ElemType::U64
        )
    }

    pub fn byte_size(self) -> usize {
        self.to_dtype().byte_size()
    }

    /// The `comparison_type` StableHLO uses for this element type.
    pub fn comparison_type(self) -> &'static str {
        if self.is_float() || self.is_complex() {
            "FLOAT"
        } else if self.is_unsigned() || self.is_bool() {
            "UNSIGNED"
        } else {
            "SIGNED"
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir_name())
    }
}

/// A ranked tensor type with static dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub shape: Vec<i64>,
    pub elem: ElemType,
}

impl TensorType {
    pub fn new(shape: Vec<i64>, elem: ElemType) -> TensorType {
        TensorType { shape, elem }
    }

    pub fn scalar(elem: ElemType) -> TensorType {
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

    pub fn with_elem(&self, elem: ElemType) -> TensorType {
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

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_mlir_types() {
        assert_eq!(
            TensorType::new(vec![2, 3], ElemType::F32).to_string(),
            "tensor<2x3xf32>"
        );
        assert_eq!(TensorType::scalar(ElemType::I1).to_string(), "tensor<i1>");
        assert_eq!(
            TensorType::new(vec![0], ElemType::U8).to_string(),
            "tensor<0xui8>"
        );
    }
}
