//! Host-side tensors in 64-byte aligned memory, which the CPU plugin can alias without copying.
use crate::error::{Error, Result};
use crate::DType;

/// Host memory a device buffer may alias (zero-copy). It must stay unchanged while shared.
pub trait HostBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
}

impl HostBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A dense, row-major tensor on the host; its data starts on a 64-byte boundary.
#[derive(Clone)]
pub struct HostTensor {
    element_type: DType,
    dims: Vec<i64>,
    lines: Vec<Line>,
    len: usize,
}

/// Rust types that are the elements of an [`DType`].
pub trait Scalar: Copy + 'static {
    const TYPE: DType;
}

macro_rules! scalars {
    ($($t:ty => $e:ident),*) => {$(impl Scalar for $t { const TYPE: DType = DType::$e; })*};
}
scalars!(bool => Bool, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16,
    u32 => U32, u64 => U64, f32 => F32, f64 => F64);

/// Number of elements of a shape, or an error for a negative or overflowing one.
pub(crate) fn element_count(dims: &[i64]) -> Result<usize> {
    dims.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| acc.checked_mul(d))
            .ok_or_else(|| Error::Invalid(format!("invalid shape {dims:?}")))
    })
}

impl HostTensor {
    /// A zero-filled tensor.
    pub fn zeros(element_type: DType, dims: &[i64]) -> Result<Self> {
        let len = element_count(dims)?
            .checked_mul(element_type.byte_size())
            .ok_or_else(|| Error::Invalid(format!("shape {dims:?} is too large")))?;
        Ok(HostTensor {
            element_type,
            dims: dims.to_vec(),
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        })
    }

    /// A tensor holding `bytes` (row-major, little-endian), which must match the shape exactly.
    pub fn from_bytes(element_type: DType, dims: &[i64], bytes: &[u8]) -> Result<Self> {
        let mut tensor = Self::zeros(element_type, dims)?;
        if bytes.len() != tensor.len {
            return Err(Error::Invalid(format!(
                "{} bytes given for a {element_type} tensor of shape {dims:?}, which needs {}",
                bytes.len(),
                tensor.len
            )));
        }
        tensor.bytes_mut().copy_from_slice(bytes);
        Ok(tensor)
    }

    /// A tensor of `T` elements.
    pub fn from_slice<T: Scalar>(element_type: DType, dims: &[i64], values: &[T]) -> Result<Self> {
        if element_type != T::TYPE {
            return Err(Error::Invalid(format!(
                "{} values given for a {element_type} tensor",
                T::TYPE
            )));
        }
        // SAFETY: `T` is a plain scalar type; its bytes are its in-memory representation.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        Self::from_bytes(element_type, dims, bytes)
    }

    pub fn element_type(&self) -> DType {
        self.element_type
    }

    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    pub fn element_count(&self) -> usize {
        self.len / self.element_type.byte_size()
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `lines` holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `self` is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }

    /// A tensor of shape `dims` (the same rank) holding this one's elements where both shapes
    /// have them, zeros elsewhere: this tensor padded to a larger shape, or its leading part.
    pub fn resized(&self, dims: &[i64]) -> Result<HostTensor> {
        Self::resized_from(self.element_type, &self.dims, self.bytes(), dims)
    }

