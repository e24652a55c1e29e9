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