    /// A tensor of shape `dims` holding the elements of `bytes` (a dense, row-major tensor of
    /// shape `from`, the same rank) where both shapes have them, zeros elsewhere.
    pub fn resized_from(
        element_type: DType,
        from: &[i64],
        bytes: &[u8],
        dims: &[i64],
    ) -> Result<HostTensor> {
        if dims.len() != from.len() {
            return Err(Error::Invalid(format!(
                "cannot resize a tensor of shape {from:?} to {dims:?}"
            )));
        }
        let esize = element_type.byte_size();
        let needed = element_count(from)?.saturating_mul(esize);
        if bytes.len() != needed {
            return Err(Error::Invalid(format!(
                "{} bytes given for a {element_type} tensor of shape {from:?}, which needs {needed}",
                bytes.len()
            )));
        }
        let mut out = HostTensor::zeros(element_type, dims)?;
        let common: Vec<i64> = from.iter().zip(dims).map(|(&a, &b)| a.min(b)).collect();
        if common.contains(&0) {
            return Ok(out);
        }
        let strides = |shape: &[i64]| -> Vec<usize> {
            let mut strides = vec![esize; shape.len()];
            for d in (0..shape.len().saturating_sub(1)).rev() {
                strides[d] = strides[d + 1] * shape[d + 1] as usize;
            }
            strides
        };
        let (from, to) = (strides(from), strides(dims));
        let rank = common.len();
        // The innermost dimension's common part is copied as one run of bytes per row.
        let run = common.last().map_or(esize, |&n| n as usize * esize);
        let rows: usize = common[..rank.saturating_sub(1)]
            .iter()
            .map(|&n| n as usize)
            .product();
        let mut index = vec![0usize; rank.saturating_sub(1)];
        let dst = out.bytes_mut();
        for _ in 0..rows {
            let offset = |strides: &[usize]| -> usize {
                index.iter().zip(strides).map(|(i, s)| i * s).sum()
            };
            let (a, b) = (offset(&from), offset(&to));
            dst[b..b + run].copy_from_slice(&bytes[a..a + run]);
            // The next row, last index fastest.
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < common[d] as usize {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(out)
    }

    /// The elements as `T`, which must be the tensor's element type.
    pub fn to_vec<T: Scalar>(&self) -> Result<Vec<T>> {
        if self.element_type != T::TYPE {
            return Err(Error::Invalid(format!(
                "tensor holds {}, not {}",
                self.element_type,
                T::TYPE
            )));
        }
        if T::TYPE == DType::Bool && self.bytes().iter().any(|&b| b > 1) {
            return Err(Error::Invalid(
                "bool tensor holds bytes other than 0 and 1".into(),
            ));
        }
        let count = self.element_count();
        let mut out = Vec::<T>::with_capacity(count);
        // SAFETY: the buffer holds `count` values of `T` (checked above; bools are 0 or 1).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.bytes().as_ptr(),
                out.as_mut_ptr().cast::<u8>(),
                self.len,
            );
            out.set_len(count);
        }
        Ok(out)
    }
}

impl HostBytes for HostTensor {
    fn bytes(&self) -> &[u8] {
        HostTensor::bytes(self)
    }
}

impl std::fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostTensor({} {:?})", self.element_type, self.dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resized_pads_with_zeros_and_takes_leading_parts() {
        let t = HostTensor::from_slice(DType::I32, &[2, 3], &[1i32, 2, 3, 4, 5, 6]).unwrap();
        let padded = t.resized(&[3, 4]).unwrap();
        assert_eq!(
            padded.to_vec::<i32>().unwrap(),
            [1, 2, 3, 0, 4, 5, 6, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            padded.resized(&[2, 3]).unwrap().to_vec::<i32>().unwrap(),
            [1, 2, 3, 4, 5, 6]
        );
        assert_eq!(t.resized(&[1, 2]).unwrap().to_vec::<i32>().unwrap(), [1, 2]);
        assert_eq!(t.resized(&[0, 2]).unwrap().element_count(), 0);
        assert!(t.resized(&[6]).is_err());
    }

    #[test]
    fn resized_from_checks_the_bytes_against_the_shape() {
        let bytes = [7u8, 8, 9, 10, 11, 12];
        let grown = HostTensor::resized_from(DType::U8, &[2, 3], &bytes, &[2, 4]).unwrap();
        assert_eq!(grown.bytes(), [7, 8, 9, 0, 10, 11, 12, 0]);
        assert_eq!(grown.bytes().as_ptr() as usize % 64, 0);
        let err = HostTensor::resized_from(DType::U8, &[2, 2], &bytes, &[2, 4]).unwrap_err();
        assert!(err.to_string().contains("6 bytes given"), "{err}");
    }
}
